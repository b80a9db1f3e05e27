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


def _tied_run(tmp_path, tied: bool, pp: int = 2, tp: int = 1):
    """Llama 3.2 1B over ``pp`` stages (x ``tp``) on a mesh row of NVLink4 x 4 per edge."""
    d = scenario_dict(cluster__topology={"kind": "mesh2d", "shape": [pp * tp, 1]},
                      workload__parallelism={"dp": 1, "tp": tp, "pp": pp},
                      workload__global_batch=4)
    d["trace"] = {"path": str(tmp_path / f"tied{tied}{pp}{tp}.h5"), "tables": ["ops", "messages"]}
    return run(load_scenario(d, [f"workload.model.tied_embeddings={str(tied).lower()}"]))


def test_tied_embeddings_over_two_stages_all_reduce_their_gradient_in_closed_form(tmp_path):
    """Megatron-LM keeps a copy of a tied embedding matrix on the last stage and all-reduces
    the two copies' gradients between the first and last stage after the data-parallel sync.
    Untied, the last stage holds an output matrix of the same size, so the two runs differ by
    that all-reduce alone: both ends start it together when the later one (stage 0, which
    ends the 1F1B backward) gets there, and a two-rank all-reduce moves the whole gradient
    each way: alpha + n / B, with n = vocab x hidden x 2 bytes (bf16 gradients), B = 4 links
    x 25 GB/s x 0.817 (the catalog's NVLink4) and alpha its overhead + hop latency."""
    from twin.catalogs import catalog

    link = catalog("links").get("nvlink4").values
    bw = 4 * link["bandwidth_gbps"] * 1e9 * link["efficiency"]
    alpha = (link["overhead_us"] + link["latency_us"]) * 1e-6
    n = 128256 * 2048 * 2.0
    tied, untied = _tied_run(tmp_path, True), _tied_run(tmp_path, False)
    delta = tied.summary["iteration_time_s"] - untied.summary["iteration_time_s"]
    # untied, the run ends with stage 0's optimizer step; tied, with stage 1's, which also
    # updates the final norm (its own duration, read from the trace)
    ops = read_table(tied.trace_path, "ops")
    opt = ops[ops["name"] == "optimizer"].set_index("cls")
    step = opt["t_end"] - opt["t_start"]
    assert delta == pytest.approx(alpha + n / bw + step[1] - step[0], rel=1e-9)
    msgs = read_table(tied.trace_path, "messages")
    embed = msgs[msgs["name"] == "p2p_embed"]
    assert sorted(zip(embed["src"], embed["dst"], strict=True)) == [(0, 1), (1, 0)]
    assert (embed["bytes"] == n).all() and embed["t_start"].nunique() == 1
    assert not (read_table(untied.trace_path, "messages")["name"] == "p2p_embed").any()


def test_tied_embeddings_exchange_only_between_the_ends_and_only_with_stages(tmp_path):
    """One stage: nothing to exchange (the matrix is shared in place). Four stages: only the
    first and last exchange, each TP rank with its peer, 1/tp of the matrix."""
    one = _tied_run(tmp_path, True, pp=1)
    assert not (read_table(one.trace_path, "messages")["name"] == "p2p_embed").any()
    four = _tied_run(tmp_path, True, pp=4, tp=2)
    msgs = read_table(four.trace_path, "messages")
    embed = msgs[msgs["name"] == "p2p_embed"]
    # one phase each way of the two TP ranks' pairs (a phase's bytes are its pairs' total)
    assert len(embed) == 2 and (embed["n_pairs"] == 2).all()
    assert (embed["bytes"] == 2 * 128256 * 2048 * 2.0 / 2).all()
