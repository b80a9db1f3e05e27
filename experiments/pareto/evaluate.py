"""Evaluating design points: one twin run per (boundary condition, point, seed) as a
:class:`RunTask`, its flat record (:func:`metrics_row`), the cache that never runs a point twice
(:class:`PointCache`, journaled for ``--resume``) and a point's record over its seeds
(:func:`aggregate`, statuses, constraints).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Number
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.many import JsonLines, TaskRunner
from twin.kernel.errors import InfeasibleConfig, ScenarioError

if TYPE_CHECKING:
    import pandas as pd

    from experiments.sweep import Sweep


STATUSES = ("ok", "constraint", "unbounded", "incomplete", "infeasible", "invalid", "error")
#: Constraint value NSGA-II sees for points that cannot run at all.
HARD_VIOLATION = 1e3
#: Metrics that get a standard deviation and a quantile column when points have several seeds.
ROBUST_METRICS = ("iteration_time_s", "energy_per_iteration_j", "avg_power_w", "mfu")
#: Scenario facts each run reports next to the summary (columns of points.csv).
SCENARIO_FACTS = ("dp", "tp", "pp", "micro_batch", "global_batch", "microbatches", "schedule",
                  "virtual_stages", "precision", "placement", "recompute")

Key = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class RunTask:
    """One twin run of a sweep: what a Dask worker receives.

    Attributes:
        boundary: name of the boundary condition.
        x: the design point (option index per dimension).
        seed: root seed (None: the base scenario's).
        base: the raw base scenario mapping.
        overrides: every override of this run (sweep ``set``, boundary, point, seed, no trace).
    """

    boundary: str
    x: tuple[int, ...]
    seed: int | None
    base: dict[str, Any]
    overrides: dict[str, Any]


def run_point(task: RunTask) -> dict[str, Any]:
    """Load and run one design point (trace disabled); bad input becomes a status, not a raise.

    Returns the run summary's scalar entries, the scenario facts (:data:`SCENARIO_FACTS`), the
    derived metrics (``time_per_sequence_s``, ``energy_per_sequence_j`` in J per sequence,
    ``energy_delay_product_js`` in J s), ``status`` and ``reason``.
    """
    from twin.api import load_scenario, run

    try:
        scen = load_scenario(task.base, task.overrides)
    except InfeasibleConfig as exc:
        return {"status": "infeasible", "reason": _reason(exc)}
    except ScenarioError as exc:
        return {"status": "invalid", "reason": _reason(exc)}
    summary = run(scen).summary
    return metrics_row(scen, summary)


def metrics_row(scen: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """The flat record of a finished run: scalar summary keys + scenario facts + derived."""
    row: dict[str, Any] = {k: (v if isinstance(v, (bool, str)) else float(v))
                           for k, v in summary.items()
                           if isinstance(v, (bool, str, Number))}
    # distances to the physical bounds (twin.limits): landauer_orders_of_magnitude,
    # shannon_hartley_orders_of_magnitude, roofline_..., communication_... (log10 actual/bound)
    for name, orders in (summary.get("limits_orders_of_magnitude") or {}).items():
        row[f"{name}_orders_of_magnitude"] = math.nan if orders is None else float(orders)
    w = scen.workload
    par = w.parallelism
    facts = {"dp": par.dp, "tp": par.tp, "pp": par.pp, "micro_batch": w.micro_batch,
             "global_batch": w.global_batch,
             "microbatches": w.global_batch // (par.dp * w.micro_batch),
             "schedule": w.schedule, "virtual_stages": w.virtual_stages,
             "precision": w.precision, "placement": w.placement, "recompute": w.recompute}
    row.update(facts)
    t = row.get("iteration_time_s", math.nan)
    e = row.get("energy_per_iteration_j", math.nan)
    row["time_per_sequence_s"] = t / w.global_batch
    row["energy_per_sequence_j"] = e / w.global_batch
    row["energy_delay_product_js"] = t * e
    row["status"] = "ok"
    row["reason"] = ""
    if summary.get("completed") is False:  # e.g. failures left the job without a path
        row["status"] = "incomplete"
        row["reason"] = (f"the run stopped after {summary.get('iterations_completed', '?')} of "
                         f"{w.iterations} iterations")
    return row


def _reason(exc: ScenarioError) -> str:
    return "; ".join(str(p) for p in exc.problems) or str(exc)


class PointCache:
    """Every run of a sweep, keyed by (boundary, x, seed); aggregated rows per (boundary, x).

    ``ensure`` runs only what is not cached yet, so a point is never run twice.
    """

    def __init__(self, sweep: Sweep, runner: TaskRunner, journal: str | Path | None = None,
                 resume: bool = False):
        self.sweep = sweep
        self.runner = runner
        self.runs: dict[tuple[str, tuple[int, ...], int | None], dict[str, Any]] = {}
        self._rows: dict[Key, dict[str, Any]] = {}
        self.twin_runs = 0
        self._journaled: set[tuple[str, tuple[int, ...], int | None]] = set()
        self._requested: dict[Key, None] = {}
        self.journal = JsonLines(journal) if journal else None
        if self.journal is not None:
            for rec in self.journal.start(resume):
                self._reuse(rec)

    def _fingerprint(self, bc: str, x: tuple[int, ...], seed: int | None) -> str:
        import hashlib

        text = json.dumps({"base": self.sweep.base,
                           "overrides": self.sweep.overrides(bc, x, seed)},
                          sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def _reuse(self, rec: dict[str, Any]) -> None:
        """Keep a journaled run if its scenario (base + overrides) is unchanged."""
        try:
            bc, x, seed = rec["boundary"], tuple(rec["x"]), rec["seed"]
            self.sweep.boundary(bc)
            if len(x) != len(self.sweep.space.shape) or any(
                    not 0 <= i < n for i, n in zip(x, self.sweep.space.shape, strict=True)):
                return
            if rec["fingerprint"] != self._fingerprint(bc, x, seed):
                return
        except (ValueError, KeyError, TypeError):
            return
        self.runs[(bc, x, seed)] = rec["result"]
        self._journaled.add((bc, x, seed))

    @property
    def resumed_runs(self) -> int:
        """Runs taken from the journal instead of being run again."""
        return sum((b, x) in self._requested for b, x, _ in self._journaled)

    def _append(self, task: RunTask, result: dict[str, Any]) -> None:
        if self.journal is None:
            return
        self.journal.add({"boundary": task.boundary, "x": list(task.x), "seed": task.seed,
                          "fingerprint": self._fingerprint(task.boundary, task.x, task.seed),
                          "result": result})

    def ensure(self, keys: Iterable[Key], desc: str = "runs") -> None:
        """Run every seed of every (boundary, x) in ``keys`` that is not cached."""
        todo: dict[tuple, RunTask] = {}
        for bc, x in keys:
            x = tuple(int(i) for i in x)
            self._requested.setdefault((bc, x), None)
            for s in self.sweep.seeds:
                k = (bc, x, s)
                if k not in self.runs and k not in todo:
                    todo[k] = RunTask(bc, x, s, self.sweep.base, self.sweep.overrides(bc, x, s))
        for task, res in self.runner.map(todo.values(), desc):
            if isinstance(res, BaseException):
                res = {"status": "error", "reason": f"{type(res).__name__}: {res}"}
            elif not isinstance(res, dict) or "status" not in res:
                res = {"status": "error", "reason": f"run returned {type(res).__name__}"}
            if res["status"] not in ("invalid", "infeasible"):
                self.twin_runs += 1
            self.runs[(task.boundary, task.x, task.seed)] = res
            self._append(task, res)

    def evaluated(self, bc: str) -> list[tuple[int, ...]]:
        """Points the search asked for under ``bc`` (all seeds done), in request order.

        Runs loaded from a journal but never asked for do not count: the number of points a
        search evaluated does not depend on what an earlier invocation left behind.
        """
        return [x for b, x in self._requested
                if b == bc and all((bc, x, s) in self.runs for s in self.sweep.seeds)]

    def row(self, bc: str, x: tuple[int, ...]) -> dict[str, Any]:
        """The aggregated record of a point (see :func:`aggregate`)."""
        key = (bc, tuple(x))
        if key not in self._rows:
            results = [self.runs[(bc, key[1], s)] for s in self.sweep.seeds]
            self._rows[key] = aggregate(self.sweep, bc, key[1], results)
        return self._rows[key]

    def objectives(self, bc: str, xs: Iterable[tuple[int, ...]]):
        """(F, G) arrays for pymoo: objectives (1e30 when not ok) and constraint violation."""
        import numpy as np

        cols = self.sweep.objective_columns()
        F, G = [], []
        for x in xs:
            r = self.row(bc, x)
            if r["status"] == "ok":
                F.append([r[c] for c in cols])
                G.append([0.0])
            else:
                F.append([1e30, 1e30])
                G.append([r.get("violation", HARD_VIOLATION)])
        return np.array(F, dtype=float), np.array(G, dtype=float)

    def table(self, boundaries: Iterable[str] | None = None) -> pd.DataFrame:
        """Aggregated rows of every evaluated point (one row per boundary and point)."""
        names = list(boundaries or [b.name for b in self.sweep.boundaries])
        rows = [self.row(bc, x) for bc in names for x in self.evaluated(bc)]
        return _frame(rows, self.sweep)

    def run_table(self) -> pd.DataFrame:
        """Every single run (boundary, point, seed) with its raw record."""
        import pandas as pd

        sp = self.sweep.space
        rows = []
        for (bc, x, s), r in self.runs.items():
            rows.append({"boundary": bc, "x": _xstr(x), "label": sp.label(x), "seed": s, **r})
        return pd.DataFrame(rows)


def _xstr(x: tuple[int, ...]) -> str:
    return "-".join(map(str, x))


def aggregate(sweep: Sweep, bc: str, x: tuple[int, ...],
              results: list[dict[str, Any]]) -> dict[str, Any]:
    """One point's record from its runs (one per seed).

    Numbers are averaged over the seeds whose run succeeded; with several seeds the metrics of
    :data:`ROBUST_METRICS`, the objectives and the constraint metrics also get ``_std`` (sample
    standard deviation, ddof=1) and a quantile column (``_p95``: ``numpy.quantile``, linear
    interpolation). Then the constraints are checked on the statistic the sweep optimizes.
    """
    import numpy as np

    sp = sweep.space
    row: dict[str, Any] = {"boundary": bc, "x": _xstr(x), "label": sp.label(x),
                           "strategy": sp.strategy(x)}
    for name, v in sp.values(x).items():
        row[name] = v if not isinstance(v, (list, tuple, dict)) else json.dumps(v)
    ok = [r for r in results if r.get("status") == "ok"]
    bad = [r for r in results if r.get("status") != "ok"]
    if bad:
        worst = max(bad, key=lambda r: STATUSES.index(r.get("status", "error")))
        row["status"] = worst.get("status", "error")
        row["reason"] = worst.get("reason", "")
        if len(results) > 1:
            row["reason"] = f"{len(bad)} of {len(results)} seeds: {row['reason']}"
    else:
        row["status"], row["reason"] = "ok", ""
    row["n_seeds"] = len(ok)
    keys: dict[str, None] = {}
    for r in ok:
        keys.update(dict.fromkeys(r))
    reserved = {"status", "reason", "boundary", "x", "label", "strategy", "feasible",
                "n_seeds", *sp.values(x)}  # a run never overwrites the point's own columns
    for k in keys:
        if k in reserved:
            continue
        vals = [r.get(k) for r in ok]
        if all(isinstance(v, Number) and not isinstance(v, bool) for v in vals):
            row[k] = float(np.mean(vals))
        else:
            uniq = list(dict.fromkeys(map(str, vals)))
            row[k] = vals[0] if len(uniq) == 1 else "|".join(uniq)
    robust = sweep.spec.robust
    if robust and len(ok) > 1:
        from experiments.sweep import quantile_suffix

        suffix = quantile_suffix(robust.quantile)
        for m in dict.fromkeys([*ROBUST_METRICS, *sweep.spec.objectives,
                                *sweep.spec.constraints]):
            vals = np.array([r[m] for r in ok if isinstance(r.get(m), Number)], dtype=float)
            if len(vals) == len(ok):
                row[f"{m}_std"] = float(np.std(vals, ddof=1))
                row[f"{m}{suffix}"] = float(np.quantile(vals, robust.quantile))
    elif robust and ok:  # one seed succeeded: its quantile is its value
        from experiments.sweep import quantile_suffix

        suffix = quantile_suffix(robust.quantile)
        for m in dict.fromkeys([*sweep.spec.objectives, *sweep.spec.constraints]):
            if isinstance(row.get(m), float):
                row[f"{m}{suffix}"] = row[m]
    if row["status"] == "ok":
        _apply_constraints(sweep, row)
    row["feasible"] = row["status"] == "ok"
    return row


def _apply_constraints(sweep: Sweep, row: dict[str, Any]) -> None:
    cols = sweep.objective_columns()
    for c in cols:
        v = row.get(c)
        if not isinstance(v, float) or not math.isfinite(v):
            row["status"] = "unbounded" if isinstance(v, float) else "error"
            row["reason"] = (f"{c} is {v} (not finite: the twin reports no finite value)"
                             if isinstance(v, float) else f"the run reports no {c}")
            return
    stat = sweep.objective_columns()[0][len(sweep.spec.objectives[0]):]  # "" or "_p95"
    violation, why = 0.0, []
    for m, b in sweep.spec.constraints.items():
        v = row.get(f"{m}{stat}", row.get(m))
        if not isinstance(v, float):
            continue
        if b.max is not None and v > b.max:
            violation += (v - b.max) / max(abs(b.max), 1e-300)
            why.append(f"{m}{stat} = {v:.6g} > max {b.max:g}")
        if b.min is not None and v < b.min:
            violation += (b.min - v) / max(abs(b.min), 1e-300)
            why.append(f"{m}{stat} = {v:.6g} < min {b.min:g}")
    if why:
        row["status"] = "constraint"
        row["reason"] = "; ".join(why)
        row["violation"] = violation


def _frame(rows: list[dict[str, Any]], sweep: Sweep) -> pd.DataFrame:
    """Rows -> DataFrame with the leading columns in a fixed, readable order."""
    import pandas as pd

    df = pd.DataFrame(rows)
    dims = [d.name for d in sweep.space.dims]
    lead = ["boundary", "x", "label", "strategy", *dims, "status", "feasible", "reason",
            *sweep.spec.objectives, *sweep.objective_columns(), "mfu", "avg_power_w",
            "peak_power_w", *SCENARIO_FACTS, "n_seeds"]
    lead = [c for c in dict.fromkeys(lead) if c in df.columns]
    rest = [c for c in df.columns if c not in lead and c != "violation"]
    if df.empty:
        return pd.DataFrame(columns=lead)
    return df[lead + rest]
