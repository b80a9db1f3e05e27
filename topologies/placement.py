"""Placing ranks on devices, and ordering rings over groups of devices.

A parallel job has ``dp * pp * tp`` ranks; rank ``r`` has coordinates
``(d, p, t) = (r // (pp*tp), (r // tp) % pp, r % tp)`` (tensor-parallel index fastest).
A placement policy maps ranks to device ids: rank ``r`` goes to ``order[r]`` where

* ``snake`` (default) keeps each tensor-parallel group on neighbouring devices:
  - grids (``torus2d``, ``mesh2d``, ``torus3d``, ``ring``): the grid is tiled with blocks of
    ``tp`` devices (sub-rectangles whose sides divide the grid's); a TP group takes a block,
    its devices in the block's own snake-cycle order (a 2x2 or 2x4 block, or a whole row of
    a torus, is a ring of 1-hop edges), and consecutive groups (pipeline stages, then
    replicas) take the blocks in the order of a walk through the block grid: its snake cycle,
    x fastest, or the last dimension fastest. Among all block shapes and walks the twin takes
    the one with (1) the fewest hops on the worst TP ring edge, then (2) the least load on the
    busiest directed link when every TP ring edge, DP ring edge and pipeline edge carries one
    message (dimension-order routes), then (3) the fewest hops in total. With ``tp = 1`` this
    is the Hamiltonian snake through the whole grid where one exists (one side even); when
    ``tp`` does not factor into divisors of the sides, ranks follow the whole-grid snake;
  - ``switched``: node by node, GPUs in ascending order (rank ``r`` on device ``r``), so TP
    groups of a size dividing the node stay inside it and the members of a DP group sit on
    the same GPU index (the same rail) of every node;
  - ``dragonfly2d``: group by group; inside group ``g`` the device holding the global link
    from group ``g-1`` first and the one holding the link to group ``g+1`` last, so a ring
    over all devices crosses each group boundary on a global link.
* ``row-major``: rank ``r`` on device ``r`` (x fastest); groups wrap across rows.
* ``spread``: rank ``(d, p, t)`` on device ``t * dp * pp + d * pp + p``: tensor-parallel
  peers are ``n / tp`` device ids apart (in other rows of a grid, other nodes of a switched
  cluster): a deliberately bad baseline.

* ``lattice``: ``snake``'s tilings, scored with the data-parallel rings in the order the
  collectives run them under this policy (``ring_order`` with ``lattice``), and rings of
  groups that fill a lattice of the grid go along that lattice's snake cycle (other kinds:
  as ``snake``). GPT-3 175B (tp 8, pp 8, dp 64) on a 64x64 torus: ``snake`` puts data-parallel
  peers 17 hops apart per ring edge, ``lattice`` 5.1. Not the default: its rings are not
  invariant under a replica shift, so rank-symmetric runs lose the replica quotient
  (``devices.replicas``) and run several times longer, and which tiling is faster in the end
  depends on the routes (the one-message-per-edge score is a proxy; on a 48x48 torus it picks
  the transpose of ``snake``'s tiling, 8% slower under x-then-y routes).

``ring_order`` orders a group of devices into a ring: the better (fewest hops on the worst ring
edge, then fewest in total) of the order given (rank order) and the order along
:func:`ring_walk` (the whole-grid snake); with ``lattice`` also, on grids, the snake cycle of
the group's own lattice when its members fill one (every combination of their coordinate
values: every second column of rows 0 and 32 of a 64x64 torus goes along the rows, 2 hops per
edge, instead of zig-zagging 34).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

import numpy as np

from topologies.base import Topology
from topologies.graph import dragonfly_port_device

PLACEMENTS = ("snake", "row-major", "spread", "lattice")

GRID_KINDS = ("torus2d", "mesh2d", "torus3d", "ring")


def snake_cycle(nx_: int, ny: int) -> list[tuple[int, int]]:
    """Visit every cell of an ``nx_ x ny`` grid once, each step to a neighbour.

    When a Hamiltonian cycle exists on the mesh (both sides >= 2 and one of them even) the
    last cell is also a neighbour of the first. Otherwise the order is a boustrophedon path
    and closing the ring costs extra hops.
    """
    if nx_ >= 2 and ny >= 2 and (ny % 2 == 0 or nx_ % 2 == 0):
        transpose = ny % 2 != 0  # need an even number of rows
        a, b = (ny, nx_) if transpose else (nx_, ny)
        cells = [(0, 0)]
        for y in range(b):
            xs = range(1, a) if y % 2 == 0 else range(a - 1, 0, -1)
            cells.extend((x, y) for x in xs)
        cells.extend((0, y) for y in range(b - 1, 0, -1))
        return [(y, x) for x, y in cells] if transpose else cells
    cells = []
    for y in range(ny):
        xs = range(nx_) if y % 2 == 0 else range(nx_ - 1, -1, -1)
        cells.extend((x, y) for x in xs)
    return cells


def boustrophedon(dims: Sequence[int]) -> list[tuple[int, ...]]:
    """A Hamiltonian path through an n-D grid: consecutive cells differ by one step."""
    if len(dims) == 1:
        return [(i,) for i in range(dims[0])]
    sub = boustrophedon(dims[:-1])
    out: list[tuple[int, ...]] = []
    for z in range(dims[-1]):
        out.extend((*c, z) for c in (sub if z % 2 == 0 else sub[::-1]))
    return out


def grid_cycle(dims: Sequence[int]) -> list[tuple[int, ...]]:
    """Cells of an n-D grid in snake-cycle order (a Hamiltonian cycle where one exists).

    The first dimension is snaked against a boustrophedon path through the others (for 2-D
    grids this is :func:`snake_cycle`).
    """
    dims = [int(d) for d in dims]
    if len(dims) == 1:
        return [(i,) for i in range(dims[0])]
    rows = boustrophedon(dims[1:])
    return [(i, *rows[j]) for i, j in snake_cycle(dims[0], len(rows))]


def _ids(topo: Topology, cells) -> np.ndarray:
    """Device ids of grid cells (a sequence of coordinate tuples or an (m, ndim) array)."""
    dims = topo.dims or ()
    strides = np.cumprod((1, *dims[:-1]))
    arr = np.asarray(cells, dtype=np.int64).reshape(-1, len(dims))
    return arr @ strides


def grid_distance(dims: Sequence[int], wrap: bool, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dimension-order hops between coordinates ``a`` and ``b`` (rows of arrays)."""
    d = np.abs(np.asarray(a) - np.asarray(b))
    if wrap:
        d = np.minimum(d, np.asarray(dims) - d)
    return d.sum(axis=-1)


def _blocks(dims: Sequence[int], tp: int) -> list[tuple[int, ...]]:
    """Block sides ``b`` with ``b_k | dims_k`` and ``prod(b) = tp``."""
    return [sh for sh in product(*[[f for f in range(1, s + 1) if s % f == 0] for s in dims])
            if int(np.prod(sh)) == tp]


def _outer_orders(outer: Sequence[int]) -> list[list[tuple[int, ...]]]:
    """Ways to visit the block grid: its snake cycle, x fastest, last dimension fastest."""
    cells = list(product(*[range(q) for q in outer]))          # last dimension fastest
    x_fast = sorted(cells, key=lambda c: c[::-1])
    out = [grid_cycle(outer), x_fast, cells]
    uniq: list[list[tuple[int, ...]]] = []
    for o in out:
        if o not in uniq:
            uniq.append(o)
    return uniq


def dor_link_load(dims: Sequence[int], wrap: bool, a: np.ndarray,
                  b: np.ndarray) -> tuple[int, int]:
    """Busiest directed link and total hops when every pair ``a[i] -> b[i]`` (coordinates)
    sends one message along its dimension-order route (the router's, closed form)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    ndim = len(dims)
    strides = np.cumprod((1, *dims[:-1]))
    cur = a.copy()
    keys = []
    for k, size in enumerate(dims):
        delta = b[:, k] - cur[:, k]
        if wrap:
            fwd = delta % size
            go_fwd = fwd <= size - fwd
            cnt = np.where(go_fwd, fwd, size - fwd)
            step = np.where(go_fwd, 1, -1)
        else:
            cnt = np.abs(delta)
            step = np.sign(delta)
        total = int(cnt.sum())
        if total:
            idx = np.repeat(np.arange(len(a)), cnt)
            j = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            pos = (cur[idx, k] + step[idx] * j) % size
            node = (cur[idx] @ strides) + (pos - cur[idx, k]) * strides[k]
            keys.append(node * 2 * ndim + 2 * k + (step[idx] > 0))
        cur[:, k] = b[:, k]
    if not keys:
        return 0, 0
    allk = np.concatenate(keys)
    return int(np.bincount(allk).max()), len(allk)


def _ring_edges(order: np.ndarray, dp: int, pp: int, tp: int, topo: Topology,
                lattice: bool) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(sender device, receiver device) of the TP rings, DP rings and pipeline sends when
    rank ``r`` is on ``order[r]``; the DP rings in rank order, or (``lattice``) in the order
    :func:`ring_orders` gives them under the ``lattice`` policy."""
    r = np.arange(dp * pp * tp).reshape(dp, pp, tp)
    none = (r[:0].ravel(),) * 2
    tp_e = (r.ravel(), np.roll(r, -1, axis=2).ravel()) if tp > 1 else none
    pp_e = (r[:, :-1].ravel(), r[:, 1:].ravel())
    out = {"tp": (order[tp_e[0]], order[tp_e[1]])}
    if dp > 1 and not lattice:
        out["dp"] = (order[r.ravel()], order[np.roll(r, -1, axis=0).ravel()])
    elif dp > 1:
        rings = ring_orders(topo, order[r.reshape(dp, pp * tp).T], lattice=True)
        out["dp"] = (rings.ravel(), np.roll(rings, -1, axis=1).ravel())
    else:
        out["dp"] = none
    out["pp"] = (order[pp_e[0]], order[pp_e[1]])
    return out


def _grid_order(topo: Topology, dp: int, pp: int, tp: int, lattice: bool = False
                ) -> np.ndarray:
    """The ``snake`` placement on a grid: the best tiling of tp-blocks (see module docs).

    Candidates: every block shape whose sides divide the grid's, visited along the block
    grid's snake cycle, x fastest or the last dimension fastest, devices inside a block along
    the block's own snake cycle. Score (lowest wins): worst TP ring edge (hops), busiest
    directed link when every TP ring, DP ring (in rank order; ``lattice``: in its ring order)
    and pipeline edge sends one message, total hops, then the order of generation (wider
    blocks, snake first).
    """
    dims = tuple(topo.dims or ())
    best, best_key = None, None
    for block in _blocks(dims, tp) or [None]:
        if block is None:
            orders = [_ids(topo, grid_cycle(dims))]
        else:
            outer = [d // b for d, b in zip(dims, block, strict=True)]
            inner = np.array(grid_cycle(block), dtype=np.int64)
            orders = [_ids(topo, np.array(oo, dtype=np.int64)[:, None, :] * np.array(block)
                           + inner[None, :, :])
                      for oo in _outer_orders(outer)]
        c = topo.coords
        for order in orders:
            edges = _ring_edges(order, dp, pp, tp, topo, lattice)
            src = np.concatenate([e[0] for e in edges.values()])
            dst = np.concatenate([e[1] for e in edges.values()])
            load, total = dor_link_load(dims, topo.wrap, c[src], c[dst])
            tp_hops = grid_distance(dims, topo.wrap, c[edges["tp"][0]], c[edges["tp"][1]])
            key = (int(tp_hops.max(initial=0)), load, total)
            if best_key is None or key < best_key:
                best, best_key = order, key
    return best


def _switched_order(topo: Topology) -> np.ndarray:
    gpn, nodes = topo.fat_tree.gpus_per_node, topo.fat_tree.nodes
    out = []
    for k in range(nodes):
        gs = range(gpn) if k % 2 == 0 else range(gpn - 1, -1, -1)
        out.extend(g + gpn * k for g in gs)
    return np.array(out, dtype=np.int64)


def _dragonfly_order(topo: Topology) -> np.ndarray:
    a, groups = topo.info["group_size"], topo.info["groups"]
    out: list[int] = []
    for g in range(groups):
        if groups == 1:
            local = list(range(a))
        else:
            entry = dragonfly_port_device(g, (g - 1) % groups, a)
            exit_ = dragonfly_port_device(g, (g + 1) % groups, a)
            mid = [i for i in range(a) if i not in (entry, exit_)]
            local = [entry, *mid] + ([exit_] if exit_ != entry else [])
        out.extend(i + a * g for i in local)
    return np.array(out, dtype=np.int64)


def device_order(topo: Topology, tp: int = 1, pp: int = 1) -> np.ndarray:
    """Devices in the order the ``snake`` placement fills them (rank ``r`` on ``order[r]``)
    for ``tp``-way tensor and ``pp``-way pipeline parallelism (see module docstring)."""
    if topo.kind in GRID_KINDS:
        return _grid_order(topo, topo.n_devices // (tp * pp), pp, tp)
    if topo.kind == "dragonfly2d":
        return _dragonfly_order(topo)
    return np.arange(topo.n_devices, dtype=np.int64)  # switched: node by node


def ring_walk(topo: Topology) -> np.ndarray:
    """Every device once, consecutive devices close: the walk :func:`ring_order` sorts by.

    Grids: the whole-grid snake cycle; ``switched``: node by node, GPUs ascending in even and
    descending in odd nodes (consecutive nodes meet on the same rail); ``dragonfly2d``: the
    group-by-group order of the ``snake`` placement.
    """
    if topo.kind == "switched":
        return _switched_order(topo)
    if topo.kind in GRID_KINDS:
        return _ids(topo, grid_cycle(topo.dims or ()))
    return device_order(topo)


def place(topo: Topology, dp: int, pp: int, tp: int, policy: str = "snake") -> np.ndarray:
    """Device id of every rank (array of length dp*pp*tp)."""
    n = dp * pp * tp
    if n != topo.n_devices:
        raise ValueError(f"dp*pp*tp = {n} but the topology has {topo.n_devices} devices")
    if policy == "snake":
        return device_order(topo, tp, pp)
    if policy == "lattice":
        if topo.kind in GRID_KINDS:
            return _grid_order(topo, dp, pp, tp, lattice=True)
        return device_order(topo, tp, pp)
    if policy == "row-major":
        return np.arange(n, dtype=np.int64)
    if policy == "spread":
        r = np.arange(n)
        return (r % tp) * (dp * pp) + r // tp
    raise ValueError(f"unknown placement policy {policy!r}; allowed: {', '.join(PLACEMENTS)}")


def hop_distance(topo: Topology, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Route hops between device arrays ``a`` and ``b`` on the healthy topology.

    Grids are measured in closed form (dimension-order distance); other kinds ask the
    topology's own router (:meth:`Topology.hops`).
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if topo.dims is not None:
        return grid_distance(topo.dims, topo.wrap, topo.coords[a], topo.coords[b])
    return np.array([topo.hops(int(x), int(y)) for x, y in zip(a, b, strict=True)],
                    dtype=np.int64)


def _walk_position(topo: Topology) -> np.ndarray:
    """Position of every device along :func:`ring_walk` (cached on the topology: groups
    are many)."""
    pos = topo.__dict__.get("_walk_pos")
    if pos is None:
        order = ring_walk(topo)
        pos = topo.__dict__["_walk_pos"] = np.empty(topo.n_devices, dtype=np.int64)
        pos[order] = np.arange(len(order))
    return pos


def _lattice_rings(topo: Topology, groups: np.ndarray) -> np.ndarray:
    """Each row of ``groups`` along the snake cycle of its own lattice where its members fill
    one (on a grid: every combination of the coordinate values they take, e.g. columns
    {0, 2, ..., 62} x rows {0, 32}); other rows unchanged.

    The members then sit on an ``n_1 x n_2 ...`` grid of their own, and its snake cycle
    (:func:`grid_cycle`) steps between neighbours of that grid. With distinct members, taking
    ``n_k`` values in dimension ``k`` and ``prod(n_k)`` = members, every combination is
    taken once and every value of dimension ``k`` ``members / n_k`` times."""
    out = groups.copy()
    if topo.dims is None:
        return out
    m = groups.shape[1]
    nd = len(topo.dims)
    srt = np.sort(topo.coords[groups], axis=1)                  # (group, member, dim)
    counts = 1 + (np.diff(srt, axis=1) > 0).sum(axis=1)          # distinct values per dim
    for sig in np.unique(counts, axis=0):
        if int(np.prod(sig)) != m:
            continue
        rows = np.flatnonzero((counts == sig).all(axis=1))
        cyc = np.array(grid_cycle([int(v) for v in sig]), dtype=np.int64)
        cells = np.empty((len(rows), m, nd), dtype=np.int64)
        for k in range(nd):
            vals = srt[rows, :, k].reshape(len(rows), int(sig[k]), m // int(sig[k]))[:, :, 0]
            cells[:, :, k] = vals[:, cyc[:, k]]
        out[rows] = _ids(topo, cells.reshape(-1, nd)).reshape(len(rows), m)
    return out


def ring_orders(topo: Topology, groups: np.ndarray, lattice: bool = False) -> np.ndarray:
    """Order every row of ``groups`` (devices; one group per row) into a ring with few hops
    between consecutive members.

    Candidates: the order given (callers pass rank order, which follows the placement), the
    order along :func:`ring_walk` and (``lattice``, grids) the snake cycle of the group's own
    lattice (:func:`_lattice_rings`); the one with the fewest hops on its worst ring edge,
    then in total, wins (ties: in that order).
    """
    groups = np.atleast_2d(np.asarray(groups, dtype=np.int64))
    n_grp, m = groups.shape
    if m <= 2:
        return groups
    pos = _walk_position(topo)
    cands = [groups,
             np.take_along_axis(groups, np.argsort(pos[groups], axis=1, kind="stable"), axis=1)]
    if lattice and topo.dims is not None:
        cands.append(_lattice_rings(topo, groups))
    best = groups.copy()
    best_max = best_sum = None
    for cand in cands:
        h = hop_distance(topo, cand.ravel(), np.roll(cand, -1, axis=1).ravel()).reshape(n_grp, m)
        h_max, h_sum = h.max(axis=1), h.sum(axis=1)
        if best_max is None:
            best_max, best_sum = h_max, h_sum
            continue
        better = (h_max < best_max) | ((h_max == best_max) & (h_sum < best_sum))
        best[better] = cand[better]
        best_max = np.where(better, h_max, best_max)
        best_sum = np.where(better, h_sum, best_sum)
    return best


def ring_order(topo: Topology, devices: np.ndarray, lattice: bool = False) -> np.ndarray:
    """Order one group of ``devices`` into a ring (:func:`ring_orders` of one row)."""
    return ring_orders(topo, np.asarray(devices, dtype=np.int64)[None, :], lattice)[0]


def ring_hops(topo: Topology, ring: np.ndarray) -> np.ndarray:
    """Hops of every ring edge ``ring[i] -> ring[i+1]`` (closing edge last)."""
    ring = np.asarray(ring, dtype=np.int64)
    if len(ring) < 2:
        return np.zeros(0, dtype=np.int64)
    return hop_distance(topo, ring, np.roll(ring, -1))


__all__ = ["PLACEMENTS", "boustrophedon", "device_order", "grid_cycle", "hop_distance",
           "place", "ring_hops", "ring_order", "ring_orders", "ring_walk",
           "snake_cycle"]
