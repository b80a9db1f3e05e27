"""HTML of a report: tables plus plots embedded as base64 PNGs (matplotlib ``Figure``, no
pyplot, no screen): the attribution per iteration, a timeline excerpt, per-device heatmaps on
the grid (energy, forwarded bytes, temperature) and power / temperature over time."""

from __future__ import annotations

import base64
import html
import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from twin.reading import TraceData


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return base64.b64encode(buf.getvalue()).decode()


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def attribution_plot(rep: dict[str, Any]) -> str:
    """:func:`attribution_figure` as a base64 PNG."""
    return _png(attribution_figure(rep))


def attribution_figure(rep: dict[str, Any]) -> Figure:
    """Horizontal stacked bar per iteration: one bar segment per category, its width the
    category's seconds in that iteration (0 where it has none), in the report's order."""
    its = rep["time"]["iterations"]
    cats = list(rep["time"]["mean"])
    fig = Figure(figsize=(10, 1.2 + 0.35 * len(its)))
    ax = fig.add_subplot()
    cmap = colormaps["tab20"]
    left = np.zeros(len(its))
    for k, c in enumerate(cats):
        w = np.array([it["categories"].get(c, 0.0) for it in its])
        ax.barh(np.arange(len(its)), w, left=left, label=c, color=cmap(k % 20))
        left += w
    ax.set_yticks(np.arange(len(its)))
    ax.set_yticklabels([f"iteration {it['iteration']}" for it in its], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25),
              frameon=False)
    fig.tight_layout()
    return fig


def heatmap_grids(td: TraceData) -> list[tuple[str, np.ndarray]] | None:
    """Per-device energy per iteration (J), forwarded GB per iteration and max die
    temperature (C) as ``(label, grid)``, ``grid[y, x]`` the device at those coordinates;
    None when the devices do not fill one flat x-y grid (a 3D torus, a switched cluster
    without coordinates, no devices table). No temperature grid when no device has one (no
    thermal or leakage data: the column is NaN)."""
    dev = td.table("devices")
    if dev.empty:
        return None
    nx_, ny = int(dev["x"].max()) + 1, int(dev["y"].max()) + 1
    if nx_ * ny != len(dev) or (dev["z"] != 0).any():
        return None
    iters = max(int(td.summary.get("iterations") or 1), 1)
    out = []
    for col, label, scale in (("energy_j", "energy per iteration (J)", iters),
                              ("forwarded_bytes", "forwarded GB per iteration", iters * 1e9),
                              ("max_temp_c", "max die temperature (C)", 1)):
        if dev[col].isna().all():
            continue
        grid = np.full((ny, nx_), np.nan)
        grid[dev["y"].to_numpy(), dev["x"].to_numpy()] = dev[col].to_numpy() / scale
        out.append((label, grid))
    return out


def heatmaps(td: TraceData) -> str | None:
    """:func:`heatmap_grids` side by side as a base64 PNG (None without grids)."""
    grids = heatmap_grids(td)
    if grids is None:
        return None
    fig = Figure(figsize=(12, 3.6))
    for k, (label, grid) in enumerate(grids):
        ax = fig.add_subplot(1, len(grids), k + 1)
        im = ax.imshow(grid, origin="lower", cmap="viridis")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    return _png(fig)


def power_plot(td: TraceData, max_classes: int = 8) -> str | None:
    """Board power and die temperature over time of the first rank classes."""
    pw = td.table("power")
    if pw.empty:
        return None
    fig = Figure(figsize=(10, 4.5))
    ax1, ax2 = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2, sharex=None)
    for c, g in list(pw.groupby("cls"))[:max_classes]:
        g = g.sort_values("t_start")
        t = np.column_stack([g["t_start"], g["t_end"]]).ravel()
        ax1.plot(t, np.repeat(g["watts"].to_numpy(), 2), lw=0.8, label=f"class {c}")
        ax2.plot(g["t_end"], g["temp_c"], lw=0.8)
    ax1.set_ylabel("board power (W)")
    ax2.set_ylabel("die temperature (C)")
    ax2.set_xlabel("time (s)")
    ax1.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    return _png(fig)


def timeline_excerpt(td: TraceData) -> str | None:
    """The timeline PNG of :func:`twin.plots.timeline` (first 16 rank classes)."""
    from twin.plots import timeline

    with tempfile.TemporaryDirectory() as d:
        p = timeline(td.path, Path(d) / "t.png", max_rows=16)
        return base64.b64encode(p.read_bytes()).decode()


def _table(rows: list[tuple], head: tuple) -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def render(rep: dict[str, Any], td: TraceData) -> str:
    """The whole HTML document."""
    v, t, e = rep["verdict"], rep["time"], rep["energy"]
    parts = [f"<h1>meshtwin report: {html.escape(str(rep['scenario']))}</h1>",
             f"<p>trace {html.escape(rep['trace'])}; iteration {t['iteration_time_s']:.6g} s; "
             f"critical path: {html.escape(t['critical_path'])}</p>",
             f"<h2>Verdict: {html.escape(v['layer'])}</h2><p>{html.escape(v['text'])}</p>",
             f"<p><b>What would move it:</b> {html.escape(v['what_would_move_it'])}</p>"]
    if v["alerts"]:
        parts.append("<ul>" + "".join(f"<li>{html.escape(a)}</li>" for a in v["alerts"])
                     + "</ul>")
    parts.append("<h2>Time per iteration</h2>")
    parts.append(_table([(k, f"{s:.6g}", f"{t['fractions'][k]:.2%}")
                         for k, s in t["mean"].items()], ("category", "s", "share")))
    parts.append(_img(attribution_plot(rep), "attribution per iteration"))
    parts.append("<h2>Layers</h2>" + _table([(k, f"{x:.2%}") for k, x in
                                            v["layer_shares"].items()], ("layer", "share")))
    parts.append("<h2>Energy per iteration</h2>")
    parts.append(_table([(k, f"{j:.6g}", f"{e['by_component_share'][k]:.2%}") for k, j in
                         e["by_component_j_per_iteration"].items()], ("component", "J", "share")))
    if "by_position" in e:
        parts.append(_table([(p, d["devices"], f"{d['mean_device_j_per_iteration']:.6g}",
                              f"{d['network_share']:.2%}") for p, d in e["by_position"].items()],
                            ("position", "devices", "J per device", "network share")))
    for title, img in (("Timeline excerpt", timeline_excerpt(td)),
                       ("Per-device heatmaps", heatmaps(td)),
                       ("Power and temperature", power_plot(td))):
        if img:
            parts.append(f"<h2>{title}</h2>{_img(img, title)}")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:"
             "collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
             "img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>meshtwin report</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")
