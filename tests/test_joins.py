"""Adding a transfer to a component without re-solving it (``twin.kernel.joins``), against the
plain-Python water-filling reference of ``tests/test_flows_reference.py`` and the engine with
every join solved in full."""

from __future__ import annotations

import numpy as np
import pytest

import tests.test_flows_reference as ref
from twin.kernel import flows
from twin.kernel.joins import extend


def _entries(routes: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ef = np.array([f for f, r in enumerate(routes) for _ in r], dtype=np.int64)
    el = np.array([lk for r in routes for lk in r], dtype=np.int64)
    return ef, el


def _extend(old: list[list[int]], new: list[list[int]], cap: np.ndarray, jit=None):
    """``extend`` of the component of ``old`` flows (rates from the reference) by ``new``."""
    rate = np.array(ref.water_fill(old, cap.tolist()))
    ef, el = _entries(old)
    ulinks, inv = np.unique(el, return_inverse=True)
    local, links = _entries(new)
    table = np.full(len(cap), -1, dtype=np.int64)
    got = extend(rate, ef, ulinks, inv, None, local, links, len(new), cap, table, jit)
    assert (table == -1).all()  # the scratch is left as it was
    return got


def test_a_flow_on_spare_links_keeps_the_rates_and_gets_the_spare():
    """Link 0 (cap 1) is shared by flows 0 and 1 (1/2 each); flow 1 also crosses link 1
    (cap 10). A new flow on link 1 alone gets 10 - 1/2 and changes nothing (it is the
    fastest flow on the link it saturates)."""
    cap = np.array([1.0, 10.0])
    got = _extend([[0], [0, 1]], [[1]], cap)
    assert got is not None
    rate, ef, ulinks, inv, _cert = got
    assert rate.tolist() == pytest.approx([0.5, 0.5, 9.5])
    assert ulinks[inv].tolist() == [0, 0, 1, 1]
    assert ef.tolist() == [0, 1, 1, 2]


def test_a_flow_that_takes_from_old_flows_is_left_to_the_full_solve():
    """A new flow on the saturated link 0 would take a share of it from flows 0 and 1 (all
    three get 1/3): keeping their rates would be wrong, so ``extend`` declines; and a new
    flow on link 1 slower than flow 1 there (link 1 of cap 0.6 saturated by flow 1's 1/2
    plus its 0.1) would take from flow 1 too."""
    assert _extend([[0], [0, 1]], [[0]], np.array([1.0, 10.0])) is None
    assert _extend([[0], [0, 1]], [[1]], np.array([1.0, 0.6])) is None


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


def test_extend_with_the_compiled_loads_is_the_same_to_the_bit():
    """``maxmin_jit.crossed_loads`` adds the old entries' rates in the order ``np.add.at``
    does: on every random case the same decision and the same arrays, bit for bit."""
    from twin.kernel import maxmin_jit

    for seed in range(60):
        cap, old, new = _random_case(seed)
        a, b = _extend(old, new, cap), _extend(old, new, cap, maxmin_jit)
        assert (a is None) == (b is None)
        if a is not None:
            for x, y in zip(a[:4], b[:4], strict=True):
                assert x.tolist() == y.tolist()


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


def _shrink_by_hand(keep, entry_flow, inv, cert, n_links):
    """Plain loops: the kept entries renumbered, or None when a kept flow's bottleneck is
    unknown or was crossed by a stopped flow."""
    freed = {int(inv[e]) for e in range(len(inv)) if not keep[entry_flow[e]]}
    kept = [f for f in range(len(keep)) if keep[f]]
    if any(cert[f] < 0 or int(cert[f]) in freed for f in kept):
        return None
    new_f = {f: i for i, f in enumerate(kept)}
    ents = [(new_f[int(entry_flow[e])], int(inv[e])) for e in range(len(inv))
            if keep[entry_flow[e]]]
    links = sorted({lk for _f, lk in ents})
    new_l = {lk: i for i, lk in enumerate(links)}
    return ([f for f, _l in ents], [new_l[lk] for _f, lk in ents],
            [lk in new_l for lk in range(n_links)], [new_l[int(cert[f])] for f in kept])


def test_the_compiled_shrink_renumbers_as_plain_loops_do():
    """``maxmin_jit.shrink_entries`` against plain Python loops on random components: the
    same refusal, and otherwise the same renumbered flows, links and bottlenecks."""
    from twin.kernel import maxmin_jit

    rng = np.random.default_rng(5)
    outcomes = set()
    for _ in range(300):
        n_flows, n_links = int(rng.integers(1, 12)), int(rng.integers(1, 10))
        per = rng.integers(1, 5, n_flows)
        entry_flow = np.repeat(np.arange(n_flows), per).astype(np.int64)
        inv = rng.integers(0, n_links, len(entry_flow)).astype(np.int64)
        cert = np.array([rng.choice(inv[entry_flow == f]) for f in range(n_flows)],
                        dtype=np.int64)
        cert[rng.random(n_flows) < 0.05] = -1
        keep = rng.random(n_flows) < 0.7
        want = _shrink_by_hand(keep, entry_flow, inv, cert, n_links)
        ok, ef, iv, used, ce = maxmin_jit.shrink_entries(keep, entry_flow, inv, cert, n_links)
        outcomes.add(ok)
        assert ok == (want is not None)
        if ok:
            assert (ef.tolist(), iv.tolist(), used.tolist(), ce.tolist()) == want
    assert outcomes == {True, False}
