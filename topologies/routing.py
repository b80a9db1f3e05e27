"""Routes over a :class:`~topologies.base.Topology`.

* Healthy grids (``torus2d``, ``mesh2d``, ``torus3d``, ``ring``): dimension-order routing
  (x first, then y, then z); on a torus each dimension goes the shorter way round, ties
  (exactly half way) go in the + direction. These routes are minimal.
* Healthy ``switched``: up/down routing through the fat-tree. Same node: GPU -> NVSwitch ->
  GPU. Other node: up to the leaf of the source's rail (NICs on the NVSwitch: through it),
  over a spine when that is not the leaf of the destination's rail and leaf group, down to
  the destination (cross-rail traffic goes through a spine, not over NVLink: no PXN). The
  spine is chosen by deterministic ECMP, *destination mod k* (``spine = spines[dst_node mod
  S]``, the static d-mod-k routing of InfiniBand fat-trees), so traffic towards different
  nodes spreads over the spines instead of piling onto one; a spine whose links failed is
  skipped (the choice is made mod the number of healthy spines).
* Any other graph (``dragonfly2d``), or a grid with failed edges: BFS shortest path (fewest
  hops; NetworkX, deterministic for a given graph). On a degraded ``switched`` graph the
  path avoids relaying through other GPUs when the switches can still connect the pair.

Routes are tuples of directed link ids, cached per (src, dst) until the set of failed edges
changes.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import networkx as nx

from topologies.base import Topology


class NoRoute(RuntimeError):
    """Raised when failures have disconnected ``src`` from ``dst``."""


class Router:
    """Route cache: dimension-order on grids, up/down ECMP on fat-trees, BFS otherwise."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self._cache: dict[tuple[int, int], tuple[int, ...]] = {}
        self._failed: set[tuple[int, int]] = set()
        self._frozen: frozenset[tuple[int, int]] = frozenset()  # _failed, for cache keys
        self._degraded: nx.Graph | None = None
        self._grid = topo.dims is not None
        self._strides = [1]
        for size in (topo.dims or ())[:-1]:
            self._strides.append(self._strides[-1] * size)

    # -- failures ---------------------------------------------------------------------------
    @property
    def failed_edges(self) -> frozenset[tuple[int, int]]:
        """Failed undirected edges as sorted (u, v) pairs (rebuilt only when they change:
        the fabric's plan caches read it at every transfer)."""
        return self._frozen

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
        self._frozen = frozenset(self._failed)
        g = self.topo.graph.copy()
        g.remove_edges_from(self._failed)
        self._degraded = g if self._failed else None

    def _healthy(self, u: int, v: int) -> bool:
        return (min(u, v), max(u, v)) not in self._failed

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

    def nodes(self, src: int, dst: int) -> list[int]:
        """Graph nodes visited from ``src`` to ``dst`` (devices and switches)."""
        route = self.route(src, dst)
        return [src] + [int(self.topo.link_dst[lid]) for lid in route]

    def _compute(self, src: int, dst: int) -> tuple[int, ...]:
        if src == dst:
            return ()
        nodes: list[int] | None = None
        if self._grid and self._degraded is None:
            nodes = self._dimension_order(src, dst)
        elif self.topo.kind == "switched":
            nodes = self._up_down(src, dst)
        if nodes is None:
            nodes = self._shortest(src, dst)
        ids = self.topo.link_ids
        return tuple(ids[(a, b)] for a, b in pairwise(nodes))

    def _shortest(self, src: int, dst: int) -> list[int]:
        g = self._degraded if self._degraded is not None else self.topo.graph
        n = self.topo.n_devices
        try:
            if self.topo.kind == "switched":  # do not relay through other GPUs if avoidable
                view = nx.subgraph_view(g, filter_node=lambda v: v >= n or v in (src, dst))
                try:
                    return nx.shortest_path(view, src, dst)
                except nx.NetworkXNoPath:
                    pass
            return nx.shortest_path(g, src, dst)
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            raise NoRoute(f"no route from {src} to {dst}: failed edges "
                          f"{sorted(self._failed)} disconnect them") from None

    def _dimension_order(self, src: int, dst: int) -> list[int]:
        topo = self.topo
        dims = topo.dims or ()
        cur = [int(c) for c in topo.coords[src]]
        goal = [int(c) for c in topo.coords[dst]]
        strides = self._strides
        node = src
        path = [node]
        for k, size in enumerate(dims):
            delta = goal[k] - cur[k]
            if delta == 0:
                continue
            if topo.wrap:
                fwd = delta % size
                step, count = (1, fwd) if fwd <= size - fwd else (-1, size - fwd)
            else:
                step, count = (1 if delta > 0 else -1), abs(delta)
            for _ in range(count):
                cur[k] = (cur[k] + step) % size
                node = sum(c * s for c, s in zip(cur, strides, strict=True))
                path.append(node)
        return path

    def _up_down(self, src: int, dst: int) -> list[int] | None:
        """Fat-tree route with d-mod-k spine choice; None when a needed edge has failed."""
        ft = self.topo.fat_tree
        n = self.topo.n_devices
        if ft is None or src >= n or dst >= n:
            return None  # routes from or to switches: shortest path
        ks, kd = ft.node_of(src), ft.node_of(dst)
        if ks == kd:
            path = [src, ft.nvswitch(ks), dst]
        else:
            ls, ld = ft.device_leaf(src), ft.device_leaf(dst)
            up = [src] if ft.nic_end(src) == src else [src, ft.nic_end(src)]
            down = [dst] if ft.nic_end(dst) == dst else [ft.nic_end(dst), dst]
            mid = [ls]
            if ls != ld:
                spines = (ft.spines if not self._failed else
                          [s for s in ft.spines if self._healthy(ls, s) and self._healthy(s, ld)])
                if not spines:
                    return None
                mid += [spines[kd % len(spines)], ld]
            path = up + mid + down
        if not self._failed or all(self._healthy(a, b) for a, b in pairwise(path)):
            return path
        return None


#: Most routes :func:`nearest_pair` computes (a bound on the search's cost, not a model number:
#: the nearest pairs are a few graph hops away).
NEIGHBOUR_PROBES = 1024


def nearest_pair(topo: Topology, router: Router, keep: Callable[[tuple[int, ...]], bool],
                 cost: Callable[[tuple[int, ...]], float]) -> float | None:
    """The least ``cost(route)`` over the routes from device 0 to the devices nearest to it
    whose route ``keep(route)`` accepts, or None when there is none.

    Breadth-first over the graph from device 0, layer by layer, up to one layer past the
    first accepted route and at most :data:`NEIGHBOUR_PROBES` routes: on the symmetric
    fabrics the twin builds (grids, tori, rings, dragonflies, identical nodes under switches)
    device 0's nearest pair of a kind is the fabric's.
    """
    best: float | None = None
    probes, found_at = 0, None
    for depth, layer in enumerate(nx.bfs_layers(topo.graph, 0)):
        if (found_at is not None and depth > found_at + 1) or probes >= NEIGHBOUR_PROBES:
            break
        for v in layer:
            if not 0 < v < topo.n_devices or probes >= NEIGHBOUR_PROBES:
                continue
            probes += 1
            route = tuple(router.route(0, int(v)))
            if route and keep(route):
                best = cost(route) if best is None else min(best, cost(route))
                found_at = depth if found_at is None else found_at
    return best
