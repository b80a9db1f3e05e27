"""Typed transformer model spec (catalog ``workloads/catalog/models`` or inline)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from twin.kernel.schema import StrictModel


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
