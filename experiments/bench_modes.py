"""Fast mode vs exact mode (``simulation.exact: true``) side by side, per configuration.

Every (configuration, mode) runs in a fresh subprocess, so its peak memory (``VmHWM``) is its
own; a subprocess that exceeds ``--timeout`` seconds is stopped and shown as such. Columns:
wall and CPU seconds, events, peak RSS, iteration time and energy of each mode, and the
ratios exact / fast (time) and fast / exact - 1 (the disagreement the fast mode must keep
under 0.5%).

Configurations (the issue-14 targets): GPT-3 175B on 2D tori (tp 8, pp 8, 32 microbatches of
one sequence per replica; ``experiments.bench_e2e``) with rank symmetry and, with compute
jitter (cov 0.05) or a straggler (device 3 at 1.5x for 1 s), without; the Llama 3 405B
layout on 16384 GPUs (``scenarios/llama3_405b.yaml`` with dp 128); the 1T-parameter
Megatron layout (tp 8, pp 64, dp 6, 512 microbatches) on 3072 A100s; the same with the
thermal model off ("no-thermal": then the fast mode aggregates steady-state microbatches,
``twin.aggregate``, and ``fast_mb_simulated`` shows the reduced counts it simulated).
``--quick`` runs the small sizes only (a few minutes on 2 cores).

``python -m experiments.bench_modes [--quick] [--timeout S]``;
``python -m experiments.bench_modes --one NAME --mode fast|exact`` prints one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from experiments.bench_e2e import _peak_rss_gib, scenario_dict

ROOT = Path(__file__).resolve().parents[1]


def _gpt3(devices: int, jitter: float = 0.0) -> dict:
    d = scenario_dict(devices)
    if jitter:
        d["simulation"] = {"compute_jitter_cov": jitter}
    return d


def _straggler(d: dict) -> dict:
    """``d`` with device 3 computing 1.5x slower from 0.5 s for 1 s (a fault that only changes
    a device: the fast mode stays on, the device's stage one agent per rank)."""
    d["faults"] = [{"kind": "straggler", "device": 3, "factor": 1.5, "time_s": 0.5,
                    "duration_s": 1.0}]
    return d


def _llama405b(nodes: int = 2048) -> dict:
    from twin.kernel.schema import read_yaml

    d = read_yaml(ROOT / "scenarios/llama3_405b.yaml", "scenario")
    d["cluster"]["topology"]["shape"] = [8, nodes]
    d["workload"]["parallelism"]["dp"] = nodes * 8 // (8 * 16)
    d["workload"]["global_batch"] = 16 * d["workload"]["parallelism"]["dp"] * 2
    d["trace"] = {"enabled": False}
    return d


def _gpt1t() -> dict:
    """Narayanan et al. 2021 (arXiv:2104.04473), Table 1, 1T row: tp 8, pp 64, 3072 A100s,
    batch 3072 (dp 6, 512 microbatches of one sequence per replica)."""
    return {
        "name": "bench-gpt-1t-3072",
        "cluster": {"topology": {"kind": "switched", "shape": [8, 384], "nodes_per_leaf": 32},
                    "device": "a100-sxm-80gb", "link": "nvlink3-switch", "links_per_edge": 12,
                    "nic_link": "ib-hdr200-port"},
        "workload": {"model": "gpt-1t", "precision": "bf16", "seq_len": 2048,
                     "global_batch": 3072, "micro_batch": 1,
                     "parallelism": {"dp": 6, "tp": 8, "pp": 64}, "recompute": "full",
                     "sequence_parallel": False, "iterations": 1},
        "trace": {"enabled": False},
    }


def _lattice(d: dict) -> dict:
    """``d`` with ``workload.placement: lattice`` (data-parallel rings along their own
    lattice: 5.1 hops per edge instead of 17 on the 64x64 torus; ``topologies.placement``)."""
    d["workload"]["placement"] = "lattice"
    return d


def _mb(d: dict, m: int) -> dict:
    """``d`` with ``m`` microbatches per data-parallel replica."""
    w = d["workload"]
    w["global_batch"] = m * w.get("micro_batch", 1) * w["parallelism"]["dp"]
    return d


def _cool(d: dict) -> dict:
    """``d`` with the thermal RC model off (die temperature constant), the condition under
    which the fast mode aggregates steady-state microbatches (``twin.aggregate``)."""
    d.setdefault("power", {})["thermal"] = {"enabled": False}
    return d


#: name -> (scenario builder, in --quick, target text)
CONFIGS = {
    "gpt3-175b/64": (lambda: _gpt3(64), True, ""),
    "gpt3-175b/256": (lambda: _gpt3(256), True, ""),
    "gpt3-175b/1024": (lambda: _gpt3(1024), False, ""),
    "gpt3-175b/256 jitter": (lambda: _gpt3(256, 0.05), True, "about linear in devices"),
    "gpt3-175b/256 straggler": (lambda: _straggler(_gpt3(256)), True,
                                "about linear in devices"),
    "gpt3-175b/1024 straggler": (lambda: _straggler(_gpt3(1024)), False,
                                 "about linear in devices"),
    "gpt3-175b/1024 jitter": (lambda: _gpt3(1024, 0.05), False, "about linear in devices"),
    "gpt3-175b/4096 jitter": (lambda: _gpt3(4096, 0.05), False, "fast <= 30 s, <= 4 GiB"),
    "gpt3-175b/16384 jitter": (lambda: _gpt3(16384, 0.05), False, "fast <= 120 s"),
    # another placement, not the default: the rings no longer span the torus
    "gpt3-175b/4096 jitter lattice": (lambda: _lattice(_gpt3(4096, 0.05)), False,
                                      "fast <= 30 s, <= 4 GiB"),
    "gpt3-175b/16384 jitter lattice": (lambda: _lattice(_gpt3(16384, 0.05)), False,
                                       "fast <= 120 s"),
    "llama3-405b/16384": (_llama405b, False, "fast <= 10 s, <= 2 GiB"),
    "gpt-1t/3072": (_gpt1t, False, "fast <= 10 s"),
    # thermal model off: the fast mode aggregates microbatches (twin.aggregate)
    "gpt3-175b/64 no-thermal 64mb": (lambda: _cool(_mb(_gpt3(64), 64)), True, ""),
    "llama3-405b/16384 no-thermal": (lambda: _cool(_llama405b()), False,
                                     "fast <= 10 s, <= 2 GiB"),
    "gpt-1t/3072 no-thermal": (lambda: _cool(_gpt1t()), False, "fast <= 10 s"),
}


def measure(name: str, mode: str) -> dict:
    """One configuration in one mode, in this process."""
    from twin.runner import run
    from twin.scenario import load_scenario

    d = copy.deepcopy(CONFIGS[name][0]())
    sim = d.setdefault("simulation", {})
    sim["exact"] = mode == "exact"
    sim.setdefault("limits", {})["max_events"] = 10**9  # the bench measures, the budget guards
    sim["limits"]["max_sim_time_s"] = 1e6
    scen = load_scenario(d)
    w0, c0 = time.perf_counter(), time.process_time()
    s = run(scen).summary
    return {"config": name, "mode": mode, "wall_s": time.perf_counter() - w0,
            "cpu_s": time.process_time() - c0, "events": s["events"],
            "peak_gib": _peak_rss_gib(), "iteration_time_s": s["iteration_time_s"],
            "energy_j": s["energy_j"], "shortcuts": ",".join(s["shortcuts_used"]) or "-",
            "mb_simulated": "+".join(str(k) for k in s["microbatches_simulated"]),
            "fallback": (s["aggregation"] or {}).get("fallback", "")}


def _child(name: str, mode: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "experiments.bench_modes", "--one", name, "--mode", mode]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"config": name, "mode": mode, "status": f"> {timeout:g} s"}
    if out.returncode != 0:
        return {"config": name, "mode": mode,
                "status": "error: " + (out.stderr.strip().splitlines() or ["?"])[-1][:60]}
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "status": "ok"}


def run(quick: bool = True, timeout: float = 900.0) -> pd.DataFrame:
    """Both modes of every configuration; one row per configuration."""
    rows = []
    for name, (_, in_quick, target) in CONFIGS.items():
        if quick and not in_quick:
            continue
        r = {"config": name}
        res = {m: _child(name, m, timeout) for m in ("fast", "exact")}
        for m, x in res.items():
            ok = x.get("status") == "ok"
            r[f"{m}_wall_s"] = x["wall_s"] if ok else math.nan
            r[f"{m}_cpu_s"] = x["cpu_s"] if ok else math.nan  # less disturbed by other load
            r[f"{m}_events"] = x["events"] if ok else math.nan
            r[f"{m}_peak_gib"] = x["peak_gib"] if ok else math.nan
            if not ok:
                r[f"{m}_status"] = x["status"]
        f, e = res["fast"], res["exact"]
        both = f.get("status") == "ok" and e.get("status") == "ok"
        r["speedup"] = e["wall_s"] / f["wall_s"] if both else math.nan
        r["d_time_%"] = 100 * (f["iteration_time_s"] / e["iteration_time_s"] - 1) if both \
            else math.nan
        r["d_energy_%"] = 100 * (f["energy_j"] / e["energy_j"] - 1) if both else math.nan
        r["fast_shortcuts"] = f.get("shortcuts", "")
        r["fast_mb_simulated"] = f.get("mb_simulated", "")
        if f.get("fallback"):
            r["fast_mb_simulated"] += " (fallback)"
        r["target"] = target
        rows.append(r)
        print(json.dumps(r, default=str), file=sys.stderr, flush=True)  # progress
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    """CLI: one configuration and mode as JSON (``--one``), or the whole table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", choices=list(CONFIGS), help="measure one configuration, print JSON")
    p.add_argument("--mode", choices=["fast", "exact"], default="fast")
    p.add_argument("--quick", action="store_true", help="small configurations only")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per subprocess")
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.mode)))
        return
    df = run(args.quick, args.timeout)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
