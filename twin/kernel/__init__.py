"""The simulation kernel: generic machinery that knows nothing of GPUs, scenarios or the CLI.

* :mod:`twin.kernel.engine`: the SimPy environment (a clock and an event heap, counting events).
* :mod:`twin.kernel.flows`: the flow-level network (max-min fair sharing of link capacities).
* :mod:`twin.kernel.queueing`: the vectorized FIFO queue engine, distributions, theory, statistics.
* :mod:`twin.kernel.rng`: seeded random streams, one generator per named agent.
* :mod:`twin.kernel.records`: the recorder interface agents write their records to.
* :mod:`twin.kernel.trace`: HDF5 trace tables (buffered writer, pandas reader).
* :mod:`twin.kernel.errors`: errors for users (field-named problems) apart from invariants.
* :mod:`twin.kernel.schema`: building blocks of the validated input models (pydantic).
* :mod:`twin.kernel.catalog`: catalogs of sourced numbers (every value with its source).

Every module here imports only the standard library, third-party packages and other kernel
modules (``tests/test_layering.py`` enforces it), so every layer above can import it.
"""
