"""Searching the design space: exhaustive enumeration, or NSGA-II (pymoo, integer-encoded, one
search per boundary condition in lockstep), and the cross-evaluation of every front point
under every boundary condition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from experiments.pareto.evaluate import PointCache

if TYPE_CHECKING:
    from experiments.sweep import Sweep


def exhaustive(sweep: Sweep, cache: PointCache) -> None:
    keys = [(b.name, x) for b in sweep.boundaries for x in sweep.space.points()]
    cache.ensure(keys, desc=f"{sweep.spec.name} (exhaustive)")


@dataclass
class SearchTrace:
    """NSGA-II progress of one boundary condition."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    fronts: list[Any] = field(default_factory=list)


def nsga2(sweep: Sweep, cache: PointCache, seed: int) -> dict[str, SearchTrace]:
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
        exhaustive(sweep, cache)
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
        traces[b.name] = SearchTrace()
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


def cross_evaluate(sweep: Sweep, cache: PointCache) -> None:
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
