"""Queueing theory: utilization, M/M/1, M/D/1 and M/G/1 (Pollaczek-Khinchine) mean waits,
time-average number in system and Little's law (times in s, rates in 1/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.queueing._validate import _TIMES_ALLOWED, _array, _raise_if, _real


def utilization(arrival_rate: float, mean_service: float) -> float:
    """Server utilization ``rho = arrival_rate * mean_service`` (dimensionless).

    Args:
        arrival_rate: mean arrival rate (1/s), >= 0.
        mean_service: mean service time (s), >= 0.
    """
    p: list[Problem] = []
    lam = _real(p, "arrival_rate", arrival_rate, ge=0.0, allowed="a rate >= 0 (1/s)")
    s = _real(p, "mean_service", mean_service, ge=0.0, allowed="a time >= 0 (s)")
    _raise_if(p)
    return lam * s


def mm1_mean_wait(lam: float, mu: float) -> float:
    """M/M/1 mean wait in queue (s): ``rho / (mu - lam)``; ``math.inf`` when ``rho >= 1``.

    Args:
        lam: arrival rate (1/s), >= 0.
        mu: service rate (1/s), > 0.
    """
    p: list[Problem] = []
    lam = _real(p, "lam", lam, ge=0.0, allowed="an arrival rate >= 0 (1/s)")
    mu = _real(p, "mu", mu, gt=0.0, allowed="a service rate > 0 (1/s)")
    _raise_if(p)
    if lam >= mu:
        return math.inf
    return (lam / mu) / (mu - lam)


def md1_mean_wait(lam: float, service: float) -> float:
    """M/D/1 mean wait in queue (s): ``rho * service / (2 (1 - rho))``; inf when rho >= 1.

    Args:
        lam: arrival rate (1/s), >= 0.
        service: the constant service time (s), > 0.
    """
    p: list[Problem] = []
    lam = _real(p, "lam", lam, ge=0.0, allowed="an arrival rate >= 0 (1/s)")
    service = _real(p, "service", service, gt=0.0, allowed="a service time > 0 (s)")
    _raise_if(p)
    return mg1_mean_wait(lam, service, service * service)


def mg1_mean_wait(lam: float, mean_s: float, second_moment_s: float) -> float:
    """M/G/1 mean wait in queue (s) by Pollaczek-Khinchine: ``lam E[S^2] / (2 (1 - rho))``.

    Returns ``math.inf`` when ``rho = lam * mean_s >= 1`` or when ``second_moment_s`` is
    infinite (e.g. Pareto service with ``alpha <= 2``) and ``lam > 0``.

    Args:
        lam: arrival rate (1/s), >= 0.
        mean_s: mean service time E[S] (s), > 0.
        second_moment_s: E[S^2] (s^2), >= mean_s^2, may be ``math.inf``.
    """
    p: list[Problem] = []
    lam = _real(p, "lam", lam, ge=0.0, allowed="an arrival rate >= 0 (1/s)")
    mean_s = _real(p, "mean_s", mean_s, gt=0.0, allowed="a mean service time > 0 (s)")
    m2 = _real(
        p,
        "second_moment_s",
        second_moment_s,
        ge=0.0,
        allow_inf=True,
        allowed="E[S^2] >= mean_s^2 (s^2), or inf",
    )
    _raise_if(p)
    if m2 < mean_s * mean_s * (1.0 - 1e-12):
        raise ScenarioError(
            Problem(
                "second_moment_s",
                "is below mean_s^2, which no distribution allows",
                second_moment_s,
                f">= mean_s^2 = {mean_s * mean_s!r} (s^2)",
            )
        )
    if lam == 0.0:
        return 0.0
    rho = lam * mean_s
    if rho >= 1.0 or math.isinf(m2):
        return math.inf
    return lam * m2 / (2.0 * (1.0 - rho))


def time_average_number(
    arrivals: ArrayLike, departures: ArrayLike, t_start: float, t_end: float
) -> float:
    """Time-average number of customers present during ``[t_start, t_end]`` (dimensionless).

    Customer ``n`` is present on ``[arrivals[n], departures[n])``; the result is the integral
    of the number present over the window divided by its length. Pass service starts
    (``arrivals + waits``) as ``departures`` for the number waiting in queue.
    """
    a = _array(arrivals, "arrivals", allowed=_TIMES_ALLOWED)
    d = _array(departures, "departures", allowed="finite times (s) >= the arrivals")
    p: list[Problem] = []
    t0 = _real(p, "t_start", t_start, allowed="a finite time (s)")
    t1 = _real(p, "t_end", t_end, allowed="a finite time (s) > t_start")
    if a.size != d.size:
        p.append(
            Problem(
                "departures",
                f"has {d.size} entries but arrivals has {a.size}",
                d.size,
                "one departure per arrival",
            )
        )
    _raise_if(p)
    if not t1 > t0:
        raise ScenarioError(
            Problem("t_end", "must be later than t_start", t_end, f"> t_start = {t0!r} (s)")
        )
    overlap = np.minimum(d, t1) - np.maximum(a, t0)
    return float(np.sum(overlap, where=overlap > 0.0)) / (t1 - t0)


@dataclass(frozen=True)
class LittlesLaw:
    """Both sides of Little's law ``L = lambda W`` measured on one window.

    Attributes:
        number_in_system: time-average number present ``L`` on the window (dimensionless).
        arrival_rate: arrivals in the window per second, ``lambda`` (1/s).
        mean_sojourn: mean time in system ``W`` of the customers arriving in the window (s).
        t_start: window start (s).
        t_end: window end (s).
        customers: arrivals counted in the window.
    """

    number_in_system: float
    arrival_rate: float
    mean_sojourn: float
    t_start: float
    t_end: float
    customers: int

    @property
    def rate_times_sojourn(self) -> float:
        """``lambda * W`` (dimensionless)."""
        return self.arrival_rate * self.mean_sojourn

    @property
    def relative_gap(self) -> float:
        """``|L - lambda W| / L`` (dimensionless); only boundary effects make it nonzero."""
        if self.number_in_system == 0.0:
            return 0.0 if self.rate_times_sojourn == 0.0 else math.inf
        return abs(self.number_in_system - self.rate_times_sojourn) / self.number_in_system


def littles_law(
    arrivals: ArrayLike,
    departures: ArrayLike,
    t_start: float | None = None,
    t_end: float | None = None,
) -> LittlesLaw:
    """Measure ``L`` and ``lambda W`` on ``[t_start, t_end]`` (defaults: first arrival to last
    departure, where the two agree exactly up to rounding). Times in seconds."""
    a = _array(arrivals, "arrivals", allowed=_TIMES_ALLOWED)
    d = _array(departures, "departures", allowed="finite times (s) >= the arrivals")
    if a.size == 0:
        raise ScenarioError(Problem("arrivals", "must not be empty", None, "at least one customer"))
    t0 = float(a.min()) if t_start is None else t_start
    t1 = float(d.max()) if t_end is None else t_end
    number = time_average_number(a, d, t0, t1)
    inside = (a >= t0) & (a <= t1)
    count = int(inside.sum())
    lam = count / (t1 - t0)
    w = float(np.mean(d[inside] - a[inside])) if count else 0.0
    return LittlesLaw(number, lam, w, float(t0), float(t1), count)
