"""Mesh vs torus on the same devices and model: iteration time, hops and link load.

``python -m experiments.mesh_vs_torus -o DIR`` runs every case of :data:`CASES` on a 2D mesh
and on a 2D torus of the same shape (same devices, link type, model and strategy; only the
wrap-around links differ), keeps each run's trace in ``DIR``, and writes

* ``DIR/mesh_vs_torus.csv``: one row per (case, kind): iteration time, the data-parallel
  all-reduce time, hops per ring edge of the dp and tp groups (``Layout.hops_per_group``),
  max / mean utilization and bytes of the directed links (the trace's ``links`` table) and the
  edge effect: mean bytes on the outgoing links (own and forwarded traffic) of devices with
  2, 3 and 4 neighbours;
* ``DIR/mesh_vs_torus.png``: the same as bars, plus per-device outgoing bytes as heat maps
  (on a mesh, traffic that a torus would send over the wrap links crosses the interior).

What it shows (numbers of one run are in the README): the mesh has no wrap-around links, so
(1) a ring over a line of it closes by walking back ``X-1`` hops (latency on every step; with
the walk back on the otherwise idle opposite direction the bandwidth term is unchanged for a
one-way ring, but a bidirectional ring folds back over links the other direction uses);
(2) the default placement cannot give both TP and DP 1-hop rings: on a torus TP takes whole
rows and DP whole columns, on a mesh TP takes 2x2 / 2x4 blocks and the DP rings that join
the blocks get multi-hop edges that overlap, so the busiest link carries more bytes and the
bandwidth-bound all-reduce slows down by that ratio. Corner and edge devices of the mesh have
2 and 3 links instead of 4, and traffic the torus would send over the wrap links crosses the
interior instead. Where the mesh has a Hamiltonian cycle through a group (a pure data-parallel
ring over a whole grid with an even side) the mesh is exactly as fast: the experiment keeps
that case as the control. Cases that need ``network.dp_algorithm`` are skipped (and said so)
when ``twin.build`` does not hand the algorithm to the Layout.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

KINDS = ("mesh2d", "torus2d")


@dataclass(frozen=True)
class Case:
    """One strategy on one grid shape (run on both a mesh and a torus)."""

    name: str
    shape: tuple[int, int]
    dp: int
    tp: int = 1
    placement: str = "snake"
    dp_algorithm: str = "auto"
    note: str = ""


CASES: tuple[Case, ...] = (
    Case("dp16-4x4", (4, 4), 16, note="control: the snake is a Hamiltonian cycle on both"),
    Case("dp25-5x5", (5, 5), 25, note="odd sides: no Hamiltonian cycle on the mesh"),
    Case("dp4tp4-4x4", (4, 4), 4, 4,
         note="torus: TP rows + DP columns; mesh: TP 2x2 blocks, DP rings of 2-hop edges"),
    Case("dp8tp8-8x8", (8, 8), 8, 8,
         note="torus: TP rows + DP columns; mesh: TP 4x2 blocks, DP rings of 2.5-hop edges"),
    Case("dp8tp8-8x8-cols", (8, 8), 8, 8, "row-major",
         note="same placement on both: the mesh closes every row / column ring over 7 hops"),
    Case("dp8tp8-8x8-cols-bidir", (8, 8), 8, 8, "row-major", "bidir_ring",
         note="bidirectional rings: on a mesh line both directions share the same links"),
    Case("dp16-4x4-2d", (4, 4), 16, 1, "snake", "torus2d",
         note="2D-torus all-reduce: rows close over the wrap (torus) or over 3 hops (mesh)"),
)


def scenario_dict(case: Case, kind: str, trace_path: Path | None) -> dict[str, Any]:
    """The scenario of ``case`` on ``kind``: a 1B model whose gradient all-reduce dominates
    (one short microbatch per replica), H100s with 4 NVLink4 links per grid edge."""
    world = case.shape[0] * case.shape[1]
    d: dict[str, Any] = {
        "name": f"{case.name}-{kind}",
        "cluster": {"topology": {"kind": kind, "shape": list(case.shape)},
                    "device": "h100-sxm", "link": "nvlink4", "links_per_edge": 4},
        "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 256,
                     "global_batch": case.dp, "micro_batch": 1,
                     "parallelism": {"dp": case.dp, "tp": case.tp, "pp": world // (
                         case.dp * case.tp)},
                     "placement": case.placement, "iterations": 1},
        "network": {"model": "flow", "dp_algorithm": case.dp_algorithm},
        "trace": {"enabled": trace_path is not None,
                  "tables": ["ops", "links", "ranks"]},
    }
    if trace_path is not None:
        d["trace"]["path"] = str(trace_path)
    return d


def _supports_algorithm(scen) -> bool:
    """Whether ``twin.build`` hands ``network.dp_algorithm`` to the Layout."""
    from twin.build import build

    return build(scen).layout.algorithm("dp") == scen.network.dp_algorithm


def run_case(case: Case, kind: str, out: Path) -> dict[str, Any]:
    """Run ``case`` on ``kind`` and return its CSV row (numbers in SI units)."""
    from twin.api import load_scenario, run
    from twin.kernel.trace import read_table

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{case.name}-{kind}.h5"
    scen = load_scenario(scenario_dict(case, kind, path))
    if scen.network.dp_algorithm != "auto" and not _supports_algorithm(scen):
        raise Unsupported(f"{case.name}: twin.build does not hand network.dp_algorithm to the "
                          "Layout in this version, so the case would silently run 'auto'")
    res = run(scen)
    s = res.summary
    ops = read_table(res.trace_path, "ops")
    links = read_table(res.trace_path, "links")
    ranks = read_table(res.trace_path, "ranks")
    dp_ops = ops[ops["kind"] == "dp"]
    dp_s = float((dp_ops["t_end"] - dp_ops["t_start"]).sum()) / max(len(ranks["cls"].unique()),
                                                                     1)
    dev = links[links["src"] < len(ranks)]
    out_bytes = dev.groupby("src")["bytes"].sum().reindex(range(len(ranks)), fill_value=0.0)
    degree = ranks.sort_values("device")["degree"].to_numpy()
    row: dict[str, Any] = {
        "case": case.name, "kind": kind, "shape": "x".join(map(str, case.shape)),
        "dp": case.dp, "tp": case.tp, "placement": case.placement,
        "dp_algorithm": case.dp_algorithm,
        "iteration_time_s": s["iteration_time_s"], "dp_allreduce_s": dp_s,
        "hops_dp": s["hops_per_ring_edge"]["dp"], "hops_tp": s["hops_per_ring_edge"]["tp"],
        "max_link_utilization": float(links["utilization"].max()),
        "mean_link_utilization": float(links["utilization"].mean()),
        "max_link_bytes": float(links["bytes"].max()),
        "mean_link_bytes": float(links["bytes"].mean()),
        "links_used_fraction": float((links["bytes"] > 0).mean()),
        "bytes_sent": s["bytes_sent"], "bytes_received": s["bytes_received"],
        "note": case.note,
    }
    for k in (2, 3, 4):
        sel = degree == k
        row[f"out_bytes_deg{k}"] = (float(out_bytes.to_numpy()[sel].mean()) if sel.any()
                                    else float("nan"))
    row["_out_bytes"] = out_bytes.to_numpy()
    return row


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """CSV of the rows (private columns, starting with ``_``, left out)."""
    cols = [k for k in rows[0] if not k.startswith("_")]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def plot(rows: list[dict[str, Any]], path: Path, heat_case: str | None = None) -> Path:
    """Bars of time, hops and link load per case; heat maps of per-device outgoing bytes."""
    cases = list(dict.fromkeys(r["case"] for r in rows))
    by = {(r["case"], r["kind"]): r for r in rows}
    fig = Figure(figsize=(15, 9), layout="constrained")
    axes = fig.subplots(2, 3)
    x = np.arange(len(cases))
    colors = {"mesh2d": "#C44E52", "torus2d": "#4C72B0"}
    panels = (("iteration_time_s", 1e3, "iteration time (ms)"),
              ("hops_dp", 1.0, "hops per dp ring edge"),
              ("max_link_bytes", 1e-9, "busiest link (bars) and mean link (dots), GB"))
    for ax, (key, scale, label) in zip(axes[0], panels, strict=True):
        for i, kind in enumerate(KINDS):
            vals = [by[(c, kind)][key] * scale if (c, kind) in by else np.nan for c in cases]
            ax.bar(x + (i - 0.5) * 0.4, vals, 0.4, label=kind, color=colors[kind])
            if key == "max_link_bytes":
                mean = [by[(c, kind)]["mean_link_bytes"] * scale for c in cases]
                ax.plot(x + (i - 0.5) * 0.4, mean, "o", color="black", markersize=4)
        ax.set_xticks(x, cases, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    heat_case = heat_case or max(cases, key=lambda c: by[(c, "mesh2d")]["iteration_time_s"]
                                 / by[(c, "torus2d")]["iteration_time_s"]
                                 if (c, "mesh2d") in by and (c, "torus2d") in by else 0)
    vmax = max(float(by[(heat_case, k)]["_out_bytes"].max()) for k in KINDS) / 1e9
    for ax, kind in zip(axes[1][:2], KINDS, strict=True):
        r = by[(heat_case, kind)]
        nx_, ny = (int(v) for v in r["shape"].split("x"))
        im = ax.imshow(r["_out_bytes"].reshape(ny, nx_) / 1e9, origin="lower", cmap="viridis",
                       vmin=0, vmax=vmax)
        ax.set_title(f"{heat_case} on {kind}: GB on each device's outgoing links "
                     "(own + forwarded)", fontsize=9)
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        fig.colorbar(im, ax=ax, shrink=0.8)
    ax = axes[1][2]
    for i, kind in enumerate(KINDS):
        r = by[(heat_case, kind)]
        vals = [r[f"out_bytes_deg{k}"] / 1e9 for k in (2, 3, 4)]
        ax.bar(np.arange(3) + (i - 0.5) * 0.4, vals, 0.4, label=kind, color=colors[kind])
    ax.set_xticks(np.arange(3), ["corner (2)", "edge (3)", "interior (4)"])
    ax.set_ylabel("mean GB on a device's outgoing links")
    ax.set_title(f"{heat_case}: edge effect by number of neighbours", fontsize=9)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path


class Unsupported(RuntimeError):
    """A case this build of the twin cannot run as configured."""


def run_all(out: Path, cases: tuple[Case, ...] = CASES) -> tuple[list[dict[str, Any]],
                                                                 list[str]]:
    """Every case on mesh and torus: rows in case order (mesh first), and skipped cases."""
    rows, skipped = [], []
    for c in cases:
        try:
            rows += [run_case(c, k, out) for k in KINDS]
        except Unsupported as exc:
            skipped.append(str(exc))
    return rows, skipped


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    p = argparse.ArgumentParser(prog="python -m experiments.mesh_vs_torus",
                                description=__doc__.split("\n")[0])
    p.add_argument("-o", "--output", required=True, help="directory for CSV, PNG and traces")
    p.add_argument("--case", action="append", choices=[c.name for c in CASES],
                   help="run only these cases (repeatable)")
    args = p.parse_args(argv)
    out = Path(args.output)
    cases = tuple(c for c in CASES if not args.case or c.name in args.case)
    rows, skipped = run_all(out, cases)
    for why in skipped:
        print(f"skipped {why}")
    cases = tuple(c for c in cases if any(r["case"] == c.name for r in rows))
    csv_path = write_csv(rows, out / "mesh_vs_torus.csv")
    png = plot(rows, out / "mesh_vs_torus.png")
    for c in cases:
        m = next(r for r in rows if r["case"] == c.name and r["kind"] == "mesh2d")
        t = next(r for r in rows if r["case"] == c.name and r["kind"] == "torus2d")
        print(f"{c.name:24s} mesh/torus time {m['iteration_time_s'] / t['iteration_time_s']:5.2f}"
              f"  hops {m['hops_dp']:.2f}/{t['hops_dp']:.2f}"
              f"  busiest link {m['max_link_bytes'] / 1e9:.2f}/{t['max_link_bytes'] / 1e9:.2f} GB")
    print(f"csv: {csv_path}\npng: {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
