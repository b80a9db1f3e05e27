"""Vectorized single-server FIFO queueing: engine, distributions, theory and heavy-tail checks.

This package is the kernel's queue engine. The HBM controller and the link models hand it whole
batches of customers (memory requests, messages) as arrays and get back waiting times, sojourn
times and departure times; nothing here is called once per customer. It imports only NumPy,
SciPy, :mod:`twin.kernel.errors` and :mod:`twin.kernel.lazy` and has no state: every
random draw comes from a ``numpy.random.Generator`` passed in by the caller.

Units: every time is in seconds (arrival times, service times, waits, means, durations), every
rate is in 1/s. Dimensionless quantities (``cov``, ``scv``, ``rho``, ``alpha``, ``k``) say so.

Contents, one module per concept
--------------------------------
* :mod:`~twin.kernel.queueing.engine`: the FIFO engine :func:`fifo_queue` (-> :class:`FifoResult`),
  :func:`fifo_waits`, :func:`fifo_departures`; :func:`lindley_reference` is the plain-Python loop
  it is validated against, :func:`max_relative_difference` the agreement metric.
* :mod:`~twin.kernel.queueing.distributions`: service-time distributions (frozen, built by name
  and moments): :class:`Deterministic`, :class:`Exponential`, :class:`Erlang`,
  :class:`HyperExponential2`, :class:`Lognormal`, :class:`Pareto`, :class:`Empirical`;
  factories :func:`service_distribution` and :func:`service_from_spec`.
* :mod:`~twin.kernel.queueing.arrivals`: :class:`PoissonArrivals`,
  :class:`DeterministicArrivals`, :class:`MMPP2Arrivals`; factories :func:`arrival_process` and
  :func:`arrival_from_spec`; :func:`superpose` merges streams and keeps a stream id per arrival.
* :mod:`~twin.kernel.queueing.theory`: :func:`utilization`, :func:`mm1_mean_wait`,
  :func:`md1_mean_wait`, :func:`mg1_mean_wait` (Pollaczek-Khinchine),
  :func:`time_average_number` and :func:`littles_law`.
* :mod:`~twin.kernel.queueing.statistics`: statistics and heavy tails: :func:`batch_means`,
  :func:`running_mean_check`, :func:`hill_estimate`, and the one-call report
  :func:`analyze_queue` (-> :class:`QueueAnalysis`).
* :mod:`~twin.kernel.queueing._validate`: the input checks and by-name factories they share.

Every public name is importable from this package (``from twin.kernel.queueing import
fifo_waits``); the submodule that defines it is imported on first use
(:func:`twin.kernel.lazy.lazy_exports`), so the scenario schema can read :mod:`.bounds`
without NumPy.

Example::

    rng = np.random.default_rng(7)
    arrivals = PoissonArrivals(rate=0.8).sample(rng, 100_000)           # s
    services = service_distribution("lognormal", mean=1.0, cov=2.0).sample(rng, 100_000)
    report = analyze_queue(arrivals, services)
    report.mean_wait, report.mean_wait_se, report.converged, report.warnings

Heavy tails: for a service time with tail index ``alpha <= 2`` (e.g. Pareto) the variance is
infinite and, by Pollaczek-Khinchine, the M/G/1 mean wait is infinite even when ``rho < 1``. A
simulation of such a queue still produces a finite sample mean; :func:`analyze_queue` reports it
as the sample mean of that finite run with ``converged=False`` and a warning, never as a limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twin.kernel.lazy import lazy_exports

#: Where each public name lives. The submodules import NumPy, so they are imported on first
#: use of a name (PEP 562): the scenario schema reads this package's bounds without NumPy.
_HOME = {
    "analyze_queue": "statistics",
    "arrival_from_spec": "arrivals",
    "arrival_process": "arrivals",
    "ArrivalProcess": "arrivals",
    "batch_means": "statistics",
    "BatchMeans": "statistics",
    "ConvergenceCheck": "statistics",
    "default_hill_k": "statistics",
    "Deterministic": "distributions",
    "DeterministicArrivals": "arrivals",
    "Empirical": "distributions",
    "Erlang": "distributions",
    "Exponential": "distributions",
    "fifo_departures": "engine",
    "fifo_queue": "engine",
    "fifo_waits": "engine",
    "FifoResult": "engine",
    "hill_estimate": "statistics",
    "HillEstimate": "statistics",
    "HyperExponential2": "distributions",
    "lindley_reference": "engine",
    "littles_law": "theory",
    "LittlesLaw": "theory",
    "Lognormal": "distributions",
    "max_relative_difference": "engine",
    "md1_mean_wait": "theory",
    "MergedArrivals": "arrivals",
    "mg1_mean_wait": "theory",
    "mm1_mean_wait": "theory",
    "MMPP2Arrivals": "arrivals",
    "Pareto": "distributions",
    "PoissonArrivals": "arrivals",
    "QueueAnalysis": "statistics",
    "running_mean_check": "statistics",
    "service_distribution": "distributions",
    "service_from_spec": "distributions",
    "ServiceDistribution": "distributions",
    "superpose": "arrivals",
    "time_average_number": "theory",
    "utilization": "theory",
}

if TYPE_CHECKING:
    from twin.kernel.queueing.arrivals import (
        ArrivalProcess,
        DeterministicArrivals,
        MergedArrivals,
        MMPP2Arrivals,
        PoissonArrivals,
        arrival_from_spec,
        arrival_process,
        superpose,
    )
    from twin.kernel.queueing.distributions import (
        Deterministic,
        Empirical,
        Erlang,
        Exponential,
        HyperExponential2,
        Lognormal,
        Pareto,
        ServiceDistribution,
        service_distribution,
        service_from_spec,
    )
    from twin.kernel.queueing.engine import (
        FifoResult,
        fifo_departures,
        fifo_queue,
        fifo_waits,
        lindley_reference,
        max_relative_difference,
    )
    from twin.kernel.queueing.statistics import (
        BatchMeans,
        ConvergenceCheck,
        HillEstimate,
        QueueAnalysis,
        analyze_queue,
        batch_means,
        default_hill_k,
        hill_estimate,
        running_mean_check,
    )
    from twin.kernel.queueing.theory import (
        LittlesLaw,
        littles_law,
        md1_mean_wait,
        mg1_mean_wait,
        mm1_mean_wait,
        time_average_number,
        utilization,
    )



__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())

__all__ = [
    "ArrivalProcess",
    "BatchMeans",
    "ConvergenceCheck",
    "Deterministic",
    "DeterministicArrivals",
    "Empirical",
    "Erlang",
    "Exponential",
    "FifoResult",
    "HillEstimate",
    "HyperExponential2",
    "LittlesLaw",
    "Lognormal",
    "MMPP2Arrivals",
    "MergedArrivals",
    "Pareto",
    "PoissonArrivals",
    "QueueAnalysis",
    "ServiceDistribution",
    "analyze_queue",
    "arrival_from_spec",
    "arrival_process",
    "batch_means",
    "default_hill_k",
    "fifo_departures",
    "fifo_queue",
    "fifo_waits",
    "hill_estimate",
    "lindley_reference",
    "littles_law",
    "max_relative_difference",
    "md1_mean_wait",
    "mg1_mean_wait",
    "mm1_mean_wait",
    "running_mean_check",
    "service_distribution",
    "service_from_spec",
    "superpose",
    "time_average_number",
    "utilization",
]
