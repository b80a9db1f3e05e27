"""How the transformer layers are split over pipeline stages and virtual stages (chunks).

A pipeline of ``pp`` stages with ``v`` virtual stages per stage (``v = 1`` without
interleaving) has ``pp * v`` *virtual stages*, in model order: virtual stage ``j = c * pp + s``
is chunk ``c`` of stage ``s`` (Megatron-LM's convention: activations go stage 0, 1, ..., pp-1
of chunk 0, then stage 0 of chunk 1, ...). The embedding sits on virtual stage 0 (chunk 0 of
stage 0), the output layer and the loss on the last one (chunk ``v-1`` of stage ``pp-1``).

``workload.stage_layers`` sets the split:

* absent: ``layers / (pp v)`` in every virtual stage (must divide evenly);
* a list of ``pp`` numbers: layers per stage; a stage's layers are spread over its ``v``
  chunks as evenly as possible, the remainder going to its last chunks (the early chunks hold
  the most microbatches in flight in the interleaved schedule);
* a list of ``pp * v`` numbers: layers per virtual stage in model order (a virtual stage may
  hold none, e.g. only the embedding, as in Llama 3's first and last chunks);
* ``auto``: the split that minimises the largest virtual stage's compute time per microbatch
  (forward + backward + recomputation of its layers, plus the embedding on the first and the
  logits and loss on the last, each costed by the device's compute model); layers are
  identical, so filling one layer at a time into the virtual stage it leaves least loaded is
  optimal (exchange argument); ties go to the lowest index.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from workloads.schedules import unit_order
from workloads.spec import WorkloadSpec
from workloads.transformer import Block, TransformerCosts


def even_split(layers: int, pp: int, virtual: int) -> list[int]:
    """``layers / (pp v)`` per virtual stage (caller checks divisibility)."""
    return [layers // (pp * virtual)] * (pp * virtual)


def spread_stage(total: int, virtual: int) -> list[int]:
    """A stage's layers over its chunks: as even as possible, remainder to the last chunks."""
    base, rem = divmod(total, virtual)
    return [base + (1 if c >= virtual - rem else 0) for c in range(virtual)]


def from_stage_list(per_stage: Sequence[int], virtual: int) -> list[int]:
    """Virtual-stage split (model order) from layers per stage."""
    pp = len(per_stage)
    chunks = [spread_stage(n, virtual) for n in per_stage]
    return [chunks[j % pp][j // pp] for j in range(pp * virtual)]


def balance(layers: int, slots: int, layer_s: float, first_s: float, last_s: float) -> list[int]:
    """Layers per virtual stage minimising the largest time ``n_j layer_s + extra_j`` (extra:
    ``first_s`` on slot 0, ``last_s`` on the last slot, both on one slot when there is one)."""
    extra = [0.0] * slots
    extra[0] += first_s
    extra[-1] += last_s
    n = [0] * slots
    heap = [(extra[j] + layer_s, j) for j in range(slots)]
    heapq.heapify(heap)
    for _ in range(layers):
        _t, j = heapq.heappop(heap)
        n[j] += 1
        heapq.heappush(heap, (extra[j] + (n[j] + 1) * layer_s, j))
    return n


def block_times(costs: TransformerCosts, duration: Callable[[Block], float]) -> tuple[float,
                                                                                       float,
                                                                                       float]:
    """(one layer, the embedding, the logits + loss) forward + backward time per microbatch, s,
    with ``duration(block)`` the device's time of a block (``ComputeModel.block_cost``)."""
    layer = [costs.attention_block(), costs.mlp_block(), costs.attention_block(True),
             costs.mlp_block(True), *costs.recompute_blocks()]
    return (sum(duration(b) for b in layer),
            duration(costs.embedding_block()) + duration(costs.embedding_block(True)),
            duration(costs.logits_block()) + duration(costs.logits_block(True)))


def virtual_stage_layers(w: WorkloadSpec, duration: Callable[[Block], float] | None = None
                         ) -> list[int]:
    """Transformer layers of every virtual stage, model order (``pp * v`` entries).

    Args:
        w: the workload (validated by ``workloads.feasibility.check_workload``).
        duration: block duration on the device, s (required for ``stage_layers: auto``).
    """
    par, v = w.parallelism, w.virtual_stages
    given = w.stage_layers
    if given is None:
        return even_split(w.model.layers, par.pp, v)
    if given == "auto":
        if duration is None:
            raise ValueError("stage_layers: auto needs the device's block durations")
        costs = TransformerCosts(w.model, w.precision, w.micro_batch, w.seq, par.tp,
                                 w.sequence_parallel, w.recompute, w.attention)
        layer_s, first_s, last_s = block_times(costs, duration)
        return balance(w.model.layers, par.pp * v, layer_s, first_s, last_s)
    if len(given) == par.pp * v:
        return list(given)
    return from_stage_list(given, v)


def stage_chunks(split: Sequence[int], pp: int) -> list[tuple[int, ...]]:
    """Per stage, the layers of each of its chunks (from the model-order split)."""
    v = len(split) // pp
    return [tuple(split[c * pp + s] for c in range(v)) for s in range(pp)]


def peak_layer_activations(schedule: str, stage: int, pp: int, microbatches: int,
                           chunks: Sequence[int]) -> int:
    """Largest number of (layer, microbatch) activations a stage holds at once: the schedule's
    units walked in order, a forward adding its chunk's layers, a backward releasing them."""
    live = peak = 0
    for kind, c, _mb in unit_order(schedule, stage, pp, microbatches, len(chunks)):
        live += chunks[c] if kind == "F" else -chunks[c]
        peak = max(peak, live)
    return peak


def resolve_split(w: WorkloadSpec, device) -> list[int]:
    """:func:`virtual_stage_layers` with ``auto`` costed on ``device`` (a
    ``devices.spec.DeviceSpec``) by the device's compute model."""
    if w.stage_layers != "auto":
        return virtual_stage_layers(w)
    from devices.accelerator import ComputeModel

    compute = ComputeModel(device, w.precision, device.hbm_pj_per_bit)
    return virtual_stage_layers(w, lambda b: compute.block_cost(b).duration_s)
