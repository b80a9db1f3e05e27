"""Routes over a :class:`~topologies.graph.Topology`.

* Healthy 2D torus / mesh: dimension-order routing (x first, then y); on a torus each
  dimension goes the shorter way round, ties (exactly half way) go in the + direction.
* Any other graph, or a grid with failed edges: BFS shortest path on the graph without the
  failed edges (NetworkX; deterministic for a given graph).

Routes are tuples of directed link ids, cached per (src, dst) until the set of failed edges
changes.
"""

from __future__ import annotations

from itertools import pairwise

import networkx as nx

from topologies.graph import Topology


class NoRoute(RuntimeError):
    """Raised when failures have disconnected ``src`` from ``dst``."""


class Router:
    """Route cache with dimension-order routing and shortest-path fallback."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self._cache: dict[tuple[int, int], tuple[int, ...]] = {}
        self._failed: set[tuple[int, int]] = set()
        self._degraded: nx.Graph | None = None
        self._grid = topo.kind in ("torus2d", "mesh2d")

    # -- failures ---------------------------------------------------------------------------
    @property
    def failed_edges(self) -> frozenset[tuple[int, int]]:
        """Failed undirected edges as sorted (u, v) pairs."""
        return frozenset(self._failed)

    def fail_edge(self, u: int, v: int) -> None:
        """Mark edge {u, v} failed; later routes avoid it."""
        self._failed.add((min(u, v), max(u, v)))
        self._invalidate()

    def restore_edge(self, u: int, v: int) -> None:
        """Bring edge {u, v} back."""
        self._failed.discard((min(u, v), max(u, v)))
        self._invalidate()

    def _invalidate(self) -> None:
        self._cache.clear()
        g = self.topo.graph.copy()
        g.remove_edges_from(self._failed)
        self._degraded = g if self._failed else None

    # -- routes -----------------------------------------------------------------------------
    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Directed link ids from ``src`` to ``dst`` (empty when ``src == dst``)."""
        key = (src, dst)
        r = self._cache.get(key)
        if r is None:
            r = self._compute(src, dst)
            self._cache[key] = r
        return r

    def hops(self, src: int, dst: int) -> int:
        """Number of links on the route."""
        return len(self.route(src, dst))

    def _compute(self, src: int, dst: int) -> tuple[int, ...]:
        if src == dst:
            return ()
        if self._grid and self._degraded is None:
            nodes = self._dimension_order(src, dst)
        else:
            g = self._degraded if self._degraded is not None else self.topo.graph
            try:
                nodes = nx.shortest_path(g, src, dst)
            except (nx.NetworkXNoPath, nx.NodeNotFound):
                raise NoRoute(f"no route from {src} to {dst}: failed edges "
                              f"{sorted(self._failed)} disconnect them") from None
        ids = self.topo.link_ids
        return tuple(ids[(a, b)] for a, b in pairwise(nodes))

    def _dimension_order(self, src: int, dst: int) -> list[int]:
        topo = self.topo
        wrap = topo.kind.startswith("torus")
        cur = [int(c) for c in topo.coords[src]]
        goal = [int(c) for c in topo.coords[dst]]
        dims = topo.shape
        strides = [1]
        for size in dims[:-1]:
            strides.append(strides[-1] * size)
        node = src
        path = [node]
        for k, size in enumerate(dims):
            delta = goal[k] - cur[k]
            if delta == 0:
                continue
            if wrap:
                fwd = delta % size
                step, count = (1, fwd) if fwd <= size - fwd else (-1, size - fwd)
            else:
                step, count = (1 if delta > 0 else -1), abs(delta)
            for _ in range(count):
                cur[k] = (cur[k] + step) % size
                node = sum(c * s for c, s in zip(cur, strides, strict=True))
                path.append(node)
        return path
