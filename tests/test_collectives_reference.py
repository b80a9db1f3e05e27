"""Collectives against references independent of ``workloads/collectives.py``.

* the phases' structure against the algorithms' definitions (who sends to whom, how many
  bytes, how many steps), written out per algorithm here;
* the alpha-beta cost functions against numbers worked out by hand from Thakur, Rabenseifner &
  Gropp (2005) (ring: ``2(p-1) a + 2(p-1)/p n/B``);
* the fabric's execution of the phases (flow model), uncontended and under rotating background
  contention, against the plain bulk-synchronous fluid simulation of
  ``tests/test_flows_reference.py`` fed with the fabric's routes and link capacities.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from devices.fabric import Fabric, Phase
from devices.spec import LinkSpec
from tests.test_flows_reference import fluid
from topologies.graph import build_topology
from topologies.routing import Router
from twin.catalogs import catalog
from twin.kernel.engine import Engine
from workloads import collectives as C

NV = LinkSpec.model_validate(catalog("links").get("nvlink4").values)


def edges(phase):
    return Counter(zip(phase.src.tolist(), phase.dst.tolist(), strict=True))


# ----------------------------------------------------------------------------- structure
@pytest.mark.parametrize("op, steps", [("allreduce", lambda p: 2 * (p - 1)),
                                       ("reduce_scatter", lambda p: p - 1),
                                       ("allgather", lambda p: p - 1)])
@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_ring_phase_is_the_ring(op, steps, p):
    groups = np.array([[7 * g + (3 * i) % p for i in range(p)] for g in range(2)])
    (ph,) = C.collective_phases(op, "ring", groups, 1000.0, None)
    expect = Counter((int(g[i]), int(g[(i + 1) % p])) for g in groups for i in range(p))
    assert edges(ph) == expect
    assert ph.steps == steps(p)
    assert np.allclose(ph.nbytes, 1000.0 / p)
    # per rank: 2(p-1)/p n for all-reduce, (p-1)/p n otherwise (bandwidth-optimal volumes)
    per_rank = ph.total_bytes / groups.size
    factor = 2 if op == "allreduce" else 1
    assert per_rank == pytest.approx(factor * (p - 1) / p * 1000.0, rel=1e-12)


@pytest.mark.parametrize("op", C.OPS)
@pytest.mark.parametrize("members, n", [([3, 1, 0, 2], 800.0), ([5, 2], 1.0)])
def test_bidirectional_ring_sends_half_each_way(op, members, n):
    p = len(members)
    g = np.array([members])
    (ph,) = C.collective_phases(op, "bidir_ring", g, n, None)
    fwd = Counter((int(g[0, i]), int(g[0, (i + 1) % p])) for i in range(p))
    bwd = Counter((int(g[0, (i + 1) % p]), int(g[0, i])) for i in range(p))
    assert edges(ph) == fwd + bwd
    assert np.allclose(ph.nbytes, n / (2 * p))
    assert ph.steps == (2 * (p - 1) if op == "allreduce" else p - 1)


def test_trivial_groups_and_empty_buffers_send_nothing():
    for op in C.OPS:
        assert C.collective_phases(op, "ring", np.array([[4]]), 1e6, None) == []
        assert C.collective_phases(op, "ring", np.array([[0, 1]]), 0.0, None) == []
        assert C.ring(op, np.array([[0]]), 1e6) == []
        assert C.bidirectional(op, np.array([[0, 1]]), 0.0) == []
        # a sub-byte buffer still moves (no threshold above zero)
        assert C.ring(op, np.array([[0, 1]]), 0.5)[0].total_bytes > 0
        sw = build_topology("switched", (2, 2), "a", nic_link="b")
        assert C.collective_phases(op, "rail_rings", np.array([[0, 1, 2, 3]]), 0.5, sw)
        assert C.collective_phases(op, "rail_rings", np.array([[0, 1, 2, 3]]), 0.0, sw) == []
    assert C.point_to_point(np.array([], dtype=int), np.array([], dtype=int), 5.0) == []
    assert C.point_to_point(np.array([1]), np.array([2]), 0.0) == []
    (ph,) = C.point_to_point(np.array([1, 3]), np.array([2, 0]), 5.0)
    assert edges(ph) == Counter({(1, 2): 1, (3, 0): 1}) and ph.steps == 1
    assert np.allclose(ph.nbytes, 5.0)
    with pytest.raises(ValueError, match="unknown collective"):
        C.ring("broadcast", np.array([[0, 1]]), 1.0)


@pytest.mark.parametrize("op", C.OPS)
@pytest.mark.parametrize("n", [1600.0, 1.0])
def test_torus2d_phases_are_row_and_column_rings(op, n):
    """4x2 sub-grid of a 4x4 torus: X = 4 (rows), Y = 2. All-reduce: RS over rows of n,
    AR over columns of n/X, AG over rows; RS: RS rows, RS columns; AG: AG columns, AG rows."""
    topo = build_topology("torus2d", (4, 4), "a")
    devs = np.array([[0, 1, 2, 3, 4, 5, 6, 7]])      # y in {0, 1}, x in 0..3
    phases = C.collective_phases(op, "torus2d", devs, n, topo)
    rows = Counter()
    for r in ([0, 1, 2, 3], [4, 5, 6, 7]):
        rows += Counter((r[i], r[(i + 1) % 4]) for i in range(4))
    cols = Counter()
    for c in range(4):
        cols += Counter({(c, c + 4): 1, (c + 4, c): 1})
    want = {"allreduce": [(rows, n / 4, 3), (cols, n / 4 / 2, 2), (rows, n / 4, 3)],
            "reduce_scatter": [(rows, n / 4, 3), (cols, n / 4 / 2, 1)],
            "allgather": [(cols, n / 4 / 2, 1), (rows, n / 4, 3)]}[op]
    assert len(phases) == len(want)
    for ph, (e, nb, steps) in zip(phases, want, strict=True):
        assert edges(ph) == e and np.allclose(ph.nbytes, nb) and ph.steps == steps


def test_hierarchical_phases_on_nodes():
    topo = build_topology("switched", (2, 3), "a", nic_link="b")   # 3 nodes of 2 GPUs
    g = np.array([[0, 1, 2, 3, 4, 5]])
    phases = C.collective_phases("allreduce", "hierarchical", g, 1200.0, topo)
    intra = Counter()
    for a, b in ((0, 1), (2, 3), (4, 5)):
        intra += Counter({(a, b): 1, (b, a): 1})
    inter = Counter()
    for rail in ((0, 2, 4), (1, 3, 5)):
        inter += Counter((rail[i], rail[(i + 1) % 3]) for i in range(3))
    assert [edges(ph) for ph in phases] == [intra, inter, intra]
    assert [ph.steps for ph in phases] == [1, 4, 1]
    assert [float(ph.nbytes[0]) for ph in phases] == pytest.approx([600.0, 200.0, 600.0])


def test_rail_rings_every_channel_is_a_ring_through_every_rank():
    topo = build_topology("switched", (4, 3), "a", nic_link="b")   # 3 nodes x 4 GPUs
    g = np.arange(12)[None, :]
    n = 2400.0
    (ph,) = C.collective_phases("allreduce", "rail_rings", g, n, topo)
    assert ph.steps == 2 * 11 and np.allclose(ph.nbytes, n / 4 / 12)
    src, dst = ph.src.reshape(4, 12), ph.dst.reshape(4, 12)
    for c in range(4):
        assert sorted(src[c].tolist()) == list(range(12))
        assert sorted(dst[c].tolist()) == list(range(12))
        nxt = dict(zip(src[c].tolist(), dst[c].tolist(), strict=True))
        seen, x = [], 0
        for _ in range(12):
            seen.append(x)
            x = nxt[x]
        assert x == 0 and sorted(seen) == list(range(12))  # one cycle through all ranks
        # exactly one hop enters each node from another node (one NIC crossing per node)
        cross = [(a, b) for a, b in nxt.items() if a // 4 != b // 4]
        assert len(cross) == 3 and len({b // 4 for _, b in cross}) == 3
        # node segments alternate direction, so node j -> j + 1 leaves and enters on the same
        # rail (member index); only the ring's closing hop may change rail
        same_rail = [a % 4 == b % 4 for a, b in cross if b // 4 == a // 4 + 1]
        assert len(same_rail) == 2 and all(same_rail)
        # channel c enters node 0 at member c (crossings land on distinct rails per channel)
        assert [b % 4 for a, b in cross if b // 4 == 0] == [c]


def test_structure_errors_name_the_reason():
    torus = build_topology("torus2d", (4, 4), "a")
    sw = build_topology("switched", (4, 2), "a", nic_link="b")
    assert "grid topology" in C.check("torus2d", np.array([[0, 1]]), sw)
    assert "switched" in C.check("hierarchical", np.array([[0, 1]]), torus)
    assert "switched" in C.check("rail_rings", np.array([[0, 1]]), torus)
    assert C.check("ring", np.array([[0, 1, 2]]), torus) is None
    assert C.check("torus2d", np.array([[0]]), torus) is None
    assert "a line" in C.check("torus2d", np.array([[0, 1, 2, 3]]), torus)
    assert "fills 3 of the 2x2" in C.check("torus2d", np.array([[0, 1, 4]]), torus)
    assert C.check("torus2d", np.array([[0, 1, 4, 5]]), torus) is None
    with pytest.raises(C.NotApplicable, match="differ in shape"):
        C.grid_structure(np.array([[0, 1, 2, 4, 5, 6], [2, 3, 6, 7, 10, 11]]), torus.coords)
    with pytest.raises(C.NotApplicable, match="unknown algorithm"):
        C.structure("tree", np.array([[0, 1]]), torus)
    with pytest.raises(C.NotApplicable, match="differ in shape"):
        C.node_structure(np.array([[0, 1, 4, 5], [8, 9, 10, 11]]), 4)
    assert "unequal" in C.check("hierarchical", np.array([[0, 1, 4]]), sw)
    assert C.choose("ring", np.array([[0, 1]]), sw) == "ring"
    assert C.choose("auto", np.array([[0, 1, 4, 5]]), sw) == "hierarchical"
    assert C.choose("auto", np.array([[0, 1, 2, 3]]), sw) == "ring"     # one node
    assert C.choose("auto", np.array([[0, 4]]), sw) == "ring"           # one per node
    assert C.choose("auto", np.array([[0, 1, 4]]), sw) == "ring"        # unequal
    assert C.choose("auto", np.array([[0]]), sw) == "ring"


def test_pairs_are_one_step_of_the_algorithm():
    torus = build_topology("torus2d", (4, 4), "a")
    assert sorted(C.pairs("ring", np.array([[0, 1, 2]]), torus)) == [(0, 1), (1, 2), (2, 0)]
    got = sorted(C.pairs("torus2d", np.array([[0, 1, 4, 5]]), torus))
    assert got == [(0, 1), (0, 4), (1, 0), (1, 5), (4, 0), (4, 5), (5, 1), (5, 4)]
    assert C.pairs("ring", np.array([[3]]), torus) == []


def test_two_member_groups_are_the_smallest_that_communicate():
    """p = 2 is the boundary of "no communication": a ring of two sends one message each way
    per step, and a 2-D sub-grid needs X, Y >= 2, i.e. at least 4 members, so no group of 2 is
    one (whether its devices differ along one dimension or two)."""
    torus = build_topology("torus2d", (4, 4), "a")
    assert sorted(C.pairs("ring", np.array([[3, 7]]), torus)) == [(3, 7), (7, 3)]
    assert sorted(C.pairs("ring", np.array([[0, 1], [8, 9]]), torus)) == [
        (0, 1), (1, 0), (8, 9), (9, 8)]
    assert "a line" in C.check("torus2d", np.array([[0, 1]]), torus)
    assert "fills 2 of the 2x2" in C.check("torus2d", np.array([[0, 5]]), torus)


# ----------------------------------------------------------------------------- costs
def test_alpha_beta_costs_worked_by_hand():
    a, b = 2e-6, 1e10        # 2 us per step, 10 GB/s
    n = 8e6
    # ring all-reduce p = 4: 6 steps -> 12 us; 2 * 3/4 * 8e6 / 1e10 = 1.2 ms
    assert C.alpha_beta_time("allreduce", 4, n, a, b) == pytest.approx(12e-6 + 1.2e-3)
    assert C.alpha_beta_time("reduce_scatter", 4, n, a, b) == pytest.approx(6e-6 + 0.6e-3)
    assert C.alpha_beta_time("allgather", 8, n, a, b) == pytest.approx(14e-6 + 0.7e-3)
    assert C.alpha_beta_time("allreduce", 1, n, a, b) == 0.0
    assert C.bidirectional_time("allreduce", 4, n, a, b) == pytest.approx(12e-6 + 0.6e-3)
    # 2-D all-reduce, X = 4 (a, b), Y = 2 (4a, b/2): RS_x 3a + 3/4 n/b; RS_y of n/4: 4a + 1/2
    # (n/4)/(b/2); doubled for all-reduce
    rs = 3 * a + 0.75 * n / b + 4 * a + 0.5 * (n / 4) / (b / 2)
    assert C.two_level_time("allreduce", 4, 2, n, a, b, 4 * a, b / 2) == pytest.approx(2 * rs)
    assert C.two_level_time("allgather", 4, 2, n, a, b, 4 * a, b / 2) == pytest.approx(rs)
    assert C.hierarchical_time("reduce_scatter", 4, 2, n, a, b, 4 * a, b / 2) == \
        pytest.approx(rs)
    with pytest.raises(ValueError):
        C.alpha_beta_time("alltoall", 4, n, a, b)
    with pytest.raises(ValueError):
        C.two_level_time("alltoall", 4, 2, n, a, b, a, b)
    # nccl-tests: busbw = algbw * 2(p-1)/p for all-reduce, (p-1)/p otherwise
    assert C.bus_bandwidth("allreduce", 8, 1e9, 0.5) == pytest.approx(2e9 * 14 / 8)
    assert C.bus_bandwidth("allgather", 8, 1e9, 0.5) == pytest.approx(2e9 * 7 / 8)


# ----------------------------------------------------------------------------- fabric
def _fabric(shape=(4, 1), kind="torus2d"):
    env = Engine()
    topo = build_topology(kind, shape, NV.name, 1)
    return env, topo, Fabric(env, topo, Router(topo), {NV.name: NV}, model="flow")


def _as_reference(fab, phase, start=0.0):
    routes = [list(fab.router.route(int(a), int(b))) for a, b in zip(phase.src, phase.dst,
                                                                      strict=True)]
    alpha = max(fab.step_latency(tuple(r)) for r in routes)
    return dict(start=start, routes=routes, sizes=[float(x) * phase.steps for x in phase.nbytes],
                steps=phase.steps, latency=alpha * phase.steps)


@pytest.mark.parametrize("algorithm, op, kind, shape", [
    ("ring", "allreduce", "torus2d", (4, 1)), ("bidir_ring", "allreduce", "torus2d", (4, 1)),
    ("torus2d", "allreduce", "torus2d", (4, 4)), ("torus2d", "allgather", "mesh2d", (4, 3)),
    ("ring", "reduce_scatter", "mesh2d", (4, 2))])
def test_fabric_runs_the_phases_as_the_fluid_reference(algorithm, op, kind, shape):
    env, topo, fab = _fabric(shape, kind)
    group = np.arange(topo.n_devices)[None, :]
    phases = C.collective_phases(op, algorithm, group, 64e6, topo)

    def body():
        for ph in phases:
            yield from fab.run_phase(ph)
    env.process(body())
    env.run()
    expect = sum(fluid(fab.capacity, [_as_reference(fab, ph)])[0] for ph in phases)
    assert env.now == pytest.approx(expect, rel=1e-9)


def _ring_under_rotation(lockstep: bool = False, background: bool = True):
    """A 4-device ring all-reduce of 256 MB on a 4x1 torus, with 40 point-to-point messages
    of 24 MB rotating over the ring's links one after the other (or none); returns the
    ring's end time, the fabric, the ring phase and the messages. ``lockstep``: the fabric
    may send the ring as one lock-step flow (``Fabric.allow_lockstep``)."""
    env, _topo, fab = _fabric()
    fab.lockstep_rings = lockstep
    (ph,) = C.ring_allreduce(np.arange(4)[None, :], 256e6)
    fab.allow_lockstep([ph])
    bg = [Phase(np.array([k % 4]), np.array([(k + 1) % 4]), np.array([24e6]))
          for k in range(40)] if background else []
    end = []

    def coll():
        yield from fab.run_phase(ph)
        end.append(env.now)

    def rotate():
        for b in bg:
            yield from fab.run_phase(b)
    env.process(coll())
    env.process(rotate())
    env.run()
    return end[0], fab, ph, bg


def test_ring_steps_synchronise_under_rotating_background():
    """Issue 15: a 4-device ring all-reduce while point-to-point background messages rotate
    over the ring's links. Each step waits for its slowest pair (bulk-synchronous, like the
    packet model); the earlier flow model let the steps drift apart and was optimistic."""
    end, fab, ph, bg = _ring_under_rotation()
    assert fab.lockstep_transfers == 0
    # the reference: the background messages one after the other (each starts when the
    # previous one has completed)
    jobs = [_as_reference(fab, ph)] + [dict(_as_reference(fab, b), after=k if k else None)
                                       for k, b in enumerate(bg)]
    ref = fluid(fab.capacity, jobs)
    assert end == pytest.approx(ref[0], rel=1e-9)
    drift = fluid(fab.capacity, [dict(jobs[0], steps=1), *jobs[1:]])
    assert ref[0] > drift[0] * 1.02


def test_a_lock_step_ring_runs_at_its_slowest_members_rate():
    """A ring phase the caller lets go lock-step (``Fabric.allow_lockstep``, fast mode
    without rank symmetry): alone on its links, the time of the per-flow bulk-synchronous
    model to rounding; under the rotating background of the test above, every member runs
    at the rate of the member sharing a link with the message, cap / 2, while a message
    drains, and at cap in the message's latency before the next starts (worked by hand
    below); here not faster than the per-flow model."""
    alone, fab, _ph, _bg = _ring_under_rotation(lockstep=True, background=False)
    assert fab.lockstep_transfers == 1
    assert alone == pytest.approx(_ring_under_rotation(background=False)[0], rel=1e-12)
    busy, fab, ph, _bg = _ring_under_rotation(lockstep=True)
    alpha = fab.step_latency(tuple(fab.router.route(0, 1)))
    cap = float(fab.capacity[fab.router.route(0, 1)[0]])
    assert ph.steps == 6 and float(ph.nbytes[0]) == 64e6
    member = 6 * 64e6  # bytes each member sends
    drain = 24e6 / (cap / 2)  # a message at half the link; the ring too, meanwhile
    per_cycle = 24e6 + cap * alpha  # ring bytes per message: half a link, then a whole one
    n = int(member // per_cycle)
    left = member - n * per_cycle
    tail = left / (cap / 2) if left <= 24e6 else drain + (left - 24e6) / cap
    assert busy == pytest.approx(n * (drain + alpha) + tail + 6 * alpha, rel=1e-9)
    assert busy >= _ring_under_rotation()[0]


def test_the_quotient_network_is_chosen_before_any_phase_is_planned():
    """``Fabric.set_quotient`` swaps the flow engine's link ids: once a phase has been planned
    (its routes cached on the full network) it is refused; clearing it (None) never is."""
    _end, fab, _ph, _bg = _ring_under_rotation(background=False)
    with pytest.raises(ValueError, match="before any phase"):
        fab.set_quotient(object())  # (refused before the object is looked at)
    fab.set_quotient(None)
    assert fab.quotient is None


def test_a_phase_without_routes_has_no_bottleneck():
    """``Fabric.profile`` (the bottleneck and reach that pick NCCL's protocol) of a phase
    whose pairs have no route (device 0 of a 4x1 torus cut off) or need none (a device to
    itself): ``(inf, False, 0)``, nothing to wait for; with the route back, the link's."""
    _env, _topo, fab = _fabric()
    cut_off = Phase(np.array([0]), np.array([1]), np.array([1e6]))
    itself = Phase(np.array([2]), np.array([2]), np.array([1e6]))
    assert fab.profile(itself) == (math.inf, False, 0.0)
    fab.fail_edge(0, 1)
    fab.fail_edge(0, 3)
    assert fab.profile(cut_off) == (math.inf, False, 0.0)
    fab.restore_edge(0, 1)
    cap, network, hop = fab.profile(cut_off)
    assert cap == fab.capacity[fab.router.route(0, 1)[0]] and not network and hop > 0
