"""NCCL protocol model (workloads.nccl): bus bandwidth versus message size.

The reference is NCCL's own ring cost model written out here from its source
(NVIDIA/nccl src/graph/tuning.cc, v2.7/2.8: baseLat, hwLat and the protocol bandwidth factors),
independently of the code under test, and evaluated on the bus bandwidth of the links; the
twin runs the collective on its flow fabric. Uncontended, the flow model is exact, so the
tolerance is 0.5% (rounding of the flow engine's event times).
"""

from __future__ import annotations

import numpy as np
import pytest

from devices.fabric import Fabric, Phase
from devices.spec import LinkSpec
from topologies.graph import build_topology
from topologies.routing import Router
from twin.catalogs import catalog
from twin.kernel.engine import Engine
from workloads import collectives, nccl

# NVIDIA/nccl src/graph/tuning.cc (ring rows), microseconds; bandwidth factors per protocol
BASE = {"LL": 3.6, "LL128": 10.0, "simple": 8.4}
HW_NVLINK = {"LL": 0.47, "LL128": 1.9, "simple": 3.4}
HW_NET = {"LL": 2.7, "LL128": 4.0, "simple": 9.6}


def reference_costs(op: str, p: int, n: float, bus: float, nodes: int = 1) -> dict:
    """NCCL's ring model per enabled protocol: ``proto -> (time, latency, bandwidth fraction)``
    with time = base + steps x hw + n / (f B p / steps) (LL128 only inside one node)."""
    steps = 2 * (p - 1) if op == "allreduce" else p - 1
    net = (2 * (nodes - 1) if op == "allreduce" else nodes - 1) if nodes > 1 else 0
    out = {}
    for proto in ("LL", "LL128", "simple"):
        if proto == "LL128" and nodes > 1:
            continue
        f = {"LL": 0.25 if (op == "allreduce" or nodes > 1) else 1 / 3, "LL128": 0.92,
             "simple": 1.0}[proto]
        intra = HW_NVLINK[proto] * (1.8 if proto == "LL" and nodes > 1 else 1.0)
        lat = (BASE[proto] + (steps - net) * intra + net * HW_NET[proto]) * 1e-6
        out[proto] = (lat + n / (f * bus * p / steps), lat, f)
    return out


def reference_time(op: str, p: int, n: float, bus: float, nodes: int = 1) -> float:
    """NCCL's ring time: the fastest protocol's (:func:`reference_costs`)."""
    return min(t for t, _lat, _f in reference_costs(op, p, n, bus, nodes).values())


def twin_time(op: str, n: float, link: str = "nvlink4-switch", gpus: int = 8) -> tuple:
    spec = LinkSpec.model_validate(catalog("links").get(link).values)
    per_gpu = int(catalog("links").get(link).values["links_per_gpu"])
    topo = build_topology("switched", (gpus, 1), link, per_gpu)
    env = Engine()
    fab = Fabric(env, topo, Router(topo), {link: spec})
    group = np.arange(gpus)[None, :]
    phases = nccl.tune_phases(op, collectives.collective_phases(op, "ring", group, n, topo),
                              n, gpus, fab)

    def body():
        for ph in phases:
            yield from fab.run_phase(ph)
    env.process(body())
    env.run()
    return float(env.now), spec.bytes_per_s * per_gpu


@pytest.mark.parametrize("op", ["allreduce", "allgather", "reduce_scatter"])
def test_bus_bandwidth_versus_size_is_nccls_cost_model(op):
    sizes = [2.0 ** k for k in range(10, 31, 4)]
    busbw = []
    for n in sizes:
        t, bus = twin_time(op, n)
        ref = reference_time(op, 8, n, bus)
        assert t == pytest.approx(ref, rel=5e-3), n
        busbw.append(collectives.bus_bandwidth(op, 8, n, t))
    # latency-bound small messages: under 5% of the link at 1 KiB, over 95% at 1 GiB
    assert busbw[0] < 0.05 * bus and busbw[-1] > 0.95 * bus
    assert np.all(np.diff(busbw) > 0)


def test_protocol_switches_from_ll_to_simple_with_size():
    bus = 367e9
    small = nccl.choose_protocol("allreduce", 14, 0, False, 4096, 8, bus)
    large = nccl.choose_protocol("allreduce", 14, 0, False, 2.0 ** 30, 8, bus)
    assert (small, large) == ("LL", "simple")
    # the crossover LL -> LL128 where their closed-form times are equal (derived here):
    # 3.6 + 14 * 0.47 + n / (0.25 B 8/14) = 10 + 14 * 1.9 + n / (0.92 B 8/14)
    lat_gap = ((10.0 + 14 * 1.9) - (3.6 + 14 * 0.47)) * 1e-6
    n_star = lat_gap / (14 / 8 / bus * (1 / 0.25 - 1 / 0.92))
    assert nccl.choose_protocol("allreduce", 14, 0, False, 0.9 * n_star, 8, bus) == "LL"
    assert nccl.choose_protocol("allreduce", 14, 0, False, 1.1 * n_star, 8, bus) != "LL"


def test_alpha_beta_closed_form_at_large_messages():
    """At 16 GiB the protocol latency is negligible and the time is the alpha-beta bandwidth
    term 2(p-1)/p n / B (Thakur, Rabenseifner, Gropp 2005)."""
    n = 16 * 2.0 ** 30
    t, bus = twin_time("allreduce", n)
    assert t == pytest.approx(2 * 7 / 8 * n / bus, rel=1e-3)


def test_tuning_reuses_a_groups_profile_across_sizes_and_not_across_failures():
    """``Fabric.profile`` is cached per pair set and failed edges: a collective tuned at many
    sizes on one fabric gets the phases a fresh fabric gives each size, and after a failure the
    profile follows the failure (a fresh fabric with the same failure is the reference)."""
    link = "nvlink4-switch"
    per_gpu = int(catalog("links").get(link).values["links_per_gpu"])
    topo = build_topology("switched", (8, 2), link, per_gpu, nic_link="ib-ndr400-port")
    group = np.array([[0, 1, 2, 3, 8, 9, 10, 11]])
    specs = {name: LinkSpec.model_validate(catalog("links").get(name).values)
             for name in topo.link_types()}

    def fabric():
        return Fabric(Engine(), topo, Router(topo), specs)

    def tuned(fab, n):
        return nccl.tune_phases("allreduce", collectives.collective_phases(
            "allreduce", "ring", group, n, topo), n, 8, fab)

    def fields(phases):
        return [(p.step_latency_s, p.base_latency_s, p.hop_latency_ref_s) for p in phases]

    shared = fabric()
    for n in (2.0 ** 12, 2.0 ** 20, 2.0 ** 28):
        assert fields(tuned(shared, n)) == fields(tuned(fabric(), n))
    assert len(shared._profiles) == 1  # one pair set, three sizes
    u, v = next((a, b) for a, b in topo.graph.edges() if a < 8 and b >= 16)  # GPU to a switch
    shared.router.fail_edge(u, v)
    fresh = fabric()
    fresh.router.fail_edge(u, v)
    assert fields(tuned(shared, 2.0 ** 20)) == fields(tuned(fresh, 2.0 ** 20))
    assert len(shared._profiles) == 2


@pytest.mark.parametrize("op,ranks,nodes", [("allreduce", 16, 2), ("allgather", 16, 2),
                                            ("reduce_scatter", 32, 4), ("allgather", 2, 1)])
def test_every_protocols_cost_is_the_tuning_models(op, ranks, nodes):
    """Each protocol's (time, latency, bandwidth fraction) against NCCL's ring model written
    out here from tuning.cc: on several nodes LL128 is off, LL's intra-node step latency is
    1.8x and the network steps pay the network latency; a two-rank ring has one step."""
    bus = 50e9
    steps = 2 * (ranks - 1) if op == "allreduce" else ranks - 1
    net = (2 * (nodes - 1) if op == "allreduce" else nodes - 1) if nodes > 1 else 0
    for n in (4096.0, 2.0 ** 20, 2.0 ** 30):
        got = nccl.protocol_costs(op, steps, net, nodes > 1, n, ranks, bus)
        ref = reference_costs(op, ranks, n, bus, nodes)
        assert sorted(got) == sorted(ref) == sorted(
            ["LL", "simple"] + (["LL128"] if nodes == 1 else []))
        for proto, (t, lat, f) in got.items():
            assert (t, f) == pytest.approx(ref[proto][::2], rel=1e-9), proto
            assert lat == pytest.approx(ref[proto][1], rel=1e-12), proto


def test_a_slower_protocol_adds_the_largest_flows_bandwidth_term():
    """A phase whose flows move different bytes (an uneven split), small enough for LL: the
    protocol's lower bandwidth is added as the largest flow's uncontended time x (1/f - 1),
    plus the base latency once; the step latency is LL's on NVLink."""
    link = "nvlink4-switch"
    spec = LinkSpec.model_validate(catalog("links").get(link).values)
    per_gpu = int(catalog("links").get(link).values["links_per_gpu"])
    topo = build_topology("switched", (4, 1), link, per_gpu)
    fab = Fabric(Engine(), topo, Router(topo), {link: spec})
    src, dst = np.arange(4), (np.arange(4) + 1) % 4
    nbytes = np.array([1000.0, 3000.0, 2000.0, 1000.0])
    (ph,) = nccl.tune_phases("allgather", [Phase(src, dst, nbytes, 3)], 4096.0, 4, fab)
    bus = spec.bytes_per_s * per_gpu
    assert ph.step_latency_s == pytest.approx(HW_NVLINK["LL"] * 1e-6, rel=1e-12)
    slow = 3000.0 * 3 / bus * (3.0 - 1.0)  # LL on one node, not all-reduce: f = 1/3
    assert ph.base_latency_s == pytest.approx(BASE["LL"] * 1e-6 + slow, rel=1e-9)


def test_a_link_slower_than_one_byte_per_second_is_still_tuned():
    """Only a phase with no finite, positive bus bandwidth (no route, failed links) is left
    untuned: a valid but absurdly slow link (0.2 GB/s x 1e-9, under one byte per second) is
    tuned like any other (the step latency NCCL's protocol gives, not the untuned None)."""
    link = "nvlink4-switch"
    values = dict(catalog("links").get(link).values, bandwidth_gbps=2e-10)
    spec = LinkSpec.model_validate(values)
    topo = build_topology("switched", (4, 1), link, 1)
    fab = Fabric(Engine(), topo, Router(topo), {link: spec})
    src, dst = np.arange(4), (np.arange(4) + 1) % 4
    bus = fab.profile(Phase(src, dst, np.full(4, 1e3), 3))[0]
    assert 0.0 < bus < 1.0
    (ph,) = nccl.tune_phases("allgather", [Phase(src, dst, np.full(4, 1e3), 3)], 4e3, 4, fab)
    assert ph.step_latency_s is not None and ph.step_latency_s > 0.0


def _two_nodes():
    link = "nvlink4-switch"
    per_gpu = int(catalog("links").get(link).values["links_per_gpu"])
    topo = build_topology("switched", (8, 2), link, per_gpu, nic_link="ib-ndr400-port")
    specs = {name: LinkSpec.model_validate(catalog("links").get(name).values)
             for name in topo.link_types()}
    return topo, Fabric(Engine(), topo, Router(topo), specs)


def test_a_two_level_collective_is_tuned_on_its_slowest_ring():
    """A hierarchical all-reduce over 2 nodes x 8 GPUs, small enough for LL: the protocol's
    bandwidth term uses the slowest level's bus bandwidth (the network ring's, below the
    NVLink ring's), once per phase as its largest flow's time x (1/f - 1) with f = 1/4 (LL,
    all-reduce); the base latency is paid once (first phase); network phases step at LL's
    network latency and NVLink phases at LL's NVLink latency x 1.8 (several nodes)."""
    topo, fab = _two_nodes()
    n = 4096.0
    phases = collectives.collective_phases("allreduce", "hierarchical",
                                           np.arange(16)[None, :], n, topo)
    profiles = [fab.profile(ph) for ph in phases]
    assert len(phases) >= 2
    kinds = {p[1] for p in profiles}
    assert kinds == {True, False}  # both levels
    bus = min(p[0] for p in profiles)
    assert bus < max(p[0] for p in profiles)
    tuned = nccl.tune_phases("allreduce", phases, n, 16, fab)
    for i, (ph, new, (_b, net, _h)) in enumerate(zip(phases, tuned, profiles, strict=True)):
        step = HW_NET["LL"] if net else HW_NVLINK["LL"] * 1.8
        assert new.step_latency_s == pytest.approx(step * 1e-6, rel=1e-12)
        slow = float(np.max(ph.nbytes)) * ph.steps / bus * (4.0 - 1.0)
        base = BASE["LL"] * 1e-6 if i == 0 else 0.0
        assert new.base_latency_s == pytest.approx(base + slow, rel=1e-12)


def test_one_network_step_makes_a_collective_multi_node():
    """A hierarchical all-gather over 2 nodes x 8 GPUs crosses the network in a single step
    (one exchange between the two nodes' rings), then 7 NVLink steps: one network step is
    enough to make it a multi-node collective, so with LL (a small message) its NVLink steps
    pay LL's multi-node factor 1.8 and its network step LL's network latency."""
    topo, fab = _two_nodes()
    phases = collectives.collective_phases("allgather", "hierarchical",
                                           np.arange(16)[None, :], 4096.0, topo)
    assert [(ph.steps, fab.profile(ph)[1]) for ph in phases] == [(1, True), (7, False)]
    net, nvl = nccl.tune_phases("allgather", phases, 4096.0, 16, fab)
    assert net.step_latency_s == pytest.approx(HW_NET["LL"] * 1e-6, rel=1e-12)
    assert nvl.step_latency_s == pytest.approx(HW_NVLINK["LL"] * 1.8 * 1e-6, rel=1e-12)


def test_phases_without_a_route_are_left_as_they_are():
    """A phase whose pairs are each a device with itself crosses no link (profile: infinite
    bandwidth): there is nothing to tune, the phases come back unchanged (the same list)."""
    _topo, fab = _two_nodes()
    same = [Phase(np.arange(4), np.arange(4), np.full(4, 1e3), 3)]
    assert fab.profile(same[0])[0] == float("inf")
    assert nccl.tune_phases("allgather", same, 4e3, 4, fab) is same


def _ring_of(members: list[int], n: float, devices: int, kind: str = "torus2d",
             latency_us: float | None = None) -> float:
    """Time of a tuned ring all-reduce of ``n`` bytes over ``members`` of a ``devices`` x 1
    row of NVLink4 (``kind``: torus2d or mesh2d; ``latency_us``: the link's hop latency, the
    catalog's by default)."""
    values = dict(catalog("links").get("nvlink4").values)
    if latency_us is not None:
        values["latency_us"] = latency_us
    spec = LinkSpec.model_validate(values)
    topo = build_topology(kind, (devices, 1), "nvlink4", 1)
    env = Engine()
    fab = Fabric(env, topo, Router(topo), {"nvlink4": spec})
    phases = nccl.tune_phases("allreduce", collectives.collective_phases(
        "allreduce", "ring", np.array(members)[None, :], n, topo), n, len(members), fab)

    def body():
        for ph in phases:
            yield from fab.run_phase(ph)
    env.process(body())
    env.run()
    return float(env.now)


@pytest.mark.parametrize("n", [4096.0, 2.0 ** 26])
def test_a_ring_closed_along_a_mesh_row_pays_the_extra_hops_at_every_step(n):
    """On a 4 x 1 mesh the ring's closing pair 3 -> 0 is three hops away, on a 4 x 1 torus
    one (the wrap link); the other pairs are neighbours on both, on links of their own
    direction (no sharing). NCCL's step latency covers a step between neighbours, and a step
    lasts as long as its slowest pair, so the mesh ring takes 2 x 3 steps x 2 extra hops x
    the link's hop latency longer, whatever the message size."""
    latency = float(catalog("links").get("nvlink4").values["latency_us"]) * 1e-6
    extra = 2 * (4 - 1) * 2 * latency
    row = [0, 1, 2, 3]
    torus, mesh = _ring_of(row, n, 4), _ring_of(row, n, 4, "mesh2d")
    assert mesh - torus == pytest.approx(extra, rel=1e-6)




def test_hops_slower_than_the_links_nccl_was_measured_over_cost_the_difference_per_step():
    """NCCL's step latency includes one hop of the link it was measured over (the catalog's
    NVLink, 1 us). A ring of neighbours on links of 5 us takes 2 x 3 steps x 4 us longer than
    on 1 us links (it took no longer before: the reference was the fabric's own nearest pair,
    so a link's latency never reached a ring of neighbours); on 0.25 us links it takes as long
    (the constant is not lowered below what was measured). Any size."""
    covered = float(catalog("links").get("nvlink4").values["latency_us"])
    assert covered == 1.0
    row = [0, 1, 2, 3]
    for n in (4096.0, 2.0 ** 26):
        base = _ring_of(row, n, 4, latency_us=1.0)
        assert _ring_of(row, n, 4, latency_us=5.0) - base == pytest.approx(
            2 * 3 * 4e-6, rel=1e-6)
        assert _ring_of(row, n, 4, latency_us=0.25) == pytest.approx(base, rel=1e-12)
        # on a mesh the closing pair's 2 extra hops stay on top, at the slower links' latency
        assert (_ring_of(row, n, 4, "mesh2d", latency_us=5.0)
                - _ring_of(row, n, 4, latency_us=5.0)) == pytest.approx(2 * 3 * 2 * 5e-6,
                                                                         rel=1e-6)


def test_a_ring_whose_pairs_are_all_two_hops_apart_pays_one_extra_hop_per_step():
    """Members 0, 2, 4, 6 of an 8-ring: every pair two hops apart (the routes of one
    direction, no link shared), against 0, 1, 2, 3 of a 4-ring (one hop): the library's step
    latency covers the fabric's nearest pair, so every one of the 2 x 3 steps pays one more
    hop's latency, at any size."""
    latency = float(catalog("links").get("nvlink4").values["latency_us"]) * 1e-6
    for n in (4096.0, 2.0 ** 26):
        strided, packed = _ring_of([0, 2, 4, 6], n, 8), _ring_of([0, 1, 2, 3], n, 4)
        assert strided - packed == pytest.approx(2 * 3 * latency, rel=1e-6)


@pytest.mark.parametrize(("kind", "shape", "link"), [
    ("switched", (8, 2), "nvlink4-switch"), ("switched", (4, 4), "nvlink4-switch"),
    ("mesh2d", (4, 3), "nvlink4"), ("torus2d", (4, 4), "nvlink4"),
    ("dragonfly2d", (4, 3), "nvlink4"), ("ring", (6,), "nvlink4")])
def test_the_fabrics_nearest_pair_is_the_brute_force_minimum(kind, shape, link):
    """``Fabric.neighbours``: the least hop latency over every pair of devices whose route
    stays on device links (False) or crosses the network (True), by brute force over all
    ordered pairs; ``inf`` for a kind no pair has."""
    per_gpu = int(catalog("links").get(link).values.get("links_per_gpu", 1))
    nic = {"nic_link": "ib-ndr400-port"} if kind == "switched" else {}
    topo = build_topology(kind, shape, link, per_gpu if kind == "switched" else 1, **nic)
    specs = {name: LinkSpec.model_validate(catalog("links").get(name).values)
             for name in topo.link_types()}
    fab = Fabric(Engine(), topo, Router(topo), specs)
    brute = {False: np.inf, True: np.inf}
    for a in range(topo.n_devices):
        for b in range(topo.n_devices):
            if a != b:
                route = fab.router.route(a, b)
                net = bool(fab.network[list(route)].any())
                brute[net] = min(brute[net], fab.hop_latency(route))
    for network in (False, True):
        assert fab.neighbours(network) == brute[network], network
