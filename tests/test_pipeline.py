"""Pipeline schedules against the analytic bubble fraction."""

from __future__ import annotations

import pytest

from tests.conftest import DEVICE_TIME_KEYS, scenario_dict
from twin.runner import run
from twin.scenario import load_scenario
from twin.trace import read_table
from workloads.schedules import unit_order

UNIFORM_MODEL = {"name": "uniform", "arch": "gpt", "layers": 16, "hidden": 4096, "heads": 32,
                 "vocab": 8, "seq_len": 2048}


def pipeline_scenario(tmp_path, pp, m, schedule="1f1b", v=1):
    """Uniform stages (tiny vocabulary, no kernel overhead) and a near-free network."""
    d = scenario_dict(
        cluster__topology={"kind": "torus2d", "shape": [pp, 1]},
        workload__model=UNIFORM_MODEL,
        workload__seq_len=2048, workload__global_batch=m, workload__micro_batch=1,
        workload__parallelism={"dp": 1, "tp": 1, "pp": pp},
        workload__schedule=schedule, workload__virtual_stages=v,
    )
    d["trace"] = {"path": str(tmp_path / f"p{pp}m{m}{schedule}{v}.h5")}
    return load_scenario(d, ["cluster.link.bandwidth_gbps=1e9", "cluster.link.latency_us=0",
                             "cluster.link.overhead_us=0", "cluster.device.kernel_overhead_us=0"])


def measured_bubble(trace):
    """Mean idle fraction of the stages over the pipeline phase [0, T], T = end of the last
    backward block anywhere (the optimizer step that follows is excluded)."""
    ops = read_table(trace, "ops")
    comp = ops[(ops["kind"] == "compute") & (ops["name"] != "optimizer")]
    end = comp["t_end"].max()
    busy = (comp["t_end"] - comp["t_start"]).groupby(comp["cls"]).sum()
    return float((1 - busy / end).mean())


@pytest.mark.parametrize("pp, m", [(4, 8), (4, 16), (8, 8), (2, 4)])
def test_1f1b_bubble_fraction(tmp_path, pp, m):
    s = pipeline_scenario(tmp_path, pp, m)
    res = run(s)
    expect = (pp - 1) / (m + pp - 1)
    assert measured_bubble(res.trace_path) == pytest.approx(expect, abs=0.01)


def test_gpipe_has_the_same_bubble_as_1f1b(tmp_path):
    a = measured_bubble(run(pipeline_scenario(tmp_path, 4, 8, "gpipe")).trace_path)
    assert a == pytest.approx(3 / 11, abs=0.01)


@pytest.mark.parametrize("v", [2, 4])
def test_interleaving_reduces_bubble_by_about_v(tmp_path, v):
    pp, m = 4, 8
    plain = measured_bubble(run(pipeline_scenario(tmp_path, pp, m)).trace_path)
    inter = measured_bubble(run(pipeline_scenario(tmp_path, pp, m, "interleaved", v)).trace_path)
    # bubble time shrinks by v: fraction ((p-1)/v) / (m + (p-1)/v)
    expect = ((pp - 1) / v) / (m + (pp - 1) / v)
    assert inter == pytest.approx(expect, abs=0.01)
    assert plain / inter == pytest.approx(v * (m + (pp - 1) / v) / (m + pp - 1), rel=0.05)


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_every_unit_once(schedule, v):
    for stage in range(4):
        units = unit_order(schedule, stage, 4, 8, v)
        assert sorted(units) == sorted({(k, c, mb) for k in "FB" for c in range(v)
                                        for mb in range(8)})
        # a unit's backward comes after its forward
        pos = {u: i for i, u in enumerate(units)}
        assert all(pos[("B", c, mb)] > pos[("F", c, mb)] for c in range(v) for mb in range(8))


def test_1f1b_keeps_fewer_microbatches_in_flight_than_gpipe():
    for stage in range(4):
        for sched, bound in (("1f1b", 4 - stage), ("gpipe", 8)):
            live = peak = 0
            for kind, _c, _mb in unit_order(sched, stage, 4, 8):
                live += 1 if kind == "F" else -1
                peak = max(peak, live)
            assert peak == bound


def test_summary_bubble_is_the_traced_receive_waits_and_the_rest_is_idle(tmp_path):
    """``bubble_fraction`` is the share of device time spent waiting for pipeline receives:
    the traced ``recv`` rows over devices x makespan (one iteration of 1F1B, pp 4, m 8). The
    last iteration's drain (a stage that finished waits for the others) is idle time, so the
    receive waits plus the idle share make the textbook bubble (p - 1) / (m + p - 1) to the
    optimizer step; and the per-device times add up to the makespan."""
    pp, m = 4, 8
    res = run(pipeline_scenario(tmp_path, pp, m))
    s = res.summary
    ops = read_table(res.trace_path, "ops")
    waits = ops[ops["kind"] == "recv"]
    traced = float((waits["t_end"] - waits["t_start"]).sum())
    assert s["bubble_fraction"] == pytest.approx(traced / (pp * s["makespan_s"]), rel=1e-9)
    assert s["pipeline_wait_per_device_s"] == pytest.approx(traced / pp, rel=1e-9)
    assert sum(s[k] for k in DEVICE_TIME_KEYS) == pytest.approx(s["makespan_s"], rel=1e-9)
    idle = s["idle_time_per_device_s"] / s["makespan_s"]
    assert idle > 0.05 and s["data_wait_fraction"] == 0.0
    assert s["bubble_fraction"] + idle == pytest.approx((pp - 1) / (m + pp - 1), abs=0.02)
