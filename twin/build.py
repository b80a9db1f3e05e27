"""Build the parts of a run from a validated scenario (no simulation happens here).

``build(scenario)`` returns a :class:`Model`: topology, router, parallel layout, per-stage
programs and block costs. The run module then creates the engine, fabric and agents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devices.accelerator import ComputeModel
from topologies.base import Topology
from topologies.graph import build_topology
from topologies.routing import Router
from twin.scenario import Scenario
from workloads.feasibility import microbatches
from workloads.memory import StageMemory, memory_per_stage, optimizer_entry
from workloads.parallel import Layout
from workloads.schedules import COMPUTE, StageWork, build_program
from workloads.sharding import ShardWork, shard_degree, shard_program
from workloads.stages import resolve_split, stage_chunks
from workloads.transformer import (
    Block,
    Kernel,
    TransformerCosts,
    grad_bytes_per_element,
    weight_bytes_per_element,
)


@dataclass
class Model:
    """Everything static about a run."""

    scenario: Scenario
    topo: Topology
    router: Router
    layout: Layout
    costs: TransformerCosts
    stage_memory: list[StageMemory]
    programs: dict[int, list[tuple]]
    blocks: dict[int, dict[str, Block]]
    compute: ComputeModel
    microbatches: int
    symmetric: bool
    hbm_pj_per_bit: float
    split: list[int] | None = None  # transformer layers per virtual stage, model order


def uses_symmetry(scen: Scenario) -> bool:
    """Whether the run simulates one representative per class of equal ranks
    (:attr:`twin.scenario.Scenario.symmetric`)."""
    return scen.symmetric


def stage_blocks(tc: TransformerCosts, params: float) -> dict[str, Block]:
    """The compute blocks a stage may run (``params``: parameters on one of its ranks)."""
    opt = optimizer_entry()
    mixed = tc.precision not in ("fp32", "tf32")
    upd = opt["update_bytes_per_param"]["mixed" if mixed else "fp32"]
    kc = tc.k
    blocks = {
        "attn_fwd": tc.attention_block(), "mlp_fwd": tc.mlp_block(),
        "attn_bwd": tc.attention_block(True), "mlp_bwd": tc.mlp_block(True),
        "embed_fwd": tc.embedding_block(), "embed_bwd": tc.embedding_block(True),
        "logits_fwd": tc.logits_block(), "logits_bwd": tc.logits_block(True),
        "optimizer": Block("optimizer", (
            Kernel("grad_clip", kc["grad_clip_flops_per_param"] * params,
                   kc["grad_clip_bytes_per_grad_byte"] * grad_bytes_per_element(tc.precision)
                   * params, False),
            Kernel("adam", opt["update_flops_per_param"] * params, upd * params, False))),
    }
    rec = tc.recompute_blocks()
    if rec:
        blocks["recompute"] = Block("recompute", tuple(k for b in rec for k in b.kernels))
    return blocks


def build(scen: Scenario) -> Model:
    """Topology, layout, programs and costs of ``scen``."""
    cl, w = scen.cluster, scen.workload
    par = w.parallelism
    topo = build_topology(cl.topology.kind, cl.topology.shape, cl.link.name,
                          cl.links_per_edge, **cl.topology_options())
    router = Router(topo)
    symmetric = uses_symmetry(scen)
    sh = w.sharding
    shards = shard_degree(sh, par.dp)
    layout = Layout(topo, par.dp, par.pp, par.tp, w.placement, symmetric,
                    tp_groups=scen.tp_groups,
                    solo_devices=tuple(sorted({d for f in scen.faults
                                               for d in f.targets(topo.n_devices)}))
                    if scen.tp_groups else (),
                    algorithms=scen.network.algorithms,
                    shard=shards if sh.strategy == "hybrid_shard" else None,
                    protocols=scen.network.protocols)
    tc = TransformerCosts(w.model, w.precision, w.micro_batch, w.seq, par.tp,
                          w.sequence_parallel, w.recompute, w.attention)
    m = microbatches(w)
    split = resolve_split(w, cl.device)
    mem = memory_per_stage(tc, par.pp, m, w.schedule, w.virtual_stages, par.dp, split,
                           sh.strategy, shards, sh.prefetch, w.grad_bucket_mb * 1e6,
                           w.activation_memory)
    pj = cl.device.hbm_pj_per_bit
    compute = ComputeModel(cl.device, w.precision, pj)
    ge = grad_bytes_per_element(w.precision)
    chunks = stage_chunks(split, par.pp)
    params = {"L": tc.layer_params() / par.tp, "E": tc.embedding_params() / par.tp,
              "H": tc.last_stage_head_params(par.pp) / par.tp}
    we = weight_bytes_per_element(w.precision)
    shard_work = ShardWork(sh.strategy, sh.prefetch, par.dp // shards, shards,
                           {k: v * we for k, v in params.items()},
                           {k: v * ge for k, v in params.items()}, w.grad_bucket_mb * 1e6)
    programs, blocks = {}, {}
    for stage in range(par.pp):
        work = StageWork(
            stage=stage, pp=par.pp, virtual=w.virtual_stages, microbatches=m,
            chunk_layers=chunks[stage], tp=par.tp,
            sequence_parallel=w.sequence_parallel, recompute=w.recompute,
            activation_bytes=w.micro_batch * w.seq * w.model.hidden * tc.e,
            layer_grad_bytes=params["L"] * ge, embed_grad_bytes=params["E"] * ge,
            head_grad_bytes=params["H"] * ge, bucket_bytes=w.grad_bucket_mb * 1e6,
            load_input=scen.data.enabled,
            tied_embed_bytes=(tc.m.vocab * tc.m.hidden / par.tp * ge
                              if tc.m.tied_embeddings else 0.0),
        )
        schedule = w.schedule if par.pp > 1 else "1f1b"
        programs[stage] = shard_program(build_program(work, schedule), shard_work)
        blocks[stage] = stage_blocks(tc, mem[stage].params / shards)  # optimizer on the shard
    return Model(scen, topo, router, layout, tc, mem, programs, blocks, compute, m, symmetric,
                 pj, split)


def model_flops_per_iteration(model: Model) -> float:
    """Model FLOPs (GEMM and attention, no recomputation) of one iteration, whole job."""
    w = model.scenario.workload
    return model.costs.model_flops_per_microbatch() * model.microbatches * w.parallelism.dp


def stage_compute_blocks(model: Model) -> dict[int, list[Block]]:
    """Compute blocks one rank of each stage runs per iteration, in program order."""
    return {s: [model.blocks[s][ins[1]] for ins in prog if ins[0] == COMPUTE]
            for s, prog in model.programs.items()}


def class_sizes(model: Model) -> np.ndarray:
    """Ranks per class."""
    return np.array([len(c) for c in model.layout.classes], dtype=np.int64)
