"""The flow engine against plain, slow references written here.

* ``water_fill``: max-min fair rates by the textbook progressive filling, one flow and one link
  at a time in plain Python (no NumPy), checked against ``max_min_rates``;
* ``fluid``: a plain fluid simulation of transfers (staggered starts, per-step barriers of
  bulk-synchronous transfers, flows cut by a failure and resumed later on a new route) that
  recomputes ``water_fill`` at every event. It keeps its own per-step byte counters instead of
  the engine's remaining-bytes arithmetic, so it shares no code or state layout with
  ``twin.kernel.flows``.

Both are exact (no time steps), so the engine must agree to rounding: rel 1e-9.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from twin.kernel.flows import FlowNetwork, max_min_rates


# ----------------------------------------------------------------------------- references
def water_fill(routes: list[list[int]], cap: list[float]) -> list[float]:
    """Max-min fair rate of each flow (``inf`` for a flow without links)."""
    rate = [math.inf] * len(routes)
    left = dict(enumerate(cap))
    todo = {f for f, r in enumerate(routes) if r}
    while todo:
        best, best_link = math.inf, None
        for lk, c in left.items():
            users = [f for f in todo if lk in routes[f]]
            if users and c / len(users) < best:
                best, best_link = c / len(users), lk
        fixed = [f for f in todo if best_link in routes[f]]
        for f in fixed:
            rate[f] = best
            todo.discard(f)
            for lk in routes[f]:
                left[lk] -= best
    return rate


def fluid(cap, transfers, cuts=()):
    """Completion time of every transfer in a plain fluid simulation.

    ``transfers``: dicts with ``start`` (s), ``routes`` (lists of link ids), ``sizes`` (bytes
    per flow), ``steps`` (bulk-synchronous steps, default 1), ``latency`` (s, added after the
    last byte) and ``after`` (optional index of a transfer on whose completion this one starts
    instead of at ``start``). ``cuts``: ``(t_cut, transfer, flow, t_resume, new_route)``: the
    flow stops at ``t_cut`` and continues from where it was at ``t_resume`` on ``new_route``.
    """
    tr = []
    for d in transfers:
        steps = d.get("steps", 1)
        tr.append(dict(start=d["start"], routes=[list(r) for r in d["routes"]], steps=steps,
                       step_bytes=[s / steps for s in d["sizes"]], latency=d.get("latency", 0.0),
                       step=0, left=[s / steps for s in d["sizes"]], cut=set(),
                       started=False, done_at=None, drained=None, after=d.get("after")))
    pending = sorted(cuts)
    resumes = []
    t = 0.0
    for _ in range(100000):
        for k in tr:  # starts
            if k["after"] is not None:
                prev = tr[k["after"]]["done_at"]
                k["start"] = prev if prev is not None else math.inf
            if not k["started"] and k["start"] <= t + 1e-15:
                k["started"] = True
                k["left"] = [0.0 if not r else b for r, b in zip(k["routes"], k["step_bytes"],
                                                                 strict=True)]
        while pending and pending[0][0] <= t + 1e-15:
            _tc, ti, fi, t_res, route = pending.pop(0)
            tr[ti]["cut"].add(fi)
            resumes.append((t_res, ti, fi, route))
        for item in sorted(resumes):
            if item[0] <= t + 1e-15:
                _tr, ti, fi, route = item
                tr[ti]["cut"].discard(fi)
                tr[ti]["routes"][fi] = list(route)
                resumes.remove(item)
        for k in tr:  # step barriers and drains
            if k["started"] and k["drained"] is None:
                # a step ends when every flow delivered its bytes of the step (a flow cut after
                # that is not waited for: its next step waits for its resume instead)
                while all(x <= 0.0 for x in k["left"]):
                    k["step"] += 1
                    if k["step"] == k["steps"]:
                        k["drained"] = t
                        k["done_at"] = t + k["latency"]
                        break
                    k["left"] = [0.0 if not r else b for r, b in zip(k["routes"],
                                                                     k["step_bytes"],
                                                                     strict=True)]
        if all(k["done_at"] is not None for k in tr):
            return [k["done_at"] for k in tr]
        flows = [(i, f) for i, k in enumerate(tr) if k["started"] and k["drained"] is None
                 for f in range(len(k["left"])) if k["left"][f] > 0 and f not in k["cut"]]
        rates = water_fill([tr[i]["routes"][f] for i, f in flows], list(cap))
        nxt = [k["start"] - t for k in tr if not k["started"]]
        nxt += [k["done_at"] - t for k in tr if k["done_at"] is not None and k["done_at"] > t]
        nxt += [c[0] - t for c in pending] + [r[0] - t for r in resumes]
        nxt += [tr[i]["left"][f] / r for (i, f), r in zip(flows, rates, strict=True)]
        dt = min(nxt)
        for (i, f), r in zip(flows, rates, strict=True):
            x = tr[i]["left"][f] - r * dt
            tr[i]["left"][f] = 0.0 if x <= 1e-9 * tr[i]["step_bytes"][f] else x
        t += dt
    raise AssertionError("reference did not finish")


def engine_run(cap, transfers, cuts=()):
    """Completion times of the same transfers in the engine (cuts via fail_links/resume)."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.asarray(cap, dtype=float))
    ends = [None] * len(transfers)
    handles = [None] * len(transfers)

    def start(i, d):
        yield env.timeout(d["start"])
        tr = net.transfer(d["routes"], d["sizes"], latency=d.get("latency", 0.0),
                          steps=d.get("steps", 1), key=d.get("key"))
        handles[i] = tr
        yield tr.done
        ends[i] = env.now

    def cut(t_cut, ti, fi, t_res, route):
        yield env.timeout(t_cut)
        lk = transfers[ti]["routes"][fi]
        got = net.fail_links([lk[0]])
        assert any(t is handles[ti] and fi in set(fl.tolist()) for t, fl in got), lk
        yield env.timeout(t_res - t_cut)
        net.resume(handles[ti], np.array([fi]), [route])

    for i, d in enumerate(transfers):
        env.process(start(i, d))
    for c in cuts:
        env.process(cut(*c))
    env.run()
    return ends, net


#: the tests below against ``fluid`` that other files run again with the engine configured
#: otherwise (compiled allocations, rates kept through joins and departures)
FLUID_CASES = [
    "test_bulk_synchronous_steps_wait_for_the_slowest_flow",
    "test_ring_steps_synchronise_under_rotating_contention",
    "test_a_ring_started_again_alone_keeps_its_steps",
    "test_steps_with_a_cut_flow_wait_for_the_resend",
    "test_contention_that_ends_mid_step_keeps_the_barrier",
    "test_a_resumed_flow_that_is_ahead_waits_parked_while_another_is_cut",
    "test_a_flow_that_ends_its_step_within_the_step_tolerance_releases_the_barrier",
    "test_flows_of_different_sizes_with_equal_remaining_bytes_keep_the_barrier",
    "test_equal_flows_that_drifted_apart_keep_the_barrier_when_rates_equalise",
    "test_flows_in_step_wait_for_a_cut_flow_of_the_same_step",
    "test_many_random_staggered_transfers",
]


# ----------------------------------------------------------------------------- max-min
def test_water_fill_reference_on_a_textbook_case():
    """Bertsekas & Gallager's example shape: link 0 (cap 1) shared by 3 flows, link 1 (cap 10)
    by flow 2 and a long flow 3: rates 1/3, 1/3, 1/3 and 10 - 1/3."""
    routes = [[0], [0], [0, 1], [1]]
    assert water_fill(routes, [1.0, 10.0]) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 29 / 3])


@pytest.mark.parametrize("seed", range(40))
def test_max_min_rates_equal_the_water_filling_reference(seed):
    rng = np.random.default_rng(seed)
    n_links = int(rng.integers(1, 8))
    n_flows = int(rng.integers(1, 10))
    cap = rng.choice([1.0, 2.0, 3.5, 10.0], n_links) * rng.uniform(0.5, 2.0, n_links)
    routes = [sorted(set(rng.integers(0, n_links, int(rng.integers(1, n_links + 1))).tolist()))
              for _ in range(n_flows)]
    ef = np.array([f for f, r in enumerate(routes) for _ in r])
    el = np.array([lk for r in routes for lk in r])
    got = max_min_rates(ef, el, n_flows, cap)
    assert got == pytest.approx(water_fill(routes, cap.tolist()), rel=1e-9)


def test_flow_without_links_is_unbounded():
    assert max_min_rates(np.array([], dtype=int), np.array([], dtype=int), 2,
                         np.array([1.0]))[0] == math.inf
    got = max_min_rates(np.array([1]), np.array([0]), 2, np.array([4.0]))
    assert got[0] == math.inf and got[1] == 4.0


# ----------------------------------------------------------------------------- transfers
CAP = [10.0, 10.0, 4.0, 6.0, 8.0]


def _check(transfers, cuts=()):
    ends, net = engine_run(CAP, transfers, cuts)
    ref = fluid(CAP, transfers, cuts)
    assert ends == pytest.approx(ref, rel=1e-9, abs=1e-12)
    return ends, net


def test_one_flow_takes_bytes_over_capacity_plus_latency():
    ends, net = _check([dict(start=0.0, routes=[[0, 2]], sizes=[20.0], latency=0.5)])
    assert ends[0] == pytest.approx(20.0 / 4.0 + 0.5)
    assert net.link_bytes[[0, 2]] == pytest.approx([20.0, 20.0])
    assert net.link_busy[[0, 2]] == pytest.approx([5.0, 5.0])


def test_staggered_transfers_share_links():
    _check([dict(start=0.0, routes=[[0, 1], [1], [3]], sizes=[30.0, 12.0, 5.0]),
            dict(start=0.7, routes=[[1, 3], [4]], sizes=[9.0, 40.0], latency=0.1),
            dict(start=1.3, routes=[[0]], sizes=[25.0]),
            dict(start=2.0, routes=[[2, 3, 4]], sizes=[8.0], key="k")])


def test_many_random_staggered_transfers():
    rng = np.random.default_rng(11)
    transfers = []
    for i in range(12):
        nf = int(rng.integers(1, 4))
        routes = [sorted(set(rng.integers(0, 5, int(rng.integers(1, 4))).tolist()))
                  for _ in range(nf)]
        transfers.append(dict(start=float(rng.uniform(0, 5)), routes=routes,
                              sizes=rng.uniform(1, 30, nf).tolist(),
                              latency=float(rng.uniform(0, 0.2)),
                              key=("p", i % 3) if i % 3 == 0 and i < 3 else None))
    _ends, net = _check(transfers)
    # every byte crossed each link of its route once
    expect = np.zeros(5)
    for d in transfers:
        for r, b in zip(d["routes"], d["sizes"], strict=True):
            expect[r] += b
    assert net.link_bytes == pytest.approx(expect, rel=1e-9)


def test_a_cut_flow_resumes_with_its_remaining_bytes_on_the_new_route():
    """Flow 0 (link 0) is cut at t = 1 and resumed at t = 2 over links 3, 4; flow 1 of the same
    transfer ends before the resume: the transfer must still wait for flow 0."""
    transfers = [dict(start=0.0, routes=[[0], [1]], sizes=[30.0, 12.0], latency=0.25)]
    cuts = [(1.0, 0, 0, 2.0, [3, 4])]
    ends, net = _check(transfers, cuts)
    # 10 bytes by t=1, 20 left at 6 B/s from t=2: done at 2 + 20/6, + latency
    assert ends[0] == pytest.approx(2.0 + 20.0 / 6.0 + 0.25)
    assert net.link_bytes[[0, 1, 3, 4]] == pytest.approx([10.0, 12.0, 20.0, 20.0])


def test_rerouted_flow_under_contention():
    transfers = [dict(start=0.0, routes=[[0, 2], [1]], sizes=[16.0, 50.0]),
                 dict(start=0.5, routes=[[3], [4]], sizes=[20.0, 10.0]),
                 dict(start=1.0, routes=[[1, 3]], sizes=[6.0])]
    _check(transfers, cuts=[(1.5, 0, 0, 2.5, [3, 4])])


def test_cancel_returns_the_undelivered_bytes():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 5.0]))
    tr = net.transfer([[0], [0, 1]], [40.0, 40.0])
    env.run(until=2.0)
    # both flows at 5 B/s (link 0 shared, link 1 caps flow 1 at 5): 10 B each delivered
    assert net.cancel(tr) == pytest.approx(60.0)
    assert net.cancel(tr) == 0.0
    env.run()
    assert not tr.finished


def test_a_flow_crossing_a_link_twice_takes_two_shares_of_it():
    """A lock-step ring (``devices.phase.lockstep_ok``) is one flow listing a link once per
    member crossing it. Worked by hand: link 0 (10 B/s) crossed twice, link 1 (8 B/s) once
    and by a second flow: fair shares 10 / 2 = 5 and 8 / 2 = 4, so both flows freeze at 4
    B/s (the lock-step flow then uses 8 of link 0's 10); 40 B take 10 s, and the second
    flow's last 20 B then run alone at 8 B/s."""
    assert max_min_rates(np.array([0, 0, 0, 1]), np.array([0, 0, 1, 1]), 2,
                         np.array([10.0, 8.0])).tolist() == [4.0, 4.0]
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 8.0]))
    ends = {}
    a = net.transfer([[0, 0, 1]], [40.0])
    b = net.transfer([[1]], [60.0])
    for name, tr in (("a", a), ("b", b)):
        tr.on_done.append(lambda _t, n=name: ends.setdefault(n, env.now))
    env.run()
    assert ends == pytest.approx({"a": 10.0, "b": 10.0 + 20.0 / 8.0})
    # alone, link 0 is its bottleneck: 10 / 2 = 5 B/s
    assert max_min_rates(np.array([0, 0, 0]), np.array([0, 0, 1]), 1,
                         np.array([10.0, 8.0])).tolist() == [5.0]
    assert net.link_bytes.tolist() == pytest.approx([80.0, 100.0])  # twice on link 0


# ----------------------------------------------------------------------------- steps
def test_bulk_synchronous_steps_wait_for_the_slowest_flow():
    """Two flows of 4 steps; a background transfer slows flow 0 during step 1 only (it lasts
    until t = 1.5). Flow 1 may not run ahead: each step ends when both flows finished it."""
    transfers = [dict(start=0.0, routes=[[0], [1]], sizes=[40.0, 40.0], steps=4, key="ring"),
                 dict(start=0.0, routes=[[0]], sizes=[7.5])]
    ends, _net = _check(transfers)
    # step 1: flow 0 at 5 B/s until the background drains (t = 1.5, 7.5 B), then 10 B/s for
    # the last 2.5 B (t = 1.75); steps 2-4 at 10 B/s: 1 s each
    assert ends[0] == pytest.approx(1.75 + 3.0)
    merged = fluid(CAP, [dict(transfers[0], steps=1), transfers[1]])
    assert merged[0] == pytest.approx(ends[0])  # a single slow step: no drift yet


def test_ring_steps_synchronise_under_rotating_contention():
    """A 4-flow ring (one flow per link, 6 steps) while background traffic rotates over the
    links, one link at a time: each step is as slow as its contended link, as in the packet
    model. Drifting steps (one transfer of 6x the bytes) would end 8% earlier (7.2 s, not 7.8)."""
    ring = dict(start=0.0, routes=[[0], [1], [2], [3]], sizes=[60.0] * 4, steps=6, key="ring")
    background = [dict(start=0.5 * k, routes=[[k % 4]], sizes=[3.0]) for k in range(14)]
    cap = [10.0] * 5
    ends, _ = engine_run(cap, [ring, *background])
    ref = fluid(cap, [ring, *background])
    assert ends == pytest.approx(ref, rel=1e-9)
    drift = fluid(cap, [dict(ring, steps=1), *background])
    assert ref[0] == pytest.approx(7.8) and drift[0] == pytest.approx(7.2)


def test_a_ring_started_again_alone_keeps_its_steps():
    """The second start of a ring alone in its component takes the allocation its first
    start derived (``FlowNetwork._start_solo``); it must still be bulk-synchronous when
    background traffic then joins it, as the reference says (drifting steps would end the
    second ring 0.6 s earlier, as in the rotating-contention case)."""
    ring = dict(start=0.0, routes=[[0], [1], [2], [3]], sizes=[60.0] * 4, steps=6, key="ring")
    again = dict(ring, start=10.0)
    background = [dict(start=10.0 + 0.5 * k, routes=[[k % 4]], sizes=[3.0]) for k in range(1, 14)]
    cap = [10.0] * 5
    ends, net = engine_run(cap, [ring, again, *background])
    assert net.solo_starts == 1
    assert ends == pytest.approx(fluid(cap, [ring, again, *background]), rel=1e-9)
    assert ends[0] == pytest.approx(6.0)
    drift = fluid(cap, [ring, dict(again, steps=1), *background])
    assert ends[1] - drift[1] > 0.1


def test_steps_with_a_cut_flow_wait_for_the_resend():
    transfers = [dict(start=0.0, routes=[[0], [1], [2]], sizes=[30.0, 30.0, 12.0], steps=3),
                 dict(start=0.2, routes=[[1, 4]], sizes=[5.0])]
    _check(transfers, cuts=[(0.5, 0, 0, 1.5, [3]), (2.2, 0, 1, 2.4, [4])])


def test_a_one_step_transfer_has_no_barrier():
    """Flow 0 (10 B at 10 B/s) and flow 1 (2 B at 1 B/s) of one transfer: flow 0 sends at full
    rate until it is done at t = 1, whatever flow 1 does (a barrier halfway would park it at
    t = 0.5)."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 1.0]))
    tr = net.transfer([[0], [1]], [10.0, 2.0])
    env.run(until=0.7)
    assert net.rates()[tr.id] == pytest.approx(water_fill([[0], [1]], [10.0, 1.0]))
    env.run(until=1.5)
    assert net.rates()[tr.id] == pytest.approx([0.0, 1.0])
    assert net.n_active_flows == 1
    env.run()
    assert env.now == pytest.approx(2.0)
    assert net.n_components == 0 and net.n_active_flows == 0 and not net.transfers


def test_rates_equal_the_reference_at_every_event():
    """After every start and completion, the engine's rates are the water-filling rates of the
    flows still sending (their routes taken from the transfers)."""
    rng = np.random.default_rng(5)
    env = simpy.Environment()
    net = FlowNetwork(env, np.asarray(CAP))
    checks = []

    def check():
        yield env.timeout(0)  # after the engine handled the event
        live = [(tr, i) for tr in net.transfers.values() for i in np.flatnonzero(tr.active)]
        got = np.array([net.rates()[tr.id][i] for tr, i in live])
        ref = water_fill([tr.routes[i].tolist() for tr, i in live], list(CAP))
        assert got == pytest.approx(ref, rel=1e-9)
        checks.append(len(live))

    def start(t, routes, sizes, steps):
        yield env.timeout(t)
        tr = net.transfer(routes, sizes, steps=steps)
        env.process(check())
        tr.on_done.append(lambda _t: env.process(check()))

    for k in range(15):
        nf = int(rng.integers(1, 4))
        routes = [sorted(set(rng.integers(0, 5, int(rng.integers(1, 3))).tolist()))
                  for _ in range(nf)]
        env.process(start(float(rng.uniform(0, 4)), routes, rng.uniform(1, 20, nf).tolist(),
                          1 + k % 3))
    env.run()
    assert len(checks) == 30 and max(checks) > 3


def test_route_pattern_cache_reuses_allocations():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 10.0]))
    assert (net.recomputes, net.cache_hits) == (0, 0)
    a = net.transfer([[0], [1]], [10.0, 10.0], key="p")
    env.run()
    assert (net.recomputes, net.cache_hits) == (1, 0)
    b = net.transfer([[0], [1]], [10.0, 10.0], key="p")
    env.run()
    assert (net.recomputes, net.cache_hits) == (1, 1)
    assert a.finished and b.finished and env.now == pytest.approx(2.0)
    assert a.id != b.id
    assert net.link_bytes == pytest.approx([20.0, 20.0])
    assert net.link_busy == pytest.approx([2.0, 2.0])


def test_contention_that_ends_mid_step_keeps_the_barrier():
    """Background traffic on link 0 ends while every ring flow is still inside step 1: the
    rates are equal again but the flows are no longer in step; the barrier still holds."""
    ring = dict(start=0.0, routes=[[0], [1], [2], [3]], sizes=[40.0] * 4, steps=4, key="r")
    bg = dict(start=0.1, routes=[[0]], sizes=[2.0])
    probe = dict(start=1.0, routes=[[1]], sizes=[1.0])  # link 1 while flow 1 waits at 1-1.2
    cap = [10.0] * 4
    ends, _ = engine_run(cap, [ring, bg, probe])
    ref = fluid(cap, [ring, bg, probe])
    assert ends == pytest.approx(ref, rel=1e-9)
    # step 1 ends at 1.2 (flow 0 lost 2 B to the background), steps 2-4 take 1 s each; the
    # probe has link 1 to itself while flow 1 waits at the barrier
    assert ref == pytest.approx([4.2, 0.5, 1.1])


def test_link_counters_read_mid_transfer_are_not_counted_twice():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 10.0, 10.0]))
    net.transfer([[0, 1], [2]], [20.0, 10.0], key="k")
    env.run(until=0.5)
    net.sync()
    assert net.link_bytes == pytest.approx([5.0, 5.0, 5.0])
    assert net.link_busy == pytest.approx([0.5, 0.5, 0.5])
    env.run()
    assert net.link_bytes == pytest.approx([20.0, 20.0, 10.0])
    assert net.link_busy == pytest.approx([2.0, 2.0, 1.0])


@pytest.mark.parametrize("key", [None, "empty"])
def test_a_transfer_without_flows_completes_at_once(key):
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0]))
    tr = net.transfer([], [], key=key)
    assert tr.finished and tr.done.triggered
    local = net.transfer([[]], [5.0], latency=0.25)   # a local copy: only the latency
    env.run()
    assert local.finished and env.now == pytest.approx(0.25)


def test_a_resumed_flow_that_is_ahead_waits_parked_while_another_is_cut():
    """Flow 1 ends step 1 and is parked, then both flows are cut; flow 1 comes back first
    (still ahead: parked again, nothing sends), flow 0 later. The transfer must not end
    before flow 0 has delivered everything."""
    transfers = [dict(start=0.0, routes=[[0], [1]], sizes=[20.0, 10.0], steps=2)]
    cuts = [(0.6, 0, 1, 0.8, [2]), (0.7, 0, 0, 1.5, [3])]
    ends, _net = _check(transfers, cuts)
    # flow 0: 7 B by 0.7, the other 3 B of step 1 from 1.5 over link 3 (6 B/s, to 2.0), step
    # 2 (10 B) to 2.0 + 10/6
    assert ends[0] == pytest.approx(2.0 + 10 / 6)


@pytest.mark.parametrize("seed", [5, 6])
def test_recurring_patterns_alone_and_in_company_keep_the_fluid_times(seed):
    """Keyed transfers of four patterns (two stepped rings) started at random: most run alone
    in their component (the cached solo start and finish), some meet others; every completion
    time is the fluid reference's and every byte crosses each link of its route once."""
    rng = np.random.default_rng(seed)
    patterns = [dict(routes=[[0], [1], [2]], sizes=[12.0] * 3, steps=3),
                dict(routes=[[0, 2], [3]], sizes=[8.0, 5.0]),
                dict(routes=[[4], [3, 4]], sizes=[6.0, 6.0], steps=2),
                dict(routes=[[1, 3]], sizes=[9.0])]
    transfers, t = [], 0.0
    for _ in range(40):
        t += float(rng.exponential(4.0))
        k = int(rng.integers(len(patterns)))
        transfers.append(dict(start=t, key=("pattern", k), latency=0.1, **patterns[k]))
    _ends, net = _check(transfers)
    assert net.solo_starts >= 10  # the fast path ran
    expect = np.zeros(len(CAP))
    for d in transfers:
        for r, b in zip(d["routes"], d["sizes"], strict=True):
            expect[r] += b
    assert net.link_bytes == pytest.approx(expect, rel=1e-9)


def test_cached_allocations_of_several_transfers_give_the_same_times():
    """Two keyed transfers sharing link 1 run twice: the second time their allocation comes
    from the cache (the slices of each transfer must still be its own)."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0, 10.0, 4.0]))
    times = []
    for _ in range(2):
        t0 = env.now
        a = net.transfer([[0, 1], [2]], [10.0, 8.0], key="a")
        b = net.transfer([[1]], [30.0], key="b")
        env.run()
        times.append((env.now - t0, a.finished, b.finished))
    ref = fluid([10.0, 10.0, 4.0], [dict(start=0.0, routes=[[0, 1], [2]], sizes=[10.0, 8.0]),
                                    dict(start=0.0, routes=[[1]], sizes=[30.0])])
    assert times[0] == times[1] == (pytest.approx(max(ref)), True, True)
    assert net.cache_hits >= 1


@pytest.mark.parametrize("size", [1.5, 0.9])
def test_sub_byte_steps_keep_the_barrier(size):
    """Steps of 0.5 B (and flows below one byte: 0.3 B per step) under rotating background
    traffic: the same bulk-synchronous times as the fluid reference."""
    ring = dict(start=0.0, routes=[[0], [1], [2]], sizes=[size] * 3, steps=3)
    bg = [dict(start=0.02 * k, routes=[[k % 3]], sizes=[0.05]) for k in range(8)]
    cap = [1.0, 1.0, 1.0]
    ends, _ = engine_run(cap, [ring, *bg])
    assert ends == pytest.approx(fluid(cap, [ring, *bg]), rel=1e-9)


def test_a_flow_that_ends_its_step_within_the_step_tolerance_releases_the_barrier():
    """Flow 1 ends step 1 at t = 1 and is parked; background traffic on link 0 (1 - d bytes)
    ends when flow 0 is d = 1e-8 B short of its step end: inside the 1e-6-step tolerance of
    the step count, but no timer marks it done. Flow 0 must still reach the barrier and
    release flow 1 (both then send step 2 together: done at 3 - d, not 4 - d, and not never)."""
    d = 1e-8
    cap = [1.0, 1.0]
    transfers = [dict(start=0.0, routes=[[0], [1]], sizes=[2.0, 2.0], steps=2),
                 dict(start=0.0, routes=[[0]], sizes=[1.0 - d])]
    ends, _ = engine_run(cap, transfers)
    ref = fluid(cap, transfers)
    assert ref[0] == pytest.approx(3.0 - d, rel=1e-12)
    assert ends == pytest.approx(ref, rel=1e-9)


def test_flows_of_different_sizes_with_equal_remaining_bytes_keep_the_barrier():
    """Flows of 10 B and 15 B in 2 steps (5 B and 7.5 B each). Three background flows hold
    flow 0 at 2.5 B/s until t = 2/3 while flow 1 runs at 10 B/s: then both have 8.33 B left
    and equal rates, but they are not in step (flow 1 is 0.83 B from its step end, flow 0
    3.33 B). The barrier must still hold: flow 1 parks at 0.75 until flow 0 ends step 1 at
    1.0; the transfer ends at 1.75 (without the barrier both would end at 1.5)."""
    bg = [dict(start=0.0, routes=[[0]], sizes=[5.0 / 3.0]) for _ in range(3)]
    tr = dict(start=0.0, routes=[[0], [1]], sizes=[10.0, 15.0], steps=2)
    cap = [10.0, 10.0]
    ends, _ = engine_run(cap, [tr, *bg])
    ref = fluid(cap, [tr, *bg])
    assert ref[0] == pytest.approx(1.75, rel=1e-12)
    assert ends == pytest.approx(ref, rel=1e-9)


def test_equal_flows_that_drifted_apart_keep_the_barrier_when_rates_equalise():
    """A 3-flow ring (30 B per flow, 3 steps of 10 B) with background traffic on link 0 until
    t = 0.4: flow 0 falls 2 B behind. Afterwards all rates are equal (10 B/s) but the
    remaining bytes are not: flows 1 and 2 must wait at every step end for flow 0, which a
    probe on link 1 sees (it has the link to itself while flow 1 waits)."""
    ring = dict(start=0.0, routes=[[0], [1], [2]], sizes=[30.0] * 3, steps=3, key="ring3")
    bg = dict(start=0.0, routes=[[0]], sizes=[2.0])
    probes = [dict(start=1.0 + 1e-3, routes=[[1]], sizes=[1.0]),
              dict(start=2.05, routes=[[2]], sizes=[1.0])]
    cap = [10.0] * 3
    ends, _ = engine_run(cap, [ring, bg, *probes])
    ref = fluid(cap, [ring, bg, *probes])
    assert ends == pytest.approx(ref, rel=1e-9)
    drifting = fluid(cap, [dict(ring, steps=1), bg, *probes])
    assert abs(drifting[1] - ref[2]) > 1e-3 or abs(drifting[0] - ref[0]) > 1e-3


def test_flows_in_step_wait_for_a_cut_flow_of_the_same_step():
    """A 3-flow ring in step (30 B per flow, 3 steps) loses flow 0 at t = 0.5 (link 0 fails)
    until t = 1.5 (resent over link 3). Flows 1 and 2 had the same remaining bytes and rates
    as flow 0 when it was cut, yet they must stop at the end of step 1 (t = 1.0) and wait for
    it; a probe on link 1 from t = 1.1 has the link to itself while flow 1 waits."""
    ring = dict(start=0.0, routes=[[0], [1], [2]], sizes=[30.0] * 3, steps=3, key="cut3")
    probe = dict(start=1.1, routes=[[1]], sizes=[2.0])
    cap = [10.0] * 4
    cuts = [(0.5, 0, 0, 1.5, [3])]
    ends, _ = engine_run(cap, [ring, probe], cuts)
    ref = fluid(cap, [ring, probe], cuts)
    assert ref[1] == pytest.approx(1.3, rel=1e-12)  # alone on link 1 while flow 1 waits
    assert ends == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("speed", [1.0, 1e5])
def test_flows_with_equal_step_times_out_of_step_keep_the_barrier(speed):
    """Flow 0 (20 B, steps of 10 B, link of 10 B/s) and flow 1 (40 B, steps of 20 B, 20 B/s)
    both take 1 s per step. Background traffic halves flow 0's rate until t = 6/7: flow 0 then
    has 5.71 B to its step end (0.57 s), flow 1 2.86 B (0.14 s): not in step (although bytes
    left x rate agree, 57.1 both). Flow 1 must park at t = 1.0 until 1.43; a probe on link 1
    from t = 1.05 has the link to itself meanwhile."""
    tr = dict(start=0.0, routes=[[0], [1]], sizes=[20.0, 40.0], steps=2)
    bg = dict(start=0.0, routes=[[0]], sizes=[30.0 / 7.0])
    probe = dict(start=1.05 / speed, routes=[[1]], sizes=[2.0])
    cap = [10.0 * speed, 20.0 * speed]  # speed 1e5: 10 us steps, the scale of real collectives
    ends, _ = engine_run(cap, [tr, bg, probe])
    ref = fluid(cap, [tr, bg, probe])
    assert ref[2] == pytest.approx(1.15 / speed, rel=1e-9)
    assert ends == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("speed", [1.0, 1e5])
def test_flows_that_end_a_step_together_but_step_at_different_speeds_keep_the_barrier(speed):
    """Two 30 B flows in 3 steps on links of 10 and 20 B/s; three background flows hold flow 1
    at 5 B/s until t = 2/3, when both are 1/3 s from the end of step 1 (in step now, but their
    steps take 1 s and 0.5 s). Flow 1 must wait at every later step end: it parks at 1.5 until
    2.0, and a probe on link 1 from 1.6 has the link to itself (done at 1.7)."""
    tr = dict(start=0.0, routes=[[0], [1]], sizes=[30.0, 30.0], steps=3)
    bg = [dict(start=0.0, routes=[[1]], sizes=[10.0 / 3.0]) for _ in range(3)]
    probe = dict(start=1.6 / speed, routes=[[1]], sizes=[2.0])
    cap = [10.0 * speed, 20.0 * speed]
    ends, _ = engine_run(cap, [tr, *bg, probe])
    ref = fluid(cap, [tr, *bg, probe])
    assert ref[-1] == pytest.approx(1.7 / speed, rel=1e-9)
    assert ends == pytest.approx(ref, rel=1e-9)


def test_a_flow_cut_with_less_than_one_byte_left_still_resumes():
    """Flow 0 (20 B on link 0 at 10 B/s) is cut at t = 1.96, 0.4 B short of done, and resumed
    at t = 3 over link 3: the last 0.4 B must still be sent (a sub-byte remainder is not "done";
    only the engine's 1e-6 B tolerance is)."""
    transfers = [dict(start=0.0, routes=[[0], [1]], sizes=[20.0, 12.0])]
    ends, net = _check(transfers, cuts=[(1.96, 0, 0, 3.0, [3])])
    assert ends[0] == pytest.approx(3.0 + 0.4 / CAP[3])
    assert net.link_bytes[[0, 3]] == pytest.approx([19.6, 0.4])


def test_flows_all_within_the_step_tolerance_of_the_end_at_a_reallocation_finish_then():
    """Two in-step flows (1000 B at 10 B/s, 400 B at 4 B/s, 2 steps) both end at t = 100; a
    transfer joins link 0 at t = 100 - 5e-6, when flow 0 has 5e-5 B (1e-7 of a step) left:
    flow 0 then ends at 100 + 5e-6 (5e-5 B at 5 B/s), the joiner 0.1 s later. (Found by the
    mutation run of branch flowsmut: the step target was -1 step when every pending flow was
    within the step count's tolerance of its end, so both ended 0.2 s late.)"""
    transfers = [dict(start=0.0, routes=[[0], [2]], sizes=[1000.0, 400.0], steps=2),
                 dict(start=100.0 - 5e-6, routes=[[0]], sizes=[1.0])]
    ends, _net = _check(transfers)
    assert ends == pytest.approx([100.0 + 5e-6, 100.1], rel=1e-9)


@pytest.mark.parametrize("steps", [1, 3])
def test_a_flow_resumed_on_an_empty_route_is_delivered_at_the_resume(steps):
    """A flow cut at t = 1.5 and resumed on an empty route (source and destination now the
    same device) has nothing left to cross: it is delivered at the resume. Closed forms (the
    ``fluid`` reference does not model empty routes): alone (20 B at 10 B/s, latency 0.25 s,
    resumed at 2) the transfer completes at 2.25. Beside a 12 B flow at 4 B/s, resumed at 2.2:
    in one step the transfer ends with that flow at 3; in 3 steps that flow ends step 2 at
    2.0, waits at the barrier for the cut flow's step until the resume at 2.2, and ends its
    last 4 B step at 3.2. Link 0 carried what the cut flow sent before 1.5 s: 15 B in one
    step; 20/3 B (step 1, done at 2/3 s) + 5 B (step 2, from 1 s) in three."""
    one = [dict(start=0.0, routes=[[0]], sizes=[20.0], latency=0.25, steps=steps)]
    ends, _ = engine_run(CAP, one, cuts=[(1.5, 0, 0, 2.0, [])])
    assert ends[0] == pytest.approx(2.25, rel=1e-12)
    two = [dict(start=0.0, routes=[[0], [2]], sizes=[20.0, 12.0], steps=steps)]
    ends, net = engine_run(CAP, two, cuts=[(1.5, 0, 0, 2.2, [])])
    assert ends[0] == pytest.approx(3.0 if steps == 1 else 3.2, rel=1e-9)
    sent = 15.0 if steps == 1 else 20.0 / 3.0 + 5.0
    assert net.link_bytes[[0, 2]] == pytest.approx([sent, 12.0], rel=1e-9)


def test_a_transfer_whose_last_flow_resumes_on_an_empty_route_is_done_at_once():
    """Resuming the only unfinished flow on an empty route delivers it in the same instant:
    ``done`` has fired and a cancel right after returns no undelivered bytes (the transfer
    finished), while the bytes it sent before the cut (10 B at 10 B/s for 1 s) stay counted."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.asarray(CAP, dtype=float))
    seen = {}

    def body():
        tr = net.transfer([[0]], [20.0])
        yield env.timeout(1.0)
        net.fail_links([0])
        yield env.timeout(1.0)
        net.resume(tr, np.array([0]), [[]])
        seen["done"] = tr.done.triggered
        seen["left"] = net.cancel(tr)

    env.process(body())
    env.run()
    assert seen == {"done": True, "left": 0.0}
    assert net.link_bytes[0] == pytest.approx(10.0, rel=1e-12)


def test_a_transfer_waits_for_a_cut_flow_while_another_resumes_on_an_empty_route():
    """Flows 0 (20 B on link 0, 10 B/s) and 1 (2 B on link 2, 4 B/s) are both cut at 0.3 s,
    with 17 B and 0.8 B left. Flow 0 resumes on an empty route at 1 s (delivered then), but
    flow 1 is still cut: the transfer is not done until flow 1, resumed over link 3 (6 B/s)
    at 2 s, has sent its 0.8 B, at 2 + 0.8 / 6 s."""
    ends, net = engine_run(CAP, [dict(start=0.0, routes=[[0], [2]], sizes=[20.0, 2.0])],
                           cuts=[(0.3, 0, 0, 1.0, []), (0.3, 0, 1, 2.0, [3])])
    assert ends[0] == pytest.approx(2.0 + 0.8 / 6.0, rel=1e-12)
    assert net.link_bytes[[0, 2, 3]] == pytest.approx([3.0, 1.2, 0.8], rel=1e-12)


def test_a_transfer_partly_sent_outside_the_engine_sends_the_rest_and_counts_every_byte():
    """A 100 B transfer over link 0 (10 B/s) started at 1 s that already ran 3 s outside the
    engine and delivered 30% of its bytes (``done_fraction``, ``busy_s``): its other 70 B take
    7 s, so it completes at 8 s; link 0 is counted 3 + 7 = 10 s busy and all 100 B."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.asarray(CAP, dtype=float))
    ends = []

    def body():
        yield env.timeout(1.0)
        tr = net.transfer([[0]], [100.0], done_fraction=0.3, busy_s=3.0)
        yield tr.done
        ends.append(env.now)

    env.process(body())
    env.run()
    net.sync()
    assert ends == pytest.approx([8.0], rel=1e-12)
    assert net.link_busy[0] == pytest.approx(10.0, rel=1e-12)
    assert net.link_bytes[0] == pytest.approx(100.0, rel=1e-12)


def test_sub_byte_steps_that_drift_apart_keep_the_barrier():
    """Two flows of 0.002 B in 2 steps (steps of 1 mB) on links 0 and 1 (10 B/s each); a
    5e-7 B transfer on link 1 halves flow 1's rate until it ends at 1e-7 s, leaving flow 1
    5e-7 B (half a thousandth of a step) behind flow 0. The in-step shortcut must not take
    them as in step: flow 0 waits at the step end for flow 1, and a probe on link 0 from
    1.9e-4 s shares the link with flow 0 for as long as the ``fluid`` reference says."""
    _check([dict(start=0.0, routes=[[0], [1]], sizes=[0.002, 0.002], steps=2),
            dict(start=0.0, routes=[[1]], sizes=[5e-7]),
            dict(start=1.9e-4, routes=[[0]], sizes=[0.001])])


def test_a_barrier_released_apart_from_the_rest_of_its_component_leaves_it_allocated():
    """Ring A (4 flows, 2 steps) and the long transfers C, E and G share a component only
    through D (links 3 and 5), which ends at t = 0.4 without the component being split (too
    few of its flows stopped). A's slowest flow ends its first step at t = 0.7 and releases
    the barrier: A rejoins the network apart from C, E and G, which must be allocated again
    (and finish) as in the fluid reference."""
    cap = [10.0] * 24
    transfers = [dict(start=0.0, routes=[[0], [1], [2], [3]], sizes=[10.0] * 4, steps=2),
                 dict(start=0.0, routes=[[3, 5]], sizes=[2.0]),
                 dict(start=0.0, routes=[[k] for k in range(5, 13)], sizes=[100.0] * 8),
                 dict(start=0.0, routes=[[k] for k in range(12, 20)], sizes=[100.0] * 8),
                 dict(start=0.0, routes=[[k] for k in range(19, 24)], sizes=[60.0] * 5)]
    ends, _net = engine_run(cap, transfers)
    assert ends == pytest.approx(fluid(cap, transfers), rel=1e-9)
    assert ends[1] == pytest.approx(0.4) and ends[0] == pytest.approx(0.7 + 0.5)


def test_local_copies_cost_nothing_and_are_never_active():
    """A flow with an empty route (source and destination on one device) has nothing to
    send: it is not an active flow, takes no share of any link, and a transfer of local
    copies alone is finished when it starts. Its bytes are not undelivered at a cancel."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([10.0]))
    tr = net.transfer([[], [0]], [7.0, 40.0])
    assert tr.active.tolist() == [False, True] and tr.remaining.tolist() == [0.0, 40.0]
    env.run(until=2.0)  # the routed flow alone on link 0: 20 B sent
    assert net.cancel(tr) == pytest.approx(20.0)
    local = net.transfer([[], []], [5.0, 6.0])
    env.run()
    assert local.finished and not local.active.any()
