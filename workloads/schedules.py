"""Per-stage programs: the ordered instructions one pipeline stage executes in an iteration.

A program is a list of tuples ``(opcode, ...)``:

* ``(COMPUTE, block, mb, chunk, layer)`` - run a compute block (see ``TransformerCosts``);
* ``(TP, kind, nbytes)`` - blocking tensor-parallel collective (``allreduce``,
  ``reduce_scatter``, ``allgather``) of an ``nbytes`` buffer;
* ``(SEND, direction, tag, nbytes)`` - non-blocking send to the next (+1) / previous (-1)
  pipeline stage; ``tag = (kind, mb, chunk of the receiver)``;
* ``(RECV, direction, tag)`` - wait for the matching send;
* ``(DP_START, bucket, nbytes)`` - start a gradient all-reduce of a bucket on the
  communication stream (overlaps with the remaining backward work);
* ``(DP_WAIT,)`` - wait for every started bucket;
* with tied embeddings over several stages (``StageWork.tied_embed_bytes``), the first and
  the last stage then all-reduce the shared matrix's gradient between them (Megatron-LM's
  embedding group, after the data-parallel sync), as sends to the other end of the pipeline
  (direction ``d`` = -1 from stage 0, +1 from stage pp-1, wrapping around): an empty
  ``(SEND, d, EMBED_READY, 0)`` and ``(RECV, -d, EMBED_READY)`` first, so that, as in a
  collective, neither starts before both are there, then ``(SEND, d, EMBED_TAG, nbytes)``
  and ``(RECV, -d, EMBED_TAG)``. A two-rank all-reduce moves the whole buffer each way (a
  ring's two steps of half of it), as this exchange does, and both ends finish together;
* ``(COMPUTE, "optimizer", -1, -1, -1)`` - the optimizer step;
* ``(DATA, mb)`` - take microbatch ``mb``'s input from the data path (``workloads.data``),
  waiting if it is not ready; only with ``StageWork.load_input``, before the first forward
  block of each microbatch on the first virtual stage.
* sharded data parallelism (``workloads.sharding`` adds these to a program):
  ``(SH_GATHER, key, nbytes)`` - start an all-gather of ``nbytes`` of parameters over the
  shard group on the sharding communication stream (FIFO); ``(SH_WAIT, key)`` - the compute
  stream waits for that all-gather; ``(SH_REDUCE, nbytes, replica_nbytes)`` - start a gradient
  reduce-scatter on the same stream, then (``replica_nbytes > 0``, hybrid sharding) an
  all-reduce of the resulting shard across the shard groups on a stream of its own.

Schedules decide the order of forward (F) and backward (B) units ``(chunk, mb)``:
GPipe (all F then all B), 1F1B (PipeDream-flush: ``pp - stage - 1`` warm-up forwards, then
alternate), and interleaved 1F1B with ``v`` model chunks per stage (Megatron-LM's ordering).
"""

from __future__ import annotations

from dataclasses import dataclass

COMPUTE, TP, SEND, RECV, DP_START, DP_WAIT, DATA, SH_GATHER, SH_WAIT, SH_REDUCE = (
    range(10))
OPCODE_NAMES = ("compute", "tp", "send", "recv", "dp_start", "dp_wait", "data",
                "sh_gather", "sh_wait", "sh_reduce")
#: Tags of the embedding group's gradient exchange between the first and last stage: the
#: empty message that says a stage is there, then the gradient (no microbatch, no chunk).
EMBED_READY, EMBED_TAG = ("ER", -1, -1), ("E", -1, -1)
#: Fabric phase name of a pipeline send by its tag's kind (forward activation, backward
#: gradient, the embedding group's exchange): "p2p..." names are pipeline traffic.
P2P_NAMES = {"F": "p2p_fwd", "B": "p2p_bwd", "ER": "p2p_embed", "E": "p2p_embed"}


@dataclass(frozen=True)
class StageWork:
    """What one stage needs to build its program."""

    stage: int
    pp: int
    virtual: int
    microbatches: int
    chunk_layers: tuple[int, ...]  # transformer layers of each of the stage's chunks
    tp: int
    sequence_parallel: bool
    recompute: str
    activation_bytes: float      # b*s*h*e: TP collective buffer and p2p message (before SP)
    layer_grad_bytes: float      # gradient bytes of one layer on one rank
    embed_grad_bytes: float      # gradient bytes of embedding (stage 0) on one rank
    head_grad_bytes: float       # gradient bytes of the untied output layer (last stage)
    bucket_bytes: float
    load_input: bool = False     # the data path feeds the first virtual stage (DATA)
    tied_embed_bytes: float = 0.0  # gradient bytes of a tied embedding matrix on one rank,
    # all-reduced between the first and last stage (0: untied, or one stage)


def unit_order(schedule: str, stage: int, pp: int, m: int,
               v: int = 1) -> list[tuple[str, int, int]]:
    """Order of ``(F|B, chunk, mb)`` units executed by ``stage``."""
    if schedule == "gpipe":
        units = [("F", c, mb) for mb in range(m) for c in range(v)]
        units += [("B", c, mb) for mb in reversed(range(m)) for c in reversed(range(v))]
        return units
    if schedule == "1f1b" or v == 1:
        w = min(pp - stage - 1, m)
        units = [("F", 0, mb) for mb in range(w)]
        for i in range(m - w):
            units += [("F", 0, w + i), ("B", 0, i)]
        units += [("B", 0, mb) for mb in range(m - w, m)]
        return units
    total = m * v

    def fwd(k: int) -> tuple[str, int, int]:
        return ("F", (k // pp) % v, (k // (pp * v)) * pp + k % pp)

    def bwd(k: int) -> tuple[str, int, int]:
        return ("B", v - 1 - (k // pp) % v, (k // (pp * v)) * pp + k % pp)

    w = min((pp - stage - 1) * 2 + (v - 1) * pp, total)
    units = [fwd(k) for k in range(w)]
    for i in range(total - w):
        units += [fwd(w + i), bwd(i)]
    units += [bwd(k) for k in range(total - w, total)]
    return units


def _tp_collectives(w: StageWork) -> tuple[list[tuple], list[tuple]]:
    """TP instructions before and after a block."""
    if w.tp < 2:
        return [], []
    n = w.activation_bytes
    if w.sequence_parallel:
        return [(TP, "allgather", n)], [(TP, "reduce_scatter", n)]
    return [], [(TP, "allreduce", n)]


def build_program(w: StageWork, schedule: str) -> list[tuple]:
    """The instructions of one iteration of stage ``w.stage``."""
    pp, v, s = w.pp, w.virtual, w.stage
    before, after = _tp_collectives(w)
    p2p_bytes = w.activation_bytes / (w.tp if w.sequence_parallel else 1)
    last_virtual = pp * v - 1
    prog: list[tuple] = []
    pending = 0.0
    bucket = 0

    def flush(force: bool = False) -> None:
        nonlocal pending, bucket
        if pending > 0 and (force or pending >= w.bucket_bytes):
            prog.append((DP_START, bucket, pending))
            bucket += 1
            pending = 0.0

    order = unit_order(schedule, s, pp, w.microbatches, v)
    last_b = {c: mb for kind, c, mb in order if kind == "B"}  # a chunk's final backward
    first = [sum(w.chunk_layers[:c]) for c in range(v)]  # stage-local index of a chunk's layer 0
    for kind, c, mb in order:
        vstage = c * pp + s
        layers = range(first[c], first[c] + w.chunk_layers[c])
        if kind == "F":
            if vstage > 0:
                prog.append((RECV, -1, ("F", mb, c)))
            else:
                if w.load_input:
                    prog.append((DATA, mb))
                prog.append((COMPUTE, "embed_fwd", mb, c, -1))
            for layer in layers:
                for blk in ("attn_fwd", "mlp_fwd"):
                    prog += before
                    prog.append((COMPUTE, blk, mb, c, layer))
                    prog += after
            if vstage < last_virtual:
                nc = c if s < pp - 1 else c + 1
                prog.append((SEND, +1, ("F", mb, nc), p2p_bytes))
            else:
                prog.append((COMPUTE, "logits_fwd", mb, c, -1))
        else:
            last_mb = mb == last_b[c]
            if vstage < last_virtual:
                prog.append((RECV, +1, ("B", mb, c)))
            else:
                prog.append((COMPUTE, "logits_bwd", mb, c, -1))
                if last_mb and w.head_grad_bytes:
                    pending += w.head_grad_bytes
            for layer in reversed(layers):
                if w.recompute != "none":
                    if w.recompute == "full":
                        for _ in ("attn", "mlp"):
                            prog += before + after
                    prog.append((COMPUTE, "recompute", mb, c, layer))
                for blk in ("mlp_bwd", "attn_bwd"):
                    prog += before  # backward of the after-collective (AG <-> RS, AR <-> AR)
                    prog.append((COMPUTE, blk, mb, c, layer))
                    prog += after
                if last_mb:
                    pending += w.layer_grad_bytes
                    flush()
            if vstage > 0:
                pc = c if s > 0 else c - 1
                prog.append((SEND, -1, ("B", mb, pc), p2p_bytes))
            else:
                prog.append((COMPUTE, "embed_bwd", mb, c, -1))
                if last_mb:
                    pending += w.embed_grad_bytes
    flush(force=True)
    prog.append((DP_WAIT,))
    if w.tied_embed_bytes > 0 and pp > 1 and s in (0, pp - 1):
        d = -1 if s == 0 else +1  # towards the other end of the pipeline
        for tag, nbytes in ((EMBED_READY, 0.0), (EMBED_TAG, w.tied_embed_bytes)):
            prog += [(SEND, d, tag, nbytes), (RECV, -d, tag)]
    prog.append((COMPUTE, "optimizer", -1, -1, -1))
    return prog
