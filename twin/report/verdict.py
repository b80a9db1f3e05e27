"""The verdict in the second brief's terms: which layer of its checklist (power wall, memory
bandwidth, interconnect, data loading, scheduling) holds the iteration back, with the evidence,
and what would move it.

Layers from the attribution's categories:

* **power wall** (supply and cooling): power-cap throttling, thermal throttling, DVFS stalls;
* **memory bandwidth**: memory contention, plus the time compute blocks spend beyond their math
  roof waiting on HBM (``hbm_bound_s``);
* **interconnect**: exposed TP, DP and pipeline communication;
* **data loading**: data wait;
* **scheduling**: pipeline bubble (and any wait kind not listed here);
* **reliability** (not one of the checklist's layers; faults): fault recovery, checkpointing,
  stragglers.

The verdict names the layer with the largest share of the iteration when that share is at least
``min_share`` (default 5%); below, the run is *compute-bound* (the math units are the limit).
The second brief's alert thresholds go into the evidence: power above 85% of the design power,
MFU below 30% (the scenario's ``power.alerts.mfu_threshold``), a die above its temperature
limit (the run's ``alerts``); resources "near their limit" (the brief's early signal, before
the peak): a device's board power at 90% of the board's limit in force (``power.cap_w``, else
the device's ``tdp_w``) or more, the busiest link carrying 95% of its capacity or more over
the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devices.power import AlertSpec
from twin.reading import TraceData
from twin.report.attribution import (
    BUBBLE,
    CAP,
    FAULT,
    MEMORY,
    PIPE,
    STRAGGLER,
    THERMAL,
    UNATTRIBUTED,
    WAIT_CATEGORY,
)

LAYERS = ("power wall", "memory bandwidth", "interconnect", "data loading", "scheduling",
          "reliability")
LAYER_OF = {CAP: "power wall", THERMAL: "power wall", WAIT_CATEGORY["dvfs"]: "power wall",
            MEMORY: "memory bandwidth", WAIT_CATEGORY["tp"]: "interconnect",
            WAIT_CATEGORY["dp_wait"]: "interconnect", PIPE: "interconnect",
            WAIT_CATEGORY["data_wait"]: "data loading", BUBBLE: "scheduling",
            FAULT: "reliability", WAIT_CATEGORY["checkpoint"]: "reliability",
            STRAGGLER: "reliability"}
MOVES = {
    "power wall": "raise the cap / budget or cool better; a lower fixed clock or a per-stage "
                  "plan costs less than throttling",
    "memory bandwidth": "fewer HBM bytes per FLOP: larger micro-batches, fused attention "
                        "(workload.attention: flash), less recomputation; keep DMA off "
                        "memory-bound kernels",
    "interconnect": "fewer exposed bytes: overlap (gradient buckets), TP on 1-hop groups, a "
                    "torus or bidirectional rings, less TP / more PP",
    "data loading": "a faster input pipeline (more workers, prefetch, faster storage)",
    "scheduling": "a smaller pipeline bubble: more micro-batches per replica, interleaved "
                  "stages, or less pipeline parallelism",
    "reliability": "longer time between failures or cheaper recovery (checkpoint interval, "
                   "restart time)",
}


def layer_times(attr: dict[str, Any]) -> dict[str, float]:
    """Mean seconds per iteration of every layer (unknown categories go to scheduling)."""
    out = dict.fromkeys(LAYERS, 0.0)
    for name, secs in attr["mean"].items():
        if name.startswith("compute: ") or name == UNATTRIBUTED:
            continue
        out[LAYER_OF.get(name, "scheduling")] += secs
    out["memory bandwidth"] += attr.get("hbm_bound_s", 0.0)
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _evidence(layer: str, share: float, attr: dict, td: TraceData) -> str:
    """The evidence for ``layer``, which holds ``share`` of the iteration time (> 0: the
    verdict names a layer only when its share reaches ``min_share``)."""
    s = td.summary
    f = attr["fractions"]
    t = attr["iteration_time_s"]
    if layer == "interconnect":
        parts = [f"{k.split()[1]} {_pct(f.get(k, 0))}" for k in
                 (WAIT_CATEGORY["dp_wait"], WAIT_CATEGORY["tp"], PIPE) if f.get(k, 0) > 0]
        links = td.table("links")
        busy = ""
        if len(links):
            mk = float(s.get("makespan_s") or 1.0)
            top = links.loc[links["busy_s"].idxmax()]
            busy = (f" on links at {_pct(top['busy_s'] / mk)} utilisation (busiest link "
                    f"{int(top['src'])}->{int(top['dst'])} busy {top['busy_s'] / mk:.0%} of the "
                    f"run, carrying {_pct(float(s.get('max_link_utilization', 0)))} of its "
                    "capacity)")
        return (f"interconnect: {_pct(share)} of the iteration is exposed communication "
                f"({', '.join(parts)}){busy}")
    if layer == "power wall":
        cap = s.get("power_cap_w")
        clock = s.get("avg_compute_frequency_mhz")
        extra = f" under a {cap:g} W cap" if cap else ""
        pw = td.table("power")
        top = (f"; board power up to {pw['watts'].max():.0f} W per device" if len(pw) else "")
        return (f"power wall: {_pct(share)} of the iteration is lost to clock throttling and "
                f"DVFS stalls{extra} (mean compute clock {clock:.0f} MHz{top}; "
                f"{s.get('throttle_steps', 0)} thermal throttle steps, max die "
                f"{s.get('max_temperature_c', float('nan')):.1f} C)")
    if layer == "memory bandwidth":
        return (f"memory bandwidth: {_pct(share)} of the iteration is compute waiting on HBM "
                f"({_pct(attr.get('hbm_bound_s', 0) / t)} beyond the math roof, "
                f"{_pct(f.get(MEMORY, 0))} contention; slowdown mean "
                f"{s.get('memory_slowdown_mean', 1):.3g})")
    if layer == "data loading":
        return f"data loading: {_pct(share)} of the iteration waits for input data"
    if layer == "scheduling":
        return (f"scheduling: {_pct(share)} of the iteration is pipeline bubble "
                f"(bubble fraction {s.get('bubble_fraction', 0):.3f})")
    return (f"reliability: {_pct(share)} of the iteration is fault recovery, checkpointing or "
            f"stragglers ({s.get('restarts', 0)} restarts, availability "
            f"{s.get('availability', 1):.3f})")


#: utilization at which a resource is "near its limit" (second brief, 4.1: power 90%,
#: bandwidth 95%)
NEAR_POWER, NEAR_BANDWIDTH = 0.90, 0.95


def _alerts(td: TraceData, attr: dict[str, Any]) -> list[str]:
    s = td.summary
    out = []
    kinds = s.get("alerts_by_kind") or {}
    if kinds.get("power"):
        out.append(f"power above 85% of the design power ({kinds['power']} alert(s))")
    mfu = s.get("mfu")
    floor = td.scenario.get("power", {}).get("alerts", {}).get(
        "mfu_threshold", AlertSpec.model_fields["mfu_threshold"].default)  # (older traces)
    if mfu is not None and mfu < floor:
        out.append(f"MFU {mfu:.1%} < {floor:.0%}: check data loading and communication "
                   "(second brief)")
    if kinds.get("temperature"):
        out.append(f"a die reached its temperature limit ({kinds['temperature']} alert(s))")
    pw = td.table("power")
    limit = attr.get("board_limit_w")
    if len(pw) and limit:
        peak = float(pw["watts"].max())
        if peak >= NEAR_POWER * limit * (1 - 1e-9):
            out.append(f"board power up to {peak:.0f} W, {peak / limit:.0%} of its {limit:.0f} W "
                       f"limit (near it from {NEAR_POWER:.0%})")
    util = s.get("max_link_utilization")
    if util is not None and util >= NEAR_BANDWIDTH:
        out.append(f"the busiest link carries {util:.0%} of its capacity over the run (near "
                   f"its limit from {NEAR_BANDWIDTH:.0%})")
    return out


def next_best(td: TraceData, sweep: str | Path | None) -> dict[str, Any] | None:
    """From a ``twin pareto`` output (``points.csv`` or its directory): the fastest feasible
    point of the sweep with another strategy or setting than this run, vs this run."""
    if sweep is None:
        return None
    from twin.kernel.reading import read_csv_table

    path = Path(sweep)
    path = path / "points.csv" if path.is_dir() else path
    pts = read_csv_table(path, "points", "--sweep", {"status": False, "iteration_time_s": True},
                         "a twin pareto output folder or its points.csv")
    ok = pts[pts["status"] == "ok"].sort_values("iteration_time_s")
    s = td.summary
    t, e = float(s["iteration_time_s"]), float(s["energy_per_iteration_j"])
    other = ok[(ok["iteration_time_s"] - t).abs() > 1e-9 * t]
    if other.empty:
        return None
    best = other.iloc[0]
    return {"label": str(best.get("label", "")), "strategy": str(best.get("strategy", "")),
            "iteration_time_s": float(best["iteration_time_s"]),
            "energy_per_iteration_j": float(best.get("energy_per_iteration_j", float("nan"))),
            "speedup": t / float(best["iteration_time_s"]),
            "energy_ratio": float(best.get("energy_per_iteration_j", float("nan"))) / e,
            "source": str(path)}


def verdict(attr: dict[str, Any], td: TraceData, sweep: str | Path | None = None,
            min_share: float = 0.05) -> dict[str, Any]:
    """The bottleneck layer with its evidence, the alerts, and what would move it."""
    t = attr["iteration_time_s"]
    layers = layer_times(attr)
    shares = {k: v / t for k, v in layers.items()}  # (t > 0: twin.report.attribution)
    layer = max(shares, key=shares.get)
    if shares[layer] < min_share:
        layer = "compute"
        comp = sum(v for k, v in attr["fractions"].items() if k.startswith("compute: "))
        text = (f"compute-bound: no layer holds {_pct(min_share)} of the iteration; compute "
                f"blocks take {_pct(comp)} of it")
        move = "faster math: lower precision, larger GEMMs, fewer recomputed FLOPs"
    else:
        text = _evidence(layer, shares[layer], attr, td)
        move = MOVES[layer]
    nb = next_best(td, sweep)
    if nb is not None:
        move += (f"; in the sweep, {nb['label'] or nb['strategy']} runs an iteration in "
                 f"{nb['iteration_time_s']:.4g} s ({nb['speedup']:.2f}x) at "
                 f"{nb['energy_ratio']:.2f}x the energy")
    return {"layer": layer, "text": text, "layer_shares": shares, "alerts": _alerts(td, attr),
            "what_would_move_it": move, "next_best": nb, "min_share": min_share}
