"""Output statistics and heavy-tail diagnostics: batch means, the running-mean convergence
check, the Hill tail-index estimate and the one-call report :func:`analyze_queue`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.queueing._validate import (
    _RATE_ALLOWED,
    _array,
    _first_bad,
    _integer,
    _raise_if,
    _real,
    _short,
)
from twin.kernel.queueing.distributions import ServiceDistribution
from twin.kernel.queueing.engine import fifo_queue


@dataclass(frozen=True)
class BatchMeans:
    """Batch-means estimate of a steady-state mean from one correlated run.

    Attributes:
        mean: mean of the batch means (units of the data).
        standard_error: standard deviation of the batch means / sqrt(n_batches).
        n_batches: number of batches.
        batch_size: observations per batch (the earliest ``n % n_batches`` are dropped).
        lag1_autocorrelation: lag-1 autocorrelation of the batch means; well above 0 means
            the batches are too short and ``standard_error`` is too small.
    """

    mean: float
    standard_error: float
    n_batches: int
    batch_size: int
    lag1_autocorrelation: float

    def confidence_interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """Student-t interval for the steady-state mean at ``confidence``."""
        from scipy import stats  # lazy: SciPy statistics only where a run needs them

        t = float(stats.t.ppf(0.5 + confidence / 2.0, self.n_batches - 1))
        return self.mean - t * self.standard_error, self.mean + t * self.standard_error


def _batch_matrix(x: np.ndarray, n_batches: int, path: str) -> np.ndarray:
    size = x.size // n_batches
    if size < 1:
        raise ScenarioError(
            Problem(
                path,
                f"has {x.size} values, fewer than n_batches = {n_batches}",
                x.size,
                "at least one value per batch",
            )
        )
    return x[x.size - size * n_batches :].reshape(n_batches, size).mean(axis=1)


def batch_means(values: ArrayLike, n_batches: int = 20) -> BatchMeans:
    """Mean and standard error of ``values`` by the method of non-overlapping batch means.

    Args:
        values: one run's observations in time order (e.g. post-warm-up waits, s).
        n_batches: number of batches (>= 2); 20-30 is the usual choice.
    """
    x = _array(values, "values", allowed="finite numbers")
    p: list[Problem] = []
    b = _integer(p, "n_batches", n_batches, minimum=2, allowed="an integer >= 2")
    _raise_if(p)
    means = _batch_matrix(x, b, "values")
    sd = float(means.std(ddof=1))
    dev = means - means.mean()
    den = float(np.dot(dev, dev))
    lag1 = float(np.dot(dev[:-1], dev[1:]) / den) if den > 0 else 0.0
    return BatchMeans(float(means.mean()), sd / math.sqrt(b), b, x.size // b, lag1)


@dataclass(frozen=True)
class ConvergenceCheck:
    """Whether a running mean has settled (see :func:`running_mean_check`).

    Attributes:
        mean: mean over the batches (units of the data).
        first_half_mean: mean of the first half of the batches.
        second_half_mean: mean of the second half.
        relative_change: ``|second - first| / |mean|`` (dimensionless).
        z_score: ``|second - first|`` over its standard error from the batch spread in each
            half (Welch); large means a drift, e.g. an unstable queue or a warm-up too short.
        relative_standard_error: batch-means standard error / ``|mean|``.
        settled: ``z_score <= z_threshold`` and ``relative_standard_error <= rtol``.
    """

    mean: float
    first_half_mean: float
    second_half_mean: float
    relative_change: float
    z_score: float
    relative_standard_error: float
    settled: bool


def _ratio(num: float, den: float) -> float:
    if den != 0.0:
        return abs(num) / abs(den)
    return 0.0 if num == 0.0 else math.inf


def running_mean_check(
    values: ArrayLike, n_batches: int = 20, rtol: float = 0.05, z_threshold: float = 3.0
) -> ConvergenceCheck:
    """Check that the running mean of ``values`` has settled.

    The run is cut into ``n_batches`` batches; the mean of the first half of the batches is
    compared with the second half (relative change, and a z-score against the within-half
    batch spread), and the relative standard error must be at most ``rtol``. A heavy-tailed
    or unstable run typically fails one of the two; a Hill estimate (:func:`hill_estimate`)
    covers the case where rare huge values have simply not happened yet.

    Args:
        values: observations in time order.
        n_batches: even number of batches, >= 4.
        rtol: largest acceptable relative standard error (dimensionless).
        z_threshold: largest acceptable z-score of the half-to-half change.
    """
    x = _array(values, "values", allowed="finite numbers")
    p: list[Problem] = []
    b = _integer(p, "n_batches", n_batches, minimum=4, allowed="an even integer >= 4")
    if b % 2:
        p.append(Problem("n_batches", "must be even", n_batches, "an even integer >= 4"))
    tol = _real(p, "rtol", rtol, gt=0.0, allowed="a relative tolerance > 0")
    zt = _real(p, "z_threshold", z_threshold, gt=0.0, allowed="a threshold > 0")
    _raise_if(p)
    means = _batch_matrix(x, b, "values")
    h = b // 2
    first, second = means[:h], means[h:]
    m1, m2, m = float(first.mean()), float(second.mean()), float(means.mean())
    se_diff = math.sqrt(float(first.var(ddof=1)) / h + float(second.var(ddof=1)) / h)
    z = _ratio(m2 - m1, se_diff)
    rel_se = _ratio(float(means.std(ddof=1)) / math.sqrt(b), m)
    rel_change = _ratio(m2 - m1, m)
    return ConvergenceCheck(m, m1, m2, rel_change, z, rel_se, bool(z <= zt and rel_se <= tol))


@dataclass(frozen=True)
class HillEstimate:
    """Hill estimate of a tail index with its asymptotic confidence interval.

    Attributes:
        alpha: estimated tail index ``alpha-hat`` (dimensionless; ``inf`` if the top values
            are all equal).
        ci_low: ``alpha-hat * (1 - z / sqrt(k))`` (clipped at 0).
        ci_high: ``alpha-hat * (1 + z / sqrt(k))``.
        k: number of upper order statistics used.
        n: number of positive samples.
        threshold: the (k+1)-th largest sample, where the tail starts (units of the data).
        confidence: confidence level of the interval.
    """

    alpha: float
    ci_low: float
    ci_high: float
    k: int
    n: int
    threshold: float
    confidence: float

    @property
    def variance_verdict(self) -> str:
        """``"infinite"`` if the interval lies at or below 2, ``"finite"`` if above, else
        ``"uncertain"``."""
        if self.ci_high <= 2.0:
            return "infinite"
        if self.ci_low > 2.0:
            return "finite"
        return "uncertain"


#: the fewest upper order statistics :func:`default_hill_k` uses
HILL_MIN_K = 10


def default_hill_k(n: int) -> int:
    """Default number of order statistics for :func:`hill_estimate`: ``round(sqrt(n))``,
    at least 10 and at most ``n - 1``.

    ``sqrt(n)`` keeps the estimate in the far tail (top 0.3% of 1e5 samples), where a
    lognormal's local slope is steep and a power law's is exact, at the price of a wider
    interval than a fixed 2-5% fraction (half-width ``1.96 / sqrt(k)`` relative: 11% at 1e5
    samples, 3.5% at 1e7).
    """
    return int(min(n - 1, max(HILL_MIN_K, round(math.sqrt(n)))))


def hill_estimate(
    samples: ArrayLike, k: int | None = None, confidence: float = 0.95
) -> HillEstimate:
    """Hill estimator of the tail index ``alpha`` of ``P[X > x] ~ x^-alpha``.

    ``1 / alpha-hat = (1/k) sum_{i<=k} log(X_(i) / X_(k+1))`` over the ``k`` largest of the
    positive samples; the interval is the asymptotic normal one,
    ``alpha-hat * (1 +- z / sqrt(k))``. Exact for a Pareto Type I tail above ``X_(k+1)``.
    Zero samples carry no tail information and are ignored.

    Args:
        samples: observations (e.g. service times, s), finite, >= 0.
        k: upper order statistics to use, ``1 <= k < n``; default :func:`default_hill_k`.
        confidence: level of the interval, in (0, 1).
    """
    x = _array(samples, "samples", allowed="finite values >= 0")
    bad = ~(np.isfinite(x) & (x >= 0.0))
    if bad.any():
        i = _first_bad(bad)
        raise ScenarioError(
            Problem(f"samples[{i}]", "must be finite and >= 0", float(x[i]), "finite values >= 0")
        )
    pos = x[x > 0.0]
    n = int(pos.size)
    p: list[Problem] = []
    conf = _real(p, "confidence", confidence, gt=0.0, allowed="a level in (0, 1)")
    if not p and conf >= 1.0:
        p.append(Problem("confidence", "must be < 1", confidence, "a level in (0, 1)"))
    if n < 3:
        p.append(
            Problem(
                "samples",
                f"has {n} positive values",
                n,
                "at least 3 positive values (a useful estimate needs thousands)",
            )
        )
    _raise_if(p)
    if k is None:
        k = default_hill_k(n)
    kk = _integer(p, "k", k, minimum=1, allowed=f"an integer in [1, {n - 1}]")
    if not p and kk > n - 1:
        p.append(
            Problem(
                "k",
                f"must be < the number of positive samples ({n})",
                k,
                f"an integer in [1, {n - 1}]",
            )
        )
    _raise_if(p)
    top = np.partition(pos, n - kk - 1)[n - kk - 1 :]
    threshold = float(top[0])
    h = float(np.mean(np.log(top[1:]))) - math.log(threshold)
    alpha = math.inf if h <= 0.0 else 1.0 / h
    from scipy import stats  # lazy: SciPy statistics only where a run needs them

    z = float(stats.norm.ppf(0.5 + conf / 2.0))
    half = z / math.sqrt(kk)
    return HillEstimate(
        alpha, max(0.0, alpha * (1.0 - half)), alpha * (1.0 + half), kk, n, threshold, conf
    )


@dataclass(frozen=True)
class QueueAnalysis:
    """Steady-state report of one FIFO queue run (:func:`analyze_queue`). Times in seconds.

    ``mean_wait`` is always the sample mean of the post-warm-up waits *of this finite run*.
    It estimates a steady-state mean only when ``converged`` is True. Otherwise ``status``
    says why not:

    * ``"unstable"``: ``rho >= 1``; waits grow without bound, no steady state exists.
    * ``"infinite_variance"``: the service variance is infinite (a given distribution says so,
      or the Hill interval lies at or below 2); by Pollaczek-Khinchine the mean wait has no
      finite limit. ``mean_wait_se`` is then ``inf``. Wait percentiles still have limits when
      ``rho < 1`` and are reported.
    * ``"uncertain_tail"``: the Hill interval straddles 2; infinite variance is not ruled out.
    * ``"not_settled"``: the running mean drifts, or its relative standard error exceeds
      ``rtol``; run longer.

    Attributes:
        n_customers: customers simulated.
        n_warmup: leading customers discarded as warm-up.
        mean_wait: sample mean wait in queue after warm-up (s) (see above).
        mean_wait_se: batch-means standard error of ``mean_wait`` (s); ``inf`` when the
            limit is known to be infinite.
        p50_wait, p95_wait, p99_wait: wait percentiles after warm-up (s).
        mean_sojourn: sample mean time in system after warm-up (s).
        arrival_rate: arrival rate (1/s), given or ``(n - 1) / (A_last - A_first)``.
        mean_service: mean service time (s), from the distribution if given, else sample.
        rho: utilization ``arrival_rate * mean_service``.
        stable: ``rho < 1``.
        variance_infinite: the service variance is judged infinite.
        tail_verdict: ``"finite"``, ``"infinite"`` or ``"uncertain"``.
        hill: Hill estimate of the service tail index (``None`` if too few positive samples).
        batches: the batch-means estimate behind ``mean_wait_se``.
        convergence: the running-mean check.
        status: see above.
        converged: ``status == "converged"``.
        warnings: human-readable reasons, empty when converged.
    """

    n_customers: int
    n_warmup: int
    mean_wait: float
    mean_wait_se: float
    p50_wait: float
    p95_wait: float
    p99_wait: float
    mean_sojourn: float
    arrival_rate: float
    mean_service: float
    rho: float
    stable: bool
    variance_infinite: bool
    tail_verdict: str
    hill: HillEstimate | None
    batches: BatchMeans
    convergence: ConvergenceCheck
    status: str
    converged: bool
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Flat summary with units in the keys. Non-finite values stay ``math.inf``/``nan``
        (``json.dumps`` writes them as ``Infinity``/``NaN``)."""
        hill = self.hill
        return {
            "status": self.status,
            "converged": self.converged,
            "mean_wait_s": self.mean_wait,
            "mean_wait_is": (
                "steady-state estimate"
                if self.converged
                else "sample mean of this finite run only (not converged)"
            ),
            "mean_wait_se_s": self.mean_wait_se,
            "p50_wait_s": self.p50_wait,
            "p95_wait_s": self.p95_wait,
            "p99_wait_s": self.p99_wait,
            "mean_sojourn_s": self.mean_sojourn,
            "arrival_rate_per_s": self.arrival_rate,
            "mean_service_s": self.mean_service,
            "rho": self.rho,
            "stable": self.stable,
            "variance_infinite": self.variance_infinite,
            "tail_verdict": self.tail_verdict,
            "tail_index": None if hill is None else hill.alpha,
            "tail_index_ci": None if hill is None else [hill.ci_low, hill.ci_high],
            "tail_index_k": None if hill is None else hill.k,
            "relative_change": self.convergence.relative_change,
            "relative_standard_error": self.convergence.relative_standard_error,
            "n_customers": self.n_customers,
            "n_warmup": self.n_warmup,
            "n_batches": self.batches.n_batches,
            "warnings": list(self.warnings),
        }


def analyze_queue(
    arrivals: ArrayLike,
    services: ArrayLike,
    *,
    warmup_fraction: float = 0.1,
    n_batches: int = 20,
    service_distribution: ServiceDistribution | None = None,
    arrival_rate: float | None = None,
    hill_k: int | None = None,
    rtol: float = 0.05,
    initial_wait: float = 0.0,
) -> QueueAnalysis:
    """Run the FIFO engine and report steady-state wait statistics with honest diagnostics.

    Steps: waits by :func:`fifo_queue`; drop the first ``warmup_fraction`` of customers;
    mean, percentiles and batch-means standard error of the rest; utilization; a Hill
    estimate of the service tail; a running-mean check. The result is ``converged`` only if
    the queue is stable, the service variance is finite and the running mean has settled;
    every failed condition adds a warning. A finite ``mean_wait`` is then only a description
    of this run (see :class:`QueueAnalysis`).

    Args:
        arrivals: arrival times (s), sorted.
        services: service times (s), one per arrival.
        warmup_fraction: leading fraction of customers discarded, in [0, 1).
        n_batches: batches for the standard error and the running-mean check (even, >= 4).
        service_distribution: the distribution the services were drawn from, if known; its
            analytic mean and variance then override the sample's (a Pareto with
            ``alpha <= 2`` is flagged even if the run saw no huge value).
        arrival_rate: the true arrival rate (1/s), if known; else estimated from the run.
        hill_k: order statistics for the Hill estimate; default :func:`default_hill_k`.
        rtol: largest relative standard error accepted as converged.
        initial_wait: wait of the first customer (s).
    """
    p: list[Problem] = []
    wf = _real(p, "warmup_fraction", warmup_fraction, ge=0.0, allowed="a fraction in [0, 1)")
    if not p and wf >= 1.0:
        p.append(Problem("warmup_fraction", "must be < 1", warmup_fraction, "a fraction in [0, 1)"))
    if service_distribution is not None and not isinstance(
        service_distribution, ServiceDistribution
    ):
        p.append(
            Problem(
                "service_distribution",
                "must be a ServiceDistribution",
                _short(service_distribution),
                "e.g. service_distribution('pareto', alpha=1.8, mean=1.0)",
            )
        )
    nb = _integer(p, "n_batches", n_batches, minimum=4, allowed="an even integer >= 4")
    if nb % 2:
        p.append(Problem("n_batches", "must be even", n_batches, "an even integer >= 4"))
    lam_given = None
    if arrival_rate is not None:
        lam_given = _real(p, "arrival_rate", arrival_rate, gt=0.0, allowed=_RATE_ALLOWED)
    _raise_if(p)
    res = fifo_queue(arrivals, services, initial_wait=initial_wait)
    n = res.n
    warm = int(n * wf)
    waits = res.waits[warm:]
    if waits.size < 2 * nb:
        raise ScenarioError(
            Problem(
                "arrivals",
                f"{n} customers leave {waits.size} after warm-up, too few for {nb} batches",
                n,
                "at least 2 customers per batch after warm-up (thousands "
                "per batch for a useful estimate)",
            )
        )
    conv = running_mean_check(waits, n_batches=nb, rtol=rtol)
    bm = batch_means(waits, n_batches=nb)
    a, s = res.arrivals, res.services
    if lam_given is not None:
        lam = lam_given
    else:
        span = float(a[-1] - a[0])
        lam = (n - 1) / span if span > 0.0 else math.inf
    dist = service_distribution
    mean_s = dist.mean if dist is not None else float(s.mean())
    rho = lam * mean_s if mean_s > 0.0 else 0.0
    stable = rho < 1.0
    warnings: list[str] = []

    hill: HillEstimate | None = None
    n_pos = int(np.count_nonzero(s > 0.0))
    if n_pos >= 50:
        hill = hill_estimate(s, k=hill_k)
    if dist is not None:
        verdict = "finite" if dist.variance_finite else "infinite"
        if verdict == "finite" and hill is not None and hill.variance_verdict != "finite":
            warnings.append(
                f"the sample tail of the services looks heavier than the given {dist.name} "
                f"distribution: Hill tail index {hill.alpha:.3g} "
                f"[{hill.ci_low:.3g}, {hill.ci_high:.3g}] (k={hill.k}) reaches 2, so the mean "
                "wait converges slowly"
            )
    elif hill is not None:
        verdict = hill.variance_verdict
    else:
        verdict = "finite" if n_pos == 0 else "uncertain"

    if not stable:
        warnings.append(
            f"unstable queue: rho = {rho:.4g} >= 1, waits grow without bound and the mean wait "
            "has no finite limit; mean_wait is the sample mean of this finite run only"
        )
    if verdict == "infinite":
        why = (
            f"{dist.name} service with tail index {dist.tail_index:.3g} <= 2"
            if dist is not None
            else f"Hill tail index {hill.alpha:.3g} [{hill.ci_low:.3g}, {hill.ci_high:.3g}] "
            f"(k={hill.k}) is at or below 2"
            if hill is not None
            else ""
        )
        warnings.append(
            f"infinite service variance ({why}): E[S^2] = inf, so by Pollaczek-Khinchine the "
            "mean wait has no finite limit; mean_wait is the sample mean of this finite run "
            "only and will keep growing with longer runs (percentiles remain meaningful if "
            "rho < 1)"
        )
    elif verdict == "uncertain":
        detail = (
            f"Hill tail index {hill.alpha:.3g} [{hill.ci_low:.3g}, {hill.ci_high:.3g}] "
            f"(k={hill.k}) straddles 2"
            if hill is not None
            else f"only {n_pos} positive service times, too few for a tail-index estimate"
        )
        warnings.append(
            f"service variance possibly infinite: {detail}; the mean wait may have no finite "
            "limit; mean_wait is the sample mean of this finite run only"
        )
    if not conv.settled:
        warnings.append(
            f"running mean not settled: first/second half of the run differ by "
            f"{100 * conv.relative_change:.3g}% (z = {conv.z_score:.3g}), relative standard "
            f"error {100 * conv.relative_standard_error:.3g}% (target <= {100 * rtol:.3g}%); "
            "run longer or increase the warm-up"
        )
    if bm.lag1_autocorrelation > 0.5:
        warnings.append(
            f"batch means are correlated (lag-1 {bm.lag1_autocorrelation:.2f}): batches are "
            "too short and the standard error is underestimated; run longer"
        )

    if not stable:
        status = "unstable"
    elif verdict == "infinite":
        status = "infinite_variance"
    elif verdict == "uncertain":
        status = "uncertain_tail"
    elif not conv.settled:
        status = "not_settled"
    else:
        status = "converged"
    se = math.inf if status in ("unstable", "infinite_variance") else bm.standard_error
    p50, p95, p99 = (float(v) for v in np.percentile(waits, [50.0, 95.0, 99.0]))
    return QueueAnalysis(
        n_customers=n,
        n_warmup=warm,
        mean_wait=float(waits.mean()),
        mean_wait_se=se,
        p50_wait=p50,
        p95_wait=p95,
        p99_wait=p99,
        mean_sojourn=float(waits.mean() + s[warm:].mean()),
        arrival_rate=lam,
        mean_service=mean_s,
        rho=rho,
        stable=stable,
        variance_infinite=verdict == "infinite",
        tail_verdict=verdict,
        hill=hill,
        batches=bm,
        convergence=conv,
        status=status,
        converged=status == "converged",
        warnings=tuple(warnings),
    )
