"""Which tensor-parallel groups no other traffic can touch (issue 14, ``tp_closed_form``).

A TP collective may be costed in closed form (``devices.fabric.Fabric.start_closed``) only when
the flow engine would give it exactly its uncontended cost, i.e. when no other transfer of the
run can share one of its links while it runs. This is a static check over every route the run
can take: the links of every pipeline send (every rank, both directions), every data-parallel,
shard and replica collective (every group, every operation, the configured algorithm) and
every TP group's collectives. ``exclusive_tp_groups`` drops the first two kinds of traffic:
the TP collectives ``workloads.optimistic`` runs ahead, taken back when such traffic comes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from workloads import collectives
from workloads.parallel import Layout


def kind_links(layout: Layout, route: Callable[[int, int], tuple[int, ...]], kind: str,
               gids: Iterable[int], mark: np.ndarray) -> None:
    """Set ``mark`` on every link a ``kind`` collective over groups ``gids`` may route over,
    for every operation (all phases of all, with the configured algorithm)."""
    groups = np.stack([layout.group_devices(kind, int(g)) for g in gids])
    if groups.shape[1] < 2:
        return
    algorithm = layout.algorithm(kind)
    seen: set[tuple[int, int]] = set()
    ids: list[int] = []
    for op in collectives.OPS:
        for ph in collectives.collective_phases(op, algorithm, groups, 1.0, layout.topo):
            for pair in zip(ph.src.tolist(), ph.dst.tolist(), strict=True):
                if pair not in seen:
                    seen.add(pair)
                    ids.extend(route(*pair))
    mark[ids] = True


def isolated_tp_groups(layout: Layout, fabric,
                       tp_groups: Callable[[int], tuple[np.ndarray, tuple[int, ...]]],
                       blocking: bool = False) -> set[tuple[int, ...]]:
    """The TP collectives (by their participating classes) that no other traffic can share a
    link with, so that the flow engine would give them exactly their uncontended cost.

    A TP group qualifies when all routes of its collectives stay off the network links of a
    switched cluster (no NIC, leaf or spine link) and none of its links is one any other
    transfer may use (on a grid: every link it routes over, e.g. a torus row closed into the
    group's ring): no pipeline send (either direction, every rank), no
    data-parallel, shard or replica collective (every group, every operation) and no other TP
    group's collective. Collectives of one group never overlap each other (a class issues its
    TP collectives one at a time: blocking, or on its FIFO TP stream). When the fabric has HBM
    ports (``memory.transfer_cap``), a port is capped only while a compute block of its
    device runs (``devices.interference.DeviceStreams.port_capacity``), so the cost is fixed
    in advance only for TP collectives that block the compute stream of every class taking
    part (``blocking``: no TP overlap); with overlapped TP and ports the set is empty.

    Args:
        layout: ranks, groups and classes of the run.
        fabric: its ``devices.fabric.Fabric`` (router, ports, network-link mask).
        tp_groups: class -> (its TP group ids, the classes taking part in its collectives).
        blocking: the TP collectives block the compute stream (``overlap.tp_comm`` off).
    """
    lay, fab = layout, fabric
    if (fab.ports and not blocking) or lay.tp < 2:
        return set()
    n = lay.topo.n_links
    other = np.zeros(n, dtype=bool)
    dev = lay.device
    route = fab.router.route
    if lay.pp > 1:
        ids: list[int] = []
        for c in range(len(lay.classes)):
            for direction in (1, -1):
                ranks, peers = lay.peer_ranks(c, direction)
                for a, b in zip(dev[ranks].tolist(), dev[peers].tolist(), strict=True):
                    ids.extend(route(a, b))
        other[ids] = True
    for kind in ("dp", "shard", "replica"):
        kind_links(lay, route, kind, range(lay.n_groups(kind)), other)
    return {parts for parts, links in exclusive_tp_groups(lay, fab, tp_groups).items()
            if not other[links].any()}


def exclusive_tp_groups(layout: Layout, fabric,
                        tp_groups: Callable[[int], tuple[np.ndarray, tuple[int, ...]]]
                        ) -> dict[tuple[int, ...], np.ndarray]:
    """The links of every TP collective (by its participating classes) whose routes use no
    link another TP collective may use and no network link of a switched cluster: with
    ``workloads.optimistic``, the collectives that may run ahead of the clock, taken back
    when other traffic reaches them. Arguments as for :func:`isolated_tp_groups`."""
    lay, fab = layout, fabric
    if lay.tp < 2:
        return {}
    n = lay.topo.n_links
    route = fab.router.route
    owner = np.full(n, -1, dtype=np.int64)  # the TP collective (index) using each link
    clash: set[int] = set()
    units: list[tuple[tuple[int, ...], np.ndarray]] = []
    done: set[tuple[int, ...]] = set()
    for c in range(len(lay.classes)):
        gids, parts = tp_groups(c)
        if parts in done:
            continue
        done.add(parts)
        mark = np.zeros(n, dtype=bool)
        kind_links(lay, route, "tp", gids, mark)
        links = np.flatnonzero(mark)
        i = len(units)
        prev = owner[links]
        clash.update(int(j) for j in np.unique(prev[prev >= 0]))
        if (prev >= 0).any():
            clash.add(i)
        owner[links] = i
        units.append((parts, links))
    return {parts: links for i, (parts, links) in enumerate(units)
            if i not in clash and len(links) and not fab.network[links].any()}


def links_shared_by_stages(layout: Layout, route: Callable[[int, int], tuple[int, ...]],
                           ends_exchange: bool = False) -> np.ndarray:
    """The links that traffic of two or more pipeline stages may use in the same phase of a
    GPipe iteration. Every forward transfer of an iteration ends before any backward one
    starts (a stage's last forward sends before the next stage's last forward begins), so
    the forward phase's traffic (each stage's sends to the next) and the backward phase's
    (its sends back to the previous) are counted apart; a stage's TP, data-parallel, shard
    and replica collectives (every group, every operation) in both, as the collectives of one
    iteration's end may meet the next iteration's start. So is, with ``ends_exchange`` (tied
    embeddings), the first and last stage's exchange of the embedding's gradient, sent at
    the iteration's end. Where this is empty, what one stage does on the network never meets
    another stage's traffic, so how far the stages' clocks drift apart changes no transfer
    (``twin.aggregate.unsteady``)."""
    pp, n = layout.pp, layout.topo.n_links
    common = np.zeros((pp, n), dtype=bool)
    sends = {d: np.zeros((pp, n), dtype=bool) for d in (1, -1)}
    dev = layout.device

    def routes_to(c: int, d: int) -> list[int]:
        ranks, peers = layout.peer_ranks(c, d)
        return [i for a, b in zip(dev[ranks].tolist(), dev[peers].tolist(), strict=True)
                for i in route(a, b)]

    for c, s in enumerate(layout.class_stage.tolist()):
        for kind in ("tp", "dp", "shard", "replica"):
            kind_links(layout, route, kind, layout.class_groups(kind, c), common[s])
        for d, mark in sends.items():
            if 0 <= s + d < pp:
                mark[s, routes_to(c, d)] = True
        if ends_exchange and pp > 1 and s in (0, pp - 1):
            common[s, routes_to(c, -1 if s == 0 else 1)] = True  # to the other end, wrapping
    shared = np.zeros(n, dtype=bool)
    for mark in sends.values():
        shared |= (common | mark).sum(axis=0) >= 2
    return np.flatnonzero(shared)
