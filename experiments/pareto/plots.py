"""Pictures of a Pareto sweep (PNG via ``matplotlib.figure.Figure``, no pyplot state).

* :func:`plot_fronts` - ``pareto.png``: per boundary condition, every evaluated point coloured
  by parallel strategy, points that violate a constraint as grey crosses, the front as a black
  line with its points labelled, the knee as a star.
* :func:`plot_deformation` - ``deformation.png``: the fronts of all boundary conditions overlaid.
* :func:`plot_robust` - ``robust.png``: fronts of the seed mean and of the seed quantile side by
  side.
* :func:`plot_convergence` - ``convergence.png``: NSGA-II hypervolume vs points evaluated.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments import front as fr

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes

    from experiments.pareto.result import ParetoResult

MAX_LABELS = 14


def _save(fig: Figure, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=110)
    return out


def _legend(ax: Axes, **kw) -> None:
    """A legend, if anything on the axes has a label."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _axes_labels(ax: Axes, cols: list[str]) -> None:
    ax.set_xlabel(cols[0])
    ax.set_ylabel(cols[1])
    ax.grid(True, alpha=0.3)


def _log_if_wide(ax: Axes, df: pd.DataFrame, cols: list[str]) -> None:
    for c, setter in zip(cols, (ax.set_xscale, ax.set_yscale), strict=True):
        v = df[c].to_numpy(dtype=float)
        v = v[np.isfinite(v) & (v > 0)]
        if len(v) and v.max() / v.min() > 30:
            setter("log")


def _colors(strategies: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return {s: cmap(i % 20) for i, s in enumerate(strategies)}


def _draw_front(ax: Axes, f: pd.DataFrame, cols: list[str], color: str = "black",
                label: str | None = None, annotate: bool = True) -> None:
    if f.empty:
        return
    ax.plot(f[cols[0]], f[cols[1]], "-o", color=color, mfc="none", ms=9, lw=1.2, label=label,
            zorder=3)
    k = fr.knee_index(f[cols].to_numpy(dtype=float))
    ax.plot(f[cols[0]].iloc[k], f[cols[1]].iloc[k], "*", color=color, ms=15, zorder=4)
    if not annotate:
        return
    # one label per position: identical points (e.g. placements that make no difference)
    # show the first label and how many more share the position
    pos: dict[tuple[float, float], list[str]] = {}
    for x, y, lab in zip(f[cols[0]], f[cols[1]], f["label"], strict=True):
        pos.setdefault((float(x), float(y)), []).append(str(lab))
    items = list(pos.items())
    if len(items) > MAX_LABELS:
        keep = {0, len(items) - 1, min(k, len(items) - 1)}
        items = [it for i, it in enumerate(items) if i in keep]
    for (x, y), labs in items:
        text = labs[0] + (f" (+{len(labs) - 1})" if len(labs) > 1 else "")
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=6.5,
                    color=color)


def _zoom(ax: Axes, f: pd.DataFrame, cols: list[str]) -> None:
    """Limit the axes to the neighbourhood of the front (3x its span, at least 10% of the
    best value, in each objective)."""
    if f.empty:
        return
    _zoom_to(ax, f[cols[0]].to_numpy(dtype=float), f[cols[1]].to_numpy(dtype=float))


def _zoom_to(ax: Axes, xs: np.ndarray, ys: np.ndarray) -> None:
    for v, setter in ((xs, ax.set_xlim), (ys, ax.set_ylim)):
        v = v[np.isfinite(v)]
        if not len(v):
            continue
        lo, hi = float(v.min()), float(v.max())
        width = max(3 * (hi - lo), 0.1 * abs(lo), 1e-300)
        setter(lo - 0.1 * width, lo + width)


def plot_fronts(result: ParetoResult, out: str | Path) -> Path:
    """``pareto.png``: one row per boundary condition: all points (left) and a zoom on the
    front (right)."""
    cols = list(result.sweep.objective_columns())
    names = list(result.fronts)
    fig = Figure(figsize=(15, 5.5 * len(names)), layout="constrained")
    pts = result.points
    strategies = sorted(pts["strategy"].dropna().unique(), key=str)
    colors = _colors(strategies)
    for n, bc in enumerate(names):
        p = pts[pts.boundary == bc]
        ok = p[p.status == "ok"]
        bad = p[(p.status == "constraint") & p[cols[0]].notna()] if cols[0] in p else p.iloc[:0]
        front = result.fronts[bc]
        for j in range(2):
            ax = fig.add_subplot(len(names), 2, 2 * n + j + 1)
            for s in strategies:
                q = ok[ok.strategy == s]
                if len(q):
                    ax.scatter(q[cols[0]], q[cols[1]], s=14, color=colors[s], alpha=0.75,
                               label=s if n == 0 and j == 0 and len(strategies) <= 30 else None)
            if len(bad):
                ax.scatter(bad[cols[0]], bad[cols[1]], marker="x", s=14, color="0.6",
                           label="violates a constraint" if n == 0 and j == 0 else None)
            _draw_front(ax, front, cols, annotate=j == 1)
            _axes_labels(ax, cols)
            if j == 0:
                if len(ok):
                    _log_if_wide(ax, ok, cols)
                c = p.status.value_counts().to_dict()
                ax.set_title(f"{bc}: {len(front)} on the front, "
                             + ", ".join(f"{v} {k}" for k, v in c.items()), fontsize=9)
                if n == 0 and len(strategies) <= 30:
                    _legend(ax, fontsize=6, ncol=2, title="strategy", title_fontsize=7)
            else:
                _zoom(ax, front, cols)
                ax.set_title(f"{bc}: near the front (star: knee)", fontsize=9)
    fig.suptitle(f"sweep {result.sweep.spec.name}: energy-latency Pareto front "
                 f"({result.method})")
    return _save(fig, out)


def plot_deformation(result: ParetoResult, out: str | Path) -> Path:
    """``deformation.png``: every boundary condition's front on one set of axes."""
    cols = list(result.sweep.objective_columns())
    fig = Figure(figsize=(8.5, 6), layout="constrained")
    ax = fig.add_subplot()
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    d = result.deformation or {"boundaries": {}}
    allf = [f for f in result.fronts.values() if len(f)]
    for i, (bc, f) in enumerate(result.fronts.items()):
        e = d["boundaries"].get(bc, {})
        hvc = e.get("hv_change")
        lab = bc if hvc is None or i == 0 else f"{bc} (HV {hvc * 100:+.3g}%)"
        _draw_front(ax, f, cols, color=cmap(i % 10), label=lab, annotate=len(allf) <= 2)
    if allf:
        import pandas as pd

        _log_if_wide(ax, pd.concat(allf), cols)
    _axes_labels(ax, cols)
    _legend(ax, fontsize=8)
    ax.set_title(f"sweep {result.sweep.spec.name}: fronts under each boundary condition "
                 f"(stars: knees)", fontsize=10)
    return _save(fig, out)


def plot_robust(result: ParetoResult, out: str | Path) -> Path:
    """``robust.png``: front of the seed mean (left) and of the seed quantile (right)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    stats = result.robust["statistics"] if result.robust else ["mean"]
    fig = Figure(figsize=(15, 6), layout="constrained")
    pts = result.points
    axes, xs, ys = [], [], []
    for j, stat in enumerate(stats):
        ax = fig.add_subplot(1, len(stats), j + 1)
        cols = list(result.sweep.objective_columns("mean" if stat == "mean" else "quantile"))
        if not set(cols) <= set(pts.columns):
            continue
        for i, b in enumerate(result.sweep.boundaries):
            p = pts[(pts.boundary == b.name) & pts.feasible.astype(bool)]
            ax.scatter(p[cols[0]], p[cols[1]], s=10, color=cmap(i % 10), alpha=0.3)
            f = fr.pareto_front(p, cols)
            _draw_front(ax, f, cols, color=cmap(i % 10), label=b.name,
                        annotate=len(result.sweep.boundaries) == 1)
            xs.append(f[cols[0]].to_numpy(dtype=float))
            ys.append(f[cols[1]].to_numpy(dtype=float))
        _axes_labels(ax, cols)
        _legend(ax, fontsize=8)
        ax.set_title(f"front of the {stat} over {len(result.sweep.seeds)} seeds "
                     f"(same axes; stars: knees)", fontsize=10)
        axes.append(ax)
    if xs:  # one zoom for both panels, so the fronts compare by eye
        for ax in axes:
            _zoom_to(ax, np.concatenate(xs), np.concatenate(ys))
    return _save(fig, out)


def plot_convergence(result: ParetoResult, out: str | Path) -> Path:
    """``convergence.png``: NSGA-II hypervolume against the number of points evaluated."""
    c = result.convergence
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    use_ratio = c is not None and "hv_ratio" in c and c["hv_ratio"].notna().any()
    col = "hv_ratio" if use_ratio else "hv_norm"
    if c is not None:
        for bc, g in c.groupby("boundary", sort=False):
            ax.plot(g["fraction_of_space"] * 100, g[col], "-o", ms=3, label=bc)
    ax.set_xlabel("points evaluated, % of the space")
    ax.set_ylabel("hypervolume / reference front's" if use_ratio
                  else "hypervolume (fraction of the ideal..reference box)")
    ax.grid(True, alpha=0.3)
    _legend(ax, fontsize=8)
    ax.set_title(f"sweep {result.sweep.spec.name}: NSGA-II convergence", fontsize=10)
    return _save(fig, out)
