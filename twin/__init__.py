"""meshtwin: a discrete-event digital twin of deep-learning training on 2D mesh / torus clusters.

The public API is small::

    import twin
    scenario = twin.load_scenario("scenarios/quickstart.yaml", overrides=["seed=3"])
    result = twin.run(scenario)          # -> twin.RunResult(summary=dict, trace_path=Path)

``twin`` holds the kernel (:mod:`twin.kernel`: engine, flow network, queueing, rng, trace,
records, errors) and, around it, the front door (scenario schema and loading, catalogs, build,
run, summary, limits, validate, plots, CLI, API). The facade names are resolved lazily, so
``import twin`` loads nothing but this file and :mod:`twin.version`.
"""

from __future__ import annotations

from twin.version import __version__

__all__ = ["InfeasibleConfig", "RunResult", "ScenarioError", "__version__", "load_scenario",
           "run"]


def __getattr__(name: str):  # PEP 562: lazy facade, no import-time side effects
    if name in ("load_scenario", "run", "RunResult"):
        from twin import api

        return getattr(api, name)
    if name in ("ScenarioError", "InfeasibleConfig"):
        from twin.kernel import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'twin' has no attribute {name!r}")
