"""Vectorized single-server FIFO queueing: engine, distributions, theory and heavy-tail checks.

This module is the kernel's queue engine. The HBM controller and the link models hand it whole
batches of customers (memory requests, messages) as arrays and get back waiting times, sojourn
times and departure times; nothing here is called once per customer. It imports only NumPy,
SciPy and :mod:`twin.kernel.errors` and has no state: every random draw comes from a
``numpy.random.Generator`` passed in by the caller.

Units: every time is in seconds (arrival times, service times, waits, means, durations), every
rate is in 1/s. Dimensionless quantities (``cov``, ``scv``, ``rho``, ``alpha``, ``k``) say so.

Contents
--------
* FIFO engine: :func:`fifo_queue` (-> :class:`FifoResult`), :func:`fifo_waits`,
  :func:`fifo_departures`; :func:`lindley_reference` is the plain-Python loop it is validated
  against, :func:`max_relative_difference` the agreement metric.
* Service-time distributions (frozen, built by name and moments): :class:`Deterministic`,
  :class:`Exponential`, :class:`Erlang`, :class:`HyperExponential2`, :class:`Lognormal`,
  :class:`Pareto`, :class:`Empirical`; factories :func:`service_distribution` and
  :func:`service_from_spec`.
* Arrival processes: :class:`PoissonArrivals`, :class:`DeterministicArrivals`,
  :class:`MMPP2Arrivals`; factories :func:`arrival_process` and :func:`arrival_from_spec`;
  :func:`superpose` merges streams and keeps a stream id per arrival.
* Theory: :func:`utilization`, :func:`mm1_mean_wait`, :func:`md1_mean_wait`,
  :func:`mg1_mean_wait` (Pollaczek-Khinchine), :func:`time_average_number` and
  :func:`littles_law`.
* Statistics and heavy tails: :func:`batch_means`, :func:`running_mean_check`,
  :func:`hill_estimate`, and the one-call report :func:`analyze_queue` (-> :class:`QueueAnalysis`).

Example::

    rng = np.random.default_rng(7)
    arrivals = PoissonArrivals(rate=0.8).sample(rng, 100_000)           # s
    services = service_distribution("lognormal", mean=1.0, cov=2.0).sample(rng, 100_000)
    report = analyze_queue(arrivals, services)
    report.mean_wait, report.mean_wait_se, report.converged, report.warnings

Heavy tails: for a service time with tail index ``alpha <= 2`` (e.g. Pareto) the variance is
infinite and, by Pollaczek-Khinchine, the M/G/1 mean wait is infinite even when ``rho < 1``. A
simulation of such a queue still produces a finite sample mean; :func:`analyze_queue` reports it
as the sample mean of that finite run with ``converged=False`` and a warning, never as a limit.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from twin.kernel.errors import Problem, ScenarioError

__all__ = [
    "ArrivalProcess",
    "BatchMeans",
    "ConvergenceCheck",
    "Deterministic",
    "DeterministicArrivals",
    "Empirical",
    "Erlang",
    "Exponential",
    "FifoResult",
    "HillEstimate",
    "HyperExponential2",
    "LittlesLaw",
    "Lognormal",
    "MMPP2Arrivals",
    "MergedArrivals",
    "Pareto",
    "PoissonArrivals",
    "QueueAnalysis",
    "ServiceDistribution",
    "analyze_queue",
    "arrival_from_spec",
    "arrival_process",
    "batch_means",
    "default_hill_k",
    "fifo_departures",
    "fifo_queue",
    "fifo_waits",
    "hill_estimate",
    "lindley_reference",
    "littles_law",
    "max_relative_difference",
    "md1_mean_wait",
    "mg1_mean_wait",
    "mm1_mean_wait",
    "running_mean_check",
    "service_distribution",
    "service_from_spec",
    "superpose",
    "time_average_number",
    "utilization",
]

# --------------------------------------------------------------------------------------------
# Input checking helpers (user errors -> ScenarioError with a Problem naming the field)
# --------------------------------------------------------------------------------------------


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _real(
    problems: list[Problem],
    path: str,
    value: Any,
    *,
    allowed: str,
    gt: float | None = None,
    ge: float | None = None,
    allow_inf: bool = False,
) -> float:
    """Check one scalar; append a Problem (and return nan) when it is not acceptable."""
    if not _is_real(value):
        problems.append(Problem(path, "must be a real number", value, allowed))
        return math.nan
    x = float(value)
    if math.isnan(x) or (math.isinf(x) and not (allow_inf and x > 0)):
        problems.append(Problem(path, "must be finite", value, allowed))
        return math.nan
    if gt is not None and not x > gt:
        problems.append(Problem(path, f"must be > {gt:g}", value, allowed))
        return math.nan
    if ge is not None and not x >= ge:
        problems.append(Problem(path, f"must be >= {ge:g}", value, allowed))
        return math.nan
    return x


def _integer(problems: list[Problem], path: str, value: Any, *, minimum: int, allowed: str) -> int:
    ok = (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer()
    )
    if not ok:
        problems.append(Problem(path, "must be an integer", value, allowed))
        return minimum
    k = int(value)
    if k < minimum:
        problems.append(Problem(path, f"must be >= {minimum}", value, allowed))
        return minimum
    return k


def _raise_if(problems: list[Problem]) -> None:
    if problems:
        raise ScenarioError(problems)


def _array(value: ArrayLike, path: str, *, allowed: str) -> np.ndarray:
    """A 1-D float64 array (no copy when already one) or a ScenarioError naming ``path``."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ScenarioError(
            Problem(path, "must be a 1-D array of numbers", _short(value), allowed)
        ) from None
    if arr.ndim != 1:
        raise ScenarioError(
            Problem(path, f"must be 1-D, got an array of shape {arr.shape}", None, allowed)
        )
    return arr


def _short(value: Any) -> Any:
    return value if isinstance(value, (str, numbers.Number)) else type(value).__name__


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            "rng must be a numpy.random.Generator, e.g. numpy.random.default_rng(seed) or "
            f"twin.kernel.rng.RngStreams(seed).get(name); got {type(rng).__name__}. The global "
            "NumPy RNG is never used."
        )
    return rng


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


# --------------------------------------------------------------------------------------------
# FIFO engine: the Lindley recursion, vectorized
# --------------------------------------------------------------------------------------------

_TIMES_ALLOWED = "finite times in seconds, sorted nondecreasing"
_SERVICES_ALLOWED = "finite service times >= 0 in seconds, one per arrival"


@dataclass(frozen=True, eq=False)
class FifoResult:
    """Per-customer outcome of a single-server FIFO queue (all arrays in seconds).

    Attributes:
        arrivals: arrival times ``A_n`` (s), as given (not copied when already float64).
        services: service times ``S_n`` (s), as given.
        waits: time in queue before service starts, ``W_n`` (s).

    ``sojourns`` (``W + S``), ``service_starts`` (``A + W``) and ``departures``
    (``(A + W) + S``, the same rounding as an event simulation) are computed on first access.
    To continue the same queue with a later batch whose first arrival is ``t``, pass
    ``initial_wait=result.backlog_at(t)``.
    """

    arrivals: np.ndarray
    services: np.ndarray
    waits: np.ndarray

    @property
    def n(self) -> int:
        """Number of customers."""
        return int(self.waits.size)

    @cached_property
    def service_starts(self) -> np.ndarray:
        """Time each customer starts service, ``A + W`` (s)."""
        return self.arrivals + self.waits

    @cached_property
    def departures(self) -> np.ndarray:
        """Departure times ``(A + W) + S`` (s); nondecreasing up to float rounding."""
        return self.service_starts + self.services

    @cached_property
    def sojourns(self) -> np.ndarray:
        """Time in system ``W + S`` (s)."""
        return self.waits + self.services

    def backlog_at(self, t: float) -> float:
        """Unfinished work (s) left in the server at time ``t`` (s), for ``t`` >= last arrival.

        This is the wait of a customer arriving at ``t``: feed it as ``initial_wait`` of the
        next batch to chain batches into one queue.
        """
        if self.n == 0:
            return 0.0
        last = float(self.arrivals[-1])
        if not t >= last:
            raise ScenarioError(
                Problem("t", "must not precede the last arrival of the batch", t, f">= {last!r}")
            )
        return max(0.0, float(self.departures[-1]) - float(t))


def fifo_queue(
    arrivals: ArrayLike,
    services: ArrayLike,
    *,
    initial_wait: float = 0.0,
    block_size: int = 1 << 16,
    segment: int = 8,
) -> FifoResult:
    """Simulate a single-server FIFO queue on given arrival and service times.

    Waiting times follow the Lindley recursion ``W_0 = initial_wait``,
    ``W_{n+1} = max(0, W_n + S_n - (A_{n+1} - A_n))``. Customers with equal arrival times are
    served in array order. The computation is vectorized: the customers are cut into blocks of
    ``block_size``; inside a block, ``segment`` consecutive customers form a segment and all
    segments of the block advance in lockstep, one NumPy operation per position; a segment is
    summarised by the max-plus map ``w -> max(w + A_seg, B_seg)`` and the maps are chained with
    a cumulative sum and a running maximum. Only one Python step per segment position and per
    block, never per customer.

    Accuracy: agrees with :func:`lindley_reference` to about 1e-11 of
    ``max(|W_n|, mean service time)`` per customer at 1e7 customers (float64); see
    :func:`max_relative_difference`. The result does not depend on ``block_size`` or
    ``segment`` beyond rounding.

    Args:
        arrivals: arrival times (s), finite, sorted nondecreasing.
        services: service times (s), finite, >= 0, one per arrival.
        initial_wait: wait of the first customer (s), i.e. the work left in the server when it
            arrives (0 for an empty system).
        block_size: customers per vectorized block (performance knob; >= 1).
        segment: customers per lockstep segment (performance knob; >= 1).

    Returns:
        a :class:`FifoResult` with waits, and lazily sojourns and departures.

    Raises:
        ScenarioError: naming ``arrivals``, ``services``, ``initial_wait``, ``block_size`` or
            ``segment`` with the offending value and what is allowed.
    """
    a = _array(arrivals, "arrivals", allowed=_TIMES_ALLOWED)
    s = _array(services, "services", allowed=_SERVICES_ALLOWED)
    problems: list[Problem] = []
    w0 = _real(problems, "initial_wait", initial_wait, ge=0.0, allowed="a finite time >= 0 (s)")
    block = _integer(problems, "block_size", block_size, minimum=1, allowed="an integer >= 1")
    seg = _integer(problems, "segment", segment, minimum=1, allowed="an integer >= 1")
    if a.size != s.size:
        problems.append(
            Problem(
                "services",
                f"has {s.size} entries but arrivals has {a.size}",
                s.size,
                "exactly one service time per arrival",
            )
        )
    _raise_if(problems)
    n = a.size
    if n and not (
        math.isfinite(a[0]) and math.isfinite(a[-1]) and s[-1] >= 0.0 and math.isfinite(s[-1])
    ):
        _raise_fifo_problems(a, s)
    waits = _lindley(a, s, w0, block=max(block, seg), seg=seg)
    return FifoResult(arrivals=a, services=s, waits=waits)


def fifo_waits(
    arrivals: ArrayLike, services: ArrayLike, *, initial_wait: float = 0.0
) -> np.ndarray:
    """Waiting times in queue (s) of a single-server FIFO queue; see :func:`fifo_queue`."""
    return fifo_queue(arrivals, services, initial_wait=initial_wait).waits


def fifo_departures(
    arrivals: ArrayLike, services: ArrayLike, *, initial_wait: float = 0.0
) -> np.ndarray:
    """Departure times (s) of a single-server FIFO queue; see :func:`fifo_queue`."""
    return fifo_queue(arrivals, services, initial_wait=initial_wait).departures


def _raise_fifo_problems(a: np.ndarray, s: np.ndarray) -> None:
    """Slow path: name every bad input (first offending index of each kind) and raise."""
    problems: list[Problem] = []
    bad = ~np.isfinite(a)
    if bad.any():
        i = _first_bad(bad)
        problems.append(Problem(f"arrivals[{i}]", "must be finite", float(a[i]), _TIMES_ALLOWED))
    else:
        down = a[1:] < a[:-1]
        if down.any():
            i = _first_bad(down) + 1
            problems.append(
                Problem(
                    f"arrivals[{i}]",
                    f"is earlier than arrivals[{i - 1}] = {float(a[i - 1])!r}; arrival times "
                    "must be sorted nondecreasing (sort them, keeping each service with its "
                    "arrival)",
                    float(a[i]),
                    _TIMES_ALLOWED,
                )
            )
    bad = ~(np.isfinite(s) & (s >= 0.0))
    if bad.any():
        i = _first_bad(bad)
        what = "must be >= 0" if s[i] < 0.0 else "must be finite"
        problems.append(Problem(f"services[{i}]", what, float(s[i]), _SERVICES_ALLOWED))
    if not problems:  # pragma: no cover - the fast checks only call here when something is bad
        raise RuntimeError("fifo input check disagreed with its diagnosis")
    raise ScenarioError(problems)


def _lindley(a: np.ndarray, s: np.ndarray, w0: float, *, block: int, seg: int) -> np.ndarray:
    """Lindley waits, vectorized per block of ``rows * seg`` customers (see fifo_queue)."""
    n = a.size
    waits = np.empty(n)
    if n == 0:
        return waits
    waits[0] = w0
    rows = max(1, block // seg)  # segments per block
    block = rows * seg
    c_buf = np.empty(block)
    acc = np.empty((seg, rows))  # acc[j, r]: sum of c over positions 0..j of segment r
    lind = np.empty((seg, rows))  # lind[j, r]: Lindley wait at position j, segment started empty
    prefix = np.empty(rows + 1)
    prefix[0] = 0.0
    peak = np.empty(rows)
    carry_in = np.empty(rows)
    w = w0
    pos = 1
    while pos < n:
        end = min(n, pos + block)
        length = end - pos
        r = -(-length // seg)
        padded = r * seg
        c = c_buf[:padded]
        gaps = c[:length]
        np.subtract(a[pos:end], a[pos - 1 : end - 1], out=gaps)
        serv = s[pos - 1 : end - 1]
        # NaN-safe: every comparison with NaN is False.
        if not (gaps.min() >= 0.0 and serv.min() >= 0.0 and serv.max() < math.inf):
            _raise_fifo_problems(a, s)
        np.subtract(serv, gaps, out=gaps)  # c_n = S_{n-1} - (A_n - A_{n-1})
        c[length:] = 0.0  # padding: a zero step leaves the wait unchanged
        acc_b = acc[:, :r]
        lind_b = lind[:, :r]
        np.copyto(acc_b, c.reshape(r, seg).T)
        np.maximum(acc_b[0], 0.0, out=lind_b[0])
        for j in range(1, seg):  # one step per position, all segments at once
            np.add(lind_b[j - 1], acc_b[j], out=lind_b[j])
            np.maximum(lind_b[j], 0.0, out=lind_b[j])
            np.add(acc_b[j - 1], acc_b[j], out=acc_b[j])
        # Segment i maps its incoming wait x to max(x + acc_last_i, lind_last_i). Chained from
        # the block's incoming wait w: x_i = P_i + max(w, max_{m<i}(lind_last_m - P_{m+1})),
        # with P_i the sum of acc_last over segments before i.
        p = prefix[: r + 1]
        np.cumsum(acc_b[seg - 1], out=p[1:])
        q = peak[:r]
        np.subtract(lind_b[seg - 1], p[1:], out=q)
        np.maximum.accumulate(q, out=q)
        x = carry_in[:r]
        x[0] = w
        if r > 1:
            np.maximum(q[:-1], w, out=x[1:])
            x[1:] += p[1:r]
        w = float(p[r]) + max(w, float(q[-1]))
        np.add(acc_b, x, out=acc_b)
        np.maximum(acc_b, lind_b, out=acc_b)
        out = waits[pos:end]
        if padded == length:
            np.copyto(out.reshape(r, seg), acc_b.T)
        else:
            out[:] = acc_b.T.reshape(-1)[:length]
        pos = end
    return waits


def lindley_reference(
    arrivals: ArrayLike, services: ArrayLike, *, initial_wait: float = 0.0
) -> np.ndarray:
    """The plain-Python sequential Lindley loop (s): slow, obviously correct, for validation.

    ``W_0 = initial_wait``; ``W_{n+1} = max(0, W_n + S_n - (A_{n+1} - A_n))``. Inputs are
    checked as in :func:`fifo_queue`.
    """
    a = _array(arrivals, "arrivals", allowed=_TIMES_ALLOWED)
    s = _array(services, "services", allowed=_SERVICES_ALLOWED)
    if a.size != s.size:
        raise ScenarioError(
            Problem(
                "services",
                f"has {s.size} entries but arrivals has {a.size}",
                s.size,
                "exactly one service time per arrival",
            )
        )
    if a.size and not (
        np.isfinite(a).all() and np.isfinite(s).all() and (s >= 0).all() and (a[1:] >= a[:-1]).all()
    ):
        _raise_fifo_problems(a, s)
    al = a.tolist()
    sl = s.tolist()
    out = [0.0] * len(al)
    w = float(initial_wait)
    for i in range(len(al)):
        if i:
            w = w + sl[i - 1] - (al[i] - al[i - 1])
            if w < 0.0:
                w = 0.0
        out[i] = w
    return np.array(out, dtype=np.float64)


def max_relative_difference(
    values: ArrayLike, reference: ArrayLike, *, floor: float = 0.0
) -> float:
    """``max_n |v_n - r_n| / max(|r_n|, floor)``: the agreement metric for wait vectors.

    With ``floor`` = the mean service time (s) this is the relative error of each wait, with
    waits shorter than one mean service judged against the mean service time (a wait of
    1e-12 s next to 1 s services cannot be resolved relative to itself in float64). Returns 0
    for empty inputs and ``inf`` when a difference meets a zero denominator.
    """
    v = np.asarray(values, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if v.shape != r.shape:
        raise ScenarioError(
            Problem("values", f"shape {v.shape} differs from reference shape {r.shape}")
        )
    if v.size == 0:
        return 0.0
    diff = np.abs(v - r)
    den = np.maximum(np.abs(r), float(floor))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0.0, 0.0, diff / den)
    return float(rel.max())


# --------------------------------------------------------------------------------------------
# Service-time distributions
# --------------------------------------------------------------------------------------------


class ServiceDistribution:
    """Base of the service-time distributions (times in seconds).

    Every distribution exposes ``mean`` (s), ``variance`` (s^2, ``math.inf`` when infinite),
    ``second_moment`` E[S^2] (s^2), ``scv`` (squared coefficient of variation, variance /
    mean^2), ``cov`` (sqrt(scv)), ``tail_index`` (``alpha`` of a power-law tail, ``math.inf``
    for lighter tails) and ``sample(rng, size)``.
    """

    name: ClassVar[str] = ""
    mean: float  # s
    cov: float  # dimensionless; a field or a property of each subclass

    @property
    def variance(self) -> float:
        """Variance (s^2); ``math.inf`` when infinite."""
        raise NotImplementedError

    @property
    def second_moment(self) -> float:
        """E[S^2] (s^2); ``math.inf`` when the variance is infinite."""
        v = self.variance
        return math.inf if math.isinf(v) else v + self.mean * self.mean

    @property
    def scv(self) -> float:
        """Squared coefficient of variation, variance / mean^2 (dimensionless)."""
        v = self.variance
        return math.inf if math.isinf(v) else v / (self.mean * self.mean)

    @property
    def tail_index(self) -> float:
        """Power-law tail index ``alpha`` (P[S > x] ~ x^-alpha); ``math.inf`` if lighter."""
        return math.inf

    @property
    def variance_finite(self) -> bool:
        """Whether the variance (and so the M/G/1 mean wait for rho < 1) is finite."""
        return math.isfinite(self.variance)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Draw service times (s) from ``rng`` (a ``numpy.random.Generator``; never global)."""
        return self._draw(_check_rng(rng), size)

    def _draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The spec that rebuilds this distribution with :func:`service_from_spec`."""
        raise NotImplementedError

    def _check(self, problems: list[Problem]) -> None:
        if problems:
            raise ScenarioError(problems)


_MEAN_ALLOWED = "a finite mean service time > 0 (s)"


class _CovFromScv:
    """``cov`` for the distributions not parametrised by it."""

    scv: float

    @property
    def cov(self) -> float:
        """Coefficient of variation, standard deviation / mean (dimensionless)."""
        return math.sqrt(self.scv)


@dataclass(frozen=True)
class Deterministic(_CovFromScv, ServiceDistribution):
    """Every service takes exactly ``mean`` seconds (variance 0).

    Args:
        mean: service time (s), > 0.
    """

    name: ClassVar[str] = "deterministic"
    mean: float

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        object.__setattr__(
            self,
            "mean",
            _real(problems, "deterministic.mean", self.mean, gt=0.0, allowed=_MEAN_ALLOWED),
        )
        self._check(problems)

    @property
    def variance(self) -> float:
        return 0.0

    def _draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return np.full(size, self.mean)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mean": self.mean}


@dataclass(frozen=True)
class Exponential(_CovFromScv, ServiceDistribution):
    """Exponential service time (cov 1).

    Args:
        mean: mean service time (s), > 0; the service rate is ``1/mean`` (1/s).
    """

    name: ClassVar[str] = "exponential"
    mean: float

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        object.__setattr__(
            self,
            "mean",
            _real(problems, "exponential.mean", self.mean, gt=0.0, allowed=_MEAN_ALLOWED),
        )
        self._check(problems)

    @property
    def variance(self) -> float:
        return self.mean * self.mean

    def _draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return rng.exponential(self.mean, size)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mean": self.mean}


@dataclass(frozen=True)
class Erlang(_CovFromScv, ServiceDistribution):
    """Erlang-k service time: the sum of ``k`` exponential phases (cov ``1/sqrt(k)``).

    Args:
        mean: mean service time (s), > 0.
        k: number of phases (integer >= 1; k = 1 is exponential).
    """

    name: ClassVar[str] = "erlang"
    mean: float
    k: int

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        object.__setattr__(
            self, "mean", _real(problems, "erlang.mean", self.mean, gt=0.0, allowed=_MEAN_ALLOWED)
        )
        object.__setattr__(
            self,
            "k",
            _integer(
                problems, "erlang.k", self.k, minimum=1, allowed="an integer number of phases >= 1"
            ),
        )
        self._check(problems)

    @property
    def variance(self) -> float:
        return self.mean * self.mean / self.k

    def _draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return rng.gamma(self.k, self.mean / self.k, size)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mean": self.mean, "k": self.k}


@dataclass(frozen=True)
class HyperExponential2(ServiceDistribution):
    """Two-phase hyperexponential (H2) with balanced means, for cov >= 1.

    With probability ``p`` the service is exponential with mean ``mean / (2 p)``, otherwise
    with mean ``mean / (2 (1 - p))``, where ``p = (1 + sqrt((cov^2 - 1) / (cov^2 + 1))) / 2``;
    each branch then carries half the mean ("balanced means"). ``cov = 1`` is exponential.

    Args:
        mean: mean service time (s), > 0.
        cov: coefficient of variation (dimensionless), >= 1.
    """

    name: ClassVar[str] = "hyperexponential"
    mean: float
    cov: float

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        object.__setattr__(
            self,
            "mean",
            _real(problems, "hyperexponential.mean", self.mean, gt=0.0, allowed=_MEAN_ALLOWED),
        )
        object.__setattr__(
            self,
            "cov",
            _real(
                problems,
                "hyperexponential.cov",
                self.cov,
                ge=1.0,
                allowed="a coefficient of variation >= 1 (use erlang for cov < 1)",
            ),
        )
        self._check(problems)

    @property
    def p(self) -> float:
        """Probability of the short branch (dimensionless)."""
        c2 = self.cov**2
        return 0.5 * (1.0 + math.sqrt((c2 - 1.0) / (c2 + 1.0)))

    @property
    def branch_means(self) -> tuple[float, float]:
        """Means (s) of the two exponential branches (first has probability ``p``)."""
        p = self.p
        return self.mean / (2.0 * p), self.mean / (2.0 * (1.0 - p))

    @property
    def variance(self) -> float:
        return (self.cov * self.mean) ** 2

    def _draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        m1, m2 = self.branch_means
        first = rng.random(size) < self.p
        return rng.standard_exponential(size) * np.where(first, m1, m2)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mean": self.mean, "cov": self.cov}


@dataclass(frozen=True)
class Lognormal(ServiceDistribution):
    """Lognormal service time given by its mean and coefficient of variation.

    ``log S ~ Normal(mu, sigma^2)`` with ``sigma^2 = log(1 + cov^2)`` and
    ``mu = log(mean) - sigma^2 / 2``. All moments are finite (``tail_index`` is ``inf``),
    but for large ``sigma`` the tail looks like a power law over many decades; see
    :func:`hill_estimate`.

    Args:
        mean: mean service time (s), > 0.
        cov: coefficient of variation (dimensionless), > 0.
    """

    name: ClassVar[str] = "lognormal"
    mean: float
    cov: float

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        object.__setattr__(
            self,
            "mean",
            _real(problems, "lognormal.mean", self.mean, gt=0.0, allowed=_MEAN_ALLOWED),
        )
        object.__setattr__(
            self,
            "cov",
            _real(
                problems,
                "lognormal.cov",
                self.cov,
                gt=0.0,
                allowed="a coefficient of variation > 0",
            ),
        )
        self._check(problems)

    @classmethod
    def from_log_params(cls, mu: float, sigma: float) -> Lognormal:
        """The lognormal with ``log S ~ Normal(mu, sigma^2)`` (``mu`` in log-seconds)."""
        problems: list[Problem] = []
        mu = _real(problems, "lognormal.mu", mu, allowed="a finite real (log of seconds)")
        sigma = _real(problems, "lognormal.sigma", sigma, gt=0.0, allowed="a real > 0")
        _raise_if(problems)
        return cls(mean=math.exp(mu + 0.5 * sigma * sigma), cov=math.sqrt(math.expm1(sigma**2)))

    @property
    def sigma(self) -> float:
        """Standard deviation of ``log S`` (dimensionless)."""
        return math.sqrt(math.log1p(self.cov**2))

    @property
    def mu(self) -> float:
        """Mean of ``log S`` (log-seconds)."""
        return math.log(self.mean) - 0.5 * self.sigma**2

    @property
    def variance(self) -> float:
        return (self.cov * self.mean) ** 2

    def _draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return rng.lognormal(self.mu, self.sigma, size)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mean": self.mean, "cov": self.cov}


@dataclass(frozen=True)
class Pareto(_CovFromScv, ServiceDistribution):
    """Pareto Type I service time with tail index ``alpha``, given by its mean.

    ``P[S > x] = (x_m / x)^alpha`` for ``x >= x_m`` (support starts at the scale ``x_m``, not
    at 0: this is Type I, not Lomax), with ``x_m = mean (alpha - 1) / alpha``. The mean is
    finite only for ``alpha > 1`` (required here); the variance is infinite for
    ``alpha <= 2`` and then the M/G/1 mean wait is infinite for every ``rho > 0``.

    Args:
        alpha: tail index (dimensionless), > 1.
        mean: mean service time (s), > 0.
    """

    name: ClassVar[str] = "pareto"
    alpha: float
    mean: float

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        object.__setattr__(
            self,
            "alpha",
            _real(
                problems,
                "pareto.alpha",
                self.alpha,
                gt=1.0,
                allowed="a tail index > 1 (alpha <= 1 has an infinite mean; alpha <= 2 an "
                "infinite variance)",
            ),
        )
        object.__setattr__(
            self, "mean", _real(problems, "pareto.mean", self.mean, gt=0.0, allowed=_MEAN_ALLOWED)
        )
        self._check(problems)

    @property
    def scale(self) -> float:
        """Minimum service time ``x_m`` (s)."""
        return self.mean * (self.alpha - 1.0) / self.alpha

    @property
    def variance(self) -> float:
        a = self.alpha
        if a <= 2.0:
            return math.inf
        return self.scale**2 * a / ((a - 1.0) ** 2 * (a - 2.0))

    @property
    def tail_index(self) -> float:
        return self.alpha

    def _draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        # log(S / x_m) is exponential with rate alpha.
        return self.scale * np.exp(rng.standard_exponential(size) / self.alpha)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "alpha": self.alpha, "mean": self.mean}


@dataclass(frozen=True, eq=False)
class Empirical(_CovFromScv, ServiceDistribution):
    """Service times resampled from data: raw samples, or a histogram.

    Give either ``samples`` (resampled uniformly with replacement; the distribution *is* the
    sample, so ``variance`` is the population variance, ddof 0) or ``edges`` plus ``counts``
    (a bin is chosen with probability proportional to its count, then the time is uniform
    within the bin). Build with :meth:`from_samples` or :meth:`from_histogram`.

    Args:
        samples: observed service times (s), finite, >= 0, not all zero.
        edges: histogram bin edges (s), finite, >= 0, strictly increasing, ``len(counts) + 1``.
        counts: histogram counts (>= 0, finite, not all zero).
    """

    name: ClassVar[str] = "empirical"
    samples: np.ndarray | None = None
    edges: np.ndarray | None = None
    counts: np.ndarray | None = None
    mean: float = field(init=False)
    _second: float = field(init=False, repr=False)
    _probs: np.ndarray | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        allowed = "either samples=[...] or edges=[...] with counts=[...]"
        have_s = self.samples is not None
        have_h = self.edges is not None or self.counts is not None
        if have_s == have_h:
            problems.append(
                Problem("empirical", "give exactly one of samples or edges+counts", None, allowed)
            )
            raise ScenarioError(problems)
        if have_s:
            x = _array(self.samples, "empirical.samples", allowed="service times >= 0 (s)")
            bad = ~(np.isfinite(x) & (x >= 0.0))
            if x.size == 0:
                problems.append(
                    Problem(
                        "empirical.samples",
                        "must not be empty",
                        None,
                        "at least one service time (s)",
                    )
                )
            elif bad.any():
                i = _first_bad(bad)
                problems.append(
                    Problem(
                        f"empirical.samples[{i}]",
                        "must be finite and >= 0",
                        float(x[i]),
                        "service times >= 0 (s)",
                    )
                )
            elif not (x > 0).any():
                problems.append(
                    Problem(
                        "empirical.samples",
                        "must not be all zero",
                        None,
                        "service times >= 0 (s) with a positive mean",
                    )
                )
            self._check(problems)
            x = np.array(x, dtype=np.float64)  # private read-only copy
            x.setflags(write=False)
            object.__setattr__(self, "samples", x)
            object.__setattr__(self, "mean", float(x.mean()))
            object.__setattr__(self, "_second", float(np.mean(x * x)))
            object.__setattr__(self, "_probs", None)
            return
        if self.edges is None or self.counts is None:
            missing = "edges" if self.edges is None else "counts"
            problems.append(
                Problem(f"empirical.{missing}", "is required with a histogram", None, allowed)
            )
            raise ScenarioError(problems)
        e = _array(self.edges, "empirical.edges", allowed="increasing bin edges >= 0 (s)")
        cnt = _array(self.counts, "empirical.counts", allowed="counts >= 0")
        if e.size != cnt.size + 1:
            problems.append(
                Problem(
                    "empirical.edges",
                    f"has {e.size} edges for {cnt.size} counts",
                    e.size,
                    "len(edges) == len(counts) + 1",
                )
            )
        elif cnt.size == 0:
            problems.append(
                Problem("empirical.counts", "must not be empty", None, "at least one bin")
            )
        else:
            if not (np.isfinite(e).all() and e[0] >= 0.0 and (np.diff(e) > 0).all()):
                problems.append(
                    Problem(
                        "empirical.edges",
                        "must be finite, >= 0 and strictly increasing",
                        None,
                        "increasing bin edges >= 0 (s)",
                    )
                )
            if not (np.isfinite(cnt).all() and (cnt >= 0).all() and cnt.sum() > 0):
                problems.append(
                    Problem(
                        "empirical.counts",
                        "must be finite, >= 0 and not all zero",
                        None,
                        "counts >= 0 with a positive total",
                    )
                )
        self._check(problems)
        e = np.array(e, dtype=np.float64)
        cnt = np.array(cnt, dtype=np.float64)
        e.setflags(write=False)
        cnt.setflags(write=False)
        probs = cnt / cnt.sum()
        lo, hi = e[:-1], e[1:]
        object.__setattr__(self, "edges", e)
        object.__setattr__(self, "counts", cnt)
        object.__setattr__(self, "_probs", probs)
        object.__setattr__(self, "mean", float(np.sum(probs * (lo + hi) / 2.0)))
        object.__setattr__(
            self, "_second", float(np.sum(probs * (lo * lo + lo * hi + hi * hi)) / 3.0)
        )

    @classmethod
    def from_samples(cls, samples: ArrayLike) -> Empirical:
        """Resample observed service times (s)."""
        return cls(samples=_array(samples, "empirical.samples", allowed="service times >= 0 (s)"))

    @classmethod
    def from_histogram(cls, edges: ArrayLike, counts: ArrayLike) -> Empirical:
        """Sample from a histogram: bin by count, then uniform within the bin (edges in s)."""
        return cls(
            edges=_array(edges, "empirical.edges", allowed="increasing bin edges >= 0 (s)"),
            counts=_array(counts, "empirical.counts", allowed="counts >= 0"),
        )

    @property
    def variance(self) -> float:
        return max(0.0, self._second - self.mean * self.mean)

    @property
    def second_moment(self) -> float:
        return self._second

    def _draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        if self.samples is not None:
            return self.samples[rng.integers(0, self.samples.size, size)]
        assert self.edges is not None and self._probs is not None  # invariant of __post_init__
        idx = rng.choice(self._probs.size, size=size, p=self._probs)
        lo = self.edges[idx]
        return lo + rng.random(size) * (self.edges[idx + 1] - lo)

    def to_dict(self) -> dict[str, Any]:
        if self.samples is not None:
            return {"name": self.name, "samples": self.samples.tolist()}
        assert self.edges is not None and self.counts is not None
        return {"name": self.name, "edges": self.edges.tolist(), "counts": self.counts.tolist()}


@dataclass(frozen=True)
class _Kind:
    cls: Any
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    signature: str = ""


_SERVICE_KINDS: dict[str, _Kind] = {
    "deterministic": _Kind(Deterministic, ("mean",), (), "deterministic(mean)"),
    "exponential": _Kind(Exponential, ("mean",), (), "exponential(mean)"),
    "erlang": _Kind(Erlang, ("mean", "k"), (), "erlang(mean, k)"),
    "hyperexponential": _Kind(
        HyperExponential2, ("mean", "cov"), (), "hyperexponential(mean, cov>=1)"
    ),
    "lognormal": _Kind(Lognormal, ("mean", "cov"), (), "lognormal(mean, cov)"),
    "pareto": _Kind(Pareto, ("alpha", "mean"), (), "pareto(alpha>1, mean)"),
    "empirical": _Kind(
        Empirical,
        (),
        ("samples", "edges", "counts"),
        "empirical(samples) or empirical(edges, counts)",
    ),
}
_SERVICE_NAMES = "; ".join(k.signature for k in _SERVICE_KINDS.values()) + " (times in s)"


def _build(
    kinds: Mapping[str, _Kind],
    what: str,
    names: str,
    name: Any,
    params: Mapping[str, Any],
    path: str | None,
) -> Any:
    name_path = f"{path}.name" if path else "name"
    if not isinstance(name, str) or name.strip().lower() not in kinds:
        raise ScenarioError(Problem(name_path, f"unknown {what}", name, f"one of: {names}"))
    key = name.strip().lower()
    kind = kinds[key]
    prefix = path if path else key
    problems = [
        Problem(f"{prefix}.{p}", f"is not a parameter of {key}", params[p], f"{kind.signature}")
        for p in params
        if p not in kind.required and p not in kind.optional
    ]
    problems += [
        Problem(f"{prefix}.{p}", "is missing", None, kind.signature)
        for p in kind.required
        if p not in params
    ]
    _raise_if(problems)
    try:
        return kind.cls(**params)
    except ScenarioError as err:
        if not path:
            raise
        renamed = [
            Problem(
                prefix + q.path[len(key) :] if q.path.startswith(key) else q.path,
                q.message,
                q.value,
                q.allowed,
            )
            for q in err.problems
        ]
        raise ScenarioError(renamed) from None


def service_distribution(name: str, **params: Any) -> ServiceDistribution:
    """Build a service-time distribution by name and moments (times in seconds).

    Names and parameters: ``deterministic(mean)``, ``exponential(mean)``, ``erlang(mean, k)``,
    ``hyperexponential(mean, cov)`` (cov >= 1), ``lognormal(mean, cov)``,
    ``pareto(alpha, mean)`` (Type I, alpha > 1), ``empirical(samples)`` or
    ``empirical(edges, counts)``. Names are case-insensitive.

    Raises:
        ScenarioError: unknown name (listing the allowed ones), missing or unknown parameter,
            or a bad value, each naming the parameter, e.g. ``pareto.alpha``.
    """
    return _build(_SERVICE_KINDS, "service-time distribution", _SERVICE_NAMES, name, params, None)


def _build_from_spec(kinds, what: str, names: str, spec: Any, path: str):
    """Shared body of the ``*_from_spec`` factories: ``spec`` must be a mapping with a
    ``name`` key; the other keys are the parameters."""
    if not isinstance(spec, Mapping):
        raise ScenarioError(Problem(path, "must be a mapping with a 'name' key", _short(spec),
                                    f"one of: {names}"))
    if "name" not in spec:
        raise ScenarioError(Problem(f"{path}.name", "is missing", None, f"one of: {names}"))
    params = {k: v for k, v in spec.items() if k != "name"}
    return _build(kinds, what, names, spec["name"], params, path)


def service_from_spec(spec: Mapping[str, Any], path: str = "service") -> ServiceDistribution:
    """Build a service-time distribution from a mapping such as a scenario YAML section.

    ``spec`` is ``{"name": "pareto", "alpha": 1.8, "mean": 2.0e-7}`` (times in seconds), the
    inverse of :meth:`ServiceDistribution.to_dict`. Problems are reported under ``path``
    (e.g. ``devices.hbm.service.alpha``).
    """
    return _build_from_spec(_SERVICE_KINDS, "service-time distribution", _SERVICE_NAMES, spec,
                            path)


# --------------------------------------------------------------------------------------------
# Arrival processes
# --------------------------------------------------------------------------------------------


class ArrivalProcess:
    """Base of the arrival processes (times in seconds, rates in 1/s).

    ``rate`` is the long-run mean arrival rate (1/s). ``sample(rng, n, start)`` returns the
    first ``n`` arrival times after ``start`` (sorted); ``sample_until(rng, t_end, start)``
    returns every arrival in ``[start, t_end)``, which is what superposing several streams
    over one time window needs.
    """

    name: ClassVar[str] = ""
    rate: float

    def sample(self, rng: np.random.Generator, n: int, start: float = 0.0) -> np.ndarray:
        """The first ``n`` arrival times (s) after ``start`` (s), sorted nondecreasing."""
        rng = _check_rng(rng)
        problems: list[Problem] = []
        n = _integer(problems, "n", n, minimum=0, allowed="a number of arrivals >= 0")
        start = _real(problems, "start", start, allowed="a finite time (s)")
        _raise_if(problems)
        return self._sample(rng, n, start)

    def sample_until(
        self, rng: np.random.Generator, t_end: float, start: float = 0.0
    ) -> np.ndarray:
        """All arrival times (s) in ``[start, t_end)``, sorted nondecreasing."""
        rng = _check_rng(rng)
        problems: list[Problem] = []
        start = _real(problems, "start", start, allowed="a finite time (s)")
        t_end = _real(problems, "t_end", t_end, allowed="a finite time (s) >= start")
        _raise_if(problems)
        if t_end < start:
            raise ScenarioError(
                Problem("t_end", "must not precede start", t_end, f">= start = {start!r} (s)")
            )
        return self._sample_until(rng, start, t_end)

    def _sample(self, rng: np.random.Generator, n: int, start: float) -> np.ndarray:
        raise NotImplementedError

    def _sample_until(self, rng: np.random.Generator, start: float, t_end: float) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The spec that rebuilds this process with :func:`arrival_from_spec`."""
        raise NotImplementedError


_RATE_ALLOWED = "a finite arrival rate > 0 (1/s)"


@dataclass(frozen=True)
class PoissonArrivals(ArrivalProcess):
    """Poisson arrivals: exponential interarrival times with mean ``1/rate``.

    Args:
        rate: arrival rate (1/s), > 0.
    """

    name: ClassVar[str] = "poisson"
    rate: float

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        object.__setattr__(
            self, "rate", _real(problems, "poisson.rate", self.rate, gt=0.0, allowed=_RATE_ALLOWED)
        )
        _raise_if(problems)

    def _sample(self, rng: np.random.Generator, n: int, start: float) -> np.ndarray:
        times = np.cumsum(rng.exponential(1.0 / self.rate, n))
        times += start
        return times

    def _sample_until(self, rng: np.random.Generator, start: float, t_end: float) -> np.ndarray:
        count = int(rng.poisson(self.rate * (t_end - start)))
        times = np.sort(rng.random(count))
        times *= t_end - start
        times += start
        return times

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rate": self.rate}


@dataclass(frozen=True)
class DeterministicArrivals(ArrivalProcess):
    """One arrival every ``1/rate`` seconds, at ``start + k/rate`` for ``k = 1, 2, ...``.

    Args:
        rate: arrival rate (1/s), > 0.
    """

    name: ClassVar[str] = "deterministic"
    rate: float

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        object.__setattr__(
            self,
            "rate",
            _real(problems, "deterministic.rate", self.rate, gt=0.0, allowed=_RATE_ALLOWED),
        )
        _raise_if(problems)

    def _sample(self, rng: np.random.Generator, n: int, start: float) -> np.ndarray:
        return start + np.arange(1, n + 1, dtype=np.float64) / self.rate

    def _sample_until(self, rng: np.random.Generator, start: float, t_end: float) -> np.ndarray:
        count = math.floor((t_end - start) * self.rate) + 1
        times = start + np.arange(1, count + 1, dtype=np.float64) / self.rate
        return times[times < t_end]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rate": self.rate}


@dataclass(frozen=True)
class MMPP2Arrivals(ArrivalProcess):
    """Bursty on-off arrivals: a two-state Markov-modulated Poisson process (MMPP-2).

    A hidden state alternates between *on* and *off*; the time spent in each visit is
    exponential with mean ``mean_on`` / ``mean_off`` (switching rates ``1/mean_on`` and
    ``1/mean_off``, 1/s). While on, arrivals are Poisson with rate ``rate_on``; while off with
    ``rate_off`` (0 for a pure on-off source). The long-run mean rate is
    ``(mean_on * rate_on + mean_off * rate_off) / (mean_on + mean_off)``.

    Args:
        rate_on: arrival rate in the on state (1/s), >= 0.
        rate_off: arrival rate in the off state (1/s), >= 0; ``rate_on + rate_off > 0``.
        mean_on: mean duration of an on period (s), > 0.
        mean_off: mean duration of an off period (s), > 0.
        initial_state: ``"stationary"`` (draw the state at ``start`` from the long-run
            probabilities, one uniform draw), ``"on"`` or ``"off"``.
    """

    name: ClassVar[str] = "mmpp2"
    rate_on: float
    rate_off: float
    mean_on: float
    mean_off: float
    initial_state: str = "stationary"

    def __post_init__(self) -> None:
        p: list[Problem] = []
        r_allowed = "an arrival rate >= 0 (1/s)"
        d_allowed = "a mean duration > 0 (s)"
        object.__setattr__(
            self, "rate_on", _real(p, "mmpp2.rate_on", self.rate_on, ge=0.0, allowed=r_allowed)
        )
        object.__setattr__(
            self, "rate_off", _real(p, "mmpp2.rate_off", self.rate_off, ge=0.0, allowed=r_allowed)
        )
        object.__setattr__(
            self, "mean_on", _real(p, "mmpp2.mean_on", self.mean_on, gt=0.0, allowed=d_allowed)
        )
        object.__setattr__(
            self, "mean_off", _real(p, "mmpp2.mean_off", self.mean_off, gt=0.0, allowed=d_allowed)
        )
        if self.initial_state not in ("stationary", "on", "off"):
            p.append(
                Problem(
                    "mmpp2.initial_state",
                    "unknown initial state",
                    self.initial_state,
                    "'stationary', 'on' or 'off'",
                )
            )
        if not p and self.rate_on + self.rate_off <= 0.0:
            p.append(
                Problem(
                    "mmpp2.rate_on",
                    "rate_on and rate_off are both 0",
                    self.rate_on,
                    "at least one positive rate (1/s)",
                )
            )
        _raise_if(p)

    @classmethod
    def from_switching_rates(
        cls,
        rate_on: float,
        rate_off: float,
        switch_on_off: float,
        switch_off_on: float,
        initial_state: str = "stationary",
    ) -> MMPP2Arrivals:
        """Build from the generator's switching rates (1/s): on->off and off->on."""
        p: list[Problem] = []
        a = _real(p, "mmpp2.switch_on_off", switch_on_off, gt=0.0, allowed="a rate > 0 (1/s)")
        b = _real(p, "mmpp2.switch_off_on", switch_off_on, gt=0.0, allowed="a rate > 0 (1/s)")
        _raise_if(p)
        return cls(rate_on, rate_off, 1.0 / a, 1.0 / b, initial_state)

    @property
    def p_on(self) -> float:
        """Long-run fraction of time in the on state (dimensionless)."""
        return self.mean_on / (self.mean_on + self.mean_off)

    @property
    def rate(self) -> float:  # type: ignore[override]
        """Long-run mean arrival rate (1/s)."""
        return self.p_on * self.rate_on + (1.0 - self.p_on) * self.rate_off

    @property
    def index_of_dispersion(self) -> float:
        """Asymptotic index of dispersion of counts, ``lim Var N(t) / E N(t)`` (dimensionless).

        ``1 + 2 p_on (1 - p_on) (rate_on - rate_off)^2 / ((1/mean_on + 1/mean_off) rate)``;
        1 for Poisson, larger the burstier the stream.
        """
        switching = 1.0 / self.mean_on + 1.0 / self.mean_off
        spread = (self.rate_on - self.rate_off) ** 2
        return 1.0 + 2.0 * self.p_on * (1.0 - self.p_on) * spread / (switching * self.rate)

    def _initial(self, rng: np.random.Generator) -> bool:
        if self.initial_state == "stationary":
            return bool(rng.random() < self.p_on)
        return self.initial_state == "on"

    def _run(
        self, rng: np.random.Generator, start: float, t_end: float, on: bool
    ) -> tuple[np.ndarray, bool]:
        """Arrivals in [start, t_end) starting in state ``on``; returns them and the end state."""
        starts: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        states: list[np.ndarray] = []
        cycle = self.mean_on + self.mean_off
        t = start
        while t < t_end:
            m = 2 * (int((t_end - t) / cycle) + 4)  # visits to draw this round (even)
            is_on = (np.arange(m) % 2 == 0) == on
            dur = rng.standard_exponential(m) * np.where(is_on, self.mean_on, self.mean_off)
            ends = t + np.cumsum(dur)
            begins = np.concatenate(([t], ends[:-1]))
            keep = int(np.searchsorted(ends, t_end, side="left")) + 1  # visits touching t_end
            keep = min(keep, m)
            starts.append(begins[:keep])
            lengths.append(np.minimum(ends[:keep], t_end) - begins[:keep])
            states.append(is_on[:keep])
            if ends[keep - 1] >= t_end:
                on = bool(is_on[keep - 1])
                break
            t = float(ends[-1])
            on = not bool(is_on[-1])
        if not starts:
            return np.empty(0), on
        b = np.concatenate(starts)
        length = np.concatenate(lengths)
        state = np.concatenate(states)
        lam = np.where(state, self.rate_on, self.rate_off)
        counts = rng.poisson(lam * length)
        total = int(counts.sum())
        times = np.repeat(b, counts) + rng.random(total) * np.repeat(length, counts)
        times.sort()
        return times, on

    def _sample(self, rng: np.random.Generator, n: int, start: float) -> np.ndarray:
        on = self._initial(rng)
        parts: list[np.ndarray] = []
        have = 0
        t = start
        while have < n:
            horizon = 1.2 * (n - have) / self.rate + 2.0 * (self.mean_on + self.mean_off)
            times, on = self._run(rng, t, t + horizon, on)
            parts.append(times)
            have += times.size
            t += horizon
        return np.concatenate(parts)[:n] if parts else np.empty(0)

    def _sample_until(self, rng: np.random.Generator, start: float, t_end: float) -> np.ndarray:
        return self._run(rng, start, t_end, self._initial(rng))[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rate_on": self.rate_on,
            "rate_off": self.rate_off,
            "mean_on": self.mean_on,
            "mean_off": self.mean_off,
            "initial_state": self.initial_state,
        }


_ARRIVAL_KINDS: dict[str, _Kind] = {
    "poisson": _Kind(PoissonArrivals, ("rate",), (), "poisson(rate)"),
    "deterministic": _Kind(DeterministicArrivals, ("rate",), (), "deterministic(rate)"),
    "mmpp2": _Kind(
        MMPP2Arrivals,
        ("rate_on", "rate_off", "mean_on", "mean_off"),
        ("initial_state",),
        "mmpp2(rate_on, rate_off, mean_on, mean_off)",
    ),
}
_ARRIVAL_NAMES = "; ".join(k.signature for k in _ARRIVAL_KINDS.values()) + " (rates 1/s, s)"


def arrival_process(name: str, **params: Any) -> ArrivalProcess:
    """Build an arrival process by name: ``poisson(rate)``, ``deterministic(rate)``,
    ``mmpp2(rate_on, rate_off, mean_on, mean_off[, initial_state])`` (rates 1/s, means s)."""
    return _build(_ARRIVAL_KINDS, "arrival process", _ARRIVAL_NAMES, name, params, None)


def arrival_from_spec(spec: Mapping[str, Any], path: str = "arrivals") -> ArrivalProcess:
    """Build an arrival process from ``{"name": "poisson", "rate": 1e6}`` (problems under
    ``path``); the inverse of ``to_dict``."""
    return _build_from_spec(_ARRIVAL_KINDS, "arrival process", _ARRIVAL_NAMES, spec, path)


@dataclass(frozen=True, eq=False)
class MergedArrivals:
    """Several arrival streams merged into one (see :func:`superpose`).

    Attributes:
        times: merged arrival times (s), sorted nondecreasing.
        stream_ids: index of the stream each arrival came from (int64).
        n_streams: number of streams merged.
    """

    times: np.ndarray
    stream_ids: np.ndarray
    n_streams: int

    def split(self, values: ArrayLike) -> list[np.ndarray]:
        """Per-arrival ``values`` (e.g. waits) regrouped by stream, each in its own order."""
        v = np.asarray(values)
        if v.shape[:1] != self.times.shape:
            raise ScenarioError(
                Problem(
                    "values",
                    f"has {v.shape[:1]} entries, expected {self.times.size}",
                    None,
                    "one value per arrival",
                )
            )
        return [v[self.stream_ids == j] for j in range(self.n_streams)]


def superpose(streams: Sequence[ArrayLike]) -> MergedArrivals:
    """Merge sorted arrival streams (s) into one, keeping the stream id of every arrival.

    Ties resolve deterministically: equal times keep stream order, then order within the
    stream. Typical use, the memory model's compute kernel stream plus DMA streams::

        merged = superpose([p.sample_until(r, t_end) for p, r in zip(processes, rngs)])
        waits = fifo_waits(merged.times, services)
        kernel_waits, dma_waits = merged.split(waits)
    """
    arrays = []
    for j, stream in enumerate(streams):
        x = _array(stream, f"streams[{j}]", allowed=_TIMES_ALLOWED)
        if x.size and not (np.isfinite(x).all() and (x[1:] >= x[:-1]).all()):
            raise ScenarioError(
                Problem(
                    f"streams[{j}]", "must be finite and sorted nondecreasing", None, _TIMES_ALLOWED
                )
            )
        arrays.append(x)
    if not arrays:
        return MergedArrivals(np.empty(0), np.empty(0, dtype=np.int64), 0)
    times = np.concatenate(arrays)
    ids = np.repeat(np.arange(len(arrays), dtype=np.int64), [x.size for x in arrays])
    order = np.argsort(times, kind="stable")
    return MergedArrivals(times[order], ids[order], len(arrays))


# --------------------------------------------------------------------------------------------
# Theory
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Output statistics and heavy-tail diagnostics
# --------------------------------------------------------------------------------------------


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


def default_hill_k(n: int) -> int:
    """Default number of order statistics for :func:`hill_estimate`: ``round(sqrt(n))``,
    at least 10 and at most ``n - 1``.

    ``sqrt(n)`` keeps the estimate in the far tail (top 0.3% of 1e5 samples), where a
    lognormal's local slope is steep and a power law's is exact, at the price of a wider
    interval than a fixed 2-5% fraction (half-width ``1.96 / sqrt(k)`` relative: 11% at 1e5
    samples, 3.5% at 1e7).
    """
    return int(min(n - 1, max(10, round(math.sqrt(n)))))


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
