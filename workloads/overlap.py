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
``sm_contention`` (default false)
    Collective kernels occupy SMs (``devices.interference``): compute beside them slows.
    Turned on automatically by a memory contention model (``memory.model`` not roofline).

FSDP prefetch (all-gathers and reduce-scatters beside compute) is ``workload.sharding.prefetch``;
host-to-device copies run beside compute whenever the data path is on (``data``).
"""

from __future__ import annotations

from pydantic import Field

from twin.kernel.schema import StrictModel


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
    sm_contention: bool = Field(default=False, description="collective kernels take SMs from "
                                "compute (on with any memory.model but roofline)")


def chunk_block(block, n: int):
    """``block`` as ``n`` equal chunks: one block with every kernel's FLOPs and bytes
    divided by ``n`` (shape kept; module docstring)."""
    from dataclasses import replace

    if n <= 1:
        return block
    return type(block)(block.name, tuple(replace(k, flops=k.flops / n, bytes=k.bytes / n)
                                         for k in block.kernels))
