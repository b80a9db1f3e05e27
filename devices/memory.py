"""HBM contention between compute kernels and communication DMA (the ``memory`` section).

While a rank class's communication stream moves data (a gradient all-reduce, a pipeline
send), the transfer's DMA traffic reads and writes the same HBM that the compute kernels
stream through. This module turns "``k`` transfers in flight on this device" into a factor
on a compute block's memory time, with the scenario's ``memory.model``:

``roofline`` (default)
    Today's behaviour: memory time = bytes / achievable bandwidth, no contention.

``frfcfs``
    The FR-FCFS controller of :mod:`devices.hbm` (banks, row buffers, refresh) simulates one
    stack of the device's HBM part (``cluster.device.hbm_type``, ``hbm_stacks`` stacks) with
    the op's request stream and ``k`` DMA streams (:func:`devices.hbm.effective_bandwidth`).

``queue``
    The controller as one single-server FIFO queue (:mod:`twin.kernel.queueing`, Lindley engine)
    with a named service-time distribution (``memory.service``).

The op and its memory phase
---------------------------
The roofline's memory time of a kernel, ``t_mem = bytes / M``, is the time its data takes at
the achievable bandwidth ``M = memory_efficiency x peak``. During that phase the op's
requests arrive at ``M``: its utilization of the *peak* bandwidth is
``op_load = memory.op.load`` (default: the device's ``memory_efficiency``, 0.9 on an H100).
The peak, not ``M``, is the server's capacity: a memory-bound kernel alone then loads the
controller to 0.9, a stable queue, and the gap between achievable and peak is the headroom
concurrent DMA eats. Requests of many SMs (and DMA engines) superpose into a nearly Poisson
stream (Palm-Khintchine), so both the op's and the DMA's requests arrive as Poisson streams.

DMA streams (how a transfer becomes memory traffic)
----------------------------------------------------
One transfer in flight on a device (counted by ``workloads.executor`` per rank class: a
data-parallel collective on every participating class, a pipeline send on the sending and the
receiving classes) is one DMA stream of
``rate = memory.dma.rate_gbps`` or, by default,
``cluster.link.bandwidth_gbps x efficiency x links_per_edge x memory.dma.hbm_bytes_per_link_byte``
bytes/s: a ring step sends on one edge and receives on another at the link's injection rate,
reading the outgoing and writing the incoming bytes (``hbm_bytes_per_link_byte = 2``). A
one-directional pipeline send touches each end's HBM once, so it is overestimated up to 2x
(pipeline sends are short next to gradient all-reduces). Its load on the controller is
``dma_load = rate / peak`` per stream (0.049 for an H100 with 4 NVLink4 links per edge).
``k`` is read when a block starts and holds for the whole block; ``k > memory.max_streams``
is clipped (and reported).

Slowdown of one op (both models)
--------------------------------
A *batch* is the op's requests, ``n`` of them, at its demanded rate, superposed with ``k``
DMA streams that last as long as the op's arrivals; the same batch is also simulated alone
(common random numbers: the op's arrivals and services, and the first ``j`` DMA streams, are
identical at every ``k >= j``). ``memory.bound`` says what the op's memory time is:

* ``bandwidth`` (default; a streaming kernel): the completion of its last request, relative
  to running alone: ``s = (last completion - first arrival)_k / (same)_0``;
* ``latency`` (a kernel with a fixed number of requests in flight, which by Little's law
  moves ``L / E[sojourn]`` requests per second): ``s = mean sojourn_k / mean sojourn_0``.

The queue model's server is one pseudo-channel: requests interleave evenly over
``stacks x channels`` pseudo-channels, so each is the same single-server queue carrying
``1/C`` of every stream; its mean service time is one burst at the channel's share of the
peak, ``burst_bytes x C / peak`` (1.53 ns on an H100), and an op of ``B`` bytes puts
``n = B / (burst_bytes x C)`` requests on it. The FR-FCFS model simulates one stack (``n =
B / (burst_bytes x stacks)``). ``n`` is rounded up to a power of two, at least 16 and at most
``memory.requests_per_batch`` (4096 by default: large ops are represented by a window of
that many requests; the fluid part of the slowdown does not depend on ``n``, the queueing
fluctuation shrinks with it, so the cap errs on the slow side).

Caching and per-op cost
-----------------------
Per op class (request count ``n``) and contention level ``k``, ``memory.batches``
independent batches are simulated once; their slowdowns are the class's empirical
distribution. Every executed block draws one of them with its rank class's generator
(``rng.integers``: a dict lookup and one draw per block). Each (class, k) entry has its own
generator derived from the run's seed and the key, so results do not depend on the order in
which entries are first needed. A run never recomputes an identical batch.

Heavy tails
-----------
For every contention level used, the queue model also runs one long stationary queue
(``2**18`` requests) through :func:`twin.kernel.queueing.analyze_queue`: its status (``converged``,
``unstable`` for rho >= 1, ``infinite_variance`` for a service tail index <= 2 such as Pareto
alpha 1.8, ``uncertain_tail``, ``not_settled``), mean wait with standard error, Hill tail
index and warnings go into the run's summary (``memory_*`` keys). A mean slowdown is then
labelled a sample mean of this finite run, never a converged value. Note that in the
``bandwidth`` view a finite batch's completion has a finite mean even for alpha <= 2 (only
its variance is infinite): the divergence of M/G/1 waits shows up in ``latency``-bound ops.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from devices.memory_results import LevelReport, SlowdownTable, roofline_report
from devices.memory_spec import (
    _MIN_REQUESTS,
    SERVICE_SHAPES,
    Bound,
    DmaSpec,
    MemorySpec,
    Mix,
    OpSpec,
    ServiceSpec,
    _flat,
    as_mix,
    dma_rate_bytes_per_s,
    latency_bound,
)
from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.queueing import (
    PoissonArrivals,
    ServiceDistribution,
    analyze_queue,
    batch_means,
    fifo_queue,
)

__all__ = [
    "SERVICE_SHAPES",
    "DmaSpec",
    "FrfcfsContention",
    "LevelReport",
    "MemoryContention",
    "MemorySpec",
    "Mix",
    "OpSpec",
    "QueueContention",
    "ServiceSpec",
    "SlowdownTable",
    "as_mix",
    "build_memory_model",
    "dma_rate_bytes_per_s",
    "latency_bound",
    "roofline_report",
]

_DIAGNOSTIC_REQUESTS = 1 << 18


# ============================================================================ base model
@dataclass
class MemoryContention(ABC):
    """Cached slowdown distributions plus run statistics (abstract base of the two models:
    they supply :meth:`_simulate` and :meth:`_diagnose`).

    Attributes:
        op_load: utilization of the peak bandwidth by the op's memory phase.
        dma_load: utilization of the peak bandwidth by one DMA stream.
        bytes_per_request: device bytes behind one request of a batch (bytes).
        bound: ``bandwidth`` or ``latency`` (module docstring).
        requests_per_batch: largest batch, requests.
        batches: batches per (op class, k).
        max_streams: largest k; more are clipped.
        entropy: root of every batch's generator (one integer from the run's seed).
    """

    op_load: float
    dma_load: float
    bytes_per_request: float
    bound: Bound = "bandwidth"
    h2d_load: float = 0.0
    requests_per_batch: int = 4096
    batches: int = 32
    max_streams: int = 16
    entropy: int = 0
    name: str = field(default="", init=False)
    _tables: dict[tuple[int, int], SlowdownTable] = field(default_factory=dict, init=False,
                                                          repr=False)
    _bucket: dict[Hashable, int] = field(default_factory=dict, init=False, repr=False)
    _levels: dict[int, LevelReport] = field(default_factory=dict, init=False, repr=False)
    _weight: dict[int, float] = field(default_factory=lambda: defaultdict(float), init=False,
                                      repr=False)
    _sum: dict[int, float] = field(default_factory=lambda: defaultdict(float), init=False,
                                   repr=False)
    _max: float = field(default=1.0, init=False, repr=False)
    _clipped: float = field(default=0.0, init=False, repr=False)
    # (n, mix) -> [batch, stream] device bandwidth each stream got while the op ran, B/s
    _windows: dict[tuple[int, Mix], np.ndarray] = field(default_factory=dict, init=False,
                                                        repr=False)
    _caps: dict[Mix, tuple[float, float]] = field(default_factory=dict, init=False,
                                                  repr=False)

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        if not 0.0 < self.op_load <= 1.0:
            problems.append(Problem("memory.op.load", "must be in (0, 1]", self.op_load,
                                    "a fraction of the peak HBM bandwidth"))
        if not self.dma_load > 0.0:
            problems.append(Problem("memory.dma.rate_gbps", "gives no DMA load", self.dma_load,
                                    "a positive rate"))
        if self.bound not in ("bandwidth", "latency", "auto"):
            problems.append(Problem("memory.bound", "unknown bound", self.bound,
                                    "bandwidth, latency, auto"))
        if self.requests_per_batch < _MIN_REQUESTS:
            problems.append(Problem("memory.requests_per_batch", "too small",
                                    self.requests_per_batch, f">= {_MIN_REQUESTS}"))
        if self.batches < 2:
            problems.append(Problem("memory.batches", "too few", self.batches, ">= 2"))
        if problems:
            raise ScenarioError(problems)

    # ------------------------------------------------------------------ classes and draws
    def rho(self, k: int | Mix) -> float:
        """Offered load on the peak bandwidth with ``k`` DMA streams (or a :data:`Mix`)."""
        net, h2d = as_mix(k)
        return self.op_load + net * self.dma_load + h2d * self.h2d_load

    def loads(self, k: int | Mix) -> list[float]:
        """Load of every stream beside the op: the network DMA streams, then the copies."""
        net, h2d = as_mix(k)
        return [self.dma_load] * net + [self.h2d_load] * h2d

    @property
    def saturation_streams(self) -> float:
        """Streams at which the offered load reaches the peak: ``(1 - op_load) / dma_load``."""
        return (1.0 - self.op_load) / self.dma_load

    def requests_for(self, nbytes: float) -> int:
        """Op class of an op moving ``nbytes``: its batch size in requests (power of two,
        clipped to ``[16, requests_per_batch]``)."""
        n = max(1.0, float(nbytes) / self.bytes_per_request)
        p = 1 << max(0, math.ceil(math.log2(n)))
        return int(min(self.requests_per_batch, max(_MIN_REQUESTS, p)))

    def table(self, n_requests: int, k: int | Mix) -> SlowdownTable:
        """Slowdown distribution of ``n_requests``-request ops next to ``k`` streams (cached)."""
        key = (int(n_requests), as_mix(k))
        tab = self._tables.get(key)
        if tab is None:
            if sum(key[1]) == 0:
                samples = np.ones(self.batches)
            else:
                samples = np.asarray(self._simulate(key[0], key[1]), dtype=np.float64)
            samples.setflags(write=False)
            tab = self._tables[key] = SlowdownTable(key[0], sum(key[1]), samples, key[1])
        return tab

    def draw(self, nbytes: float, k: int | Mix, rng: np.random.Generator, weight: float = 1.0,
             key: Hashable | None = None, count: int = 1) -> float | list[float]:
        """Slowdown of one executed op moving ``nbytes`` next to ``k`` transfers.

        Draws one batch of the op class's cached distribution with ``rng``; records the draw
        (``weight``: devices the op stands for). ``key`` (e.g. the block's id) caches the op
        class so ``nbytes`` is not re-classified on every call. ``count`` > 1: that many
        draws, each recorded, in one call of ``rng`` (the same numbers as ``count`` calls),
        returned as a list (one per member of a group that runs the op side by side).
        """
        k = self.clip(k, weight * count)
        if k == (0, 0):
            self.record((0, 0), 1.0, weight * count)
            return 1.0 if count == 1 else [1.0] * count
        self._weight[k] += weight * count
        n = self._bucket.get(key) if key is not None else None
        if n is None:
            n = self.requests_for(nbytes)
            if key is not None:
                self._bucket[key] = n
        tab = self._tables.get((n, k))
        if tab is None:
            tab = self.table(n, k)
        vals = tab.values
        if count == 1:
            s = vals[rng.integers(len(vals))]
            self._sum[k] += weight * s
            if s > self._max:
                self._max = s
            return s
        # a handful of draws: Python floats beat NumPy's per-call cost
        v = [vals[i] for i in rng.integers(len(vals), size=count)]
        self._sum[k] += weight * sum(v)
        self._max = max(self._max, *v)
        return v

    def clip(self, k: int | Mix, weight: float = 1.0) -> Mix:
        """The mix simulated for ``k``: at most ``max_streams`` streams (network first).
        ``weight`` is added to the count of clipped blocks (0: a lookup that is no block)."""
        net, h2d = as_mix(k)
        if net + h2d > self.max_streams:
            self._clipped += weight
            net = min(net, self.max_streams)
            h2d = self.max_streams - net
        return net, h2d

    def record(self, k: Mix, s: float, weight: float) -> None:
        """Account one executed op of slowdown ``s`` at level ``k`` (already clipped)."""
        self._weight[k] += weight
        self._sum[k] += weight * s
        if s > self._max:
            self._max = s

    def record_many(self, k: Mix, s: list[float], weight: float) -> None:
        """:meth:`record` of several ops of one level, each of weight ``weight``."""
        self._weight[k] += weight * len(s)
        self._sum[k] += weight * sum(s)
        self._max = max(self._max, *s)

    def request_class(self, block) -> int:
        """:meth:`requests_for` a ``workloads.transformer.Block``'s bytes (cached by id, as
        :meth:`draw_block` classifies it)."""
        n = self._bucket.get(id(block))
        if n is None:
            n = self._bucket[id(block)] = self.requests_for(block.bytes)
        return n

    def draw_block(self, block, k: int | Mix, rng: np.random.Generator,
                   weight: float = 1.0, count: int = 1) -> float | list[float]:
        """:meth:`draw` for a ``workloads.transformer.Block`` (its :meth:`request_class`)."""
        self.request_class(block)
        return self.draw(0.0, k, rng, weight, id(block), count)

    # ------------------------------------------------------------------ transfers
    @abstractmethod
    def offered_bytes_per_s(self) -> tuple[float, float]:
        """HBM traffic one network DMA stream and one copy stream offer, bytes/s."""

    def dma_caps(self, k: int | Mix) -> tuple[float, float]:
        """What the controller gives the transfers beside a running op at mix ``k``:
        ``(all network DMA streams together, one copy stream)``, bytes/s of HBM traffic, or
        ``inf`` where it serves what they offer.

        From the op class of ``requests_per_batch`` requests (the longest window, so the
        most DMA requests counted), over the ``batches`` batches the op's slowdown table is
        made of (the same runs, common random numbers): a stream's bandwidth is its bytes
        completed while the op ran over the op's span. A kind is capped only when the mean
        over batches is below what it offers (:meth:`offered_bytes_per_s`) by more than 3 standard
        errors: below saturation the counts only fluctuate around the offered rate, and a
        cap from that noise would slow transfers the controller does not slow. Cached per
        mix (``memory.max_streams`` clips as for blocks).
        """
        mix = as_mix(k)
        hit = self._caps.get(mix)
        if hit is not None:
            return hit
        net, h2d = mix
        caps = [math.inf, math.inf]
        if net + h2d > 0:
            n = self.requests_per_batch
            self.table(n, mix)
            win = self._windows[(n, mix)]
            offered = self.offered_bytes_per_s()
            for j, (lo, hi, rate) in enumerate(((0, net, offered[0]),
                                                (net, net + h2d, offered[1]))):
                if hi == lo:
                    continue
                got = win[:, lo:hi].sum(axis=1) / (hi - lo)  # per stream of the kind
                mean = float(got.mean())
                se = float(got.std(ddof=1) / math.sqrt(got.size))
                # mean 0: no request of the kind completed in any window (a trickle that
                # offered none in the op's span): nothing measured, and it is served in full
                if 0.0 < mean and mean + 3.0 * se < rate:
                    caps[j] = mean * (hi - lo) if j == 0 else mean
        hit = self._caps[mix] = (caps[0], caps[1])
        return hit

    # ------------------------------------------------------------------ diagnostics
    def level(self, k: int | Mix) -> LevelReport:
        """Diagnostics of contention level ``k`` (cached)."""
        k = as_mix(k)
        rep = self._levels.get(k)
        if rep is None:
            rep = self._levels[k] = self._diagnose(k)
        return rep

    def report(self) -> dict[str, Any]:
        """Summary keys (``memory_*``) of the draws made so far, with diagnostics per level."""
        w = sum(self._weight.values())
        levels = [self.level(k).to_dict() | {
            "blocks": self._weight[k],
            "slowdown_mean": self._sum[k] / self._weight[k] if self._weight[k] else 1.0}
            for k in sorted(self._weight) if self._weight[k] > 0]
        warnings: list[str] = []
        for lv in levels:
            warnings += [f"k={lv['k']}{'' if not lv['h2d'] else ' (' + str(lv['h2d']) + ' h2d)'} "
                         f"(rho={lv['rho']:.3g}): {m}" for m in lv["warnings"]]
        if self._clipped:
            warnings.append(f"{self._clipped:g} block(s) ran next to more than max_streams = "
                            f"{self.max_streams} transfers and were simulated at k = "
                            f"{self.max_streams}")
        converged = all(lv["converged"] for lv in levels)
        mean = sum(self._sum.values()) / w if w else 1.0
        contended = sum(v for k, v in self._weight.items() if sum(k) > 0)
        return {
            "memory_model": self.name,
            "memory_bound": self.bound,
            "memory_slowdown_mean": mean,
            "memory_slowdown_is": ("exact (no block ran next to a transfer)" if not contended
                                   else "estimate (every contention level converged)"
                                   if converged else
                                   "sample mean of this finite run only (not converged)"),
            "memory_slowdown_max": self._max,
            "memory_contended_fraction": contended / w if w else 0.0,
            "memory_max_transfers": max((sum(k) for k, v in self._weight.items() if v > 0),
                                        default=0),
            "memory_converged": converged,
            "memory_variance_infinite": any(lv["variance_infinite"] for lv in levels),
            "memory_unstable": any(lv["unstable"] for lv in levels),
            "memory_warnings": warnings,
            "memory_levels": levels,
        }

    # ------------------------------------------------------------------ per model
    @abstractmethod
    def _simulate(self, n: int, k: Mix) -> list[float]:
        """Slowdowns of ``batches`` batches of ``n`` op requests next to ``k`` streams."""

    @abstractmethod
    def _diagnose(self, k: Mix) -> LevelReport:
        """Diagnostics of contention level ``k``."""

    def _rng(self, *key) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(
            np.random.SeedSequence(self.entropy, spawn_key=_flat(key))))


# ============================================================================ queue model
@dataclass
class QueueContention(MemoryContention):
    """Single-server FIFO model of one pseudo-channel (module docstring).

    Attributes:
        service: service-time distribution with mean :attr:`service_mean_s` (s).
        diagnostic_requests: requests in each level's stationary diagnostic run.
    """

    service: ServiceDistribution | None = None
    diagnostic_requests: int = _DIAGNOSTIC_REQUESTS
    _alone: dict[tuple, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.service is None:
            raise ScenarioError(Problem("memory.service", "is required by the queue model"))
        self.name = "queue"

    @property
    def service_mean_s(self) -> float:
        """Mean service time of one request, s."""
        return float(self.service.mean)

    @property
    def op_rate(self) -> float:
        """Arrival rate of the op's requests during its memory phase, 1/s."""
        return self.op_load / self.service_mean_s

    @property
    def dma_rate(self) -> float:
        """Arrival rate of one DMA stream's requests, 1/s."""
        return self.dma_load / self.service_mean_s

    def stream_rates(self, k: int | Mix) -> list[float]:
        """Arrival rate of every stream beside the op, 1/s (network DMA, then copies)."""
        return [x / self.service_mean_s for x in self.loads(k)]

    def _op_batch(self, n: int, r: int) -> tuple:
        """Arrivals, services, alone completion span and alone mean sojourn of batch r."""
        hit = self._alone.get((n, r))
        if hit is None:
            g = self._rng(0, n, r, 0)
            arr = PoissonArrivals(self.op_rate).sample(g, n)
            srv = self.service.sample(g, n)
            res = fifo_queue(arr, srv)
            dep = res.departures
            hit = (arr, srv, float(dep.max() - arr[0]), float(res.sojourns.mean()))
            self._alone[(n, r)] = hit
        return hit

    def _dma(self, n: int, r: int, j: int, t_end: float,
             rate: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        g = self._rng(0, n, r, j)
        arr = PoissonArrivals(self.dma_rate if rate is None else rate).sample_until(g, t_end)
        return arr, self.service.sample(g, arr.size)

    def offered_bytes_per_s(self) -> tuple[float, float]:
        """HBM traffic of one network DMA stream and one copy stream: their loads times the
        peak (one request's device bytes per mean service time), bytes/s."""
        peak = self.bytes_per_request / self.service_mean_s
        return self.dma_load * peak, self.h2d_load * peak

    def batch(self, n: int, k: int | Mix, r: int) -> tuple[float, np.ndarray]:
        """Slowdown of batch ``r`` of ``n`` op requests next to ``k`` streams, and the waits
        of the op's requests (s), in arrival order. Network stream ``j`` (1-based) and copy
        stream ``j`` have their own generators, the same at every level that has them."""
        s, waits, _win = self.batch_windows(n, k, r)
        return s, waits

    def batch_windows(self, n: int, k: int | Mix,
                      r: int) -> tuple[float, np.ndarray, np.ndarray]:
        """:meth:`batch` and the device bandwidth each stream beside the op got while it
        ran (its requests departing within the op's span, times the request's device bytes,
        over that span; network streams, then copies), bytes/s."""
        arr, srv, span0, soj0 = self._op_batch(n, r)
        t_end = float(arr[-1])  # later DMA arrivals never overtake an op request (FIFO)
        parts_a, parts_s = [arr], [srv]
        net, h2d = as_mix(k)
        for j, rate in [(j, self.dma_rate) for j in range(1, net + 1)] + [
                (1000 + j, self.h2d_load / self.service_mean_s) for j in range(1, h2d + 1)]:
            a, s = self._dma(n, r, j, t_end, rate)
            parts_a.append(a)
            parts_s.append(s)
        times = np.concatenate(parts_a)
        order = np.argsort(times, kind="stable")  # ties: the op first, then stream order
        res = fifo_queue(times[order], np.concatenate(parts_s)[order])
        is_op = order < n
        dep = res.departures[is_op]
        waits = res.waits[is_op]
        if self.bound == "bandwidth":
            s = float(dep.max() - arr[0]) / span0
        else:
            s = float(res.sojourns[is_op].mean()) / soj0
        t0, t1 = float(arr[0]), float(dep.max())
        owner = np.repeat(np.arange(len(parts_a)), [a.size for a in parts_a])[order]
        all_dep = res.departures
        inside = (all_dep >= t0) & (all_dep <= t1) & (owner > 0)
        counts = np.bincount(owner[inside], minlength=len(parts_a))[1:]
        win = counts * self.bytes_per_request / (t1 - t0) if t1 > t0 else np.zeros(len(counts))
        return s, waits, win

    def _simulate(self, n: int, k: Mix) -> list[float]:
        out = [self.batch_windows(n, k, r) for r in range(self.batches)]
        self._windows[(n, k)] = np.array([w for _s, _w, w in out], dtype=float).reshape(
            self.batches, sum(k))
        return [s for s, _w, _win in out]

    def alone_sojourn(self, n: int) -> float:
        """Mean sojourn (s) of an ``n``-request op alone, over the cached alone batches."""
        return float(np.mean([self._op_batch(n, r)[3] for r in range(self.batches)]))

    def fresh_latency(self, n: int, k: int | Mix, rng: np.random.Generator) -> float:
        """Slowdown of one latency-bound op drawn afresh (not from a table): the mean sojourn
        of its ``n`` requests next to ``k`` streams, over the mean alone sojourn. Every op
        sees its own sample of the queue's sojourn-time tail (``memory.bound: auto``)."""
        arr = PoissonArrivals(self.op_rate).sample(rng, n)
        parts_a, parts_s = [arr], [self.service.sample(rng, n)]
        t_end = float(arr[-1])
        for rate in self.stream_rates(k):
            a = PoissonArrivals(rate).sample_until(rng, t_end)
            parts_a.append(a)
            parts_s.append(self.service.sample(rng, a.size))
        times = np.concatenate(parts_a)
        order = np.argsort(times, kind="stable")
        res = fifo_queue(times[order], np.concatenate(parts_s)[order])
        return float(res.sojourns[order < n].mean()) / self.alone_sojourn_cached(n)

    def fresh_latencies(self, n: int, k: int | Mix, rng: np.random.Generator,
                        count: int) -> np.ndarray:
        """``count`` independent draws of :meth:`fresh_latency` at once (the same
        distribution, exactly: see :meth:`fresh_inputs`), solved in one pass."""
        gaps, services, ops = self.fresh_inputs(n, k, rng, count)
        return self.solve_fresh(n, count, gaps, services, ops)

    def fresh_inputs(self, n: int, k: int | Mix, rng: np.random.Generator,
                     count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Inputs of ``count`` independent fresh batches, laid end to end on one time axis.

        Batch ``b`` has the law of what :meth:`fresh_latency` draws (``n`` op arrivals of a
        Poisson process at the op's rate, every stream beside it a Poisson process until the
        op's last arrival, i.i.d. service times), generated without sorting: the
        superposition of independent Poisson processes is one Poisson process at the summed
        rate ``L`` whose points are independently the op's with probability ``p = op rate /
        L`` (the colouring theorem). So a batch is a run of exponential gaps of mean ``1 / L``
        with i.i.d. Bernoulli(``p``) op marks, cut at its ``n``-th op point; consecutive cuts
        of one mark sequence are independent batches. Before each batch's first point the
        previous batch's total service time is added to the gap, so the server is empty when
        it begins (its last departure is at most its last arrival plus its work) and each
        batch is its own queue, as if simulated alone. Returns the gap before each point (s;
        the first from time 0), the service times (s) and the op points' indices (batch
        ``b``'s are ``ops[b n:(b + 1) n]``)."""
        lam = self.op_rate + sum(self.stream_rates(k))
        p = self.op_rate / lam
        need = count * n
        marks = np.empty(0, dtype=bool)
        while True:  # enough marks for count x n op points (rarely more than one round)
            mean = (need - int(marks.sum())) / p
            more = rng.random(int(mean + 6 * math.sqrt(mean) + 64)) < p
            marks = np.concatenate([marks, more]) if marks.size else more
            if int(marks.sum()) >= need:
                break
        ops = np.flatnonzero(marks)[:need]
        total = int(ops[-1]) + 1
        gaps = rng.standard_exponential(total)
        gaps *= 1.0 / lam  # = rng.exponential(1 / lam, total), one temporary fewer
        services = self.service.sample(rng, total)
        if count > 1:
            starts = ops[n - 1:-1:n] + 1  # first point of batches 1 .. count - 1
            work = np.add.reduceat(services, np.concatenate(([0], starts)))
            gaps[starts] += work[:-1] * (1 + 1e-9)
        return gaps, services, ops

    def solve_fresh(self, n: int, count: int, gaps: np.ndarray, services: np.ndarray,
                    ops: np.ndarray) -> np.ndarray:
        """Slowdowns of the batches of :meth:`fresh_inputs`: each batch's mean op sojourn over
        the mean alone sojourn. The waits are the Lindley recursion ``W_{i+1} = max(0, W_i +
        S_i - gap_{i+1})`` in its closed form ``W_i = C_i - min_{j <= i} C_j`` with ``C`` the
        running sum of ``S_i - gap_{i+1}`` from ``C_0 = 0``; every batch starts on an empty
        server, so the running minimum never reaches back into the previous batch."""
        from devices.lindley import op_sojourns  # compiled (numba): imported when used

        soj = op_sojourns(gaps, services, ops)
        return soj.reshape(count, n).mean(axis=1) / self.alone_sojourn_cached(n)

    def alone_sojourn_cached(self, n: int) -> float:
        """:meth:`alone_sojourn`, cached per ``n``."""
        key = ("alone", n)
        v = self._alone.get(key)
        if v is None:
            v = self._alone[key] = self.alone_sojourn(n)
        return v

    def stationary(self, k: int | Mix, n: int, g: np.random.Generator) -> tuple:
        """One stationary run with ``n`` requests in all at load ``rho(k)`` (empty at 0).

        Returns:
            (arrival times (s), service times (s), mask of the op's requests, FifoResult).
        """
        n_op = max(16, round(n * self.op_load / self.rho(k)))
        op = PoissonArrivals(self.op_rate).sample(g, n_op)
        parts = [op] + [PoissonArrivals(rate).sample_until(g, float(op[-1]))
                        for rate in self.stream_rates(k)]
        times = np.concatenate(parts)
        order = np.argsort(times, kind="stable")
        times = times[order]
        services = self.service.sample(g, times.size)
        return times, services, order < n_op, fifo_queue(times, services)

    def mean_op_wait(self, k: int | Mix, n: int, replication: int) -> float:
        """Sample mean wait (s) of the op's requests in stationary run ``replication`` of
        ``n`` requests at level ``k`` (no warm-up dropped; the queue starts empty). For a
        service tail index <= 2 its expectation grows without bound with ``n``."""
        *_, is_op, res = self.stationary(k, n, self._rng(2, as_mix(k), n, replication))
        return float(res.waits[is_op].mean())

    def _diagnose(self, k: Mix) -> LevelReport:
        """One long stationary run at load ``rho(k)``: twin.kernel.queueing's verdict."""
        times, services, is_op, res = self.stationary(k, self.diagnostic_requests,
                                                      self._rng(1, k))
        lam = self.op_rate + sum(self.stream_rates(k))
        qa = analyze_queue(times, services, service_distribution=self.service, arrival_rate=lam)
        op_waits = res.waits[is_op]
        op_bm = batch_means(op_waits[op_waits.size // 10:], 20)
        return LevelReport(k=sum(k), h2d=k[1], rho=self.rho(k), status=qa.status,
                           converged=qa.converged,
                           variance_infinite=qa.variance_infinite, mean_wait_s=qa.mean_wait,
                           mean_wait_se_s=qa.mean_wait_se,
                           op_mean_wait_s=op_bm.mean,
                           op_mean_wait_se_s=(math.inf if math.isinf(qa.mean_wait_se)
                                              else op_bm.standard_error),
                           tail_index=None if qa.hill is None else qa.hill.alpha,
                           warnings=qa.warnings)


# ============================================================================ FR-FCFS model
@dataclass
class FrfcfsContention(MemoryContention):
    """The FR-FCFS controller of :mod:`devices.hbm` on one stack (module docstring).

    Attributes:
        spec: the HBM stack (``devices.hbm.HbmSpec``).
        stacks: stacks on the device.
        op_stream: the op's stream template (rate per stack; ``n_requests`` is set per class).
        dma_stream: one DMA stream's template (rate per stack).
    """

    spec: Any = None
    stacks: int = 1
    op_stream: Any = None
    dma_stream: Any = None
    h2d_stream: Any = None
    _alone: dict[tuple[int, int], Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.spec is None or self.op_stream is None or self.dma_stream is None:
            raise ScenarioError(Problem("memory", "the frfcfs model needs an HBM spec and "
                                        "stream templates"))
        self.name = "frfcfs"

    def _streams(self, n: int, k: int | Mix):
        """The op's stream and the streams beside it (network DMA, then copies), per stack."""
        op = replace(self.op_stream, n_requests=n, nbytes=None)
        net, h2d = as_mix(k)
        tmpl = [self.dma_stream] * net + [self.h2d_stream or self.dma_stream] * h2d
        total = sum(t.rate_bytes_per_s for t in tmpl) / self.op_stream.rate_bytes_per_s
        out = []
        for t in tmpl:  # arrivals cover 3x the op's arrival span, stretched by the fluid bound
            ratio = t.rate_bytes_per_s / self.op_stream.rate_bytes_per_s
            out.append(replace(t, n_requests=math.ceil(n * ratio * 3.0 * (1.0 + total)) + 16,
                               nbytes=None))
        return op, out

    def batch(self, n: int, k: int | Mix, r: int):
        """(slowdown, :class:`devices.hbm.EffectiveBandwidth`) of batch ``r``."""
        from devices.hbm import effective_bandwidth

        op, dma = self._streams(n, k)
        alone = self._alone.get((n, r))
        if alone is None:
            alone = self._alone[(n, r)] = effective_bandwidth(
                self.spec, self.stacks, op, [], self._rng(0, n, r))
        if sum(as_mix(k)) == 0:
            return 1.0, alone
        eb = effective_bandwidth(self.spec, self.stacks, op, dma, self._rng(0, n, r),
                                 op_alone_bytes_per_s=alone.op_bandwidth_bytes_per_s)
        if self.bound == "bandwidth":
            return eb.slowdown, eb
        return eb.op_mean_latency_s / alone.op_mean_latency_s, eb

    def offered_bytes_per_s(self) -> tuple[float, float]:
        """HBM traffic of one network DMA stream and one copy stream (their stream
        templates' per-stack rates x stacks), bytes/s."""
        h2d = self.h2d_stream.rate_bytes_per_s * self.stacks if self.h2d_stream else 0.0
        return self.dma_stream.rate_bytes_per_s * self.stacks, h2d

    def _simulate(self, n: int, k: Mix) -> list[float]:
        out = [self.batch(n, k, r) for r in range(self.batches)]
        self._windows[(n, k)] = np.array([eb.dma_window_bytes_per_s for _s, eb in out],
                                         dtype=float).reshape(self.batches, sum(k))
        return [s for s, _eb in out]

    def _diagnose(self, k: Mix) -> LevelReport:
        tabs = [t for (n, kk), t in self._tables.items() if kk == k]
        n = max((t.n_requests for t in tabs), default=min(self.requests_per_batch, 1024))
        lat = [self.batch(n, k, r)[1].op_mean_latency_s for r in range(min(self.batches, 8))]
        rho = self.rho(k)
        warnings: list[str] = []
        rel = max((t.standard_error / t.mean for t in tabs if sum(k) > 0), default=0.0)
        if rho >= 1.0:
            status = "unstable"
            warnings.append(f"offered load {rho:.3g} of the peak HBM bandwidth >= 1: the op "
                            "and the DMA streams oversubscribe the memory; slowdowns are "
                            "finite-batch values")
        elif rel > 0.05:
            status = "not_settled"
            warnings.append(f"slowdown relative standard error {100 * rel:.3g}% > 5% over "
                            f"{self.batches} batches; raise memory.batches")
        else:
            status = "converged"
        mean_lat = float(np.mean(lat))
        se = float(np.std(lat, ddof=1) / math.sqrt(len(lat))) if len(lat) > 1 else math.inf
        return LevelReport(k=sum(k), h2d=k[1], rho=rho, status=status,
                           converged=status == "converged",
                           variance_infinite=False, mean_wait_s=mean_lat, mean_wait_se_s=se,
                           op_mean_wait_s=mean_lat, op_mean_wait_se_s=se, tail_index=None,
                           warnings=tuple(warnings))


# ============================================================================ building
def build_memory_model(spec: MemorySpec, device, link, links_per_edge: int,
                       rng: np.random.Generator, h2d_bytes_per_s: float = 0.0,
                       bound: Bound | None = None) -> MemoryContention | None:
    """The contention model of a run (``None`` for ``roofline``).

    Args:
        spec: the scenario's ``memory`` section.
        device: ``cluster.device`` (``devices.spec.DeviceSpec``).
        link: ``cluster.link`` (``devices.spec.LinkSpec``), for the DMA rate.
        links_per_edge: ``cluster.links_per_edge``.
        rng: one integer is drawn from it as the root of every batch's generator.
        h2d_bytes_per_s: HBM write rate of one host-to-device copy stream (its PCIe rate),
            bytes/s (0: no copy streams).
        bound: overrides ``spec.bound`` (``auto`` builds one model per view: bandwidth and
            latency).
    """
    if spec.model == "roofline":
        return None
    from devices.hbm import StreamSpec, load_hbm_spec

    hbm = load_hbm_spec(device.hbm_type)
    peak = device.hbm_bandwidth_gbps * 1e9  # bytes/s
    op_load = spec.op.load if spec.op.load is not None else device.memory_efficiency
    dma = dma_rate_bytes_per_s(spec, link, links_per_edge)
    view = bound or spec.bound
    common = dict(op_load=op_load, dma_load=dma / peak, bound=view,
                  h2d_load=h2d_bytes_per_s / peak,
                  requests_per_batch=spec.requests_per_batch, batches=spec.batches,
                  max_streams=spec.max_streams, entropy=int(rng.integers(0, 2**63 - 1)))
    stacks = device.hbm_stacks
    if spec.model == "queue":
        channels = hbm.channels * stacks
        mean_s = hbm.burst_bytes * channels / peak
        return QueueContention(bytes_per_request=float(hbm.burst_bytes * channels),
                               service=spec.service.distribution(mean_s), **common)
    op = StreamSpec(n_requests=1, arrival="poisson", rate_bytes_per_s=op_load * peak / stacks,
                    read_fraction=spec.op.read_fraction, row_locality=spec.op.row_locality)
    dstream = StreamSpec(n_requests=1, arrival="poisson", rate_bytes_per_s=dma / stacks,
                         read_fraction=spec.dma.read_fraction,
                         row_locality=spec.dma.row_locality, interleave="random")
    # a host-to-device copy only writes HBM, in whole rows (bulk DMA of a pinned buffer)
    h2d = (StreamSpec(n_requests=1, arrival="poisson",
                      rate_bytes_per_s=h2d_bytes_per_s / stacks, read_fraction=0.0,
                      row_locality=spec.dma.row_locality, interleave="random")
           if h2d_bytes_per_s > 0 else None)
    return FrfcfsContention(bytes_per_request=float(hbm.burst_bytes * stacks), spec=hbm,
                            stacks=stacks, op_stream=op, dma_stream=dstream, h2d_stream=h2d,
                            **common)
