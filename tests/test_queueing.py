"""Tests of twin.kernel.queueing: the FIFO engine against references and theory, distributions,
arrival processes and the heavy-tail diagnostics.

Tolerances come from standard errors (batch means for queue waits, analytic or sample
moments for distributions, binomial bounds for interval coverage), never from pinned seeded
numbers. Seeds are fixed only so that a failure can be reproduced.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from twin.kernel import queueing as q
from twin.kernel.errors import ScenarioError

SEEDS = (11, 23, 37)


def plain_lindley(arrivals, services, initial_wait=0.0):
    """Independent sequential Lindley loop, written without the module."""
    waits = []
    w = float(initial_wait)
    for i in range(len(arrivals)):
        if i:
            w = max(0.0, w + float(services[i - 1]) - (float(arrivals[i]) - float(arrivals[i - 1])))
        waits.append(w)
    return np.array(waits, dtype=float)


def simpy_fifo(arrivals, services):
    """Waits and departures from a SimPy ``Resource(capacity=1)`` queue on the same inputs."""
    env = simpy.Environment()
    server = simpy.Resource(env, capacity=1)
    n = len(arrivals)
    waits = np.empty(n)
    departures = np.empty(n)

    def customer(i):
        with server.request() as req:
            yield req
            waits[i] = env.now - arrivals[i]
            yield env.timeout(services[i])
            departures[i] = env.now

    def source():
        for i, t in enumerate(arrivals):
            yield env.timeout(max(0.0, t - env.now))
            env.process(customer(i))

    env.process(source())
    env.run()
    return waits, departures


def poisson_mg1(rng, lam, dist, n):
    arrivals = q.PoissonArrivals(lam).sample(rng, n)
    return arrivals, dist.sample(rng, n)


# ------------------------------------------------------------------------------------------
# FIFO engine vs references
# ------------------------------------------------------------------------------------------

# Subnormal times (< 2.2e-308 s) are excluded: differences at that scale are rounding, not
# queueing (hypothesis found 0 vs 1.1e-308 once).
_gap = st.one_of(st.just(0.0), st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False,
                                         allow_subnormal=False))
_service = st.one_of(st.just(0.0), st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False,
                                             allow_subnormal=False))


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(st.tuples(_gap, _service), min_size=0, max_size=120),
    offset=st.sampled_from([0.0, 1.0e3, 1.0e6]),
    initial_wait=st.one_of(st.just(0.0), st.floats(0.0, 5.0)),
    block_size=st.sampled_from([1, 2, 3, 8, 13, 64, 1 << 16]),
    segment=st.sampled_from([1, 2, 3, 8]),
)
def test_fifo_equals_sequential_loop(data, offset, initial_wait, block_size, segment):
    gaps = np.array([g for g, _ in data], dtype=float)
    services = np.array([s for _, s in data], dtype=float)
    arrivals = offset + np.cumsum(gaps)
    res = q.fifo_queue(
        arrivals, services, initial_wait=initial_wait, block_size=block_size, segment=segment
    )
    ref = plain_lindley(arrivals, services, initial_wait)
    scale = max(float(services.mean()) if services.size else 0.0, initial_wait)
    # waits below the float resolution of the time axis (ulp of the largest arrival time)
    # are rounding, whatever the service scale: hypothesis found 0 vs 9.6e-268 s next to 1 s
    resolution = 4 * np.finfo(float).eps * max(float(arrivals.max()) if arrivals.size else 0, 1)
    np.testing.assert_allclose(res.waits, ref, rtol=1e-9, atol=1e-9 * scale + resolution)
    assert (res.waits >= 0.0).all()
    # departures are nondecreasing up to rounding of the (different) summation order
    assert (np.diff(res.departures) >= -1e-12 * max(scale, 1.0) - 1e-15 * offset).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_fifo_equals_simpy_resource(seed):
    rng = np.random.default_rng(seed)
    n = 4000
    dist = q.Lognormal(mean=0.9, cov=2.0)  # rho 0.9, long busy periods
    arrivals, services = poisson_mg1(rng, 1.0, dist, n)
    arrivals[100:110] = arrivals[100]  # simultaneous arrivals are served in array order
    res = q.fifo_queue(arrivals, services)
    sim_waits, sim_departures = simpy_fifo(arrivals, services)
    floor = float(services.mean())
    assert q.max_relative_difference(res.waits, sim_waits, floor=floor) <= 1e-9
    assert q.max_relative_difference(res.departures, sim_departures, floor=floor) <= 1e-9
    np.testing.assert_allclose(res.waits, plain_lindley(arrivals, services), atol=1e-9 * floor)


def test_fifo_large_block_boundaries_match_reference():
    rng = np.random.default_rng(5)
    n = (1 << 16) * 3 + 12345  # several full blocks plus a partial one
    arrivals, services = poisson_mg1(rng, 1.0, q.HyperExponential2(0.95, 3.0), n)
    waits = q.fifo_waits(arrivals, services)
    ref = q.lindley_reference(arrivals, services)
    assert q.max_relative_difference(waits, ref, floor=0.95) <= 1e-9
    assert waits.max() > 50.0  # long busy periods cross many block boundaries


def test_fifo_batches_chain_through_backlog():
    rng = np.random.default_rng(8)
    arrivals, services = poisson_mg1(rng, 0.9, q.Exponential(1.0), 5000)
    whole = q.fifo_queue(arrivals, services)
    first = q.fifo_queue(arrivals[:2000], services[:2000])
    second = q.fifo_queue(
        arrivals[2000:], services[2000:], initial_wait=first.backlog_at(arrivals[2000])
    )
    np.testing.assert_allclose(
        np.concatenate([first.waits, second.waits]), whole.waits, rtol=1e-12, atol=1e-12
    )


def test_fifo_small_cases_by_hand():
    res = q.fifo_queue([0.0, 1.0, 1.5, 10.0], [2.0, 2.0, 1.0, 1.0])
    np.testing.assert_allclose(res.waits, [0.0, 1.0, 2.5, 0.0])
    np.testing.assert_allclose(res.departures, [2.0, 4.0, 5.0, 11.0])
    np.testing.assert_allclose(res.sojourns, [2.0, 3.0, 3.5, 1.0])
    assert q.fifo_waits([], []).size == 0
    np.testing.assert_allclose(q.fifo_waits([3.0], [1.0], initial_wait=0.5), [0.5])
    np.testing.assert_allclose(q.fifo_departures([0.0, 0.0], [1.0, 1.0]), [1.0, 2.0])


@pytest.mark.parametrize(
    ("arrivals", "services", "kwargs", "path"),
    [
        ([0.0, 2.0, 1.0], [1.0, 1.0, 1.0], {}, "arrivals[2]"),
        ([0.0, 1.0], [1.0], {}, "services"),
        ([0.0, 1.0, 2.0], [1.0, -0.5, 1.0], {}, "services[1]"),
        ([0.0, 1.0, 2.0], [1.0, math.nan, 1.0], {}, "services[1]"),
        ([0.0, math.inf], [1.0, 1.0], {}, "arrivals[1]"),
        ([math.nan, 1.0], [1.0, 1.0], {}, "arrivals[0]"),
        ([0.0, 1.0], [1.0, math.inf], {}, "services[1]"),
        ([0.0, 1.0], [1.0, 1.0], {"initial_wait": -1.0}, "initial_wait"),
        ([[0.0, 1.0]], [[1.0, 1.0]], {}, "arrivals"),
        (["a", "b"], [1.0, 1.0], {}, "arrivals"),
    ],
)
def test_fifo_rejects_bad_input_naming_it(arrivals, services, kwargs, path):
    with pytest.raises(ScenarioError) as err:
        q.fifo_waits(arrivals, services, **kwargs)
    assert path in [p.path for p in err.value.problems]
    assert all(p.allowed for p in err.value.problems)


@pytest.mark.parametrize(("make", "path"), [
    (lambda v: q.Lognormal(mean=1.0, cov=v), "lognormal.cov"),
    (lambda v: q.HyperExponential2(mean=1.0, cov=v), "hyperexponential.cov"),
    (lambda v: q.Pareto(alpha=v, mean=1.0), "pareto.alpha"),
])
def test_shape_parameters_are_bounded_where_float64_would_overflow(make, path):
    """Just above the documented bound (1e3) a shape parameter is a field error; at the bound
    the distribution's moments are finite and its draws are finite and positive (at 1e308 the
    variance overflowed into an OverflowError / an infinite sigma, found by fuzzing)."""
    for bad in (1e3 * (1 + 1e-9), 1e308):
        with pytest.raises(ScenarioError) as err:
            make(bad)
        assert [p.path for p in err.value.problems] == [path]
        assert "1000" in err.value.problems[0].allowed
    d = make(1e3)
    assert math.isfinite(d.variance) and d.variance > 0
    x = d.sample(np.random.default_rng(0), 10_000)
    assert np.all(np.isfinite(x)) and np.all(x >= 0)


def test_fifo_unsorted_deep_in_a_large_input_is_found():
    arrivals = np.arange(300_000, dtype=float)
    arrivals[250_001] = 5.0
    with pytest.raises(ScenarioError) as err:
        q.fifo_waits(arrivals, np.ones_like(arrivals))
    assert err.value.problems[0].path == "arrivals[250001]"
    assert err.value.problems[0].value == 5.0


# ------------------------------------------------------------------------------------------
# FIFO engine vs queueing theory
# ------------------------------------------------------------------------------------------

THEORY_CASES = {
    # name: (arrival rate 1/s, service distribution); rho 0.5-0.7 so that runs converge fast
    "M/M/1": (0.7, q.Exponential(1.0)),
    "M/D/1": (0.7, q.Deterministic(1.0)),
    "M/G/1 lognormal cov 2": (0.5, q.Lognormal(1.0, 2.0)),
    "M/E4/1": (0.7, q.Erlang(1.0, 4)),
}


def _theory(name: str, lam: float, dist: q.ServiceDistribution) -> float:
    if name == "M/M/1":
        return q.mm1_mean_wait(lam, 1.0 / dist.mean)
    if name == "M/D/1":
        return q.md1_mean_wait(lam, dist.mean)
    return q.mg1_mean_wait(lam, dist.mean, dist.second_moment)


@pytest.mark.parametrize("name", list(THEORY_CASES))
def test_mean_wait_matches_theory(name):
    lam, dist = THEORY_CASES[name]
    theory = _theory(name, lam, dist)
    means, ses = [], []
    for seed in SEEDS:
        arrivals, services = poisson_mg1(np.random.default_rng(seed), lam, dist, 400_000)
        rep = q.analyze_queue(
            arrivals,
            services,
            warmup_fraction=0.1,
            n_batches=20,
            service_distribution=dist,
            arrival_rate=lam,
        )
        assert rep.stable and not rep.variance_infinite
        assert math.isfinite(rep.mean_wait_se) and rep.mean_wait_se > 0.0
        # each seed within 4 SE (t with 19 df: P(|t| > 4) < 0.1%) ...
        assert abs(rep.mean_wait - theory) <= 4.0 * rep.mean_wait_se, (seed, rep.to_dict())
        means.append(rep.mean_wait)
        ses.append(rep.mean_wait_se)
    # ... and the independent seeds pooled within 3 SE of the pooled mean.
    pooled = float(np.mean(means))
    pooled_se = math.sqrt(sum(s * s for s in ses)) / len(ses)
    assert abs(pooled - theory) <= 3.0 * pooled_se, (name, pooled, theory, pooled_se)


def test_mm1_report_converged_and_percentiles_match_theory():
    lam, mu = 0.7, 1.0
    arrivals, services = poisson_mg1(np.random.default_rng(3), lam, q.Exponential(1 / mu), 400_000)
    rep = q.analyze_queue(arrivals, services)
    assert rep.converged and rep.status == "converged" and rep.warnings == ()
    assert rep.tail_verdict == "finite"
    rho = lam / mu
    assert abs(rep.rho - rho) <= 0.01
    # M/M/1 waits: P(W > x) = rho exp(-(mu - lam) x); p95 at x = log(rho / 0.05) / (mu - lam).
    p95 = math.log(rho / 0.05) / (mu - lam)
    assert abs(rep.p95_wait - p95) / p95 < 0.05
    assert rep.p50_wait == pytest.approx(math.log(rho / 0.5) / (mu - lam), rel=0.05)
    d = rep.to_dict()
    assert d["converged"] is True and d["mean_wait_s"] == rep.mean_wait
    assert d["mean_wait_is"] == "steady-state estimate"


def test_littles_law():
    lam = 0.7
    arrivals, services = poisson_mg1(np.random.default_rng(4), lam, q.Exponential(1.0), 300_000)
    res = q.fifo_queue(arrivals, services)
    # Over the whole busy horizon the two sides are the same integral: equal up to rounding.
    whole = q.littles_law(res.arrivals, res.departures)
    assert whole.relative_gap <= 1e-9
    # On an inner window they differ only by customers straddling the edges: far less than
    # the statistical uncertainty of W itself.
    t0, t1 = float(arrivals[30_000]), float(arrivals[-30_000])
    inner = q.littles_law(res.arrivals, res.departures, t0, t1)
    inside = (arrivals >= t0) & (arrivals <= t1)
    se_w = q.batch_means(res.sojourns[inside], 20).standard_error
    assert abs(inner.number_in_system - inner.rate_times_sojourn) <= 3.0 * inner.arrival_rate * se_w
    # ... and L agrees with M/M/1 theory rho / (1 - rho) within 3 standard errors.
    rho = lam * 1.0
    theory_l = rho / (1.0 - rho)
    se_l = inner.number_in_system * math.sqrt(
        (se_w / inner.mean_sojourn) ** 2 + 1.0 / inner.customers
    )
    assert abs(inner.number_in_system - theory_l) <= 3.0 * se_l
    # Number waiting in queue: service starts instead of departures, L_q = lambda W_q.
    lq = q.littles_law(res.arrivals, res.service_starts)
    assert lq.mean_sojourn == pytest.approx(float(res.waits.mean()), rel=1e-12)
    assert lq.relative_gap <= 1e-9


def test_time_average_number_by_hand():
    # one customer on [0, 2), one on [1, 4): integral over [0, 4] is 2 + 3 = 5
    assert q.time_average_number([0.0, 1.0], [2.0, 4.0], 0.0, 4.0) == pytest.approx(5.0 / 4.0)
    assert q.time_average_number([0.0, 1.0], [2.0, 4.0], 1.0, 2.0) == pytest.approx(2.0)
    with pytest.raises(ScenarioError, match="t_end"):
        q.time_average_number([0.0], [1.0], 2.0, 1.0)


# ------------------------------------------------------------------------------------------
# Analytic formulas
# ------------------------------------------------------------------------------------------


def test_formulas_agree_and_diverge_where_they_should():
    assert q.mm1_mean_wait(0.5, 1.0) == pytest.approx(1.0)
    assert q.mg1_mean_wait(0.5, 1.0, 2.0) == pytest.approx(q.mm1_mean_wait(0.5, 1.0))
    assert q.md1_mean_wait(0.5, 1.0) == pytest.approx(0.5)
    assert q.md1_mean_wait(0.5, 1.0) == pytest.approx(q.mm1_mean_wait(0.5, 1.0) / 2.0)
    assert q.mm1_mean_wait(1.0, 1.0) == math.inf
    assert q.md1_mean_wait(2.0, 1.0) == math.inf
    assert q.mg1_mean_wait(0.1, 1.0, q.Pareto(1.8, 1.0).second_moment) == math.inf
    assert q.mg1_mean_wait(0.0, 1.0, math.inf) == 0.0
    assert q.utilization(0.5, 1.5) == pytest.approx(0.75)
    with pytest.raises(ScenarioError, match="second_moment_s"):
        q.mg1_mean_wait(0.5, 1.0, 0.5)
    with pytest.raises(ScenarioError, match="mu"):
        q.mm1_mean_wait(0.5, 0.0)
    with pytest.raises(ScenarioError, match="lam"):
        q.md1_mean_wait(-1.0, 1.0)


# ------------------------------------------------------------------------------------------
# Service-time distributions
# ------------------------------------------------------------------------------------------

MOMENT_CASES = [
    q.Deterministic(2.0),
    q.Exponential(1.5),
    q.Erlang(1.0, 4),
    q.HyperExponential2(1.0, 3.0),
    q.Lognormal(1.0, 1.0),
    q.Lognormal(1.0, 2.0),
    q.Pareto(2.5, 1.0),
    q.Pareto(4.5, 1.0),
    q.Empirical.from_samples([0.5, 1.0, 1.0, 4.0]),
    q.Empirical.from_histogram([0.0, 1.0, 2.0, 5.0], [3.0, 1.0, 1.0]),
]


@pytest.mark.parametrize("dist", MOMENT_CASES, ids=lambda d: repr(d)[:40])
def test_sample_moments_match_analytic(dist):
    n = 1_000_000
    x = dist.sample(np.random.default_rng(17), n)
    assert x.shape == (n,) and (x >= 0.0).all()
    var = dist.variance
    assert math.isfinite(var)
    assert dist.second_moment == pytest.approx(var + dist.mean**2)
    assert dist.cov == pytest.approx(math.sqrt(var) / dist.mean)
    # mean: standard error from the analytic variance
    se_mean = math.sqrt(var / n)
    assert abs(x.mean() - dist.mean) <= 4.0 * se_mean + 1e-12 * dist.mean
    # variance: standard error sqrt((m4 - var^2) / n) needs a finite fourth moment; for the
    # Pareto with alpha = 2.5 it is infinite, so only its mean is checked.
    if dist.tail_index > 4.0:
        dev2 = (x - x.mean()) ** 2
        se_var = float(dev2.std()) / math.sqrt(n)
        assert abs(dev2.mean() - var) <= 4.0 * se_var + 1e-12 * var


@pytest.mark.parametrize(
    ("dist", "frozen"),
    [
        (q.Exponential(1.5), stats.expon(scale=1.5)),
        (q.Erlang(2.0, 4), stats.gamma(4, scale=0.5)),
        (
            q.Lognormal(1.0, 2.0),
            stats.lognorm(s=math.sqrt(math.log(5.0)), scale=math.exp(-0.5 * math.log(5.0))),
        ),
        (q.Pareto(1.8, 1.0), stats.pareto(b=1.8, scale=0.8 / 1.8)),
        (q.Pareto(2.5, 3.0), stats.pareto(b=2.5, scale=3.0 * 1.5 / 2.5)),
    ],
    ids=["exponential", "erlang", "lognormal", "pareto1.8", "pareto2.5"],
)
def test_samples_follow_the_distribution(dist, frozen):
    # Kolmogorov-Smirnov against SciPy's independent implementation (false alarm 1e-3).
    x = dist.sample(np.random.default_rng(99), 20_000)
    assert stats.kstest(x, frozen.cdf).pvalue > 1e-3
    assert frozen.mean() == pytest.approx(dist.mean)


def test_pareto_type_i_and_heavy_tail_moments():
    p = q.Pareto(1.8, 2.0)
    assert p.scale == pytest.approx(2.0 * 0.8 / 1.8)
    assert p.variance == math.inf and p.second_moment == math.inf and p.scv == math.inf
    assert not p.variance_finite and p.tail_index == 1.8
    assert q.Pareto(2.0, 1.0).variance == math.inf
    p25 = q.Pareto(2.5, 1.0)
    assert math.isfinite(p25.variance) and p25.variance_finite
    x = p.sample(np.random.default_rng(1), 200_000)
    assert x.min() >= p.scale  # Type I: support starts at x_m
    # median of Type I Pareto: x_m 2^(1/alpha); SE of a sample median is
    # sqrt(p(1-p)/n) / f(median) with f the density.
    med = p.scale * 2.0 ** (1.0 / p.alpha)
    dens = p.alpha * p.scale**p.alpha / med ** (p.alpha + 1.0)
    se = math.sqrt(0.25 / x.size) / dens
    assert abs(float(np.median(x)) - med) <= 4.0 * se


def test_hyperexponential_balanced_means():
    h = q.HyperExponential2(2.0, 3.0)
    m1, m2 = h.branch_means
    assert h.p * m1 == pytest.approx(1.0) and (1 - h.p) * m2 == pytest.approx(1.0)
    assert h.scv == pytest.approx(9.0)
    assert q.HyperExponential2(1.0, 1.0).p == pytest.approx(0.5)


def test_lognormal_from_log_params():
    sigma = 1.5
    d = q.Lognormal.from_log_params(0.0, sigma)
    assert d.sigma == pytest.approx(sigma) and d.mu == pytest.approx(0.0, abs=1e-12)
    assert d.cov == pytest.approx(math.sqrt(math.exp(sigma**2) - 1.0))


def test_lognormal_from_log_params_takes_a_small_sigma_and_erlang_one_phase():
    """Sigma 0.25 is a cov of 0.254: allowed (the bound is sigma > 0); an Erlang of one phase
    is the exponential of its mean (variance mean^2)."""
    d = q.Lognormal.from_log_params(math.log(2.0), 0.25)
    assert d.mean == pytest.approx(2.0 * math.exp(0.25**2 / 2))
    assert q.Erlang(3.0, 1).variance == pytest.approx(9.0)


def test_empirical_moments_exact():
    e = q.Empirical.from_samples([1.0, 3.0])
    assert e.mean == 2.0 and e.variance == 1.0 and e.cov == 0.5
    h = q.Empirical.from_histogram([0.0, 2.0], [5])
    assert h.mean == 1.0 and h.variance == pytest.approx(4.0 / 12.0)
    x = h.sample(np.random.default_rng(0), 10_000)
    assert x.min() >= 0.0 and x.max() < 2.0


def test_an_empty_bin_of_a_histogram_is_allowed_and_its_arrays_are_read_only():
    """A bin with no count is part of a histogram (one count in all is enough): uniform on
    [2, 4) has mean 3 and variance 4/12. Its arrays cannot be changed after the moments
    were computed from them."""
    h = q.Empirical.from_histogram([0.0, 2.0, 4.0], [0, 1])
    assert h.mean == 3.0 and h.variance == pytest.approx(4.0 / 12.0)
    with pytest.raises(ValueError, match="read-only"):
        h.edges[0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        h.counts[0] = 1.0


def test_factory_and_spec_round_trip():
    for dist in MOMENT_CASES:
        again = q.service_from_spec(dist.to_dict())
        assert type(again) is type(dist)
        assert again.mean == pytest.approx(dist.mean) and again.variance == pytest.approx(
            dist.variance
        )
    assert q.service_distribution("Pareto", alpha=1.8, mean=1.0) == q.Pareto(1.8, 1.0)
    assert q.service_distribution("erlang", mean=1.0, k=4) == q.Erlang(1.0, 4)
    assert q.service_distribution("empirical", samples=[1.0, 2.0]).mean == 1.5


@pytest.mark.parametrize(
    ("build", "path", "words"),
    [
        (lambda: q.Exponential(-1.0), "exponential.mean", "> 0"),
        (lambda: q.service_distribution("lognormal", mean=-2.0, cov=1.0), "lognormal.mean", ">"),
        (lambda: q.Pareto(1.0, 1.0), "pareto.alpha", "> 1"),
        (lambda: q.service_distribution("pareto", alpha=0.5, mean=1.0), "pareto.alpha", "> 1"),
        (lambda: q.service_distribution("weibull", mean=1.0), "name", "lognormal"),
        (lambda: q.service_distribution("erlang", mean=1.0), "erlang.k", "missing"),
        (lambda: q.service_distribution("erlang", mean=1.0, k=2.5), "erlang.k", "integer"),
        (
            lambda: q.service_distribution("exponential", mean=1.0, rate=2.0),
            "exponential.rate",
            "not a parameter",
        ),
        (lambda: q.HyperExponential2(1.0, 0.5), "hyperexponential.cov", ">= 1"),
        (lambda: q.Deterministic(math.nan), "deterministic.mean", "finite"),
        (lambda: q.Deterministic(True), "deterministic.mean", "real number"),
        (lambda: q.Empirical.from_samples([1.0, -1.0]), "empirical.samples[1]", ">= 0"),
        (lambda: q.Empirical(), "empirical", "exactly one"),
        (lambda: q.Empirical.from_histogram([0.0, 1.0], [1.0, 2.0]), "empirical.edges", "edges"),
        (
            lambda: q.service_from_spec(
                {"name": "pareto", "alpha": 0.9, "mean": 1.0}, "devices.hbm.service"
            ),
            "devices.hbm.service.alpha",
            "> 1",
        ),
        (lambda: q.service_from_spec({"alpha": 2.0}, "hbm.service"), "hbm.service.name", "missing"),
        (
            lambda: q.service_from_spec({"name": "gamma"}, "hbm.service"),
            "hbm.service.name",
            "pareto",
        ),
        (lambda: q.PoissonArrivals(0.0), "poisson.rate", "> 0"),
        (
            lambda: q.arrival_process(
                "mmpp2", rate_on=-1.0, rate_off=1.0, mean_on=1.0, mean_off=1.0
            ),
            "mmpp2.rate_on",
            ">= 0",
        ),
        (
            lambda: q.arrival_process(
                "mmpp2", rate_on=1.0, rate_off=1.0, mean_on=0.0, mean_off=1.0
            ),
            "mmpp2.mean_on",
            "> 0",
        ),
        (lambda: q.arrival_from_spec({"name": "hawkes", "rate": 1.0}), "arrivals.name", "poisson"),
    ],
)
def test_bad_parameters_raise_scenario_error_naming_them(build, path, words):
    with pytest.raises(ScenarioError) as err:
        build()
    problems = {p.path: p for p in err.value.problems}
    assert path in problems, err.value
    text = str(problems[path])
    assert words in text, text
    assert problems[path].allowed


def test_non_finite_parameters_are_refused():
    """NaN and infinite rates and means are refused, naming the parameter (an infinite mean
    service time is no distribution; an infinite rate no process)."""
    for make, path in ((lambda: q.PoissonArrivals(math.nan), "poisson.rate"),
                       (lambda: q.PoissonArrivals(math.inf), "poisson.rate"),
                       (lambda: q.DeterministicArrivals(-math.inf), "deterministic.rate"),
                       (lambda: q.service_distribution("exponential", mean=math.inf),
                        "exponential.mean")):
        with pytest.raises(ScenarioError, match=rf"{re.escape(path)}: must be finite"):
            make()


def test_sample_requires_a_generator():
    with pytest.raises(TypeError, match="Generator"):
        q.Exponential(1.0).sample(np.random.RandomState(0), 3)
    with pytest.raises(TypeError, match="Generator"):
        q.PoissonArrivals(1.0).sample(42, 3)


# ------------------------------------------------------------------------------------------
# Arrival processes
# ------------------------------------------------------------------------------------------


def test_mmpp2_long_run_rate_and_burstiness():
    m = q.MMPP2Arrivals(rate_on=20.0, rate_off=1.0, mean_on=0.5, mean_off=2.0)
    assert m.rate == pytest.approx((0.5 * 20.0 + 2.0 * 1.0) / 2.5)
    assert m.rate == pytest.approx(q.MMPP2Arrivals.from_switching_rates(20.0, 1.0, 2.0, 0.5).rate)
    idc = m.index_of_dispersion
    assert idc > 1.0
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        horizon = 40_000.0
        times = m.sample_until(rng, horizon)
        assert (np.diff(times) >= 0).all() and times.min() >= 0.0 and times.max() < horizon
        # counts of an MMPP have variance ~ IDC * mean over windows much longer than a cycle
        expected = m.rate * horizon
        assert abs(times.size - expected) <= 4.0 * math.sqrt(idc * expected)
        # window counts: variance / mean estimates the index of dispersion
        counts = np.histogram(times, bins=200, range=(0.0, horizon))[0]
        ratio = counts.var(ddof=1) / counts.mean()
        assert abs(ratio / idc - 1.0) <= 4.0 * math.sqrt(2.0 / 199) + 0.02
    n = 200_000
    times = m.sample(np.random.default_rng(5), n)
    assert times.size == n and (np.diff(times) >= 0).all()
    assert abs(n / times[-1] - m.rate) <= 4.0 * m.rate * math.sqrt(idc / n)


def test_mmpp2_index_of_dispersion_against_the_cookbook_closed_form():
    """Fischer & Meier-Hellstern, "The MMPP cookbook" (1993), eq. for the MMPP(2)'s
    asymptotic index of dispersion with switching rates r1 (on -> off), r2 (off -> on):
    1 + 2 (l1 - l2)^2 r1 r2 / ((r1 + r2)^2 (l1 r2 + l2 r1)); for an interrupted Poisson
    process (l2 = 0) that is 1 + 2 l1 r1 / (r1 + r2)^2."""
    for l1, l2, mean_on, mean_off in ((20.0, 1.0, 0.5, 2.0), (3.0, 7.0, 0.25, 4.0),
                                      (5.0, 0.0, 1.0, 3.0)):
        r1, r2 = 1.0 / mean_on, 1.0 / mean_off
        cookbook = 1.0 + 2.0 * (l1 - l2) ** 2 * r1 * r2 / ((r1 + r2) ** 2 * (l1 * r2 + l2 * r1))
        m = q.MMPP2Arrivals(rate_on=l1, rate_off=l2, mean_on=mean_on, mean_off=mean_off)
        assert m.index_of_dispersion == pytest.approx(cookbook, rel=1e-12)
    ipp = q.MMPP2Arrivals(rate_on=5.0, rate_off=0.0, mean_on=1.0, mean_off=3.0)
    assert ipp.index_of_dispersion == pytest.approx(1.0 + 2.0 * 5.0 * 1.0 / (1.0 + 1 / 3) ** 2)


def test_poisson_and_deterministic_arrivals():
    rng = np.random.default_rng(2)
    p = q.PoissonArrivals(3.0)
    t = p.sample(rng, 300_000, start=10.0)
    gaps = np.diff(np.concatenate([[10.0], t]))
    assert gaps.min() >= 0.0
    assert abs(gaps.mean() - 1 / 3.0) <= 4.0 * (1 / 3.0) / math.sqrt(gaps.size)
    u = p.sample_until(rng, 1000.0, start=0.0)
    assert abs(u.size - 3000.0) <= 4.0 * math.sqrt(3000.0)
    d = q.DeterministicArrivals(4.0)
    np.testing.assert_allclose(d.sample(rng, 3), [0.25, 0.5, 0.75])
    np.testing.assert_allclose(d.sample_until(rng, 1.0), [0.25, 0.5, 0.75])
    assert q.arrival_from_spec(p.to_dict()) == p
    assert q.arrival_from_spec(d.to_dict()) == d


def test_superpose_keeps_stream_ids_and_ties_deterministic():
    kernel = np.array([0.0, 1.0, 2.0, 2.0])
    dma = np.array([0.5, 2.0, 3.0])
    merged = q.superpose([kernel, dma])
    np.testing.assert_array_equal(merged.times, [0.0, 0.5, 1.0, 2.0, 2.0, 2.0, 3.0])
    np.testing.assert_array_equal(merged.stream_ids, [0, 1, 0, 0, 0, 1, 1])
    back = merged.split(merged.times)
    np.testing.assert_array_equal(back[0], kernel)
    np.testing.assert_array_equal(back[1], dma)
    with pytest.raises(ScenarioError, match=r"streams\[1\]"):
        q.superpose([kernel, dma[::-1]])
    # superposed independent Poisson streams are Poisson with the summed rate
    rng = np.random.default_rng(12)
    streams = [q.PoissonArrivals(r).sample_until(rng, 20_000.0) for r in (0.2, 0.3)]
    streams.append(q.MMPP2Arrivals(2.0, 0.0, 0.1, 0.9).sample_until(rng, 20_000.0))
    merged = q.superpose(streams)
    assert (np.diff(merged.times) >= 0).all()
    assert np.bincount(merged.stream_ids).tolist() == [s.size for s in streams]
    waits = q.fifo_waits(merged.times, np.full(merged.times.size, 0.5))
    assert [w.size for w in merged.split(waits)] == [s.size for s in streams]
    none = q.superpose([])
    assert none.n_streams == 0 and none.split([]) == []


class _ScriptedGenerator(np.random.Generator):
    """A Generator whose draws the test chooses: every exponential visit is ``visit`` long,
    a Poisson count is 1 where its mean is positive (else 0), a uniform is 0.5."""

    def __init__(self, visit: float):
        super().__init__(np.random.PCG64(0))
        self.visit = visit

    def standard_exponential(self, size=None, **kw):
        return np.full(size, self.visit)

    def poisson(self, lam=1.0, size=None):
        return (np.asarray(lam) > 0).astype(np.int64)

    def random(self, size=None, **kw):
        return np.full(size, 0.5)


def test_mmpp2_states_alternate_across_drawing_rounds():
    """A path drawn in several rounds (each round's visits fall short of ``t_end``) still
    alternates on, off, on, ...: with every visit 0.25 s long, one arrival in the middle of
    each on visit and none off, the arrivals are at 0.125 + 0.5 k, k = 0 .. 199, written out
    here from the alternation alone."""
    m = q.MMPP2Arrivals(rate_on=3.0, rate_off=0.0, mean_on=1.0, mean_off=1.0,
                        initial_state="on")
    times = m.sample_until(_ScriptedGenerator(0.25), 100.0)  # 108 visits cover 27 s, ...
    np.testing.assert_allclose(times, 0.125 + 0.5 * np.arange(200))


def test_mmpp2_stationary_start_is_on_with_probability_p_on():
    """Windows of 1 ms from a stationary start: an on start (probability p_on = 0.9) sees
    ~10 arrivals at 10^4/s, an off start almost never switches on in time (mean off 1 s), so
    the share of windows with an arrival is 0.9 (+ ~1e-4) within its binomial error."""
    m = q.MMPP2Arrivals(rate_on=1e4, rate_off=0.0, mean_on=9.0, mean_off=1.0)
    rng = np.random.default_rng(17)
    n = 4000
    seen = sum(m.sample_until(rng, 1e-3).size > 0 for _ in range(n))
    assert abs(seen / n - 0.9) <= 4.0 * math.sqrt(0.9 * 0.1 / n)


def test_mmpp2_edges_of_its_parameters():
    """Rates below 1/s and a source that emits only when off are valid; both rates 0 is not;
    an empty window has no arrivals; a few arrivals from a slowly switching source."""
    m = q.MMPP2Arrivals.from_switching_rates(2.0, 0.0, 0.5, 0.25)  # rates < 1/s
    assert (m.mean_on, m.mean_off) == (2.0, 4.0)
    off_only = q.MMPP2Arrivals(rate_on=0.0, rate_off=2.0, mean_on=1.0, mean_off=3.0)
    assert off_only.rate == pytest.approx(2.0 * 3.0 / 4.0)
    t = off_only.sample_until(np.random.default_rng(8), 20_000.0)
    assert abs(t.size - 30_000.0) <= 4.0 * math.sqrt(off_only.index_of_dispersion * 30_000.0)
    with pytest.raises(ScenarioError, match=r"mmpp2\.rate_on") as exc:
        q.MMPP2Arrivals(rate_on=0.0, rate_off=0.0, mean_on=1.0, mean_off=1.0)
    assert "both 0" in str(exc.value)
    assert m.sample_until(np.random.default_rng(1), 5.0, start=5.0).size == 0
    slow = q.MMPP2Arrivals(rate_on=1.0, rate_off=0.0, mean_on=100.0, mean_off=100.0)
    few = slow.sample(np.random.default_rng(2), 5, start=3.0)
    assert few.size == 5 and (np.diff(few) >= 0).all() and few[0] >= 3.0


# ------------------------------------------------------------------------------------------
# Heavy tails, stability and the analysis report
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.5, 2.5])
def test_hill_interval_covers_true_alpha(alpha):
    n, trials, level = 100_000, 40, 0.95
    covered = 0
    estimates = []
    for seed in range(trials):
        x = q.Pareto(alpha, 1.0).sample(np.random.default_rng(1000 + seed), n)
        h = q.hill_estimate(x, confidence=level)
        assert h.k == q.default_hill_k(n) == round(math.sqrt(n))
        covered += h.ci_low <= alpha <= h.ci_high
        estimates.append(h.alpha)
    # coverage is Binomial(trials, 0.95); fail only below its 0.1% quantile
    assert covered >= stats.binom.ppf(1e-3, trials, level)
    se = alpha / math.sqrt(q.default_hill_k(n)) / math.sqrt(trials)
    assert abs(float(np.mean(estimates)) - alpha) <= 4.0 * se + alpha / q.default_hill_k(n)


def test_hill_verdicts_and_input_checks():
    rng = np.random.default_rng(4)
    assert q.hill_estimate(q.Pareto(1.5, 1.0).sample(rng, 1_000_000)).variance_verdict == (
        "infinite"
    )
    assert q.hill_estimate(q.Pareto(3.5, 1.0).sample(rng, 1_000_000)).variance_verdict == "finite"
    assert q.hill_estimate(np.ones(100)).alpha == math.inf
    with pytest.raises(ScenarioError, match="k"):
        q.hill_estimate(np.arange(1.0, 11.0), k=10)
    with pytest.raises(ScenarioError, match=r"samples\[1\]"):
        q.hill_estimate([1.0, -1.0, 2.0])


def test_hill_estimate_on_three_values_by_hand():
    """The smallest admissible input, 3 positive values, k = 1: 1 / alpha = ln(4 / 2), and the
    95% interval alpha (1 -+ 1.96 / sqrt(1)) has its lower end clipped at 0."""
    h = q.hill_estimate([1.0, 2.0, 4.0], k=1)
    assert h.alpha == pytest.approx(1.0 / math.log(2.0))
    assert h.threshold == 2.0 and h.n == 3
    assert h.ci_low == 0.0
    assert h.ci_high == pytest.approx(h.alpha * (1.0 + 1.959964), rel=1e-6)
    with pytest.raises(ScenarioError, match="confidence"):
        q.hill_estimate([1.0, 2.0, 4.0], k=1, confidence=1.0)
    with pytest.raises(ScenarioError, match="3 positive"):
        q.hill_estimate([0.0, 2.0, 4.0], k=1)


def test_batch_means_by_hand_and_their_interval():
    """Batch means 1, 2, 4, 3 (two values each): mean 2.5, standard error
    sqrt(5/3) / 2, lag-1 autocorrelation (-1.5 x -0.5 + -0.5 x 1.5 + 1.5 x 0.5) / 5 = 0.15
    in any unit (the same series in microseconds), and the 95% interval uses Student's t
    with 3 degrees of freedom, 3.182446 (table value)."""
    x = np.array([0.5, 1.5, 2.0, 2.0, 3.0, 5.0, 2.5, 3.5])
    for scale in (1.0, 1e-6):
        bm = q.batch_means(x * scale, n_batches=4)
        assert bm.mean == pytest.approx(2.5 * scale)
        assert bm.standard_error == pytest.approx(math.sqrt(5.0 / 3.0) / 2.0 * scale)
        assert bm.lag1_autocorrelation == pytest.approx(0.15)
    lo, hi = q.batch_means(x, n_batches=4).confidence_interval(0.95)
    half = 3.182446 * math.sqrt(5.0 / 3.0) / 2.0
    assert (lo, hi) == (pytest.approx(2.5 - half, rel=1e-6), pytest.approx(2.5 + half, rel=1e-6))


def test_running_mean_check_of_a_constant_series():
    """No change between the halves and no spread: z-score, relative change and relative
    standard error are all 0 (not 0 / 0); a constant 0 series likewise."""
    for value in (2.0, 0.0):
        c = q.running_mean_check(np.full(40, value), n_batches=4)
        assert (c.z_score, c.relative_change, c.relative_standard_error) == (0.0, 0.0, 0.0)
        assert c.settled


def test_infinite_variance_warning_names_the_hill_estimate():
    """Without a given distribution the verdict comes from the Hill estimate, and the
    warning says so with its numbers."""
    rng = np.random.default_rng(9)
    services = q.Pareto(1.3, 0.2).sample(rng, 200_000)
    arrivals = q.PoissonArrivals(1.0).sample(rng, 200_000)
    a = q.analyze_queue(arrivals, services)
    assert a.variance_infinite and a.hill is not None
    text = " ".join(a.warnings)
    assert "infinite service variance (Hill tail index" in text


def test_a_given_distribution_is_checked_against_the_sample_tail():
    """With the services' distribution given, a finite-variance one is taken at its word
    unless the sample's Hill interval reaches 2: exponential samples declared exponential
    leave no warning, Pareto alpha 1.3 samples declared exponential warn that the sample's
    tail looks heavier (the analysis keeps the declared, finite verdict); fewer than 50
    positive services give no Hill estimate and no such warning."""
    rng = np.random.default_rng(5)
    declared = q.Exponential(1.0)
    arrivals = q.PoissonArrivals(0.5).sample(rng, 200_000)
    honest = q.analyze_queue(arrivals, declared.sample(rng, 200_000),
                             service_distribution=declared, arrival_rate=0.5)
    assert honest.hill is not None and honest.hill.variance_verdict == "finite"
    assert honest.warnings == () and honest.converged
    heavy = q.analyze_queue(arrivals, q.Pareto(1.3, 0.2).sample(rng, 200_000),
                            service_distribution=declared, arrival_rate=0.5)
    assert not heavy.variance_infinite
    assert [w for w in heavy.warnings if "looks heavier than the given exponential" in w]
    few = q.analyze_queue(arrivals[:49], declared.sample(rng, 49), n_batches=4,
                          service_distribution=declared, arrival_rate=0.5)
    assert few.hill is None and not any("looks heavier" in w for w in few.warnings)


def test_pareto_alpha_18_flagged_infinite_variance_not_converged():
    lam, dist = 0.5, q.Pareto(1.8, 1.0)
    arrivals, services = poisson_mg1(np.random.default_rng(21), lam, dist, 400_000)
    known = q.analyze_queue(arrivals, services, service_distribution=dist)
    assert known.stable
    assert known.variance_infinite and known.status == "infinite_variance"
    assert not known.converged and known.mean_wait_se == math.inf
    assert math.isfinite(known.mean_wait)  # a sample mean of this run, explicitly marked
    assert any("infinite service variance" in w for w in known.warnings)
    d = known.to_dict()
    assert d["converged"] is False and "not converged" in d["mean_wait_is"]
    assert q.mg1_mean_wait(lam, dist.mean, dist.second_moment) == math.inf
    # Without the distribution, the Hill interval alone must refuse convergence.
    blind = q.analyze_queue(arrivals, services)
    assert not blind.converged
    assert blind.status in ("infinite_variance", "uncertain_tail")
    assert blind.hill is not None and blind.hill.ci_low < 2.0
    assert any("variance" in w for w in blind.warnings)


def test_pareto_alpha_25_not_flagged_infinite_variance():
    lam, dist = 0.5, q.Pareto(2.5, 1.0)
    arrivals, services = poisson_mg1(np.random.default_rng(22), lam, dist, 400_000)
    for rep in (
        q.analyze_queue(arrivals, services, service_distribution=dist),
        q.analyze_queue(arrivals, services),
    ):
        assert not rep.variance_infinite
        assert rep.tail_verdict == "finite"
        assert not any("infinite service variance" in w for w in rep.warnings)
        assert math.isfinite(rep.mean_wait_se)


@pytest.mark.parametrize("rho", [1.0, 1.2])
def test_unstable_queue_flagged(rho):
    arrivals, services = poisson_mg1(np.random.default_rng(6), rho, q.Exponential(1.0), 100_000)
    rep = q.analyze_queue(
        arrivals, services, arrival_rate=rho, service_distribution=q.Exponential(1.0)
    )
    assert not rep.stable and rep.status == "unstable" and not rep.converged
    assert rep.mean_wait_se == math.inf
    assert any("unstable" in w for w in rep.warnings)
    estimated = q.analyze_queue(arrivals, services)  # rho estimated from the run
    assert not estimated.converged
    if rho > 1.0:
        assert estimated.status == "unstable"


def test_warmup_removes_initial_transient():
    lam, dist = 0.5, q.Exponential(1.0)
    arrivals, services = poisson_mg1(np.random.default_rng(31), lam, dist, 200_000)
    backlog = 2000.0  # s of work at time 0: drains after ~4000 s, i.e. ~2000 customers
    theory = q.mm1_mean_wait(lam, 1.0)
    warm = q.analyze_queue(arrivals, services, initial_wait=backlog, warmup_fraction=0.1)
    assert warm.n_warmup == 20_000
    assert abs(warm.mean_wait - theory) <= 4.0 * warm.mean_wait_se
    cold = q.analyze_queue(arrivals, services, initial_wait=backlog, warmup_fraction=0.0)
    assert cold.n_warmup == 0 and cold.mean_wait > theory + 10.0 * warm.mean_wait_se
    assert not cold.converged and any("not settled" in w for w in cold.warnings)


def test_running_mean_check_detects_drift_and_accepts_noise():
    rng = np.random.default_rng(9)
    noise = rng.exponential(1.0, 100_000)
    ok = q.running_mean_check(noise)
    assert ok.settled and ok.relative_change < 0.05
    drift = noise + np.linspace(0.0, 1.0, noise.size)
    bad = q.running_mean_check(drift)
    assert not bad.settled and bad.z_score > 3.0
    bm = q.batch_means(noise, 25)
    lo, hi = bm.confidence_interval(0.99)
    assert lo <= 1.0 <= hi and bm.batch_size == 4000


def test_analyze_queue_input_checks():
    with pytest.raises(ScenarioError, match="warmup_fraction"):
        q.analyze_queue([0.0, 1.0], [1.0, 1.0], warmup_fraction=1.0)
    with pytest.raises(ScenarioError, match="n_batches"):
        q.analyze_queue(np.arange(100.0), np.ones(100), n_batches=5)
    with pytest.raises(ScenarioError, match="too few"):
        q.analyze_queue(np.arange(10.0), np.ones(10))


# ------------------------------------------------------------------------------------------
# Determinism and module hygiene
# ------------------------------------------------------------------------------------------

DRAWERS = [
    *(d.sample for d in MOMENT_CASES),
    q.HyperExponential2(1.0, 2.0).sample,
    q.Pareto(1.8, 1.0).sample,
    lambda rng, n: q.PoissonArrivals(2.0).sample(rng, n),
    lambda rng, n: q.MMPP2Arrivals(5.0, 0.5, 1.0, 3.0).sample(rng, n),
    lambda rng, n: q.MMPP2Arrivals(5.0, 0.5, 1.0, 3.0).sample_until(rng, n / 2.0),
]


@pytest.mark.parametrize("draw", DRAWERS)
def test_same_seed_same_samples_and_no_global_rng(draw):
    before = np.random.get_state()[1].copy()  # noqa: NPY002 - checking it is left alone
    a = draw(np.random.default_rng(123), 5000)
    b = draw(np.random.default_rng(123), 5000)
    np.testing.assert_array_equal(a, b)
    assert np.array_equal(np.random.get_state()[1], before)  # noqa: NPY002


def test_module_imports_only_numpy_scipy_and_errors():
    roots = set()
    for path in sorted(Path(q.__file__).parent.glob("*.py")):  # the package's modules
        for node in ast.walk(ast.parse(path.read_text())):  # lazy imports included
            if isinstance(node, ast.Import):
                roots |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.module.startswith(q.__name__):
                errors = node.module in ("twin.kernel.errors", "twin.kernel.lazy")
                roots.add(node.module if errors else node.module.split(".")[0])
    stdlib = {"__future__", "math", "numbers", "collections", "dataclasses", "functools", "typing"}
    # twin.kernel.lazy: the package imports its submodules on first use of a name
    assert roots - stdlib == {"numpy", "scipy", "twin.kernel.errors", "twin.kernel.lazy"}


@pytest.mark.parametrize("k,seed", [(10, 8), (600, 50), (500, 191)])
def test_hill_estimate_of_a_shuffled_sequence_by_hand(k, seed):
    """1 .. 1000 in random order: the threshold is the (k + 1)-th largest value, 1000 - k,
    and 1 / alpha = mean(ln(1001 - k) .. ln 1000) - ln(1000 - k), whatever the order of the
    input. (The orders of seeds 50 and 191 are ones where a partial sort around the wrong
    index leaves another value just below the top k.)"""
    x = np.random.default_rng(seed).permutation(np.arange(1.0, 1001.0))
    h = q.hill_estimate(x, k=k)
    assert h.threshold == 1000.0 - k
    inv = sum(math.log(v) for v in range(1001 - k, 1001)) / k - math.log(1000 - k)
    assert h.alpha == pytest.approx(1.0 / inv, rel=1e-12)


@pytest.mark.parametrize("n", [3, 5, 11])
def test_default_hill_k_of_a_short_sample_uses_all_but_the_threshold(n):
    """At most n - 1 order statistics above the threshold (the (k + 1)-th largest): below
    HILL_MIN_K + 1 samples the default k is n - 1; from there on max(HILL_MIN_K,
    round(sqrt(n)))."""
    assert q.default_hill_k(n) == min(n - 1, 10)
    assert q.default_hill_k(400) == 20 and q.default_hill_k(50) == 10


def test_running_mean_check_applies_a_threshold_below_one():
    """Batch means 1, 3 | 2, 4 (one value each): halves 2 and 3, standard error of the
    difference sqrt(2/2 + 2/2) = sqrt 2, z = 1 / sqrt 2 = 0.707: settled at the default
    threshold 3 (and relative change 0.4 within rtol 0.5), not at a threshold of 0.5, which
    is accepted; a threshold of 0 is not."""
    x = np.array([1.0, 3.0, 2.0, 4.0])
    c = q.running_mean_check(x, n_batches=4, rtol=0.5)
    assert c.z_score == pytest.approx(1.0 / math.sqrt(2.0))
    assert c.settled
    assert not q.running_mean_check(x, n_batches=4, rtol=0.5, z_threshold=0.5).settled
    with pytest.raises(ScenarioError, match="z_threshold"):
        q.running_mean_check(x, n_batches=4, z_threshold=0.0)


def test_analyze_queue_drops_a_tenth_and_needs_two_customers_per_batch():
    """By default the first 10% of customers are warm-up: 40 customers leave 36, too few for
    20 batches of 2 (the message says how many are left); 11 customers leave 10 (int(1.1) =
    1 dropped), enough for 4 batches of 2 (the oldest left over, as batch means drop it)."""
    with pytest.raises(ScenarioError, match="40 customers leave 36 after warm-up"):
        q.analyze_queue(np.arange(40.0), np.full(40, 0.5))
    r = q.analyze_queue(np.arange(11.0), np.full(11, 0.5), n_batches=4)
    assert r.n_customers == 11 and r.n_warmup == 1


def test_an_unknown_service_distribution_lists_the_kinds_with_their_units():
    with pytest.raises(ScenarioError) as err:
        q.service_distribution("gamma", mean=1.0)
    assert "empirical(samples) or empirical(edges, counts) (times in s)" in str(err.value)


def test_an_unknown_arrival_process_lists_the_kinds_with_their_units():
    with pytest.raises(ScenarioError) as err:
        q.arrival_process("hawkes", rate=1.0)
    assert "mmpp2(rate_on, rate_off, mean_on, mean_off) (rates 1/s, s)" in str(err.value)
