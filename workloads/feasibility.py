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
    if w.stage_layers is None and m.layers % chunks:
        p.append(Problem("workload.parallelism.pp",
                         f"pp*virtual_stages = {chunks} must divide the {m.layers} layers "
                         f"(or give workload.stage_layers)",
                         par.pp, _divisors(m.layers)))
    p += _check_stage_layers(w)
    p += _check_sharding(w)
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


def _check_stage_layers(w: WorkloadSpec) -> list[Problem]:
    """``workload.stage_layers``: pp or pp*virtual_stages counts >= 0 summing to the layers
    (a stage or chunk may hold none: only the embedding, the output layer, or nothing)."""
    given, par, layers = w.stage_layers, w.parallelism, w.model.layers
    path = "workload.stage_layers"
    if given is None or given == "auto":
        return []
    chunks = par.pp * w.virtual_stages
    lengths = sorted({par.pp, chunks})
    allowed = " or ".join(str(n) for n in lengths)
    if len(given) not in lengths:
        return [Problem(path, f"needs {allowed} entries (pp = {par.pp}, virtual_stages = "
                        f"{w.virtual_stages}), got {len(given)}", given,
                        f"a list of {allowed} layer counts, or auto")]
    p: list[Problem] = []
    if any(n < 0 for n in given):
        p.append(Problem(path, "layer counts must be >= 0", given, "integers >= 0"))
    if sum(given) != layers:
        p.append(Problem(path, f"entries sum to {sum(given)}, the model has {layers} layers",
                         given, f"counts summing to {layers}"))
    return p


def _check_sharding(w: WorkloadSpec) -> list[Problem]:
    """``workload.sharding``: ``group`` only for hybrid_shard, where it divides dp; a changed
    ``grad_bucket_mb`` only where buckets exist (DDP, zero1, zero2: the unit strategies
    reduce-scatter each unit's gradients, so it would change neither time nor memory), and
    ``prefetch: false`` only where parameters are gathered unit by unit (the unit
    strategies)."""
    from workloads.sharding import UNIT_STRATEGIES

    sh, dp = w.sharding, w.parallelism.dp
    p: list[Problem] = []
    default = type(w).model_fields["grad_bucket_mb"].default
    if sh.strategy in UNIT_STRATEGIES and w.grad_bucket_mb != default:
        p.append(Problem("workload.grad_bucket_mb", f"with workload.sharding.strategy "
                         f"{sh.strategy} gradients are reduce-scattered unit by unit, in no "
                         "buckets", w.grad_bucket_mb, f"{default:g} (the default), or "
                         "strategy none, zero1 or zero2"))
    if sh.strategy not in UNIT_STRATEGIES and not sh.prefetch:
        p.append(Problem("workload.sharding.prefetch", f"strategy {sh.strategy} gathers no "
                         "parameters unit by unit, so there is nothing to prefetch", False,
                         "true (the default), or strategy zero3, full_shard, shard_grad_op "
                         "or hybrid_shard"))
    if sh.strategy != "hybrid_shard":
        if sh.group is not None:
            p.append(Problem("workload.sharding.group", f"only used by strategy hybrid_shard, "
                             f"not {sh.strategy}", sh.group,
                             "leave it out, or strategy: hybrid_shard"))
    elif sh.group is None:
        p.append(Problem("workload.sharding.group", "required by hybrid_shard (ranks per "
                         "shard group)", None, f"a divisor of dp = {dp}: {_divisors(dp)}"))
    elif dp % sh.group:
        p.append(Problem("workload.sharding.group", f"must divide dp = {dp}", sh.group,
                         _divisors(dp)))
    return p


def stage_memory(w: WorkloadSpec, device: DeviceSpec, split: list[int] | None = None) -> list:
    """``workloads.memory.StageMemory`` of every pipeline stage of ``w`` on ``device``
    (``split``: layers per virtual stage, default resolved from ``workload.stage_layers``); a
    workload that passed ``check_workload`` (at least one microbatch per replica)."""
    from workloads.memory import memory_per_stage
    from workloads.sharding import shard_degree
    from workloads.stages import resolve_split

    costs = TransformerCosts(w.model, w.precision, w.micro_batch, w.seq, w.parallelism.tp,
                             w.sequence_parallel, w.recompute, w.attention)
    split = split if split is not None else resolve_split(w, device)
    sh = w.sharding
    return memory_per_stage(costs, w.parallelism.pp, microbatches(w), w.schedule,
                            w.virtual_stages, w.parallelism.dp, split, sh.strategy,
                            shard_degree(sh, w.parallelism.dp), sh.prefetch,
                            w.grad_bucket_mb * 1e6, w.activation_memory)


def check_memory(w: WorkloadSpec, device: DeviceSpec) -> list[Problem]:
    """Infeasibility: the busiest pipeline stage needs more memory than the device has."""
    stages = stage_memory(w, device)
    worst = max(stages, key=lambda st: st.total)
    if worst.total <= device.hbm_bytes:
        return []
    gb = 1e9
    buffers = f", communication buffers {worst.buffers / gb:.1f}" if worst.buffers else ""
    return [Problem(
        "workload",
        f"out of HBM: stage {worst.stage} needs {worst.total / gb:.1f} GB per device "
        f"(weights {worst.weights / gb:.1f}, gradients {worst.gradients / gb:.1f}, optimizer "
        f"{worst.optimizer / gb:.1f}, activations {worst.activations / gb:.1f}{buffers}) but "
        f"{device.name} has {device.hbm_gb:.0f} GB",
        None, "more tp/pp, smaller micro_batch, recompute, sharding "
              "(workload.sharding.strategy), or a larger device")]


def _divisors(n: int, limit: int | None = None) -> str:
    ds = [d for d in range(1, (limit or n) + 1) if n % d == 0]
    return ", ".join(map(str, ds))
