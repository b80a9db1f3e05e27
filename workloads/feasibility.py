"""Rules a workload must satisfy (divisibility of the parallel layout, batch arithmetic)."""

from __future__ import annotations

from devices.spec import DeviceSpec
from twin.kernel.errors import Problem
from workloads.spec import WorkloadSpec
from workloads.transformer import TransformerCosts


def microbatches(w: WorkloadSpec) -> int:
    """Microbatches per iteration per data-parallel replica (gradient accumulation steps)."""
    return w.global_batch // (w.parallelism.dp * w.micro_batch)


def check_workload(w: WorkloadSpec) -> list[Problem]:
    """Problems with a workload's batch and parallel layout (empty when fine)."""
    p: list[Problem] = []
    par, m = w.parallelism, w.model
    if w.global_batch % (par.dp * w.micro_batch):
        p.append(Problem("workload.global_batch",
                         f"must be a multiple of dp*micro_batch = {par.dp}*{w.micro_batch}",
                         w.global_batch, f"multiples of {par.dp * w.micro_batch}"))
    if m.heads % par.tp:
        p.append(Problem("workload.parallelism.tp", f"must divide the {m.heads} attention heads",
                         par.tp, _divisors(m.heads)))
    if m.n_kv_heads % par.tp and par.tp % m.n_kv_heads:
        p.append(Problem("workload.parallelism.tp",
                         f"must divide or be a multiple of the {m.n_kv_heads} key/value heads",
                         par.tp))
    if m.ffn % par.tp:
        p.append(Problem("workload.parallelism.tp", f"must divide the MLP width {m.ffn}",
                         par.tp, _divisors(m.ffn, limit=64)))
    chunks = par.pp * w.virtual_stages
    if m.layers % chunks:
        p.append(Problem("workload.parallelism.pp",
                         f"pp*virtual_stages = {chunks} must divide the {m.layers} layers",
                         par.pp, _divisors(m.layers)))
    if w.virtual_stages > 1 and w.schedule != "interleaved":
        p.append(Problem("workload.virtual_stages", "only the interleaved schedule uses "
                         "virtual stages", w.virtual_stages, "1, or set schedule: interleaved"))
    if w.schedule == "interleaved":
        if w.virtual_stages < 2:
            p.append(Problem("workload.virtual_stages", "the interleaved schedule needs >= 2",
                             w.virtual_stages, "an integer >= 2"))
        if par.pp < 2:
            p.append(Problem("workload.schedule", "interleaving needs pp >= 2", w.schedule,
                             "gpipe, 1f1b"))
        elif microbatches(w) % par.pp:
            p.append(Problem("workload.global_batch",
                             f"the interleaved schedule needs a multiple of pp = {par.pp} "
                             f"microbatches per replica, got {microbatches(w)}",
                             w.global_batch))
    return p


def check_memory(w: WorkloadSpec, device: DeviceSpec) -> list[Problem]:
    """Infeasibility: the busiest pipeline stage needs more memory than the device has."""
    from workloads.memory import memory_per_stage

    costs = TransformerCosts(w.model, w.precision, w.micro_batch, w.seq, w.parallelism.tp,
                             w.sequence_parallel, w.recompute, w.attention)
    stages = memory_per_stage(costs, w.parallelism.pp, max(microbatches(w), 1), w.schedule,
                              w.virtual_stages, w.parallelism.dp)
    worst = max(stages, key=lambda st: st.total)
    if worst.total <= device.hbm_bytes:
        return []
    gb = 1e9
    return [Problem(
        "workload",
        f"out of HBM: stage {worst.stage} needs {worst.total / gb:.1f} GB per device "
        f"(weights {worst.weights / gb:.1f}, gradients {worst.gradients / gb:.1f}, optimizer "
        f"{worst.optimizer / gb:.1f}, activations {worst.activations / gb:.1f}) but "
        f"{device.name} has {device.hbm_gb:.0f} GB",
        None, "more tp/pp, smaller micro_batch, recompute, or a larger device")]


def _divisors(n: int, limit: int | None = None) -> str:
    ds = [d for d in range(1, (limit or n) + 1) if n % d == 0]
    return ", ".join(map(str, ds))
