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
    of its rate, so the iteration grows, by at most the factor ``U / (U - u)``."""
    from devices.interference import sm_shares
    from twin.scenario import load_scenario

    d = published_data()["mpt"]
    scen = mpt_scenario("125m", 2048, 8, 40, 640, False, d["models"]["125m"], d["vocab"])
    assert scen.overlap.sm_contention
    off = load_scenario({**scen.model_dump(mode="json", exclude_none=True),
                         "overlap": {"sm_contention": False}})
    t_on = simulate_summary(scen)[0]["iteration_time_s"]
    t_off = simulate_summary(off)[0]["iteration_time_s"]
    units = catalog("devices").get("a100-sxm-80gb").values["compute_units"]
    ctas = sm_shares().collective_ctas
    assert t_off < t_on <= t_off * units / (units - ctas)
