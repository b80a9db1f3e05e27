"""``twin report``: where a run's time and energy went and which layer holds it back.

``build_report(trace)`` returns a JSON-ready dict: the critical-path attribution of every
iteration (:mod:`twin.report.attribution`), the energy by component and by device position,
and the verdict in the second brief's terms (:mod:`twin.report.verdict`).
``write_html(report, trace, out)`` renders it with embedded plots (:mod:`twin.report.html`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twin.reading import TraceData

#: Trace tables a report reads (``trace.tables`` must keep them).
REPORT_TABLES = ("ops", "power")


def build_report(trace: str | Path, sweep: str | Path | None = None,
                 min_share: float = 0.05) -> dict[str, Any]:
    """The report of ``trace`` (``sweep``: a ``twin pareto`` output to pick the next-best
    strategy from)."""
    from twin.report.attribution import attribute, energy_attribution
    from twin.report.verdict import verdict

    td = TraceData(trace, need=REPORT_TABLES)
    attr = attribute(td)
    s = td.summary
    return {
        "trace": str(td.path),
        "scenario": td.scenario.get("name"),
        "summary": {k: s.get(k) for k in ("iteration_time_s", "iterations", "energy_j",
                                          "energy_per_iteration_j", "mfu", "avg_power_w",
                                          "devices", "symmetry_used")},
        "time": attr,
        "energy": energy_attribution(td),
        "verdict": verdict(attr, td, sweep, min_share),
    }


def format_report(rep: dict[str, Any]) -> str:
    """Plain-text version for the terminal."""
    v = rep["verdict"]
    t = rep["time"]
    lines = [f"report of {rep['trace']} ({rep['scenario']}): iteration "
             f"{t['iteration_time_s']:.6g} s", f"verdict: {v['text']}",
             f"what would move it: {v['what_would_move_it']}"]
    lines += [f"alert: {a}" for a in v["alerts"]]
    lines.append("time per iteration (critical path):")
    for k, secs in t["mean"].items():
        lines.append(f"  {k:<32} {secs:.6g} s  {t['fractions'][k]:7.2%}")
    lines.append("energy per iteration by component:")
    for k, j in rep["energy"]["by_component_j_per_iteration"].items():
        lines.append(f"  {k:<32} {j:.6g} J  {rep['energy']['by_component_share'][k]:7.2%}")
    for p, d in rep["energy"].get("by_position", {}).items():
        lines.append(f"  position {p:<23} {d['mean_device_j_per_iteration']:.6g} J per device "
                     f"({d['devices']} devices, network {d['network_share']:.2%})")
    return "\n".join(lines)


def write_html(rep: dict[str, Any], trace: str | Path, out: str | Path) -> Path:
    """Write the HTML report with its plots embedded."""
    from twin.outputs import atomic_write
    from twin.report.html import render

    html = render(rep, TraceData(trace, need=REPORT_TABLES))
    return atomic_write(out, lambda tmp: tmp.write_text(html, encoding="utf-8"))
