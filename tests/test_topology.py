"""Topologies, routing and placement."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topologies.graph import MissingLinkType, build_topology
from topologies.placement import (
    PLACEMENTS,
    boustrophedon,
    device_order,
    dor_link_load,
    grid_cycle,
    place,
    ring_order,
    ring_walk,
    snake_cycle,
)
from topologies.routing import NEIGHBOUR_PROBES, NoRoute, Router, nearest_pair
from workloads.parallel import Layout


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


@pytest.mark.parametrize("shape", [(1, 4), (4, 1), (1, 1), (3, 3), (1, 5)])
def test_snake_without_a_cycle_is_a_path_of_neighbours(shape):
    """A grid with a side of 1, or both sides odd, has no Hamiltonian cycle: the snake is
    a boustrophedon path, every cell once, each step (not the closing one) to a neighbour
    (a 1 x 4 line must not jump from its first cell to its last)."""
    cells = snake_cycle(*shape)
    assert sorted(cells) == sorted((x, y) for x in range(shape[0]) for y in range(shape[1]))
    for (x0, y0), (x1, y1) in itertools.pairwise(cells):
        assert abs(x0 - x1) + abs(y0 - y1) == 1, cells


def test_switched_and_dragonfly_walks_cross_boundaries_cheaply():
    """``switched``: every GPU once, node by node, and consecutive nodes meet on the same
    rail (GPU index); ``dragonfly2d``: every device once, group by group, and each group
    boundary is crossed on the global link between the two groups (one hop), as the module
    docstring says, where every other group has its own port device (here 5 groups of 4:
    with more groups, ports share devices and a group may enter and leave by the same one)."""
    sw = _switched()
    gpn = sw.fat_tree.gpus_per_node
    walk = ring_walk(sw)
    assert sorted(walk.tolist()) == list(range(sw.n_devices))
    for k in range(sw.fat_tree.nodes):
        assert sorted(walk[k * gpn:(k + 1) * gpn] // gpn) == [k] * gpn
        if k:
            assert walk[k * gpn - 1] % gpn == walk[k * gpn] % gpn
    df = build_topology("dragonfly2d", (4, 5), "x", 2, global_link="g", global_links_per_edge=1)
    a, groups = df.info["group_size"], df.info["groups"]
    order = device_order(df)
    assert sorted(order.tolist()) == list(range(df.n_devices))
    r = Router(df)
    for g in range(groups):
        assert sorted(order[g * a:(g + 1) * a] // a) == [g] * a
        last, first = int(order[(g + 1) * a - 1]), int(order[((g + 1) % groups) * a])
        assert r.hops(last, first) == 1 and df.graph.has_edge(last, first), g


def test_tensor_parallel_rings_of_two_are_scored():
    """The tiling score counts every TP ring edge, a ring of two (there and back) too."""
    from topologies.placement import _ring_edges

    t = build_topology("torus2d", (4, 2), "x")
    order = np.arange(8)
    src, dst = _ring_edges(order, 2, 2, 2, t, lattice=False)["tp"]
    assert sorted(zip(src.tolist(), dst.tolist(), strict=True)) == sorted(
        [(2 * g, 2 * g + 1) for g in range(4)] + [(2 * g + 1, 2 * g) for g in range(4)])


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


def test_lattice_group_rings_along_its_rows():
    """A group filling every second column of rows 0 and 32 of a 64x64 torus: its own 32 x 2
    lattice has a Hamiltonian cycle of 62 steps along the rows (2 hops each) and 2 across
    (32 hops), whatever order the members are given in (``lattice``); the rank order
    (zig-zag between the rows: 34 hops per edge) and the whole-grid snake (a 36-hop jump),
    the candidates without it, are both worse."""
    t = build_topology("torus2d", (64, 64), "x")
    xs, ys = np.meshgrid(np.arange(0, 64, 2), (0, 32), indexing="ij")
    devices = (xs + 64 * ys).ravel()                       # rank order: x outer, y inner
    rng = np.random.default_rng(3)
    for order in (devices, rng.permutation(devices)):
        r = Router(t)
        for lattice in (True, False):
            ring = ring_order(t, order, lattice=lattice)
            assert sorted(ring.tolist()) == sorted(devices.tolist())
            if not lattice:  # the default
                assert ring_order(t, order).tolist() == ring.tolist()
            hops = sorted(r.hops(int(a), int(b)) for a, b in zip(ring, np.roll(ring, -1),
                                                                 strict=True))
            if lattice:
                assert hops == [2] * 62 + [32] * 2
            else:
                assert hops[-1] >= 34


def test_lattice_placement_scores_data_parallel_rings_in_ring_order():
    """GPT-3 175B's layout on a 64x64 torus (tp 8, pp 8, dp 64). Scored with its DP rings
    in the order the collectives run them (``lattice``), the placement takes 4x2 TP blocks
    and stacks a replica's 8 stages along y (a 4 x 16 tile): a DP group is then a 16 x 4
    lattice of spacings 4 and 16, whose snake cycle steps 58 times along x and 6 times
    along y, so (58 * 4 + 6 * 16) / 64 = 5.125 hops per DP ring edge. ``snake`` (scored in
    rank order) puts 2x4 blocks 8 to a 16 x 4 tile, replicas 4 along x: its rank-order rings
    step 16 hops along x 48 times and 20 hops (x wrap and 4 down) 16 times, 17 per edge."""
    t = build_topology("torus2d", (64, 64), "x")
    lattice = Layout(t, 64, 8, 8, "lattice").hops_per_group(Router(t))
    assert lattice["tp"] == 1.0
    assert lattice["dp"] == pytest.approx((58 * 4 + 6 * 16) / 64)
    assert lattice["pp"] == 2.0
    snake = Layout(t, 64, 8, 8).hops_per_group(Router(t))
    assert snake["tp"] == 1.0
    assert snake["dp"] == pytest.approx((48 * 16 + 16 * 20) / 64)


def test_placement_policies():
    t = build_topology("torus2d", (4, 4), "x")
    snake = place(t, 4, 2, 2, "snake")
    assert sorted(snake) == list(range(16))
    np.testing.assert_array_equal(place(t, 16, 1, 1, "snake"), device_order(t))
    np.testing.assert_array_equal(snake, device_order(t, 2, 2))
    np.testing.assert_array_equal(place(t, 4, 2, 2, "row-major"), np.arange(16))
    with pytest.raises(ValueError):
        place(t, 3, 2, 2)


# ----------------------------------------------------------------------- every kind
def _switched(**kw):
    return build_topology("switched", (4, 6), "nvs", 18, nic_link="ib", **kw)


KINDS = {
    "torus2d": lambda: build_topology("torus2d", (4, 3), "x", 2),
    "mesh2d": lambda: build_topology("mesh2d", (4, 3), "x", 2),
    "dragonfly2d": lambda: build_topology("dragonfly2d", (4, 6), "x", 2, global_link="g",
                                          global_links_per_edge=1),
    "ring": lambda: build_topology("ring", (7,), "x", 2),
    "torus3d": lambda: build_topology("torus3d", (3, 4, 3), "x", 2),
    "switched": lambda: _switched(),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_builds_connected_with_typed_edges(kind):
    t = KINDS[kind]()
    assert t.kind == kind
    assert nx.is_connected(t.graph)
    assert t.coords.shape == (t.n_devices, max(2, len(t.shape)))
    for _u, _v, d in t.graph.edges(data=True):
        assert {"link", "count", "dim", "tier"} <= set(d) and d["count"] >= 1
    switches = [v for v in t.graph.nodes if v >= t.n_devices]
    assert all(t.graph.nodes[v]["role"] != "device" for v in switches)
    assert t.n_links == 2 * t.graph.number_of_edges()


def test_grid_degrees_and_counts():
    assert (KINDS["torus2d"]().degree() == 4).all()
    assert sorted(set(KINDS["mesh2d"]().degree().tolist())) == [2, 3, 4]
    t3 = KINDS["torus3d"]()
    assert t3.n_devices == 36 and (t3.degree() == 6).all() and (t3.link_degree() == 12).all()
    r = KINDS["ring"]()
    assert r.n_devices == 7 and (r.degree() == 2).all() and r.link_types() == {"x"}
    assert Router(r).hops(0, 4) == 3 and Router(r).hops(0, 3) == 3  # shorter way round


def test_dragonfly_wiring():
    """K_A inside each group, exactly one global edge per pair of groups, at the documented
    devices; every device has A-1 local and floor/ceil((G-1)/A) global links; diameter 3."""
    a, groups = 4, 6
    t = KINDS["dragonfly2d"]()
    assert t.n_devices == a * groups and t.link_types() == {"x", "g"}
    local = [(u, v) for u, v, d in t.graph.edges(data=True) if d["tier"] == "local"]
    glob = [(u, v, d) for u, v, d in t.graph.edges(data=True) if d["tier"] == "global"]
    assert len(local) == groups * a * (a - 1) // 2
    assert all(u // a == v // a for u, v in local)
    pairs = sorted(tuple(sorted((u // a, v // a))) for u, v, _ in glob)
    assert pairs == [(i, j) for i in range(groups) for j in range(i + 1, groups)]
    for u, v, d in glob:
        i, j = sorted((u // a, v // a))
        lo, hi = (u, v) if u // a == i else (v, u)
        assert lo == (j - 1) % a + a * i and hi == i % a + a * j
        assert d["link"] == "g" and d["count"] == 1 and d["dim"] == 1
    n_global = np.zeros(t.n_devices, dtype=int)
    for u, v, _ in glob:
        n_global[[u, v]] += 1
    assert set(n_global.tolist()) <= {(groups - 1) // a, -(-(groups - 1) // a)}
    assert nx.diameter(t.graph) <= 3


def test_switched_fat_tree_wiring():
    """Rail-optimized: one NIC per GPU on its rail's leaf; full bisection: as many spines as
    hosts per leaf, every leaf to every spine."""
    t = _switched(nodes_per_leaf=2)
    ft = t.fat_tree
    g, nodes = 4, 6
    assert t.n_devices == g * nodes and t.link_types() == {"nvs", "ib"}
    assert ft.rails == g and ft.per_gpu_nics and ft.leaves.shape == (g, 3)
    assert len(ft.spines) == 2 and len(ft.nvswitches) == nodes
    for d in range(t.n_devices):
        nb = {t.graph.nodes[v]["role"]: v for v in t.graph.neighbors(d)}
        assert nb == {"nvswitch": ft.nvswitch(d // g), "leaf": ft.device_leaf(d)}
        assert t.graph.edges[d, nb["nvswitch"]]["link"] == "nvs"
        assert t.graph.edges[d, nb["nvswitch"]]["count"] == 18
        assert t.graph.edges[d, nb["leaf"]]["link"] == "ib"
    for leaf in ft.leaves.ravel():
        assert t.graph.degree(leaf) == 2 + len(ft.spines)   # 2 hosts + every spine
    for s in ft.spines:
        assert t.graph.degree(s) == ft.leaves.size
    half = _switched(nodes_per_leaf=2, oversubscription=2.0)
    assert len(half.fat_tree.spines) == 1
    shared = _switched(nics_per_node=2)
    assert not shared.fat_tree.per_gpu_nics and shared.fat_tree.rails == 2
    sw = shared.fat_tree.nvswitch(0)
    assert sorted(shared.graph.nodes[v]["role"] for v in shared.graph.neighbors(sw)) == \
        ["device"] * 4 + ["leaf"] * 2
    # NICs on the NVSwitch: GPU g of a node leaves through rail g R / G (4 GPUs, 2 rails)
    assert [shared.fat_tree.rail_of(d) for d in range(8)] == [0, 0, 1, 1] * 2
    assert [t.fat_tree.rail_of(d) for d in range(8)] == [0, 1, 2, 3] * 2  # a NIC per GPU
    single = _switched(nics_per_node=1)  # one rail, one leaf: still a fabric
    assert single.fat_tree.leaves.size == 1 and single.fat_tree.has_fabric
    assert single.fat_tree.leaf_groups == 1
    one_node = build_topology("switched", (8, 1), "nvs", 18)
    assert not one_node.fat_tree.has_fabric and one_node.link_types() == {"nvs"}
    assert one_node.fat_tree.leaf_groups == 0
    with pytest.raises(MissingLinkType):
        build_topology("switched", (8, 2), "nvs", 18)


# ----------------------------------------------------------------------- routing
@given(st.data())
@settings(max_examples=60, deadline=None)
def test_routes_connected_and_minimal_on_every_healthy_kind(data):
    kind = data.draw(st.sampled_from(list(KINDS)))
    t = KINDS[kind]()
    r = Router(t)
    a = data.draw(st.integers(0, t.n_devices - 1))
    b = data.draw(st.integers(0, t.n_devices - 1))
    route = r.route(a, b)
    node = a
    for lid in route:
        assert int(t.link_src[lid]) == node
        node = int(t.link_dst[lid])
    assert node == b
    assert len(route) == nx.shortest_path_length(t.graph, a, b)
    assert all(v >= t.n_devices for v in r.nodes(a, b)[1:-1]) or t.fat_tree is None
    assert t.hops(a, b) == len(route)


def test_dimension_order_in_3d():
    t = build_topology("torus3d", (4, 4, 4), "x")
    nodes = Router(t).nodes(0, 1 + 4 * 2 + 16 * 3)
    coords = [tuple(t.coords[v]) for v in nodes]
    assert coords == [(0, 0, 0), (1, 0, 0), (1, 1, 0), (1, 2, 0), (1, 2, 3)]  # z wraps


def test_switched_routes_up_down():
    t = _switched(nodes_per_leaf=2)
    ft = t.fat_tree
    r = Router(t)
    assert r.nodes(0, 3) == [0, ft.nvswitch(0), 3]                          # same node
    assert r.nodes(1, 5) == [1, ft.device_leaf(1), 5]                       # same rail+leaf
    far = r.nodes(1, 4 * 5 + 1)                                              # other leaf group
    assert far[1] == ft.device_leaf(1) and far[2] in ft.spines and len(far) == 5
    cross_rail = r.nodes(0, 5)                                                # rail 0 -> 1
    assert cross_rail[2] in ft.spines and len(cross_rail) == 5


def test_ecmp_spreads_over_spines_and_avoids_failed_ones():
    """Destination-mod-k: flows to the nodes of another leaf group take distinct spines."""
    t = build_topology("switched", (2, 16), "nvs", 18, nic_link="ib", nodes_per_leaf=8)
    ft = t.fat_tree
    r = Router(t)
    src = [2 * k for k in range(8)]          # GPU 0 of nodes 0..7 (leaf group 0)
    dst = [2 * (k + 8) for k in range(8)]    # GPU 0 of nodes 8..15 (leaf group 1)
    used = [r.nodes(a, b)[2] for a, b in zip(src, dst, strict=True)]
    assert sorted(used) == sorted(ft.spines)  # every spine once: no up-link carries two
    leaf = ft.device_leaf(0)
    r.fail_edge(leaf, ft.spines[0])
    used = [r.nodes(a, b)[2] for a, b in zip(src, dst, strict=True)]
    assert ft.spines[0] not in used and len(set(used)) == 7


def test_failed_nic_detours_without_relaying_through_gpus_when_possible():
    t = _switched(nics_per_node=2)
    ft = t.fat_tree
    r = Router(t)
    leaf = ft.leaf(0, 0)
    r.fail_edge(ft.nvswitch(0), leaf)
    path = r.nodes(0, 4)
    assert all(v >= t.n_devices for v in path[1:-1])
    assert ft.leaf(1, 0) in path


# ----------------------------------------------------------------------- placement
@pytest.mark.parametrize("kind, shape, tp", [
    ("torus2d", (8, 8), 8), ("torus2d", (8, 8), 4), ("mesh2d", (8, 8), 8),
    ("mesh2d", (8, 8), 4), ("mesh2d", (4, 4), 2), ("torus3d", (4, 4, 4), 8),
    ("ring", (16,), 2)])
def test_default_placement_keeps_tp_rings_one_hop(kind, shape, tp):
    t = build_topology(kind, shape, "x")
    n = t.n_devices
    lay = Layout(t, n // tp, 1, tp)
    assert sorted(lay.device.tolist()) == list(range(n))
    hops = lay.hops_per_group(Router(t))
    assert hops["tp"] == 1.0
    spread = Layout(t, n // tp, 1, tp, "spread").hops_per_group(Router(t))
    assert spread["tp"] >= 1.0
    if kind == "mesh2d":  # TP peers n/tp apart: a line whose ring walks back
        assert spread["tp"] > 1.0


def test_default_placement_on_switched_and_dragonfly():
    sw = _switched()
    lay = Layout(sw, 6, 1, 4)
    r = Router(sw)
    for g in range(6):
        devs = lay.group_devices("tp", g)
        assert len({d // 4 for d in devs}) == 1             # one node
    assert lay.hops_per_group(r)["tp"] == 2.0                # GPU - NVSwitch - GPU
    dp = lay.group_devices("dp", 0)
    assert len({d % 4 for d in dp}) == 1                     # DP peers on one rail
    df = KINDS["dragonfly2d"]()
    lay = Layout(df, 12, 1, 2)
    assert lay.hops_per_group(Router(df))["tp"] == 1.0
    assert all(len({d // 4 for d in lay.group_devices("tp", g)}) == 1 for g in range(12))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_hops_per_group_equals_brute_force(kind, placement):
    """Layout.hops_per_group against routing every ring edge of every group by hand, with
    every pipeline depth of 1-3 stages the devices allow (two stages: one neighbour pair per
    pipeline, the last stage sends to no one)."""
    t = KINDS[kind]()
    n = t.n_devices
    tp = 2 if n % 2 == 0 else 1
    r = Router(t)
    for pp in [p for p in (1, 2, 3) if (n // tp) % p == 0]:
        lay = Layout(t, n // (tp * pp), pp, tp, placement,
                     algorithms={"tp": "ring", "dp": "ring"})
        got = lay.hops_per_group(r)
        for kind_, count in (("tp", lay.dp * lay.pp), ("dp", lay.pp * lay.tp)):
            h = []
            for g in range(count):
                ring = lay.group_devices(kind_, g)
                assert sorted(ring.tolist()) == sorted(
                    lay.device[lay.group_ranks(kind_, g)].tolist())
                if len(ring) > 1:
                    h += [r.hops(int(a), int(b)) for a, b in zip(ring, np.roll(ring, -1),
                                                                 strict=True)]
            assert got[kind_] == pytest.approx(np.mean(h) if h else 0.0)
        if pp == 1:
            assert got["pp"] == 0.0
            continue
        h = [r.hops(int(lay.device[lay.rank(d, s, tt)]),
                    int(lay.device[lay.rank(d, s + 1, tt)]))
             for d in range(lay.dp) for s in range(pp - 1) for tt in range(tp)]
        assert len(h) == lay.dp * (pp - 1) * tp
        assert got["pp"] == pytest.approx(np.mean(h)), (pp, h)


def test_grid_cycle_is_hamiltonian_in_3d():
    cells = grid_cycle((2, 3, 4))
    assert len(set(cells)) == 24
    for a, b in zip(cells, cells[1:] + cells[:1], strict=True):
        assert sum(abs(x - y) for x, y in zip(a, b, strict=True)) == 1


def test_dor_link_load_matches_router():
    """The closed-form load count used to choose placements equals routing with Router."""
    rng = np.random.default_rng(5)
    for kind, shape in (("torus2d", (5, 4)), ("mesh2d", (4, 6)), ("torus3d", (3, 2, 4))):
        t = build_topology(kind, shape, "x")
        a = rng.integers(0, t.n_devices, 50)
        b = rng.integers(0, t.n_devices, 50)
        r = Router(t)
        counts = np.zeros(t.n_links, dtype=int)
        for x, y in zip(a, b, strict=True):
            for lid in r.route(int(x), int(y)):
                counts[lid] += 1
        load, total = dor_link_load(t.dims, t.wrap, t.coords[a], t.coords[b])
        assert total == counts.sum()
        if all(s > 2 for s in t.dims):  # size-2 wraps double one edge instead of two links
            assert load == counts.max()


def test_dor_link_load_by_hand():
    """Row 0 of a 5x4 torus: (0,0)->(2,0) and (1,0)->(2,0) both cross the link 1->2 (load 2,
    3 hops); (0,0)->(3,0) goes the shorter way round, 0->4->3 (2 hops, each link once); on the
    5x4 mesh the same pair goes 0->1->2->3 and shares 1->2 with the first two (load 3)."""
    a = np.array([[0, 0], [1, 0]])
    b = np.array([[2, 0], [2, 0]])
    assert dor_link_load((5, 4), True, a, b) == (2, 3)
    assert dor_link_load((5, 4), True, np.array([[0, 0]]), np.array([[3, 0]])) == (1, 2)
    three = (np.array([[0, 0], [1, 0], [0, 0]]), np.array([[2, 0], [2, 0], [3, 0]]))
    assert dor_link_load((5, 4), False, *three) == (3, 6)
    assert dor_link_load((5, 4), True, a, a) == (0, 0)


@pytest.mark.parametrize("dims", [(4,), (3, 2), (2, 3, 2), (3, 1, 2, 2)])
def test_boustrophedon_is_a_hamiltonian_path(dims):
    """Every cell once, consecutive cells one step apart in one dimension."""
    cells = boustrophedon(dims)
    assert len(cells) == len(set(cells)) == int(np.prod(dims))
    for c, d in itertools.pairwise(cells):
        assert sum(abs(x - y) for x, y in zip(c, d, strict=True)) == 1


def test_one_link_per_edge_unless_bundled():
    """By default an edge of the grid is one physical link; ``links_per_edge`` bundles more."""
    t = build_topology("mesh2d", (3, 3), "nvlink4")
    np.testing.assert_array_equal(t.link_degree(), t.degree())
    four = build_topology("mesh2d", (3, 3), "nvlink4", 4)
    np.testing.assert_array_equal(four.link_degree(), 4 * t.degree())


def test_rank_classes_by_layout_kind():
    """dp 8 x pp 2 x tp 2 (rank = (d pp + p) tp + t): by default (rank symmetry) a class is a
    pipeline stage's ranks; without symmetry every rank is its own class; with one agent per
    TP group a class is a (d, p) group's tp consecutive ranks."""
    t = build_topology("torus2d", (8, 4), "nvlink4")
    ranks = np.arange(32)
    stage = (ranks // 2) % 2
    default = Layout(t, 8, 2, 2)
    assert [c.tolist() for c in default.classes] == [
        ranks[stage == 0].tolist(), ranks[stage == 1].tolist()]
    assert default.class_stage.tolist() == [0, 1]
    each = Layout(t, 8, 2, 2, symmetric=False)
    assert [c.tolist() for c in each.classes] == [[r] for r in range(32)]
    groups = Layout(t, 8, 2, 2, symmetric=False, tp_groups=True)
    assert [c.tolist() for c in groups.classes] == [[2 * g, 2 * g + 1] for g in range(16)]
    assert groups.class_stage.tolist() == [g % 2 for g in range(16)]


@pytest.mark.parametrize("shard", [None, 1, 2, 4])
def test_group_ids_by_brute_force(shard):
    """dp 8 x pp 2 x tp 2 (ranks d, p, t with t fastest), hybrid shard groups of ``shard``
    ranks: a shard group is ``shard`` consecutive data-parallel ranks of one (p, t), a
    replica group the ranks of one (p, t) with the same d mod shard. Every kind's ids number
    its groups 0 .. n - 1, and ``group_ranks`` of an id gives back exactly its ranks."""
    t = build_topology("torus2d", (8, 4), "nvlink4")
    lay = Layout(t, 8, 2, 2, shard=shard)
    g = shard or 8
    ranks = np.arange(32)
    d, p, tt = ranks // 4, (ranks // 2) % 2, ranks % 2
    keys = {"tp": list(zip(d, p, strict=True)), "dp": list(zip(p, tt, strict=True)),
            "shard": list(zip(p, tt, d // g, strict=True)),
            "replica": list(zip(p, tt, d % g, strict=True))}
    for kind, key in keys.items():
        ids = lay.group_id(kind, ranks)
        groups = {}
        for r, k in enumerate(key):
            groups.setdefault(k, set()).add(r)
        assert sorted(set(ids.tolist())) == list(range(len(groups))), kind
        for members in groups.values():  # one id per group, a different one per group
            assert len({int(ids[r]) for r in members}) == 1, kind
            gid = int(ids[next(iter(members))])
            assert set(lay.group_ranks(kind, gid).tolist()) == members, (kind, gid)


# ----------------------------------------------------------------------- end to end
@pytest.mark.parametrize("name, net", [
    ("dragonfly2d", "flow"), ("dragonfly2d", "packet"), ("ring", "flow"), ("torus3d", "flow"),
    ("switched", "flow"), ("switched-1node", "flow")])
def test_scenario_of_each_new_kind_runs_and_conserves_bytes(name, net, tmp_path):
    from tests.conftest import ROOT
    from twin.build import build
    from twin.runner import run
    from twin.scenario import load_scenario

    over = [f"network.model={net}", "network.packet_kib=4096", "workload.seq_len=256",
            "trace.enabled=false"]
    if name == "switched-1node":
        name, over = "switched", [*over, "cluster.topology.shape=[8, 1]",
                                  "workload.parallelism.dp=2"]
    scen = load_scenario(ROOT / "scenarios" / f"{name}.yaml", over)
    model = build(scen)
    assert model.topo.link_types() <= set(scen.cluster.link_specs())  # every type is mapped
    s = run(scen).summary
    assert s["iteration_time_s"] > 0 and s["bytes_sent"] > 0
    assert s["bytes_sent"] == pytest.approx(s["bytes_received"], rel=1e-12)
    assert s["hops_per_ring_edge"]["tp"] == (2.0 if name == "switched" else 1.0)


# ----------------------------------------------------------------------- scenario fields
@pytest.mark.parametrize("cluster, path, words", [
    ({"topology": {"kind": "switched", "shape": [8, 2]}}, "cluster.nic_link", "required"),
    ({"nic_link": "ib-ndr400-port"}, "cluster.nic_link", "only used by kind switched"),
    ({"global_link": "ib-ndr400"}, "cluster.global_link", "only used by kind dragonfly2d"),
    ({"topology": {"kind": "torus2d", "shape": [4, 2], "nics_per_node": 2}},
     "cluster.topology.nics_per_node", "only used by kind switched"),
    ({"topology": {"kind": "switched", "shape": [2, 4], "nics_per_node": 4},
      "nic_link": "ib-ndr400-port"}, "cluster.topology.nics_per_node", "more NICs"),
    ({"topology": {"kind": "torus3d", "shape": [2, 4]}}, "cluster.topology", "shape of 3"),
    ({"topology": {"kind": "ring", "shape": [4, 2]}}, "cluster.topology", "shape of 1"),
    ({"topology": {"kind": "hypercube", "shape": [8]}}, "cluster.topology.kind", "switched"),
    ({"link": {"base": "nvlink4", "bandwidth_gbps": 30}, "global_link": "nvlink4",
      "topology": {"kind": "dragonfly2d", "shape": [4, 2]}}, "cluster.global_link.name",
     "differs"),
])
def test_topology_fields_are_validated_with_field_names(cluster, path, words):
    from tests.conftest import scenario_dict
    from twin.kernel.errors import ScenarioError
    from twin.scenario import load_scenario

    raw = scenario_dict()
    raw["cluster"].update(cluster)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(raw)
    hits = [p for p in exc.value.problems if p.path == path]
    assert hits, [str(p) for p in exc.value.problems]
    assert words in str(hits[0])


@pytest.mark.parametrize(("kind", "shape"), [("mesh2d", (5, 4)), ("torus2d", (6, 6)),
                                              ("ring", (7,))])
def test_nearest_pair_searches_one_layer_past_the_first_accepted_route(kind, shape):
    """Routes from device 0 on a grid are shortest, so a route's hop count is the breadth-first
    depth of its end. Accepting every route, the least hop count is 1 (a neighbour); the
    largest cost it sees, with cost = -hops, is -2: the search goes one layer past the first
    accepted one (depth 2) and no further. Accepting only routes of 3+ hops, the least is 3."""
    topo = build_topology(kind, shape, "nvlink4", 1)
    router = Router(topo)
    assert nearest_pair(topo, router, lambda r: True, len) == 1
    assert nearest_pair(topo, router, lambda r: True, lambda r: -len(r)) == -2
    assert nearest_pair(topo, router, lambda r: len(r) >= 3, len) == 3
    assert nearest_pair(topo, router, lambda r: False, len) is None


def test_nearest_pair_routes_only_to_other_devices():
    """On a switched fabric the graph's nodes past the devices are switches: a route from
    device 0 to its own NVSwitch (1 hop) is not a pair of devices; the nearest pair is two
    GPUs of one node, 2 hops through the switch."""
    topo = build_topology("switched", (8, 2), "nvlink4-switch", 18, nic_link="ib-ndr400-port")
    assert topo.graph.number_of_nodes() > topo.n_devices  # switches are in the graph
    assert nearest_pair(topo, Router(topo), lambda r: True, len) == 2


def test_nearest_pair_computes_at_most_its_probe_bound_of_routes():
    """A kind no route has, on a 48 x 48 torus (2,303 other devices): the search gives up
    after NEIGHBOUR_PROBES routes, each asked of ``keep`` once."""
    topo = build_topology("torus2d", (48, 48), "nvlink4", 1)
    asked = []
    assert nearest_pair(topo, Router(topo), lambda r: asked.append(r) or False, len) is None
    assert len(asked) == NEIGHBOUR_PROBES


def test_a_failed_spine_link_moves_flows_to_dst_mod_k_over_the_healthy_spines():
    """With one of the source leaf's 8 up-links down, destination node ``kd`` takes spine
    ``healthy[kd mod 7]`` (d-mod-k over the spines healthy on both sides), not a shortest
    path that happens to avoid the failure."""
    t = build_topology("switched", (2, 16), "nvs", 18, nic_link="ib", nodes_per_leaf=8)
    ft = t.fat_tree
    r = Router(t)
    leaf = ft.device_leaf(0)
    r.fail_edge(leaf, ft.spines[0])
    healthy = list(ft.spines[1:])
    for k in range(8):
        dst_node = k + 8
        assert r.nodes(0, 2 * dst_node)[2] == healthy[dst_node % 7]


def test_a_detour_through_switches_is_preferred_to_relaying_through_a_gpu():
    """Up-links failed so that the two leaves of rail 1 share no healthy spine: GPU 3 (node 1)
    to GPU 7 (node 3) has two 6-hop detours, one through a third leaf and the other spine, one
    through another GPU's NIC and its node's NVSwitch. The route takes the switches only."""
    t = build_topology("switched", (2, 4), "nvs", 18, nic_link="ib", nodes_per_leaf=1,
                       oversubscription=0.5)
    ft = t.fat_tree
    r = Router(t)
    a, b = ft.spines
    src_leaf, dst_leaf = ft.device_leaf(3), ft.device_leaf(7)
    for u, v in ((dst_leaf, b), (src_leaf, a), (ft.leaf(0, 3), a), (ft.leaf(1, 2), a)):
        r.fail_edge(u, v)
    path = r.nodes(3, 7)
    assert len(path) == 7
    assert all(v >= t.n_devices for v in path[1:-1]), path


@pytest.mark.parametrize("kw, leaves", [({"nics_per_node": 2}, (2, 1)),
                                        ({"nics_per_node": 1, "nodes_per_leaf": 1}, (1, 2))])
def test_two_leaves_are_joined_by_spines(kw, leaves):
    """Two GPUs per node, two nodes: two rails on one leaf group, or one rail over two leaf
    groups, give two leaves; the network joins them through ceil(hosts / oversubscription)
    spines (2 and 1 here), so every pair of leaves is connected by switch links alone."""
    t = build_topology("switched", (2, 2), "nvs", 18, nic_link="ib", **kw)
    ft = t.fat_tree
    assert ft.leaves.shape == leaves
    hosts = 2 if kw.get("nodes_per_leaf") is None else 1
    assert len(ft.spines) == hosts
    switches = nx.Graph(t.graph.subgraph([*ft.leaves.ravel().tolist(), *ft.spines]))
    assert nx.is_connected(switches)


@pytest.mark.parametrize("kw, nics", [({}, 8), ({"nics_per_node": 2}, 4)])
def test_switched_edges_by_tier(kw, nics):
    """Two nodes of four GPUs: a GPU-NVSwitch edge holds the links_per_edge NVLinks; a NIC
    edge is one port (a GPU's own NIC, or one of a node's shared NICs from its NVSwitch to
    its rail's leaf) and a leaf-spine edge one link (every leaf, one per rail, to each of
    the ceil(2 hosts / 1) = 2 spines); no switched edge belongs to a grid dimension (dim -1
    in the trace's links table)."""
    from collections import Counter

    t = build_topology("switched", (4, 2), "nvs", 18, nic_link="ib", **kw)
    got = Counter((d["tier"], d["dim"], d["count"]) for _u, _v, d in t.graph.edges(data=True))
    rails = kw.get("nics_per_node", 4)
    assert got == {("nvlink", -1, 18): 8, ("nic", -1, 1): nics, ("spine", -1, 1): 2 * rails}
