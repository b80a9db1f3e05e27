"""What a sweep produced (:class:`ParetoResult`): the type the driver fills and the report and
plots read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from experiments.sweep import Sweep


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
