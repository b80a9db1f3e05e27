"""The data path: storage reads, CPU preprocessing, a prefetch queue and the PCIe
host-to-device copy that feed every rank its microbatches (the ``data`` scenario section).

The second brief's "data loading" layer: a GPU whose input is not ready waits. Off by default
(``data.enabled: false``): nothing changes for a scenario without it.

Who needs input
---------------
The ranks of the first pipeline stage (the ones that run ``embed_fwd``; every rank when
``pp = 1``). Each of them loads its own microbatches, as a per-rank ``DataLoader`` does
(PyTorch DDP / FSDP, torchtitan: tensor-parallel peers read the same samples each for
itself). The last stage's labels come from the same samples, are ready no later than the
first stage's tokens and are needed a pipeline latency later, so they are not modelled.

One microbatch of one rank
--------------------------
A load goes through three stages in order, each a host agent of ``devices.host``:

1. read ``micro_batch x seq x bytes_per_token`` bytes from the node's storage (one FIFO server
   at ``storage_gbps``, shared by the node's loading ranks);
2. preprocess on one of the rank's ``workers`` CPU worker processes (PyTorch's
   ``num_workers``, each builds a whole microbatch) for ``micro_batch x
   preprocess_ms_per_sample``; when the node's workers (``workers x loading ranks``) outnumber
   ``host.cpu_cores`` they time-share the cores, and every job takes ``workers x loading ranks
   / cpu_cores`` times longer;
3. copy ``micro_batch x seq x h2d_bytes_per_token`` bytes to the GPU over its own PCIe port
   (``pcie_gbps``).

Reads are asynchronous (read-ahead): a worker's CPU is not held while its read is in flight,
so the three stages form a tandem line and the slowest stage sets the rate.

The prefetch queue
------------------
Per rank at most ``prefetch_batches`` microbatches are in flight or ready but not yet taken by
the compute stream (PyTorch's ``prefetch_factor`` 2 per worker by default): microbatch ``k``
starts loading when microbatch ``k - prefetch_batches`` has been consumed. The compute stream
takes microbatch ``k`` before the first forward block of that microbatch (the ``DATA``
instruction of ``workloads.schedules``); if it is not ready the stream waits, an op of kind
``data_wait``. Microbatches are numbered across iterations (``k = iteration x m + mb``): the
loader keeps working through the optimizer step.

Symmetry
--------
A node's loading ranks share its storage and CPU. Nodes whose loading ranks belong to the same
rank classes in the same numbers behave identically, so one *representative node* is simulated
for each such group (with symmetry a class stands for all ranks of a stage, so the groups are
"nodes with c loading ranks"); without symmetry every rank is its own class and every node is
simulated. A rank class takes microbatch ``k`` when it is ready on all of its ranks (the class
moves as its slowest member).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import simpy
from pydantic import Field

from devices.host import BandwidthServer, HostSpec, WorkerPool
from twin.kernel.errors import Problem
from twin.kernel.schema import NonNegativeFloat, PositiveFloat, StrictModel

if TYPE_CHECKING:  # NumPy is imported where arrays are built: the schema is read without it
    import numpy as np

#: Columns of the trace table ``data`` (one row per load of one rank's microbatch).
DATA_COLUMNS = {"node": "int32", "nodes": "int32", "cls": "int32", "rank": "int32",
                "iteration": "int32", "mb": "int32", "t_start": "float64",
                "t_read": "float64", "t_prep": "float64", "t_ready": "float64",
                "t_consumed": "float64"}
DATA_UNITS = {"t_start": "s (queue slot granted, read requested)", "t_read": "s (read done)",
              "t_prep": "s (preprocessing done)", "t_ready": "s (copy to the GPU done)",
              "t_consumed": "s (taken by the compute stream; NaN: never)",
              "nodes": "nodes this representative stands for"}


class DataSpec(StrictModel):
    """The ``data`` section: the input pipeline feeding every first-stage rank."""

    enabled: bool = Field(default=False, description="simulate the data path")
    host: HostSpec | None = Field(default=None, description="the node's CPU host (catalog "
                                  "name, base + overrides, or inline); required when enabled")
    gpus_per_node: int | None = Field(
        default=None, ge=1, description="GPUs sharing one host (default: a switched node's "
                                        "GPUs, else host.gpus); node of device d = d // this")
    storage_gbps: PositiveFloat | None = Field(
        default=None, ge=1e-6, description="storage read bandwidth per node, 1e9 B/s "
                                  "(default host.storage_read_gbps)")
    pcie_gbps: PositiveFloat | None = Field(
        default=None, ge=1e-6, description="host-to-device copy bandwidth per GPU, 1e9 B/s "
                                  "(default host.pcie_h2d_gbps)")
    workers: int = Field(default=2, ge=1, le=4096,
                         description="preprocessing workers per loading rank (Megatron-LM's "
                                     "--num-workers default)")
    preprocess_ms_per_sample: NonNegativeFloat = Field(
        default=0.0, le=1e9,
        description="CPU time to prepare one sample (sequence) on one worker, ms")
    prefetch_batches: int | None = Field(
        default=None, ge=1, le=1 << 16,
        description="microbatches per rank in flight or ready ahead of the compute stream "
                    "(default 2 x workers: PyTorch's prefetch_factor 2 per worker)")
    bytes_per_token: PositiveFloat | None = Field(
        default=None, le=1e9,
        description="bytes read from storage per token (default: the smallest integer type "
                    "holding the vocabulary, 2 or 4, as Megatron's indexed datasets store "
                    "token ids)")
    pcie_switch: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.\-]+$", max_length=200,
        description="PCIe switch the GPUs, NICs and host copies share (catalog "
                    "devices/catalog/pcie, e.g. dgx-h100); default: a port of its own per GPU")
    h2d_bytes_per_token: PositiveFloat = Field(
        default=16.0, le=1e9, description="bytes copied to the GPU per token (int64 input ids and "
                                  "labels, as torchtitan copies them)")

    def problems(self, prefix: str = "data") -> list[Problem]:
        """Cross-field checks (the host is required when the data path is on)."""
        if self.enabled and self.host is None:
            return [Problem(f"{prefix}.host", "required when data.enabled is true", None,
                            "a host catalog name (twin catalog hosts), {base: NAME, key: "
                            "value}, or an inline spec")]
        if self.pcie_switch is not None:
            from devices.pcie import pcie_catalog

            if self.pcie_switch not in pcie_catalog():
                return [Problem(f"{prefix}.pcie_switch", "unknown PCIe switch",
                                self.pcie_switch, ", ".join(pcie_catalog().names()))]
        return []

    @property
    def depth(self) -> int:
        """Prefetch queue depth per rank (microbatches)."""
        return self.prefetch_batches if self.prefetch_batches is not None else 2 * self.workers

    def node_gpus(self, topology_kind: str, shape: tuple[int, ...] | list[int]) -> int:
        """GPUs per node: ``gpus_per_node``, a switched node's GPUs, else the host's."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        if topology_kind == "switched":
            return int(shape[0])
        assert self.host is not None, "validated: the host is given when enabled"
        return self.host.gpus


@dataclass(frozen=True)
class LoadCost:
    """What one microbatch of one rank costs on the data path.

    Attributes:
        read_bytes: bytes read from storage (B).
        preprocess_s: CPU time on one worker (s).
        h2d_bytes: bytes copied host to device (B).
    """

    read_bytes: float
    preprocess_s: float
    h2d_bytes: float

    @classmethod
    def of(cls, spec: DataSpec, micro_batch: int, seq: int, vocab: int) -> LoadCost:
        """The cost of one ``micro_batch x seq`` microbatch under ``spec``."""
        tokens = micro_batch * seq
        bpt = spec.bytes_per_token
        if bpt is None:  # smallest unsigned integer type that holds every token id
            bpt = 2.0 if vocab <= 1 << 16 else 4.0
        return cls(tokens * bpt, micro_batch * spec.preprocess_ms_per_sample * 1e-3,
                   tokens * spec.h2d_bytes_per_token)


@dataclass(frozen=True)
class NodePlan:
    """A simulated node: the first node id it stands for, how many nodes it stands for and
    its loading ranks with their rank classes."""

    node: int
    nodes: int
    ranks: tuple[int, ...]
    classes: tuple[int, ...]


def plan_nodes(rank_class: np.ndarray, rank_device: np.ndarray, loading: np.ndarray,
               gpus_per_node: int) -> list[NodePlan]:
    """Representative nodes of the data path (see the module docstring).

    Args:
        rank_class: class of every rank.
        rank_device: device of every rank.
        loading: ranks that need input (first pipeline stage).
        gpus_per_node: GPUs per host; device ``d`` is on node ``d // gpus_per_node``.
    """
    by_node: dict[int, list[int]] = defaultdict(list)
    for r in sorted(int(x) for x in loading):
        by_node[int(rank_device[r]) // gpus_per_node].append(r)
    groups: dict[tuple, list[int]] = {}
    for node in sorted(by_node):
        sig = tuple(sorted(Counter(int(rank_class[r]) for r in by_node[node]).items()))
        groups.setdefault(sig, []).append(node)
    plans = []
    for nodes in groups.values():
        ranks = tuple(by_node[nodes[0]])
        plans.append(NodePlan(nodes[0], len(nodes), ranks,
                              tuple(int(rank_class[r]) for r in ranks)))
    return sorted(plans, key=lambda p: p.node)


class _Entry:
    """One loading rank of a simulated node: its workers, its PCIe port, its prefetch
    slots."""

    __slots__ = ("cls", "cpu", "node", "pcie", "prep_s", "rank", "slots")

    def __init__(self, node: int, rank: int, cls: int, cpu: WorkerPool, prep_s: float,
                 pcie: Any):
        self.node, self.rank, self.cls = node, rank, cls
        self.cpu, self.prep_s, self.pcie = cpu, prep_s, pcie
        self.slots: simpy.Container | None = None


class DataPath:
    """SimPy agents of the data path of a run (see the module docstring).

    Args:
        env: SimPy environment.
        plans: simulated nodes (:func:`plan_nodes`).
        cost: cost of one microbatch of one rank.
        storage_bps: storage read bandwidth per node (B/s).
        pcie_bps: host-to-device bandwidth per GPU (B/s).
        workers: preprocessing workers per loading rank.
        cpu_cores: CPU cores per host (caps the workers of a node).
        depth: prefetch queue depth per rank (microbatches).
        microbatches: microbatches per iteration and rank.
        iterations: iterations of the run.
        record: keep one row per load for the trace table ``data``.
        gpus_per_node: GPUs per host (reported).
        pcie_port: ``pcie_port(rank)`` -> the rank's host-to-device port, any object with a
            ``transfer(nbytes)`` process body (e.g. a PCIe-switch agent shared with NICs; its
            ``bytes_per_s`` and ``busy_s``, if it has them, go into the report);
            default: a ``devices.host.BandwidthServer`` of its own at ``pcie_bps``.
        on_copied: ``on_copied(cls, t0, t1, nbytes)`` after every host-to-device copy from
            ``t0`` to ``t1`` (s) of a simulated rank of class ``cls``; ``nbytes`` is the HBM
            bytes it stands for per device of the class (the rank stands for one rank on
            each of its plan's nodes: the copy's bytes x those nodes / the class's loading
            devices), or None.
    """

    def __init__(self, env: simpy.Environment, plans: list[NodePlan], cost: LoadCost, *,
                 storage_bps: float, pcie_bps: float, workers: int, cpu_cores: int, depth: int,
                 microbatches: int, iterations: int, record: bool = False,
                 gpus_per_node: int = 0, pcie_port: Callable[[int], Any] | None = None,
                 on_copied: Callable[[int, float, float, float], None] | None = None):
        self.env = env
        self.gpus_per_node = gpus_per_node
        self.plans = plans
        self.cost = cost
        self.depth = int(depth)
        self.m = int(microbatches)
        self.total = self.m * int(iterations)
        self.storage = [BandwidthServer(env, storage_bps) for _ in plans]
        self.entries: list[_Entry] = []
        if pcie_port is None:
            def pcie_port(_rank: int) -> BandwidthServer:
                return BandwidthServer(env, pcie_bps)
        for i, p in enumerate(plans):
            share = max(1.0, workers * len(p.ranks) / cpu_cores)  # oversubscribed cores
            for r, c in zip(p.ranks, p.classes, strict=True):
                self.entries.append(_Entry(i, r, c, WorkerPool(env, workers),
                                           cost.preprocess_s * share,
                                           pcie_port(r)))
        self._of_class: dict[int, list[_Entry]] = defaultdict(list)
        for e in self.entries:
            self._of_class[e.cls].append(e)
        self.on_copied = on_copied
        # devices of each class that load (a simulated rank of a plan stands for its nodes)
        loading: dict[int, int] = defaultdict(int)
        for e in self.entries:
            loading[e.cls] += plans[e.node].nodes
        self._loading = dict(loading)
        self.rows: list[list] | None = [] if record else None
        self._row_of: dict[tuple[int, int], int] = {}
        self._live: set[simpy.Process] = set()
        self._start(0)

    # ----------------------------------------------------------------- the compute stream
    def ready(self, cls: int, iteration: int, mb: int) -> simpy.Event:
        """Event that fires when microbatch ``mb`` of ``iteration`` is on every GPU of
        ``cls``."""
        key = (cls, iteration * self.m + mb)
        ev = self._ready.get(key)
        if ev is None:
            ev = self._ready[key] = self.env.event()
        return ev

    def consumed(self, cls: int, iteration: int, mb: int) -> None:
        """The compute stream of ``cls`` took the microbatch: its queue slots are free."""
        k = iteration * self.m + mb
        self._ready.pop((cls, k), None)
        now = self.env.now
        for e in self._of_class[cls]:
            e.slots.put(1)
            if self.rows is not None:
                i = self._row_of.pop((id(e), k), None)
                if i is not None:
                    self.rows[i][10] = now

    # ----------------------------------------------------------------- job control
    def abort(self) -> None:
        """Stop loading (the job failed): interrupt every load and feeder."""
        for proc in list(self._live):
            if proc.is_alive:
                proc.interrupt("job aborted")
        self._live.clear()

    def restart(self, start_iteration: int) -> None:
        """Start over with empty queues at the first microbatch of ``start_iteration``."""
        self._start(start_iteration * self.m)

    def _start(self, k0: int) -> None:
        self._ready: dict[tuple[int, int], simpy.Event] = {}
        self._arrived: dict[tuple[int, int], int] = defaultdict(int)
        self._row_of = {}
        for e in self.entries:
            e.slots = simpy.Container(self.env, capacity=self.depth, init=self.depth)
            self._spawn(self._feeder(e, k0))

    def _spawn(self, gen) -> None:
        proc = self.env.process(self._guarded(gen))
        self._live.add(proc)
        proc.callbacks.append(lambda _e, p=proc: self._live.discard(p))

    @staticmethod
    def _guarded(gen):
        try:
            yield from gen
        except simpy.Interrupt:
            return

    # ----------------------------------------------------------------- the loader
    def _feeder(self, e: _Entry, k0: int):
        slots = e.slots
        for k in range(k0, self.total):
            yield slots.get(1)
            self._spawn(self._load(e, k))

    def _load(self, e: _Entry, k: int):
        env, cost = self.env, self.cost
        t0 = env.now
        yield from self.storage[e.node].transfer(cost.read_bytes)
        t1 = env.now
        yield from e.cpu.work(e.prep_s)
        t2 = env.now
        yield from e.pcie.transfer(cost.h2d_bytes)
        t3 = env.now
        if self.on_copied is not None:
            share = self.plans[e.node].nodes / self._loading[e.cls]  # its copies per device
            self.on_copied(e.cls, t2, t3, cost.h2d_bytes * share)
        if self.rows is not None:
            p = self.plans[e.node]
            self._row_of[(id(e), k)] = len(self.rows)
            self.rows.append([p.node, p.nodes, e.cls, e.rank, k // self.m, k % self.m,
                              t0, t1, t2, t3, math.nan])
        key = (e.cls, k)
        self._arrived[key] += 1
        if self._arrived[key] == len(self._of_class[e.cls]):
            del self._arrived[key]
            ev = self._ready.get(key)
            if ev is None:
                ev = self._ready[key] = env.event()
            ev.succeed()

    # ----------------------------------------------------------------- results
    def table(self) -> dict[str, np.ndarray]:
        """Columns of the trace table ``data`` (empty unless ``record``)."""
        import numpy as np

        rows = self.rows or []
        cols = list(DATA_COLUMNS)
        if not rows:
            return {c: np.empty(0) for c in cols}
        arr = list(zip(*rows, strict=True))
        return {c: np.asarray(v) for c, v in zip(cols, arr, strict=True)}

    def report(self, makespan: float) -> dict:
        """Summary details: sizes, per-rank rate limits of each stage on the busiest node,
        measured utilizations (busiest simulated node) and the most utilized stage."""
        cost = self.cost
        busiest = max(range(len(self.plans)), key=lambda i: len(self.plans[i].ranks))
        c = len(self.plans[busiest].ranks)
        e = next(x for x in self.entries if x.node == busiest)
        limits = {
            "storage": self.storage[busiest].bytes_per_s / (c * cost.read_bytes),
            "cpu": e.cpu.servers / e.prep_s if e.prep_s > 0 else math.inf,
            "pcie": getattr(e.pcie, "bytes_per_s", math.nan) / cost.h2d_bytes,
        }
        span = makespan if makespan > 0 else 1.0
        util = {
            "storage": max(s.busy_s for s in self.storage) / span,
            "cpu": max(x.cpu.busy_s / x.cpu.servers for x in self.entries) / span,
            "pcie": max(getattr(x.pcie, "busy_s", math.nan) for x in self.entries) / span,
        }
        return {
            "gpus_per_node": self.gpus_per_node,
            "nodes": int(sum(p.nodes for p in self.plans)),
            "simulated_nodes": len(self.plans),
            "loading_ranks_per_node_max": c,
            "prefetch_batches": self.depth,
            "cpu_workers_per_node": e.cpu.servers * c,
            "read_bytes_per_microbatch": cost.read_bytes,
            "preprocess_s_per_microbatch": cost.preprocess_s,
            "h2d_bytes_per_microbatch": cost.h2d_bytes,
            "rate_limit_microbatches_per_s": limits,
            "utilization": util,
            "bottleneck": max(util, key=util.get),
        }


def build_data_path(env: simpy.Environment, spec: DataSpec, layout, topology_kind: str,
                    shape, micro_batch: int, seq: int, vocab: int, microbatches: int,
                    iterations: int, record: bool = False,
                    pcie_port: Callable[[int], Any] | None = None,
                    on_copied: Callable[[int, float, float, float], None] | None = None
                    ) -> DataPath:
    """The run's data path (``spec.enabled`` must be true).

    Args:
        layout: the job's ``workloads.parallel.Layout``.
        topology_kind, shape: the cluster topology (a switched node sets the GPUs per node).
        micro_batch, seq, vocab: microbatch size (sequences), tokens per sequence, vocabulary.
        microbatches, iterations: microbatches per iteration and rank, iterations.
        record: keep the rows of the trace table ``data``.
        pcie_port: ``pcie_port(rank)`` -> the rank's host-to-device port (see
            :class:`DataPath`), e.g. a ``devices.pcie.CopyPort``.
        on_copied: called after every copy (see :class:`DataPath`), or None.
    """
    import numpy as np

    host = spec.host
    assert host is not None, "validated: the host is given when enabled"
    g = spec.node_gpus(topology_kind, shape)
    ranks = np.arange(layout.world)
    _, stage, _ = layout.coords(ranks)
    plans = plan_nodes(layout.rank_class, layout.device, ranks[stage == 0], g)
    storage = (spec.storage_gbps or host.storage_read_gbps) * 1e9
    pcie = (spec.pcie_gbps or host.pcie_h2d_gbps) * 1e9
    path = DataPath(env, plans, LoadCost.of(spec, micro_batch, seq, vocab),
                    storage_bps=storage, pcie_bps=pcie, workers=spec.workers,
                    cpu_cores=host.cpu_cores, depth=spec.depth, microbatches=microbatches,
                    iterations=iterations, record=record, gpus_per_node=g,
                    pcie_port=pcie_port, on_copied=on_copied)
    return path
