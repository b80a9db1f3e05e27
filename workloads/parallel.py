"""The parallel layout of a job: ranks, their devices, process groups and rank classes.

Rank ``r`` has coordinates ``(d, p, t)`` = (data-parallel replica, pipeline stage,
tensor-parallel index) with ``r = (d * pp + p) * tp + t``.

Group kinds: ``tp`` (same ``d, p``), ``dp`` (same ``p, t``), and for sharded data parallelism
``shard`` (the ``shard`` consecutive data-parallel indices ``d`` that split the model states
between them; the whole ``dp`` group unless hybrid sharding) and ``replica`` (the ranks of
equal ``d mod shard`` across the shard groups of one ``dp`` group, which all-reduce their
gradient shards).

A *rank class* is a set of ranks the engine simulates as one agent because they execute the
same program at the same times: with symmetry on, all ranks of a pipeline stage form one class
(their compute is identical; their traffic is still sent for every member, so link contention
is exact under the symmetry assumption); with symmetry off every rank is its own class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from topologies.base import Topology
from topologies.placement import place, ring_order


@dataclass
class Layout:
    """Ranks, devices and groups of a ``dp x pp x tp`` job on a topology."""

    topo: Topology
    dp: int
    pp: int
    tp: int
    placement: str = "snake"
    symmetric: bool = True
    algorithms: dict[str, str] | None = None  # collective algorithm per group kind (tp, dp)
    shard: int | None = None  # ranks of a shard group (sharded data parallelism; default dp)
    protocols: str = "nccl"   # collective protocol model (workloads.nccl) or "links"
    tp_groups: bool = False   # without symmetry: one class per tensor-parallel group
    # with tp_groups: devices whose pipeline stage is split into one class per rank (the
    # targets of faults that change a device: its group's members no longer run alike, and
    # the data-parallel groups it shares with the stage's other groups keep their own times)
    solo_devices: tuple[int, ...] = ()
    device: np.ndarray = field(init=False)      # device of each rank
    rank_class: np.ndarray = field(init=False)  # class of each rank
    classes: list[np.ndarray] = field(init=False)  # ranks of each class
    class_stage: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.device = place(self.topo, self.dp, self.pp, self.tp, self.placement)
        world = self.world
        r = np.arange(world)
        stage = (r // self.tp) % self.pp
        if self.symmetric:
            self.rank_class = stage.copy()
        elif self.tp_groups:  # ranks (d, p, 0..tp-1) are consecutive
            on_solo = np.isin(self.device, np.asarray(self.solo_devices, dtype=np.int64))
            split = np.isin(stage, stage[on_solo])
            # a class per TP group, and per rank of a split stage, in rank order
            joins = ~split & (r % self.tp != 0)  # ranks that join their group's class
            self.rank_class = np.cumsum(~joins) - 1
        else:
            self.rank_class = r.copy()
        n_cls = int(self.rank_class.max()) + 1
        self.classes = [np.flatnonzero(self.rank_class == c) for c in range(n_cls)]
        self.class_stage = np.array([stage[c[0]] for c in self.classes], dtype=np.int64)
        self._ring_cache: dict[tuple[str, int], np.ndarray] = {}

    @property
    def world(self) -> int:
        """Number of ranks."""
        return self.dp * self.pp * self.tp

    def coords(self, rank: int | np.ndarray) -> tuple:
        """(d, p, t) of rank(s)."""
        r = np.asarray(rank)
        return r // (self.pp * self.tp), (r // self.tp) % self.pp, r % self.tp

    def rank(self, d, p, t):
        """Rank of coordinates (d, p, t) (arrays broadcast)."""
        return (np.asarray(d) * self.pp + np.asarray(p)) * self.tp + np.asarray(t)

    # ----------------------------------------------------------------- groups
    @property
    def shard_size(self) -> int:
        """Ranks of a ``shard`` group."""
        return self.shard or self.dp

    def group_id(self, kind: str, ranks: np.ndarray) -> np.ndarray:
        """Id of the ``kind`` group (``tp``, ``dp``, ``shard``, ``replica``) of each rank."""
        d, p, t = self.coords(ranks)
        if kind == "tp":
            return d * self.pp + p
        if kind == "dp":
            return p * self.tp + t
        g = self.shard_size
        if kind == "shard":
            return (p * self.tp + t) * (self.dp // g) + d // g
        if kind == "replica":
            return (p * self.tp + t) * g + d % g
        raise ValueError(kind)

    def group_ranks(self, kind: str, gid: int) -> np.ndarray:
        """Ranks of group ``gid`` of ``kind``."""
        if kind == "tp":
            d, p = divmod(int(gid), self.pp)
            return self.rank(d, p, np.arange(self.tp))
        if kind == "dp":
            p, t = divmod(int(gid), self.tp)
            return self.rank(np.arange(self.dp), p, t)
        g = self.shard_size
        if kind == "shard":
            pt, k = divmod(int(gid), self.dp // g)
            p, t = divmod(pt, self.tp)
            return self.rank(np.arange(k * g, (k + 1) * g), p, t)
        if kind == "replica":
            pt, j = divmod(int(gid), g)
            p, t = divmod(pt, self.tp)
            return self.rank(np.arange(j, self.dp, g), p, t)
        raise ValueError(kind)

    def group_devices(self, kind: str, gid: int) -> np.ndarray:
        """Devices of a group, in ring order (cached)."""
        key = (kind, int(gid))
        ring = self._ring_cache.get(key)
        if ring is None:
            ring = ring_order(self.topo, self.device[self.group_ranks(kind, gid)],
                              lattice=self.placement == "lattice")
            self._ring_cache[key] = ring
        return ring

    def algorithm(self, kind: str) -> str:
        """Collective algorithm configured for ``kind`` groups (``auto`` when not given;
        ``shard`` and ``replica`` groups use the data-parallel one)."""
        kind = "dp" if kind in ("shard", "replica") else kind
        return (self.algorithms or {}).get(kind, "auto")

    def n_groups(self, kind: str) -> int:
        """Number of ``kind`` groups."""
        if kind == "shard":
            return self.pp * self.tp * (self.dp // self.shard_size)
        if kind == "replica":
            return self.pp * self.tp * self.shard_size
        return self.dp * self.pp if kind == "tp" else self.pp * self.tp

    def all_group_devices(self, kind: str) -> np.ndarray:
        """``[group, member]`` devices of every ``kind`` group, members in ring order."""
        return np.stack([self.group_devices(kind, g) for g in range(self.n_groups(kind))])

    def class_groups(self, kind: str, cls: int) -> np.ndarray:
        """Distinct ``kind`` groups touched by the ranks of class ``cls``."""
        return np.unique(self.group_id(kind, self.classes[cls]))

    def group_classes(self, kind: str, gids: np.ndarray) -> np.ndarray:
        """Classes of all ranks of the given groups."""
        ranks = np.concatenate([self.group_ranks(kind, g) for g in gids])
        return np.unique(self.rank_class[ranks])

    def peer_ranks(self, cls: int, direction: int) -> tuple[np.ndarray, np.ndarray]:
        """(ranks of class, their pipeline neighbours ``direction`` = +1 next / -1 previous),
        wrapping around the pipeline (the interleaved schedule sends stage pp-1 -> 0)."""
        ranks = self.classes[cls]
        d, p, t = self.coords(ranks)
        return ranks, self.rank(d, (p + direction) % self.pp, t)

    def hops_per_group(self, router) -> dict[str, float]:
        """Mean route hops per ring edge of tp and dp groups, and between pipeline neighbours.

        A ring edge is a (sender, receiver) pair of the group's collective algorithm: the
        ring's neighbours for ``ring`` / ``bidir_ring``, the row and column rings for
        ``torus2d`` / ``hierarchical``.
        """
        from workloads.collectives import pairs  # lazy: the fabric comes with it

        out = {}
        for kind in ("tp", "dp"):
            groups = self.all_group_devices(kind)
            edges = pairs(self.algorithm(kind), groups, self.topo)
            hops = [router.hops(int(a), int(b)) for a, b in edges]
            out[kind] = float(np.mean(hops)) if hops else 0.0
        if self.pp > 1:
            r = np.arange(self.world)
            d, p, t = self.coords(r)
            m = p < self.pp - 1
            nxt = self.rank(d[m], p[m] + 1, t[m])
            out["pp"] = float(np.mean([router.hops(int(a), int(b)) for a, b in
                                       zip(self.device[r[m]], self.device[nxt], strict=True)]))
        else:
            out["pp"] = 0.0
        return out
