"""Collective algorithms as fabric phases, and their alpha-beta costs.

Groups are given as a 2-D array ``groups[g, i]``: device of member ``i`` of group ``g``, members
in ring order. All groups of one call run concurrently (their phases are merged), so groups
that share links contend. ``n`` is the per-rank buffer in bytes (the full vector for
all-reduce, the full output for all-gather, the full input for reduce-scatter).

Algorithms (``network.dp_algorithm`` / ``network.tp_algorithm``), each for the operations
``allreduce``, ``reduce_scatter`` and ``allgather``:

* ``ring``: every member sends to the next one; all-reduce is one phase of ``2(p-1)`` steps
  of ``n/p`` bytes (reduce-scatter then all-gather), reduce-scatter and all-gather ``p-1``.
* ``bidir_ring``: the buffer is split in halves that go round the ring in opposite
  directions at once (one phase, ``2p`` pairs of ``n/(2p)`` bytes per step); on full-duplex
  links this halves the bandwidth term.
* ``torus2d`` (Mikami et al. 2018, arXiv:1811.05233), on ``torus2d``, ``mesh2d`` and
  ``torus3d`` for groups that form a 2-D sub-grid ``X x Y`` (their device coordinates are the
  Cartesian product of ``X`` values along one dimension and ``Y`` values along another,
  ``X, Y >= 2``; X is the lower dimension): reduce-scatter along X (rings over
  each row), all-reduce along Y of the ``n/X`` shard (rings over each column), all-gather
  along X. Reduce-scatter is RS along X then RS along Y; all-gather the reverse. Rows and
  columns are ordered by coordinate, so on a torus every row ring closes over the wrap link.
* ``hierarchical`` (``switched`` only): the same three steps with X = the members inside a
  node (rings through the NVSwitch) and Y = the nodes (rings over the InfiniBand fabric among
  the i-th member of every node, which with rail-optimized NICs stay on one rail). Needs the
  same number of members in every node; with one node or one member per node it is a ring.
* ``rail_rings`` (``switched`` only): NCCL's ring algorithm on a rail-optimized cluster: one
  ring (channel) per member-in-node, each carrying ``n/C`` bytes; channel ``c`` enters every
  node at its ``c``-th member and the node segments alternate direction, so consecutive nodes
  are joined on one rail and every NIC carries one crossing. All channels run at once.
* ``auto``: ``hierarchical`` on ``switched`` when the groups span several nodes with several
  members in each, otherwise ``ring``.

Alpha-beta costs (Thakur, Rabenseifner, Gropp 2005; nccl-tests PERFORMANCE.md; ``alpha`` the
per-step latency, ``bandwidth`` the per-direction bytes/s of the bottleneck link):
ring all-reduce ``2(p-1) alpha + 2(p-1)/p * n / B``; ring reduce-scatter and all-gather
``(p-1) alpha + (p-1)/p * n / B``; bidirectional: the same with ``n/2``; 2-D and
hierarchical all-reduce ``2(X-1) a_x + 2(X-1)/X n/B_x + 2(Y-1) a_y + 2(Y-1)/Y (n/X)/B_y``.
"""

from __future__ import annotations

import numpy as np

from devices.fabric import Phase

OPS = ("allreduce", "reduce_scatter", "allgather")

#: Algorithms a scenario may name (``auto`` resolves to one of the others).
ALGORITHM_CHOICES = ("auto", "ring", "bidir_ring", "torus2d", "hierarchical", "rail_rings")

#: Topology kinds on which ``torus2d`` (the dimension-wise algorithm) may run.
GRID_KINDS = ("torus2d", "mesh2d", "torus3d")


class NotApplicable(ValueError):
    """An algorithm cannot run on these groups (the message says why)."""


AlgorithmError = NotApplicable


# ----------------------------------------------------------------------------- ring
def _ring_pairs(groups: np.ndarray, reverse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    g = np.asarray(groups, dtype=np.int64)
    nxt = np.roll(g, 1 if reverse else -1, axis=1)
    return g.ravel(), nxt.ravel()


def _steps(op: str, p: int) -> int:
    if op == "allreduce":
        return 2 * (p - 1)
    if op in ("reduce_scatter", "allgather"):
        return p - 1
    raise ValueError(f"unknown collective {op!r}; allowed: {', '.join(OPS)}")


def ring(op: str, groups: np.ndarray, n: float) -> list[Phase]:
    """Ring ``op`` over every group at once: one phase of ``_steps(op, p)`` steps of n/p."""
    p = np.shape(groups)[1]
    steps = _steps(op, p)
    if p < 2 or n <= 0:
        return []
    src, dst = _ring_pairs(groups)
    return [Phase(src, dst, np.full(len(src), n / p), steps)]


def ring_allreduce(groups: np.ndarray, n: float) -> list[Phase]:
    """Ring all-reduce (reduce-scatter then all-gather): one phase of 2(p-1) steps."""
    return ring("allreduce", groups, n)


def ring_reduce_scatter(groups: np.ndarray, n: float) -> list[Phase]:
    """Ring reduce-scatter: p-1 steps of n/p bytes."""
    return ring("reduce_scatter", groups, n)


def ring_allgather(groups: np.ndarray, n: float) -> list[Phase]:
    """Ring all-gather: p-1 steps of n/p bytes."""
    return ring("allgather", groups, n)


def bidirectional(op: str, groups: np.ndarray, n: float) -> list[Phase]:
    """Half of the buffer round the ring each way, concurrently (one phase, 2p pairs)."""
    p = np.shape(groups)[1]
    steps = _steps(op, p)
    if p < 2 or n <= 0:
        return []
    fs, fd = _ring_pairs(groups)
    bs, bd = _ring_pairs(groups, reverse=True)
    src = np.concatenate([fs, bs])
    dst = np.concatenate([fd, bd])
    return [Phase(src, dst, np.full(len(src), n / (2 * p)), steps)]


def point_to_point(src: np.ndarray, dst: np.ndarray, n: float) -> list[Phase]:
    """Each ``src[i]`` sends ``n`` bytes to ``dst[i]`` (pipeline activations/gradients)."""
    src = np.asarray(src, dtype=np.int64)
    if len(src) == 0 or n <= 0:
        return []
    return [Phase(src, np.asarray(dst, dtype=np.int64), np.full(len(src), float(n)), 1)]


# ----------------------------------------------------------------------------- 2-D structure
def grid_structure(groups: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """The groups as 2-D sub-grids: ``out[g, j, i]`` = device at row ``j``, column ``i``.

    Row ``j`` holds the devices sharing the ``j``-th value of the second varying coordinate
    (ordered by the first), column ``i`` those sharing the ``i``-th value of the first.

    Raises:
        NotApplicable: a group's coordinates are not the Cartesian product of values along two
            dimensions (``X, Y >= 2``), or groups differ in ``X x Y``.
    """
    groups = np.asarray(groups, dtype=np.int64)
    out, shape = [], None
    for g, devs in enumerate(groups):
        c = np.asarray(coords)[devs]
        varying = [k for k in range(c.shape[1]) if len(np.unique(c[:, k])) > 1]
        what = f"group {g} (devices {devs.tolist()}) is not a 2D sub-grid"
        if len(varying) != 2:
            where = "a line" if len(varying) == 1 else f"it spans {len(varying)} dimensions"
            raise NotApplicable(f"{what}: {where}")
        kx, ky = varying
        xs, ys = np.unique(c[:, kx]), np.unique(c[:, ky])
        m = np.full((len(ys), len(xs)), -1, dtype=np.int64)
        m[np.searchsorted(ys, c[:, ky]), np.searchsorted(xs, c[:, kx])] = devs
        if len(xs) * len(ys) != len(devs) or (m < 0).any():
            raise NotApplicable(f"{what}: it fills {int((m >= 0).sum())} of the "
                                f"{len(xs)}x{len(ys)} cells its coordinates span")
        if shape is not None and m.shape != shape:
            raise NotApplicable(f"groups differ in shape: {shape[1]}x{shape[0]} and "
                                f"{m.shape[1]}x{m.shape[0]}")
        shape = m.shape
        out.append(m)
    return np.stack(out)


def grid_matrix(topo, devices: np.ndarray) -> np.ndarray:
    """One group as a 2-D sub-grid: ``m[j, i]`` = device at row ``j``, column ``i``."""
    return grid_structure(np.asarray(devices, dtype=np.int64)[None, :], topo.coords)[0]


def node_matrix(topo, devices: np.ndarray) -> np.ndarray:
    """One group as (node, member-in-node): ``m[j, i]`` = i-th member of its j-th node."""
    return node_structure(np.asarray(devices, dtype=np.int64)[None, :],
                          topo.fat_tree.gpus_per_node)[0]


def node_structure(groups: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """The groups as (node, member-in-node) matrices: ``out[g, j, i]`` = i-th member (by GPU
    index) of the group's j-th node (by node index).

    Raises:
        NotApplicable: the nodes of a group hold different numbers of its members, or groups
            differ in shape.
    """
    groups = np.asarray(groups, dtype=np.int64)
    out, shape = [], None
    for g, devs in enumerate(groups):
        devs = np.sort(devs)
        node = devs // gpus_per_node
        nodes, counts = np.unique(node, return_counts=True)
        if len(set(counts.tolist())) != 1:
            raise NotApplicable(f"group {g} has unequal numbers of members {counts.tolist()} "
                                f"in nodes {nodes.tolist()}; hierarchical needs the same "
                                f"number in every node")
        m = devs.reshape(len(nodes), counts[0])
        if shape is not None and m.shape != shape:
            raise NotApplicable(f"groups differ in shape: {shape[0]} nodes x {shape[1]} and "
                                f"{m.shape[0]} nodes x {m.shape[1]}")
        shape = m.shape
        out.append(m)
    return np.stack(out)


def _rings_along_rows(mats: np.ndarray) -> np.ndarray:
    """Every row of every group as one ring: (groups*rows, X)."""
    return mats.reshape(-1, mats.shape[2])


def _rings_along_cols(mats: np.ndarray) -> np.ndarray:
    """Every column of every group as one ring: (groups*cols, Y)."""
    return np.swapaxes(mats, 1, 2).reshape(-1, mats.shape[1])


def two_level(op: str, mats: np.ndarray, n: float) -> list[Phase]:
    """Dimension-wise ``op`` over groups given as (group, row, column) matrices.

    all-reduce: RS along rows (X), AR along columns (Y) of n/X, AG along rows;
    reduce-scatter: RS along rows, RS along columns of n/X; all-gather: the reverse.
    """
    _steps(op, 2)
    if n <= 0:
        return []
    x = mats.shape[2]
    rows, cols = _rings_along_rows(mats), _rings_along_cols(mats)
    if op == "allreduce":
        return ring("reduce_scatter", rows, n) + ring("allreduce", cols, n / x) + ring(
            "allgather", rows, n)
    if op == "reduce_scatter":
        return ring("reduce_scatter", rows, n) + ring("reduce_scatter", cols, n / x)
    return ring("allgather", cols, n / x) + ring("allgather", rows, n)


def rail_rings(op: str, mats: np.ndarray, n: float) -> list[Phase]:
    """``op`` as one ring per member-in-node over (group, node, member) matrices, run together
    (see the module docstring); each channel carries ``n / C``."""
    _steps(op, 2)
    _g, nodes, c_count = mats.shape
    if n <= 0 or nodes * c_count < 2:
        return []
    channels = []
    for c in range(c_count):
        seg = np.roll(np.arange(c_count), -c)           # c, c+1, ..., c-1
        order = [mats[:, j, seg if j % 2 == 0 else seg[::-1]] for j in range(nodes)]
        channels.append(np.concatenate(order, axis=1))  # (groups, nodes * members)
    return ring(op, np.concatenate(channels, axis=0), n / c_count)


# ----------------------------------------------------------------------------- dispatch
def structure(algorithm: str, groups: np.ndarray, topo) -> np.ndarray | None:
    """Check that ``algorithm`` can run on ``groups`` of ``topo``; returns the 2-D structure
    ``[group, row, column]`` of the two-level algorithms (None for rings).

    Raises:
        NotApplicable: with the reason, e.g. a ``torus2d`` group that is not a sub-grid.
    """
    if algorithm in ("ring", "bidir_ring"):
        return None
    if algorithm == "torus2d":
        if topo.kind not in GRID_KINDS:
            raise NotApplicable(f"torus2d needs a grid topology ({', '.join(GRID_KINDS)}), "
                                f"not {topo.kind}")
        return grid_structure(groups, topo.coords)
    if algorithm in ("hierarchical", "rail_rings"):
        if topo.fat_tree is None:
            raise NotApplicable(f"{algorithm} needs nodes (topology kind switched), "
                                f"not {topo.kind}")
        return node_structure(groups, topo.fat_tree.gpus_per_node)
    raise NotApplicable(f"unknown algorithm {algorithm!r}; allowed: "
                        f"{', '.join(ALGORITHM_CHOICES)}")


def check(algorithm: str, groups: np.ndarray, topo) -> str | None:
    """Why ``algorithm`` cannot run on ``groups`` of ``topo`` (None when it can).

    The topology must suit the algorithm even when the groups have a single member (no
    traffic): a ``hierarchical`` choice on a torus is a mistake worth reporting."""
    if algorithm == "torus2d" and topo.kind not in GRID_KINDS:
        return f"torus2d needs a grid topology ({', '.join(GRID_KINDS)}), not {topo.kind}"
    if algorithm in ("hierarchical", "rail_rings") and topo.fat_tree is None:
        return f"{algorithm} needs nodes (topology kind switched), not {topo.kind}"
    if np.shape(groups)[1] < 2:
        return None  # no communication
    try:
        structure(choose(algorithm, groups, topo), groups, topo)
    except NotApplicable as exc:
        return str(exc)
    return None


def choose(requested: str, groups: np.ndarray, topo) -> str:
    """Resolve ``auto`` (see module docstring); other names are returned unchanged."""
    if requested != "auto":
        return requested
    if topo.fat_tree is not None and np.shape(groups)[1] > 1:
        try:
            mats = node_structure(groups, topo.fat_tree.gpus_per_node)
        except NotApplicable:
            return "ring"
        if mats.shape[1] >= 2 and mats.shape[2] >= 2:
            return "hierarchical"
    return "ring"


resolve = choose


def collective_phases(op: str, algorithm: str, groups: np.ndarray, n: float,
                      topo) -> list[Phase]:
    """Fabric phases of collective ``op`` with ``algorithm`` over every group at once.

    Args:
        op: ``allreduce``, ``reduce_scatter`` or ``allgather``.
        algorithm: ``ring``, ``bidir_ring``, ``torus2d``, ``hierarchical`` or ``auto``
            (resolved with :func:`choose`).
        groups: ``[group, member]`` device ids in ring order.
        n: per-rank buffer, bytes.
        topo: the topology (coordinates and node structure).

    Raises:
        NotApplicable: the algorithm does not fit the groups (scenarios are checked before).
    """
    _steps(op, 2)
    algorithm = choose(algorithm, groups, topo)
    if np.shape(groups)[1] < 2 or n <= 0:
        return []
    if algorithm == "ring":
        return ring(op, groups, n)
    if algorithm == "bidir_ring":
        return bidirectional(op, groups, n)
    if algorithm == "rail_rings":
        return rail_rings(op, structure(algorithm, groups, topo), n)
    return two_level(op, structure(algorithm, groups, topo), n)


def pairs(algorithm: str, groups: np.ndarray, topo) -> list[tuple[int, int]]:
    """(sender, receiver) device pairs of one step of ``algorithm``: ring neighbours for
    the rings (one direction), the row and column ring neighbours for the two-level ones."""
    groups = np.asarray(groups, dtype=np.int64)
    if groups.ndim != 2 or groups.shape[1] < 2:
        return []
    algorithm = choose(algorithm, groups, topo)
    mats = structure(algorithm, groups, topo)
    rings = [groups] if mats is None else [
        r for r in (_rings_along_rows(mats), _rings_along_cols(mats)) if r.shape[1] > 1]
    out: list[tuple[int, int]] = []
    for rg in rings:
        src, dst = _ring_pairs(rg)
        out.extend(zip(src.tolist(), dst.tolist(), strict=True))
    return out


ALGORITHMS = {
    "allreduce": ring_allreduce,
    "reduce_scatter": ring_reduce_scatter,
    "allgather": ring_allgather,
}


# ----------------------------------------------------------------------------- costs
def alpha_beta_time(kind: str, p: int, n: float, alpha: float, bandwidth: float) -> float:
    """Uncontended time of a ring collective, s (``bandwidth`` in bytes/s per direction)."""
    if p < 2:
        return 0.0
    if kind == "allreduce":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth
    if kind in ("reduce_scatter", "allgather"):
        return (p - 1) * alpha + (p - 1) / p * n / bandwidth
    raise ValueError(f"unknown collective {kind!r}")


def bidirectional_time(kind: str, p: int, n: float, alpha: float, bandwidth: float) -> float:
    """Uncontended bidirectional ring: the ring cost of ``n/2`` (halves run concurrently on
    opposite directions of full-duplex links), s."""
    return alpha_beta_time(kind, p, n / 2, alpha, bandwidth)


def two_level_time(kind: str, x: int, y: int, n: float, alpha_x: float, bw_x: float,
                   alpha_y: float, bw_y: float) -> float:
    """Uncontended 2-D (or hierarchical) collective, s.

    ``x`` members per row (2D: along X; hierarchical: in a node) with per-step latency
    ``alpha_x`` and bandwidth ``bw_x``; ``y`` rows (2D: along Y; hierarchical: nodes) with
    ``alpha_y``, ``bw_y``. All-reduce: ``2(x-1) a_x + 2(x-1)/x n/bw_x + 2(y-1) a_y +
    2(y-1)/y (n/x)/bw_y``; reduce-scatter and all-gather are half of that.
    """
    if kind not in OPS:
        raise ValueError(f"unknown collective {kind!r}")
    rs = (alpha_beta_time("reduce_scatter", x, n, alpha_x, bw_x)
          + alpha_beta_time("reduce_scatter", y, n / x, alpha_y, bw_y))
    return 2 * rs if kind == "allreduce" else rs


def hierarchical_time(kind: str, per_node: int, nodes: int, n: float, alpha_intra: float,
                      bw_intra: float, alpha_inter: float, bw_inter: float) -> float:
    """Uncontended hierarchical collective (in node, across nodes, in node), s."""
    return two_level_time(kind, per_node, nodes, n, alpha_intra, bw_intra, alpha_inter,
                          bw_inter)


ring_time = alpha_beta_time
bidir_ring_time = bidirectional_time
torus2d_time = two_level_time


def bus_bandwidth(kind: str, p: int, n: float, seconds: float) -> float:
    """nccl-tests bus bandwidth of a measured collective, bytes/s."""
    algbw = n / seconds
    factor = 2 * (p - 1) / p if kind == "allreduce" else (p - 1) / p
    return algbw * factor
