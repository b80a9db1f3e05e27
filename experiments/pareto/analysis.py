"""What the evaluated points say: options that never ran, caveats (heavy tails), the knee, the
deformation of the front across boundary conditions, robust (multi-seed) fronts and NSGA-II
convergence.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from experiments.pareto.search import SearchTrace

if TYPE_CHECKING:
    import pandas as pd

    from experiments.sweep import Sweep


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


def front_knee(front: pd.DataFrame, cols: list[str]) -> dict[str, Any] | None:
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
    bknee = front_knee(bfront, cols)
    report: dict[str, Any] = {"baseline": base, "objectives": cols,
                              "reference_point": hv[base]["reference_point"] if hv else None,
                              "boundaries": {}}
    rows = []
    for bc in names:
        f = fronts[bc]
        knee = front_knee(f, cols)
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


def convergence(sweep: Sweep, traces: dict[str, SearchTrace],
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
