"""Ring models side by side: the per-step barrier model, refined, and the lock-step model.

GPT-3 175B on 2D tori (the ``modes`` section's scenario: tp 8, pp 8) with compute jitter (cov
0.05, so every rank is simulated and the data-parallel rings run out of step beside pipeline
and tensor-parallel traffic), fast mode: ``network.ring_model: step`` with
``network.ring_substeps`` 1 (the default: one barrier per chunk), 16 and 64, and
``ring_model: lockstep``. Prints iteration time and energy, their difference from the
lock-step run (the step model's discretization error if lock-step is its limit: it should
shrink as the barriers get finer), CPU seconds and events. Each run in its own subprocess.

``python -m experiments.bench_rings [--devices 256 1024] [--microbatches 4]
[--models step:1 step:16 step:64 lockstep:1]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import pandas as pd

MODELS = ("step:1", "step:16", "step:64", "lockstep:1")


def measure(devices: int, microbatches: int, ring_model: str, substeps: int) -> dict:
    """One run in this process."""
    from experiments.bench_modes import _gpt3
    from twin.runner import run
    from twin.scenario import load_scenario

    d = _gpt3(devices, 0.05)
    d["workload"]["global_batch"] = microbatches * d["workload"]["parallelism"]["dp"]
    d["network"] = {"ring_model": ring_model, "ring_substeps": substeps}
    d["simulation"]["limits"] = {"max_events": 10**9, "max_sim_time_s": 1e6}
    scen = load_scenario(d)
    c0 = time.process_time()
    s = run(scen).summary
    return {"devices": devices, "microbatches": microbatches, "ring_model": ring_model,
            "substeps": substeps, "cpu_s": time.process_time() - c0, "events": s["events"],
            "iteration_time_s": s["iteration_time_s"], "energy_j": s["energy_j"]}


def run(devices: tuple[int, ...] = (256, 1024), microbatches: int = 4,
        models: tuple[str, ...] = MODELS) -> pd.DataFrame:
    """Every model per size, each in a fresh subprocess; differences against the lock-step
    run of the same size (when it is among ``models``)."""
    rows = []
    for n in devices:
        got = []
        for m in models:
            out = subprocess.run([sys.executable, "-m", "experiments.bench_rings", "--one",
                                  str(n), "--microbatches", str(microbatches), "--model", m],
                                 capture_output=True, text=True, check=True)
            got.append(json.loads(out.stdout.strip().splitlines()[-1]))
        ref = next((g for g in got if g["ring_model"] == "lockstep"), None)
        for g in got:
            if ref is not None:
                g["iteration_vs_lockstep"] = g["iteration_time_s"] / ref["iteration_time_s"] - 1
                g["energy_vs_lockstep"] = g["energy_j"] / ref["energy_j"] - 1
            rows.append(g)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    """CLI: one run as JSON (``--one N --model M:K``), or the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", type=int, help="devices of one run (prints JSON)")
    p.add_argument("--model", default="step:1", help="with --one: ring_model:substeps")
    p.add_argument("--devices", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--models", nargs="+", default=list(MODELS),
                   help="ring_model:substeps of each run")
    args = p.parse_args(argv)
    if args.one:
        name, k = args.model.split(":")
        print(json.dumps(measure(args.one, args.microbatches, name, int(k))))
        return
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(run(tuple(args.devices), args.microbatches, tuple(args.models))
              .to_string(index=False, float_format=lambda v: f"{v:.6g}"))


if __name__ == "__main__":
    main()
