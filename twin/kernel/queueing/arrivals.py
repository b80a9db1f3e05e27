"""Arrival processes (rates in 1/s, times in s): Poisson, deterministic, two-state MMPP; and
:func:`superpose`, which merges streams keeping a stream id per arrival.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.queueing._validate import (
    _RATE_ALLOWED,
    _TIMES_ALLOWED,
    _array,
    _build,
    _build_from_spec,
    _check_rng,
    _integer,
    _Kind,
    _raise_if,
    _real,
)


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
