"""Benchmark: parallel efficiency of a fault campaign on local Dask workers.

The same campaign (``scenarios/fault_mixed.yaml`` with ``tasks`` seeds, no baseline, traces
written) runs on a ``LocalCluster`` of 1 worker and then of 2 workers (single-threaded
processes, started and warmed up - packages imported - before the clock starts). Each
campaign's wall time covers submitting the tasks, running them (every task simulates, writes
its trace and its record) and rebuilding the tables and statistics. The iteration count is
scaled so that one task takes about ``task_s`` seconds on this machine. With 2 workers the
last tasks leave one worker idle; 16 tasks keep that tail small (with 8 it cost about 10%
efficiency here), and the driver and scheduler share the same 2 cores.

Parallel efficiency on ``p`` workers = ``T_1 / (p T_p)``; target (DESIGN.md scale-out) >= 90%
on 2 workers for tasks of one second or more. Other load on the machine lowers it: the table
also reports the mean task time measured inside the tasks (contention for the cores shows as
longer tasks) and ``busy`` = sum of task times / (p T_p), the fraction of the workers' time
spent in tasks (what Dask scheduling, transfers and the driver's bookkeeping leave).

Run ``python -m experiments.bench_campaign``; a top-level bench script can call :func:`run`.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

TARGET_EFFICIENCY = 0.90
SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "fault_mixed.yaml"


WARM_MODULES = ("pyarrow.parquet", "scipy.stats", "h5py", "experiments.campaign", "twin.runner",
                "twin.scenario", "twin.kernel.trace")


def _warm() -> None:
    """Import what a task and the driver use, so the clock measures running, not importing."""
    for name in WARM_MODULES:
        importlib.import_module(name)


def _iterations_for(task_s: float) -> int:
    """Iterations of the scenario that take about ``task_s`` seconds here (one probe run)."""
    from twin.runner import run
    from twin.scenario import load_scenario

    probe = 10
    scen = load_scenario(SCENARIO, {"workload.iterations": probe, "trace.enabled": False})
    t0 = time.perf_counter()
    run(scen)
    per_it = (time.perf_counter() - t0) / probe
    return max(probe, round(task_s / per_it))


def _campaign(tmp: Path, tasks: int, iterations: int):
    from experiments.campaign import load_campaign

    spec = {"name": "bench", "base": str(SCENARIO), "seeds": tasks, "baseline": False,
            "overrides": {"workload.iterations": iterations}, "bootstrap": 200}
    path = tmp / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_campaign(path)


def run(tasks: int = 16, task_s: float = 2.0, workers: tuple[int, ...] = (1, 2)) -> pd.DataFrame:
    """Measure campaign wall time on 1 and 2 local workers.

    Args:
        tasks: runs in the campaign (seeds).
        task_s: wanted duration of one run, s (>= 1 for the target to apply).
        workers: worker counts to measure (the first is the reference).

    Returns:
        a DataFrame with columns ``workers, tasks, iterations, task_s_mean, wall_s, busy,
        speedup, efficiency, target, met`` (``target``/``met`` only for more than one worker).
    """
    from experiments.campaign import run_campaign
    from experiments.many import dask_client

    _warm()
    iterations = _iterations_for(task_s)
    rows = []
    with tempfile.TemporaryDirectory(prefix="meshtwin-bench-campaign-") as d:
        tmp = Path(d)
        camp = _campaign(tmp, tasks, iterations)
        ref = None
        for n in workers:
            with dask_client(workers=n) as client:
                client.run(_warm)
                t0 = time.perf_counter()
                res = run_campaign(camp, tmp / f"out{n}", client, progress=False, plots=False)
                wall = time.perf_counter() - t0
            if res.errors:
                raise RuntimeError(f"benchmark runs failed: {res.errors}")
            import json

            recs = [json.loads(p.read_text()) for p in (tmp / f"out{n}" / "runs").glob("*.json")]
            task_mean = sum(r["timing"]["wall_s"] for r in recs) / len(recs)
            ref = wall if ref is None else ref
            speedup = ref / wall
            eff = speedup / (n / workers[0])
            rows.append({"workers": n, "tasks": tasks, "iterations": iterations,
                         "task_s_mean": task_mean, "wall_s": wall,
                         "busy": task_mean * len(recs) / (n * wall), "speedup": speedup,
                         "efficiency": eff,
                         "target": TARGET_EFFICIENCY if n > workers[0] else None,
                         "met": bool(eff >= TARGET_EFFICIENCY) if n > workers[0] else None})
    return pd.DataFrame(rows)


def main() -> None:
    """Print the benchmark table and whether the target is met."""
    print(f"fault campaign parallel efficiency: {SCENARIO.name}, LocalCluster of "
          "single-threaded worker processes")
    import os

    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    df = run()
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    checked = df[df["met"].notna()]
    print("target met" if bool(checked["met"].all()) else "TARGET MISSED")


if __name__ == "__main__":
    main()
