"""The built topology: the device graph, coordinates and the table of directed links.

A :class:`Topology` wraps an undirected NetworkX graph whose nodes ``0..n_devices-1`` are
accelerators and whose other nodes (ids ``>= n_devices``) are switches. Every edge carries:

* ``link``: the catalog name of its link type (a key of the fabric's ``link_specs``),
* ``count``: physical links bundled on the edge (``links_per_edge`` x wrap multiplicity),
* ``dim``: the grid dimension of the edge (``-1`` when the edge is not along a dimension),
* ``tier``: what the edge is (``grid``, ``local``, ``global``, ``nvlink``, ``nic``, ``spine``).

Every undirected edge ``{u, v}`` becomes two directed links with integer ids; capacities and
latencies live in NumPy arrays indexed by link id so the network engine can work on arrays.

This is the type both :mod:`topologies.routing` and :mod:`topologies.graph` (which builds it and
gives it its router) import; it imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np


@dataclass
class Topology:
    """A built topology: graph, device coordinates and the directed-link table.

    Attributes:
        kind: topology kind.
        shape: the scenario's shape.
        graph: devices ``0..n_devices-1`` and switches ``n_devices..``.
        n_devices: number of accelerators.
        coords: ``(n_devices, ndim)`` integer coordinates, ``ndim >= 2``.
        dims: sizes of the grid dimensions dimension-order routing walks (None: not a grid).
        wrap: whether grid dimensions wrap around (torus, ring).
        info: kind-specific facts (``dragonfly2d``: ``group_size``, ``groups``).
        fat_tree: the switches of a ``switched`` cluster (None for other kinds).
        route_hops: hop count of the healthy route between two devices (the router's; set by
            :func:`topologies.graph.build_topology`, used by :meth:`hops` off grids).
    """

    kind: str
    shape: tuple[int, ...]
    graph: nx.Graph
    n_devices: int
    coords: np.ndarray
    dims: tuple[int, ...] | None = None
    wrap: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    fat_tree: FatTree | None = None
    route_hops: Callable[[int, int], int] | None = field(default=None, repr=False,
                                                         compare=False)
    link_src: np.ndarray = field(init=False)
    link_dst: np.ndarray = field(init=False)
    link_ids: dict[tuple[int, int], int] = field(init=False)

    def __post_init__(self) -> None:
        src: list[int] = []
        dst: list[int] = []
        ids: dict[tuple[int, int], int] = {}
        for u, v in sorted((min(a, b), max(a, b)) for a, b in self.graph.edges()):
            for a, b in ((u, v), (v, u)):
                ids[(a, b)] = len(src)
                src.append(a)
                dst.append(b)
        self.link_src = np.asarray(src, dtype=np.int64)
        self.link_dst = np.asarray(dst, dtype=np.int64)
        self.link_ids = ids

    @property
    def n_links(self) -> int:
        """Number of directed links."""
        return len(self.link_src)

    @property
    def n_nodes(self) -> int:
        """Devices plus switches."""
        return self.graph.number_of_nodes()

    def link_id(self, u: int, v: int) -> int:
        """Id of the directed link ``u -> v`` (KeyError when there is no such edge)."""
        return self.link_ids[(u, v)]

    def edge_attr(self, link: int, name: str):
        """Attribute ``name`` of the undirected edge under directed link ``link``."""
        return self.graph.edges[int(self.link_src[link]), int(self.link_dst[link])][name]

    def link_types(self) -> set[str]:
        """Catalog names of the link types on the edges."""
        return {d["link"] for _u, _v, d in self.graph.edges(data=True)}

    def hops(self, a: int, b: int) -> int:
        """Route hops from device ``a`` to ``b`` on the healthy topology (the router's)."""
        if self.dims is not None:
            d = np.abs(self.coords[a] - self.coords[b])
            if self.wrap:
                d = np.minimum(d, np.asarray(self.dims) - d)
            return int(d.sum())
        if self.route_hops is None:
            raise ValueError(f"{self.kind}: hops of a non-grid topology need its router; build "
                             "the topology with topologies.graph.build_topology")
        return self.route_hops(int(a), int(b))

    def degree(self) -> np.ndarray:
        """Number of neighbours of each device (mesh edges and corners have fewer)."""
        return np.array([self.graph.degree(d) for d in range(self.n_devices)], dtype=np.int64)

    def link_degree(self) -> np.ndarray:
        """Physical links at each device (sum of ``count`` over its edges)."""
        return np.array([sum(d["count"] for _u, _v, d in self.graph.edges(dev, data=True))
                         for dev in range(self.n_devices)], dtype=np.int64)


@dataclass(frozen=True)
class FatTree:
    """The switches of a ``switched`` cluster (ids are graph node ids).

    Attributes:
        gpus_per_node: GPUs per node (``G``).
        nodes: number of nodes (``N``).
        rails: NICs per node (``R``), one per rail.
        per_gpu_nics: NIC ``g`` sits on GPU ``g`` (``R = G``); else on the NVSwitch.
        hosts_per_leaf: nodes per leaf.
        nvswitches: NVSwitch of each node (empty when ``G = 1``).
        leaves: ``(rails, leaf_groups)`` leaf ids (empty without an inter-node fabric).
        spines: spine ids (empty with a single leaf).
        oversubscription: leaf down-links per up-link.
    """

    gpus_per_node: int
    nodes: int
    rails: int
    per_gpu_nics: bool
    hosts_per_leaf: int
    nvswitches: tuple[int, ...]
    leaves: np.ndarray
    spines: tuple[int, ...]
    oversubscription: float

    @property
    def has_fabric(self) -> bool:
        """Whether nodes are joined by an InfiniBand fabric (more than one node)."""
        return self.leaves.size > 0

    @property
    def leaf_groups(self) -> int:
        """Leaves per rail."""
        return int(self.leaves.shape[1]) if self.has_fabric else 0

    def node_of(self, device: int) -> int:
        """Node of a device."""
        return int(device) // self.gpus_per_node

    def rail_of(self, device: int) -> int:
        """Rail (NIC index in its node) a device's inter-node traffic uses."""
        g = int(device) % self.gpus_per_node
        return g if self.per_gpu_nics else g * self.rails // self.gpus_per_node

    def leaf_group(self, node: int) -> int:
        """Leaf group (which leaf of each rail) of a node."""
        return int(node) // self.hosts_per_leaf

    def leaf(self, rail: int, group: int) -> int:
        """Id of the leaf of ``rail`` serving leaf group ``group``."""
        return int(self.leaves[rail, group])

    def nvswitch(self, node: int) -> int:
        """Id of a node's NVSwitch (KeyError-like IndexError when ``G = 1``)."""
        return self.nvswitches[int(node)]

    def nic_end(self, device: int) -> int:
        """Graph node the device's NIC hangs on (the GPU itself, or its NVSwitch)."""
        if self.per_gpu_nics or not self.nvswitches:
            return int(device)
        return self.nvswitch(self.node_of(device))

    def device_leaf(self, device: int) -> int:
        """Leaf the device's inter-node traffic enters."""
        return self.leaf(self.rail_of(device), self.leaf_group(self.node_of(device)))
