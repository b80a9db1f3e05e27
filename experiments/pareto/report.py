"""The outputs of a sweep: every file in the output directory (:func:`write_outputs`, atomic) and
the text report ``twin pareto`` prints (:func:`format_report`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.many import atomic_write_table, atomic_write_text
from experiments.pareto.analysis import front_knee
from experiments.pareto.result import ParetoResult

if TYPE_CHECKING:
    import pandas as pd


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
        from experiments.pareto import plots as pl

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
        knee = front_knee(f, cols)
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
