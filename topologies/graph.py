"""Building the device graph of a cluster: the wiring of every topology kind.

:func:`build_topology` returns a :class:`~topologies.base.Topology` (graph, coordinates,
directed links; edge attributes ``link``, ``count``, ``dim``, ``tier`` described there) with
its healthy router attached.

Wiring of each kind (``shape`` as in :mod:`topologies.spec`):

* ``torus2d [X, Y]`` / ``mesh2d [X, Y]`` / ``torus3d [X, Y, Z]``: device
  ``d = x + X*y (+ X*Y*z)``; an edge joins devices one step apart along one dimension; a
  torus also joins the last and first device of every line (for a line of 2 the wrap edge
  doubles the ``count`` of the single edge). Every edge has type ``link``, ``count``
  ``links_per_edge`` and ``dim`` = its dimension. Mesh corner / edge nodes have 2 / 3 links.
* ``ring [N]``: a 1-D torus, device ``d`` at ``(d, 0)``.
* ``dragonfly2d [A, G]``: ``G`` groups of ``A`` devices (the devices are the routers, as in a
  direct network); device ``(a, g)`` is ``a + A*g``.
  - *local* edges: every two devices of a group are joined (complete graph ``K_A``), type
    ``link``, ``dim`` 0;
  - *global* edges: every two groups ``i < j`` are joined by exactly one edge, from device
    ``((j - 1) mod A, i)`` to device ``(i mod A, j)``: group ``g`` numbers its ``G - 1``
    global ports ``k = 0..G-2`` towards groups ``0..g-1, g+1..G-1`` in order and deals port
    ``k`` to its device ``k mod A``. Type ``global_link`` (default ``link``), ``count``
    ``global_links_per_edge`` (default ``links_per_edge``), ``dim`` 1.
  Every device therefore has ``A - 1`` local and ``floor`` or ``ceil((G - 1) / A)`` global
  links, and every two groups are one global hop apart (diameter 3: local, global, local).
* ``switched [G, N]``: ``N`` nodes of ``G`` GPUs; GPU ``g`` of node ``k`` is device
  ``g + G*k`` at ``(g, k)``.
  - inside a node (``G >= 2``) every GPU has one edge to the node's NVSwitch (one switch
    node, non-blocking), type ``link``, ``count`` ``links_per_edge`` (18 NVLink4 links of an
    H100 give its 450 GB/s); two GPUs of a node are two hops apart;
  - between nodes (``N >= 2``), an InfiniBand two-level fat-tree (leaf-spine folded Clos) of
    ``nic_link`` edges, ``count`` 1. A node has ``R = nics_per_node`` NICs (default ``G``), NIC
    ``r`` on *rail* ``r``. With ``R = G`` (rail-optimized, as in DGX SuperPOD) GPU ``g`` owns
    NIC ``g``, which sits on the GPU: edge GPU - leaf. With ``R < G`` the NICs sit on the
    node's NVSwitch and GPU ``g`` uses NIC ``g*R // G``: ``R`` edges NVSwitch - leaf per node.
    Each rail has ``ceil(N / nodes_per_leaf)`` leaves (*leaf groups*; ``nodes_per_leaf``
    default ``N``), leaf group ``b`` serving nodes ``b*nodes_per_leaf ...``. When there is more
    than one leaf, ``S = ceil(h / oversubscription)`` spines (``h = min(nodes_per_leaf, N)``
    hosts per leaf) and every leaf has one edge to every spine: ``oversubscription`` 1 gives
    full bisection (as many up-links as down-links per leaf). Spine radix is not limited.
  Switch ids: NVSwitches ``n .. n+N-1`` (node order), then leaves (rail-major), then spines;
  :class:`FatTree` (``Topology.fat_tree``) tells which is which.
"""

from __future__ import annotations

from math import ceil

import networkx as nx
import numpy as np

from topologies.base import FatTree, Topology
from topologies.routing import Router
from topologies.spec import KINDS, SHAPE_ARITY


class MissingLinkType(ValueError):
    """A topology kind needs a link type that was not given (e.g. ``nic_link`` for switched)."""


def _devices_in_rows(n: int, per_row: int) -> tuple[np.ndarray, nx.Graph]:
    """Coordinates ``(d % per_row, d // per_row)`` of ``n`` devices and a graph holding them
    as nodes (role ``device``); the dragonfly's groups and the switched cluster's nodes."""
    coords = np.stack([np.arange(n) % per_row, np.arange(n) // per_row], axis=1)
    g = nx.Graph()
    for d in range(n):
        g.add_node(d, coord=(int(coords[d, 0]), int(coords[d, 1])), role="device")
    return coords, g


def _add(g: nx.Graph, u: int, v: int, link: str, count: int, dim: int, tier: str) -> None:
    if g.has_edge(u, v):  # a line of 2 on a torus: the wrap link doubles the edge
        g.edges[u, v]["count"] += count
    else:
        g.add_edge(u, v, link=link, count=count, dim=dim, tier=tier)


def _grid(kind: str, shape: tuple[int, ...], dims: tuple[int, ...], wrap: bool, link: str,
          links_per_edge: int) -> Topology:
    """n-D torus or mesh over ``dims``. Device id = x + X*y (+ X*Y*z ...)."""
    n = int(np.prod(dims))
    coords = np.array(np.unravel_index(np.arange(n), dims[::-1])).T[:, ::-1]  # (x, y, ...)
    strides = np.cumprod((1, *dims[:-1]))
    g = nx.Graph()
    for d in range(n):
        g.add_node(d, coord=tuple(int(c) for c in coords[d]), role="device")
    for d in range(n):
        for k, size in enumerate(dims):
            c = coords[d, k]
            if c + 1 < size:
                nb = d + strides[k]
            elif wrap and size > 1:
                nb = d - c * strides[k]  # wrap to coordinate 0
            else:
                continue
            nb = int(nb)
            if nb != d:
                _add(g, d, nb, link, links_per_edge, k, "grid")
    return Topology(kind=kind, shape=tuple(shape), graph=g, n_devices=n, coords=coords,
                    dims=tuple(dims), wrap=wrap)


def dragonfly_port_device(group: int, other: int, a: int) -> int:
    """Local index of the device of ``group`` holding the global edge to group ``other``."""
    port = other if other < group else other - 1
    return port % a


def _dragonfly(shape: tuple[int, ...], link: str, global_link: str, links_per_edge: int,
               global_links_per_edge: int) -> Topology:
    a, groups = (int(s) for s in shape)
    n = a * groups
    coords, g = _devices_in_rows(n, a)
    for grp in range(groups):
        for i in range(a):
            for j in range(i + 1, a):
                _add(g, i + a * grp, j + a * grp, link, links_per_edge, 0, "local")
    for i in range(groups):
        for j in range(i + 1, groups):
            u = dragonfly_port_device(i, j, a) + a * i
            v = dragonfly_port_device(j, i, a) + a * j
            _add(g, u, v, global_link, global_links_per_edge, 1, "global")
    return Topology(kind="dragonfly2d", shape=(a, groups), graph=g, n_devices=n, coords=coords,
                    info={"group_size": a, "groups": groups})


def _switched(shape: tuple[int, ...], link: str, nic_link: str | None, links_per_edge: int,
              nics_per_node: int | None, nodes_per_leaf: int | None,
              oversubscription: float) -> Topology:
    gpn, nodes = (int(s) for s in shape)
    n = gpn * nodes
    coords, g = _devices_in_rows(n, gpn)
    nxt = n
    nvswitches: list[int] = []
    if gpn >= 2:
        for k in range(nodes):
            g.add_node(nxt, role="nvswitch", node=k)
            for gi in range(gpn):
                _add(g, gi + gpn * k, nxt, link, links_per_edge, -1, "nvlink")
            nvswitches.append(nxt)
            nxt += 1
    rails = min(nics_per_node or gpn, gpn)
    hosts = min(nodes_per_leaf or nodes, nodes)
    groups = ceil(nodes / hosts) if nodes > 1 else 0
    leaves = np.arange(nxt, nxt + rails * groups, dtype=np.int64).reshape(rails, groups)
    nxt += leaves.size
    spines: list[int] = []
    if leaves.size > 1:
        spines = list(range(nxt, nxt + max(1, ceil(hosts / oversubscription - 1e-9))))
    ft = FatTree(gpn, nodes, rails, rails == gpn, hosts, tuple(nvswitches), leaves,
                 tuple(spines), oversubscription)
    if ft.has_fabric:
        if nic_link is None:
            raise MissingLinkType("build_topology('switched') of several nodes got no nic_link "
                                  "(the InfiniBand link type between nodes); callers building "
                                  "from a scenario pass ClusterSpec.topology_options()")
        for leaf in leaves.ravel():
            g.add_node(int(leaf), role="leaf")
        for k in range(nodes):
            if ft.per_gpu_nics or not nvswitches:
                for gi in range(gpn):
                    d = gi + gpn * k
                    _add(g, d, ft.device_leaf(d), nic_link, 1, -1, "nic")
            else:
                for r in range(rails):
                    _add(g, ft.nvswitch(k), ft.leaf(r, ft.leaf_group(k)), nic_link, 1, -1, "nic")
        for s in spines:
            g.add_node(s, role="spine")
            for leaf in leaves.ravel():
                _add(g, int(leaf), s, nic_link, 1, -1, "spine")
    return Topology(kind="switched", shape=(gpn, nodes), graph=g, n_devices=n, coords=coords,
                    fat_tree=ft)


def build_topology(kind: str, shape: tuple[int, ...], link: str, links_per_edge: int = 1, *,
                   nic_link: str | None = None, global_link: str | None = None,
                   global_links_per_edge: int | None = None, nics_per_node: int | None = None,
                   nodes_per_leaf: int | None = None,
                   oversubscription: float | None = None) -> Topology:
    """Build the graph of a topology kind (wiring in the module docstring).

    Args:
        kind: ``torus2d``, ``mesh2d``, ``dragonfly2d``, ``ring``, ``torus3d`` or ``switched``.
        shape: devices per dimension (see :mod:`topologies.spec`).
        link: catalog name of the grid / intra-group / GPU-NVSwitch link type.
        links_per_edge: physical links bundled on each ``link`` edge.
        nic_link: catalog name of the InfiniBand link type (``switched`` with several nodes).
        global_link: catalog name of the dragonfly global links (default: ``link``).
        global_links_per_edge: links per dragonfly global edge (default: ``links_per_edge``).
        nics_per_node: NICs per node (``switched``; default one per GPU).
        nodes_per_leaf: nodes per leaf switch (``switched``; default all nodes).
        oversubscription: leaf down-links per up-link (``switched``; default 1 = full
            bisection).

    Raises:
        MissingLinkType: ``switched`` with several nodes and no ``nic_link``.
        ValueError: unknown kind or wrong shape arity (the schema rejects these earlier).
    """
    shape = tuple(int(s) for s in shape)
    want = SHAPE_ARITY.get(kind)
    if want is None:
        raise ValueError(f"unknown topology kind {kind!r}; allowed: {', '.join(KINDS)}")
    if len(shape) != want or min(shape, default=0) < 1:
        raise ValueError(f"{kind} takes a shape of {want} integers >= 1, got {list(shape)}")
    if kind in ("torus2d", "mesh2d", "torus3d"):
        topo = _grid(kind, shape, shape, kind.startswith("torus"), link, links_per_edge)
    elif kind == "ring":
        topo = _grid(kind, shape, (shape[0], 1), True, link, links_per_edge)
    elif kind == "dragonfly2d":
        topo = _dragonfly(shape, link, global_link or link, links_per_edge,
                          global_links_per_edge or links_per_edge)
    else:
        topo = _switched(shape, link, nic_link, links_per_edge, nics_per_node, nodes_per_leaf,
                         float(oversubscription or 1.0))
    topo.route_hops = Router(topo).hops  # a router of its own: never sees a failure
    return topo
