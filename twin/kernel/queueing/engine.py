"""The FIFO engine: the Lindley recursion, vectorized over blocks of customers, and the
plain-Python reference it is validated against (times in seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.queueing._validate import (
    _TIMES_ALLOWED,
    _array,
    _first_bad,
    _integer,
    _raise_if,
    _real,
)

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
