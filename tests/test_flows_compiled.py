"""The flow engine's compiled allocation (``twin.kernel.maxmin_jit``, used for components of
``twin.kernel.flows._JIT_FLOWS`` flows or more once a run has made ``_JIT_AFTER`` of them)
against its NumPy / Python form and the plain references of ``tests/test_flows_reference.py``.

The compiled forms promise the same IEEE operations in the same order, so the comparisons
with the NumPy form are exact (bit for bit), not within a tolerance; the comparisons with the
fluid reference keep that file's rel 1e-9.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

import tests.test_flows_reference as ref
from twin.kernel import flows
from twin.kernel.maxmin import _max_min_local
from twin.kernel.maxmin_jit import compact_max_min
from twin.kernel.steps import step_target
from twin.kernel.transfer import Component, Transfer


def _instance(rng: np.random.Generator):
    """A random incidence: up to 60 links (some of infinite capacity, capacities drawn from a
    few values so that shares tie, or differ by 5e-11 or 5e-10 relative: a bottleneck tie
    is taken within 1e-12), up to 300 flows of 0-5 links each."""
    n_all = int(rng.integers(1, 60))
    cap = (rng.choice([1.0, 2.0, 3.5, 10.0, np.inf], n_all) * rng.choice([1.0, 1.0, 0.3], n_all)
           * rng.choice([1.0, 1.0 + 5e-11, 1.0 + 5e-10], n_all))  # ties, near ties
    n_flows = int(rng.integers(1, 300))
    ef, el = [], []
    for f in range(n_flows):
        links = rng.choice(n_all, size=min(int(rng.integers(0, 6)), n_all), replace=False)
        ef += [f] * len(links)
        el += links.tolist()
    return (np.array(ef, dtype=np.int64), np.array(el, dtype=np.int64), n_flows, cap)


@pytest.mark.parametrize("seed", range(60))
def test_compiled_max_min_is_the_numpy_solve_to_the_bit(seed):
    ef, el, n, cap = _instance(np.random.default_rng(seed))
    scratch = np.full(len(cap), -1, dtype=np.int64)
    cert, want_cert = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    rate, ulinks, inv = compact_max_min(ef, el, n, cap, scratch, cert)
    want_links, want_inv = np.unique(el, return_inverse=True)
    with np.errstate(invalid="ignore"):  # inf x 0 on links of infinite capacity: never read
        want = _max_min_local(ef, want_inv, n, cap[want_links], want_cert)
    assert rate.tobytes() == want.tobytes()
    assert np.array_equal(cert, want_cert)
    _bottlenecks_hold(ef, inv, rate, cap[ulinks], cert)
    assert np.array_equal(ulinks, want_links) and np.array_equal(inv, want_inv)
    assert (scratch == -1).all()  # left as it was given
    if len(el):  # the textbook water filling agrees too (to rounding)
        routes = [el[ef == f].tolist() for f in range(n)]
        finite = [r for r in range(n) if np.isfinite(want[r])]
        wf = ref.water_fill([routes[f] for f in finite], cap.tolist())
        assert rate[finite] == pytest.approx(wf, rel=1e-9)


def _bottlenecks_hold(ef, inv, rate, cap, cert) -> None:
    """Each flow's ``cert`` is a link it crosses, saturated (rel 1e-9), on which no flow is
    faster: the bottleneck property of a max-min allocation, checked here by summing loads
    (flows of infinite rate, without finite links, have none)."""
    finite = np.isfinite(rate)
    load = np.zeros(len(cap))
    np.add.at(load, inv[finite[ef]], rate[ef[finite[ef]]])
    fastest = np.zeros(len(cap))
    np.maximum.at(fastest, inv[finite[ef]], rate[ef[finite[ef]]])
    for f in np.flatnonzero(finite):
        lk = cert[f]
        assert lk in inv[ef == f]
        assert load[lk] == pytest.approx(cap[lk], rel=1e-9)
        assert rate[f] >= fastest[lk] * (1 - 1e-12)


def _many_levels(rng: np.random.Generator):
    """An incidence with many distinct rates (more levels than ``max_min_local`` scans
    before it turns to its heap): up to 200 links of continuous random capacities, up to 400
    flows of 1-4 links each."""
    n_all = int(rng.integers(20, 200))
    cap = rng.uniform(1.0, 50.0, n_all)
    n_flows = int(rng.integers(50, 400))
    ef, el = [], []
    for f in range(n_flows):
        links = rng.choice(n_all, size=int(rng.integers(1, 5)), replace=False)
        ef += [f] * len(links)
        el += links.tolist()
    return (np.array(ef, dtype=np.int64), np.array(el, dtype=np.int64), n_flows, cap)


@pytest.mark.parametrize("seed", range(30))
def test_compiled_max_min_with_many_levels_is_the_numpy_solve_to_the_bit(seed):
    """More levels than the compiled solve scans (``_SCAN_LEVELS``): the rest go through
    its heap of link shares, from the state the scans left."""
    from twin.kernel.maxmin_jit import _SCAN_LEVELS

    ef, el, n, cap = _many_levels(np.random.default_rng(1000 + seed))
    scratch = np.full(len(cap), -1, dtype=np.int64)
    cert, want_cert = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    rate, ulinks, inv = compact_max_min(ef, el, n, cap, scratch, cert)
    want_links, want_inv = np.unique(el, return_inverse=True)
    want = _max_min_local(ef, want_inv, n, cap[want_links], want_cert)
    assert len(np.unique(want)) > _SCAN_LEVELS  # the heap part was reached
    assert rate.tobytes() == want.tobytes()
    assert np.array_equal(cert, want_cert)
    _bottlenecks_hold(ef, inv, rate, cap[ulinks], cert)
    assert np.array_equal(ulinks, want_links) and np.array_equal(inv, want_inv)
    assert (scratch == -1).all()
    routes = [el[ef == f].tolist() for f in range(n)]
    assert rate == pytest.approx(ref.water_fill(routes, cap.tolist()), rel=1e-9)


def _stepped_state(rng: np.random.Generator) -> tuple[Transfer, np.ndarray, np.ndarray]:
    """A stepped transfer part way through (``(transfer, active flows, their rates)``): its
    slowest flows pending in step ``top`` from the end, others parked at the end of the step
    before, done, or (equal flows) a hair apart; rates equal, a hair apart or unequal."""
    k = int(rng.integers(1, 12))
    steps = int(rng.integers(2, 9))
    equal = bool(rng.integers(2))
    size = np.full(k, 48.0) if equal else rng.uniform(10.0, 60.0, k)
    tr = Transfer(0, [np.array([j]) for j in range(k)], size, 0.0, simpy.Environment(), 0.0,
                  steps=steps)
    step = size / steps
    top = int(rng.integers(1, steps + 1))
    hair = float(rng.choice([0.0, 5e-10, 5e-8, 1e-6]))
    kind = rng.choice(["pending", "parked", "done", "hair"], k, p=[0.5, 0.2, 0.1, 0.2])
    kind[0] = "pending"
    # one fraction of the step left for all (some just above the step's end: within its
    # 1e-6 tolerance or not) or one each
    u = (float(rng.choice([rng.uniform(0.05, 0.95), 1e-4, 5e-6, 5e-7])) if rng.integers(2)
         else None)
    for j in range(k):
        frac = u if u is not None else float(rng.uniform(0.05, 0.95))
        if kind[j] == "pending":
            tr.remaining[j] = (top - 1 + frac) * step[j]
        elif kind[j] == "hair":
            tr.remaining[j] = (top - 1 + frac) * step[j] * (1 + hair)
        elif kind[j] == "parked" and top > 1:
            tr.remaining[j] = (top - 1) * step[j]
            tr.parked[j] = True
        else:
            tr.remaining[j] = 0.0
    tr.active = (tr.remaining > 0) & ~tr.parked
    act = np.flatnonzero(tr.active)
    r0 = float(rng.uniform(1.0, 10.0))
    rates = rng.choice([r0, r0 * (1 + 5e-10), r0 * (1 + 5e-8), r0 * 2.0], len(act),
                       p=[0.6, 0.15, 0.15, 0.1])
    return tr, act, rates


def _comp(slices: list) -> Component:
    """A component holding ``slices`` (what the compiled step targets read)."""
    comp = Component(0.0)
    comp.set_slices([(tr, act) for tr, _lo, _hi, act in slices])
    return comp


@pytest.mark.parametrize("seed", range(400))
def test_compiled_step_targets_are_the_methods_to_the_bit(seed):
    """``step_targets`` against ``steps.step_target`` on a transfer in the states a
    ring passes through (pending, parked at a step end, done, a hair out of step; rates
    equal, a hair apart or not): the same None / target, the same bits."""
    tr, act, rate = _stepped_state(np.random.default_rng(seed))
    want = step_target(tr, act, rate)
    to_go, got = flows._step_targets_compiled(_comp([(tr, 0, len(act), act)]), rate)
    if want is None:
        assert got is None
        assert to_go.tobytes() == tr.remaining[act].tobytes()
    else:
        assert got is not None and got.tobytes() == want.tobytes()
        assert to_go.tobytes() == (tr.remaining[act] - want).tobytes()


@pytest.mark.parametrize("seed", range(100))
def test_compiled_step_targets_of_several_transfers_in_one_call(seed):
    """Two to five such transfers in one call (one component's stepped slices, among
    one-step slices): each slice's target is the method's, 0 where the method gives None."""
    rng = np.random.default_rng(10_000 + seed)
    slices, want, n = [], [], 0
    for _ in range(int(rng.integers(2, 6))):
        tr, act, rate = _stepped_state(rng)
        if rng.integers(4) == 0:
            tr.steps = 1  # a one-step transfer among them: no target asked
        slices.append((tr, n, n + len(act), act))
        step = None if tr.steps == 1 else step_target(tr, act, rate)
        want.append((rate, step))
        n += len(act)
    rate = np.concatenate([r for r, _w in want])
    comp = _comp(slices)
    to_go, got = flows._step_targets_compiled(comp, rate)
    expect = np.concatenate([np.zeros(len(r)) if w is None else w for r, w in want])
    if all(w is None for _r, w in want):
        assert got is None
    else:
        assert got.tobytes() == expect.tobytes()
    rem = np.concatenate([tr.remaining[act] for tr, _lo, _hi, act in slices])
    assert to_go.tobytes() == (rem - expect).tobytes()


def test_compiled_step_targets_keep_statics_only_for_the_same_stepped_transfers():
    """The step sizes and offsets kept on the component serve a later call with the same
    stepped transfers (other flows active, other bytes left) and are rebuilt when they
    change: every call equals the method on each slice."""
    rng = np.random.default_rng(99)
    states = [_stepped_state(rng) for _ in range(3)]
    for j, (tr, _a, _r) in enumerate(states):
        tr.id = j
    comp = Component(0.0)

    def check(which):
        slices, want, n = [], [], 0
        for tr, act, rate in which:
            slices.append((tr, n, n + len(act), act))
            want.append(step_target(tr, act, rate))
            n += len(act)
        comp.set_slices([(tr, act) for tr, _lo, _hi, act in slices])
        rate = np.concatenate([r for _t, _a, r in which])
        _to_go, got = flows._step_targets_compiled(comp, rate)
        expect = np.concatenate([np.zeros(len(a)) if w is None else w
                                 for (_t, a, _r), w in zip(which, want, strict=True)])
        assert (got if got is not None else np.zeros(n)).tobytes() == expect.tobytes()

    check(states[:2])
    kept = comp.statics
    tr, act, _rate = states[1]
    tr.remaining[act] *= 0.5  # same transfers, other state
    check(states[:2])
    assert comp.statics is kept
    check(states[1:])  # other transfers: rebuilt
    assert comp.statics is not kept and comp.statics[0] == (1, 2)


def test_compiled_step_targets_take_the_methods_shortcut_on_every_slice():
    """A uniform ring whose rates differ by 0.9e-9 and remaining bytes by 0.9e-9 of a step:
    the method's cheap in-step check (rates and bytes within 1e-9) says None, though its
    general check would not (the times to the step's end differ by ~1.8e-9 of a step's time).
    As the second slice of a call, after any stepped transfer, it must still get None."""
    rng = np.random.default_rng(7)
    first, act0, rate0 = _stepped_state(rng)
    tr = Transfer(1, [np.array([j]) for j in range(4)], np.full(4, 48.0), 0.0,
                  simpy.Environment(), 0.0, steps=4)
    tr.remaining[:] = 1.999 * 12.0
    tr.remaining[0] += 0.9e-9 * 12.0
    act = np.arange(4)
    rate = np.array([5.0, 5.0, 5.0, 5.0 * (1 + 0.9e-9)])
    assert step_target(tr, act, rate) is None
    n0 = len(act0)
    slices = [(first, 0, n0, act0), (tr, n0, n0 + 4, act)]
    _to_go, got = flows._step_targets_compiled(_comp(slices), np.concatenate([rate0, rate]))
    want0 = step_target(first, act0, rate0)
    if want0 is None:
        assert got is None
    else:
        assert got[:n0].tobytes() == want0.tobytes() and not got[n0:].any()


def _rings(seed: int, n: int = 14):
    """``n`` stepped transfers (rings of 3-8 flows, 2-8 steps, equal or unequal sizes; drawn
    from 5 patterns, keyed, so that some allocations come from the pattern cache) and
    one-step transfers over 12 links, staggered so that they meet."""
    rng = np.random.default_rng(seed)
    patterns = []
    for i in range(5):
        k = int(rng.integers(3, 9))
        first = int(rng.integers(0, 12))
        routes = [[(first + j) % 12, (first + j + 1) % 12] for j in range(k)]
        sizes = ([float(rng.uniform(10, 60))] * k if i % 2 else rng.uniform(10, 60, k).tolist())
        patterns.append(dict(routes=routes, sizes=sizes, steps=int(rng.integers(2, 9))))
    transfers = []
    for _ in range(n):
        j = int(rng.integers(len(patterns)))
        transfers.append(dict(start=float(rng.uniform(0, 4)), latency=0.01, key=("ring", j),
                              **patterns[j]))
    for _ in range(n // 2):
        transfers.append(dict(start=float(rng.uniform(0, 6)), routes=[[int(rng.integers(0, 12))]],
                              sizes=[float(rng.uniform(1, 20))]))
    return transfers


def _run(transfers, threshold, monkeypatch, cap):
    monkeypatch.setattr(flows, "_JIT_FLOWS", threshold)
    monkeypatch.setattr(flows, "_JIT_AFTER", -1)
    calls = []
    real = flows._step_targets_compiled

    def counted(comp, rate, rem=None):
        calls.append(len(rate))
        return real(comp, rate, rem)

    monkeypatch.setattr(flows, "_step_targets_compiled", counted)
    ends, net = ref.engine_run(cap, transfers)
    return ends, net, calls


@pytest.mark.parametrize("seed", range(6))
def test_the_engine_gives_the_same_times_to_the_bit_either_way(seed, monkeypatch):
    """The same workload of contended, stepped rings with the compiled allocation for every
    component (threshold 0) and for none: every completion time and every link's bytes and
    busy seconds are equal to the last bit, and the compiled step targets ran."""
    cap = [10.0] * 6 + [4.0, 7.0] * 3
    transfers = _rings(seed)
    fast = _run(transfers, 0, monkeypatch, cap)
    slow = _run(transfers, 10**9, monkeypatch, cap)
    assert fast[2] and not slow[2]
    assert fast[0] == slow[0]
    assert fast[1].link_bytes.tobytes() == slow[1].link_bytes.tobytes()
    assert fast[1].link_busy.tobytes() == slow[1].link_busy.tobytes()
    assert fast[1].recomputes == slow[1].recomputes


@pytest.mark.parametrize("name", ref.FLUID_CASES)
def test_the_compiled_allocation_passes_the_fluid_reference_tests(name, monkeypatch):
    """The reference file's step-barrier and random-workload tests (against the plain fluid
    simulation), with every component allocated by the compiled forms."""
    monkeypatch.setattr(flows, "_JIT_FLOWS", 0)
    monkeypatch.setattr(flows, "_JIT_AFTER", -1)
    getattr(ref, name)()
