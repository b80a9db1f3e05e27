"""Lock-step tensor-parallel rings (fast mode without rank symmetry) on and off, side by side.

(The shortcut of ``network.ring_model: step``; the default ring model runs every ring
lock-step.)

GPT-3 175B on 2D tori (the ``modes`` section's scenario: tp 8, pp 8) with compute jitter
(cov 0.05, so every rank is simulated), few microbatches per replica so that the
data-parallel all-reduce, whose rings cross the tensor-parallel groups' links, is a large part
of the run: ``simulation.lockstep_rings`` true (the default, ``devices.phase.lockstep_ok``) and
false (every ring flow by flow, step by step, as in exact mode). Prints CPU seconds, events,
the speed-up and the relative difference of iteration time and energy (lock-step runs a
ring at its slowest member's rate, so a difference is usually a positive one). Each run in
its own subprocess.

``python -m experiments.bench_lockstep [--devices 256 1024] [--microbatches 4]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import pandas as pd


def measure(devices: int, microbatches: int, lockstep: bool) -> dict:
    """One run in this process."""
    from experiments.bench_modes import _gpt3
    from twin.runner import run
    from twin.scenario import load_scenario

    d = _gpt3(devices, 0.05)
    d["workload"]["global_batch"] = microbatches * d["workload"]["parallelism"]["dp"]
    d["simulation"]["lockstep_rings"] = lockstep
    d["network"] = {"ring_model": "step"}  # (the shortcut belongs to the step ring model)
    d["simulation"]["limits"] = {"max_events": 10**9, "max_sim_time_s": 1e6}
    scen = load_scenario(d)
    c0 = time.process_time()
    s = run(scen).summary
    return {"devices": devices, "lockstep": lockstep, "cpu_s": time.process_time() - c0,
            "events": s["events"], "lockstep_transfers": s["lockstep_ring_transfers"],
            "iteration_time_s": s["iteration_time_s"], "energy_j": s["energy_j"]}


def run(devices: tuple[int, ...] = (256, 1024), microbatches: int = 4) -> pd.DataFrame:
    """Both settings per size, each in a fresh subprocess; one row per size."""
    rows = []
    for n in devices:
        got = {}
        for on in (False, True):
            out = subprocess.run([sys.executable, "-m", "experiments.bench_lockstep", "--one",
                                  str(n), "--microbatches", str(microbatches)]
                                 + (["--on"] if on else []),
                                 capture_output=True, text=True, check=True)
            got[on] = json.loads(out.stdout.strip().splitlines()[-1])
        off, on = got[False], got[True]
        rows.append({"devices": n, "microbatches": microbatches, "per_flow_cpu_s": off["cpu_s"],
                     "lockstep_cpu_s": on["cpu_s"], "speedup": off["cpu_s"] / on["cpu_s"],
                     "per_flow_events": off["events"], "lockstep_events": on["events"],
                     "lockstep_transfers": on["lockstep_transfers"],
                     "iteration_time_rel": on["iteration_time_s"] / off["iteration_time_s"] - 1,
                     "energy_rel": on["energy_j"] / off["energy_j"] - 1,
                     "target": "|rel| <= 0.5% (fast vs exact)"})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    """CLI: one run as JSON (``--one N``), or the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", type=int, help="devices of one run (prints JSON)")
    p.add_argument("--on", action="store_true", help="with --one: lock-step rings on")
    p.add_argument("--devices", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--microbatches", type=int, default=4)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.microbatches, args.on)))
        return
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(run(tuple(args.devices), args.microbatches).to_string(index=False))


if __name__ == "__main__":
    main()
