"""Service-time distributions, frozen and built by name and moments (times in seconds):
deterministic, exponential, Erlang, two-phase hyperexponential, lognormal, Pareto, empirical.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.queueing._validate import (
    _array,
    _build,
    _build_from_spec,
    _check_rng,
    _first_bad,
    _integer,
    _Kind,
    _raise_if,
    _real,
)
from twin.kernel.queueing.bounds import MAX_ALPHA, MAX_COV, MAX_SIGMA


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

    def _check_mean(self, problems: list[Problem]) -> None:
        """Validate ``mean`` (s, finite, > 0) in place, as ``<name>.mean``."""
        object.__setattr__(self, "mean", _real(problems, f"{self.name}.mean", self.mean,
                                               gt=0.0, allowed=_MEAN_ALLOWED))


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
        self._check_mean(problems)
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
        self._check_mean(problems)
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
        self._check_mean(problems)
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
        self._check_mean(problems)
        object.__setattr__(
            self,
            "cov",
            _real(
                problems,
                "hyperexponential.cov",
                self.cov,
                ge=1.0,
                le=MAX_COV,
                allowed=f"a coefficient of variation in [1, {MAX_COV:g}] (use erlang for cov < 1)",
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
        self._check_mean(problems)
        object.__setattr__(
            self,
            "cov",
            _real(
                problems,
                "lognormal.cov",
                self.cov,
                gt=0.0,
                le=MAX_COV,
                allowed=f"a coefficient of variation in (0, {MAX_COV:g}]",
            ),
        )
        self._check(problems)

    @classmethod
    def from_log_params(cls, mu: float, sigma: float) -> Lognormal:
        """The lognormal with ``log S ~ Normal(mu, sigma^2)`` (``mu`` in log-seconds)."""
        problems: list[Problem] = []
        mu = _real(problems, "lognormal.mu", mu, allowed="a finite real (log of seconds)")
        sigma = _real(problems, "lognormal.sigma", sigma, gt=0.0, le=MAX_SIGMA,
                      allowed=f"a real in (0, {MAX_SIGMA:.4g}] (cov <= {MAX_COV:g})")
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
                le=MAX_ALPHA,
                allowed=f"a tail index in (1, {MAX_ALPHA:g}] (alpha <= 1 has an infinite mean; "
                "alpha <= 2 an infinite variance; above the bound the cov is below 1/alpha: "
                "use deterministic)",
            ),
        )
        self._check_mean(problems)
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
        x = rng.standard_exponential(size)
        np.divide(x, self.alpha, out=x)
        np.exp(x, out=x)
        np.multiply(x, self.scale, out=x)  # = scale * exp(E / alpha), in place
        return x

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


def service_from_spec(spec: Mapping[str, Any], path: str = "service") -> ServiceDistribution:
    """Build a service-time distribution from a mapping such as a scenario YAML section.

    ``spec`` is ``{"name": "pareto", "alpha": 1.8, "mean": 2.0e-7}`` (times in seconds), the
    inverse of :meth:`ServiceDistribution.to_dict`. Problems are reported under ``path``
    (e.g. ``devices.hbm.service.alpha``).
    """
    return _build_from_spec(_SERVICE_KINDS, "service-time distribution", _SERVICE_NAMES, spec,
                            path)
