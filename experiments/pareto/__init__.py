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

The package, one module per stage: :mod:`~experiments.pareto.evaluate` (runs, the point cache,
statuses), :mod:`~experiments.pareto.search` (exhaustive, NSGA-II),
:mod:`~experiments.pareto.analysis` (fronts' knee, deformation, robust fronts, convergence),
:mod:`~experiments.pareto.result` (:class:`ParetoResult`), :mod:`~experiments.pareto.run`
(:func:`run_sweep`), :mod:`~experiments.pareto.report` (files and text),
:mod:`~experiments.pareto.plots` (PNGs) and :mod:`~experiments.pareto.command` (``twin
pareto``). The ``twin`` CLI imports it at start-up, so heavy imports (NumPy, pandas, pymoo,
Dask, matplotlib) happen inside the functions that need them.
"""

from __future__ import annotations

from experiments.pareto.command import ParetoCommand
from experiments.pareto.evaluate import (
    STATUSES,
    PointCache,
    RunTask,
    aggregate,
    metrics_row,
    run_point,
)
from experiments.pareto.report import format_report, write_outputs
from experiments.pareto.result import ParetoResult
from experiments.pareto.run import run_sweep

__all__ = [
    "STATUSES",
    "ParetoCommand",
    "ParetoResult",
    "PointCache",
    "RunTask",
    "aggregate",
    "format_report",
    "metrics_row",
    "run_point",
    "run_sweep",
    "write_outputs",
]
