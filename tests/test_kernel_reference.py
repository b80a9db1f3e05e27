"""Independent references for the kernel model (issue 15, part 2).

* A transformer layer's FLOPs and HBM bytes per kernel, counted here from the textbook GEMM
  formulas (Narayanan et al. SC'21, Korthikanti et al. 2022: ``24 b s h^2 + 4 b s^2 h`` GEMM
  FLOPs per GPT layer forward, twice that backward) and from tensor shapes x bytes per element,
  without calling any helper of ``workloads/transformer.py``.
* Per-kernel roofline times with wave quantization from a plain slow reference that enumerates
  the output tiles of a GEMM and fills the compute units wave by wave, against
  ``devices/accelerator.py``'s kernel times and block costs.

The per-element FLOP counts of element-wise kernels are catalog data
(``workloads/catalog/kernels/transformer.yaml``, each with its derivation); they are read here
from the YAML file itself, not through the code under test.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from devices.accelerator import ComputeModel
from devices.spec import DeviceSpec
from twin.catalogs import catalog
from workloads.spec import ModelSpec
from workloads.transformer import Block, Kernel, TransformerCosts

KCAT = (Path(__file__).resolve().parents[1] / "workloads" / "catalog" / "kernels"
        / "transformer.yaml")


def kc(name: str) -> float:
    """A per-element constant straight from the kernel catalog file."""
    return float(yaml.safe_load(KCAT.read_text())[name]["value"])


def device(name: str, **over) -> DeviceSpec:
    return DeviceSpec.model_validate({**catalog("devices").get(name).values, **over})


GPT = dict(name="gpt-ref", arch="gpt", layers=2, hidden=1536, heads=12, vocab=4096,
           seq_len=1024)
LLAMA = dict(name="llama-ref", arch="llama", layers=2, hidden=2048, heads=16, kv_heads=4,
             ffn_hidden=5632, vocab=4096, seq_len=1024)


# ----------------------------------------------------------------------------- FLOPs / bytes
def ref_layer(arch: str, b: int, s: int, h: int, heads: int, kv_heads: int, f: int, t: int,
              sp: bool, attention: str, prec_bytes: float = 2.0) -> dict[str, dict]:
    """Expected ``{block: {kernel: (flops, bytes)}}`` of one layer on one rank, bf16/fp16
    (``prec_bytes`` = 2: activations, GEMM inputs, weights and gradients 16-bit), written from
    the tensor shapes. ``executed`` is not part of the counts (FLOPs are the published ones)."""
    e = prec_bytes
    d = h // heads
    T = b * s                                  # tokens
    hq = heads * d / t                         # query width per rank
    hkv = kv_heads * d / t                     # key / value width per rank
    ew = T * h / (t if sp else 1)              # elements of an element-wise kernel on h
    gated = arch == "llama"
    up = (2 * f if gated else f) / t           # MLP up (+ gate) width per rank
    fr = f / t
    norm = kc("rmsnorm_flops" if gated else "layernorm_flops")
    act = kc("swiglu_flops" if gated else "gelu_flops")

    def gemm_fwd(M, K, N):                     # [M,K] x [K,N]: read A, W, write C
        return 2 * M * K * N, (M * K + K * N + M * N) * e

    def dgrad(M, K, N):                        # dX[M,K] = dY[M,N] W^T: read dY, W, write dX
        return 2 * M * K * N, (M * N + K * N + M * K) * e

    def wgrad(M, K, N):                        # dW[K,N] = X^T dY: read X, dY, write dW
        return 2 * M * K * N, (M * K + M * N + K * N) * e

    fwd_a: dict[str, tuple[float, float]] = {"norm1": (norm * ew, 2 * ew * e)}
    bwd_a: dict[str, tuple[float, float]] = {"norm1.bwd": (2 * norm * ew, 3 * ew * e)}
    qkv = (T, h, hq + 2 * hkv)
    fwd_a["qkv"] = gemm_fwd(*qkv)
    bwd_a["qkv.dgrad"], bwd_a["qkv.wgrad"] = dgrad(*qkv), wgrad(*qkv)
    if gated:
        rot = T * (hq + hkv)                   # q and k are rotated, v is not
        fwd_a["rotary"] = (kc("rotary_flops") * rot, 2 * rot * e)
        bwd_a["rotary.bwd"] = (kc("rotary_flops") * rot, 2 * rot * e)
    # attention core: QK^T and PV batched GEMMs, each 2 b s^2 (h/t) FLOPs forward
    core = 2 * 2 * b * s * s * hq
    if attention == "flash":
        fwd_a["attn_core"] = (core, (T * hq + 2 * T * hkv + T * hq) * e)          # Q K V -> O
        bwd_a["attn_core.bwd"] = (2 * core,                                       # Q K V O dO
                                  (3 * T * hq + 2 * T * hkv + T * hq + 2 * T * hkv) * e)
    else:
        S = b * (heads / t) * s * s            # score elements
        fwd_a["attn_scores"] = (core / 2, (T * hq + T * hkv + S) * e)             # Q K -> S
        fwd_a["softmax"] = (kc("softmax_flops") * S, 2 * S * e)
        fwd_a["dropout"] = (kc("dropout_flops") * S, S * (2 * e + 1))             # + 1 B mask
        fwd_a["attn_context"] = (core / 2, (S + T * hkv + T * hq) * e)            # P V -> O
        # backward of the two batched GEMMs: each operand gradient is one GEMM of the forward's
        # size (dQ, dK from dS; dP, dV from dO), reading and writing twice the forward's tensors
        for k in ("attn_scores", "attn_context"):
            fl, by = fwd_a[k]
            bwd_a[k] = (2 * fl, 2 * by)
        # softmax backward dx = y (dy - rowsum(dy y)): reads y and dy, writes dx (3 S e);
        # dropout backward dx = dy mask / (1 - p): reads dy and the 1-byte mask, writes dx.
        # FLOPs: twice the forward's (the catalog's per-element count, both passes).
        bwd_a["softmax"] = (2 * kc("softmax_flops") * S, 3 * S * e)
        bwd_a["dropout"] = (2 * kc("dropout_flops") * S, S * (e + 1 + e))
    out = (T, hq, h)
    fwd_a["attn_out"] = gemm_fwd(*out)
    bwd_a["attn_out.dgrad"], bwd_a["attn_out.wgrad"] = dgrad(*out), wgrad(*out)
    fwd_a["residual1"] = bwd_a["residual1"] = (kc("residual_flops") * ew, 3 * ew * e)

    fwd_m: dict[str, tuple[float, float]] = {"norm2": (norm * ew, 2 * ew * e)}
    bwd_m: dict[str, tuple[float, float]] = {"norm2.bwd": (2 * norm * ew, 3 * ew * e)}
    mup = (T, h, up)
    fwd_m["mlp_up"] = gemm_fwd(*mup)
    bwd_m["mlp_up.dgrad"], bwd_m["mlp_up.wgrad"] = dgrad(*mup), wgrad(*mup)
    ea = T * fr                            # the activation is TP-split with or without SP
    ins = 2 if gated else 1                # SwiGLU reads gate and up
    fwd_m["act"] = (act * ea, (ins + 1) * ea * e)
    bwd_m["act.bwd"] = (2 * act * ea, (ins + 1 + ins) * ea * e)  # saved input(s), dy -> dx
    mdn = (T, fr, h)
    fwd_m["mlp_down"] = gemm_fwd(*mdn)
    bwd_m["mlp_down.dgrad"], bwd_m["mlp_down.wgrad"] = dgrad(*mdn), wgrad(*mdn)
    fwd_m["residual2"] = bwd_m["residual2"] = (kc("residual_flops") * ew, 3 * ew * e)
    return {"attn_fwd": fwd_a, "attn_bwd": bwd_a, "mlp_fwd": fwd_m, "mlp_bwd": bwd_m}


def _costs(spec: dict, t: int = 1, sp: bool = False, attention: str = "flash",
           precision: str = "bf16", b: int = 2) -> tuple[TransformerCosts, ModelSpec]:
    m = ModelSpec(**spec)
    return TransformerCosts(m, precision, b, m.seq_len, tp=t, sequence_parallel=sp,
                            attention=attention), m


def _blocks(tc: TransformerCosts) -> dict[str, Block]:
    return {"attn_fwd": tc.attention_block(), "attn_bwd": tc.attention_block(True),
            "mlp_fwd": tc.mlp_block(), "mlp_bwd": tc.mlp_block(True)}


CASES = [(GPT, 1, False, "flash"), (GPT, 2, False, "standard"), (GPT, 4, True, "flash"),
         (GPT, 2, True, "standard"), (LLAMA, 1, False, "flash"), (LLAMA, 2, True, "flash"),
         (LLAMA, 4, False, "standard")]


@pytest.mark.parametrize("spec,t,sp,attention", CASES)
def test_every_kernel_flops_and_bytes_match_the_shape_count(spec, t, sp, attention):
    tc, m = _costs(spec, t, sp, attention)
    ffn = m.ffn_hidden or 4 * m.hidden
    ref = ref_layer(m.arch, 2, m.seq_len, m.hidden, m.heads, m.kv_heads or m.heads, ffn, t, sp,
                    attention)
    for name, blk in _blocks(tc).items():
        got = {k.name: (k.flops, k.bytes) for k in blk.kernels}
        assert set(got) == set(ref[name]), name
        for k, (fl, by) in ref[name].items():
            assert got[k][0] == pytest.approx(fl, rel=1e-12), (name, k, "flops")
            assert got[k][1] == pytest.approx(by, rel=1e-12), (name, k, "bytes")


#: kernels that are matrix products (tensor cores): the projections, the MLP and the attention
#: core's batched products; everything else (norms, rotary, softmax, dropout, activation,
#: residual adds) is element-wise work on the vector units
MATMULS = ("qkv", "attn_core", "attn_scores", "attn_context", "attn_out", "mlp_up", "mlp_down")


@pytest.mark.parametrize("spec,t,sp,attention", CASES)
def test_only_the_matrix_products_run_on_the_tensor_cores(spec, t, sp, attention):
    tc, _m = _costs(spec, t, sp, attention)
    for name, blk in _blocks(tc).items():
        for k in blk.kernels:
            assert k.gemm == (k.name.split(".")[0] in MATMULS), (name, k.name)


@pytest.mark.parametrize("spec", [GPT, LLAMA])
def test_backward_runs_the_forward_kernels_in_reverse_order(spec):
    tc, _ = _costs(spec)
    for fwd, bwd in ((tc.attention_block(), tc.attention_block(True)),
                     (tc.mlp_block(), tc.mlp_block(True))):
        stem = [k.name.split(".")[0] for k in bwd.kernels]
        dedup = [n for i, n in enumerate(stem) if i == 0 or stem[i - 1] != n]
        assert dedup == [k.name for k in reversed(fwd.kernels)]


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("attention", ["flash", "standard"])
def test_gpt_layer_gemm_flops_equal_the_published_closed_form(t, attention):
    """Narayanan et al. (SC'21) / Korthikanti et al. (2022): a GPT layer's GEMMs (including the
    two attention batched GEMMs) cost ``24 b s h^2 + 4 b s^2 h`` FLOPs forward and twice that
    backward, split 1/t over tensor parallelism."""
    tc, m = _costs(GPT, t, attention=attention)
    b, s, h = 2, m.seq_len, m.hidden
    fwd = (24 * b * s * h * h + 4 * b * s * s * h) / t
    blocks = _blocks(tc)
    g = {n: sum(k.flops for k in blk.kernels if k.gemm) for n, blk in blocks.items()}
    assert g["attn_fwd"] + g["mlp_fwd"] == pytest.approx(fwd, rel=1e-12)
    assert g["attn_bwd"] + g["mlp_bwd"] == pytest.approx(2 * fwd, rel=1e-12)
    # logits: 2 b s h V forward, 4 b s h V backward
    lf = sum(k.flops for k in tc.logits_block().kernels if k.gemm)
    lb = sum(k.flops for k in tc.logits_block(True).kernels if k.gemm)
    assert lf == pytest.approx(2 * b * s * h * m.vocab / t, rel=1e-12)
    assert lb == pytest.approx(4 * b * s * h * m.vocab / t, rel=1e-12)


def test_flash_attention_executes_the_causal_half_and_recomputes_the_scores():
    """Causal: half the score blocks run. The backward (FlashAttention-2 Algorithm 2) runs five
    matmuls (S = Q K^T again, dV, dP, dQ, dK) where its published count has four (twice the
    forward's two): it executes 5/4 of that count, of which the causal half."""
    tc, _ = _costs(GPT)
    cores = [k for k in tc.attention_block().kernels + tc.attention_block(True).kernels
             if k.fused]
    assert [k.executed for k in cores] == [0.5, 0.5 * 5 / 4]
    assert {k.fused for k in cores} == {"fwd", "bwd"}


def test_fp8_gemm_reads_one_byte_operands_and_adds_the_casts():
    """FP8 (Transformer Engine): GEMM inputs and the weights' copy in 1 byte, outputs in bf16,
    one cast kernel per activation input (read bf16, write fp8); norms stay bf16."""
    tc, m = _costs(GPT, precision="fp8")
    T, h = 2 * m.seq_len, m.hidden
    ks = {k.name: k for k in tc.attention_block().kernels}
    assert ks["qkv"].bytes == pytest.approx(T * h * 1 + h * 3 * h * 1 + T * 3 * h * 2)
    assert ks["qkv.cast"].bytes == pytest.approx(T * h * (2 + 1))
    assert ks["qkv.cast"].flops == pytest.approx(T * h)
    assert ks["norm1"].bytes == pytest.approx(2 * T * h * 2)
    kb = {k.name: k for k in tc.attention_block(True).kernels}
    n = 3 * h
    assert kb["qkv.dgrad"].bytes == pytest.approx(T * n * 1 + h * n * 1 + T * h * 2)
    assert kb["qkv.wgrad"].bytes == pytest.approx(T * h * 1 + T * n * 1 + h * n * 2)
    assert kb["qkv.grad_cast"].bytes == pytest.approx(T * n * 3)
    # casts are element-wise (vector units, not the tensor-core GEMM path); the GEMMs are
    # plain [M, K] x [K, N] products: one matrix (batch 1), M x N output tiles, reduction K
    for k in (*ks.values(), *kb.values()):
        assert k.gemm == (k.name.split(".")[0] in ("qkv", "attn_out", "attn_core")
                          and not k.name.endswith("cast")), k.name
    assert (ks["qkv"].shape, ks["qkv"].depth) == ((1.0, T, n), h)
    assert (kb["qkv.dgrad"].shape, kb["qkv.dgrad"].depth) == ((1.0, T, h), n)


@pytest.mark.parametrize("spec,t", [(GPT, 2), (LLAMA, 4), (GPT, 1)])
def test_gemm_shapes_are_the_output_tiles_of_the_flops_they_count(spec, t):
    """The wave model tiles a GEMM's output ``(batch, rows, cols)``; its work is
    ``2 batch rows cols depth`` FLOPs (the backward of a batched attention GEMM is two GEMMs
    of the forward's size). Standard attention on one rank: b (heads / t) independent
    matrices, scores [s, s] reduced over the head dim d, context [s, d] reduced over s."""
    b = 2
    tc, m = _costs(spec, t, attention="standard", b=b)
    s, d = m.seq_len, m.hidden // m.heads
    batch = b * m.heads / t
    for backward in (False, True):
        ks = {k.name: k for k in tc.attention_block(backward).kernels}
        assert (ks["attn_scores"].shape, ks["attn_scores"].depth) == ((batch, s, s), d)
        assert (ks["attn_context"].shape, ks["attn_context"].depth) == ((batch, s, d), s)
        for name in ("attn_scores", "attn_context"):
            k = ks[name]
            n_gemms = 2 if backward else 1
            assert k.flops == pytest.approx(n_gemms * 2 * np.prod(k.shape) * k.depth,
                                            rel=1e-12), (name, backward)
    for blk in (tc.attention_block(), tc.mlp_block(), tc.logits_block()):
        for k in blk.kernels:
            if k.gemm and k.shape is not None:
                assert k.flops == pytest.approx(2 * np.prod(k.shape) * k.depth, rel=1e-12), k.name


def test_fp32_training_uses_four_byte_elements():
    tc, m = _costs(GPT, precision="fp32")
    T, h = 2 * m.seq_len, m.hidden
    ks = {k.name: k for k in tc.attention_block().kernels}
    assert ks["qkv"].bytes == pytest.approx((T * h + h * 3 * h + T * 3 * h) * 4)
    assert ks["residual1"].bytes == pytest.approx(3 * T * h * 4)


def test_logits_and_loss_bytes_from_the_shapes():
    tc, m = _costs(GPT, t=2)
    T, h, V = 2 * m.seq_len, m.hidden, m.vocab
    f = {k.name: k for k in tc.logits_block().kernels}
    assert f["logits"].bytes == pytest.approx((T * h + h * V / 2 + T * V / 2) * 2)
    assert f["loss"].bytes == pytest.approx(kc("loss_fwd_bytes_per_logit") * T * V / 2)
    assert f["loss"].flops == pytest.approx(kc("loss_fwd_flops") * T * V / 2)
    bw = {k.name: k for k in tc.logits_block(True).kernels}
    assert bw["loss.bwd"].bytes == pytest.approx(kc("loss_bwd_bytes_per_logit") * T * V / 2)
    assert bw["loss.bwd"].flops == pytest.approx(kc("loss_bwd_flops") * T * V / 2)
    assert tc.logits_block(True).kernels[0].name == "loss.bwd"


def test_recompute_policies_add_the_forward_they_name():
    full, _ = _costs(GPT)
    full.recompute = "full"
    sel, _ = _costs(GPT)
    sel.recompute = "selective"
    fwd = [*full.attention_block().kernels, *full.mlp_block().kernels]
    [rb] = full.recompute_blocks()
    assert rb.kernels == tuple(fwd)
    [rs] = sel.recompute_blocks()
    assert [k.name for k in rs.kernels] == ["attn_core"]
    none, _ = _costs(GPT)
    assert none.recompute_blocks() == []


# ----------------------------------------------------------------------------- roofline
def ref_wave_eff(shape, units: int, tile: tuple[int, int]) -> float:
    """Enumerate the output tiles and issue them to the units one wave at a time."""
    batch, rows, cols = (round(x) for x in shape)
    tiles = []
    for z in range(max(batch, 1)):
        r0 = 0
        while r0 < rows:
            c0 = 0
            while c0 < cols:
                tiles.append((z, r0, c0))
                c0 += tile[1]
            r0 += tile[0]
    waves, busy, left = 0, 0, len(tiles)
    while left > 0:
        run = min(units, left)
        busy += run
        left -= run
        waves += 1
    return busy / (waves * units)


def ref_kernel(spec: DeviceSpec, k: Kernel, precision: str, math_scale: float = 1.0,
               mem_scale: float = 1.0) -> tuple[float, float]:
    """``(duration, math time at the top clock)`` of one kernel from the catalog figures."""
    if not k.gemm:
        v = spec.vector_tflops or {}
        rate = (v.get("fp32") or spec.peak_tflops["fp32"]) * 1e12
    elif k.fused:
        rate = spec.peak_tflops[precision] * 1e12 * spec.attention_efficiency[k.fused]
    else:
        rate = spec.peak_tflops[precision] * 1e12 * spec.matmul_efficiency[precision]
        if k.shape is not None and spec.compute_units:
            tiles = [tuple(spec.gemm_tile), *[tuple(x) for x in spec.gemm_tiles or []]]
            rate *= max(ref_wave_eff(k.shape, spec.compute_units, tl) for tl in tiles)
    if k.depth:
        rate /= 1 + spec.gemm_k_half / k.depth
    t_math = k.flops * k.executed / rate
    t_mem = k.bytes / (spec.hbm_bandwidth_gbps * 1e9 * spec.memory_efficiency) * mem_scale
    return max(t_math * math_scale, t_mem) + spec.kernel_overhead_us * 1e-6, t_math


def test_wave_efficiency_examples_by_hand():
    """132 SMs, 128x128 tiles: 4096x4096 has 1024 tiles = 7 full waves + 100 -> 1024/1056;
    a 128x128 output is one tile in one wave of 132 -> 1/132."""
    assert ref_wave_eff((1, 4096, 4096), 132, (128, 128)) == pytest.approx(1024 / 1056)
    assert ref_wave_eff((1, 128, 128), 132, (128, 128)) == pytest.approx(1 / 132)
    assert ref_wave_eff((1, 129, 128), 132, (128, 128)) == pytest.approx(2 / 132)
    assert ref_wave_eff((3, 128, 44 * 128), 132, (128, 128)) == 1.0


@pytest.mark.parametrize("dev,k_half", [("h100-sxm", None), ("a100-sxm-80gb", None),
                                        ("h100-sxm", 0.5), ("h100-sxm", 0.0)])
def test_random_gemm_times_match_the_wave_by_wave_reference(dev, k_half):
    spec = device(dev) if k_half is None else device(dev, gemm_k_half=k_half)
    cm = ComputeModel(spec, "bf16", spec.hbm_pj_per_bit)
    rng = np.random.default_rng(15)
    ks = []
    for _ in range(60):
        m_, n_, k_ = (int(x) for x in rng.integers(1, 6000, 3))
        batch = int(rng.integers(1, 5))
        ks.append(Kernel("g", 2.0 * batch * m_ * n_ * k_, 2.0 * batch * (m_ * k_ + k_ * n_
                  + m_ * n_), True, (float(batch), float(m_), float(n_)), depth=k_))
    blk = Block("g", tuple(ks))
    got = cm.kernel_times(blk)
    ref = [ref_kernel(spec, k, "bf16")[0] for k in ks]
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    # wave quantization matters on these shapes (the test would not notice it switched off)
    flat = [k.flops / (spec.peak_tflops["bf16"] * 1e12 * spec.matmul_efficiency["bf16"]
                       / (1 + spec.gemm_k_half / k.depth)) for k in ks]
    assert max(np.asarray(ref) / (np.asarray(flat) + spec.kernel_overhead_us * 1e-6)) > 1.3


@pytest.mark.parametrize("dev,attention,prec", [("h100-sxm", "flash", "bf16"),
                                                ("h100-sxm", "standard", "bf16"),
                                                ("a100-sxm-80gb", "standard", "bf16"),
                                                ("h100-sxm", "flash", "fp8")])
@pytest.mark.parametrize("scale", [(1.0, 1.0), (1980 / 1080, 1.0), (1.0, 1.7)])
def test_layer_block_costs_match_the_reference(dev, attention, prec, scale):
    """Every kernel of a layer (GEMMs, fused attention, element-wise): durations, math time,
    dynamic and HBM energy of the block against the per-kernel reference."""
    spec = device(dev)
    if not spec.supports(prec):
        pytest.skip(f"{dev} has no {prec}")
    cm = ComputeModel(spec, prec, spec.hbm_pj_per_bit)
    tc, _ = _costs(LLAMA if attention == "flash" else GPT, t=2, attention=attention,
                   precision=prec)
    ms, mm = scale
    vf = spec.vector_power_fraction
    for blk in [*_blocks(tc).values(), tc.logits_block(), tc.logits_block(True)]:
        ref = [ref_kernel(spec, k, prec, ms, mm) for k in blk.kernels]
        if scale == (1.0, 1.0):
            np.testing.assert_allclose(cm.kernel_times(blk), [r[0] for r in ref], rtol=1e-12)
        c = cm.block_cost(blk, ms, mm)
        assert c.duration_s == pytest.approx(sum(r[0] for r in ref), rel=1e-12)
        assert c.math_s == pytest.approx(sum(r[1] for r in ref), rel=1e-12)
        assert c.gemm_flops == pytest.approx(sum(k.flops for k in blk.kernels if k.gemm),
                                             rel=1e-12)
        weighted = sum(r[1] * (1.0 if k.gemm else vf)
                       for r, k in zip(ref, blk.kernels, strict=True))
        assert c.compute_j == pytest.approx(weighted * cm.power.dyn_max_w, rel=1e-12)
        hbm_j = sum(k.bytes for k in blk.kernels) * 8 * spec.hbm_pj_per_bit * 1e-12
        assert c.memory_j == pytest.approx(hbm_j, rel=1e-12)
        assert c.static_j == pytest.approx(c.duration_s * spec.idle_w, rel=1e-12)


@pytest.mark.parametrize("dev,expect", [("h100-sxm", "fp8"), ("a100-sxm-80gb", "bf16")])
def test_a_kernel_of_its_own_precision_runs_at_that_peak_if_the_device_has_it(dev, expect):
    spec = device(dev, kernel_overhead_us=0.0, gemm_k_half=0.0)
    cm = ComputeModel(spec, "bf16", spec.hbm_pj_per_bit)
    k = Kernel("g", 1e12, 1.0, True, precision="fp8")
    rate = spec.peak_tflops[expect] * 1e12 * spec.matmul_efficiency[expect]
    assert cm.kernel_times(Block("g", (k,)))[0] == pytest.approx(1e12 / rate, rel=1e-12)


def test_element_wise_kernels_run_at_the_vector_peak_not_the_gemm_peak():
    spec = device("h100-sxm", kernel_overhead_us=0.0)
    cm = ComputeModel(spec, "bf16", spec.hbm_pj_per_bit)
    k = Kernel("ew", 1e12, 1.0, False)
    assert cm.kernel_times(Block("e", (k,)))[0] == pytest.approx(1e12 / 67e12, rel=1e-12)


def test_memory_bound_kernel_time_is_bytes_over_achievable_bandwidth():
    spec = device("h100-sxm")
    cm = ComputeModel(spec, "bf16", spec.hbm_pj_per_bit)
    k = Kernel("copy", 1.0, 3.0e9, False)
    t = spec.hbm_bandwidth_gbps * 1e9 * spec.memory_efficiency
    assert cm.kernel_times(Block("c", (k,)))[0] == pytest.approx(
        3.0e9 / t + spec.kernel_overhead_us * 1e-6, rel=1e-12)
    assert math.isclose(cm.block_cost(Block("c", (k,)), 1.0, 2.0).duration_s,
                        2 * 3.0e9 / t + spec.kernel_overhead_us * 1e-6, rel_tol=1e-12)


# ----------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("spec,tied", [(GPT, True), (GPT, False), (LLAMA, False)])
def test_parameter_counts_from_the_weight_shapes(spec, tied):
    m = ModelSpec(**{**spec, "tied_embeddings": tied})
    tc = TransformerCosts(m, "bf16", 1, m.seq_len)
    h, V, s, L = m.hidden, m.vocab, m.seq_len, m.layers
    if m.arch == "gpt":
        f = 4 * h
        attn = (h * 3 * h + 3 * h) + (h * h + h)          # QKV and out, with biases
        mlp = (h * f + f) + (f * h + h)                   # up and down, with biases
        norms = 2 * 2 * h                                 # two LayerNorms: gain and bias
        emb = V * h + s * h                               # tokens + learned positions
        final = 2 * h
    else:
        f, kv = m.ffn_hidden, m.kv_heads * (h // m.heads)
        attn = h * h + 2 * h * kv + h * h                 # q, k, v, o (no biases)
        mlp = 3 * h * f                                   # gate, up, down
        norms = 2 * h                                     # two RMSNorm gains
        emb = V * h
        final = h
    layer = attn + mlp + norms
    assert tc.layer_params() == layer
    assert tc.embedding_params() == emb
    assert tc.output_params() == final + (0 if tied else V * h)
    assert tc.total_params() == L * layer + emb + final + (0 if tied else V * h)


@pytest.mark.parametrize("spec", [GPT, LLAMA])
def test_model_flops_per_microbatch_is_three_forwards_of_the_gemms(spec):
    """Model FLOPs: forward + backward (2x) of every GEMM of the layers and the logits."""
    m = ModelSpec(**spec)
    b = 2
    tc = TransformerCosts(m, "bf16", b, m.seq_len)
    s, h, V = m.seq_len, m.hidden, m.vocab
    f = m.ffn_hidden or 4 * h
    kv = (m.kv_heads or m.heads) * (h // m.heads)
    up = 2 * f if m.arch == "llama" else f
    layer = 2 * b * s * (h * (h + 2 * kv) + h * h + h * up + f * h) + 4 * b * s * s * h
    ref = 3 * (m.layers * layer + 2 * b * s * h * V)
    assert tc.model_flops_per_microbatch() == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_closed_form_flops_equal_the_summed_kernel_count(recompute):
    """Narayanan et al.'s closed forms against the per-layer count of this file: B sequences,
    forward 24 b s h^2 + 4 b s^2 h per layer and 2 b s h V for the logits, backward twice the
    forward, full recompute one more forward of the layers (not of the logits)."""
    from workloads.transformer import closed_form_flops

    m = ModelSpec(**GPT)
    B, s, h, L, V = 8, m.seq_len, m.hidden, m.layers, m.vocab
    layer_fwd = 24 * B * s * h * h + 4 * B * s * s * h
    passes = 4 if recompute == "full" else 3
    ref = passes * L * layer_fwd + 3 * 2 * B * s * h * V
    assert closed_form_flops(m, B, s, recompute) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_gpt_embedding_reads_token_and_position_rows_and_writes_the_sum(sp):
    tc, m = _costs(GPT, t=2, sp=sp)
    T, h = 2 * m.seq_len, m.hidden
    for bwd in (False, True):
        [k] = tc.embedding_block(bwd).kernels
        assert k.flops == pytest.approx(T * h)
        assert k.bytes == pytest.approx(3 * T * h * 2 / (2 if sp else 1))
        assert not k.gemm


@pytest.mark.parametrize("sp", [False, True])
def test_llama_embedding_reads_one_token_row_and_writes_it(sp):
    """Llama has no position table (rotary is applied in attention): per token one row read and
    one written forward; the gradient row read and one written backward (2 rows, not 3)."""
    tc, m = _costs(LLAMA, t=2, sp=sp)
    T, h = 2 * m.seq_len, m.hidden
    for bwd in (False, True):
        [k] = tc.embedding_block(bwd).kernels
        assert k.bytes == pytest.approx(2 * T * h * 2 / (2 if sp else 1), rel=1e-12)


def test_defaults_are_no_sequence_parallelism_no_recompute_flash():
    m = ModelSpec(**GPT)
    tc = TransformerCosts(m, "bf16", 2, m.seq_len, tp=2)
    ref = ref_layer("gpt", 2, m.seq_len, m.hidden, m.heads, m.heads, 4 * m.hidden, 2, False,
                    "flash")
    got = {k.name: (k.flops, k.bytes) for k in tc.attention_block().kernels}
    assert set(got) == set(ref["attn_fwd"])
    for k, v in ref["attn_fwd"].items():
        assert got[k] == pytest.approx(v, rel=1e-12), k
    assert tc.recompute_blocks() == []


DEVCAT = Path(__file__).resolve().parents[1] / "devices" / "catalog" / "devices"


@pytest.mark.parametrize("dev,impl", [("a100-sxm-80gb", "triton"), ("a100-sxm-80gb", "flash1"),
                                      ("a100-sxm-80gb", "flash2"), ("h100-sxm", "flash2")])
def test_named_fused_attention_runs_at_its_catalog_fraction_of_the_peak(dev, impl):
    """A named fused implementation (``workload.attention: triton`` ...) executes the causal
    half of its matmuls (two forward; five backward, FlashAttention-2 Algorithm 2, which
    recomputes the scores) at the fraction of the bf16 peak its catalog entry gives, read from
    the YAML file; the other kernels do not change."""
    raw = yaml.safe_load((DEVCAT / f"{dev}.yaml").read_text())
    frac = raw["attention_kernels"]["value"][impl]
    peak = float(raw["peak_tflops"]["value"]["bf16"]) * 1e12
    spec = device(dev, kernel_overhead_us=0.0)
    cm = ComputeModel(spec, "bf16", spec.hbm_pj_per_bit)
    tc, m = _costs(GPT, t=2, attention=impl)
    base, _ = _costs(GPT, t=2, attention="flash")
    b, s, d, heads = 2, m.seq_len, m.hidden // m.heads, m.heads / 2
    for backward, key in ((False, "fwd"), (True, "bwd")):
        blk, ref_blk = tc.attention_block(backward), base.attention_block(backward)
        core = [i for i, k in enumerate(blk.kernels) if k.fused]
        assert len(core) == 1
        matmuls = 5 if backward else 2                  # each 2 s^2 d FLOPs per head
        flops = 2.0 * b * heads * s * s * d * matmuls
        t_math = 0.5 * flops / (peak * frac[key])       # causal half
        t_mem = blk.kernels[core[0]].bytes / (spec.hbm_bandwidth_gbps * 1e9
                                              * spec.memory_efficiency)
        times, ref_times = cm.kernel_times(blk), cm.kernel_times(ref_blk)
        assert times[core[0]] == pytest.approx(max(t_math, t_mem), rel=1e-12)
        others = [i for i in range(len(times)) if i != core[0]]
        np.testing.assert_allclose(times[others], ref_times[others], rtol=1e-12)


def test_an_attention_kernel_the_device_does_not_list_is_a_clear_error(tmp_path):
    """``workload.attention: triton`` on a device without a triton entry: exit 2 naming the
    field, the value and the names the device has."""
    import subprocess
    import sys

    scen = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
    raw = yaml.safe_load(scen.read_text())
    raw["cluster"]["device"] = "h100-sxm"
    raw["workload"]["attention"] = "triton"
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(raw))
    r = subprocess.run([sys.executable, "-m", "twin.cli", "check", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    err = r.stdout + r.stderr
    assert "workload.attention" in err and "triton" in err and "flash3" in err
    assert "Traceback" not in err
