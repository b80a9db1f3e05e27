"""Fabric and flow engine against alpha-beta costs, serialization and max-min fairness."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.fabric import Fabric, Phase
from devices.spec import LinkSpec
from topologies.graph import build_topology
from topologies.routing import Router
from twin.catalogs import catalog
from twin.kernel.engine import Engine
from twin.kernel.flows import max_min_rates
from workloads import collectives

LINK = LinkSpec.model_validate(catalog("links").get("nvlink4").values)


def make_fabric(kind="torus2d", shape=(8, 1), model="flow", links_per_edge=1, **kw):
    env = Engine()
    topo = build_topology(kind, shape, LINK.name, links_per_edge)
    fab = Fabric(env, topo, Router(topo), {LINK.name: LINK}, model=model, **kw)
    return env, topo, fab


def run_phases(env, fab, phases):
    def body():
        for ph in phases:
            yield from fab.run_phase(ph)
    env.process(body())
    env.run()
    return env.now


ALPHA = (LINK.overhead_us + LINK.latency_us) * 1e-6
BW = LINK.bytes_per_s


@pytest.mark.parametrize("model", ["flow", "packet"])
@pytest.mark.parametrize("p, n", [(8, 64e6), (4, 1e6), (8, 4096.0)])
def test_ring_allreduce_alpha_beta(model, p, n):
    """Uncontended ring all-reduce = 2(p-1) alpha + 2(p-1)/p n/B within 1%."""
    env, _topo, fab = make_fabric(shape=(p, 1), model=model, packet_bytes=1 << 20)
    ring = np.arange(p)[None, :]
    t = run_phases(env, fab, collectives.ring_allreduce(ring, n))
    expect = collectives.alpha_beta_time("allreduce", p, n, ALPHA, BW)
    assert t == pytest.approx(expect, rel=0.01)


@pytest.mark.parametrize("model", ["flow", "packet"])
def test_start_runs_phases_in_either_model(model):
    """``Fabric.start`` (a phase list without a caller's process) in both models: the
    packet model runs them as a process, the flow model as chained transfers; the same
    alpha-beta time as ``run_phase`` one by one."""
    env, _topo, fab = make_fabric(shape=(4, 1), model=model, packet_bytes=1 << 20)
    ring = np.arange(4)[None, :]
    n = 4e6
    env.run(fab.start(collectives.ring_allreduce(ring, n), "ar"))
    expect = collectives.alpha_beta_time("allreduce", 4, n, ALPHA, BW)
    assert env.now == pytest.approx(expect, rel=0.01)
    assert fab.bytes_received.sum() == pytest.approx(fab.bytes_sent.sum())


@pytest.mark.parametrize("model", ["flow", "packet"])
def test_reduce_scatter_and_allgather_alpha_beta(model):
    env, _topo, fab = make_fabric(shape=(4, 1), model=model)
    ring = np.arange(4)[None, :]
    n = 16e6
    phases = collectives.ring_reduce_scatter(ring, n) + collectives.ring_allgather(ring, n)
    t = run_phases(env, fab, phases)
    expect = 2 * collectives.alpha_beta_time("allgather", 4, n, ALPHA, BW)
    assert t == pytest.approx(expect, rel=0.01)


@pytest.mark.parametrize("model", ["flow", "packet"])
def test_messages_on_one_link_serialize(model):
    """Two messages of n bytes over the same directed link take 2n/B, one takes n/B."""
    n = 50e6
    one = Phase(np.array([0]), np.array([1]), np.array([n]))
    two = Phase(np.array([0, 0]), np.array([1, 1]), np.array([n, n]))
    env, _, fab = make_fabric(shape=(4, 1), model=model)
    t1 = run_phases(env, fab, [one])
    env, _, fab = make_fabric(shape=(4, 1), model=model)
    t2 = run_phases(env, fab, [two])
    assert t1 == pytest.approx(ALPHA + n / BW, rel=1e-3)
    assert t2 == pytest.approx(ALPHA + 2 * n / BW, rel=1e-3)
    # opposite directions do not contend (full duplex)
    env, _, fab = make_fabric(shape=(4, 1), model=model)
    both = Phase(np.array([0, 1]), np.array([1, 0]), np.array([n, n]))
    assert run_phases(env, fab, [both]) == pytest.approx(t1, rel=1e-3)


@pytest.mark.parametrize("model", ["flow", "packet"])
def test_two_collectives_sharing_links_take_longer(model):
    """Two identical rings over the same links: max-min gives each half of every link, so both
    end at 2(p-1) steps x (2 n/p / B) + 2(p-1) alpha. The packet model's FIFO links are work
    conserving: the later ring ends at the same time up to the packet pipeline (one packet
    per step: 14 x 1 MiB / B here, 0.4%)."""
    n = 32e6
    ring = np.arange(8)[None, :]
    env, _, fab = make_fabric(shape=(8, 1), model=model)
    alone = run_phases(env, fab, collectives.ring_allreduce(ring, n))
    env, _, fab = make_fabric(shape=(8, 1), model=model)
    ends = []

    def one():
        for ph in collectives.ring_allreduce(ring, n):
            yield from fab.run_phase(ph)
        ends.append(env.now)
    env.process(one())
    env.process(one())
    env.run()
    p = 8
    both = 2 * (p - 1) * (2 * n / p / BW + ALPHA)
    assert alone == pytest.approx(2 * (p - 1) * (n / p / BW + ALPHA), rel=1e-3)
    if model == "flow":
        assert ends == pytest.approx([both, both], rel=1e-9)
    else:
        assert max(ends) == pytest.approx(both, rel=0.01)
        assert min(ends) >= alone * (1 - 1e-9)


@pytest.mark.parametrize("model", ["flow", "packet"])
def test_bytes_conserved(model):
    env, _topo, fab = make_fabric(kind="mesh2d", shape=(4, 4), model=model)
    rng = np.random.default_rng(3)
    src = rng.integers(0, 16, 40)
    dst = rng.integers(0, 16, 40)
    nb = rng.uniform(1e3, 1e7, 40)
    run_phases(env, fab, [Phase(src, dst, nb, steps=2)])
    assert fab.bytes_sent.sum() == pytest.approx(fab.bytes_received.sum())
    assert fab.bytes_sent.sum() == pytest.approx(2 * nb.sum())
    routes = [fab.router.route(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
    on_links = 2 * sum(b * len(r) for b, r in zip(nb, routes, strict=True))
    assert fab.link_bytes.sum() == pytest.approx(on_links, rel=1e-9)


def test_link_failure_reroutes_and_completes():
    for model in ("flow", "packet"):
        env, _topo, fab = make_fabric(kind="torus2d", shape=(4, 4), model=model,
                                     retransmit_timeout_s=1e-3)
        n = 200e6
        ph = Phase(np.array([0]), np.array([1]), np.array([n]))
        rows = []
        fab.record = rows.append

        def fail(env=env, fab=fab):
            yield env.timeout(1e-3)
            fab.fail_edge(0, 1)
        env.process(fail())
        t = run_phases(env, fab, [ph])
        assert fab.reroutes >= 1
        assert [r.max_hops for r in rows] == [3]  # the message row counts the detour
        assert fab.bytes_received.sum() == pytest.approx(n)
        assert fab.router.hops(0, 1) == 3
        # 1 ms on the direct link, the 1 ms timeout, the rest over the 3-hop detour (same
        # bandwidth, no contention), then the detour's latency
        detour = (LINK.overhead_us + 3 * LINK.latency_us) * 1e-6
        expect = 1e-3 + 1e-3 + (n - BW * 1e-3) / BW + detour
        if model == "flow":
            assert t == pytest.approx(expect, rel=1e-9)
        else:  # store-and-forward over 3 hops fills a 2-packet pipeline, and the packet on
            # the wire when the link failed is resent whole: at most 3 packet times more
            assert expect - 1e-9 <= t <= expect + 3 * (1 << 20) / BW
            # every packet that met the failed link goes again: at most one packet each
            k = fab.reroutes
            assert (k - 1) * (1 << 20) < fab.retransmitted_bytes <= k * (1 << 20)


def test_a_detour_longer_than_every_planned_route_sets_the_rows_hops():
    """Two one-hop flows (0 -> 1, 2 -> 3) on a 4x4 torus; the edge 0-1 fails mid-transfer,
    so 0 -> 1 finishes over a 3-hop detour while 2 -> 3 stays on one hop: the phase's message
    row reports the longest route any of its flows took, 3."""
    env, _topo, fab = make_fabric(kind="torus2d", shape=(4, 4), retransmit_timeout_s=1e-3)
    rows = []
    fab.record = rows.append

    def fail():
        yield env.timeout(1e-3)
        fab.fail_edge(0, 1)
    env.process(fail())
    run_phases(env, fab, [Phase(np.array([0, 2]), np.array([1, 3]), np.array([200e6, 200e6]))])
    assert fab.reroutes == 1 and fab.router.hops(0, 1) == 3 and fab.router.hops(2, 3) == 1
    assert len(rows) == 1 and rows[0].max_hops == 3 and rows[0].n_pairs == 2


@pytest.mark.parametrize("model", ["flow", "packet"])
def test_a_message_row_counts_the_hops_of_its_longest_route(model):
    """On a 4x4 mesh (no wrap-around) device 0 -> 15 crosses 3 + 3 links and 0 -> 1 one; a
    phase with both pairs reports the longer route, in both network models, and a
    two-packet message (store and forward) still counts each link once."""
    env, _topo, fab = make_fabric(kind="mesh2d", shape=(4, 4), model=model,
                                  packet_bytes=1 << 20)
    rows = []
    fab.record = rows.append
    assert fab.router.hops(0, 15) == 6 and fab.router.hops(0, 1) == 1
    run_phases(env, fab, [Phase(np.array([0, 0]), np.array([15, 1]), np.array([2e6, 1e6]))])
    assert len(rows) == 1 and rows[0].max_hops == 6 and rows[0].n_pairs == 2
    assert (rows[0].src, rows[0].dst, rows[0].bytes) == (0, 15, 3e6)


@pytest.mark.parametrize("model", ["flow", "packet"])
def test_a_phase_without_pairs_takes_no_time_and_reports_no_ends(model):
    """A phase with no pairs (what a collective of a group whose members all sit on one
    device degenerates to) moves nothing, takes no time and reports no route: 0 hops and
    -1 for its first source and destination, by the process path and by the chained one."""
    env, _topo, fab = make_fabric(kind="mesh2d", shape=(4, 4), model=model)
    rows = []
    fab.record = rows.append
    empty = Phase(np.array([], dtype=np.int64), np.array([], dtype=np.int64), np.array([]))
    t = run_phases(env, fab, [empty])
    if model == "flow":
        fab.start([empty], "chained", 7)
        env.run()
    assert t == 0.0 and env.now == 0.0 and fab.bytes_sent.sum() == 0.0
    assert len(rows) == (2 if model == "flow" else 1)
    for r in rows:
        assert (r.n_pairs, r.max_hops, r.src, r.dst, r.bytes) == (0, 0, -1, -1, 0.0)
        assert r.t_start == r.t_end == 0.0


def test_flows_within_their_done_tolerance_finish_together():
    """Two flows share a link at half its rate each; one is 1e-12 larger (a size rounding
    makes). A flow is done when at most 1e-9 of its bytes are left, so the phase ends
    exactly when the one of two equal flows does, not a second timer later."""
    n = 100e6
    times = []
    for sizes in ([n, n], [n, n * (1 + 1e-12)]):
        env, _topo, fab = make_fabric(kind="torus2d", shape=(4, 1))
        times.append(run_phases(env, fab, [Phase(np.array([0, 0]), np.array([1, 1]),
                                                 np.array(sizes))]))
    assert times[0] == pytest.approx(2 * n / BW + ALPHA, rel=1e-9)
    assert times[1] == times[0]


# ----------------------------------------------------------------------- max-min
@st.composite
def flow_sets(draw):
    n_links = draw(st.integers(1, 6))
    n_flows = draw(st.integers(1, 8))
    cap = np.array(draw(st.lists(st.floats(0.5, 10), min_size=n_links, max_size=n_links)))
    ef, el = [], []
    for f in range(n_flows):
        links = draw(st.sets(st.integers(0, n_links - 1), min_size=1, max_size=n_links))
        for lk in sorted(links):
            ef.append(f)
            el.append(lk)
    return np.array(ef), np.array(el), n_flows, cap


@settings(max_examples=200, deadline=None)
@given(flow_sets())
def test_max_min_is_feasible_and_fair(case):
    """Feasible (no link over capacity) and max-min fair: every flow crosses a saturated link
    on which no other flow has a higher rate."""
    ef, el, n, cap = case
    rate = max_min_rates(ef, el, n, cap)
    load = np.bincount(el, weights=rate[ef], minlength=len(cap))
    assert np.all(load <= cap * (1 + 1e-9))
    for f in range(n):
        links = el[ef == f]
        ok = False
        for lk in links:
            sat = load[lk] >= cap[lk] * (1 - 1e-9)
            top = rate[f] >= rate[ef[el == lk]].max() * (1 - 1e-9)
            ok |= bool(sat and top)
        assert ok, f"flow {f} has no bottleneck"


def test_packet_links_are_busy_for_the_serialization_of_their_bytes():
    """A packet holds its link for size / bandwidth and propagates without it: each link's
    busy time is its bytes over the link's bandwidth (a ring all-reduce on 4 devices, 1 MiB
    packets), and the links the ring does not use stay idle."""
    env, _topo, fab = make_fabric(shape=(4, 1), model="packet", packet_bytes=1 << 20)
    run_phases(env, fab, collectives.ring_allreduce(np.arange(4)[None, :], 8e6))
    nbytes, busy = fab.link_bytes, fab.link_busy_s
    assert nbytes.max() > 0 and (nbytes == 0).any()
    np.testing.assert_allclose(busy, nbytes / BW, rtol=1e-12, atol=0.0)


def test_a_failed_link_is_down_and_interrupts_its_packets_until_restored():
    from devices.link import Link, LinkDown

    env = Engine()
    link = Link(env, 3, bytes_per_s=1e9, latency_s=0.0)
    seen = []

    def packet():
        try:
            yield from link.send(1e6)  # 1 ms on the link
            seen.append("sent")
        except simpy.Interrupt as intr:
            seen.append(intr.cause)

    env.process(packet())
    env.run(until=0.5e-3)
    link.fail()
    env.run()
    assert not link.up and isinstance(seen[0], LinkDown) and seen[0].link == 3
    assert link.busy_s == pytest.approx(0.5e-3) and link.bytes == 0.0  # cut mid-packet
    link.restore()
    assert link.up
    env.process(packet())
    env.run()
    assert seen[1] == "sent" and link.bytes == 1e6


@pytest.mark.parametrize("model", ["flow", "packet"])
def test_a_phase_that_waits_for_a_repair_reports_its_longest_route(model):
    """On a 4-ring, device 0 is cut off (both its edges down) when a phase 0 -> 2, 1 -> 2
    starts, so the phase waits for routes; edge 0-1 comes back at 1 ms and the phase runs on
    the routes then: 0 -> 1 -> 2 (2 hops) and 1 -> 2 (1 hop). Its message row reports the
    longer, 2, in both network models."""
    env, _topo, fab = make_fabric(kind="ring", shape=(4,), model=model)
    rows = []
    fab.record = rows.append
    fab.fail_edge(0, 1)
    fab.fail_edge(0, 3)

    def repair():
        yield env.timeout(1e-3)
        fab.restore_edge(0, 1)
    env.process(repair())
    t = run_phases(env, fab, [Phase(np.array([0, 1]), np.array([2, 2]), np.array([1e6, 1e6]))])
    assert t > 1e-3
    assert fab.router.hops(0, 2) == 2 and fab.router.hops(1, 2) == 1
    assert len(rows) == 1 and rows[0].max_hops == 2 and rows[0].n_pairs == 2
