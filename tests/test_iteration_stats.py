"""Iteration-time distribution and the convergence verdict (twin/iteration_stats.py).

References: hand-computed percentiles and coefficient of variation; series whose behaviour is
known by construction (constant, i.i.d. light-tailed noise, a drift, i.i.d. Pareto with
alpha 1.2 < 2); runs whose inputs are deterministic or have an infinite-variance tail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

import twin
from twin.iteration_stats import MIN_CHECK, iteration_report


def test_distribution_keys_by_hand():
    r = iteration_report(np.array([1.0, 2.0, 3.0, 4.0]), random=False)
    assert r["iteration_time_p50_s"] == 2.5
    assert r["iteration_time_p99_s"] == pytest.approx(3.97)  # 3 + 0.97 x (4 - 3), linear
    assert r["iteration_time_max_s"] == 4.0
    # sample standard deviation sqrt(((1.5^2 + 0.5^2) x 2) / 3) over the mean 2.5
    assert r["iteration_time_cov"] == pytest.approx(math.sqrt(5 / 3) / 2.5)
    assert r["iteration_time_running_mean_s"] == [1.0, 1.5, 2.5]  # after 1, 2 and 4


def test_deterministic_constant_run_is_exact():
    r = iteration_report(np.full(3, 0.2), random=False)
    assert r["iteration_time_converged"] and r["iteration_time_se_s"] == 0.0
    assert r["iteration_time_mean_is"].startswith("exact")
    assert r["iteration_time_cov"] < 1e-12 and not r["iteration_time_warnings"]


def test_light_tailed_noise_settles():
    rng = np.random.default_rng(7)
    t = 1.0 + 0.02 * rng.exponential(size=400)
    r = iteration_report(t, random=True)
    assert r["iteration_time_converged"], r["iteration_time_warnings"]
    assert r["iteration_time_mean_is"] == "steady-state estimate"
    # batch-means standard error vs the i.i.d. one: sd / sqrt(n) = 0.02 / 20 = 1e-3
    assert r["iteration_time_se_s"] == pytest.approx(1e-3, rel=0.5)
    assert r["iteration_time_tail_index"] > 2


def test_drift_does_not_settle():
    t = np.linspace(1.0, 2.0, 40)  # e.g. a die heating up: the mean depends on the run length
    for random in (False, True):
        r = iteration_report(t, random=random)
        assert not r["iteration_time_converged"]
        assert "does not settle" in r["iteration_time_warnings"][0]


def test_infinite_variance_series_is_flagged():
    """i.i.d. Pareto excess with alpha 1.2: the Hill interval lies below 2."""
    rng = np.random.default_rng(3)
    t = 1.0 + 0.01 * (rng.pareto(1.2, size=4000) + 1.0)
    r = iteration_report(t, random=True)
    assert not r["iteration_time_converged"]
    assert any("infinite variance" in w for w in r["iteration_time_warnings"])
    assert 0.8 < r["iteration_time_tail_index"] < 1.6


def test_known_infinite_variance_source_and_short_random_runs():
    r = iteration_report(np.full(20, 1.0), random=True, infinite_variance=["faults[0].tail"])
    assert not r["iteration_time_converged"] and r["iteration_time_se_s"] == math.inf
    short = iteration_report(np.ones(MIN_CHECK), random=True)  # MIN_CHECK - 1 after warm-up
    assert not short["iteration_time_converged"]
    assert "too few" in short["iteration_time_warnings"][0]


def test_heavy_tailed_hbm_fault_run_is_flagged(capsys):
    """A per-block Pareto alpha 1.5 memory multiplier (infinite variance): the run says its
    iteration-time mean is a sample, and `twin run` prints the warning."""
    from twin.cli import print_summary

    scen = twin.load_scenario("scenarios/fault_hbm.yaml",
                              ["workload.iterations=3", "trace.enabled=false"])
    s = twin.run(scen).summary
    assert s["iteration_time_converged"] is False
    assert any("faults[0].tail" in w for w in s["iteration_time_warnings"])
    print_summary(s)
    assert "warning: iteration_time_s is a sample mean" in capsys.readouterr().out


def test_quickstart_is_deterministic_and_converged():
    s = twin.run(twin.load_scenario("scenarios/quickstart.yaml",
                                    ["trace.enabled=false"])).summary
    assert s["iteration_time_converged"] is True
    assert s["iteration_time_p50_s"] == pytest.approx(s["iteration_time_s"], rel=1e-12)
    assert s["iteration_time_cov"] < 1e-12


def test_negligible_drift_of_a_random_run_is_not_a_drift():
    """A random run whose draws barely move it (a stochastic memory model with nothing beside
    the blocks): the halves differ by 1e-5 of the mean with almost no batch spread, so the
    z-score is huge but the drift is far below anything the mean is quoted to; it settles.
    A drift of 2% with the same spread does not."""
    n = 21
    tiny = 0.0722 * (1 + 1e-5 * (np.arange(n) >= n // 2))
    assert iteration_report(tiny, random=True)["iteration_time_converged"]
    drift = 0.0722 * (1 + 0.02 * (np.arange(n) >= n // 2))
    assert not iteration_report(drift, random=True)["iteration_time_converged"]


def test_random_run_without_spread_needs_no_tail_estimate():
    """A random run whose draws never move the iteration time (or move only two iterations
    above the median) has too few slow iterations for a Hill estimate: no tail index and no
    error (the report raised 'has 0 positive values' at the end of such a run)."""
    flat = iteration_report(np.full(60, 1.0), random=True)
    assert flat["iteration_time_converged"] and flat["iteration_time_tail_index"] is None
    two = iteration_report(np.r_[np.full(58, 1.0), 1.1, 1.2], random=True)
    assert two["iteration_time_tail_index"] is None


def test_running_means_at_powers_of_two_and_the_end():
    """After 1, 2, 4 and all 5 iterations of 1 .. 5 s: 1, 1.5, 2.5 and 3 s."""
    r = iteration_report(np.arange(1.0, 6.0), random=False)
    assert r["iteration_time_running_mean_s"] == [1.0, 1.5, 2.5, 3.0]


@pytest.mark.parametrize("n", range(MIN_CHECK + 1, 70))
def test_standard_error_from_an_even_number_of_batches(n):
    """The standard error is the batch-means one over the iterations after the first, with an
    even number of batches: 20 when there are 2 or more iterations per batch, else the largest
    even number that leaves 2 per batch (at least 4); written out here with NumPy."""
    rng = np.random.default_rng(n)
    t = 1.0 + 0.01 * rng.standard_normal(n)
    steady = t[1:]
    nb = max(4, min(20, 2 * (steady.size // 4)))
    size = steady.size // nb
    means = steady[steady.size - size * nb:].reshape(nb, size).mean(axis=1)
    r = iteration_report(t, random=True)
    assert r["iteration_time_se_s"] == pytest.approx(means.std(ddof=1) / math.sqrt(nb))


@pytest.mark.parametrize("alpha,flagged", [(1.5, True), (2.0, True), (2.5, False)])
def test_a_fault_tail_is_named_when_its_variance_is_infinite(alpha, flagged):
    """A Pareto tail has a finite variance only for alpha > 2: the run names the fault's tail
    among its infinite-variance inputs at alpha 1.5 and 2, not at 2.5."""
    from twin.summary import infinite_variance_sources

    scen = twin.load_scenario("scenarios/fault_hbm.yaml", [
        f"faults.0.tail.alpha={alpha}", "trace.enabled=false"])
    got = infinite_variance_sources(scen, {})
    assert got == (["faults[0].tail has infinite variance"] if flagged else [])


@pytest.mark.parametrize("sets,expected", [
    ([], []),
    (["simulation.compute_jitter_cov=0.05"], ["simulation.compute_jitter_cov"]),
    (["memory.model=frfcfs"], ["memory.model frfcfs"]),
    (["simulation.compute_jitter_cov=0.001", "memory.model=queue"],
     ["simulation.compute_jitter_cov", "memory.model queue"]),
])
def test_what_makes_a_run_random_is_named(sets, expected):
    """Any compute jitter, however small, and any memory model but the roofline make the
    iteration times samples (the report then asks for a precise mean, not only no drift);
    the deterministic quickstart has no random input."""
    from twin.summary import random_sources

    scen = twin.load_scenario("scenarios/quickstart.yaml", ["trace.enabled=false", *sets])
    assert random_sources(scen) == expected


def test_the_documented_iteration_counts_of_the_verdict():
    """README: the running mean is judged from 8 iterations after the first (warm-up) one,
    and a random run's Hill tail index from 50, when more than 10 of them lie above the
    median. The numbers are written out here, not read from the module."""
    rng = np.random.default_rng(11)
    noise = 1.0 + 0.001 * rng.random(60)
    for steady, judged in ((7, False), (8, True)):
        r = iteration_report(noise[:steady + 1], random=True)
        too_few = any("too few" in w for w in r["iteration_time_warnings"])
        assert too_few is not judged, (steady, r["iteration_time_warnings"])
    for steady, has_tail in ((49, False), (50, True)):
        r = iteration_report(noise[:steady + 1], random=True)
        assert (r["iteration_time_tail_index"] is not None) is has_tail, steady
    # a deterministic run is judged from the same count: a drift is found in 8, not in 7
    drift = np.linspace(1.0, 2.0, 9)
    assert not iteration_report(drift, random=False)["iteration_time_converged"]
    assert iteration_report(drift[:8], random=False)["iteration_time_converged"]


def test_many_heavy_tailed_faults_are_named_in_one_line():
    """Thirty HBM degradations with a Pareto 1.5 tail (infinite variance) and one with a
    finite-variance tail: one warning naming the thirty by index runs, not thirty lines."""
    from twin.summary import index_ranges, infinite_variance_sources

    tail = {"name": "pareto", "alpha": 1.5, "mean": 2.0}
    faults = [{"kind": "hbm_degradation", "device": 0, "time_s": 0.01 * i, "duration_s": 0.005,
               "tail": tail if i != 3 else {**tail, "alpha": 2.5}} for i in range(31)]
    with open("scenarios/quickstart.yaml") as fh:
        base = yaml.safe_load(fh)
    scen = twin.load_scenario({**base,
                               "faults": faults, "trace": {"enabled": False}})
    assert infinite_variance_sources(scen, {}) == [
        "faults[0-2, 4-30].tail have infinite variance"]
    assert index_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert index_ranges([4]) == "4"
