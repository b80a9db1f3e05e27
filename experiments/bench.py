"""`make bench`: every performance measurement of the twin, printed side by side.

Sections (each prints its own table with the target beside each measurement):

* queueing - Lindley FIFO engine vs a SimPy Resource queue vs a plain-Python loop;
* hbm      - compiled FR-FCFS controller vs its plain-Python reference;
* e2e      - one iteration of GPT-3 175B on 64 ... 4096 devices: wall, CPU, peak memory;
* trace    - trace rows written per second and the slowdown tracing causes;
* campaign - parallel efficiency of a fault campaign on 2 Dask workers;
* contention - GPT-3 175B on 64 devices with the contention model vs roofline (wall ratio);
* startup  - wall time of `twin --help`, `twin check` and `twin run` of the quickstart;
* modes    - fast mode vs ``simulation.exact: true`` side by side per configuration (wall,
  events, peak memory, ratio, disagreement);
* lockstep - lock-step tensor-parallel rings on and off in jittered runs (CPU, events, ratio,
  difference);
* rings    - the ring models: the per-step barrier model at 1, 16 and 64 barriers per chunk
  against the lock-step model (iteration time, energy, their difference, CPU, events).

``python -m experiments.bench [--only SECTION ...] [--quick]`` (``--quick``: the small
configurations of the sections that have large ones). Timings come from this machine under its
current load; the e2e rows give CPU seconds too, which other processes disturb less.
"""

from __future__ import annotations

import argparse
import importlib
import time

import pandas as pd

SECTIONS = {
    "queueing": "experiments.bench_queueing",
    "hbm": "experiments.bench_hbm",
    "e2e": "experiments.bench_e2e",
    "trace": "experiments.bench_trace",
    "campaign": "experiments.bench_campaign",
    "contention": "experiments.bench_contention",
    "startup": "experiments.bench_startup",
    "modes": "experiments.bench_modes",
    "lockstep": "experiments.bench_lockstep",
    "rings": "experiments.bench_rings",
}
#: Sections whose ``run`` takes ``quick`` (small configurations only).
QUICK = {"modes"}


def main(argv: list[str] | None = None) -> None:
    """Run the selected sections and print their tables."""
    p = argparse.ArgumentParser(description="meshtwin benchmarks")
    p.add_argument("--only", action="append", choices=list(SECTIONS),
                   help="run only these sections (repeatable)")
    p.add_argument("--quick", action="store_true",
                   help="small configurations only (minutes on 2 cores)")
    args = p.parse_args(argv)
    for name in args.only or list(SECTIONS):
        mod = importlib.import_module(SECTIONS[name])
        print(f"\n== {name}: {(mod.__doc__ or '').strip().splitlines()[0]}")
        t0 = time.perf_counter()
        df = mod.run(quick=args.quick) if name in QUICK else mod.run()
        with pd.option_context("display.width", 200, "display.max_columns", 30,
                               "display.max_colwidth", 90):
            print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
