"""Pareto fronts of two minimized objectives: extraction, hypervolume, knee point, shape.

Conventions: ``F`` is an ``(n, 2)`` float array, both columns minimized (iteration time in s and
energy per iteration in J in the sweeps). Non-finite rows are never on a front.

Definitions used throughout (documented here once):

* **Non-dominated**: row ``i`` is on the front iff no row ``j`` has ``F[j] <= F[i]`` in both
  objectives and ``F[j] < F[i]`` in at least one. Exact duplicates of a front point are all on
  the front.
* **Hypervolume** (pymoo ``HV``): area dominated by the front and bounded by a reference point
  ``r`` (in objective units, here s x J). ``hv_norm`` divides by the box between the ideal point
  and ``r``, giving a fraction in [0, 1] that does not depend on units. Fronts are only
  comparable against a *common* reference point (:func:`reference_point`).
* **Knee**: after scaling each objective to [0, 1] by the front's own extremes, the front point
  farthest from the straight line through the two extreme points (the "maximum distance to the
  chord" knee). A front of one or two points has its point closest to the ideal (L2) as knee.
* **Shape** (:func:`shape_analysis`): front points with identical objective values count as
  one position. With each objective scaled by the front's span, a *jump* is a gap between
  neighbouring positions that is at least ``jump_fraction`` of the front's total (normalized)
  polyline length *and* at least ``jump_median_factor`` times the median gap (both conditions:
  a gap must be large relative to the span and to the typical spacing; fronts of fewer than 3
  positions therefore never report a jump). A position is *non-convex* when it lies more than
  ``concavity_tol`` (in units of the second objective's span) above the lower convex hull of
  the front; consecutive such positions form a non-convex segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd


# ----------------------------------------------------------------------------- extraction
def pareto_mask(F: np.ndarray) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``F`` (two objectives, minimized).

    O(n log n): rows are sorted by (f1, f2); a row survives if its f2 is the smallest among
    rows with the same f1 and strictly below the best f2 of all rows with smaller f1.
    """
    F = np.asarray(F, dtype=float)
    if F.ndim != 2 or F.shape[1] != 2:
        raise ValueError(f"pareto_mask needs an (n, 2) array, got shape {F.shape}")
    n = len(F)
    mask = np.zeros(n, dtype=bool)
    finite = np.isfinite(F).all(axis=1)
    idx = np.flatnonzero(finite)
    if not len(idx):
        return mask
    order = idx[np.lexsort((F[idx, 1], F[idx, 0]))]
    best = np.inf  # smallest f2 among rows with strictly smaller f1
    i = 0
    while i < len(order):
        j = i
        f1 = F[order[i], 0]
        while j < len(order) and F[order[j], 0] == f1:
            j += 1
        group = order[i:j]
        gmin = F[group[0], 1]  # sorted by f2 within equal f1
        if gmin < best:
            mask[group[F[group, 1] == gmin]] = True
            best = gmin
        i = j
    return mask


def pareto_front(df: pd.DataFrame, objectives: Sequence[str],
                 feasible: str | None = "feasible") -> pd.DataFrame:
    """The non-dominated rows of ``df`` (only rows with ``df[feasible]`` true), sorted by the
    objectives (and by ``label`` among identical points)."""
    sel = df if feasible is None or feasible not in df else df[df[feasible].astype(bool)]
    if sel.empty:
        return sel.copy()
    F = sel[list(objectives)].to_numpy(dtype=float)
    front = sel[pareto_mask(F)]
    keys = list(objectives) + (["label"] if "label" in front else [])  # ties: by label
    return front.sort_values(keys, kind="mergesort")


# ----------------------------------------------------------------------------- indicators
def reference_point(fronts: Sequence[np.ndarray], margin: float = 0.1) -> np.ndarray:
    """A common hypervolume reference point: the nadir of all fronts plus ``margin`` of their
    span in each objective (so the extreme points contribute area)."""
    pts = [np.asarray(f, dtype=float).reshape(-1, 2) for f in fronts if len(f)]
    if not pts:
        raise ValueError("no front points to derive a reference point from")
    allp = np.vstack(pts)
    allp = allp[np.isfinite(allp).all(axis=1)]
    lo, hi = allp.min(axis=0), allp.max(axis=0)
    span = hi - lo
    span = np.where(span > 0, span, np.abs(hi) * 0.1 + 1e-300)
    return hi + margin * span


def ideal_point(fronts: Sequence[np.ndarray]) -> np.ndarray:
    """Component-wise minimum over all fronts."""
    allp = np.vstack([np.asarray(f, dtype=float).reshape(-1, 2) for f in fronts if len(f)])
    return allp.min(axis=0)


def hypervolume(F: np.ndarray, ref: Sequence[float]) -> float:
    """Hypervolume (pymoo ``HV``) of the points ``F`` w.r.t. ``ref``, in objective units.

    Points not strictly better than ``ref`` in both objectives contribute nothing.
    """
    from pymoo.indicators.hv import HV

    F = np.asarray(F, dtype=float).reshape(-1, 2)
    ref = np.asarray(ref, dtype=float)
    F = F[np.isfinite(F).all(axis=1) & (F < ref).all(axis=1)]
    if not len(F):
        return 0.0
    return float(HV(ref_point=ref)(F))


def knee_index(F: np.ndarray) -> int:
    """Index (into ``F``) of the knee of a front (see the module docstring)."""
    F = np.asarray(F, dtype=float).reshape(-1, 2)
    if not len(F):
        raise ValueError("empty front has no knee")
    lo, hi = F.min(axis=0), F.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    Z = (F - lo) / span
    if len(F) <= 2:
        return int(np.argmin(np.hypot(Z[:, 0], Z[:, 1])))
    a = Z[np.argmin(Z[:, 0])]  # fastest extreme
    b = Z[np.argmin(Z[:, 1])]  # most frugal extreme
    d = b - a
    norm = np.hypot(*d)
    if norm == 0:
        return int(np.argmin(Z.sum(axis=1)))
    # signed distance from the chord, positive on the side of the ideal point (0, 0)
    dist = (d[0] * (Z[:, 1] - a[1]) - d[1] * (Z[:, 0] - a[0])) / norm
    towards_ideal = (d[0] * (0 - a[1]) - d[1] * (0 - a[0])) / norm
    if towards_ideal < 0:
        dist = -dist
    return int(np.argmax(dist))


# ----------------------------------------------------------------------------- shape
def lower_convex_hull(P: np.ndarray) -> np.ndarray:
    """Indices of the vertices of the lower convex hull of 2-D points, by increasing x
    (Andrew's monotone chain, collinear points dropped; of points sharing an x only the
    lowest, so the hull is a function of x)."""
    P = np.asarray(P, dtype=float)
    order = np.lexsort((P[:, 1], P[:, 0]))
    hull: list[int] = []
    for i in order:
        if hull and P[hull[-1], 0] == P[i, 0]:
            continue  # above the hull's point at this x (sorted by y within an x)
        while len(hull) >= 2:
            o, a = P[hull[-2]], P[hull[-1]]
            cross = (a[0] - o[0]) * (P[i, 1] - o[1]) - (a[1] - o[1]) * (P[i, 0] - o[0])
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(int(i))
    return np.array(hull, dtype=int)


def hull_depth(P: np.ndarray) -> np.ndarray:
    """Vertical distance of each point above the lower convex hull (0 on the hull)."""
    P = np.asarray(P, dtype=float)
    h = lower_convex_hull(P)
    hx, hy = P[h, 0], P[h, 1]
    if len(h) == 1:
        return P[:, 1] - hy[0]
    return P[:, 1] - np.interp(P[:, 0], hx, hy)


def shape_analysis(front: pd.DataFrame, objectives: Sequence[str], params: Sequence[str],
                   label: str = "label", jump_fraction: float = 0.25,
                   jump_median_factor: float = 3.0, concavity_tol: float = 0.005
                   ) -> dict[str, Any]:
    """Jumps and non-convex segments of a front (definitions in the module docstring).

    Front points with identical objective values (e.g. two placements that make no
    difference) form one *position*; gaps, jumps and the convex hull are computed over the
    distinct positions, so a duplicate never counts as a gap of zero.

    Args:
        front: the non-dominated points (any order), with objective, parameter and label
            columns.
        objectives: the two objective columns (minimized).
        params: the design-parameter columns; each jump reports which of them change between
            its two neighbouring positions (``changed``: value on each side, a list when a
            position holds several points) and which separate the two sides completely
            (``separating``: no value in common between the points left and right of the jump,
            up to the neighbouring jumps).
        label: column naming each point.

    Returns:
        A JSON-ready dict: ``n_points``, ``n_positions``, ``span`` (objective ranges),
        ``thresholds``, ``gaps`` (normalized, between consecutive positions), ``jumps``,
        ``nonconvex_segments``, ``convex`` and ``smooth`` (no jump and convex).
    """
    objectives = list(objectives)
    f = (front.sort_values(objectives, kind="mergesort").reset_index(drop=True)
         if len(front) else front)
    if label not in f:
        f[label] = [str(i) for i in range(len(f))]
    n = len(f)
    out: dict[str, Any] = {
        "n_points": n, "n_positions": 0,
        "thresholds": {"jump_fraction": jump_fraction, "jump_median_factor": jump_median_factor,
                       "concavity_tol": concavity_tol},
        "span": {}, "gaps": [], "jumps": [], "nonconvex_segments": [],
    }
    if n == 0:
        out.update(convex=True, smooth=True)
        return out
    F = f[objectives].to_numpy(dtype=float)
    groups: list[list[int]] = []  # rows with identical objectives are adjacent once sorted
    for i in range(n):
        if groups and (F[i] == F[groups[-1][0]]).all():
            groups[-1].append(i)
        else:
            groups.append([i])
    m = len(groups)
    out["n_positions"] = m
    P = F[[g[0] for g in groups]]
    lo, hi = P.min(axis=0), P.max(axis=0)
    out["span"] = {o: float(h - lo_) for o, lo_, h in zip(objectives, lo, hi, strict=True)}
    span = np.where(hi > lo, hi - lo, 1.0)
    Z = (P - lo) / span
    gaps = np.hypot(*np.diff(Z, axis=0).T) if m > 1 else np.zeros(0)
    out["gaps"] = [float(g) for g in gaps]
    total = float(gaps.sum())
    med = float(np.median(gaps)) if len(gaps) else 0.0
    jumps_at = [i for i, g in enumerate(gaps)
                if m >= 3 and total > 0 and g >= jump_fraction * total
                and g >= jump_median_factor * med]

    def rows(g0: int, g1: int) -> pd.DataFrame:  # the points of positions g0..g1-1
        return f.iloc[[r for g in groups[g0:g1] for r in g]]

    def values(df: pd.DataFrame, p: str) -> Any:
        vals = sorted({_plain(v) for v in df[p]}, key=str)
        return vals[0] if len(vals) == 1 else vals

    bounds = [0, *[i + 1 for i in jumps_at], m]
    for k, i in enumerate(jumps_at):
        left, right = rows(bounds[k], i + 1), rows(i + 1, bounds[k + 2])
        a, b = rows(i, i + 1), rows(i + 1, i + 2)
        changed = {p: [values(a, p), values(b, p)] for p in params
                   if set(map(_key, a[p])) != set(map(_key, b[p]))}
        separating = [p for p in params
                      if not set(map(_key, left[p])) & set(map(_key, right[p]))]
        out["jumps"].append({
            "after": _plain(a[label].iloc[0]), "before": _plain(b[label].iloc[0]),
            "after_group": [_plain(v) for v in a[label]],
            "before_group": [_plain(v) for v in b[label]],
            "index": i,
            "gap": float(gaps[i]),
            "gap_fraction": float(gaps[i] / total),
            "gap_over_median": float(gaps[i] / med) if med > 0 else None,
            "delta": {o: float(P[i + 1, j] - P[i, j]) for j, o in enumerate(objectives)},
            "changed": changed,
            "separating": separating,
        })
    depth = hull_depth(Z) if m >= 3 else np.zeros(m)
    above = depth > concavity_tol
    i = 0
    while i < m:
        if not above[i]:
            i += 1
            continue
        j = i
        while j < m and above[j]:
            j += 1
        seg = rows(i, j)
        out["nonconvex_segments"].append({
            "points": [_plain(v) for v in seg[label]],
            "first_position": i,
            "last_position": j - 1,
            "max_depth": float(depth[i:j].max()),
            "params": {p: sorted({_plain(v) for v in seg[p]}, key=str) for p in params},
        })
        i = j
    out["convex"] = not out["nonconvex_segments"]
    out["smooth"] = out["convex"] and not out["jumps"]
    return out


def compare_fronts(base: pd.DataFrame, other: pd.DataFrame, key: str = "label"
                   ) -> dict[str, list[Any]]:
    """Which ``key`` values left, joined or stayed on the front from ``base`` to ``other``."""
    a, b = set(base[key]), set(other[key])
    return {"left": sorted(a - b, key=str), "joined": sorted(b - a, key=str),
            "stayed": sorted(a & b, key=str)}


def _key(v: Any) -> Any:
    return repr(v) if isinstance(v, (list, dict)) else v


def _plain(v: Any) -> Any:
    """A JSON-ready version of a pandas / numpy scalar."""
    if isinstance(v, np.generic):
        return v.item()
    return v
