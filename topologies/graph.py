"""The device graph of a cluster and its directed links.

A :class:`Topology` wraps an undirected NetworkX graph whose nodes ``0..n_devices-1`` are
accelerators (other node ids, if any, are switches) and whose edges carry:

* ``link``: the catalog link type name,
* ``count``: physical links bundled on the edge (``links_per_edge`` x wrap multiplicity),
* ``dim``: the grid dimension of the edge (``-1`` when not a grid edge).

Every undirected edge ``{u, v}`` becomes two directed links with integer ids; capacities and
latencies live in NumPy arrays indexed by link id so the network engine can work on arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np


@dataclass
class Topology:
    """A built topology: graph, coordinates and the directed-link table."""

    kind: str
    shape: tuple[int, ...]
    graph: nx.Graph
    n_devices: int
    coords: np.ndarray  # (n_devices, ndim) integer coordinates
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

    def link_id(self, u: int, v: int) -> int:
        """Id of the directed link ``u -> v`` (KeyError when there is no such edge)."""
        return self.link_ids[(u, v)]

    def edge_attr(self, link: int, name: str):
        """Attribute ``name`` of the undirected edge under directed link ``link``."""
        return self.graph.edges[int(self.link_src[link]), int(self.link_dst[link])][name]

    def degree(self) -> np.ndarray:
        """Number of neighbours of each device (mesh edges and corners have fewer)."""
        return np.array([self.graph.degree(d) for d in range(self.n_devices)], dtype=np.int64)


def _grid(kind: str, shape: tuple[int, ...], link: str, links_per_edge: int) -> Topology:
    """2D (or n-D) torus or mesh. Device id = x + X*y (+ X*Y*z ...)."""
    wrap = kind.startswith("torus")
    dims = tuple(int(n) for n in shape)
    n = int(np.prod(dims))
    coords = np.array(np.unravel_index(np.arange(n), dims[::-1])).T[:, ::-1]  # (x, y, ...)
    strides = np.cumprod((1, *dims[:-1]))
    g = nx.Graph()
    for d in range(n):
        g.add_node(d, coord=tuple(int(c) for c in coords[d]))
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
            if nb == d:
                continue
            if g.has_edge(d, nb):  # size-2 ring: the wrap link doubles the edge
                g.edges[d, nb]["count"] += links_per_edge
            else:
                g.add_edge(d, nb, link=link, count=links_per_edge, dim=k)
    return Topology(kind=kind, shape=dims, graph=g, n_devices=n, coords=coords)


def build_topology(kind: str, shape: tuple[int, ...], link: str,
                   links_per_edge: int = 1) -> Topology:
    """Build the graph of a topology kind (``torus2d`` or ``mesh2d``).

    Args:
        kind: topology kind.
        shape: devices per dimension.
        link: catalog name of the link type on every edge.
        links_per_edge: physical links bundled on each edge.
    """
    if kind in ("torus2d", "mesh2d"):
        return _grid(kind, tuple(shape), link, links_per_edge)
    raise ValueError(f"unknown topology kind {kind!r}")  # schema rejects this earlier
