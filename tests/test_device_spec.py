"""Device and link specs (devices/spec.py): units, defaults and bounds, against values worked
out here from the catalog entries' own numbers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from devices.accelerator import ComputeModel
from devices.spec import DeviceSpec, LinkSpec
from twin.catalogs import catalog
from workloads.transformer import Block, Kernel


def _h100(**changes) -> DeviceSpec:
    return DeviceSpec.model_validate({**catalog("devices").get("h100-sxm").values, **changes})


def _nvlink(**changes) -> LinkSpec:
    return LinkSpec.model_validate({**catalog("links").get("nvlink4").values, **changes})


def test_units_of_capacities_and_rates():
    """80 GB of HBM are 80e9 bytes; an NVLink 4 link of 25 GB/s at 81.7% moves 20.425e9 B/s."""
    assert _h100().hbm_bytes == 80e9
    link = _nvlink()
    assert (link.bandwidth_gbps, link.efficiency) == (25, 0.817)
    assert link.bytes_per_s == pytest.approx(25e9 * 0.817, rel=1e-12)


def test_gemm_k_half_defaults_to_no_k_dependence():
    """Without ``gemm_k_half`` a GEMM of depth 16 runs at the rate of any other depth: the
    rate of a compute-bound GEMM (no launch overhead, no tiles) is the same at k = 16 and
    k = 4096 per FLOP."""
    values = {**catalog("devices").get("h100-sxm").values, "kernel_overhead_us": 0.0,
              "compute_units": None}
    dev = DeviceSpec.model_validate({k: v for k, v in values.items() if k != "gemm_k_half"})
    assert dev.gemm_k_half == 0.0
    cm = ComputeModel(dev, "bf16", dev.hbm_pj_per_bit)

    def rate(k: int) -> float:
        m = n = 8192
        kern = Kernel("g", 2.0 * m * n * k, 1.0, True, (1.0, m, n), depth=k)
        return 2.0 * m * n * k / cm.kernel_times(Block("g", (kern,)))[0]

    assert rate(16) == pytest.approx(rate(4096), rel=1e-12)


def test_vector_rate_sources():
    """Element-wise math runs on the vector units: their fp32 peak, else their largest
    entry, else the fp32 entry of the tensor peaks; a device with neither is refused."""
    assert _h100(vector_tflops={"fp32": 60.0}).vector_flops() == 60e12
    assert _h100(vector_tflops={"bf16": 100.0, "fp16": 50.0}).vector_flops() == 100e12
    dev = _h100(vector_tflops=None)
    assert dev.vector_flops() == dev.peak_tflops["fp32"] * 1e12
    peaks = {k: v for k, v in dev.peak_tflops.items() if k != "fp32"}
    with pytest.raises(ValidationError, match="vector_tflops is required"):
        _h100(vector_tflops=None, peak_tflops=peaks)


def test_tiles_need_both_the_tile_and_the_units():
    """Wave quantization needs the output tile and the number of compute units: without
    either there are no tile candidates."""
    dev = _h100()
    assert dev.tile_candidates()[0] == tuple(dev.gemm_tile)
    assert _h100(compute_units=None).tile_candidates() == ()
    assert _h100(gemm_tile=None, gemm_tiles=None).tile_candidates() == ()


def test_spec_bounds():
    """One HBM stack is a device; a board of 1e5 W is the largest allowed; a link's idle
    power up to 1e6 W, its receiver's noise figure up to 100 dB; a link without
    ``device_w`` adds no device power."""
    assert _h100(hbm_stacks=1).hbm_stacks == 1
    assert _h100(tdp_w=1e5).tdp_w == 1e5
    with pytest.raises(ValidationError, match="tdp_w"):
        _h100(tdp_w=1.0001e5)
    assert _nvlink(idle_w=1e6).idle_w == 1e6
    with pytest.raises(ValidationError, match="idle_w"):
        _nvlink(idle_w=1.0001e6)
    assert _nvlink(noise_figure_db=100.0).noise_figure_db == 100.0
    with pytest.raises(ValidationError, match="noise_figure_db"):
        _nvlink(noise_figure_db=100.01)
    assert _nvlink().device_w == 0.0


def test_nccl_channels_leave_an_sm_to_compute():
    """A device's NCCL channel count (one SM each) is optional and below its SM count: a
    collective that took every SM would leave compute no rate at all."""
    assert _h100().nccl_channels is None
    assert _h100(nccl_channels=19, compute_units=20).nccl_channels == 19
    with pytest.raises(ValidationError, match=r"nccl_channels \(20\) must be below "
                                              r"compute_units \(20\)"):
        _h100(nccl_channels=20, compute_units=20)
    with pytest.raises(ValidationError, match="less than or equal to 64"):
        _h100(nccl_channels=65)
    assert _h100(nccl_channels=64, compute_units=None).nccl_channels == 64


def test_collectives_take_the_devices_nccl_channels():
    """The SMs a collective takes: the A100's logged 24 NCCL channels (nccl-tests issue #100,
    an HGX A100 node), the interference catalog's ``collective_ctas`` on a device whose
    entry gives none; the other shares are the catalog's either way."""
    from devices.interference import device_sm_shares, sm_shares

    a100 = DeviceSpec.model_validate(catalog("devices").get("a100-sxm-80gb").values)
    assert a100.nccl_channels == 24
    shares = device_sm_shares(a100)
    base = sm_shares()
    assert shares.collective_ctas == 24 and shares.of("dp") == shares.of("shard") == 24
    assert (shares.tp_overlap_ctas, shares.copy_ctas, shares.activity) == (
        base.tp_overlap_ctas, base.copy_ctas, base.activity)
    assert device_sm_shares(_h100()) == base


def test_operand_bytes_are_the_formats_sizes():
    """A GEMM operand takes the storage size of its format: IEEE binary32 (and TF32, stored
    as 32 bits) 4 bytes, bfloat16 / binary16 2, FP8 (E4M3 / E5M2) 1, FP4 (E2M1) half."""
    from workloads.transformer import gemm_input_bytes_per_element

    want = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
    assert {p: gemm_input_bytes_per_element(p) for p in want} == want


def test_fused_attention_fractions_fall_back_to_the_matmul_efficiency():
    """``flash`` runs at ``attention_efficiency`` where the device gives the direction, else
    at its lowest matmul efficiency (a device without any, or with the forward only)."""
    low = min(_h100().matmul_efficiency.values())
    none = _h100(attention_efficiency=None)
    assert none.attention_fraction("fwd", "flash") == none.attention_fraction("bwd", "flash") == low
    fwd_only = _h100(attention_efficiency={"fwd": 0.6})
    assert fwd_only.attention_fraction("fwd", "flash") == 0.6
    assert fwd_only.attention_fraction("bwd", "flash") == low


def test_hbm_access_energy_is_bounded_at_ten_thousand_pj_per_bit():
    """``hbm_pj_per_bit`` at most 1e4 (a thousand times DRAM's ~10 pJ/bit): the bound is
    taken, one pJ more is refused naming the field; a link's ``lanes`` from 1."""
    from pathlib import Path

    from twin.kernel.errors import ScenarioError
    from twin.scenario import load_scenario

    quick = Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml"
    ok = load_scenario(quick, ["cluster.device.hbm_pj_per_bit=10000", "cluster.link.lanes=1"])
    assert ok.cluster.device.hbm_pj_per_bit == 1e4
    assert ok.cluster.link.lanes == 1  # one electrical lane is a link; none is not
    with pytest.raises(ScenarioError, match=r"cluster\.link\.lanes"):
        load_scenario(quick, ["cluster.link.lanes=0"])
    with pytest.raises(ScenarioError, match=r"cluster\.device\.hbm_pj_per_bit"):
        load_scenario(quick, ["cluster.device.hbm_pj_per_bit=10001"])
