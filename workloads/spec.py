"""Typed workload specs: the transformer model (catalog ``workloads/catalog/models`` or inline),
the parallel degrees and the ``workload`` section of a scenario."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from devices.spec import Precision
from twin.kernel.schema import PositiveFloat, StrictModel


class ModelSpec(StrictModel):
    """A decoder-only transformer.

    ``arch: gpt`` is GPT-style (LayerNorm, GELU MLP of width ``ffn_hidden``, learned positions,
    multi-head attention); ``arch: llama`` is Llama-style (RMSNorm, SwiGLU MLP, rotary
    positions, grouped-query attention with ``kv_heads`` key/value heads).
    """

    name: str
    description: str = ""
    arch: Literal["gpt", "llama"] = "gpt"
    layers: int = Field(gt=0, description="transformer blocks")
    hidden: int = Field(gt=0, description="model width h")
    heads: int = Field(gt=0, description="attention heads")
    kv_heads: int | None = Field(default=None, gt=0, description="key/value heads (GQA)")
    ffn_hidden: int | None = Field(default=None, gt=0, description="MLP width (default 4h)")
    vocab: int = Field(gt=0, description="vocabulary size V")
    seq_len: int = Field(gt=0, description="training sequence length s, tokens")
    tied_embeddings: bool = False

    @model_validator(mode="after")
    def _shapes(self) -> ModelSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")
        return self

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads (``heads`` for plain multi-head attention)."""
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    @property
    def ffn(self) -> int:
        """MLP inner width."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP is gated (SwiGLU: three weight matrices)."""
        return self.arch == "llama"


class ParallelismSpec(StrictModel):
    """Hybrid-parallel degrees; dp * tp * pp must equal the number of devices."""

    dp: int = Field(default=1, ge=1, description="data-parallel replicas")
    tp: int = Field(default=1, ge=1, description="tensor-parallel ranks per layer")
    pp: int = Field(default=1, ge=1, description="pipeline stages")

    @property
    def world(self) -> int:
        """Ranks in the job."""
        return self.dp * self.tp * self.pp


#: Sharded data parallelism (``workload.sharding.strategy``); see ``workloads.sharding``.
ShardStrategy = Literal["none", "zero1", "zero2", "zero3", "full_shard", "shard_grad_op",
                        "hybrid_shard"]


class ShardingSpec(StrictModel):
    """How model states are split over the data-parallel ranks (ZeRO / PyTorch FSDP).

    ``none``: plain data parallelism (DDP, every rank holds everything); ``zero1``: optimizer
    states sharded; ``zero2``: + gradients; ``zero3`` / ``full_shard``: + parameters (gathered
    per layer in forward and again in backward); ``shard_grad_op``: gradients and optimizer
    states sharded, parameters gathered per layer once per iteration and kept until its end;
    ``hybrid_shard``: ``full_shard`` inside groups of ``group`` data-parallel ranks, gradient
    shards all-reduced across the groups.
    """

    strategy: ShardStrategy = "none"
    group: int | None = Field(default=None, ge=1,
                              description="hybrid_shard: data-parallel ranks per shard group")
    prefetch: bool = Field(default=True,
                           description="issue the next layer's all-gather while the current "
                                       "layer computes (FSDP forward/backward prefetch)")


class WorkloadSpec(StrictModel):
    """What is trained and how."""

    model: ModelSpec
    precision: Precision = "bf16"
    seq_len: int | None = Field(default=None, gt=0, description="tokens; default: model's")
    global_batch: int = Field(gt=0, description="sequences per iteration")
    micro_batch: int = Field(default=1, gt=0, description="sequences per microbatch")
    parallelism: ParallelismSpec = ParallelismSpec()
    iterations: int = Field(default=1, gt=0, description="training iterations to simulate")
    schedule: Literal["gpipe", "1f1b", "interleaved"] = Field(
        default="1f1b", description="pipeline schedule")
    virtual_stages: int = Field(default=1, ge=1,
                                description="model chunks per stage (interleaved schedule)")
    recompute: Literal["none", "selective", "full"] = "none"
    attention: str = Field(
        default="flash", pattern=r"^[a-z][a-z0-9_]{0,31}$",
        description="flash: the device's best fused kernel, scores stay on chip; a name of "
                    "the device's `attention_kernels` (e.g. flash1, flash2, triton): that fused "
                    "implementation; standard: scores, softmax and dropout go through HBM "
                    "(Megatron-LM 2022)")
    sequence_parallel: bool = Field(
        default=False, description="split norms/dropout along the sequence across TP ranks "
                                   "(TP collectives become reduce-scatter + all-gather)")
    placement: Literal["snake", "row-major", "spread", "lattice"] = Field(
        default="snake", description="rank -> device policy (topologies.placement)")
    grad_bucket_mb: PositiveFloat = Field(
        default=25.0, description="gradient all-reduce bucket, MB (PyTorch DDP default 25)")
    activation_memory: Literal["korthikanti", "tensors"] = Field(
        default="tensors", description="tensors: the tensors each layer keeps, by architecture "
                                       "(workloads.memory; Korthikanti et al.'s numbers for "
                                       "GPT); korthikanti: the paper's GPT closed forms for "
                                       "every model")
    sharding: ShardingSpec = ShardingSpec()
    stage_layers: list[int] | Literal["auto"] | None = Field(
        default=None, description="transformer layers per pipeline stage (pp entries) or per "
                                  "virtual stage (pp*virtual_stages entries, model order), or "
                                  "auto (balanced by compute time); default: an even split")

    @field_validator("stage_layers", mode="before")
    @classmethod
    def _stage_layers(cls, value: object) -> object:
        if value is None or value == "auto":
            return value
        if isinstance(value, list | tuple) and all(
                isinstance(n, int) and not isinstance(n, bool) for n in value):
            return list(value)
        raise ValueError(f"must be a list of layer counts (integers) or auto, got {value!r}")

    @property
    def seq(self) -> int:
        """Sequence length in tokens."""
        return self.seq_len or self.model.seq_len
