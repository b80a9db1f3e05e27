"""Topologies, routing and placement."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from topologies.graph import build_topology
from topologies.placement import device_order, place, ring_order, snake_cycle
from topologies.routing import NoRoute, Router


def test_mesh_edges_and_corners_have_fewer_links():
    deg = build_topology("mesh2d", (4, 4), "x").degree().reshape(4, 4)
    assert deg[0, 0] == 2 and deg[0, 1] == 3 and deg[1, 1] == 4
    assert (build_topology("torus2d", (4, 4), "x").degree() == 4).all()


def test_directed_links_two_per_edge():
    t = build_topology("torus2d", (4, 3), "x")
    assert t.n_links == 2 * t.graph.number_of_edges() == 2 * 24
    for lid in range(t.n_links):
        assert t.link_id(int(t.link_src[lid]), int(t.link_dst[lid])) == lid


def test_size_two_torus_doubles_the_edge():
    t = build_topology("torus2d", (2, 4), "x", links_per_edge=3)
    assert t.graph.edges[0, 1]["count"] == 6


def test_dimension_order_takes_shorter_way_on_torus():
    t = build_topology("torus2d", (8, 8), "x")
    r = Router(t)
    assert r.hops(0, 7) == 1          # wrap in x
    assert r.hops(0, 8 * 7) == 1      # wrap in y
    assert r.hops(0, 4 + 8 * 4) == 8  # half way in both
    m = Router(build_topology("mesh2d", (8, 8), "x"))
    assert m.hops(0, 7) == 7
    nodes = [int(t.link_src[lid]) for lid in r.route(0, 2 + 8 * 3)] + [2 + 8 * 3]
    xs = [n % 8 for n in nodes]
    assert xs[:3] == [0, 1, 2]  # x first, then y


@given(st.integers(2, 7), st.integers(1, 7), st.data())
def test_routes_are_connected_and_minimal(nx_, ny, data):
    kind = data.draw(st.sampled_from(["torus2d", "mesh2d"]))
    t = build_topology(kind, (nx_, ny), "x")
    r = Router(t)
    a = data.draw(st.integers(0, t.n_devices - 1))
    b = data.draw(st.integers(0, t.n_devices - 1))
    route = r.route(a, b)
    node = a
    for lid in route:
        assert int(t.link_src[lid]) == node
        node = int(t.link_dst[lid])
    assert node == b
    import networkx as nx
    assert len(route) == nx.shortest_path_length(t.graph, a, b)


def test_failed_edge_detour_and_disconnection():
    t = build_topology("mesh2d", (3, 1), "x")
    r = Router(t)
    r.fail_edge(0, 1)
    with pytest.raises(NoRoute):
        r.route(0, 2)
    r.restore_edge(0, 1)
    assert r.hops(0, 2) == 2


@pytest.mark.parametrize("shape", [(4, 4), (4, 3), (3, 4), (2, 2), (8, 6)])
def test_snake_cycle_is_hamiltonian(shape):
    cells = snake_cycle(*shape)
    assert len(set(cells)) == shape[0] * shape[1]
    for (x0, y0), (x1, y1) in zip(cells, cells[1:] + cells[:1], strict=True):
        assert abs(x0 - x1) + abs(y0 - y1) == 1


def test_full_ring_on_torus_and_mesh_is_one_hop_per_edge():
    for kind in ("torus2d", "mesh2d"):
        t = build_topology(kind, (4, 4), "x")
        r = Router(t)
        ring = ring_order(t, np.arange(16))
        hops = [r.hops(int(a), int(b)) for a, b in zip(ring, np.roll(ring, -1), strict=True)]
        assert hops == [1] * 16


def test_line_ring_closes_cheaply_on_torus_only():
    """A ring over one row: the torus wraps in one hop, the mesh needs to walk back."""
    for kind, closing in (("torus2d", 1), ("mesh2d", 7)):
        t = build_topology(kind, (8, 1), "x")
        ring = ring_order(t, np.arange(8))
        assert Router(t).hops(int(ring[-1]), int(ring[0])) == closing


def test_placement_policies():
    t = build_topology("torus2d", (4, 4), "x")
    snake = place(t, 4, 2, 2, "snake")
    assert sorted(snake) == list(range(16))
    np.testing.assert_array_equal(snake, device_order(t))
    np.testing.assert_array_equal(place(t, 4, 2, 2, "row-major"), np.arange(16))
    with pytest.raises(ValueError):
        place(t, 3, 2, 2)
