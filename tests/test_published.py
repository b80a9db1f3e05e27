"""Published-runs validation plumbing (twin.published) and kernel-level laws it relies on."""

from __future__ import annotations

import pytest

from devices.accelerator import ComputeModel
from devices.spec import DeviceSpec
from twin.catalogs import catalog
from twin.published import (
    ENV_VAR,
    mpt_scenario,
    published_data,
    simulate_summary,
)
from workloads.transformer import Block, Kernel


def test_bundled_data_has_every_calibration_row():
    d = published_data()
    assert len(d["korthikanti"]["rows"]) == 4 and len(d["mpt"]["rows"]) == 11
    assert all(r[0] in d["mpt"]["models"] for r in d["mpt"]["rows"])


def test_external_calibration_folder_overrides(tmp_path, monkeypatch):
    (tmp_path / "calibration.yaml").write_text(
        "training_a100_fsdp_mpt:\n  models: {125m: [768, 12, 12]}\n  rows:\n"
        "    - {model: 125m, seq: 2048, gpus: 8, micro: 40, accum: 2, batch: 640, ckpt: false,"
        " tokens_per_s_per_gpu: 1000, mfu: 0.1}\n")
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    rows = published_data()["mpt"]["rows"]
    assert rows == [["125m", 2048, 8, 40, 2, 640, False, 1000, 0.1]]


def test_breakdown_adds_up_to_the_iteration_time():
    d = published_data()["mpt"]
    s, b = simulate_summary(mpt_scenario("125m", 2048, 8, 40, 640, False, d["models"]["125m"],
                                         d["vocab"]))
    assert sum(b.values()) == pytest.approx(s["iteration_time_s"], rel=1e-6)
    assert b["compute"] > 0 and b["other_kernels"] > 0 and b["optimizer"] > 0
    assert b["attention"] > 0  # the MPT rows run a fused (Triton FlashAttention) kernel


def test_elementwise_kernels_run_on_the_vector_units():
    """B200 has no fp32 entry in peak_tflops: an element-wise kernel runs at its vector peak
    (75 TFLOP/s), not the 2250 TFLOP/s tensor-core peak, and is charged the vector units'
    share of the dynamic power for its math time."""
    s = DeviceSpec.model_validate(catalog("devices").get("b200-sxm").values)
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    flops = 1e12
    k = Kernel("vec", flops, 0.0, False)
    t = cm.kernel_times(Block("v", (k,)))[0] - cm.overhead_s
    assert t == pytest.approx(flops / 75e12, rel=1e-9)
    c = cm.block_cost(Block("v", (k,)))
    assert c.compute_j == pytest.approx(t * s.vector_power_fraction * cm.dynamic_max_w, rel=1e-9)


def test_mpt_runs_fsdp_collectives_beside_compute_on_sms():
    """PyTorch FSDP runs its all-gathers / reduce-scatters on a separate stream beside the
    GEMMs, so the MPT rows take the NCCL CTAs from compute (overlap.sm_contention). Bounds from
    the closed form of devices.interference: compute beside a collective runs at ``(U - u) / U``
    of its rate, so the iteration grows, by at most the factor ``U / (U - u)``, with ``u``
    the A100's NCCL channels (24, logged on an HGX A100 node), the most SMs taken at once."""
    from twin.scenario import load_scenario

    d = published_data()["mpt"]
    scen = mpt_scenario("125m", 2048, 8, 40, 640, False, d["models"]["125m"], d["vocab"])
    assert scen.overlap.sm_contention
    off = load_scenario({**scen.model_dump(mode="json", exclude_none=True),
                         "overlap": {"sm_contention": False}})
    on = simulate_summary(scen)[0]
    t_on, t_off = on["iteration_time_s"], simulate_summary(off)[0]["iteration_time_s"]
    a100 = catalog("devices").get("a100-sxm-80gb").values
    units, ctas = a100["compute_units"], a100["nccl_channels"]
    assert ctas == 24 and on["sm_max_used"] == ctas
    assert t_off < t_on <= t_off * units / (units - ctas)


# Korthikanti et al. 2022 Table 5, written out here: (model, GPUs, tp, pp, interleaving,
# global batch, micro batch, published s per iteration)
TABLE5 = [("gpt-22b", 8, 8, 1, 1, 4, 4, 1.10), ("gpt3-175b", 64, 8, 8, 3, 64, 1, 13.75),
          ("gpt-530b", 280, 8, 35, 3, 280, 1, 37.83), ("gpt-1t", 512, 8, 64, 1, 512, 1, 71.49)]


def test_korthikanti_rows_become_table_5_scenarios():
    """Every row as the paper ran it: fp16, 2048 tokens, selective recompute, sequence
    parallelism, unfused attention, dp = GPUs / (tp pp), interleaved where v > 1, DGX nodes of
    8 GPUs with the HDR200 NICs between nodes; the rows above 64 GPUs only when asked."""
    from twin.published import cases

    small = list(cases("korthikanti"))
    large = list(cases("korthikanti", large=True))
    assert [c[1] for c in small] == [1.10, 13.75] and [c[1] for c in large] == [37.83, 71.49]
    for (model, gpus, tp, pp, v, gb, mb, ref), (label, t, scen, _src) in zip(
            TABLE5, small + large, strict=True):
        w, cl = scen.workload, scen.cluster
        assert label == f"korthikanti {model} {gpus} A100 tp{tp} pp{pp} v{v}" and t == ref
        assert (w.precision, w.seq, w.recompute, w.sequence_parallel, w.attention) == (
            "fp16", 2048, "selective", True, "standard")
        par = w.parallelism
        assert (par.dp, par.tp, par.pp) == (gpus // (tp * pp), tp, pp)
        assert (w.global_batch, w.micro_batch, w.virtual_stages) == (gb, mb, v)
        assert w.schedule == ("interleaved" if v > 1 else "1f1b")
        assert tuple(cl.topology.shape) == (8, gpus // 8) and cl.device.name == "a100-sxm-80gb"
        assert (cl.nic_link is not None) == (gpus > 8)


def test_a_run_smaller_than_a_node_is_one_node():
    """Four GPUs of an 8-GPU node: one node of four, no NIC."""
    from twin.published import korthikanti_scenario

    scen = korthikanti_scenario("llama3.2-1b", 4, 4, 1, 1, 4, 4)
    assert tuple(scen.cluster.topology.shape) == (4, 1) and scen.cluster.nic_link is None
    # two virtual stages are interleaved too (Table 5 has 1 and 3)
    two = korthikanti_scenario("llama3.2-1b", 4, 2, 2, 2, 8, 1)
    assert (two.workload.schedule, two.workload.virtual_stages) == ("interleaved", 2)


def test_external_korthikanti_rows(tmp_path, monkeypatch):
    """The calibration folder's Table 5 rows in its own format: model names mapped to the
    catalog's, a row of a model the catalog lacks left out, the common micro batch where a row
    gives none."""
    (tmp_path / "calibration.yaml").write_text(
        "training_a100_selective_recompute_seqpar:\n  common: {micro_batch: 1}\n  rows:\n"
        "    - {model: 22B, gpus: 8, tp: 8, pp: 1, interleave: 1, global_batch: 4,"
        " micro_batch: 4, iteration_time_s: 1.1}\n"
        "    - {model: 13B, gpus: 8, tp: 8, pp: 1, interleave: 1, global_batch: 4,"
        " iteration_time_s: 0.7}\n"
        "    - {model: 175B, gpus: 64, tp: 8, pp: 8, interleave: 3, global_batch: 64,"
        " iteration_time_s: 13.75}\n")
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert published_data()["korthikanti"]["rows"] == [
        ["gpt-22b", 8, 8, 1, 1, 4, 4, 1.1], ["gpt3-175b", 64, 8, 8, 3, 64, 1, 13.75]]


@pytest.mark.parametrize("iterations", [1, 2])
def test_breakdown_waits_are_the_summary_waits_per_iteration(iterations):
    """The MPT 125M row (FULL_SHARD): exposed TP, data-parallel (with the all-gather waits)
    and pipeline waits are the summary's per-device waits over the iterations."""
    d = published_data()["mpt"]
    scen = mpt_scenario("125m", 2048, 8, 40, 640, False, d["models"]["125m"], d["vocab"])
    s, b = simulate_summary(scen.replace([f"workload.iterations={iterations}"]))
    n = s["iterations"]
    assert n == iterations and s["sharding"]["allgather_wait_per_device_s"] > 0
    assert b["exposed_tp"] == pytest.approx(s["tp_comm_time_per_device_s"] / n, rel=1e-12)
    assert b["exposed_dp"] == pytest.approx(
        (s["dp_wait_per_device_s"] + s["sharding"]["allgather_wait_per_device_s"]) / n,
        rel=1e-12)
    assert b["pipeline_wait"] == pytest.approx(s["pipeline_wait_per_device_s"] / n, rel=1e-12,
                                               abs=0)


@pytest.mark.parametrize("iterations", [1, 2])
def test_tp_and_pipeline_waits_of_the_breakdown_are_per_iteration(iterations):
    """A run with TP and pipeline waits (tp 2, pp 2 on the tiny torus): the breakdown's
    exposed TP and pipeline waits are the summary's per-device waits over the iterations."""
    from tests.conftest import scenario_dict
    from twin.scenario import load_scenario

    d = scenario_dict(workload__parallelism={"dp": 2, "tp": 2, "pp": 2},
                      workload__iterations=iterations)
    d["trace"] = {"enabled": False}
    s, b = simulate_summary(load_scenario(d))
    assert s["tp_comm_time_per_device_s"] > 0 and s["pipeline_wait_per_device_s"] > 0
    assert b["exposed_tp"] == pytest.approx(s["tp_comm_time_per_device_s"] / iterations,
                                            rel=1e-12)
    assert b["pipeline_wait"] == pytest.approx(s["pipeline_wait_per_device_s"] / iterations,
                                               rel=1e-12)


def test_mpt_rows_take_their_time_from_tokens_per_second():
    """Each MPT row's published iteration time is its global batch of tokens over the
    cluster's tokens per second (calibration rows, worked out here): 70B on 64 GPUs 2048 x
    2048 / (410 x 64) s, 7B at 2k 96 x 2048 / (4641 x 8) s, 125M 640 x 2048 / (142830 x 8)
    s; eleven rows. No validation run writes a trace (Korthikanti's rows neither)."""
    from twin.published import cases

    rows = {label: t for label, t, _scen, _src in cases("mpt")}
    assert len(rows) == 11
    assert not any(c[2].trace.enabled for which in ("mpt", "korthikanti")
                   for c in cases(which))
    assert rows["mpt 70b seq2048 64 A100 FSDP ckpt"] == pytest.approx(159.8439, rel=1e-5)
    assert rows["mpt 7b seq2048 8 A100 FSDP"] == pytest.approx(5.29541, rel=1e-5)
    assert rows["mpt 125m seq2048 8 A100 FSDP"] == pytest.approx(1.147098, rel=1e-5)
