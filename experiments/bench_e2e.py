"""End-to-end benchmark: one training iteration of GPT-3 175B on 2D tori of growing size.

Layout at every size: tensor parallelism 8, pipeline parallelism 8, data parallelism
``devices / 64``, 32 microbatches of one sequence per replica (so the work per replica is fixed
and the total grows with devices), bf16, selective recompute and sequence parallelism, H100
devices with four NVLink4 links per torus edge, flow network model, tracing off (the trace
cost is measured separately by ``bench_trace``).

Each size runs in a fresh subprocess so its peak memory (max RSS) is its own.
``python -m experiments.bench_e2e --devices 1024`` prints one JSON line for one size.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

import pandas as pd

MICROBATCHES = 32
TP, PP = 8, 8


def scenario_dict(devices: int, trace: bool = False, placement: str = "snake") -> dict:
    """The benchmark scenario for a square torus of ``devices`` accelerators."""
    side = math.isqrt(devices)
    if side * side != devices or devices % (TP * PP):
        raise ValueError(f"devices must be a square multiple of {TP * PP}, got {devices}")
    dp = devices // (TP * PP)
    return {
        "name": f"bench-gpt3-{devices}",
        "cluster": {"topology": {"kind": "torus2d", "shape": [side, side]},
                    "device": "h100-sxm", "link": "nvlink4", "links_per_edge": 4},
        "workload": {"model": "gpt3-175b", "precision": "bf16", "global_batch": MICROBATCHES * dp,
                     "micro_batch": 1, "parallelism": {"dp": dp, "tp": TP, "pp": PP},
                     "recompute": "selective", "sequence_parallel": True, "iterations": 1,
                     "placement": placement},
        "trace": {"enabled": trace},
    }


def _peak_rss_gib() -> float:
    """Peak resident memory of this process, GiB (``VmHWM``: reset at exec, unlike
    ``ru_maxrss``, which a child inherits from a large parent)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # kB -> GiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def measure(devices: int, placement: str = "snake") -> dict:
    """Run one size in this process; wall/CPU seconds, peak RSS and the run's summary."""
    from twin.runner import run
    from twin.scenario import load_scenario

    scen = load_scenario(scenario_dict(devices, placement=placement))
    w0, c0 = time.perf_counter(), time.process_time()
    res = run(scen)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rss_gib = _peak_rss_gib()
    s = res.summary
    return {"devices": devices, "microbatches": MICROBATCHES, "wall_s": wall, "cpu_s": cpu,
            "peak_rss_gib": rss_gib, "events": s["events"],
            "iteration_time_s": s["iteration_time_s"], "mfu": s["mfu"],
            "symmetry_used": s["symmetry_used"], "replica_orbit": s["replica_orbit"],
            "placement": placement}


def run(sizes: tuple[int, ...] = (64, 256, 1024, 4096)) -> pd.DataFrame:
    """Every size in its own subprocess; one row per size with the targets beside."""
    rows = []
    for n in sizes:
        out = subprocess.run([sys.executable, "-m", "experiments.bench_e2e", "--devices", str(n)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    df = pd.DataFrame(rows)
    df["cpu_us_per_device_microbatch"] = df["cpu_s"] / (df["devices"] * df["microbatches"]) * 1e6
    targets = {64: "wall <= 2 s", 1024: "wall <= 30 s", 4096: "peak RSS <= 4 GiB"}
    df["target"] = df["devices"].map(targets).fillna("")
    met = []
    for r in df.itertuples():
        if r.devices == 64:
            met.append(r.wall_s <= 2)
        elif r.devices == 1024:
            met.append(r.wall_s <= 30)
        elif r.devices == 4096:
            met.append(r.peak_rss_gib <= 4)
        else:
            met.append(None)
    df["met"] = met
    return df


def main(argv: list[str] | None = None) -> None:
    """CLI: one size (``--devices``) as JSON, or the whole table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, help="measure one size and print JSON")
    p.add_argument("--sizes", default="64,256,1024,4096", help="comma-separated sizes")
    p.add_argument("--placement", default="snake", help="with --devices: workload.placement")
    args = p.parse_args(argv)
    if args.devices:
        print(json.dumps(measure(args.devices, args.placement)))
        return
    df = run(tuple(int(x) for x in args.sizes.split(",")))
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
