"""The outcome of a simulation (:class:`HbmResult`): completion time and kind (:data:`HIT`,
:data:`MISS`, :data:`CONFLICT`) of every request, and aggregates computed on first access.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from devices.hbm.requests import HbmRequests
from devices.hbm.spec import _NS, HbmSpec

HIT = 0
"""Request kind: its row was open when its column command was issued, no ACT/PRE for it."""
MISS = 1
"""Request kind: an ACT (but no PRE) was issued on its behalf."""
CONFLICT = 2
"""Request kind: a PRE (then an ACT) was issued on its behalf."""




@dataclass(frozen=True, eq=False)
class HbmResult:
    """Outcome of a simulation: per-request arrays plus aggregates (computed on first access).

    Attributes:
        spec: the stack simulated.
        requests: the input requests.
        completion_s: time the request's data burst ended, s.
        kind: :data:`HIT`, :data:`MISS` or :data:`CONFLICT` per request (int8).
        refresh: whether refresh was simulated.
    """

    spec: HbmSpec
    requests: HbmRequests
    completion_s: np.ndarray
    kind: np.ndarray
    refresh: bool = True

    @cached_property
    def latency_s(self) -> np.ndarray:
        """Completion minus arrival, s (includes the wait outside a full queue)."""
        return self.completion_s - self.requests.arrival_s

    @property
    def n_requests(self) -> int:
        """Number of requests."""
        return len(self.requests)

    @property
    def total_bytes(self) -> int:
        """Bytes moved, bytes."""
        return self.n_requests * self.spec.burst_bytes

    @cached_property
    def makespan_s(self) -> float:
        """Last completion minus first arrival, s (0 for no requests)."""
        if self.n_requests == 0:
            return 0.0
        return float(self.completion_s.max() - self.requests.arrival_s.min())

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Achieved bandwidth, bytes/s: total bytes over the makespan."""
        return self.total_bytes / self.makespan_s if self.makespan_s > 0 else 0.0

    @cached_property
    def _kind_counts(self) -> np.ndarray:
        return np.bincount(self.kind.astype(np.intp), minlength=3)[:3]

    @property
    def row_hit_rate(self) -> float:
        """Fraction of requests that were row hits."""
        return float(self._kind_counts[HIT]) / max(self.n_requests, 1)

    @property
    def row_miss_rate(self) -> float:
        """Fraction of requests that found their bank closed."""
        return float(self._kind_counts[MISS]) / max(self.n_requests, 1)

    @property
    def row_conflict_rate(self) -> float:
        """Fraction of requests that needed a precharge."""
        return float(self._kind_counts[CONFLICT]) / max(self.n_requests, 1)

    @property
    def mean_latency_s(self) -> float:
        """Mean latency, s."""
        return float(self.latency_s.mean()) if self.n_requests else float("nan")

    @cached_property
    def p99_latency_s(self) -> float:
        """99th-percentile latency (linear interpolation), s."""
        return float(np.quantile(self.latency_s, 0.99)) if self.n_requests else float("nan")

    @cached_property
    def refresh_fraction(self) -> float:
        """Share of [0, last completion] covered by refresh windows (0 without refresh)."""
        if not self.refresh or self.n_requests == 0:
            return 0.0
        end = float(self.completion_s.max())
        if end <= 0:
            return 0.0
        refi, rfc = self.spec.tREFI_ns * _NS, self.spec.tRFC_ns * _NS
        k = math.floor(end / refi)
        covered = max(k - 1, 0) * rfc + (min(rfc, end - k * refi) if k >= 1 else 0.0)
        return covered / end

    def per_stream(self) -> pd.DataFrame:
        """One row per stream id: requests, bytes, bandwidth_bytes_per_s (stream bytes over
        the stream's own first-arrival-to-last-completion span), mean/p99 latency (s) and
        row_hit_rate."""
        rows = []
        st = self.requests.stream
        for sid in np.unique(st):
            m = st == sid
            lat = self.latency_s[m]
            span = float(self.completion_s[m].max() - self.requests.arrival_s[m].min())
            nb = int(m.sum()) * self.spec.burst_bytes
            rows.append({
                "stream": int(sid),
                "requests": int(m.sum()),
                "bytes": nb,
                "bandwidth_bytes_per_s": nb / span if span > 0 else 0.0,
                "mean_latency_s": float(lat.mean()),
                "p99_latency_s": float(np.quantile(lat, 0.99)),
                "row_hit_rate": float(np.mean(self.kind[m] == HIT)),
            })
        return pd.DataFrame(rows, columns=["stream", "requests", "bytes",
                                           "bandwidth_bytes_per_s", "mean_latency_s",
                                           "p99_latency_s", "row_hit_rate"])

    def summary(self) -> dict[str, float]:
        """Aggregates as a flat dict (SI units)."""
        return {
            "requests": float(self.n_requests),
            "bytes": float(self.total_bytes),
            "makespan_s": self.makespan_s,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "row_hit_rate": self.row_hit_rate,
            "row_miss_rate": self.row_miss_rate,
            "row_conflict_rate": self.row_conflict_rate,
            "mean_latency_s": self.mean_latency_s,
            "p99_latency_s": self.p99_latency_s,
            "refresh_fraction": self.refresh_fraction,
        }
