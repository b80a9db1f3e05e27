"""Which streams overlap compute (the ``overlap`` scenario section) and chunked blocks.

Defaults are today's behaviour: data-parallel buckets run beside the backward pass on their
own stream, pipeline sends do not block the sender, tensor-parallel collectives block the
compute stream, and nothing takes SMs from the compute kernels. What each key turns on or off
(``workloads.executor`` runs it):

``tp_comm`` (default false)
    Megatron-LM / Transformer Engine tensor-parallel communication overlap: the all-gather
    before a block and the reduce-scatter (all-reduce without sequence parallelism) after it
    are split into ``tp_chunks`` chunks on a TP communication stream, pipelined with the
    block's compute split the same way: compute chunk ``i`` waits for all-gather chunk ``i``
    (so the first is exposed), reduce-scatter chunk ``i`` starts when compute chunk ``i`` ends
    and the block waits for the last one. A compute chunk is ``1/tp_chunks`` of every kernel
    (FLOPs and bytes; the GEMM's tile shape and its wave quantization are kept, each chunk
    pays the kernel overhead again).
``dp_buckets`` (default true)
    Gradient buckets all-reduce beside the backward pass (PyTorch DDP). False: the buckets are
    all-reduced one after the other at the end of the backward pass, the compute stream
    waiting (no overlap).
``dp_streams`` (default 1)
    Concurrent data-parallel communication streams: bucket ``b`` goes to stream ``b mod
    dp_streams`` (as with several process groups / NCCL communicators); more streams, more
    concurrent DMA at the HBM and more SMs taken.
``pipeline`` (default true)
    Pipeline sends run beside compute. False: the sender waits until its send is delivered.
``sm_contention`` (default null)
    Collective kernels occupy SMs (``devices.interference``): compute beside them slows.
    Null: on with a memory contention model (``memory.model`` not roofline), off without;
    true or false is honoured either way (``Scenario.sm_shared``).

FSDP prefetch (all-gathers and reduce-scatters beside compute) is ``workload.sharding.prefetch``;
host-to-device copies run beside compute whenever the data path is on (``data``).

Also here, for the executor: :func:`fuse_tp` (a stage program's TP / compute / TP runs as one
``TPO`` instruction) and :class:`Fifo` (the TP communication stream of overlapped chunks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import Field

from twin.kernel.schema import StrictModel
from workloads.schedules import COMPUTE, TP

if TYPE_CHECKING:  # (the scenario schema imports this module: no simpy for `twin check`)
    import simpy

    from twin.kernel.engine import Engine

#: the fused ``(TP before, COMPUTE, TP after)`` instruction of tensor-parallel overlap
#: (:func:`fuse_tp`; run by ``workloads.executor.Executor``)
TPO = 100


class OverlapSpec(StrictModel):
    """The ``overlap`` section (module docstring)."""

    tp_comm: bool = Field(default=False, description="chunked tensor-parallel communication "
                          "overlap with the blocks' GEMMs (Megatron-LM / Transformer Engine)")
    tp_chunks: int = Field(default=4, ge=1, le=64, description="chunks a TP collective and its "
                           "block are split into when tp_comm is on")
    dp_buckets: bool = Field(default=True, description="gradient buckets all-reduce beside the "
                             "backward pass (false: after it, blocking)")
    dp_streams: int = Field(default=1, ge=1, le=16, description="concurrent data-parallel "
                            "communication streams (buckets round-robin)")
    pipeline: bool = Field(default=True, description="pipeline sends beside compute (false: "
                           "the sender waits for delivery)")
    sm_contention: bool | None = Field(
        default=None, description="collective kernels take SMs from compute; null (default): "
        "on with a memory.model other than roofline (its device agents), off with roofline; "
        "true / false: as given")

    def sharding_problems(self, strategy: str) -> list:
        """``dp_buckets`` and ``dp_streams`` changed under a sharded strategy: they act on
        DDP's gradient-bucket all-reduces, and a sharded strategy has none (its gradients are
        reduce-scattered on its sharding stream, one collective after another in issue order,
        each tied to a unit's or a bucket's backward). Accepted, they would change nothing."""
        from twin.kernel.errors import Problem

        if strategy == "none":
            return []
        return [Problem(f"overlap.{key}", "acts on DDP's gradient-bucket all-reduces; with "
                        f"workload.sharding.strategy {strategy} gradients are reduce-scattered "
                        "on the sharding stream instead", getattr(self, key),
                        f"{str(OverlapSpec.model_fields[key].default).lower()} (the default), or "
                        "workload.sharding.strategy: none")
                for key in ("dp_buckets", "dp_streams")
                if getattr(self, key) != OverlapSpec.model_fields[key].default]


def chunk_block(block, n: int):
    """``block`` as ``n`` equal chunks: one block with every kernel's FLOPs and bytes
    divided by ``n`` (shape kept; module docstring)."""
    from dataclasses import replace

    if n <= 1:
        return block
    return type(block)(block.name, tuple(replace(k, flops=k.flops / n, bytes=k.bytes / n)
                                         for k in block.kernels))


class Fifo:
    """A communication stream: jobs start one after the other in submission order. A job's
    ``done`` event fires after the next job has started, so a compute block that resumes on
    it already sees the next chunk's stream. ``env``: the run's ``twin.kernel.engine.Engine``
    (a ``done`` nothing waits for is fired in place)."""

    def __init__(self, env: Engine, alive: Callable[[], bool]):
        self.env = env
        self.alive = alive
        self.queue: deque = deque()
        self.busy = False

    def submit(self, start: Callable[..., simpy.Event], *args) -> simpy.Event:
        """Queue ``start(*args)`` (which starts the job and returns its completion event)."""
        done = self.env.event()
        self.queue.append((start, args, done))
        if not self.busy:
            self._next()
        return done

    def _next(self) -> None:
        if not self.queue or not self.alive():
            self.busy = False
            return
        self.busy = True
        start, args, done = self.queue.popleft()
        ev = start(*args)

        def finished(_e: object) -> None:
            self._next()
            if self.alive():
                if done.callbacks:
                    done.succeed()
                else:  # nobody waits yet: processed now, no event in the queue (a later
                    # waiter finds it triggered, as it would between succeed and processing)
                    self.env.fire(done)

        if ev.callbacks is None:
            finished(ev)
        else:
            ev.callbacks.append(finished)


def fuse_tp(prog: list[tuple]) -> list[tuple]:
    """``prog`` with every ``(TP allgather) (COMPUTE) (TP reduce_scatter | allreduce)`` run
    (either TP side may be missing) fused into one ``(TPO, block, mb, chunk, layer, before,
    after)`` instruction; ``before`` / ``after`` are ``(algo, nbytes)`` or None. TP
    collectives not adjacent to a compute block (full recomputation's) stay blocking."""
    out: list[tuple] = []
    i = 0
    while i < len(prog):
        ins = prog[i]
        if ins[0] != COMPUTE or ins[1] == "optimizer":
            out.append(ins)
            i += 1
            continue
        before = None
        if out and out[-1][0] == TP and out[-1][1] == "allgather":
            before = (out[-1][1], out[-1][2])
            out.pop()
        after = None
        nxt = prog[i + 1] if i + 1 < len(prog) else None
        if nxt is not None and nxt[0] == TP and nxt[1] in ("reduce_scatter", "allreduce"):
            after = (nxt[1], nxt[2])
            i += 1
        if before is None and after is None:
            out.append(ins)
        else:
            out.append((TPO, ins[1], ins[2], ins[3], ins[4], before, after))
        i += 1
    return out
