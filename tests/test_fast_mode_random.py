"""Random layouts with faults that only change a device, fast mode against exact mode.

Each case draws a small job (TP 2-4, PP 1-4, 1F1B or interleaved, sharding or not, 2D torus or
mesh, one to three stragglers / HBM degradations / cooling failures on random devices and
windows, compute jitter on or off) and runs it in both modes: iteration time and energy within
the fast mode's 0.5%, and without jitter the same iteration time to 1e-9 where the flow engine
gives the rings their own rates (``lockstep_rings: false``; lock-step rings are exact only
while a ring's members get equal rates). Slow (two seeds of 50 cases: ~4 minutes): ``make
test-slow``; ``tests/test_device_faults_fast.py`` holds the quick cases.
"""

from __future__ import annotations

import random

import pytest

from tests.test_exact import _scenario
from twin.runner import run
from twin.scenario import load_scenario


def random_workload(rnd: random.Random, tps: tuple[int, ...] = (2, 4),
                    shard_p: float = 0.4) -> dict:
    """A random layout of 16 devices: TP from ``tps``, PP 1-4, 1F1B or interleaved, sharded
    data parallelism with probability ``shard_p`` (the ``workload`` keys)."""
    tp = rnd.choice(list(tps))
    pp = rnd.choice([1, 2, 4])
    dp = 16 // (tp * pp)
    w: dict = {"parallelism": {"dp": dp, "tp": tp, "pp": pp},
               "global_batch": dp * rnd.choice([2, 4, 8])}
    if pp > 1 and rnd.random() < 0.3:
        w.update(schedule="interleaved", virtual_stages=2, global_batch=dp * pp * 2)
    if dp > 1 and rnd.random() < shard_p:
        w["sharding"] = {"strategy": rnd.choice(["full_shard", "zero1", "zero2"])}
    return w


def _case(rnd: random.Random) -> tuple[dict, list[dict], float, str]:
    w = random_workload(rnd)
    faults = []
    for _ in range(rnd.choice([1, 1, 2, 3])):
        kind = rnd.choice(["straggler", "hbm_degradation", "cooling_failure"])
        f: dict = {"kind": kind, "time_s": round(rnd.uniform(0, 0.05), 4),
                   "duration_s": round(rnd.uniform(0.005, 0.08), 4)}
        if rnd.random() < 0.7:
            f["device"] = rnd.randrange(16)
        else:
            f["devices"] = sorted(rnd.sample(range(16), rnd.choice([2, 3, 5])))
        if kind == "straggler":
            f["factor"] = round(rnd.uniform(1.1, 3), 2)
        elif kind == "hbm_degradation":
            f["factor"] = round(rnd.uniform(1.1, 4), 2)
        else:
            f["rise_k"] = round(rnd.uniform(5, 30), 1)
        faults.append(f)
    return w, faults, rnd.choice([0.0, 0.05]), rnd.choice(["torus2d", "mesh2d"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [7, 11])
def test_random_faulty_layouts_agree_with_exact_mode(seed):
    rnd = random.Random(seed)
    for _ in range(50):
        w, faults, jitter, kind = _case(rnd)
        out = {}
        for exact in (False, True):
            d = _scenario(exact, **w)
            d["cluster"]["topology"]["kind"] = kind
            d["faults"] = faults
            d["simulation"]["compute_jitter_cov"] = jitter
            if jitter == 0.0:
                d["simulation"]["lockstep_rings"] = False
            out[exact] = run(load_scenario(d)).summary
        fast, ref = out[False], out[True]
        label = (w, faults, jitter, kind)
        for key in ("iteration_time_s", "energy_j"):
            assert fast[key] == pytest.approx(ref[key], rel=5e-3), (key, label)
        if jitter == 0.0:
            assert fast["iteration_time_s"] == pytest.approx(ref["iteration_time_s"],
                                                             rel=1e-9), label
