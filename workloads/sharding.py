"""Sharded data parallelism: ZeRO stages 1-3 (Rajbhandari et al. 2020) and PyTorch FSDP.

Every tensor- and pipeline-parallel rank holds a slice of ``P`` parameters (its stage's layers
split ``1/tp``); its data-parallel group of ``dp`` ranks all hold the same slice. Sharding
splits the model states of that slice over the group's ``N`` ranks (``N = dp``, or the
shard-group size of ``hybrid_shard``). Per device, in bytes (``w``, ``g``: bytes per weight
and gradient element, 2 in mixed precision; ``K``: optimizer state bytes per parameter, 12 for
mixed-precision Adam; ``u``: parameters of the largest unit, one transformer layer, the
embedding or the output layer; ``B``: the gradient bucket), the ZeRO paper's accounting (sec.
5, Fig. 1) plus the communication buffers:

=============== ========= ========= ======= =================================================
strategy        weights   gradients states  buffers
=============== ========= ========= ======= =================================================
none (DDP)      w P       g P       K P     -
zero1           w P       g P       K P/N   - (reduce-scatter and all-gather in place)
zero2           w P       g P/N     K P/N   two gradient buckets ``2 min(g P, B + g u)``
zero3, full_    w P/N     g P/N     K P/N   gathered units ``(2 or 1) w u`` (current +
shard, hybrid                               prefetched) and reduce-scatter inputs ``2 g u``
shard_grad_op   w P       g P/N     K P/N   reduce-scatter inputs ``2 g u``
=============== ========= ========= ======= =================================================

Communication (the fabric moves it; the units are one transformer layer each, plus the
embedding and the output layer of the first and last virtual stage):

* ``zero1``: gradients accumulate over the microbatches at full size; in the last backward of
  each chunk they are reduce-scattered in buckets (where DDP all-reduces them), the optimizer
  steps on the ``1/N`` shard, and the updated parameters are all-gathered (blocking).
  ``2 P`` per iteration, as an all-reduce (ZeRO sec. 7.2.1).
* ``zero2``: gradients stay sharded, so every microbatch's backward reduce-scatters its
  buckets; optimizer on the shard; all-gather of the parameters after it.
  ``(m + 1) P`` for ``m`` microbatches (``2 P`` at ``m = 1``).
* ``zero3`` = ``full_shard``: every unit is all-gathered before its forward and again before
  its backward, in every microbatch, and its gradient reduce-scattered after its backward;
  the optimizer steps on the shard, nothing follows. ``3 m P`` (ZeRO sec. 7.2.2: ``3 P``).
* ``shard_grad_op``: a unit is all-gathered before its first forward of the iteration and
  kept until the iteration ends (not resharded after forward, as Llama 3 did); gradients
  are reduce-scattered after every backward. ``(m + 1) P``.
* ``hybrid_shard``: ``full_shard`` inside each shard group, and after each reduce-scatter an
  all-reduce of the ``1/N`` gradient shard across the ``dp / N`` groups (its own stream).

Collectives of the shard group run in issue order on one communication stream per rank
(ProcessGroupNCCL serialises a group's collectives); with ``prefetch`` a unit's all-gather is
issued when the previous unit starts computing (FSDP's forward/backward prefetch), so it
overlaps that unit's compute; without it, when the unit itself is about to compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.schedules import COMPUTE, DP_START, SH_GATHER, SH_REDUCE, SH_WAIT
from workloads.spec import ShardingSpec

#: strategies that all-gather parameters per unit during forward / backward
UNIT_STRATEGIES = ("zero3", "full_shard", "hybrid_shard", "shard_grad_op")
#: strategies whose parameters stay sharded while in use (gathered per unit, freed after)
PARAMS_SHARDED = ("zero3", "full_shard", "hybrid_shard")
#: strategies whose gradients are sharded
GRADS_SHARDED = ("zero2", "zero3", "full_shard", "hybrid_shard", "shard_grad_op")

_BACKWARD = ("recompute", "mlp_bwd", "attn_bwd", "embed_bwd", "logits_bwd")


def shard_degree(spec: ShardingSpec, dp: int) -> int:
    """Ranks ``N`` one parameter's states are split over (1 without sharding)."""
    if spec.strategy == "none":
        return 1
    if spec.strategy == "hybrid_shard":
        return int(spec.group or dp)
    return dp


@dataclass(frozen=True)
class ModelStates:
    """Bytes per device of the model states of one stage slice."""

    weights: float
    gradients: float
    optimizer: float
    buffers: float


def model_states(strategy: str, n: int, params: float, unit_params: float, w: float, g: float,
                 k: float, prefetch: bool, bucket_bytes: float) -> ModelStates:
    """Per-device bytes of ``params`` parameters under ``strategy`` over ``n`` shards (see the
    module docstring's table); ``unit_params``: parameters of the largest unit."""
    if strategy == "none":
        return ModelStates(params * w, params * g, params * k, 0.0)
    weights = params * w / n if strategy in PARAMS_SHARDED else params * w
    grads = params * g / n if strategy in GRADS_SHARDED else params * g
    buffers = 0.0
    if strategy == "zero2":
        buffers = 2.0 * min(params * g, bucket_bytes + unit_params * g)
    elif strategy in UNIT_STRATEGIES:
        buffers = 2.0 * unit_params * g
        if strategy in PARAMS_SHARDED:
            buffers += (2.0 if prefetch else 1.0) * unit_params * w
    return ModelStates(weights, grads, params * k / n, buffers)


@dataclass(frozen=True)
class ShardWork:
    """What the program transform needs: the strategy and the bytes of every unit on one rank."""

    strategy: str
    prefetch: bool
    replicas: int             # shard groups per data-parallel group (hybrid_shard: dp / N)
    degree: int               # N
    param_bytes: dict[str, float]  # unit ("L" a layer, "E", "H") -> weight bytes of one unit
    grad_bytes: dict[str, float]   # unit -> gradient bytes of one unit
    bucket_bytes: float


def _unit(ins: tuple) -> tuple | None:
    """(direction, unit, mb, chunk) of a compute instruction (None: the optimizer step)."""
    name = ins[1]
    if name == "optimizer":
        return None
    direction = "B" if name in _BACKWARD else "F"
    unit = "E" if name.startswith("embed") else "H" if name.startswith("logits") else ins[4]
    return direction, unit, ins[2], ins[3]


def _kind(unit) -> str:
    return unit if unit in ("E", "H") else "L"


def _passes(prog: list[tuple]) -> list[list]:
    """``[first index, last index, key]`` of every run of compute instructions of one unit in
    one direction for one microbatch (a *unit pass*), in program order."""
    out: list[list] = []
    for i, ins in enumerate(prog):
        if ins[0] != COMPUTE:
            continue
        key = _unit(ins)
        if key is None:
            continue
        if out and out[-1][2] == key:
            out[-1][1] = i
        else:
            out.append([i, i, key])
    return out


def shard_program(prog: list[tuple], sw: ShardWork) -> list[tuple]:
    """The stage's program with the collectives of ``sw.strategy`` (a new list; ``none``
    returns ``prog`` itself)."""
    if sw.strategy == "none":
        return prog
    if sw.strategy in UNIT_STRATEGIES:
        return _unit_program(prog, sw)
    return _bucket_program(prog, sw)


def _reduce(sw: ShardWork, nbytes: float) -> tuple:
    replica = nbytes / sw.degree if sw.replicas > 1 else 0.0
    return (SH_REDUCE, nbytes, replica)


def _stage_param_bytes(prog: list[tuple], sw: ShardWork) -> float:
    units = {key[1] for ins in prog if ins[0] == COMPUTE and (key := _unit(ins)) is not None}
    return sum(sw.param_bytes[_kind(u)] for u in sorted(units, key=str))


def _bucket_program(prog: list[tuple], sw: ShardWork) -> list[tuple]:
    """zero1 (DDP's buckets reduce-scattered) and zero2 (buckets in every microbatch), then the
    optimizer on the shard and the all-gather of the updated parameters."""
    out: list[tuple] = []
    if sw.strategy == "zero1":
        out = [_reduce(sw, ins[2]) if ins[0] == DP_START else ins for ins in prog]
    else:
        passes = _passes(prog)
        ends = {p[1]: j for j, p in enumerate(passes) if p[2][0] == "B"}
        pending = 0.0
        for i, ins in enumerate(prog):
            if ins[0] == DP_START:
                continue
            out.append(ins)
            j = ends.get(i)
            if j is None:
                continue
            _d, unit, mb, chunk = passes[j][2]
            pending += sw.grad_bytes[_kind(unit)]
            nxt = passes[j + 1][2] if j + 1 < len(passes) else None
            last = nxt is None or nxt[0] != "B" or nxt[2:] != (mb, chunk)
            if pending > 0 and (last or pending >= sw.bucket_bytes):
                out.append(_reduce(sw, pending))
                pending = 0.0
    out += [(SH_GATHER, -1, _stage_param_bytes(prog, sw)), (SH_WAIT, -1)]
    return out


def _unit_program(prog: list[tuple], sw: ShardWork) -> list[tuple]:
    """zero3 / full_shard / hybrid_shard / shard_grad_op: per-unit all-gathers (prefetched) and
    reduce-scatters; the data-parallel buckets are dropped."""
    passes = _passes(prog)
    if sw.strategy == "shard_grad_op":  # gathered once, at the unit's first use
        seen: set = set()
        need = []
        for _a, _b, key in passes:
            need.append(key[1] not in seen)
            seen.add(key[1])
    else:
        need = [True] * len(passes)
    gathers = [j for j, n in enumerate(need) if n]
    following = {}  # pass -> first pass after it that needs an all-gather
    nxt = None
    for j in range(len(passes) - 1, -1, -1):
        following[j] = nxt
        if need[j]:
            nxt = j
    starts = {p[0]: j for j, p in enumerate(passes)}
    ends = {p[1]: j for j, p in enumerate(passes) if p[2][0] == "B"}
    issued: set[int] = set()
    out: list[tuple] = []

    def gather(j: int) -> None:
        if j not in issued:
            issued.add(j)
            out.append((SH_GATHER, j, sw.param_bytes[_kind(passes[j][2][1])]))

    for i, ins in enumerate(prog):
        if ins[0] == DP_START:
            continue
        j = starts.get(i)
        if j is not None:
            if need[j]:
                gather(j)
                out.append((SH_WAIT, j))
            if sw.prefetch and following[j] is not None:
                gather(following[j])
        out.append(ins)
        j = ends.get(i)
        if j is not None:
            out.append(_reduce(sw, sw.grad_bytes[_kind(passes[j][2][1])]))
    assert issued == set(gathers)
    return out
