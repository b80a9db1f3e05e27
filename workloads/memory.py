"""Memory per device: weights, gradients, optimizer state and activations, per pipeline stage.

Activation sizes follow Korthikanti et al. 2022 (sec. 4, Table 2) with flash attention, so the
``5 a s / h`` term for stored attention scores is absent: per layer and microbatch a rank keeps
``s b h (10 + 24/t)`` 16-bit values with tensor parallelism alone, ``34 s b h / t`` with
sequence parallelism, and ``2 s b h`` (the layer input; ``/t`` with SP) under full recompute.
With ``standard`` attention and no recompute the score matrices are stored too:
``5 a s / h`` more per ``s b h`` (``/t`` with TP), as in the paper; selective recompute drops
exactly that term (and flash attention never has it). The fp32 logits of the last stage are
added. Values are scaled from 16-bit to the run's activation precision.

``workload.activation_memory: tensors`` counts instead, per architecture, the tensors a layer
keeps for its backward pass (bytes per ``s b h`` at 16 bits; ``f`` the MLP width, ``k/a``
the key/value heads per head): outside the tensor-parallel regions (replicated across TP ranks
unless sequence parallel) the two norms' inputs and outputs (8) and, for ``gpt``, the two
dropout masks on the residual branches (2, one byte per element); inside them (``/t``) the
query (2), keys and values (``4 k/a``), the attention output (2) and the MLP's tensors: GELU
input and output (``4 f/h``, ``gpt``) or SwiGLU's gate, up and product (``6 f/h``, ``llama``).
For a GPT layer (``f = 4h``, ``k = a``) that is ``10 + 24/t``: the paper's numbers.

Stages may hold different numbers of layers (``workloads.stages``): an even split uses the
closed forms of :func:`in_flight_microbatches`; an uneven one walks the stage's schedule and
takes the largest number of (layer, microbatch) activations held at once (the same number for
an even split). Sharded data parallelism (``workloads.sharding``) splits weights, gradients
and optimizer states over the shard group and adds its communication buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import workloads
from twin.kernel.catalog import Catalog
from workloads.sharding import model_states
from workloads.stages import even_split, peak_layer_activations, stage_chunks
from workloads.transformer import (
    TransformerCosts,
    grad_bytes_per_element,
    weight_bytes_per_element,
)


@cache
def optimizer_entry(name: str = "adam") -> dict:
    """Values of an optimizer catalog entry (``workloads/catalog/optimizers``)."""
    cat = Catalog("optimizers", Path(workloads.__file__).parent / "catalog" / "optimizers")
    return cat.get(name, "workload.optimizer").values


@dataclass(frozen=True)
class StageMemory:
    """Bytes per device of one pipeline stage."""

    stage: int
    params: float
    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float            # sharding: gathered units and reduce-scatter inputs
    layers: int               # transformer layers of the stage (all its chunks)

    @property
    def total(self) -> float:
        """All bytes."""
        total = self.weights + self.gradients + self.optimizer + self.activations
        return total + self.buffers if self.buffers else total

    def breakdown_gb(self) -> dict[str, float]:
        """Every component and the total, GB (1e9 bytes)."""
        return {"weights": self.weights / 1e9, "gradients": self.gradients / 1e9,
                "optimizer": self.optimizer / 1e9, "activations": self.activations / 1e9,
                "buffers": self.buffers / 1e9, "total": self.total / 1e9}


def in_flight_microbatches(schedule: str, pp: int, stage: int, microbatches: int,
                           virtual: int = 1) -> float:
    """Microbatches whose activations a stage holds at its peak, in whole-stage units.

    GPipe keeps all ``m``; 1F1B keeps ``pp - stage`` (its warm-up depth plus one); interleaved
    1F1B with ``v`` chunks per stage runs ``2 (pp - stage - 1) + (v - 1) pp`` warm-up chunk
    forwards plus one (Megatron-LM's schedule), each chunk holding ``1/v`` of the stage.
    """
    if schedule == "gpipe":
        return float(microbatches)
    if schedule == "interleaved" and virtual > 1:
        chunks = min(2 * (pp - stage - 1) + (virtual - 1) * pp + 1, microbatches * virtual)
        return chunks / virtual
    return float(min(pp - stage, microbatches))


def layer_tensors(m) -> tuple[float, float]:
    """(replicated, TP-split) 16-bit values per ``s b h`` one layer keeps for its backward pass
    (``activations: tensors``, module docstring)."""
    h, f = m.hidden, m.ffn
    replicated = 8.0 + (2.0 if m.arch == "gpt" else 0.0)
    mlp = 6.0 * f / h if m.gated_mlp else 4.0 * f / h
    return replicated, 2.0 + 4.0 * m.n_kv_heads / m.heads + 2.0 + mlp


def memory_per_stage(costs: TransformerCosts, pp: int, microbatches: int, schedule: str,
                     virtual: int = 1, dp: int = 1, split: list[int] | None = None,
                     sharding: str = "none", shards: int = 1, prefetch: bool = True,
                     bucket_bytes: float = 25e6, activations: str = "korthikanti"
                     ) -> list[StageMemory]:
    """Memory of one device of every pipeline stage.

    Args:
        split: layers per virtual stage in model order (``workloads.stages``; default even).
        sharding: ``workload.sharding.strategy``; ``shards``: ranks ``N`` the states are split
            over; ``prefetch``: FSDP prefetch (one more gathered unit); ``bucket_bytes``: the
            gradient bucket (zero2's buffers).
        activations: ``korthikanti`` (the paper's GPT forms for every architecture) or
            ``tensors`` (the per-architecture tensor count, module docstring).
    """
    m, t = costs.m, costs.t
    split = split if split is not None else even_split(m.layers, pp, virtual)
    chunks = stage_chunks(split, pp)
    uniform = len(set(split)) == 1
    opt = optimizer_entry()
    mixed = costs.precision not in ("fp32", "tf32")
    state = opt["state_bytes_per_param"]["mixed" if mixed else "fp32"]
    we = weight_bytes_per_element(costs.precision)
    ge = grad_bytes_per_element(costs.precision)
    s, b, h = costs.s, costs.b, m.hidden
    act_scale = costs.e / 2.0
    replicated, split_tp = layer_tensors(m) if activations == "tensors" else (10.0, 24.0)
    if costs.recompute == "full":
        per_layer = 2.0 * s * b * h / (t if costs.sp else 1)
    elif costs.sp:
        per_layer = (replicated + split_tp) * s * b * h / t
    else:
        per_layer = s * b * h * (replicated + split_tp / t)
    if costs.attention == "standard" and costs.recompute == "none":
        per_layer += 5.0 * m.heads * s * s * b / t  # softmax output, dropout mask and output
    per_layer *= act_scale
    out = []
    for stage, chunk in enumerate(chunks):
        n_layers = sum(chunk)
        units = [costs.layer_params() / t] if n_layers else []
        params = n_layers * costs.layer_params() / t
        if stage == 0:
            params += costs.embedding_params() / t
            units.append(costs.embedding_params() / t)
        if stage == pp - 1:
            head = costs.last_stage_head_params(pp) / t
            params += head
            units.append(head)
        if uniform:
            flight = in_flight_microbatches(schedule, pp, stage, microbatches, virtual)
            acts = per_layer * n_layers * flight
        else:
            acts = per_layer * peak_layer_activations(schedule, stage, pp, microbatches, chunk)
        if stage == pp - 1:
            acts += 4.0 * s * b * m.vocab / t  # fp32 logits for the loss
        st = model_states(sharding, shards, params, max(units, default=0.0), we, ge, state,
                          prefetch, bucket_bytes)
        out.append(StageMemory(stage, params, st.weights, st.gradients, st.optimizer, acts,
                               st.buffers, n_layers))
    return out
