"""FLOPs and bytes of a decoder-only transformer, per kernel, per rank.

Counts follow Narayanan et al. (SC'21) and Korthikanti et al. (2022): a GEMM ``[m, k] x [k, n]``
costs ``2 m k n`` FLOPs; the backward pass of a GEMM costs twice its forward (input gradient +
weight gradient); attention scores and context cost ``2 b s^2 h`` each (no causal discount, as
in the published formulas). Bytes are the ideal HBM traffic of each kernel: every operand read
once and the result written once (``(mk + kn + mn) * bytes_per_element`` for a GEMM);
element-wise kernels (norms, activations, residual adds, softmax statistics) are listed
separately since they are memory-bound.

With tensor parallelism ``t`` the weight matrices are split Megatron-style (QKV and MLP-up by
columns, attention-out and MLP-down by rows), so each rank does ``1/t`` of every GEMM; without
sequence parallelism the element-wise kernels are replicated on every rank, with it they are
split ``1/t`` as well.

Attention comes in two kinds. Fused (``flash``, FlashAttention-style, or a named fused
implementation of the device catalog such as ``flash1`` / ``flash2`` / ``triton``, which differ
only in their achieved fraction of the peak): Q, K and V are read and O written once, the
``s x s`` scores never reach HBM. ``standard`` (Megatron-LM before
fused attention): the scores are written, the fused scale-mask-softmax reads and writes them,
dropout reads them and writes the dropped probabilities plus a one-byte mask, and the second
batched GEMM reads them again; the backward pass does the reverse with twice the GEMM work.

Closed forms (GPT, tied embeddings, per iteration, B sequences):

* no recompute: ``F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))``
* full recompute: ``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` (Narayanan et al.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

from devices.spec import BYTES_PER_ELEMENT
from workloads.spec import ModelSpec

Recompute = Literal["none", "selective", "full"]


@cache
def kernel_constants() -> dict[str, float]:
    """FLOPs per element and bytes of the element-wise kernels
    (``workloads/catalog/kernels/transformer.yaml``, each value with its source)."""
    from pathlib import Path

    import workloads
    from twin.kernel.catalog import Catalog

    cat = Catalog("kernels", Path(workloads.__file__).parent / "catalog" / "kernels")
    return dict(cat.get("transformer", "kernels").values)


@dataclass(frozen=True)
class Kernel:
    """One kernel on one rank: ``flops`` (FLOP) and ideal HBM ``bytes`` moved.

    GEMMs carry their output shape ``(batch, rows, cols)`` so the device model can count the
    output tiles its compute units process in waves (``None`` when not a plain GEMM).
    ``precision`` is the precision of the math (GEMM inputs; ``None``: the run's), ``fused``
    marks a fused attention kernel (``"fwd"`` / ``"bwd"``) that runs at the device's attention
    efficiency of implementation ``impl`` (``flash``: the device's best), and ``executed`` is
    the fraction of ``flops`` the kernel really executes (a causal FlashAttention kernel skips
    the masked half of the score blocks, and its backward recomputes the scores: 5/4 of the
    published backward count; ``flops`` stays the published count that MFU uses).
    """

    name: str
    flops: float
    bytes: float
    gemm: bool
    shape: tuple[float, float, float] | None = None
    precision: str | None = None
    fused: str | None = None
    impl: str = "flash"  # fused attention implementation (device catalog name), if fused
    executed: float = 1.0
    depth: float | None = None  # GEMM reduction length k (None: not a plain GEMM / unknown)


@dataclass(frozen=True)
class Block:
    """A sequence of kernels executed back to back on one rank (one SimPy compute op)."""

    name: str
    kernels: tuple[Kernel, ...]

    @property
    def flops(self) -> float:
        """Total FLOPs of the block."""
        return sum(k.flops for k in self.kernels)

    @property
    def bytes(self) -> float:
        """Total ideal HBM bytes of the block."""
        return sum(k.bytes for k in self.kernels)


def grad_bytes_per_element(precision: str) -> float:
    """Gradient storage: fp32 for fp32/tf32 training, 16-bit otherwise (fp8 GEMMs keep bf16
    gradients, as Transformer Engine does)."""
    return 4.0 if precision in ("fp32", "tf32") else 2.0


def weight_bytes_per_element(precision: str) -> float:
    """Stored weight copy used by the GEMMs (fp8 weights are cast on the fly from bf16)."""
    return 4.0 if precision in ("fp32", "tf32") else 2.0


def activation_bytes_per_element(precision: str) -> float:
    """Activations, the residual stream, TP collectives and pipeline sends: fp32 in fp32/tf32
    training, else 16-bit. FP8 training runs only the GEMM inputs in fp8 (NVIDIA Transformer
    Engine: LayerNorm, activations, residual adds and communication stay bf16)."""
    return 4.0 if precision in ("fp32", "tf32") else 2.0


def gemm_input_bytes_per_element(precision: str) -> float:
    """Operands a GEMM reads (its inputs: activations / gradients cast to ``precision``)."""
    return BYTES_PER_ELEMENT[precision]


class TransformerCosts:
    """Per-rank kernel costs of one model under one parallel layout.

    Args:
        model: the model.
        precision: compute precision of the GEMMs.
        micro_batch: sequences per microbatch ``b``.
        seq: sequence length ``s`` in tokens.
        tp: tensor-parallel degree ``t``.
        sequence_parallel: split element-wise work along the sequence across the TP group.
        recompute: activation recomputation policy.
    """

    def __init__(self, model: ModelSpec, precision: str, micro_batch: int, seq: int,
                 tp: int = 1, sequence_parallel: bool = False, recompute: Recompute = "none",
                 attention: str = "flash"):
        self.m = model
        self.precision = precision
        self.b = micro_batch
        self.s = seq
        self.t = tp
        self.sp = sequence_parallel
        self.recompute = recompute
        self.attention = attention
        self.e = activation_bytes_per_element(precision)  # activation element, bytes
        self.we = weight_bytes_per_element(precision)      # weight element, bytes
        self.ge_in = gemm_input_bytes_per_element(precision)  # GEMM operand element, bytes
        self.k = kernel_constants()

    # ------------------------------------------------------------------ parameters
    def layer_params(self) -> int:
        """Parameters of one transformer block (whole model, not per rank)."""
        m = self.m
        h, f, d = m.hidden, m.ffn, m.head_dim
        if m.arch == "gpt":
            return 4 * h * h + 2 * h * f + 9 * h + f  # QKV+out (+biases), MLP (+biases), 2 LN
        kv = m.n_kv_heads * d
        return 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # q,o + k,v + SwiGLU + 2 RMSNorm

    def embedding_params(self) -> int:
        """Input embedding (+ learned positions for GPT)."""
        pos = self.s * self.m.hidden if self.m.arch == "gpt" else 0
        return self.m.vocab * self.m.hidden + pos

    def output_params(self) -> int:
        """Output layer parameters not shared with the embedding (+ final norm)."""
        norm = 2 * self.m.hidden if self.m.arch == "gpt" else self.m.hidden
        head = 0 if self.m.tied_embeddings else self.m.vocab * self.m.hidden
        return head + norm

    def last_stage_head_params(self, pp: int) -> int:
        """Output-layer parameters the last of ``pp`` pipeline stages holds: with tied
        embeddings split over stages it keeps its own copy of the shared matrix (as
        Megatron-LM lays it out), else :meth:`output_params`."""
        tied_copy = self.m.vocab * self.m.hidden if self.m.tied_embeddings and pp > 1 else 0
        return self.output_params() + tied_copy

    def total_params(self) -> int:
        """Parameters of the whole model."""
        return self.m.layers * self.layer_params() + self.embedding_params() + self.output_params()

    # ------------------------------------------------------------------ kernels
    def _gemm(self, name: str, m: float, k: float, n: float, backward: bool) -> list[Kernel]:
        """GEMM [m,k]x[k,n] (weights [k,n]); backward = dgrad + wgrad.

        Inputs are read at the GEMM precision, outputs written at the activation precision
        (bf16 for fp8 GEMMs). FP8 adds the casts Transformer Engine runs: the activation (or
        incoming gradient) read in bf16 and written in fp8 once per GEMM input; the weights'
        fp8 copy is read in place of the 16-bit one.
        """
        e, gi = self.e, self.ge_in
        wi = gi if self.precision == "fp8" else self.we
        casts: list[Kernel] = []
        fwd = Kernel(name, 2.0 * m * k * n, (m * k) * gi + (k * n) * wi + (m * n) * e, True,
                     (1.0, m, n), depth=k)
        if not backward:
            if self.precision == "fp8":
                casts.append(Kernel(f"{name}.cast", m * k, m * k * (e + gi), False))
            return [*casts, fwd]
        ge = grad_bytes_per_element(self.precision)
        dgrad = Kernel(f"{name}.dgrad", 2.0 * m * k * n, (m * n) * gi + (k * n) * wi + (m * k) * e,
                       True, (1.0, m, k), depth=n)
        wgrad = Kernel(f"{name}.wgrad", 2.0 * m * k * n, (m * k) * gi + (m * n) * gi + (k * n) * ge,
                       True, (1.0, k, n), depth=m)
        if self.precision == "fp8":
            casts.append(Kernel(f"{name}.grad_cast", m * n, m * n * (e + gi), False))
        return [*casts, dgrad, wgrad]

    def _elementwise(self, name: str, elements: float, reads: float, writes: float,
                     flops_per_element: float = 1.0) -> Kernel:
        ew = elements / (self.t if self.sp else 1)
        return Kernel(name, flops_per_element * ew, (reads + writes) * ew * self.e, False)

    def _norm(self, name: str, tokens: float, backward: bool) -> Kernel:
        """LayerNorm (GPT) or RMSNorm (Llama) over ``tokens x h``: forward reads x and writes
        y; backward reads x and dy and writes dx (about twice the forward's math)."""
        f = self.k["rmsnorm_flops" if self.m.arch == "llama" else "layernorm_flops"]
        h = self.m.hidden
        if backward:
            return self._elementwise(f"{name}.bwd", tokens * h, 2, 1, 2 * f)
        return self._elementwise(name, tokens * h, 1, 1, f)

    def _activation(self, tokens: float, backward: bool) -> Kernel:
        """GELU (reads the MLP-up output, writes its activation) or SwiGLU (reads gate and up,
        writes one); backward reads the saved input(s) and the incoming gradient and writes
        the input gradient(s). The activation is TP-split in any case."""
        gated = self.m.gated_mlp
        f = self.k["swiglu_flops" if gated else "gelu_flops"]
        elems = tokens * self.m.ffn / self.t * (self.t if self.sp else 1)
        ins = 2 if gated else 1
        if backward:
            return self._elementwise("act.bwd", elems, ins + 1, ins, 2 * f)
        return self._elementwise("act", elems, ins, 1, f)

    def attention_block(self, backward: bool = False) -> Block:
        """Norm, QKV projection, attention core, output projection, residual add."""
        m, b, s, t = self.m, self.b, self.s, self.t
        h, d = m.hidden, m.head_dim
        heads_r = m.heads / t
        kv_r = m.n_kv_heads / t
        tokens = b * s
        ks: list[Kernel] = [self._norm("norm1", tokens, backward)]
        ks += self._gemm("qkv", tokens, h, (heads_r + 2 * kv_r) * d, backward)
        if m.arch == "llama":  # rotary embedding of q and k (TP-split heads)
            rot = tokens * (heads_r + kv_r) * d
            ks.append(Kernel("rotary.bwd" if backward else "rotary", self.k["rotary_flops"] * rot,
                             2 * rot * self.e, False))
        ks += self.attention_core(backward)
        ks += self._gemm("attn_out", tokens, heads_r * d, h, backward)
        ks.append(self._elementwise("residual1", tokens * h, 2, 1, self.k["residual_flops"]))
        if backward:
            ks.reverse()  # backward runs the layer's kernels in reverse order
        return Block("attn_bwd" if backward else "attn_fwd", tuple(ks))

    def attention_core(self, backward: bool = False) -> list[Kernel]:
        """Scores, softmax, dropout and context of one rank's heads (see module docstring)."""
        m, b, s, t, e = self.m, self.b, self.s, self.t, self.e
        d = m.head_dim
        heads_r = m.heads / t
        kv_r = m.n_kv_heads / t
        tokens = b * s
        k = 2.0 if backward else 1.0
        gemm_flops = 2.0 * b * heads_r * s * s * d * k   # one of the two batched GEMMs
        if self.attention != "standard":  # a fused kernel: flash or a named implementation
            # forward reads Q, K, V and writes O; backward reads Q, K, V, O, dO and writes
            # dQ, dK, dV (FlashAttention-2 Algorithm 2); causal: half the score blocks run.
            # The backward executes flash_bwd_matmuls (5: it recomputes S) where the
            # published count has 4, twice the forward's 2.
            run = 0.5 * (self.k["flash_bwd_matmuls"] / 4.0 if backward else 1.0)
            core_bytes = ((2 * heads_r + 2 * kv_r) * tokens * d * e if not backward
                          else (3 * heads_r + 2 * kv_r) * tokens * d * e
                          + (heads_r + 2 * kv_r) * tokens * d * e)
            return [Kernel("attn_core.bwd" if backward else "attn_core", 2 * gemm_flops,
                           core_bytes, True, fused="bwd" if backward else "fwd",
                           impl=self.attention, executed=run)]
        scores = b * heads_r * s * s                       # elements of the score matrix
        qk_bytes = (heads_r + kv_r) * tokens * d * e + scores * e
        pv_bytes = scores * e + (kv_r + heads_r) * tokens * d * e
        # softmax: forward reads x, writes y (2 S e); backward dx = y (dy - sum(dy y)) reads y
        # and dy and writes dx (3 S e). Dropout: forward reads x, writes y and a 1-byte mask;
        # backward dx = dy mask / (1 - p) reads dy and the mask, writes dx: S (2e + 1) both ways.
        softmax = Kernel("softmax", self.k["softmax_flops"] * scores * k,
                         (3 if backward else 2) * scores * e, False)
        dropout = Kernel("dropout", self.k["dropout_flops"] * scores * k,
                         scores * (2 * e + 1), False)
        batch = b * heads_r
        return [Kernel("attn_scores", gemm_flops, qk_bytes * k, True, (batch, s, s), depth=d),
                softmax, dropout,
                Kernel("attn_context", gemm_flops, pv_bytes * k, True, (batch, s, d), depth=s)]

    def mlp_block(self, backward: bool = False) -> Block:
        """Norm, MLP up (+gate), activation, MLP down, residual add."""
        m, b, s, t = self.m, self.b, self.s, self.t
        h, f = m.hidden, m.ffn
        tokens = b * s
        ks: list[Kernel] = [self._norm("norm2", tokens, backward)]
        up = 2 * f / t if m.gated_mlp else f / t
        ks += self._gemm("mlp_up", tokens, h, up, backward)
        ks.append(self._activation(tokens, backward))
        ks += self._gemm("mlp_down", tokens, f / t, h, backward)
        ks.append(self._elementwise("residual2", tokens * h, 2, 1, self.k["residual_flops"]))
        if backward:
            ks.reverse()
        return Block("mlp_bwd" if backward else "mlp_fwd", tuple(ks))

    def embedding_block(self, backward: bool = False) -> Block:
        """Token (+ position) embedding lookup: memory-bound gather / scatter-add.

        Forward: one row per token read from each table (token; GPT also a learned position
        table) and the sum written: 3 rows per token for GPT, 2 for Llama (no position table,
        rotary is applied in attention). Backward: the output gradient read and one gradient
        row written per table (the same 3 / 2)."""
        tokens = self.b * self.s
        h = self.m.hidden
        name = "embed_bwd" if backward else "embed_fwd"
        rows = 3 if self.m.arch == "gpt" else 2
        k = Kernel(name, tokens * h, rows * tokens * h * self.e / (self.t if self.sp else 1),
                   False)
        return Block(name, (k,))

    def logits_block(self, backward: bool = False) -> Block:
        """Final norm, output projection to the vocabulary (split over TP) and the loss."""
        tokens = self.b * self.s
        h, v = self.m.hidden, self.m.vocab
        ks: list[Kernel] = [self._norm("final_norm", tokens, backward)]
        ks += self._gemm("logits", tokens, h, v / self.t, backward)
        logits = tokens * v / self.t
        kc = self.k
        if backward:
            ks.append(Kernel("loss.bwd", kc["loss_bwd_flops"] * logits,
                             kc["loss_bwd_bytes_per_logit"] * logits, False))
            ks.reverse()
        else:
            ks.append(Kernel("loss", kc["loss_fwd_flops"] * logits,
                             kc["loss_fwd_bytes_per_logit"] * logits, False))
        return Block("logits_bwd" if backward else "logits_fwd", tuple(ks))

    def recompute_blocks(self) -> list[Block]:
        """Extra forward work done before a layer's backward, by recompute policy."""
        if self.recompute == "full":
            return [Block("recompute", self.attention_block().kernels + self.mlp_block().kernels)]
        if self.recompute == "selective":
            return [Block("recompute", tuple(self.attention_core()))]
        return []

    # ------------------------------------------------------------------ closed forms
    def model_flops_per_microbatch(self) -> float:
        """Model FLOPs (no recompute) of one microbatch over all layers, whole model."""
        m, b, s = self.m, self.b, self.s
        h, f, d = m.hidden, m.ffn, m.head_dim
        kv = m.n_kv_heads * d
        up = 2 * f if m.gated_mlp else f
        per_token = 2 * (h * (h + 2 * kv) + h * h + h * up + f * h)  # GEMM weights
        layer_fwd = b * s * per_token + 4.0 * b * s * s * h
        logits_fwd = 2.0 * b * s * h * m.vocab
        return 3.0 * (m.layers * layer_fwd + logits_fwd)


def closed_form_flops(model: ModelSpec, global_batch: int, seq: int,
                      recompute: Recompute = "none") -> float:
    """Published closed form for GPT models (Narayanan et al. SC'21), FLOPs per iteration.

    ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` without recompute (the logit term is 6BshV:
    forward 2BshV plus backward 4BshV) and ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` with full
    recompute (the layers' forward is done twice, the logits are not recomputed).
    """
    B, s, L, h, V = global_batch, seq, model.layers, model.hidden, model.vocab
    if recompute == "full":
        return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
