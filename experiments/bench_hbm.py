"""Benchmark: compiled FR-FCFS HBM engine vs the plain-Python reference on identical inputs.

Workload: one HBM3 stack (H100 operating point) serving a mixed stream - a backlogged compute
kernel stream (2/3 reads, sequential interleaving, row locality ``locality``) plus two Poisson
DMA streams (one writing, one reading, 40 GB/s each per stack, random interleaving, row locality
0.97). The default locality 0.97 is that of a sequential stream over 1 KB rows of 32 B bursts
(31 of every 32 bursts stay in the row); ``--locality 0.9`` is a harsher mix (more row
conflicts, hence more commands and decisions per request). The same requests go to both
implementations; completion times and row kinds must be identical.

Both builds of the compiled engine run (``devices.hbm.aot``: Numba's JIT, and the module
compiled ahead of time at install when it is built; threads always run the JIT build).
Compilation and loading are excluded: each build is warmed up on a small input first. Compiled times
are the best of ``repeats`` runs; the reference runs once. Wall time and process CPU time are
both reported: on a shared machine (see the printed load average) wall time includes waiting
for a core.

Run: ``python -m experiments.bench_hbm [--large] [--locality 0.9]``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd

from devices.hbm import (
    HbmRequests,
    HbmSpec,
    StreamSpec,
    generate_requests,
    load_hbm_spec,
    simulate,
    simulate_reference,
)
from devices.hbm.aot import kernels

TARGET_RATE = 10e6  # requests/s, compiled engine (DESIGN.md performance targets)
TARGET_SPEEDUP = 20.0  # compiled / reference


def workload(spec: HbmSpec, n: int, seed: int, locality: float = 0.97) -> HbmRequests:
    """``n`` requests of the mixed stream described in the module docstring."""
    n_dma = n // 6
    streams = [
        StreamSpec(n_requests=n - 2 * n_dma, read_fraction=2 / 3, row_locality=locality),
        StreamSpec(n_requests=n_dma, arrival="poisson", rate_bytes_per_s=40e9,
                   read_fraction=0.0, row_locality=0.97, interleave="random"),
        StreamSpec(n_requests=n_dma, arrival="poisson", rate_bytes_per_s=40e9,
                   read_fraction=1.0, row_locality=0.97, interleave="random"),
    ]
    return generate_requests(spec, np.random.default_rng(seed), streams)


def _best_time(spec: HbmSpec, req: HbmRequests, workers: int, repeats: int,
               build: str) -> tuple[float, float]:
    """Best wall time and best process CPU time (s) over ``repeats`` runs."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        simulate(spec, req, workers=workers, build=build)
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu


def run(
    n_reference: int = 200_000,
    n_compiled: Sequence[int] = (200_000, 2_000_000),
    workers: Sequence[int] = (1, 2),
    repeats: int = 3,
    seed: int = 0,
    locality: float = 0.97,
) -> pd.DataFrame:
    """Measure both implementations; one row per (engine, requests, workers).

    Columns: engine, requests, workers, wall_s (s), cpu_s (process CPU time, s),
    requests_per_s (by wall time), requests_per_cpu_s, speedup_vs_reference (by wall time, on
    the reference's input size), identical (completion times and kinds equal to the
    reference on the same input; None where the reference was not run), row_hit_rate,
    bandwidth_bytes_per_s.
    """
    spec = load_hbm_spec("hbm3")
    # the engine's builds (devices.hbm.aot): the JIT one, and the one compiled at install if
    # it is built; threads (workers > 1) always run the JIT build
    builds = {"jit": "compiled (Numba JIT)"}
    try:
        kernels("aot")
        builds["aot"] = "compiled (ahead of time)"
    except RuntimeError:
        pass
    for build in builds:  # warm-up: compile / load cache now
        simulate(spec, workload(spec, 2000, seed, locality), build=build)

    rows = []
    req = workload(spec, n_reference, seed, locality)
    t0, c0 = time.perf_counter(), time.process_time()
    ref = simulate_reference(spec, req)
    ref_wall, ref_cpu = time.perf_counter() - t0, time.process_time() - c0
    ref_rate = n_reference / ref_wall
    rows.append({"engine": "reference (Python)", "requests": n_reference, "workers": 1,
                 "wall_s": ref_wall, "cpu_s": ref_cpu, "requests_per_s": ref_rate,
                 "requests_per_cpu_s": n_reference / ref_cpu, "speedup_vs_reference": 1.0,
                 "identical": True, "row_hit_rate": ref.row_hit_rate,
                 "bandwidth_bytes_per_s": ref.bandwidth_bytes_per_s})
    for n in n_compiled:
        req_n = req if n == n_reference else workload(spec, n, seed, locality)
        for build, w in [(b, w) for w in workers for b in builds if w == 1 or b == "jit"]:
            res = simulate(spec, req_n, workers=w, build=build)
            wall, cpu = _best_time(spec, req_n, w, repeats, build)
            same = None
            if n == n_reference:
                same = bool(np.array_equal(res.completion_s, ref.completion_s)
                            and np.array_equal(res.kind, ref.kind))
            rows.append({"engine": builds[build], "requests": n, "workers": w,
                         "wall_s": wall, "cpu_s": cpu, "requests_per_s": n / wall,
                         "requests_per_cpu_s": n / cpu,
                         "speedup_vs_reference": (n / wall) / ref_rate, "identical": same,
                         "row_hit_rate": res.row_hit_rate,
                         "bandwidth_bytes_per_s": res.bandwidth_bytes_per_s})
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the benchmark table with the targets beside it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="also run 1e7 requests (compiled)")
    ap.add_argument("--repeats", type=int, default=3, help="compiled runs per size (best kept)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--locality", type=float, default=0.97,
                    help="row locality of the compute stream (default 0.97)")
    args = ap.parse_args(argv)
    sizes = (200_000, 2_000_000, 10_000_000) if args.large else (200_000, 2_000_000)
    load = os.getloadavg()[0]
    df = run(n_compiled=sizes, repeats=args.repeats, seed=args.seed, locality=args.locality)
    shown = df.assign(
        wall_s=df.wall_s.map("{:.3f}".format),
        cpu_s=df.cpu_s.map("{:.3f}".format),
        requests_per_s=df.requests_per_s.map("{:,.0f}".format),
        requests_per_cpu_s=df.requests_per_cpu_s.map("{:,.0f}".format),
        speedup_vs_reference=df.speedup_vs_reference.map("{:.0f}x".format),
        row_hit_rate=df.row_hit_rate.map("{:.3f}".format),
        bandwidth_GB_per_s=(df.bandwidth_bytes_per_s / 1e9).map("{:.1f}".format),
    ).drop(columns="bandwidth_bytes_per_s")
    print("HBM FR-FCFS benchmark: one HBM3 stack, mixed compute + DMA stream, compute "
          f"locality {args.locality}; 1-min load average {load:.1f} on {os.cpu_count()} CPUs")
    print("(compilation and loading excluded by a warm-up call; compiled = best of "
          f"{args.repeats} runs; reference = one run)")
    print(shown.to_string(index=False))
    comp = df[df.engine.str.startswith("compiled")]
    one = comp[comp.workers == 1]
    best1 = one.requests_per_s.max()
    best1_cpu = one.requests_per_cpu_s.max()
    best = comp.requests_per_s.max()
    speed = one[one.requests == df.requests.iloc[0]].speedup_vs_reference.iloc[0]
    ident = bool(comp.identical.dropna().all())
    print(f"target >= {TARGET_RATE / 1e6:.0f} M requests/s: 1 thread {best1 / 1e6:.2f} M/s wall "
          f"[{'met' if best1 >= TARGET_RATE else 'NOT met'}], {best1_cpu / 1e6:.2f} M/CPU-s "
          f"[{'met' if best1_cpu >= TARGET_RATE else 'NOT met'}]; best {best / 1e6:.2f} M/s "
          f"wall [{'met' if best >= TARGET_RATE else 'NOT met'}]")
    print(f"target >= {TARGET_SPEEDUP:.0f}x reference: {speed:.0f}x "
          f"[{'met' if speed >= TARGET_SPEEDUP else 'NOT met'}]")
    print(f"identical completion times and kinds: {ident}")


if __name__ == "__main__":
    main()
