"""The FIFO engine and queueing theory against references written here.

* the waits of ``fifo_queue`` against a plain departure-time recursion
  ``D_n = max(A_n, D_{n-1}) + S_n`` (a different recursion from the Lindley one the engine
  vectorizes; ``W_n = max(A_n, D_{n-1}) - A_n``);
* ``time_average_number`` against a plain sweep over the sorted arrival/departure events;
* the M/M/1, M/D/1 and M/G/1 formulas against their textbook closed forms evaluated here
  (Kleinrock vol. 1: ``W_q = rho/(mu - lambda)``, ``rho S/(2(1-rho))``,
  ``lambda E[S^2]/(2(1-rho))``) and against simulation over several seeds, with tolerances from
  the standard error of the batch means (never a fixed band).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from twin.kernel import queueing as q
from twin.kernel.errors import ScenarioError


def departures_reference(a, s, w0=0.0):
    """Plain loop: departure times of a single FIFO server (first customer waits ``w0``)."""
    out, dep = [], None
    for i, (ai, si) in enumerate(zip(a, s, strict=True)):
        start = ai + w0 if i == 0 else max(ai, dep)
        dep = start + si
        out.append((start - ai, dep))
    return np.array([w for w, _ in out]), np.array([d for _, d in out])


def number_reference(a, d, t0, t1):
    """Integral of the number present over [t0, t1] by an event sweep, / (t1 - t0)."""
    ev = sorted([(float(x), +1) for x in a] + [(float(x), -1) for x in d])
    n, last, area = 0, t0, 0.0
    for t, k in ev:
        t = min(max(t, t0), t1)
        area += n * (t - last)
        last = t
        n += k
    area += n * (t1 - last)
    return area / (t1 - t0)


def _random_queue(seed, n, rho=0.9, ties=True):
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, n)
    if ties:
        gaps[rng.random(n) < 0.1] = 0.0  # simultaneous arrivals
    a = np.cumsum(gaps) + 5.0
    s = rng.exponential(rho, n) * (rng.random(n) < 0.95)  # some zero services
    return a, s


@pytest.mark.parametrize("seed, n, block, seg, w0", [
    (0, 1, 1 << 16, 8, 0.0), (1, 2, 1 << 16, 8, 3.0), (2, 37, 4, 3, 0.5),
    (3, 1000, 64, 8, 0.0), (4, 5001, 1000, 7, 12.0), (5, 20000, 1 << 16, 8, 0.0),
    (6, 333, 1, 1, 1.0), (7, 4096, 512, 16, 0.0),
])
def test_fifo_equals_the_departure_recursion(seed, n, block, seg, w0):
    a, s = _random_queue(seed, n)
    res = q.fifo_queue(a, s, initial_wait=w0, block_size=block, segment=seg)
    waits, deps = departures_reference(a.tolist(), s.tolist(), w0)
    scale = max(1.0, float(np.abs(waits).max()))
    assert np.abs(res.waits - waits).max() <= 1e-9 * scale
    assert np.abs(res.departures - deps).max() <= 1e-9 * max(scale, float(deps.max()))
    assert np.allclose(res.service_starts, a + waits, rtol=0, atol=1e-9 * scale)
    assert np.allclose(res.sojourns, waits + s, rtol=0, atol=1e-9 * scale)
    assert res.n == n
    assert np.abs(q.fifo_waits(a, s, initial_wait=w0) - waits).max() <= 1e-9 * scale
    assert np.abs(q.fifo_departures(a, s, initial_wait=w0) - deps).max() <= 1e-9 * max(
        scale, float(deps.max()))
    ref = q.lindley_reference(a, s, initial_wait=w0)
    assert np.abs(ref - waits).max() <= 1e-9 * scale


def test_small_queue_by_hand():
    # arrivals 0, 1, 1, 6; services 2, 2, 1, 1: starts 0, 2, 4, 6 -> waits 0, 1, 3, 0
    res = q.fifo_queue([0.0, 1.0, 1.0, 6.0], [2.0, 2.0, 1.0, 1.0])
    assert res.waits.tolist() == [0.0, 1.0, 3.0, 0.0]
    assert res.departures.tolist() == [2.0, 4.0, 5.0, 7.0]
    assert res.backlog_at(6.0) == 1.0 and res.backlog_at(6.5) == 0.5 and res.backlog_at(9) == 0
    with pytest.raises(ScenarioError, match="t"):
        res.backlog_at(5.0)
    assert q.fifo_queue([], []).backlog_at(0.0) == 0.0
    assert q.fifo_queue([], []).n == 0


def test_batches_chain_through_the_backlog():
    a, s = _random_queue(9, 3000)
    whole = q.fifo_queue(a, s).waits
    first = q.fifo_queue(a[:1700], s[:1700])
    second = q.fifo_queue(a[1700:], s[1700:], initial_wait=first.backlog_at(float(a[1700])))
    assert np.abs(np.concatenate([first.waits, second.waits]) - whole).max() <= 1e-9 * max(
        1.0, whole.max())


def test_max_relative_difference_by_hand():
    assert q.max_relative_difference([1.0, 2.0], [1.0, 2.5]) == pytest.approx(0.2)
    assert q.max_relative_difference([1e-12, 2.0], [0.0, 2.0], floor=1.0) == pytest.approx(1e-12)
    assert q.max_relative_difference([1.0], [0.0]) == math.inf
    assert q.max_relative_difference([0.0], [0.0]) == 0.0
    assert q.max_relative_difference([], []) == 0.0
    with pytest.raises(ScenarioError):
        q.max_relative_difference([1.0], [1.0, 2.0])


# ----------------------------------------------------------------------------- theory
@pytest.mark.parametrize("lam, mu", [(0.1, 1.0), (0.5, 1.0), (0.9, 1.0), (3.0, 4.0), (0.0, 2.0)])
def test_mm1_closed_form(lam, mu):
    rho = lam / mu
    assert q.mm1_mean_wait(lam, mu) == pytest.approx(rho / (mu - lam), rel=1e-12)
    # P-K with exponential service (E[S^2] = 2/mu^2) is the same number
    assert q.mg1_mean_wait(lam, 1 / mu, 2 / mu ** 2) == pytest.approx(rho / (mu - lam),
                                                                       rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("lam, s", [(0.2, 1.0), (0.5, 1.5), (0.9, 1.0), (0.0, 1.0)])
def test_md1_closed_form(lam, s):
    rho = lam * s
    assert q.md1_mean_wait(lam, s) == pytest.approx(rho * s / (2 * (1 - rho)), rel=1e-12,
                                                    abs=1e-15)


@pytest.mark.parametrize("lam, mean, m2", [(0.3, 1.0, 5.0), (0.7, 0.5, 0.3), (1.5, 0.6, 1.0)])
def test_pollaczek_khinchine_closed_form(lam, mean, m2):
    rho = lam * mean
    assert q.mg1_mean_wait(lam, mean, m2) == pytest.approx(lam * m2 / (2 * (1 - rho)),
                                                           rel=1e-12)
    assert q.utilization(lam, mean) == pytest.approx(rho, rel=1e-15)


def test_unstable_or_infinite_variance_means_infinite_wait():
    assert q.mm1_mean_wait(1.0, 1.0) == math.inf and q.mm1_mean_wait(2.0, 1.0) == math.inf
    assert q.mg1_mean_wait(1.0, 1.0, 1.0) == math.inf
    assert q.mg1_mean_wait(0.999, 1.0, 1.0) == pytest.approx(0.999 / (2 * 0.001))
    assert q.mg1_mean_wait(0.5, 1.0, math.inf) == math.inf
    assert q.mg1_mean_wait(0.0, 1.0, math.inf) == 0.0
    # E[S^2] = E[S]^2 (deterministic) is allowed, below it is not
    assert q.mg1_mean_wait(0.5, 1.0, 1.0) == pytest.approx(0.5)
    with pytest.raises(ScenarioError, match="second_moment_s"):
        q.mg1_mean_wait(0.5, 1.0, 0.99)
    for bad in (dict(lam=-0.1, mean_s=1.0, second_moment_s=1.0),
                dict(lam=0.1, mean_s=0.0, second_moment_s=1.0),
                dict(lam=0.1, mean_s=1.0, second_moment_s=-1.0)):
        with pytest.raises(ScenarioError):
            q.mg1_mean_wait(**bad)
    with pytest.raises(ScenarioError):
        q.utilization(-1.0, 1.0)
    with pytest.raises(ScenarioError):
        q.md1_mean_wait(0.1, 0.0)


# ----------------------------------------------------------------------------- Little
@pytest.mark.parametrize("seed", range(3))
def test_time_average_number_equals_the_event_sweep(seed):
    a, s = _random_queue(seed, 400)
    res = q.fifo_queue(a, s)
    d = res.departures
    for t0, t1 in [(float(a[0]), float(d.max())), (float(a[50]), float(a[300])),
                   (0.0, float(a[10])), (float(a[20]) + 0.3, float(d.max()) + 7.0)]:
        assert q.time_average_number(a, d, t0, t1) == pytest.approx(
            number_reference(a, d, t0, t1), rel=1e-9)


def test_littles_law_sides_measured_plainly():
    a, s = _random_queue(21, 2000, ties=False)
    res = q.fifo_queue(a, s)
    d = res.departures
    t0, t1 = float(a[100]), float(a[1800])
    lw = q.littles_law(a, d, t0, t1)
    inside = (a >= t0) & (a <= t1)
    assert lw.customers == int(inside.sum())
    assert lw.arrival_rate == pytest.approx(inside.sum() / (t1 - t0), rel=1e-12)
    assert lw.mean_sojourn == pytest.approx(float(np.mean((d - a)[inside])), rel=1e-12)
    assert lw.number_in_system == pytest.approx(number_reference(a, d, t0, t1), rel=1e-9)
    assert lw.rate_times_sojourn == pytest.approx(lw.arrival_rate * lw.mean_sojourn)
    gap = abs(lw.number_in_system - lw.rate_times_sojourn) / lw.number_in_system
    assert lw.relative_gap == pytest.approx(gap, rel=1e-12)
    whole = q.littles_law(a, d)
    assert (whole.t_start, whole.t_end) == (float(a.min()), float(d.max()))
    assert whole.relative_gap < 1e-9     # the same integral over the whole busy horizon
    assert lw.t_start == t0 and lw.t_end == t1
    empty = q.littles_law([0.0], [0.0], 0.0, 1.0)
    assert empty.number_in_system == 0.0 and empty.relative_gap == 0.0
    with pytest.raises(ScenarioError):
        q.littles_law([], [])


@pytest.mark.parametrize("name, dist", [
    ("M/H2/1", q.HyperExponential2(1.0, 4.0)),
    ("M/E2/1", q.Erlang(1.0, 2)),
])
def test_pk_against_simulation_over_seeds(name, dist):
    """Mean wait of simulated M/G/1 queues (rho = 0.6) within 4 standard errors of P-K for
    each seed (batch means, 20 batches: P(|t_19| > 4) < 0.1%) and pooled within 3."""
    lam = 0.6
    theory = lam * dist.second_moment / (2 * (1 - lam * dist.mean))
    means, ses = [], []
    for seed in range(4):
        rng = np.random.default_rng([15, seed])
        a = np.cumsum(rng.exponential(1 / lam, 150_000))
        s = dist.sample(rng, 150_000)
        w = q.fifo_queue(a, s).waits[15_000:]
        bm = q.batch_means(w, 20)
        assert abs(bm.mean - theory) <= 4 * bm.standard_error, (name, seed, bm.mean, theory)
        means.append(bm.mean)
        ses.append(bm.standard_error)
    pooled_se = math.sqrt(sum(x * x for x in ses)) / len(ses)
    assert abs(float(np.mean(means)) - theory) <= 3 * pooled_se


def test_edge_cases_of_the_formulas_and_windows():
    # E[S^2] a rounding below E[S]^2 (a deterministic service computed in floats) is accepted
    m = 0.1
    assert q.mg1_mean_wait(0.5, m, m * m * (1 - 1e-13)) == pytest.approx(
        0.5 * m * m / (2 * (1 - 0.05)), rel=1e-9)
    # a window without arrivals: nobody's sojourn to average, one customer present throughout
    lw = q.littles_law([0.0], [5.0], 1.0, 2.0)
    assert lw.customers == 0 and lw.mean_sojourn == 0.0 and lw.arrival_rate == 0.0
    assert lw.number_in_system == pytest.approx(1.0)


def test_bad_services_and_arrivals_are_named_with_the_reason():
    with pytest.raises(ScenarioError, match=r"services\[1\].*must be >= 0"):
        q.fifo_queue([0.0, 1.0], [1.0, -1.0])
    with pytest.raises(ScenarioError, match=r"services\[1\].*must be finite"):
        q.fifo_queue([0.0, 1.0], [1.0, math.inf])
    with pytest.raises(ScenarioError, match=r"arrivals\[2\].*earlier than arrivals\[1\]"):
        q.fifo_queue([0.0, 2.0, 1.0], [1.0, 1.0, 1.0])
    with pytest.raises(ScenarioError, match=r"arrivals\[0\].*must be finite"):
        q.fifo_queue([math.nan, 2.0], [1.0, 1.0])
    with pytest.raises(ScenarioError, match="services"):
        q.fifo_queue([0.0, 1.0], [1.0])


def test_bad_values_inside_a_block_are_found_and_the_reference_checks_too():
    a = np.arange(10.0)
    s = np.ones(10)
    s[3] = math.inf
    with pytest.raises(ScenarioError, match=r"services\[3\].*must be finite"):
        q.fifo_queue(a, s)
    s[3] = -2.0
    with pytest.raises(ScenarioError, match=r"services\[3\].*must be >= 0"):
        q.fifo_queue(a, s)
    for bad_a, bad_s in (([0.0, 2.0, 1.0], [1.0, 1.0, 1.0]), ([0.0, 1.0], [1.0, -1.0]),
                         ([0.0, math.inf], [1.0, 1.0]), ([0.0, 1.0], [math.nan, 1.0])):
        with pytest.raises(ScenarioError):
            q.lindley_reference(bad_a, bad_s)


def test_a_bad_service_after_a_sub_second_one_is_named_by_its_own_index():
    """The first offending service is named (a valid 0.5 s service before it is not)."""
    with pytest.raises(ScenarioError) as err:
        q.fifo_queue([0.0, 1.0, 2.0], [0.5, -1.0, 1.0])
    assert [p.path for p in err.value.problems] == ["services[1]"]
