"""The iteration-time distribution of a run and whether its mean can be trusted.

``iteration_report(times, random, infinite_variance)`` gives the summary keys
``iteration_time_p50_s``, ``iteration_time_p99_s``, ``iteration_time_max_s``,
``iteration_time_cov``, ``iteration_time_converged`` and their companions. The verdict uses
the kernel's output statistics (``twin.kernel.queueing.statistics``):

* the first iteration is a warm-up (empty pipelines and queues, a cold die) and is left out
  of the convergence check, not of the percentiles;
* a run whose inputs have an infinite-variance source (``infinite_variance``: e.g. Pareto
  service or a per-block Pareto multiplier with alpha <= 2) is never converged: its sample
  mean has no standard error and, for M/G/1 waits, no finite limit;
* with at least ``MIN_CHECK`` iterations after the warm-up, the running mean must settle
  (:func:`running_mean_check`: the halves agree within ``z <= 3`` and the batch-means relative
  standard error is <= 5%; a deterministic run has no sampling noise, so there only a drift of
  more than 5% between the halves counts: heating, a controller) and, for a random run from
  ``MIN_HILL`` iterations on with more than ``HILL_MIN_K`` of them above the median, the Hill
  estimate of the excess over the median must not put the tail index at or below 2;
* a random run (``random``) with fewer iterations cannot be judged and is not converged; a
  deterministic one needs no statistics: its mean is exact for the iterations simulated.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from twin.kernel.queueing.statistics import (
    HILL_MIN_K,
    batch_means,
    hill_estimate,
    running_mean_check,
)

MIN_CHECK = 8       # iterations after the warm-up needed to judge the running mean
MIN_HILL = 50       # iterations after the warm-up needed for a Hill estimate
_RTOL = 0.05
_DRIFT_FLOOR = 1e-3  # relative half-to-half change too small to call a drift (0.1%)
NOT_CONVERGED = "sample mean of this finite run only (not converged)"


def _batches(n: int) -> int:
    """Even number of batches for ``n`` values: 20 when there are enough, at least 4."""
    return max(4, min(20, (n // 2) // 2 * 2))


def _running_means(x: np.ndarray) -> list[float]:
    """Running mean after 1, 2, 4, ... values and after all of them."""
    cum = np.cumsum(x) / np.arange(1, x.size + 1)
    idx = sorted({*(2 ** j - 1 for j in range(int(math.log2(x.size)) + 1)), x.size - 1})
    return [float(cum[i]) for i in idx]


def iteration_report(times: np.ndarray, random: bool,
                     infinite_variance: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Distribution and convergence keys of the iteration times (s) of one run.

    Args:
        times: time of every completed iteration, in order (s).
        random: whether anything random drives the run (jitter, random faults, sampled HBM
            contention); a deterministic run's mean is exact.
        infinite_variance: descriptions of the run's infinite-variance sources.
    """
    t = np.asarray(times, dtype=float)
    n = int(t.size)
    out: dict[str, Any] = {
        "iteration_time_p50_s": float(np.percentile(t, 50)) if n else math.nan,
        "iteration_time_p99_s": float(np.percentile(t, 99)) if n else math.nan,
        "iteration_time_max_s": float(t.max()) if n else math.nan,
        # iteration times are positive: only a count under 2 leaves the spread undefined
        "iteration_time_cov": float(t.std(ddof=1) / t.mean()) if n > 1 else math.nan,
    }
    warnings: list[str] = []
    steady = t[1:] if n > 1 else t  # the first iteration is a warm-up
    se: float = math.nan
    tail: float | None = None
    if n == 0:
        warnings.append("no iteration completed")
    for why in infinite_variance:
        warnings.append(f"{why}: the iteration-time mean has no standard error (infinite "
                        "variance), the value is a sample of this run")
    if steady.size >= MIN_CHECK:
        check = running_mean_check(steady, n_batches=_batches(steady.size), rtol=_RTOL)
        se = batch_means(steady, _batches(steady.size)).standard_error
        # a deterministic run has no sampling noise: only a drift of the mean counts. A random
        # run must be precise (relative standard error <= _RTOL) and show no significant drift;
        # a drift below _DRIFT_FLOOR of the mean is not one, however small the batch spread
        # (a run whose draws barely move it would otherwise fail on a z-score of ~0 / ~0)
        negligible = abs(check.relative_change) <= _DRIFT_FLOOR
        settled = ((check.settled or (negligible and check.relative_standard_error <= _RTOL))
                   if random else check.relative_change <= _RTOL)
        if not settled:
            warnings.append(
                f"the running mean of the iteration time does not settle (first half "
                f"{check.first_half_mean:.6g} s, second half {check.second_half_mean:.6g} s, "
                f"relative standard error {check.relative_standard_error:.3g})")
        if random and steady.size >= MIN_HILL:
            excess = steady - float(np.median(steady))
            above = excess[excess > 0]
            # the estimate's default k needs more values above the median than HILL_MIN_K
            # (a random run whose draws barely move the time can have none: nothing to judge)
            if above.size > HILL_MIN_K:
                hill = hill_estimate(above)
                tail = hill.alpha
                if hill.variance_verdict == "infinite":
                    warnings.append(f"iteration-time tail index {hill.alpha:.3g} "
                                    f"(95% interval {hill.ci_low:.3g}-{hill.ci_high:.3g}) "
                                    "<= 2: infinite variance")
    elif random and n:
        warnings.append(f"only {steady.size} iteration(s) after the first: too few to judge "
                        f"whether the mean settles (run at least {MIN_CHECK + 1})")
    converged = not warnings
    if not random and converged:
        mean_is = "exact (deterministic run)"
        se = 0.0
    elif converged:
        mean_is = "steady-state estimate"
    else:
        mean_is = NOT_CONVERGED
        if infinite_variance:
            se = math.inf
    out.update({
        "iteration_time_converged": converged,
        "iteration_time_mean_is": mean_is,
        "iteration_time_se_s": se,
        "iteration_time_running_mean_s": _running_means(t) if n else [],
        "iteration_time_tail_index": tail,
        "iteration_time_warnings": warnings,
    })
    return out
