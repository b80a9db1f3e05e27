"""Memory requests as structure-of-arrays (:class:`HbmRequests`: one burst to one channel, bank
and row each) and :func:`generate_requests`, which superposes request streams (:class:`StreamSpec`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from devices.hbm.spec import HbmSpec
from twin.kernel.errors import Problem, ScenarioError


@dataclass(frozen=True, eq=False)
class HbmRequests:
    """Memory requests as parallel arrays; request ``i`` is one burst of ``burst_bytes``.

    Attributes:
        arrival_s: arrival time at the controller, s (float64, finite, >= 0).
        channel: pseudo-channel index in ``[0, spec.channels)`` (int32).
        bank: bank index in ``[0, spec.banks_per_channel)`` (int32).
        row: row index, >= 0 (int64).
        is_write: True for a write (bool).
        stream: stream id (int32; 0 when there is only one stream).
    """

    arrival_s: np.ndarray
    channel: np.ndarray
    bank: np.ndarray
    row: np.ndarray
    is_write: np.ndarray
    stream: np.ndarray

    @classmethod
    def from_arrays(
        cls,
        arrival_s: Any,
        channel: Any,
        bank: Any,
        row: Any,
        is_write: Any = None,
        stream: Any = None,
    ) -> HbmRequests:
        """Build from array-likes, coercing dtypes (missing ``is_write``/``stream`` -> 0)."""
        arr = np.ascontiguousarray(arrival_s, dtype=np.float64).reshape(-1)
        n = arr.shape[0]
        wr = (np.zeros(n, dtype=np.bool_) if is_write is None
              else np.ascontiguousarray(is_write, dtype=np.bool_).reshape(-1))
        st = (np.zeros(n, dtype=np.int32) if stream is None
              else np.ascontiguousarray(stream, dtype=np.int32).reshape(-1))
        return cls(
            arrival_s=arr,
            channel=np.ascontiguousarray(channel, dtype=np.int32).reshape(-1),
            bank=np.ascontiguousarray(bank, dtype=np.int32).reshape(-1),
            row=np.ascontiguousarray(row, dtype=np.int64).reshape(-1),
            is_write=wr,
            stream=st,
        )

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def validate(self, spec: HbmSpec) -> None:
        """Check shapes and ranges against ``spec``.

        Raises:
            ScenarioError: listing every problem, each naming the offending array.
        """
        n = len(self)
        problems: list[Problem] = []
        for name in ("channel", "bank", "row", "is_write", "stream"):
            m = getattr(self, name).shape[0]
            if m != n:
                problems.append(Problem(f"requests.{name}", "length differs from arrival_s",
                                        m, f"{n} entries"))
        if problems:
            raise ScenarioError(problems)
        if n == 0:
            return
        if not np.all(np.isfinite(self.arrival_s)) or float(self.arrival_s.min()) < 0.0:
            problems.append(Problem("requests.arrival_s", "arrival times must be finite and >= 0",
                                    float(np.nanmin(self.arrival_s)), "finite seconds >= 0"))
        for name, hi in (("channel", spec.channels), ("bank", spec.banks_per_channel)):
            a = getattr(self, name)
            lo_v, hi_v = int(a.min()), int(a.max())
            if lo_v < 0 or hi_v >= hi:
                problems.append(Problem(f"requests.{name}", "index out of range",
                                        lo_v if lo_v < 0 else hi_v, f"0 .. {hi - 1}"))
        if int(self.row.min()) < 0:
            problems.append(Problem("requests.row", "row index must be >= 0",
                                    int(self.row.min()), "0 or more"))
        if problems:
            raise ScenarioError(problems)


@dataclass(frozen=True)
class StreamSpec:
    """One request stream to superpose with others in :func:`generate_requests`.

    Attributes:
        n_requests: number of bursts; or give ``nbytes`` (rounded up to whole bursts).
        nbytes: bytes to move, alternative to ``n_requests``.
        arrival: ``"backlogged"`` (every request present at ``start_s``: a saturating, closed
            source), ``"poisson"`` (exponential inter-arrival times) or ``"periodic"``.
        rate_bytes_per_s: offered load of the stream over the whole stack, bytes/s (required
            for ``poisson`` and ``periodic``).
        read_fraction: probability that a request is a read, in [0, 1].
        row_locality: probability that a request goes to the same (channel, bank, row) as the
            stream's previous request; otherwise the stream jumps to a new location. Runs in a
            row are therefore geometric with mean ``1 / (1 - row_locality)`` requests, all in
            one bank (so their column commands are spaced by at least tCCD_L).
        interleave: where a jump goes. ``"sequential"``: the next channel (round robin from a
            random start), moving to the next bank after a sweep of all channels, random row;
            ``"random"``: uniformly random channel, bank and row.
        start_s: time of the first arrival, s.
        stream_id: id recorded in :attr:`HbmRequests.stream` (default: position in the list).
    """

    n_requests: int | None = None
    nbytes: int | None = None
    arrival: Literal["backlogged", "poisson", "periodic"] = "backlogged"
    rate_bytes_per_s: float | None = None
    read_fraction: float = 1.0
    row_locality: float = 0.0
    interleave: Literal["sequential", "random"] = "sequential"
    start_s: float = 0.0
    stream_id: int | None = None

    def count(self, spec: HbmSpec) -> int:
        """Number of requests (bursts) of this stream."""
        if self.n_requests is not None:
            return int(self.n_requests)
        return -(-int(self.nbytes or 0) // spec.burst_bytes)

    def problems(self, where: str) -> list[Problem]:
        """What is wrong with this stream description (empty if nothing)."""
        out: list[Problem] = []
        if (self.n_requests is None) == (self.nbytes is None):
            out.append(Problem(where, "give exactly one of n_requests and nbytes",
                               (self.n_requests, self.nbytes)))
        for name in ("n_requests", "nbytes"):
            v = getattr(self, name)
            if v is not None and v < 0:
                out.append(Problem(f"{where}.{name}", "must be >= 0", v))
        if self.arrival not in ("backlogged", "poisson", "periodic"):
            out.append(Problem(f"{where}.arrival", "unknown arrival process", self.arrival,
                               "backlogged, poisson, periodic"))
        if self.arrival != "backlogged" and not (
            self.rate_bytes_per_s is not None and self.rate_bytes_per_s > 0
        ):
            out.append(Problem(f"{where}.rate_bytes_per_s",
                               f"a {self.arrival} stream needs a rate > 0",
                               self.rate_bytes_per_s, "bytes/s > 0"))
        for name in ("read_fraction", "row_locality"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                out.append(Problem(f"{where}.{name}", "must be a probability", v, "0 .. 1"))
        if self.row_locality >= 1.0:
            out.append(Problem(f"{where}.row_locality", "must be < 1 (a stream must move on)",
                               self.row_locality, "0 .. 1 (exclusive)"))
        if self.interleave not in ("sequential", "random"):
            out.append(Problem(f"{where}.interleave", "unknown interleaving", self.interleave,
                               "sequential, random"))
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            out.append(Problem(f"{where}.start_s", "must be finite and >= 0", self.start_s))
        return out


def _one_stream(
    spec: HbmSpec, s: StreamSpec, n: int, rng: np.random.Generator, rows: int
) -> tuple[np.ndarray, ...]:
    if s.arrival == "backlogged":
        arr = np.full(n, s.start_s, dtype=np.float64)
    else:
        rate = float(s.rate_bytes_per_s or 0.0) / spec.burst_bytes  # requests/s
        if s.arrival == "poisson":
            arr = s.start_s + np.cumsum(rng.exponential(1.0 / rate, size=n))
        else:
            arr = s.start_s + np.arange(n, dtype=np.float64) / rate
    jump = rng.random(n) >= s.row_locality
    if n:
        jump[0] = True
    run = np.cumsum(jump) - 1
    n_runs = int(run[-1]) + 1 if n else 0
    n_ch, n_bk = spec.channels, spec.banks_per_channel
    if s.interleave == "random":
        ch_r = rng.integers(0, n_ch, size=n_runs)
        bk_r = rng.integers(0, n_bk, size=n_runs)
    else:
        k = np.arange(n_runs, dtype=np.int64)
        c0 = int(rng.integers(0, n_ch))
        b0 = int(rng.integers(0, n_bk))
        ch_r = (c0 + k) % n_ch
        bk_r = (b0 + (c0 + k) // n_ch) % n_bk
    row_r = rng.integers(0, rows, size=n_runs)
    is_write = rng.random(n) >= s.read_fraction
    return arr, ch_r[run], bk_r[run], row_r[run], is_write


def generate_requests(
    spec: HbmSpec,
    rng: np.random.Generator,
    streams: Sequence[StreamSpec],
    *,
    rows_per_bank: int = 1 << 14,
) -> HbmRequests:
    """Superpose request streams on one stack.

    Requests are ordered by arrival time; equal arrival times are ordered by the position
    within their stream, then by stream id, so backlogged streams interleave round robin. The
    request index (the FR-FCFS tie breaker) is the position in this order.

    Args:
        spec: the stack.
        rng: the only source of randomness.
        streams: the streams (see :class:`StreamSpec`).
        rows_per_bank: rows to draw from when a stream jumps (a jump lands on the open row of
            its bank only by chance, with probability about 1/rows_per_bank).

    Raises:
        ScenarioError: naming every bad stream field (``streams[i].<field>``).
    """
    problems: list[Problem] = []
    if not streams:
        problems.append(Problem("streams", "at least one stream is needed"))
    for i, s in enumerate(streams):
        problems.extend(s.problems(f"streams[{i}]"))
    if rows_per_bank < 1:
        problems.append(Problem("rows_per_bank", "must be >= 1", rows_per_bank))
    if problems:
        raise ScenarioError(problems)
    parts = []
    for i, s in enumerate(streams):
        n = s.count(spec)
        arr, ch, bk, row, wr = _one_stream(spec, s, n, rng, rows_per_bank)
        sid = i if s.stream_id is None else s.stream_id
        parts.append((arr, ch, bk, row, wr, np.full(n, sid, dtype=np.int32),
                      np.arange(n, dtype=np.int64)))
    cols = [np.concatenate([p[j] for p in parts]) for j in range(7)]
    if len(parts) > 1:
        order = np.lexsort((cols[5], cols[6], cols[0]))
        cols = [c[order] for c in cols]
    return HbmRequests.from_arrays(cols[0], cols[1], cols[2], cols[3], cols[4], cols[5])
