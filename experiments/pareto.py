"""Energy-latency Pareto fronts of a design space, and how boundary conditions deform them.

``twin pareto SWEEP.yaml -o DIR`` evaluates a sweep (:mod:`experiments.sweep`): every design point
under every boundary condition (and every seed of ``robust``) is one twin run with the trace
disabled, executed on Dask (:mod:`experiments.many`). Small spaces are enumerated; large
ones are searched with NSGA-II (pymoo), integer-encoded: one variable per dimension holding the
option's index, SBX crossover and polynomial mutation with rounding, seeded. Evaluations are
cached by (boundary condition, parameter vector, seed), so no point is ever run twice.

A point's status is one of ``ok``, ``invalid`` (the scenario is rejected, e.g. tp does not
divide the heads), ``infeasible`` (it does not fit in HBM), ``constraint`` (a sweep constraint
such as a power cap is violated), ``unbounded`` (an objective is not finite, e.g. the twin
reports a diverging mean), ``incomplete`` (the run reports ``completed: false``, e.g. failures
stopped the job) or ``error`` (the run raised); only ``ok`` points can be on a front. With
several seeds the worst status of the seeds is the point's.
NSGA-II sees ``constraint`` points as mildly infeasible (the relative violation) and the
others as strongly infeasible (1000).

Outputs (:func:`write_outputs`): ``points.csv``, ``runs.csv``, ``pareto.csv``, ``pareto.png``,
``shape.json``; with several boundary conditions ``deformation.json``, ``deformation.csv``,
``deformation.png``; with several seeds ``pareto_robust.csv``, ``robust.json``, ``robust.png``;
with NSGA-II ``convergence.csv`` and ``convergence.png``; always ``report.json`` and
``report.txt``.

This module is imported by the ``twin`` CLI at start-up, so its heavy imports (NumPy, pandas,
pymoo, Dask, matplotlib) happen inside the functions that need them.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from numbers import Number
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.many import (
    JsonLines,
    ManyRunsCommand,
    TaskRunner,
    atomic_write_table,
    atomic_write_text,
)
from twin.kernel.errors import InfeasibleConfig, Problem, ScenarioError

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

#: Summary flags that qualify a run's numbers, with the value that means "no caveat" and what
#: the caveat means. A point whose runs disagree (or have the other value) carries the caveat;
#: the report counts them per boundary condition.
CAVEATS: dict[str, tuple[bool, str]] = {
    "memory_variance_infinite": (False, "infinite HBM service variance: mean waits have no "
                                        "finite limit; the objectives are sample values of "
                                        "finite runs"),
    "memory_converged": (True, "the HBM queue's running mean did not settle"),
    "memory_unstable": (False, "an HBM queue is unstable (load >= 1)"),
}


# ----------------------------------------------------------------------------- one run
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


# ----------------------------------------------------------------------------- evaluation
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


# ----------------------------------------------------------------------------- search
def _exhaustive(sweep: Sweep, cache: PointCache) -> None:
    keys = [(b.name, x) for b in sweep.boundaries for x in sweep.space.points()]
    cache.ensure(keys, desc=f"{sweep.spec.name} (exhaustive)")


@dataclass
class _Trace:
    """NSGA-II progress of one boundary condition."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    fronts: list[Any] = field(default_factory=list)


def _nsga2(sweep: Sweep, cache: PointCache, seed: int) -> dict[str, _Trace]:
    """NSGA-II, one search per boundary condition, run in lockstep so each generation's new
    points of all searches go to Dask as one batch."""
    import numpy as np
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.evaluator import Evaluator
    from pymoo.core.problem import Problem as MooProblem
    from pymoo.core.termination import NoTermination
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.operators.sampling.rnd import IntegerRandomSampling
    from pymoo.problems.static import StaticProblem

    from experiments.front import pareto_mask

    sp = sweep.space
    opt = sweep.spec.nsga2
    free = [i for i, n in enumerate(sp.shape) if n > 1]
    if not free:  # a single point: nothing to search
        _exhaustive(sweep, cache)
        return {}
    xu = np.array([sp.shape[i] - 1 for i in free], dtype=float)
    problem = MooProblem(n_var=len(free), n_obj=2, n_ieq_constr=1, xl=np.zeros(len(free)),
                         xu=xu, vtype=int)

    def full(v) -> tuple[int, ...]:
        x = [0] * len(sp.shape)
        for j, i in enumerate(free):
            x[i] = int(np.rint(v[j]))
        return tuple(x)

    budget = min(opt.max_evaluations or sp.size, sp.size)
    algs, traces = {}, {}
    for b in sweep.boundaries:
        alg = NSGA2(pop_size=opt.pop_size, sampling=IntegerRandomSampling(),
                    crossover=SBX(prob=0.9, eta=3.0, vtype=float, repair=RoundingRepair()),
                    mutation=PM(eta=3.0, vtype=float, repair=RoundingRepair()),
                    eliminate_duplicates=True)
        alg.setup(problem, termination=NoTermination(), seed=seed, verbose=False)
        algs[b.name] = alg
        traces[b.name] = _Trace()
    active = [b.name for b in sweep.boundaries]
    stale = dict.fromkeys(active, 0)  # generations in a row without a change of the front
    last_front: dict[str, frozenset] = {}
    gen = 0
    cols = sweep.objective_columns()
    while active:
        pops = {bc: algs[bc].ask() for bc in active}
        keys = [(bc, full(v)) for bc in active if pops[bc] is not None
                for v in pops[bc].get("X")]
        cache.ensure(keys, desc=f"{sweep.spec.name} nsga2 gen {gen}")
        still = []
        for bc in active:
            pop = pops[bc]
            if pop is None or len(pop) == 0:
                continue
            xs = [full(v) for v in pop.get("X")]
            F, G = cache.objectives(bc, xs)
            Evaluator().eval(StaticProblem(problem, F=F, G=G), pop)
            algs[bc].tell(infills=pop)
            done = cache.evaluated(bc)
            rows = [cache.row(bc, x) for x in done]
            ok = [r for r in rows if r["status"] == "ok"]
            Fa = np.array([[r[c] for c in cols] for r in ok], dtype=float).reshape(-1, 2)
            mask = pareto_mask(Fa) if len(Fa) else np.zeros(0, dtype=bool)
            traces[bc].fronts.append(Fa[mask])
            front_now = frozenset(r["x"] for r, on in zip(ok, mask, strict=True) if on)
            stale[bc] = stale[bc] + 1 if front_now == last_front.get(bc) else 0
            last_front[bc] = front_now
            traces[bc].rows.append({
                "boundary": bc, "generation": gen, "evaluated_points": len(done),
                "feasible_points": len(ok), "space_size": sp.size,
                "fraction_of_space": len(done) / sp.size, "twin_runs_total": cache.twin_runs})
            patient = opt.patience is None or stale[bc] < opt.patience
            if gen < opt.generations and len(done) < budget and patient:
                still.append(bc)
        active = still
        gen += 1
    return traces


# ----------------------------------------------------------------------------- results
@dataclass
class ParetoResult:
    """Everything a sweep produced (DataFrames and JSON-ready dicts).

    Attributes:
        sweep: the sweep.
        method: ``exhaustive`` or ``nsga2``.
        points: one row per (boundary, evaluated point), aggregated over seeds.
        runs: one row per single run (boundary, point, seed).
        fronts: boundary name -> its non-dominated feasible points (main statistic).
        shapes: boundary name -> :func:`experiments.front.shape_analysis` result.
        hv: boundary name -> {hv, hv_norm, reference_point, ideal_point}.
        deformation: report vs the first boundary condition (None with one boundary).
        deformation_table: per (boundary, front point) changes (None with one boundary).
        robust: per boundary, fronts of the mean and the quantile (None without seeds).
        robust_fronts: the points of those fronts (None without seeds).
        convergence: NSGA-II progress per generation (None when exhaustive).
        meta: sizes, counts, wall time, seed.
    """

    sweep: Sweep
    method: str
    points: pd.DataFrame
    runs: pd.DataFrame
    fronts: dict[str, pd.DataFrame]
    shapes: dict[str, dict[str, Any]]
    hv: dict[str, dict[str, Any]]
    deformation: dict[str, Any] | None = None
    deformation_table: pd.DataFrame | None = None
    robust: dict[str, Any] | None = None
    robust_fronts: pd.DataFrame | None = None
    convergence: pd.DataFrame | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def front_labels(self, boundary: str | None = None) -> list[str]:
        """Labels of the points on a boundary condition's front (default: the first)."""
        bc = boundary or self.sweep.boundaries[0].name
        return list(self.fronts[bc]["label"])


def run_sweep(sweep: Sweep, client: Any = None, method: str | None = None,
              seed: int | None = None, progress: bool = True,
              run_fn: Callable[[RunTask], dict] = run_point,
              reference: pd.DataFrame | None = None, journal: str | Path | None = None,
              resume: bool = False) -> ParetoResult:
    """Evaluate a sweep and analyse its fronts.

    Args:
        sweep: from :func:`experiments.sweep.load_sweep`.
        client: a ``dask.distributed.Client`` (see :func:`experiments.many.dask_client`);
            None runs in this process (tests, debugging).
        method: ``auto``/``exhaustive``/``nsga2`` (default: the sweep file's ``method``).
        seed: NSGA-II seed (default: ``nsga2.seed`` of the sweep file).
        run_fn: evaluates one :class:`RunTask` (default :func:`run_point`, a twin run); tests
            pass a table lookup.
        reference: a previous ``pareto.csv`` (e.g. of an exhaustive run); the NSGA-II
            convergence then reports ``hv_ratio`` against it (common reference point).
        journal: a JSON-lines file receiving every run as it finishes.
        resume: reuse the journal's runs whose scenario is unchanged (a killed sweep goes on
            where it stopped; NSGA-II is deterministic, so it replays to the same point).
    """
    from experiments import front as fr

    t0 = time.perf_counter()
    meth = sweep.method_for(method)
    cache = PointCache(sweep, TaskRunner(run_fn, client, progress), journal, resume)
    search_seed = sweep.spec.nsga2.seed if seed is None else seed
    traces: dict[str, _Trace] = {}
    if meth == "exhaustive":
        _exhaustive(sweep, cache)
    else:
        traces = _nsga2(sweep, cache, search_seed)
        if len(sweep.boundaries) > 1:
            _cross_evaluate(sweep, cache)
    points = cache.table()
    names = [b.name for b in sweep.boundaries]
    cols = list(sweep.objective_columns())
    fronts = {bc: fr.pareto_front(points[points.boundary == bc], cols) for bc in names}
    dims = [d.name for d in sweep.space.dims]
    sh = sweep.spec.shape
    shapes = {bc: fr.shape_analysis(f, cols, dims, jump_fraction=sh.jump_fraction,
                                    jump_median_factor=sh.jump_median_factor,
                                    concavity_tol=sh.concavity_tol)
              for bc, f in fronts.items()}
    Fs = [f[cols].to_numpy(dtype=float) for f in fronts.values() if len(f)]
    hv: dict[str, dict[str, Any]] = {}
    if Fs:
        ref = (list(sweep.spec.reference_point) if sweep.spec.reference_point
               else fr.reference_point(Fs).tolist())
        ideal = fr.ideal_point(Fs)
        box = float((ref[0] - ideal[0]) * (ref[1] - ideal[1]))
        for bc, f in fronts.items():
            v = fr.hypervolume(f[cols].to_numpy(dtype=float), ref) if len(f) else 0.0
            hv[bc] = {"hv": v, "hv_norm": v / box if box > 0 else math.nan,
                      "reference_point": ref, "ideal_point": ideal.tolist(),
                      "units": f"{cols[0]} x {cols[1]}"}
    result = ParetoResult(sweep, meth, points, cache.run_table(), fronts, shapes, hv)
    if len(names) > 1:
        result.deformation, result.deformation_table = deformation(sweep, points, fronts, hv)
    if sweep.spec.robust:
        result.robust, result.robust_fronts = robust_fronts(sweep, points)
    if traces:
        result.convergence = convergence(sweep, traces, reference)
    n_eval = {bc: int((points.boundary == bc).sum()) for bc in names}
    result.meta = {
        "sweep": sweep.spec.name, "method": meth, "space_size": sweep.space.size,
        "dimensions": {d.name: len(d.options) for d in sweep.space.dims},
        "boundary_conditions": names, "seeds": list(sweep.seeds),
        "evaluated_points": n_eval,
        "fraction_of_space": {bc: n / sweep.space.size for bc, n in n_eval.items()},
        "twin_runs": cache.twin_runs, "resumed_runs": cache.resumed_runs,
        "nsga2_seed": search_seed if meth == "nsga2" else None,
        "dead_options": dead_options(sweep, points),
        "caveats": {bc: caveats(points[points.boundary == bc]) for bc in names},
        "objectives": cols, "status_counts": {
            bc: points[points.boundary == bc].status.value_counts().to_dict() for bc in names},
        "wall_time_s": time.perf_counter() - t0,
    }
    return result


def _cross_evaluate(sweep: Sweep, cache: PointCache) -> None:
    """Evaluate every boundary's front points under every boundary, so 'left the front' means
    'evaluated and dominated (or infeasible)', not 'not found by this search'."""
    from experiments import front as fr

    cols = list(sweep.objective_columns())
    pts = cache.table()
    union: dict[tuple[int, ...], None] = {}
    for b in sweep.boundaries:
        f = fr.pareto_front(pts[pts.boundary == b.name], cols)
        union.update(dict.fromkeys(tuple(map(int, s.split("-"))) for s in f["x"]))
    cache.ensure([(b.name, x) for b in sweep.boundaries for x in union],
                 desc=f"{sweep.spec.name} cross-evaluation")


def dead_options(sweep: Sweep, points: pd.DataFrame) -> list[dict[str, Any]]:
    """Options that could not run in any point where they were tried (at least two points),
    with the most common reason: usually a mistake in the sweep file (e.g. a clock that is
    not a P-state), which only running the points can reveal."""
    out = []
    for d in sweep.space.dims:
        if d.name not in points or len(d.options) < 2:
            continue
        for opt in d.options:
            sel = points[points[d.name].astype(str) == str(opt.value)]
            if len(sel) >= 2 and sel.status.isin(["invalid", "infeasible"]).all():
                reason = sel.reason.astype(str).str.replace(r"^\d+ of \d+ seeds: ", "",
                                                            regex=True).mode().iloc[0]
                out.append({"dimension": d.name, "option": opt.label, "points": len(sel),
                            "status": sel.status.mode().iloc[0], "reason": reason})
    return out


def caveats(points: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per caveat flag of :data:`CAVEATS`: how many evaluated points carry it, and how many of
    them are on nothing but ``ok`` runs (JSON-ready)."""
    out = {}
    for key, (good, meaning) in CAVEATS.items():
        if key not in points:
            continue
        col = points[key]
        bad = col.notna() & (col.astype(str) != str(good))
        if bad.any():
            out[key] = {"points": int(bad.sum()), "ok_points": int((bad & (points.status == "ok"))
                                                                   .sum()),
                        "meaning": meaning}
    return out


def _knee(front: pd.DataFrame, cols: list[str]) -> dict[str, Any] | None:
    from experiments import front as fr

    if front.empty:
        return None
    r = front.iloc[fr.knee_index(front[cols].to_numpy(dtype=float))]
    return {"label": r["label"], "strategy": r["strategy"], "x": r["x"],
            **{c: float(r[c]) for c in cols}}


def deformation(sweep: Sweep, points: pd.DataFrame, fronts: dict[str, pd.DataFrame],
                hv: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], pd.DataFrame]:
    """How each boundary condition's front differs from the first one's.

    Per boundary: hypervolume (common reference point) and its relative change, the knee and
    its shift (absolute and relative to the baseline knee), the points (full labels) and
    strategies (dp-tp-pp) that left or joined the front, and for each point that left, what
    it became under that boundary (``dominated``, or its non-ok status and reason).
    """
    import pandas as pd

    from experiments import front as fr

    cols = list(sweep.objective_columns())
    names = [b.name for b in sweep.boundaries]
    base = names[0]
    bfront = fronts[base]
    bknee = _knee(bfront, cols)
    report: dict[str, Any] = {"baseline": base, "objectives": cols,
                              "reference_point": hv[base]["reference_point"] if hv else None,
                              "boundaries": {}}
    rows = []
    for bc in names:
        f = fronts[bc]
        knee = _knee(f, cols)
        pts = points[points.boundary == bc].set_index("label")
        cmp = fr.compare_fronts(bfront, f) if len(bfront) or len(f) else {
            "left": [], "joined": [], "stayed": []}
        strat = fr.compare_fronts(bfront, f, key="strategy")
        became = {}
        for lab in cmp["left"]:
            if lab in pts.index:
                r = pts.loc[lab]
                became[lab] = "dominated" if r["status"] == "ok" else (
                    f"{r['status']}: {r['reason']}")
            else:
                became[lab] = "not evaluated under this boundary condition"
        entry: dict[str, Any] = {
            "description": sweep.boundary(bc).description,
            "caveats": caveats(points[points.boundary == bc]),
            "overrides": dict(sweep.boundary(bc).set),
            "front_size": len(f),
            "hv": hv.get(bc, {}).get("hv", 0.0),
            "hv_norm": hv.get(bc, {}).get("hv_norm", 0.0),
            "hv_change": (hv[bc]["hv"] / hv[base]["hv"] - 1.0)
            if hv and hv[base]["hv"] > 0 else None,
            "knee": knee,
            "left": cmp["left"], "joined": cmp["joined"], "stayed": cmp["stayed"],
            "left_became": became,
            "strategies_left": strat["left"], "strategies_joined": strat["joined"],
        }
        if knee and bknee:
            entry["knee_moved"] = knee["label"] != bknee["label"]
            entry["knee_shift"] = {c: knee[c] - bknee[c] for c in cols}
            entry["knee_shift_rel"] = {c: knee[c] / bknee[c] - 1.0 if bknee[c] else None
                                       for c in cols}
        report["boundaries"][bc] = entry
        on = set(f["label"])
        on_base = set(bfront["label"])
        for lab in sorted(on | on_base, key=str):
            r = pts.loc[lab] if lab in pts.index else None
            change = ("stayed" if lab in on and lab in on_base else
                      "joined" if lab in on else "left")
            rows.append({"boundary": bc, "label": lab,
                         "strategy": (r["strategy"] if r is not None else None),
                         "on_front": lab in on, "on_baseline_front": lab in on_base,
                         "change": change,
                         "status": r["status"] if r is not None else "not evaluated",
                         **{c: (float(r[c]) if r is not None and c in r and
                                r["status"] == "ok" else math.nan) for c in cols}})
    return report, pd.DataFrame(rows)


def robust_fronts(sweep: Sweep, points: pd.DataFrame) -> tuple[dict[str, Any], pd.DataFrame]:
    """Fronts of the seed mean and of the seed quantile, per boundary condition.

    Both use the same points and feasibility; hypervolumes share one reference point.
    """
    import pandas as pd

    from experiments import front as fr

    mean_cols = list(sweep.objective_columns("mean"))
    q_cols = list(sweep.objective_columns("quantile"))
    q_name = q_cols[0][len(sweep.spec.objectives[0]) + 1:]
    out: dict[str, Any] = {"statistics": ["mean", q_name], "boundaries": {}}
    frames = []
    fronts: dict[tuple[str, str], pd.DataFrame] = {}
    for b in sweep.boundaries:
        pts = points[points.boundary == b.name]
        for stat, cols in (("mean", mean_cols), (q_name, q_cols)):
            if not set(cols) <= set(pts.columns):
                fronts[(b.name, stat)] = pts.iloc[:0]
                continue
            f = fr.pareto_front(pts, cols)
            fronts[(b.name, stat)] = f
            g = f.copy()
            g.insert(1, "statistic", stat)
            g["objective_1"] = g[cols[0]]
            g["objective_2"] = g[cols[1]]
            frames.append(g)
    Fs = [f[c].to_numpy(dtype=float) for (bc, stat), f in fronts.items()
          for c in [mean_cols if stat == "mean" else q_cols] if len(f)]
    ref = (list(sweep.spec.reference_point) if sweep.spec.reference_point
           else fr.reference_point(Fs).tolist()) if Fs else None
    out["reference_point"] = ref
    for b in sweep.boundaries:
        fm, fq = fronts[(b.name, "mean")], fronts[(b.name, q_name)]
        lm, lq = set(fm["label"]), set(fq["label"])
        out["boundaries"][b.name] = {
            "mean": {"labels": sorted(lm, key=str),
                     "hv": fr.hypervolume(fm[mean_cols].to_numpy(dtype=float), ref)
                     if ref and len(fm) else 0.0},
            q_name: {"labels": sorted(lq, key=str),
                     "hv": fr.hypervolume(fq[q_cols].to_numpy(dtype=float), ref)
                     if ref and len(fq) else 0.0},
            "only_mean": sorted(lm - lq, key=str), f"only_{q_name}": sorted(lq - lm, key=str),
            "both": sorted(lm & lq, key=str),
        }
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return out, table


def convergence(sweep: Sweep, traces: dict[str, _Trace],
                reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """NSGA-II progress: per boundary and generation, points evaluated, fraction of the space,
    hypervolume of the front found so far (common reference point over all generations and,
    if given, the reference run's front) and ``hv_ratio`` to the reference front."""
    import numpy as np
    import pandas as pd

    from experiments import front as fr

    cols = list(sweep.objective_columns())
    rows = []
    for bc, tr in traces.items():
        ref_front = None
        if reference is not None and set(cols) <= set(reference.columns):
            sel = reference
            if "boundary" in reference.columns:
                sel = reference[reference.boundary == bc]
            ref_front = sel[cols].to_numpy(dtype=float) if len(sel) else None
        Fs = [f for f in tr.fronts if len(f)] + ([ref_front] if ref_front is not None else [])
        if not Fs:  # nothing feasible found (yet)
            rows.extend({**r, "front_size": 0, "hv": 0.0, "hv_norm": math.nan,
                         "hv_ratio": math.nan} for r in tr.rows)
            continue
        ref = (np.array(sweep.spec.reference_point) if sweep.spec.reference_point
               else fr.reference_point(Fs))
        ideal = fr.ideal_point(Fs)
        box = float(np.prod(ref - ideal))
        hv_ref = fr.hypervolume(ref_front, ref) if ref_front is not None else None
        for r, f in zip(tr.rows, tr.fronts, strict=True):
            v = fr.hypervolume(f, ref) if len(f) else 0.0
            rows.append({**r, "front_size": len(f), "hv": v, "hv_norm": v / box,
                         "hv_ratio": v / hv_ref if hv_ref else math.nan})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- output
def write_outputs(result: ParetoResult, out_dir: str | Path, plots: bool = True) -> list[Path]:
    """Write every output file of a sweep into ``out_dir`` (created); returns the paths."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def csv(df: pd.DataFrame, name: str) -> None:
        written.append(atomic_write_table(df, out / name))

    def js(obj: Any, name: str) -> None:
        text = json.dumps(obj, indent=2, default=_json_default) + "\n"
        written.append(atomic_write_text(out / name, text))

    csv(result.points, "points.csv")
    csv(result.runs, "runs.csv")
    fronts = [f for f in result.fronts.values() if len(f)]
    csv(pd.concat(fronts, ignore_index=True) if fronts else result.points.iloc[:0],
        "pareto.csv")
    js(result.shapes, "shape.json")
    if result.deformation is not None:
        js(result.deformation, "deformation.json")
        csv(result.deformation_table, "deformation.csv")
    if result.robust is not None:
        js(result.robust, "robust.json")
        csv(result.robust_fronts, "pareto_robust.csv")
    if result.convergence is not None:
        csv(result.convergence, "convergence.csv")
    js({"meta": result.meta, "hypervolume": result.hv}, "report.json")
    written.append(atomic_write_text(out / "report.txt", format_report(result) + "\n"))
    if plots:
        from experiments import pareto_plots as pl

        written.append(pl.plot_fronts(result, out / "pareto.png"))
        if result.deformation is not None:
            written.append(pl.plot_deformation(result, out / "deformation.png"))
        if result.robust is not None:
            written.append(pl.plot_robust(result, out / "robust.png"))
        if result.convergence is not None and not result.convergence.empty:
            written.append(pl.plot_convergence(result, out / "convergence.png"))
    return written


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def format_report(result: ParetoResult) -> str:
    """The human-readable summary printed by ``twin pareto``."""
    m = result.meta
    cols = list(result.sweep.objective_columns())
    lines = [f"sweep {m['sweep']}: space of {m['space_size']} points "
             f"({', '.join(f'{k}:{v}' for k, v in m['dimensions'].items())}), method "
             f"{m['method']}, {len(m['boundary_conditions'])} boundary condition(s), "
             f"{len(m['seeds'])} seed(s) per point, {m['twin_runs']} twin runs, "
             f"{m['wall_time_s']:.1f} s"]
    for dead in m.get("dead_options", []):
        lines.append(f"note: space.{dead['dimension']} = {dead['option']} was {dead['status']} "
                     f"in all {dead['points']} points tried: {dead['reason']}")
    for bc, f in result.fronts.items():
        counts = m["status_counts"].get(bc, {})
        n = m["evaluated_points"][bc]
        lines.append(f"[{bc}] {n} points evaluated ({100 * n / m['space_size']:.0f}% of the "
                     f"space): " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        for key, c in m.get("caveats", {}).get(bc, {}).items():
            lines.append(f"  caveat: {c['points']} point(s) with {key}: {c['meaning']}")
        h = result.hv.get(bc)
        if h:
            lines.append(f"  front: {len(f)} points, hypervolume {h['hv']:.6g} "
                         f"({100 * h['hv_norm']:.1f}% of the box ideal..reference)")
        for _, r in f.iterrows():
            lines.append(f"    {r[cols[0]]:12.6g} {r[cols[1]]:12.6g}  {r['label']}")
        knee = _knee(f, cols)
        if knee:
            lines.append(f"  knee: {knee['label']} ({cols[0]} {knee[cols[0]]:.6g}, "
                         f"{cols[1]} {knee[cols[1]]:.6g})")
        s = result.shapes[bc]
        for j in s["jumps"]:
            ch = "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in j["changed"].items())
            lines.append(f"  jump after {j['after']!r}: gap {j['gap_fraction']:.0%} of the "
                         f"front's length ({j['gap_over_median'] or math.inf:.1f}x the median "
                         f"gap); "
                         f"changed: {ch or 'nothing'}; separating: "
                         f"{', '.join(j['separating']) or 'none'}")
        for seg in s["nonconvex_segments"]:
            lines.append(f"  non-convex: {', '.join(map(str, seg['points']))} (up to "
                         f"{seg['max_depth']:.3f} of the energy span above the convex hull)")
        if s["n_positions"] >= 3 and s["smooth"]:
            lines.append("  shape: no jump, convex")
    d = result.deformation
    if d:
        lines.append(f"deformation vs {d['baseline']} (common reference point "
                     f"{_fmt_list(d['reference_point'])}):")
        for bc, e in d["boundaries"].items():
            if bc == d["baseline"]:
                continue
            hvc = e["hv_change"]
            text = f"  {bc}: hypervolume {'n/a' if hvc is None else pct(hvc)}"
            if e.get("knee"):
                rel = e.get("knee_shift_rel") or {}
                where = (f"moved to {e['knee']['label']!r}" if e.get("knee_moved")
                         else "same point")
                shift = ", ".join(f"{c} {pct(v)}" for c, v in rel.items() if v is not None)
                text += f"; knee {where} ({shift})"
            lines.append(text)
            if e["left"]:
                lines.append(f"    left the front: {', '.join(map(str, e['left']))}")
            if e["joined"]:
                lines.append(f"    joined the front: {', '.join(map(str, e['joined']))}")
            if e["strategies_left"] or e["strategies_joined"]:
                lines.append(f"    strategies left: {', '.join(e['strategies_left']) or '-'}; "
                             f"joined: {', '.join(e['strategies_joined']) or '-'}")
    r = result.robust
    if r:
        q = r["statistics"][1]
        lines.append(f"robust fronts (mean vs {q} over {len(m['seeds'])} seeds):")
        for bc, e in r["boundaries"].items():
            lines.append(f"  [{bc}] mean front {len(e['mean']['labels'])} points, {q} front "
                         f"{len(e[q]['labels'])} points; only on the mean front: "
                         f"{', '.join(e['only_mean']) or '-'}; only on the {q} front: "
                         f"{', '.join(e[f'only_{q}']) or '-'}")
    c = result.convergence
    if c is not None and not c.empty:
        for bc, g in c.groupby("boundary", sort=False):
            last = g.iloc[-1]
            text = (f"nsga2 [{bc}]: {int(last.generation) + 1} generations, "
                    f"{int(last.evaluated_points)} points ({last.fraction_of_space:.1%} of the "
                    f"space)")
            if "hv_ratio" in g and math.isfinite(last.hv_ratio):
                text += f", hypervolume {last.hv_ratio:.1%} of the reference front's"
            lines.append(text)
    return "\n".join(lines)


def pct(v: float) -> str:
    """A relative change as a signed percentage with 3 significant digits (+12.3%, -0.00127%)."""
    return f"{v * 100:+.3g}%"


def _fmt_list(v: Any) -> str:
    return "n/a" if v is None else "[" + ", ".join(f"{x:.6g}" for x in v) + "]"


# ----------------------------------------------------------------------------- CLI
class ParetoCommand(ManyRunsCommand):
    """``twin pareto SWEEP.yaml -o DIR``: the subcommand (the CLI registers it)."""

    name = "pareto"
    help = "energy-latency Pareto front of a sweep (exhaustive or NSGA-II, on Dask)"
    input_name = "sweep"
    input_help = "sweep YAML file (see README: Pareto sweeps)"
    resume_help = "reuse the runs recorded in DIR/runs.jsonl by an earlier (e.g. killed) invocation"
    quiet_help = "no progress bars"

    def add_options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--method", choices=["auto", "exhaustive", "nsga2"],
                       help="search method (default: the sweep file's, else auto)")
        p.add_argument("--seed", type=int, help="NSGA-II seed (default: nsga2.seed)")
        p.add_argument("--reference", help="pareto.csv of an earlier (e.g. exhaustive) run: "
                       "report NSGA-II's hypervolume as a fraction of it")

    def load(self, args: argparse.Namespace) -> tuple[Sweep, pd.DataFrame | None]:
        """The sweep and the reference front (``--reference``), if any."""
        from experiments.sweep import load_sweep

        sweep = load_sweep(args.sweep)
        if not args.reference:
            return sweep, None
        import pandas as pd

        ref_path = Path(args.reference)
        if ref_path.is_dir():
            ref_path = ref_path / "pareto.csv"
        if not ref_path.is_file():
            raise ScenarioError([Problem("--reference", "file not found", args.reference,
                                         "a pareto.csv or the directory holding it")])
        return sweep, pd.read_csv(ref_path)

    def compute(self, job, args: argparse.Namespace, client) -> ParetoResult:
        sweep, reference = job
        return run_sweep(sweep, client=client, method=args.method, seed=args.seed,
                         progress=not args.quiet, reference=reference,
                         journal=Path(args.output) / "runs.jsonl", resume=args.resume)

    def report(self, job, result: ParetoResult, args: argparse.Namespace) -> int:
        paths = write_outputs(result, args.output, plots=not args.no_plots)
        print(format_report(result))
        print(f"wrote {len(paths)} files to {args.output}: "
              + ", ".join(p.name for p in paths))
        return 0
