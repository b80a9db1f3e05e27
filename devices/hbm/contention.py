"""What the accelerator agents use: the effective bandwidth of an op's stream next to k DMA
streams (:func:`effective_bandwidth`) and the cached slowdowns of :class:`HbmContention`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from devices.hbm.engine import simulate
from devices.hbm.requests import StreamSpec, generate_requests
from devices.hbm.result import HIT, HbmResult
from devices.hbm.spec import HbmSpec
from twin.kernel.errors import Problem, ScenarioError


@dataclass(frozen=True)
class EffectiveBandwidth:
    """What an op's memory stream gets from HBM, alone and next to k DMA streams.

    Attributes:
        contention: number of concurrent DMA streams (k).
        op_bandwidth_bytes_per_s: the op's achieved bandwidth on the whole device with k DMA
            streams, bytes/s.
        op_alone_bytes_per_s: the same with no DMA stream, bytes/s.
        slowdown: ``op_alone / op_bandwidth`` (>= 1 in practice): multiply the op's
            memory-bound time by it.
        op_mean_latency_s: mean latency of the op's requests with k DMA streams, s.
        op_p99_latency_s: 99th-percentile latency of the op's requests, s.
        op_row_hit_rate: the op's row-hit rate with k DMA streams.
        dma_bandwidth_bytes_per_s: bandwidth achieved by all DMA streams together, bytes/s.
        dma_window_bytes_per_s: per DMA stream (in order), the device bandwidth the controller
            gave it *while the op ran*: its bytes completed within the op's span (first
            arrival to last completion) over that span, bytes/s (the DMA share at this mix;
            the streams outlast the op, so their own span mixes in uncontended time).
    """

    contention: int
    op_bandwidth_bytes_per_s: float
    op_alone_bytes_per_s: float
    slowdown: float
    op_mean_latency_s: float
    op_p99_latency_s: float
    op_row_hit_rate: float
    dma_bandwidth_bytes_per_s: float
    dma_window_bytes_per_s: tuple[float, ...] = ()


def effective_bandwidth(
    spec: HbmSpec,
    stacks: int,
    op: StreamSpec,
    dma: Sequence[StreamSpec],
    rng: np.random.Generator,
    *,
    op_alone_bytes_per_s: float | None = None,
) -> EffectiveBandwidth:
    """Bandwidth the op's stream achieves on a device of ``stacks`` stacks next to ``dma``.

    Semantics: one stack is simulated with the op's stream and the DMA streams superposed
    (stream ids: op = 0, DMA = 1..k); stacks are identical and the address interleaving spreads
    every stream evenly over them, so device figures are the one-stack figures times
    ``stacks``. Stream rates (``rate_bytes_per_s``) and sizes are therefore *per stack*: divide
    a device-level DMA rate by ``stacks`` before passing it. The op's bandwidth is its bytes
    over its own first-arrival-to-last-completion span; the op should be large enough to
    overlap the DMA streams for its whole span (a backlogged op and rate-limited DMA streams
    that last at least as long is the intended use).

    Args:
        op_alone_bytes_per_s: the op's device bandwidth without contention if already known
            (otherwise it is simulated).
    """
    if stacks < 1:
        raise ScenarioError(Problem("stacks", "must be >= 1", stacks))
    op0 = replace(op, stream_id=0)
    dmas = [replace(d, stream_id=k + 1) for k, d in enumerate(dma)]
    res = simulate(spec, generate_requests(spec, rng, [op0, *dmas]))
    if op_alone_bytes_per_s is None:
        alone = res if not dmas else simulate(spec, generate_requests(spec, rng, [op0]))
        op_alone_bytes_per_s = stacks * _stream_bandwidth(alone, 0)
    m = res.requests.stream == 0
    lat = res.latency_s[m]
    op_bw = stacks * _stream_bandwidth(res, 0)
    dma_bw = 0.0
    window: tuple[float, ...] = ()
    if dmas and lat.size:
        t0 = float(res.requests.arrival_s[m].min())
        t1 = float(res.completion_s[m].max())
        done = res.completion_s
        inside = (done >= t0) & (done <= t1) & ~m
        counts = np.bincount(res.requests.stream[inside].astype(np.intp),
                             minlength=len(dmas) + 1)[1:len(dmas) + 1]
        if t1 > t0:
            window = tuple(float(stacks * c * spec.burst_bytes / (t1 - t0)) for c in counts)
    if dmas:
        md = ~m
        span = float(res.completion_s[md].max() - res.requests.arrival_s[md].min())
        dma_bw = stacks * int(md.sum()) * spec.burst_bytes / span if span > 0 else 0.0
    return EffectiveBandwidth(
        contention=len(dmas),
        op_bandwidth_bytes_per_s=op_bw,
        op_alone_bytes_per_s=float(op_alone_bytes_per_s),
        slowdown=float(op_alone_bytes_per_s) / op_bw if op_bw > 0 else math.inf,
        op_mean_latency_s=float(lat.mean()) if lat.size else float("nan"),
        op_p99_latency_s=float(np.quantile(lat, 0.99)) if lat.size else float("nan"),
        op_row_hit_rate=float(np.mean(res.kind[m] == HIT)) if lat.size else float("nan"),
        dma_bandwidth_bytes_per_s=dma_bw,
        dma_window_bytes_per_s=window,
    )


def _stream_bandwidth(res: HbmResult, sid: int) -> float:
    m = res.requests.stream == sid
    if not m.any():
        return 0.0
    span = float(res.completion_s[m].max() - res.requests.arrival_s[m].min())
    return int(m.sum()) * res.spec.burst_bytes / span if span > 0 else 0.0


@dataclass
class HbmContention:
    """Cached HBM slowdowns for accelerator agents: (op class, contention level) -> result.

    The first query for an op class key and a number k of concurrent DMA streams simulates
    one stack (see :func:`effective_bandwidth`) with ``k`` copies of ``dma_stream``; later
    queries with the same key and k return the cached :class:`EffectiveBandwidth`. Each cache
    entry draws from its own generator derived from ``rng`` (one draw at construction) and
    the key, so results do not depend on the order of queries. The op's stream for a key is
    fixed by the first query with that key.

    Attributes:
        spec: the stack.
        stacks: stacks on the device.
        rng: source of the base seed (one draw at construction).
        dma_stream: template of one DMA stream, per stack (e.g. a link's DMA rate / stacks).
    """

    spec: HbmSpec
    stacks: int
    rng: np.random.Generator
    dma_stream: StreamSpec
    _entropy: int = field(init=False, repr=False)
    _cache: dict[tuple[Hashable, int], EffectiveBandwidth] = field(
        init=False, repr=False, default_factory=dict)
    _ops: dict[Hashable, StreamSpec] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.stacks < 1:
            raise ScenarioError(Problem("stacks", "must be >= 1", self.stacks))
        self._entropy = int(self.rng.integers(0, 2**63 - 1))

    def _rng_for(self, key: Hashable, k: int) -> np.random.Generator:
        h = zlib.crc32(repr(key).encode("utf-8"))
        return np.random.Generator(np.random.PCG64(
            np.random.SeedSequence(self._entropy, spawn_key=(h, k))))

    def query(self, op_key: Hashable, op_stream: StreamSpec, k: int) -> EffectiveBandwidth:
        """Effective bandwidth of op class ``op_key`` next to ``k`` DMA streams (cached)."""
        if k < 0:
            raise ScenarioError(Problem("contention", "must be >= 0", k))
        key = (op_key, int(k))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        op = self._ops.setdefault(op_key, op_stream)
        alone_key = (op_key, 0)
        if alone_key not in self._cache:
            self._cache[alone_key] = effective_bandwidth(
                self.spec, self.stacks, op, [], self._rng_for(op_key, 0))
        alone = self._cache[alone_key]
        if k == 0:
            return alone
        res = effective_bandwidth(
            self.spec, self.stacks, op, [self.dma_stream] * k, self._rng_for(op_key, k),
            op_alone_bytes_per_s=alone.op_bandwidth_bytes_per_s)
        self._cache[key] = res
        return res

    def slowdown(self, op_key: Hashable, op_stream: StreamSpec, k: int) -> float:
        """Factor by which the op's memory time grows with ``k`` DMA streams (cached)."""
        return self.query(op_key, op_stream, k).slowdown

    def __len__(self) -> int:
        return len(self._cache)
