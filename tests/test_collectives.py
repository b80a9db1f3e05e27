"""Collective algorithms against their alpha-beta closed forms, contention, ECMP, algorithm
selection in scenarios, and the mesh-vs-torus comparison."""

from __future__ import annotations

import numpy as np
import pytest

from devices.fabric import Fabric
from devices.spec import LinkSpec
from tests.conftest import ROOT, scenario_dict
from topologies.graph import build_topology
from topologies.routing import Router
from twin.catalogs import catalog
from twin.kernel.engine import Engine
from twin.kernel.errors import ScenarioError
from twin.scenario import load_scenario
from workloads import collectives as C


def link(name: str) -> LinkSpec:
    return LinkSpec.model_validate(catalog("links").get(name).values)


NV = link("nvlink4")
NVS = link("nvlink4-switch")
IB = link("ib-ndr400-port")


def alpha(spec: LinkSpec, hops: int) -> float:
    """Per-message alpha of a route of ``hops`` links of ``spec``: overhead + hop latencies."""
    return (spec.overhead_us + hops * spec.latency_us) * 1e-6


def _pipeline_fill(m: float, packet: float, hops: int, bw: float) -> float:
    """Extra time of one message of ``m`` bytes cut into packets that are stored and
    forwarded over ``hops`` equal links: (hops - 1) packet times (the pipeline fills)."""
    k = np.ceil(m / packet)
    return (hops - 1) * (m / k) / bw


def fabric(kind, shape, specs, model="flow", lpe=1, packet_bytes=1 << 20, **opts):
    env = Engine()
    names = {k: (v.name if isinstance(v, LinkSpec) else v) for k, v in opts.items()}
    topo = build_topology(kind, shape, specs[0].name, lpe, **names)
    fab = Fabric(env, topo, Router(topo), {s.name: s for s in specs}, model=model,
                 packet_bytes=packet_bytes)
    return env, topo, fab


def run_concurrently(env, fab, *phase_lists) -> list[float]:
    """Run each list of phases as its own process; return their finishing times."""
    ends: list[float] = [0.0] * len(phase_lists)

    def body(i, phases):
        for ph in phases:
            yield from fab.run_phase(ph)
        ends[i] = env.now

    for i, phases in enumerate(phase_lists):
        env.process(body(i, phases))
    env.run()
    return ends


# ------------------------------------------------------------------ alpha-beta, uncontended
@pytest.mark.parametrize("model", ["flow", "packet"])
@pytest.mark.parametrize("op", C.OPS)
@pytest.mark.parametrize("algorithm, p", [("ring", 8), ("bidir_ring", 8), ("bidir_ring", 5)])
def test_ring_algorithms_match_alpha_beta(model, op, algorithm, p):
    """Uncontended ring and bidirectional ring on a ring of p devices: within 2% of
    k(p-1) alpha + k(p-1)/p n' / B, with n' = n (ring) or n/2 (bidirectional, p > 2)."""
    n = 64e6
    env, topo, fab = fabric("ring", (p,), [NV], model, lpe=2, packet_bytes=1 << 18)
    group = np.arange(p)[None, :]
    (t,) = run_concurrently(env, fab, C.collective_phases(op, algorithm, group, n, topo))
    fn = C.ring_time if algorithm == "ring" else C.bidir_ring_time
    expect = fn(op, p, n, alpha(NV, 1), 2 * NV.bytes_per_s)
    assert t == pytest.approx(expect, rel=0.02)
    if algorithm == "bidir_ring" and p > 2:  # twice the ring's bandwidth
        ring = C.ring_time(op, p, n, alpha(NV, 1), 2 * NV.bytes_per_s)
        assert t < 0.6 * ring


@pytest.mark.parametrize("model", ["flow", "packet"])
@pytest.mark.parametrize("op", C.OPS)
@pytest.mark.parametrize("shape", [(4, 4), (4, 2)])
def test_torus2d_algorithm_matches_alpha_beta(model, op, shape):
    """2D-torus all-reduce (RS along X, AR along Y, AG along X) over the whole torus, all
    rows / columns concurrently: within 2% of its closed form."""
    n = 64e6
    env, topo, fab = fabric("torus2d", shape, [NV], model, lpe=4, packet_bytes=1 << 18)
    group = np.arange(topo.n_devices)[None, :]
    (t,) = run_concurrently(env, fab, C.collective_phases(op, "torus2d", group, n, topo))
    bw = 4 * NV.bytes_per_s
    if shape[1] == 2:  # a 2-long torus line: the wrap doubles the y edge
        bw_y = 8 * NV.bytes_per_s
    else:
        bw_y = bw
    expect = C.torus2d_time(op, shape[0], shape[1], n, alpha(NV, 1), bw, alpha(NV, 1), bw_y)
    assert t == pytest.approx(expect, rel=0.02)


@pytest.mark.parametrize("model", ["flow", "packet"])
@pytest.mark.parametrize("op", C.OPS)
def test_hierarchical_matches_its_closed_form(model, op):
    """Hierarchical all-reduce on 4 nodes x 4 GPUs (NVSwitch in node, one NIC per GPU): ring
    RS over the NVSwitch (2 hops), all-reduce of n/4 per rail over its leaf (2 hops), AG.
    The packet model adds one packet time per step and extra hop (store-and-forward pipeline
    fill), which the alpha-beta form omits."""
    n, packet = 32e6, 1 << 20
    env, topo, fab = fabric("switched", (4, 4), [NVS, IB], model, lpe=18,
                            packet_bytes=packet, nic_link=IB)
    group = np.arange(16)[None, :]
    phases = C.collective_phases(op, "hierarchical", group, n, topo)
    (t,) = run_concurrently(env, fab, phases)
    b_in, b_out = 18 * NVS.bytes_per_s, IB.bytes_per_s
    expect = C.hierarchical_time(op, 4, 4, n, alpha(NVS, 2), b_in, alpha(IB, 2), b_out)
    if model == "packet":
        k = 2 if op == "allreduce" else 1
        expect += k * 3 * _pipeline_fill(n / 4, packet, 2, b_in)
        expect += k * 3 * _pipeline_fill(n / 16, packet, 2, b_out)
    assert t == pytest.approx(expect, rel=0.01)


def test_auto_picks_hierarchical_only_where_it_fits():
    sw = build_topology("switched", (4, 4), "a", nic_link="b")
    assert C.resolve("auto", np.arange(16)[None, :], sw) == "hierarchical"
    assert C.resolve("auto", np.array([[0, 4, 8, 12]]), sw) == "ring"      # 1 per node
    assert C.resolve("auto", np.array([[0, 1, 2, 3]]), sw) == "ring"       # one node
    assert C.resolve("auto", np.array([[0, 1, 2, 4]]), sw) == "ring"       # unequal
    torus = build_topology("torus2d", (4, 4), "a")
    assert C.resolve("auto", np.arange(16)[None, :], torus) == "ring"


@pytest.mark.parametrize("algorithm, kind, shape", [
    ("ring", "torus2d", (4, 4)), ("bidir_ring", "torus2d", (4, 4)),
    ("torus2d", "torus2d", (4, 4)), ("torus2d", "mesh2d", (4, 3)),
    ("hierarchical", "switched", (4, 4))])
def test_allreduce_sends_the_bandwidth_optimal_volume(algorithm, kind, shape):
    """Every algorithm here is bandwidth-optimal: an all-reduce of n bytes over p ranks sends
    2(p-1) n bytes in total; reduce-scatter and all-gather send (p-1) n."""
    topo = build_topology(kind, shape, "a", nic_link="b" if kind == "switched" else None)
    p = topo.n_devices
    group = np.arange(p)[None, :]
    n = 1e6
    for op, factor in (("allreduce", 2), ("reduce_scatter", 1), ("allgather", 1)):
        phases = C.collective_phases(op, algorithm, group, n, topo)
        assert sum(ph.total_bytes for ph in phases) == pytest.approx(factor * (p - 1) * n)


def test_grid_and_node_matrices():
    t = build_topology("torus2d", (4, 4), "a")
    m = C.grid_matrix(t, np.array([9, 1, 3, 11]))           # x in {1, 3}, y in {0, 2}
    np.testing.assert_array_equal(m, [[1, 3], [9, 11]])
    with pytest.raises(C.AlgorithmError, match="not a 2D sub-grid"):
        C.grid_matrix(t, np.array([0, 1, 5]))
    t3 = build_topology("torus3d", (2, 2, 2), "a")
    with pytest.raises(C.AlgorithmError, match="3 dimensions"):
        C.grid_matrix(t3, np.arange(8))
    sw = build_topology("switched", (4, 2), "a", nic_link="b")
    np.testing.assert_array_equal(C.node_matrix(sw, np.array([5, 0, 4, 1])), [[0, 1], [4, 5]])
    with pytest.raises(C.AlgorithmError, match="unequal"):
        C.node_matrix(sw, np.array([0, 1, 4]))


# ------------------------------------------------------------------ contention
@pytest.mark.parametrize("algorithm, kind, shape, specs, opts", [
    ("ring", "ring", (8,), [NV], {}),
    ("bidir_ring", "ring", (8,), [NV], {}),
    ("torus2d", "torus2d", (4, 4), [NV], {}),
    ("hierarchical", "switched", (4, 4), [NVS, IB], {"nic_link": IB}),
])
@pytest.mark.parametrize("model", ["flow", "packet"])
def test_two_collectives_sharing_links_take_longer(algorithm, kind, shape, specs, opts,
                                                   model):
    """Two identical all-reduces at once on the same links: both are delayed, and the later
    cannot end before the busiest link has carried twice the bytes (work conservation). The
    flow model shares fairly (both end together at about 2x); the packet model serves FIFO
    (the first to queue is delayed less)."""
    n = 32e6
    group = np.arange(int(np.prod(shape)))[None, :]
    env, topo, fab = fabric(kind, shape, specs, model, packet_bytes=1 << 19, **opts)
    phases = C.collective_phases("allreduce", algorithm, group, n, topo)
    (alone,) = run_concurrently(env, fab, phases)
    busiest = int(np.argmax(fab.link_bytes / fab.capacity))
    one = fab.link_bytes[busiest]
    env, topo, fab = fabric(kind, shape, specs, model, packet_bytes=1 << 19, **opts)
    both = run_concurrently(env, fab, phases, phases)
    assert fab.link_bytes[busiest] == pytest.approx(2 * one)
    assert max(both) >= 2 * one / fab.capacity[busiest]
    assert min(both) > 1.05 * alone
    assert max(both) > 1.5 * alone


# ------------------------------------------------------------------ fat-tree ECMP
def _flat_ring_time(oversubscription: float, model: str = "flow") -> tuple[float, float]:
    """Flat ring all-reduce over 4 nodes x 8 GPUs; returns (simulated, IB-bound closed form)."""
    n = 64e6
    env, topo, fab = fabric("switched", (8, 4), [NVS, IB], model, lpe=18, nic_link=IB,
                            oversubscription=oversubscription)
    group = np.arange(32)[None, :]
    (t,) = run_concurrently(env, fab, C.collective_phases("allreduce", "ring", group, n, topo))
    # cross-node ring edges: GPU 7 of node k -> GPU 0 of node k+1 = NIC, leaf, spine, leaf
    expect = C.ring_time("allreduce", 32, n, alpha(IB, 4), IB.bytes_per_s)
    return t, expect


def test_ecmp_keeps_a_cross_rail_ring_off_one_spine():
    """The four cross-node edges of a flat ring all leave rail leaf 7 for rail leaf 0; the
    spine choice spreads them over the 4 spines, so the ring runs at NIC bandwidth. With one
    spine (oversubscription 4) they share one uplink and the ring is ~4x slower."""
    t, expect = _flat_ring_time(1.0)
    assert t == pytest.approx(expect, rel=0.02)
    t1, _ = _flat_ring_time(4.0)
    assert t1 > 3.5 * t


# ------------------------------------------------------------------ scenarios
def _problems(raw, overrides=()):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(raw, list(overrides))
    return exc.value.problems


def test_torus2d_on_a_group_that_is_not_a_subgrid_is_a_field_error():
    """4x4 torus, dp 4 x tp 4: TP takes whole rows and a DP group is a column, a line, not a
    2D sub-grid; the error names network.dp_algorithm and what is allowed. On a mesh the TP
    groups take 2x2 blocks and the DP groups {0,2} x {0,2}: both are sub-grids."""
    raw = scenario_dict(cluster__topology={"kind": "torus2d", "shape": [4, 4]},
                        workload__parallelism={"dp": 4, "tp": 4, "pp": 1})
    (p,) = _problems(raw, ["network.dp_algorithm=torus2d"])
    assert p.path == "network.dp_algorithm" and "not a 2D sub-grid" in p.message
    assert p.value == "torus2d" and "ring" in p.allowed
    (p,) = _problems(raw, ["workload.placement=spread", "network.tp_algorithm=torus2d"])
    assert p.path == "network.tp_algorithm" and "line" in p.message
    mesh = load_scenario(raw, ["cluster.topology.kind=mesh2d", "network.dp_algorithm=torus2d",
                               "network.tp_algorithm=torus2d"])
    assert mesh.network.algorithms == {"tp": "torus2d", "dp": "torus2d"}
    # a whole-grid dp group is a sub-grid: accepted
    ok = load_scenario(scenario_dict(cluster__topology={"kind": "torus2d", "shape": [4, 4]},
                                     workload__parallelism={"dp": 16}, workload__global_batch=16),
                       ["network.dp_algorithm=torus2d"])
    assert ok.network.dp_algorithm == "torus2d"


def test_hierarchical_needs_a_switched_cluster_with_equal_nodes():
    (p,) = _problems(scenario_dict(), ["network.tp_algorithm=hierarchical"])
    assert p.path == "network.tp_algorithm" and "switched" in p.message
    raw = scenario_dict(cluster__topology={"kind": "switched", "shape": [4, 2]},
                        cluster__link="nvlink4-switch", cluster__nic_link="ib-ndr400-port",
                        workload__parallelism={"dp": 1, "tp": 1, "pp": 8},
                        workload__global_batch=8)
    (p,) = _problems(raw, ["network.dp_algorithm=bogus"])
    assert p.path == "network.dp_algorithm" and "hierarchical" in p.allowed


def test_algorithm_choice_changes_the_run_and_the_phase_cache_key(tmp_path):
    """The same scenario with dp ring vs bidirectional ring: the bidirectional all-reduce is
    faster and moves the same bytes (the algorithm reaches the executor through the Layout,
    and the phase cache keeps the two apart)."""
    from twin.runner import run

    base = scenario_dict(cluster__topology={"kind": "ring", "shape": [8]},
                         workload__global_batch=8)
    base["trace"] = {"enabled": False}
    ring = run(load_scenario(base, ["network.dp_algorithm=ring",
                                          "workload.grad_bucket_mb=1e6"])).summary
    bidir = run(load_scenario(base, ["network.dp_algorithm=bidir_ring",
                                           "workload.grad_bucket_mb=1e6"])).summary
    assert bidir["bytes_sent"] == pytest.approx(ring["bytes_sent"])
    assert bidir["dp_wait_per_device_s"] < ring["dp_wait_per_device_s"]
    assert bidir["iteration_time_s"] < ring["iteration_time_s"]


@pytest.mark.parametrize("cluster, algorithm", [
    ({"topology": {"kind": "ring", "shape": [8]}}, "bidir_ring"),
    ({"topology": {"kind": "torus2d", "shape": [4, 2]}}, "torus2d"),
    ({"topology": {"kind": "switched", "shape": [4, 2]}, "link": "nvlink4-switch",
      "links_per_edge": 18, "nic_link": "ib-ndr400-port"}, "hierarchical"),
])
def test_run_gradient_allreduce_matches_the_algorithms_closed_form(cluster, algorithm,
                                                                   tmp_path):
    """End to end: one bucket holding every gradient, nothing else on the links; the DP
    all-reduce of the trace takes the chosen algorithm's alpha-beta time (every algorithm
    here sends 2(p-1) n bytes in all, which gives n)."""
    from twin.runner import run
    from twin.trace import read_table

    raw = scenario_dict()
    raw["cluster"].update(cluster)
    raw["cluster"].setdefault("links_per_edge", 4)
    raw["trace"] = {"path": str(tmp_path / "t.h5")}
    scen = load_scenario(raw, ["workload.grad_bucket_mb=1e6",
                               f"network.dp_algorithm={algorithm}"])
    res = run(scen)
    ops = read_table(res.trace_path, "ops")
    (dur,) = (ops.t_end - ops.t_start)[ops.kind == "dp"]
    n = res.summary["bytes_sent"] / (2 * 7)
    if algorithm == "bidir_ring":
        expect = C.bidir_ring_time("allreduce", 8, n, alpha(NV, 1), 4 * NV.bytes_per_s)
    elif algorithm == "torus2d":  # x rings of 4; y rings of 2 over the doubled wrap edge
        expect = C.torus2d_time("allreduce", 4, 2, n, alpha(NV, 1), 4 * NV.bytes_per_s,
                                alpha(NV, 1), 8 * NV.bytes_per_s)
    else:
        expect = C.hierarchical_time("allreduce", 4, 2, n, alpha(NVS, 2),
                                     18 * NVS.bytes_per_s, alpha(IB, 2), IB.bytes_per_s)
    assert dur == pytest.approx(expect, rel=0.01)
    assert res.summary["bytes_sent"] == pytest.approx(res.summary["bytes_received"])


# ------------------------------------------------------------------ mesh vs torus
def test_mesh_is_slower_than_torus_for_spread_out_dp_rings(tmp_path):
    """Same 16 H100s, model and strategy (dp 4 x tp 4, default placement, gradient
    all-reduce dominated). The torus gives TP whole rows (1-hop rings over the wrap links)
    and DP whole columns; the mesh cannot close a row in one hop, so its TP groups take 2x2
    blocks and its DP rings get 2-hop edges that overlap. Why, in numbers: hops per DP ring
    edge double, the busiest link carries twice the bytes, and the bandwidth-bound DP
    all-reduce slows by that same ratio. The even-sided pure-DP control has a Hamiltonian
    cycle on both and runs equally fast."""
    from experiments.mesh_vs_torus import CASES, run_case

    case = next(c for c in CASES if c.name == "dp4tp4-4x4")
    mesh = run_case(case, "mesh2d", tmp_path)
    torus = run_case(case, "torus2d", tmp_path)
    assert mesh["dp_allreduce_s"] > 0.5 * mesh["iteration_time_s"]   # DP-dominated
    assert mesh["iteration_time_s"] > 1.2 * torus["iteration_time_s"]
    assert mesh["hops_dp"] == 2.0 and torus["hops_dp"] == 1.0          # why: hops ...
    assert mesh["hops_tp"] == torus["hops_tp"] == 1.0
    load_ratio = mesh["max_link_bytes"] / torus["max_link_bytes"]     # ... and link load
    assert load_ratio == pytest.approx(2.0, rel=0.01)
    assert mesh["dp_allreduce_s"] / torus["dp_allreduce_s"] == pytest.approx(load_ratio,
                                                                              rel=0.05)
    assert mesh["out_bytes_deg4"] > mesh["out_bytes_deg2"]   # interior carries the detours
    assert np.isnan(torus["out_bytes_deg2"])                  # the torus has no corners
    for r in (mesh, torus):
        assert r["bytes_sent"] == pytest.approx(r["bytes_received"])
    assert mesh["bytes_sent"] == pytest.approx(torus["bytes_sent"])  # same work, other paths
    control = next(c for c in CASES if c.name == "dp16-4x4")
    m, t = run_case(control, "mesh2d", tmp_path), run_case(control, "torus2d", tmp_path)
    assert m["hops_dp"] == t["hops_dp"] == 1.0
    assert m["iteration_time_s"] == pytest.approx(t["iteration_time_s"], rel=1e-6)


def test_mesh_vs_torus_cli_writes_csv_and_png(tmp_path):
    from experiments.mesh_vs_torus import main

    assert main(["-o", str(tmp_path), "--case", "dp16-4x4", "--case", "dp25-5x5"]) == 0
    text = (tmp_path / "mesh_vs_torus.csv").read_text()
    assert text.count("\n") == 5 and "hops_dp" in text.splitlines()[0]
    assert (tmp_path / "mesh_vs_torus.png").stat().st_size > 10_000


def test_scenario_library_has_every_topology_kind():
    import yaml

    kinds = {(yaml.safe_load(p.read_text()).get("cluster") or {}).get("topology", {}).get("kind")
             for p in (ROOT / "scenarios").glob("*.yaml")}
    assert {"dragonfly2d", "ring", "torus3d", "switched"} <= kinds


# ------------------------------------------------------------------ more closed forms
def test_torus2d_algorithm_on_mesh_pays_the_walk_back():
    """On a mesh each row ring closes over X-1 hops: the per-step latency grows (bulk-
    synchronous steps wait for the longest route) while the bandwidth term does not, because
    the walk back uses the otherwise idle opposite direction."""
    n = 8e6
    env, topo, fab = fabric("mesh2d", (4, 3), [NV])
    (t,) = run_concurrently(env, fab, C.collective_phases("allreduce", "torus2d",
                                                          np.arange(12)[None, :], n, topo))
    bw = NV.bytes_per_s
    expect = C.torus2d_time("allreduce", 4, 3, n, alpha(NV, 3), bw, alpha(NV, 2), bw)
    assert t == pytest.approx(expect, rel=0.02)


@pytest.mark.parametrize("model", ["flow", "packet"])
def test_hierarchical_across_spines_matches_its_closed_form(model):
    """Two nodes per leaf: the cross-node rings of each rail also cross a spine (NIC, leaf,
    spine, leaf, NIC: 4 hops); d-mod-k keeps the rails' flows on separate links, so the
    closed form holds with a 4-hop alpha. The packet model adds the store-and-forward
    pipeline fill of every step (1 packet per extra hop), which the alpha-beta form omits."""
    g, nodes, n, packet = 4, 4, 32e6, 1 << 20
    env, topo, fab = fabric("switched", (g, nodes), [NVS, IB], model, lpe=18,
                            packet_bytes=packet, nic_link=IB, nodes_per_leaf=2)
    group = np.arange(g * nodes)[None, :]
    assert C.resolve("auto", group, topo) == "hierarchical"
    (t,) = run_concurrently(env, fab, C.collective_phases("allreduce", "auto", group, n, topo))
    b_in, b_out = 18 * NVS.bytes_per_s, IB.bytes_per_s
    expect = C.hierarchical_time("allreduce", g, nodes, n, alpha(NVS, 2), b_in, alpha(IB, 4),
                                 b_out)
    if model == "packet":
        expect += 2 * (g - 1) * _pipeline_fill(n / g, packet, 2, b_in)
        expect += 2 * (nodes - 1) * _pipeline_fill(n / (g * nodes), packet, 4, b_out)
    assert t == pytest.approx(expect, rel=0.01)
    flat = C.ring_time("allreduce", g * nodes, n, alpha(IB, 4), IB.bytes_per_s)
    assert t < flat  # the point of the hierarchy: only n/g per GPU crosses the slow network


def test_dmodk_spreads_leaf_to_leaf_traffic_over_the_spines():
    """Every node of leaf group 0 sends to a node of leaf group 1 on the same rail: with one
    flow per spine the transfer takes n/B of one NIC; piled onto one spine it would take
    (hosts per leaf) x longer."""
    hosts, n = 4, 200e6
    env, topo, fab = fabric("switched", (2, 2 * hosts), [NVS, IB], lpe=18, nic_link=IB,
                            nodes_per_leaf=hosts)
    src = np.array([2 * k for k in range(hosts)])            # GPU 0 of nodes 0..3
    dst = src + 2 * hosts                                    # GPU 0 of nodes 4..7
    (t,) = run_concurrently(env, fab, C.point_to_point(src, dst, n))
    assert t == pytest.approx(alpha(IB, 4) + n / IB.bytes_per_s, rel=1e-3)
    spines = {fab.router.nodes(int(a), int(b))[2] for a, b in zip(src, dst, strict=True)}
    assert spines == set(topo.fat_tree.spines)


def test_rail_rings_reach_nic_bandwidth_per_rail():
    """NCCL-style rail rings across 2 nodes of 8: every NIC carries one ring crossing, so the
    all-reduce bus bandwidth per NIC equals the NIC bandwidth (independent of the calibration
    figure: here against the link spec itself)."""
    from devices.fabric import Fabric
    from devices.spec import LinkSpec
    from topologies.graph import build_topology
    from topologies.routing import Router
    from twin.catalogs import catalog
    from twin.kernel.engine import Engine

    nv = LinkSpec.model_validate(catalog("links").get("nvlink4-switch").values)
    ib = LinkSpec.model_validate(catalog("links").get("ib-ndr400-port").values)
    topo = build_topology("switched", (8, 2), nv.name, 18, nic_link=ib.name)
    env = Engine()
    fab = Fabric(env, topo, Router(topo), {nv.name: nv, ib.name: ib})
    n = 16 * 2**30
    phases = C.collective_phases("allreduce", "rail_rings", np.arange(16)[None, :], n, topo)
    assert len(phases) == 1 and len(phases[0].src) == 8 * 16  # 8 channels x 16 ranks

    def body():
        yield from fab.run_phase(phases[0])
    env.process(body())
    env.run()
    per_nic = C.bus_bandwidth("allreduce", 16, n, env.now) / 8
    assert per_nic == pytest.approx(ib.bytes_per_s, rel=0.01)
    # every NIC link carries the same bytes (one crossing each way per channel)
    nic = [lid for lid in range(topo.n_links) if topo.edge_attr(lid, "link") == ib.name]
    loads = fab.link_bytes[nic]
    assert loads[loads > 0].std() / loads[loads > 0].mean() < 1e-9


@pytest.mark.parametrize("op", ["allreduce", "allgather", "reduce_scatter"])
def test_a_collective_of_one_rank_or_of_no_bytes_has_no_phases(op):
    """Nothing to exchange: groups of one member (any bytes), or groups of four moving 0
    bytes, give no phase for any algorithm; four members and bytes give some."""
    from workloads.collectives import collective_phases

    topo = build_topology("torus2d", (4, 4), "a")
    one = np.arange(16)[:, None]
    four = np.arange(16).reshape(4, 4)
    for algo in ("ring", "bidir_ring"):
        assert collective_phases(op, algo, one, 1e6, topo) == []
        assert collective_phases(op, algo, four, 0.0, topo) == []
        assert collective_phases(op, algo, four, 1e6, topo) != []
    # one rank is no 2D sub-grid, and needs none: nothing to exchange
    assert collective_phases(op, "torus2d", one, 1e6, topo) == []
