"""Edge effect: per-position energy-latency fronts on a 2D mesh vs a 2D torus.

``python -m experiments.edge_effect -o DIR`` runs the same strategies (:data:`STRATEGIES`) at
three DVFS clocks on a 4x4 mesh and a 4x4 torus (H100s, 4 NVLink4 links per grid edge, Llama
3.2 1B, symmetry off so that every device is simulated), each healthy and with the edge link
``0-1`` failed from the start (at a corner of the mesh; the same link on the torus), and writes

* ``DIR/edge_effect.csv``: one row per (topology, failure, strategy, clock, position class):
  devices, iteration time, the class's mean and spread (std) of per-device energy per
  iteration, its network part (link ports + router), forwarded bytes, wait time, and whether
  the point is on that class's front (non-dominated in iteration time and mean energy per
  device within its topology and failure state);
* ``DIR/edge_effect.png``: the fronts, one panel per topology and failure state, one colour
  per position class;
* ``DIR/edge_effect.json``: the answer to the brief's hypothesis (do corner / edge / interior
  devices have separate fronts?): per topology and failure state, the relative energy gap
  between the classes at each configuration (median and range) against the spread inside a
  class, and whether the classes' fronts consist of the same configurations.

The training step is synchronous, so every device of a run shares its iteration time: fronts
can separate only along the energy axis. ``--fast`` runs one clock and three strategies.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

TOPOLOGIES = ("mesh2d", "torus2d")
#: name -> (dp, tp, pp, placement, dp_algorithm)
STRATEGIES: dict[str, tuple[int, int, int, str, str]] = {
    "dp16": (16, 1, 1, "snake", "auto"),
    "dp16-bidir": (16, 1, 1, "snake", "bidir_ring"),
    "dp16-2d": (16, 1, 1, "snake", "torus2d"),
    "dp4-tp4": (4, 4, 1, "snake", "auto"),
    "dp8-pp2": (8, 1, 2, "snake", "auto"),
}
CLOCKS_MHZ = (1980, 1530, 1080)
FAILED_LINK = (0, 1)
CLASSES = ("corner", "edge", "interior", "all")


def scenario(topology: str, strategy: str, clock: float, failed: bool,
             inlet_gradient_k: float = 0.0) -> dict[str, Any]:
    """The scenario of one point (trace to memory only: the devices table is what is kept)."""
    dp, tp, pp, placement, algo = STRATEGIES[strategy]
    d: dict[str, Any] = {
        "name": f"edge-{topology}-{strategy}-{clock:.0f}{'-failed' if failed else ''}",
        "seed": 1,
        "cluster": {"topology": {"kind": topology, "shape": [4, 4]}, "device": "h100-sxm",
                    "link": "nvlink4", "links_per_edge": 4},
        "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 512,
                     "global_batch": 2 * dp, "micro_batch": 1,
                     "parallelism": {"dp": dp, "tp": tp, "pp": pp}, "placement": placement,
                     "iterations": 1},
        "network": {"dp_algorithm": algo},
        "simulation": {"symmetry": False},
        "power": {"dvfs": {"frequency_mhz": clock},
                  "thermal": {"inlet_gradient_k": inlet_gradient_k,
                              "inlet_gradient_along": "center"}},
        "trace": {"tables": ["devices", "ranks"]},
    }
    if failed:
        d["faults"] = [{"kind": "link_down", "link": list(FAILED_LINK), "time_s": 0.0}]
    return d


def run_point(topology: str, strategy: str, clock: float, failed: bool, out: Path,
              inlet_gradient_k: float = 0.0) -> list[dict[str, Any]]:
    """Run one point; one row per position class."""
    from twin.api import load_scenario, run
    from twin.kernel.trace import read_table

    d = scenario(topology, strategy, clock, failed, inlet_gradient_k)
    d["trace"]["path"] = str(out / f"{d['name']}.h5")
    res = run(load_scenario(d))
    s = res.summary
    iters = max(int(s["iterations_completed"]), 1)
    dev = read_table(res.trace_path, "devices")
    rows = []
    for pos, g in dev.groupby("position", observed=True):
        e = g["energy_j"].to_numpy() / iters
        rows.append({
            "topology": topology, "failed_link": "0-1" if failed else "none",
            "strategy": strategy, "clock_mhz": clock, "position": str(pos),
            "devices": len(g), "iteration_time_s": s["iteration_time_s"],
            "energy_per_device_j": float(e.mean()), "energy_std_j": float(e.std()),
            "network_per_device_j": float(g["network_j"].mean() / iters),
            "forwarded_bytes_per_device": float(g["forwarded_bytes"].mean() / iters),
            "wait_per_device_s": float(g["wait_s"].mean() / iters),
            "max_temp_c": float(g["max_temp_c"].max())})
    res.trace_path.unlink(missing_ok=True)
    return rows


def mark_fronts(rows: list[dict[str, Any]]) -> None:
    """``on_front``: non-dominated (time, mean energy per device) within (topology, failure,
    position)."""
    from experiments.front import pareto_mask

    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r["topology"], r["failed_link"], r["position"]), []).append(i)
    for idx in groups.values():
        pts = np.array([[rows[i]["iteration_time_s"], rows[i]["energy_per_device_j"]]
                        for i in idx])
        for i, on in zip(idx, pareto_mask(pts), strict=True):
            rows[i]["on_front"] = bool(on)


def answer(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (topology, failure): relative energy gaps between position classes at equal
    configuration, the spread inside classes, and whether their fronts hold the same points."""
    out: dict[str, Any] = {}
    keys = sorted({(r["topology"], r["failed_link"]) for r in rows})
    for topo, fail in keys:
        sub = [r for r in rows if r["topology"] == topo and r["failed_link"] == fail]
        classes = [c for c in CLASSES if any(r["position"] == c for r in sub)]
        cfgs = sorted({(r["strategy"], r["clock_mhz"]) for r in sub})
        by = {(r["strategy"], r["clock_mhz"], r["position"]): r for r in sub}
        entry: dict[str, Any] = {"classes": classes}
        lo = classes[0]
        for c in classes[1:]:
            gaps = np.array([by[(*k, c)]["energy_per_device_j"]
                             / by[(*k, lo)]["energy_per_device_j"] - 1 for k in cfgs])
            entry[f"{c}_vs_{lo}_energy_gap"] = {"median": float(np.median(gaps)),
                                                "min": float(gaps.min()),
                                                "max": float(gaps.max())}
        entry["within_class_spread_max"] = {
            st: float(max(r["energy_std_j"] / r["energy_per_device_j"] for r in sub
                          if r["strategy"] == st)) for st in sorted({r["strategy"] for r in sub})}
        fronts = {c: sorted(f"{r['strategy']}@{r['clock_mhz']:.0f}" for r in sub
                            if r["position"] == c and r["on_front"]) for c in classes}
        entry["fronts"] = fronts
        entry["same_front_points"] = len({tuple(v) for v in fronts.values()}) == 1
        out[f"{topo}/{fail}"] = entry
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write :func:`figure` as a PNG at ``path``."""
    figure(rows).savefig(path, dpi=110)
    return path


def figure(rows: list[dict[str, Any]]) -> Figure:
    """One panel per (topology, failure), in sorted order: energy per device vs iteration time,
    one scatter per position class and its front as a line."""
    panels = sorted({(r["topology"], r["failed_link"]) for r in rows})
    cols = 2 if len(panels) > 1 else 1
    rows_n = (len(panels) + cols - 1) // cols
    fig = Figure(figsize=(5.5 * cols, 4.2 * rows_n))
    colors = {"corner": "#C44E52", "edge": "#DD8452", "interior": "#4C72B0", "all": "#55A868"}
    for k, (topo, fail) in enumerate(panels):
        ax = fig.add_subplot(rows_n, cols, k + 1)
        for c in CLASSES:
            pts = [r for r in rows if r["topology"] == topo and r["failed_link"] == fail
                   and r["position"] == c]
            if not pts:
                continue
            ax.scatter([r["iteration_time_s"] for r in pts],
                       [r["energy_per_device_j"] for r in pts], s=14, color=colors[c], alpha=0.5)
            front = sorted((r for r in pts if r["on_front"]), key=lambda r: r["iteration_time_s"])
            ax.plot([r["iteration_time_s"] for r in front],
                    [r["energy_per_device_j"] for r in front], "-o", ms=4, color=colors[c],
                    label=f"{c} front")
        ax.set_title(f"{topo}, failed link {fail}", fontsize=10)
        ax.set_xlabel("iteration time (s)")
        ax.set_ylabel("energy per device per iteration (J)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    p = argparse.ArgumentParser(prog="python -m experiments.edge_effect",
                                description=__doc__.split("\n")[0])
    p.add_argument("-o", "--output", required=True, help="directory for CSV, PNG and JSON")
    p.add_argument("--fast", action="store_true", help="one clock, three strategies")
    p.add_argument("--inlet-gradient-k", type=float, default=0.0,
                   help="inlet air gradient towards the grid centre, K (default 0)")
    args = p.parse_args(argv)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    strategies = list(STRATEGIES)[:3] if args.fast else list(STRATEGIES)
    clocks = CLOCKS_MHZ[:1] if args.fast else CLOCKS_MHZ
    rows: list[dict[str, Any]] = []
    for topo in TOPOLOGIES:
        for failed in (False, True):
            for strat in strategies:
                for clock in clocks:
                    rows += run_point(topo, strat, clock, failed, out, args.inlet_gradient_k)
    mark_fronts(rows)
    with open(out / "edge_effect.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    ans = answer(rows)
    (out / "edge_effect.json").write_text(json.dumps(ans, indent=2) + "\n")
    png = plot(rows, out / "edge_effect.png")
    for key, e in ans.items():
        gaps = ", ".join(f"{k.replace('_energy_gap', '')} {v['median']:+.2%} "
                         f"[{v['min']:+.2%}, {v['max']:+.2%}]" for k, v in e.items()
                         if k.endswith("_energy_gap"))
        spread = ", ".join(f"{k} {v:.2%}" for k, v in e["within_class_spread_max"].items())
        print(f"{key:18s} energy gap {gaps or 'one class'}; same front points: "
              f"{e['same_front_points']}; spread within a class: {spread}")
    print(f"csv: {out / 'edge_effect.csv'}\npng: {png}\njson: {out / 'edge_effect.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
