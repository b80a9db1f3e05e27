"""Random jobs with device agents: running ahead against the step-by-step run (slow).

Each case draws a small job (TP 1-4, PP 1-4, 1F1B or interleaved, sharding or not), a memory
controller model (FR-FCFS or a FIFO queue with deterministic, exponential or Pareto 2.5
service; rank symmetry or per-device draws; HBM ports on or off), overlaps (DP buckets,
pipeline sends that the sender waits for, chunked TP overlap), compute jitter, a straggler
and a power cap, and runs it with agents running ahead (``workloads.quiet``) and with
``twin.runner.uses_run_ahead`` patched off. Times, energy, power segments and the device
agents' records of every contended piece must be the same; the controller's mean slowdown to
1e-12 (blocks run alone are booked in one sum per run). Slow (two seeds of 20 cases, ~2
minutes): ``make test-slow``; ``tests/test_run_ahead.py`` holds the quick cases.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.test_exact import _scenario
from tests.test_fast_mode_random import random_workload
from tests.test_run_ahead import _both


def _case(rnd: random.Random) -> dict:
    w = random_workload(rnd, (1, 2, 4), shard_p=0.3)
    tp = w["parallelism"]["tp"]
    d = _scenario(False, **w)
    service = rnd.choice([{"dist": "exponential"}, {"dist": "deterministic"},
                          {"dist": "pareto", "alpha": 2.5}])
    d["memory"] = rnd.choice([{"model": "frfcfs"}, {"model": "queue", "service": service}]) | {
        "per_device_draws": rnd.random() < 0.5, "transfer_cap": rnd.random() < 0.7}
    ov: dict = {}
    if rnd.random() < 0.5:
        ov["dp_buckets"] = rnd.random() < 0.5
        if w.get("sharding", {}).get("strategy", "none") != "none":
            del ov["dp_buckets"]  # DDP's knob (refused beside a sharded strategy)
    if rnd.random() < 0.3:
        ov["pipeline"] = False
    if tp > 1 and rnd.random() < 0.3:
        ov["tp_comm"] = True
    d["overlap"] = ov
    if rnd.random() < 0.4:
        d["simulation"]["compute_jitter_cov"] = 0.1
    if rnd.random() < 0.3:
        d["faults"] = [{"kind": "straggler", "device": rnd.randrange(16), "time_s": 0.0,
                        "duration_s": 0.05, "factor": 1.5}]
    if rnd.random() < 0.3:
        d["power"] = {"cap_w": 500.0}
    return d


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 5])
def test_random_jobs_beside_device_agents_run_ahead_as_step_by_step(seed, monkeypatch):
    rnd = random.Random(seed)
    ran_ahead = 0
    for _ in range(20):
        d = _case(rnd)
        out = _both(d, monkeypatch)
        (sa, _fa, xa), (ss, _fs, xs) = out[True], out[False]
        ran_ahead += sa["run_ahead_ops"] > 0
        for key in ("iteration_time_s", "makespan_s", "energy_j", "hbm_slowdown_mean",
                    "hbm_port_capped_s", "hbm_max_streams"):
            assert sa[key] == ss[key], (key, d)
        for a, b in zip(xa.accelerators, xs.accelerators, strict=True):
            np.testing.assert_array_equal(a.power_segments(), b.power_segments())
        assert [a.records for a in xa.streams] == [a.records for a in xs.streams], d
        assert sa["memory_slowdown_mean"] == pytest.approx(ss["memory_slowdown_mean"],
                                                           rel=1e-12), d
    assert ran_ahead >= 5  # the draw reaches the shortcut, not only its refusals
