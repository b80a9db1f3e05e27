"""Which settings of a scenario change nothing? A probe for settings the model ignores.

For every leaf of the resolved scenario (``Scenario.to_dict``) it runs the scenario once more
with that leaf changed, and prints the leaves whose change moves neither the iteration time
nor the energy per iteration:

* numbers are doubled (a zero becomes 1, integers stay integers);
* switches are flipped (an unset optional setting is tried as true and as false);
* choices (a string the schema allows only some values for) take each other allowed value.

A leaf listed as ``SAME`` is either irrelevant to this scenario (a fault setting with no
faults, a precision the run does not use) or a setting the model ignores: read each one.
Session 39 found five this way (a link's latency, a fault's acceleration without a catalog
rate, the tied-embedding all-reduce, ``overlap.sm_contention: false`` beside a memory model,
``rail_rings`` on a torus). Changes the scenario refuses are skipped (``--verbose`` prints
them).

    python tools/sensitivity.py scenarios/quickstart.yaml [--set KEY=VALUE ...] [--kinds
        number,switch,choice] [--verbose]

Not part of ``make test``: it runs the scenario once per leaf (a few hundred runs).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from typing import Any

#: Leaves that name or label things, or bound the run, rather than describe it.
SKIP = ("name", "description", "source", "seed", "trace", "simulation.limits")


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every scalar leaf (a list of numbers counts as one)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, list) and node and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in node):
        yield prefix, node
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, f"{prefix}.{i}")
    else:
        yield prefix, node


def variants(scen: Any, key: str, value: Any, kinds: set[str]) -> list[Any]:
    """The changed values to try for one leaf."""
    from twin.kernel.errors import InfeasibleConfig, ScenarioError

    if isinstance(value, bool):
        return [not value] if "switch" in kinds else []
    if value is None:  # an unset optional setting: a tri-state switch, if the schema allows
        return [True, False] if "switch" in kinds else []
    if isinstance(value, (int, float, list)):
        if "number" not in kinds:
            return []
        def doubled(x: Any) -> Any:
            return (x * 2 if x else 1) if isinstance(x, int) else (x * 2.0 if x else 1.0)
        return [[doubled(x) for x in value] if isinstance(value, list) else doubled(value)]
    if isinstance(value, str) and "choice" in kinds:
        try:  # the schema's own list of allowed values, from its error on a wrong one
            scen.replace({key: "\x00not a value"})
        except (ScenarioError, InfeasibleConfig) as exc:
            m = re.match(r"(?:.*: )?one of (.*)", exc.problems[0].allowed or "")
            if m:
                return [a for a in (x.strip() for x in re.split(r",| or ", m.group(1)))
                        if a and a != value]
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--kinds", default="number,switch,choice",
                    help="comma-separated: number, switch, choice")
    ap.add_argument("--verbose", action="store_true", help="also print refused changes")
    args = ap.parse_args(argv)
    from twin.kernel.errors import InfeasibleConfig, ScenarioError
    from twin.runner import run
    from twin.scenario import load_scenario

    def measure(s: Any) -> tuple[float, float]:
        r = run(s, None)
        return r.summary["iteration_time_s"], r.summary["energy_per_iteration_j"]

    base = load_scenario(args.scenario, [*args.set, "trace.enabled=false"])
    t0, e0 = measure(base)
    print(f"base: iteration {t0:.6g} s, energy {e0:.6g} J per iteration", flush=True)
    kinds = set(args.kinds.split(","))
    same = 0
    for key, value in leaves(base.to_dict()):
        if key.split(".")[-1] in SKIP or key.startswith(SKIP):
            continue
        for new in variants(base, key, value, kinds):
            try:
                t, e = measure(base.replace({key: new}))
            except (ScenarioError, InfeasibleConfig) as exc:
                if args.verbose:
                    print(f"refused {key}={new}: {exc.problems[0]}"[:200])
                continue
            if (t, e) == (t0, e0):
                same += 1
                print(f"SAME {key}: {value} -> {new}", flush=True)
            elif args.verbose:
                print(f"diff {key}: {value} -> {new}: time {t / t0 - 1:+.2e}, "
                      f"energy {e / e0 - 1:+.2e}", flush=True)
    print(f"{same} change(s) moved neither the iteration time nor the energy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
