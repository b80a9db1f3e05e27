"""The sweep driver: :func:`run_sweep` evaluates a sweep (search), then extracts and analyses
its fronts into a :class:`~experiments.pareto.result.ParetoResult`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.many import TaskRunner
from experiments.pareto.analysis import (
    caveats,
    convergence,
    dead_options,
    deformation,
    robust_fronts,
)
from experiments.pareto.evaluate import PointCache, RunTask, run_point
from experiments.pareto.result import ParetoResult
from experiments.pareto.search import SearchTrace, cross_evaluate, exhaustive, nsga2

if TYPE_CHECKING:
    import pandas as pd

    from experiments.sweep import Sweep


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
    traces: dict[str, SearchTrace] = {}
    if meth == "exhaustive":
        exhaustive(sweep, cache)
    else:
        traces = nsga2(sweep, cache, search_seed)
        if len(sweep.boundaries) > 1:
            cross_evaluate(sweep, cache)
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
