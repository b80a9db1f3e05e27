"""meshtwin: a discrete-event digital twin of deep-learning training on 2D mesh / torus clusters.

The public API is small::

    import twin
    scenario = twin.load_scenario("scenarios/quickstart.yaml", overrides=["seed=3"])
    result = twin.run(scenario)          # -> twin.RunResult(summary=dict, trace_path=Path)

``twin`` is also the kernel package (engine, queueing, rng, trace). The facade names are
resolved lazily so that importing a kernel module (``twin.trace``) never drags in the rest of
the product and lower layers can import the kernel without a cycle.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["InfeasibleConfig", "RunResult", "ScenarioError", "load_scenario", "run"]


def __getattr__(name: str):  # PEP 562: lazy facade, no import-time side effects
    if name in ("load_scenario", "run", "RunResult"):
        from twin import api

        return getattr(api, name)
    if name in ("ScenarioError", "InfeasibleConfig"):
        from twin import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'twin' has no attribute {name!r}")
