"""Adding a transfer to a component without re-solving it (``twin.kernel.joins``), against the
plain-Python water-filling reference of ``tests/test_flows_reference.py`` and the engine with
every join solved in full."""

from __future__ import annotations

import numpy as np
import pytest

import tests.test_flows_reference as ref
from twin.kernel import flows, maxmin_jit
from twin.kernel.joins import Ledger


def _entries(routes: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ef = np.array([f for f, r in enumerate(routes) for _ in r], dtype=np.int64)
    el = np.array([lk for r in routes for lk in r], dtype=np.int64)
    return ef, el


def _extend(old: list[list[int]], new: list[list[int]], cap: np.ndarray,
            compiled: bool = False):
    """``Ledger.join`` of ``new`` to the component of ``old`` flows (rates from the
    reference): ``(every rate, the new flows' bottleneck links)`` or None. ``compiled``:
    the ledger's compiled forms (``twin.kernel.maxmin_jit``)."""

    rate = np.array(ref.water_fill(old, cap.tolist()))
    ef, el = _entries(old)
    ulinks, inv = np.unique(el, return_inverse=True)
    local, links = _entries(new)
    lid, lown = np.zeros(len(cap), dtype=np.int64), np.full(len(cap), -1, dtype=np.int64)
    got = Ledger(7, lid, lown, ulinks, inv, ef, rate, maxmin_jit if compiled else None).join(
        local, links, len(new), cap, 0.0)
    return None if got is None else (np.concatenate([rate, got[0]]), got[1])


def test_a_flow_on_spare_links_keeps_the_rates_and_gets_the_spare():
    """Link 0 (cap 1) is shared by flows 0 and 1 (1/2 each); flow 1 also crosses link 1
    (cap 10). A new flow on link 1 alone gets 10 - 1/2 and changes nothing (it is the
    fastest flow on the link it saturates)."""
    cap = np.array([1.0, 10.0])
    got = _extend([[0], [0, 1]], [[1]], cap)
    assert got is not None
    rate, held = got
    assert rate.tolist() == pytest.approx([0.5, 0.5, 9.5])
    assert held.tolist() == [1]


@pytest.mark.parametrize("compiled", [False, True])
def test_joins_that_must_be_kept_are_kept(compiled):
    """The check accepts what it must, not only what is safe to refuse (a refusal costs a
    solve but gives the same rates, so the engine tests cannot see it): a flow on link 0
    alone (its bottleneck has id 0) at a rate below 1 B/s, and two flows on spare links
    (the progressive filling of several flows); NumPy and compiled ledgers."""
    got = _extend([[1]], [[0]], np.array([0.5, 1.0]), compiled)
    assert got is not None and got[0].tolist() == [1.0, 0.5] and got[1].tolist() == [0]
    got = _extend([[0], [0, 1]], [[1], [2, 3]], np.array([1.0, 10.0, 4.0, 6.0]), compiled)
    assert got is not None and got[0].tolist() == pytest.approx([0.5, 0.5, 9.5, 4.0])
    assert got[1].tolist() == [1, 2]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_join_that_saturates_its_link_only_to_rounding_is_kept(compiled):
    """An old flow held at 1.2605651854566955 by link 1 also crosses link 0 (cap
    6.78064926639201); a lock-step ring crossing link 0 three times gets a third of what is
    left. Its three shares and the old load add up to 8.9e-16 below the capacity in floating
    point (worked out here), yet the link is saturated: the join is kept, within the
    tolerance, by the NumPy and the compiled ledger."""
    cap = np.array([6.78064926639201, 1.2605651854566955])
    y = (cap[0] - cap[1]) / 3
    assert cap[1] + (y + y + y) < cap[0]  # the rounding the tolerance is there for
    got = _extend([[0, 1]], [[0, 0, 0]], cap, compiled)
    assert got is not None and got[0].tolist() == [cap[1], y] and got[1].tolist() == [0]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_join_a_rounding_slower_than_an_old_flow_on_its_link_is_kept(compiled):
    """An old flow held at r by link 1 (cap r) also crosses link 0, of capacity one unit in
    the last place below 2 r. A new flow on link 0 gets the rest, r less that unit (an exact
    subtraction): slower than the old flow there by rounding only, so link 0 is its
    bottleneck within the tolerance and the join is kept (the exact filling gives both
    r - ulp / 2: the same rates to rounding)."""
    r = 1.2605651854566955
    cap = np.array([np.nextafter(2 * r, 0.0), r])
    y = cap[0] - r
    assert y < r and y == r - (2 * r - cap[0])
    got = _extend([[0, 1]], [[0]], cap, compiled)
    assert got is not None and got[0].tolist() == [r, y] and got[1].tolist() == [0]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_flow_on_links_that_never_bind_is_left_to_the_full_solve(compiled):
    """Links of infinite capacity give a joining flow an infinite rate: not a rate to keep
    (one flow, and two: the progressive filling's path)."""
    assert _extend([[0]], [[1]], np.array([1.0, np.inf]), compiled) is None
    with np.errstate(invalid="ignore"):  # (the filling meets inf - inf on link 1)
        assert _extend([[0]], [[1], [2]], np.array([1.0, np.inf, 4.0]), compiled) is None


@pytest.mark.parametrize("compiled", [False, True])
def test_a_flow_that_takes_from_old_flows_is_left_to_the_full_solve(compiled):
    """A new flow on the saturated link 0 would take a share of it from flows 0 and 1 (all
    three get 1/3): keeping their rates would be wrong, so ``extend`` declines; and a new
    flow on link 1 slower than flow 1 there (link 1 of cap 0.6 saturated by flow 1's 1/2
    plus its 0.1) would take from flow 1 too."""
    assert _extend([[0], [0, 1]], [[0]], np.array([1.0, 10.0]), compiled) is None
    assert _extend([[0], [0, 1]], [[1]], np.array([1.0, 0.6]), compiled) is None


@pytest.mark.parametrize("seed", range(60))
def test_extend_is_the_max_min_allocation_whenever_it_accepts(seed):
    """Random components (routes of 1-4 distinct links over 3-9 links) and a random joining
    transfer of 1-4 flows: when ``extend`` keeps the old rates, old and new rates together
    are the water-filling of every flow (rel 1e-9)."""
    rng = np.random.default_rng(seed)
    n_links = int(rng.integers(3, 10))
    cap = rng.choice([1.0, 4.0, 10.0, 25.0], n_links) * rng.uniform(0.5, 2.0, n_links)

    old, new = _random_case(seed)[1:]
    cap = _random_case(seed)[0]
    got = _extend(old, new, cap)
    if got is not None:
        assert got[0].tolist() == pytest.approx(ref.water_fill(old + new, cap.tolist()),
                                                rel=1e-9)


def _random_case(seed: int) -> tuple[np.ndarray, list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(seed)
    n_links = int(rng.integers(3, 10))
    cap = rng.choice([1.0, 4.0, 10.0, 25.0], n_links) * rng.uniform(0.5, 2.0, n_links)

    def routes(k: int) -> list[list[int]]:
        return [sorted(set(rng.integers(0, n_links, int(rng.integers(1, 5))).tolist()))
                for _ in range(k)]

    return cap, routes(int(rng.integers(1, 8))), routes(int(rng.integers(1, 5)))


def test_extend_accepts_and_declines_in_the_random_cases():
    """The property above is not vacuous: over its seeds ``extend`` both accepts and
    declines."""
    assert {_extend(*_random_case(s)[1:], _random_case(s)[0]) is not None
            for s in range(60)} == {True, False}


def test_the_compiled_ledger_totals_are_the_same_to_the_bit():
    """``maxmin_jit.link_totals`` adds the entries' rates in the order ``np.bincount`` does:
    on random components the same loads, largest rates and counts, bit for bit."""
    rng = np.random.default_rng(3)
    for _ in range(40):
        n_flows, n_links = int(rng.integers(1, 30)), int(rng.choice([5, 20, 300]))
        ef = np.repeat(np.arange(n_flows), rng.integers(1, 6, n_flows)).astype(np.int64)
        inv = rng.integers(0, n_links, len(ef)).astype(np.int64)
        inv[:n_links] = np.arange(min(n_links, len(ef)))
        n = int(inv.max()) + 1
        rate = rng.uniform(0.1, 10.0, n_flows)
        ulinks = np.arange(n, dtype=np.int64)
        tables = [(np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)) for _ in "ab"]
        a = Ledger(1, *tables[0], ulinks, inv, ef, rate)
        b = Ledger(1, *tables[1], ulinks, inv, ef, rate, maxmin_jit)
        for name in ("load", "top", "count"):
            assert getattr(a, name)[:n].tolist() == getattr(b, name)[:n].tolist()
        assert a.count[:n].tolist() == np.bincount(inv, minlength=n).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_ledger_joins_and_leaves_to_the_bit(seed):
    """``maxmin_jit.ledger_slots`` / ``ledger_join`` / ``ledger_leave`` against the NumPy
    ``Ledger``: a random component on 200 links, then 60 random joins (one flow or several,
    on links already crossed or fresh ones, some crossing a link twice, so that some are
    kept, some refused and the ledger grows past its first slots) and departures of joined
    flows. After each, the
    returned rates and bottlenecks, every slot array, the link tables and the busy seconds
    are the same bit for bit."""
    rng = np.random.default_rng(seed)
    n_links = 200
    cap = rng.choice([1.0, 4.0, 10.0, 25.0], n_links) * rng.uniform(0.5, 2.0, n_links)
    old = [sorted(set(rng.integers(0, 12, int(rng.integers(1, 4))).tolist())) for _ in range(6)]
    rate = np.array(ref.water_fill(old, cap.tolist()))
    ef, el = _entries(old)
    ulinks, inv = np.unique(el, return_inverse=True)
    tables = [(np.zeros(n_links, dtype=np.int64), np.full(n_links, -1, dtype=np.int64))
              for _ in "ab"]
    a = Ledger(5, *tables[0], ulinks, inv, ef, rate)
    b = Ledger(5, *tables[1], ulinks, inv, ef, rate, maxmin_jit)
    busy = [np.zeros(n_links), np.zeros(n_links)]
    joined, outcomes, kept_twice = [], set(), False

    def same():
        assert a.n == b.n
        for name in ("gl", "load", "top", "count", "since"):
            assert getattr(a, name)[:a.n].tolist() == getattr(b, name)[:b.n].tolist(), name
        assert tables[0][0].tolist() == tables[1][0].tolist()
        assert tables[0][1].tolist() == tables[1][1].tolist()
        assert busy[0].tolist() == busy[1].tolist()

    for step in range(60):
        clock = 0.5 * step
        if joined and rng.random() < 0.3:
            links, rates = joined.pop(int(rng.integers(0, len(joined))))
            a.leave(links, rates, busy[0], clock)
            b.leave(links, rates, busy[1], clock)
            same()
            continue
        hi = 12 if rng.random() < 0.4 else n_links
        twice = rng.random() < 0.3  # links crossed twice or more, as rings cross them
        routes = [(int(rng.integers(12, n_links - 4)) + rng.choice(4, int(rng.integers(2, 6)))
                   if twice else rng.choice(hi, int(rng.integers(1, 6)), replace=False)
                   ).tolist() for _ in range(int(rng.integers(1, 4)))]
        local, links = _entries(routes)
        got_a = a.join(local, links, len(routes), cap, clock)
        got_b = b.join(local, links, len(routes), cap, clock)
        outcomes.add((got_a is None, len(routes) == 1))
        kept_twice |= (got_a is not None and len(routes) == 1
                       and len(set(routes[0])) < len(routes[0]))
        assert (got_a is None) == (got_b is None)
        if got_a is not None:
            assert got_a[0].tolist() == got_b[0].tolist()
            assert got_a[1].tolist() == got_b[1].tolist()
            joined.append((links, got_a[0][local]))
        same()
    # kept and refused, one flow and several; a single flow crossing a link twice kept
    assert {(True, True), (True, False), (False, True), (False, False)} <= outcomes
    assert kept_twice and len(a.gl) > 64


def test_a_ledger_grows_and_gives_busy_seconds_to_the_links_it_frees():
    """Flows 0 (link 0) and 1 (links 0, 1) hold 1/2 each (link 0 of cap 1). A flow joining
    at busy clock 2 s on 149 fresh links of cap 10 gets 10 (the ledger grows past its first
    64 slots, keeping the old ones); leaving at busy clock 5 s, each of its links gets 3 busy
    seconds and its slot is emptied, and the old links are as they were."""
    cap = np.full(200, 10.0)
    cap[0] = 1.0
    lid, lown = np.zeros(200, dtype=np.int64), np.full(200, -1, dtype=np.int64)
    led = Ledger(3, lid, lown, np.array([0, 1]), np.array([0, 0, 1]), np.array([0, 1, 1]),
                 np.array([0.5, 0.5]))
    links = np.arange(2, 151)
    got = led.join(np.zeros(len(links), dtype=np.int64), links, 1, cap, 2.0)
    assert got is not None and got[0].tolist() == [10.0] and 2 <= got[1][0] <= 150
    assert led.n == 151 and len(led.gl) >= 151
    assert led.gl[:led.n].tolist() == list(range(151))
    assert (lid[links] == np.arange(2, 151)).all() and (lown[:151] == 3).all()
    assert led.load[:3].tolist() == [1.0, 0.5, 10.0] and led.count[:3].tolist() == [2, 1, 1]
    busy = np.zeros(200)
    led.leave(links, np.full(len(links), 10.0), busy, 5.0)
    assert busy[links].tolist() == [3.0] * len(links) and busy[:2].tolist() == [0.0, 0.0]
    assert (led.load[2:151] == 0.0).all() and (led.count[2:151] == 0).all()
    assert (led.top[2:151] == 0.0).all()
    assert led.load[:2].tolist() == [1.0, 0.5] and led.count[:2].tolist() == [2, 1]
    led.flush(busy, 6.0)  # the old links, crossed since the ledger began (clock 0)
    assert busy[:2].tolist() == [6.0, 6.0] and busy[links].tolist() == [3.0] * len(links)


def test_a_flow_crossing_a_link_twice_counts_twice():
    """A lock-step ring crosses a link once per member, and the engine counts each crossing
    as a user. Alone on link 1 (cap 10) such a flow gets 10 / 2 = 5 beside an old flow on
    link 0 (cap 4, rate 4). Sharing link 1 with an old flow that also crosses link 0, the
    filling reaches 10 / 3 on link 1 (three crossings) before 4 on link 0, so both get 10/3:
    keeping the old flow's 4 would be wrong, and ``extend`` declines."""
    got = _extend([[0]], [[1, 1]], np.array([4.0, 10.0]))
    assert got is not None
    assert got[0].tolist() == pytest.approx([4.0, 5.0])
    assert _extend([[0, 1]], [[1, 1]], np.array([4.0, 10.0])) is None
    ef, el = _entries([[0, 1], [1, 1]])
    assert flows.max_min_rates(ef, el, 2, np.array([4.0, 10.0])).tolist() == \
        pytest.approx([10 / 3, 10 / 3])


def _staggered(seed: int) -> list[dict]:
    """Transfers over 16 links that meet: stepped rings on a few links each and single sends,
    started at random times (many join a component already running)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(14):
        k = int(rng.integers(2, 6))
        first = int(rng.integers(0, 16))
        out.append(dict(start=float(rng.uniform(0, 5)), steps=int(rng.integers(1, 5)),
                        routes=[[(first + 2 * j) % 16, (first + 2 * j + 1) % 16]
                                for j in range(k)],
                        sizes=rng.uniform(5, 40, k).tolist(), latency=0.001))
    for _ in range(10):
        out.append(dict(start=float(rng.uniform(0, 6)), routes=[[int(rng.integers(0, 16))]],
                        sizes=[float(rng.uniform(1, 30))]))
    return out


@pytest.mark.parametrize("jit", [False, True])
def test_the_engine_keeping_rates_equals_every_change_solved(monkeypatch, jit):
    """The same staggered workloads with ``keep_rates`` on and off: completion times, link
    bytes and busy seconds equal to rounding (rel 1e-12); some joins were extended and some
    departures kept the other rates, each saving a solve (NumPy and compiled forms)."""
    monkeypatch.setattr(flows, "_KEEP_ENTRIES", 0)  # (these components are small)
    if jit:
        monkeypatch.setattr(flows, "_JIT_FLOWS", 0)
        monkeypatch.setattr(flows, "_JIT_AFTER", -1)
    cap = [10.0, 4.0, 7.0, 25.0] * 4
    runs = {True: [], False: []}
    for on in (True, False):
        monkeypatch.setattr(flows.FlowNetwork, "keep_rates", on)
        runs[on] = [ref.engine_run(cap, _staggered(seed)) for seed in range(8)]
    for (on_ends, on), (off_ends, off) in zip(runs[True], runs[False], strict=True):
        assert off.extensions == 0
        assert on_ends == pytest.approx(off_ends, rel=1e-12)
        assert on.link_bytes == pytest.approx(off.link_bytes, rel=1e-12)
        assert on.link_busy == pytest.approx(off.link_busy, rel=1e-12)
        assert off.shrinks == 0
        assert on.recomputes + on.extensions + on.shrinks == off.recomputes
    assert sum(net.extensions for _e, net in runs[True]) > 0
    assert sum(net.shrinks for _e, net in runs[True]) > 0


def _wide(seed: int) -> list[dict]:
    """Transfers of 1-4 flows on routes of 3-12 of 240 links, started over 6 s: components
    of hundreds of links that merge, split and hand links to each other."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(60):
        k = int(rng.integers(1, 5))
        out.append(dict(start=float(rng.uniform(0, 6)), steps=int(rng.integers(1, 4)),
                        routes=[rng.choice(240, int(rng.integers(3, 13)), replace=False).tolist()
                                for _ in range(k)],
                        sizes=rng.uniform(5, 60, k).tolist(), latency=0.001))
    return out


def test_keeping_rates_on_a_wide_network_equals_every_change_solved(monkeypatch):
    """As above on 240 links, with ledgers of more than 64 slots (one grows over these
    seeds) and links passing from one component to another; the ledgers checked against
    fresh sums after every kept change."""
    monkeypatch.setattr(flows, "_KEEP_ENTRIES", 0)
    keep = flows.FlowNetwork._keep
    grown = []

    def checking(self, comp, got, *args, **kw):
        keep(self, comp, got, *args, **kw)
        _check_ledger(self)
        grown.append(comp.ledger is not None and len(comp.ledger.gl) > 64)

    cap = np.random.default_rng(1).choice([4.0, 10.0, 25.0], 240).tolist()
    for seed in range(3):
        monkeypatch.setattr(flows.FlowNetwork, "_keep", keep)
        monkeypatch.setattr(flows.FlowNetwork, "keep_rates", False)
        off_ends, off = ref.engine_run(cap, _wide(seed))
        monkeypatch.setattr(flows.FlowNetwork, "_keep", checking)
        monkeypatch.setattr(flows.FlowNetwork, "keep_rates", True)
        on_ends, on = ref.engine_run(cap, _wide(seed))
        assert on_ends == pytest.approx(off_ends, rel=1e-12)
        assert on.link_bytes == pytest.approx(off.link_bytes, rel=1e-12)
        assert on.link_busy == pytest.approx(off.link_busy, rel=1e-12)
        assert on.extensions > 0 and on.shrinks > 0
    assert any(grown)


def test_the_engine_keeping_rates_matches_the_fluid_reference(monkeypatch):
    """And against the plain fluid simulation (its own water-filling at every event)."""
    monkeypatch.setattr(flows, "_KEEP_ENTRIES", 0)
    cap = [10.0, 4.0, 7.0, 25.0] * 4
    total = 0
    for seed in range(4):
        transfers = _staggered(seed)
        ends, net = ref.engine_run(cap, transfers)
        total += net.extensions
        assert ends == pytest.approx(ref.fluid(cap, transfers), rel=1e-9)
    assert total > 0


@pytest.mark.parametrize("name", ref.FLUID_CASES)
@pytest.mark.parametrize("jit", [False, True])
def test_keeping_rates_passes_the_fluid_reference_tests(name, jit, monkeypatch):
    """The reference file's step-barrier, cut-and-resume and random-workload tests (against
    the plain fluid simulation) with every component keeping its rates where the check
    allows, solved in NumPy and by the compiled forms (whose bottlenecks must be the same)."""
    monkeypatch.setattr(flows, "_KEEP_ENTRIES", 0)
    if jit:
        monkeypatch.setattr(flows, "_JIT_FLOWS", 0)
        monkeypatch.setattr(flows, "_JIT_AFTER", -1)
    getattr(ref, name)()


def _check_ledger(net: flows.FlowNetwork) -> int:
    """Every component's ledger against sums made afresh from its flows: per crossed link
    the load (rel 1e-12) and the number of entries, a ``top`` no smaller than the fastest
    rate, the network's tables pointing at the slot; uncrossed slots empty. Returns the
    number of ledgers checked."""
    seen = 0
    for comp in net._comps:
        led = comp.ledger
        if led is None:
            continue
        seen += 1
        load, count, fastest = {}, {}, {}
        for (tr, act), lo in zip(comp.slices, comp.bounds.tolist(), strict=False):
            pos = {int(f): lo + i for i, f in enumerate(act)}
            for f, lk in zip(tr.entry_owner.tolist(), tr.entry_link.tolist(), strict=True):
                if f in pos:
                    r = float(comp.rate[pos[f]])
                    load[lk] = load.get(lk, 0.0) + r
                    count[lk] = count.get(lk, 0) + 1
                    fastest[lk] = max(fastest.get(lk, 0.0), r)
        live = {int(led.gl[i]): i for i in range(led.n) if led.count[i] > 0}
        assert set(live) == set(count)
        for lk, i in live.items():
            assert led.lid[lk] == i and led.lown[lk] == led.serial
            assert led.count[i] == count[lk]
            assert led.load[i] == pytest.approx(load[lk], rel=1e-12)
            assert led.top[i] >= fastest[lk]
    return seen


def test_two_transfers_ending_together_leave_the_ledger_as_fresh_sums(monkeypatch):
    """A departure of flows of two transfers at once: transfer L has seven flows, L0 alone
    on link 0 (cap 1), L1 on links 1-2 and L2 on 3-4 (bottlenecks 1 and 3, cap 1), L3-L6 on
    links 5-8; M and N share links 5 and 6; A (links 2, 10) and B (4, 11) take 9 each of the
    capacity 10 of links 2 and 4 and end together at 1 s. Every kept flow's bottleneck
    (link 0 among them) is untouched, so the departure keeps the rates, and the ledger is
    then the fresh sums."""
    monkeypatch.setattr(flows, "_KEEP_ENTRIES", 0)
    keep = flows.FlowNetwork._keep
    kept_at = []

    def checking(self, comp, got, *args, **kw):
        keep(self, comp, got, *args, **kw)
        if kw.get("kept") is not None:
            kept_at.append((self.env.now, _check_ledger(self)))

    monkeypatch.setattr(flows.FlowNetwork, "_keep", checking)
    cap = [1.0, 1.0, 10.0, 1.0, 10.0, 10.0, 10.0, 10.0, 10.0, 0.0, 9.0, 9.0]
    long = dict(start=0.0, routes=[[0], [1, 2], [3, 4], [5], [6], [7], [8]],
                sizes=[100.0] * 7)
    ends, _net = ref.engine_run(cap, [long, dict(start=0.0, routes=[[5]], sizes=[50.0]),
                                      dict(start=0.0, routes=[[6]], sizes=[50.0]),
                                      dict(start=0.0, routes=[[2, 10]], sizes=[9.0]),
                                      dict(start=0.0, routes=[[4, 11]], sizes=[9.0])])
    assert ends[3:] == pytest.approx([1.0, 1.0])
    assert (1.0, 1) in [(pytest.approx(t), n) for t, n in kept_at]


def test_the_ledger_is_the_sum_of_its_flows_after_every_kept_change(monkeypatch):
    """The staggered workloads with the check above after every join and departure that
    kept the rates (the ledger is updated, not summed afresh)."""
    monkeypatch.setattr(flows, "_KEEP_ENTRIES", 0)
    keep = flows.FlowNetwork._keep
    checked = []

    def checking(self, comp, got, *args, **kw):
        keep(self, comp, got, *args, **kw)
        checked.append(_check_ledger(self))
        for c in self._comps:  # (kept, not rebuilt, through joins and departures)
            lens = [len(act) for _t, act in c.slices]
            assert c.bounds.tolist() == np.cumsum([0, *lens]).tolist()
            assert c.nstep == sum(tr.steps > 1 for tr, _a in c.slices)

    monkeypatch.setattr(flows.FlowNetwork, "_keep", checking)
    cap = [10.0, 4.0, 7.0, 25.0] * 4
    for seed in range(8):
        ref.engine_run(cap, _staggered(seed))
    assert sum(checked) > 50


@pytest.mark.parametrize("jit", [False, True])
def test_a_ring_joining_unstepped_traffic_keeps_its_steps(monkeypatch, jit):
    """A one-flow transfer over links 0-4 runs at 1 B/s (link 4); a 6-step ring over links
    0-3 (link 3 at 5 B/s, the others 10) joins its component at 0.5 s on spare capacity, a
    kept join into a component that held no stepped transfer. The ring stays bulk-
    synchronous: its flows on links 0-2 park at each step end waiting for the one on link 3,
    so a 5 B transfer on link 0 at 2 s gets 9 B/s and ends at 2.556 s, as the fluid reference
    says (3.111 s if the ring's flows ran on without their steps). In NumPy and in the
    compiled step targets (which read the component's count of stepped transfers)."""
    monkeypatch.setattr(flows, "_KEEP_ENTRIES", 0)
    if jit:
        monkeypatch.setattr(flows, "_JIT_FLOWS", 0)
        monkeypatch.setattr(flows, "_JIT_AFTER", -1)
    monkeypatch.setattr(flows.FlowNetwork, "keep_rates", True)
    cap = [10.0, 10.0, 10.0, 5.0, 1.0]
    ring = dict(start=0.5, routes=[[0], [1], [2], [3]], sizes=[60.0] * 4, steps=6)
    transfers = [dict(start=0.0, routes=[[0, 1, 2, 3, 4]], sizes=[100.0]), ring,
                 dict(start=2.0, routes=[[0]], sizes=[5.0])]
    ends, net = ref.engine_run(cap, transfers)
    assert net.extensions >= 1
    assert ends == pytest.approx(ref.fluid(cap, transfers), rel=1e-9)
    assert ends[2] == pytest.approx(2.0 + 5.0 / 9.0, rel=1e-9)
    unstepped = ref.fluid(cap, [transfers[0], dict(ring, steps=1), transfers[2]])
    assert unstepped[2] == pytest.approx(2.0 + 10.0 / 9.0, rel=1e-9)
