"""Shared resources of a device that every stream goes through at run time: HBM and SMs.

A device runs several *streams* at once (``workloads.executor`` starts and ends them): the
compute stream's blocks, and beside them tensor-parallel communication chunks (``tp``),
data-parallel gradient buckets (``dp``), sharding all-gathers / reduce-scatters (``shard``,
``replica``), pipeline sends and receives (``p2p``) and host-to-device copies of the next
batch (``h2d``, ``devices.pcie``). :class:`DeviceStreams` is the agent of one rank class's
devices: it counts the streams running *now* and, when a compute block starts, turns that mix
into the block's cost:

HBM controller
    Every communication stream reads and writes HBM (its DMA rate, ``devices.memory``), a copy
    writes it at its PCIe rate. The block's memory time is multiplied by the slowdown the
    run's controller model (``memory.model``: ``frfcfs`` or ``queue``) gives for the block's
    request count next to the current mix ``(network streams, copy streams)``. Mixes repeat,
    so each (request class, mix) is simulated once (``memory.batches`` batches, cached) and a
    block draws one of them; what it draws is for the streams actually running beside it.
    With ``memory.bound: auto`` the block is split by kernel: GEMMs of at least
    ``memory.latency_below_mb`` are bandwidth-bound (span view, cached tables: they see the
    controller's throughput), the rest (norms, element-wise, optimizer, small GEMMs) are
    latency-bound and see the sojourn-time tail: under the ``queue`` model each block draws a
    fresh batch of its own (:meth:`devices.memory.QueueContention.fresh_latency`), so a Pareto
    service tail reaches every such block, alone or not.

SMs
    A collective kernel runs on SMs: NCCL one CTA per channel (``collective_ctas``),
    Transformer Engine's overlap kernels ``tp_overlap_ctas``, copies none (copy engines;
    catalog ``devices/catalog/interference``). With ``u`` SMs taken of ``U``, a block's math
    time is multiplied by ``U / (U - u)`` (at least one SM is left to compute).

A block is a fluid job (:meth:`DeviceStreams.run_block`): it is priced at the mix running
when it starts, and whenever a stream starts or ends beside it (an FSDP all-gather issued as the
block begins, a DP bucket, a TP chunk, a send) it is re-priced at the new mix and its remaining
fraction of work continues at the new rate; its time, energy and statistics are the pieces'
prices weighted by the fraction of the block each did. So a block slows exactly while a
collective runs beside it. Each piece draws its HBM factor afresh (a cached table batch; under
``queue`` with ``bound: auto`` a fresh latency batch for the latency-bound part), so a block
cut into pieces averages independent draws. ``hbm_max_streams`` counts the compute stream with
the others: the most streams the controller served at once during a block.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from twin.kernel.catalog import Catalog

if TYPE_CHECKING:
    from devices.spec import DeviceSpec

#: Stream kinds and which of them are network DMA (the rest: host copies).
STREAM_KINDS = ("tp", "dp", "shard", "replica", "p2p", "h2d")
NETWORK_KINDS = ("tp", "dp", "shard", "replica", "p2p")
CATALOG_DIR = Path(__file__).parent / "catalog" / "interference"
_LOG_STEP = 0.002  # latency slowdowns are rounded to a 0.2% log grid (bounded cost cache)
_KEEP = 64         # blocks kept per mix for inspection (tests, reports)
_FRESH_MIN, _FRESH_MAX = 8, 256  # fresh latency draws made at once per (requests, mix)


@dataclass(frozen=True)
class SmShares:
    """SMs one kernel of each stream kind occupies (catalog ``interference/nccl``)."""

    collective_ctas: int
    tp_overlap_ctas: int
    copy_ctas: int
    activity: float = 0.3  # dynamic power of an SM running a collective / running a GEMM

    def of(self, kind: str) -> int:
        """SMs of one stream of ``kind``."""
        if kind == "h2d":
            return self.copy_ctas
        return self.tp_overlap_ctas if kind == "tp" else self.collective_ctas


@cache
def sm_shares(name: str = "nccl") -> SmShares:
    """The SM shares of catalog entry ``name``."""
    v = Catalog("interference", CATALOG_DIR).get(name).values
    return SmShares(int(v["collective_ctas"]), int(v["tp_overlap_ctas"]), int(v["copy_ctas"]),
                    float(v["collective_sm_activity"]))


def device_sm_shares(device: DeviceSpec) -> SmShares:
    """:func:`sm_shares` on ``device`` (``devices.spec.DeviceSpec``): a collective takes the
    device's ``nccl_channels`` SMs where its catalog entry gives them (NCCL's channel count
    on that node), the catalog's ``collective_ctas`` otherwise."""
    shares = sm_shares()
    if device.nccl_channels is None:
        return shares
    return replace(shares, collective_ctas=int(device.nccl_channels))


@dataclass(frozen=True)
class Price:
    """The cost of a whole block at one mix of streams (:meth:`DeviceStreams.price`).

    Attributes:
        duration_s: contended duration, s.
        gemm_flops: GEMM FLOPs.
        compute_j: dynamic compute energy at the P-state, J.
        memory_j: HBM energy, J.
        base_s: uncontended duration, s.
        hbm_s: uncontended duration weighted by the HBM factor of each part, s.
        mix: ``(network streams, copy streams)`` it was priced at (clipped).
        n_requests: request class of its bandwidth-bound part.
        slowdown: HBM factor of its bandwidth-bound part.
        sm_factor: factor on its math time.
        members_s: the members' mean contended duration, s (``duration_s`` but for a group
            whose members draw apart: :meth:`DeviceStreams.price`).
        lags_after: how far each member of such a group ends ahead of the block's end, s,
            if the block runs at this price to its end; None: the members' lags stay as
            they are (one member, or a price made in step).
    """

    duration_s: float
    gemm_flops: float
    compute_j: float
    memory_j: float
    base_s: float
    hbm_s: float
    mix: tuple[int, int]
    n_requests: int
    slowdown: float
    sm_factor: float
    members_s: float
    lags_after: tuple[float, ...] | None = None


_REPRICE = object()  # interrupt cause: the streams beside a running block changed
_ALIKE = (1.0,)  # the HBM factors of a part nothing contends with: one, for every member


@dataclass(frozen=True)
class BlockRecord:
    """One contended block as executed (for inspection).

    Attributes:
        name: block name.
        mix: ``(network streams, copy streams)`` beside it.
        n_requests: the request class its bandwidth-bound part was simulated with.
        slowdown: HBM factor applied to its bandwidth-bound memory time.
        sm_factor: factor applied to its math time.
        t: time the piece ended (s).
        fraction: fraction of the block's work done at this mix (1: the whole block).
    """

    name: str
    mix: tuple[int, int]
    n_requests: int
    slowdown: float
    sm_factor: float
    t: float
    fraction: float = 1.0


class TableIndices:
    """``rng.integers(high, size)`` for one ``high`` (a table's batch count), drawn in blocks
    of ``block``: a Generator's array draw is the sequence of as many scalar draws, so the
    indices are the numbers one call each would give, as long as nothing else draws from
    ``rng`` (the device agent's own generator, with no fresh latency draws)."""

    def __init__(self, rng: np.random.Generator, high: int, block: int = 4096):
        self.rng, self.high, self.block = rng, int(high), int(block)
        self._buf = np.empty(0, dtype=np.int64)
        self._list: list[int] = []
        self._i = 0

    def integers(self, high: int, size: int | None = None):
        """The next index (``size`` None) or a list of the next ``size`` indices, in
        ``[0, high)``."""
        if high != self.high:
            raise ValueError(f"TableIndices draws below {self.high}, asked for {high}")
        n = 1 if size is None else int(size)
        i = self._i
        if i + n > len(self._list):  # refill, keeping the unused tail first
            tail = self._buf[i:]
            self._buf = np.concatenate([tail, self.rng.integers(
                self.high, size=max(self.block, n))])
            self._list = self._buf.tolist()
            i = 0
        self._i = i + n
        return self._list[i] if size is None else self._list[i:i + n]


class DeviceStreams:
    """The streams on one rank class's devices and the resources they share (module docstring).

    Args:
        env: SimPy environment (for times).
        n_devices: devices the class stands for (weights of the statistics).
        units: SMs of the device (``cluster.device.compute_units``; None: no SM sharing).
        shares: SMs per stream kind, or None for no SM contention.
        memory: the HBM controller model (``devices.memory.MemoryContention``, bandwidth
            view), or None (roofline memory).
        latency: ``memory.bound: auto``: the latency-view model (a ``QueueContention`` draws
            fresh batches, an ``FrfcfsContention`` its latency tables), else None.
        latency_below_bytes: ``memory.bound: auto`` GEMM threshold, bytes.
        rng: the class's generator for the draws.
        on_network: called with +1 / -1 when a network stream starts / ends (the PCIe
            switches count NIC flows), or None.
        group: devices that meet after every block (a tensor-parallel group) when one agent
            stands for many (rank symmetry with ``memory.per_device_draws: false``, or one
            agent per TP group, ``Scenario.tp_groups``): a block draws once per member and
            lasts as long as its slowest member's, as the group's TP collective waits for it
            (1: one draw).
        on_ports: ``memory.transfer_cap``: called with the HBM bandwidth (bytes/s, ``inf``:
            uncapped) the controller gives the network DMA of the class's devices whenever
            it changes (:meth:`port_capacity`); the fabric caps the devices' HBM ports with
            it. None: transfers are not capped.
    """

    def __init__(self, env, n_devices: int, units: int | None, shares: SmShares | None,
                 memory=None, latency=None, latency_below_bytes: float = 1e6,
                 rng: np.random.Generator | None = None, on_network=None, group: int = 1,
                 on_ports=None):
        self.env = env
        self.n = n_devices
        self.units = units
        self.shares = shares if units else None
        self.memory = memory
        self.latency = latency
        self.latency_below = float(latency_below_bytes)
        self.rng = rng
        # the table draws' indices in blocks, where nothing else draws from rng (no fresh
        # latency batches; every table of the model has memory.batches samples)
        self._indices = (TableIndices(rng, memory.batches) if memory is not None
                         and latency is None and rng is not None else None)
        self.on_network = on_network
        self.group = max(int(group), 1)
        self._net = 0
        self._h2d = 0
        self._sm = 0
        self.max_streams = 1 if memory is not None else 0
        self.max_sm_used = 0
        self._split: dict[int, tuple[Any, Any]] = {}
        self._cost_cache: dict[tuple, dict[float, tuple]] = {}  # see _costs
        self._w = 0.0      # uncontended seconds of blocks (weights)
        self._w_hbm = 0.0  # sum of weight x HBM factor
        self._w_dur = 0.0  # contended seconds of blocks
        self.records: dict[tuple[int, int], list[BlockRecord]] = {}
        self._running: tuple | None = None  # (process, price key) of the block running now
        self.repriced = 0  # pieces after a block's first (streams changed mid-block)
        self._fresh_buf: dict[tuple, list] = {}  # (requests, mix) -> [draws, next index]
        self.on_ports = on_ports if memory is not None else None
        self._port_cap = math.inf  # what on_ports was last told, bytes/s
        self._net_caps: dict[tuple[int, int], float] = {}  # see port_capacity
        self._flush_due = False    # a change of the ports' capacity is queued (see _ports)
        self._reprice_due = False  # a re-price check is queued (see _changed)
        self.port_capped_s = 0.0   # seconds the ports were capped (closed intervals)
        self._capped_since: float | None = None
        self.port_cap_min = math.inf  # smallest port capacity set, bytes/s
        # blocks priced alone ahead of the clock (``workloads.quiet``): their weight at the
        # controller's level (0, 0) not yet booked on the model, and the hook told before
        # every change of the streams
        self._alone_w = 0.0
        self._alone: dict[tuple, Price] = {}  # see price_alone
        # one op alone booked at level (0, 0) (see _account): its weight, 0 where none is
        self._alone_op_w = (self.n / self.group * self.group
                            if memory is not None and latency is None else 0.0)
        self.on_change: Callable[[], None] | None = None
        # a group whose members draw apart: how far each member is ahead of the agent's clock
        # since the members last met (None: in step; see sync, price and run_block)
        self._lags: tuple[float, ...] | None = None
        # runs a flush once the instant's other changes are made: the engine's end-of-instant
        # callbacks (``Engine.at_instant_end``), a zero-delay event on a plain SimPy environment
        self._defer: Callable[[Callable[..., None]], None] = getattr(
            env, "at_instant_end", self._zero_delay)

    # ------------------------------------------------------------------ streams
    def start(self, kind: str) -> None:
        """A stream of ``kind`` starts on the devices."""
        if self.on_change is not None:
            self.on_change()
        if kind == "h2d":
            self._h2d += 1
        else:
            self._net += 1
            if self.on_network is not None and kind != "tp":
                self.on_network(1)
        if self.shares is not None:
            self._sm += self.shares.of(kind)
        self._changed()
        self._ports()

    def end(self, kind: str) -> None:
        """A stream of ``kind`` ends."""
        if self.on_change is not None:
            self.on_change()
        if kind == "h2d":
            self._h2d -= 1
        else:
            self._net -= 1
            if self.on_network is not None and kind != "tp":
                self.on_network(-1)
        if self.shares is not None:
            self._sm -= self.shares.of(kind)
        self._changed()
        self._ports()

    @property
    def mix(self) -> tuple[int, int]:
        """``(network streams, copy streams)`` running now."""
        return self._net, self._h2d

    @property
    def quiet(self) -> bool:
        """Whether a block starting now would run alone and be priced without a draw: no
        stream running (so no SMs taken either) and no fresh latency batches (which every
        latency-bound part draws, alone or not)."""
        return self._net == 0 and self._h2d == 0 and self._sm == 0 and self.latency is None

    # ------------------------------------------------------------------ transfers
    def port_capacity(self) -> float:
        """HBM bandwidth the controller gives the network DMA of one of the class's devices
        now, bytes/s: while a compute block runs beside ``net >= 1`` network streams, the
        model's :meth:`devices.memory.MemoryContention.dma_caps` of the current mix (what all
        network DMA streams together got while the op ran, in the same runs that price the
        blocks; ``inf`` where they got what they offer); ``inf`` between blocks (DMA alone
        stays far below the peak) and without network streams."""
        mem = self.memory
        if mem is None or self._running is None or self._net <= 0:
            return math.inf
        mix = (self._net, self._h2d)
        cap = self._net_caps.get(mix)
        if cap is None:  # the model's caps of a mix are fixed once computed
            cap = self._net_caps[mix] = mem.dma_caps(mem.clip(mix, weight=0.0))[0]
        return cap

    def h2d_cap(self) -> float:
        """HBM bandwidth of one copy stream now (a copy counts itself: call it after its
        stream started), bytes/s; ``inf`` as in :meth:`port_capacity`. Read by the PCIe copy
        ports when a copy starts (a copy's rate is fixed at its start)."""
        mem = self.memory
        if mem is None or self._running is None or self._h2d <= 0:
            return math.inf
        return mem.dma_caps(mem.clip(self.mix, weight=0.0))[1]

    def capped_s(self) -> float:
        """Seconds the class's HBM ports have been capped so far (an open interval counted
        up to now)."""
        open_s = self.env.now - self._capped_since if self._capped_since is not None else 0.0
        return self.port_capped_s + open_s

    def _ports(self) -> None:
        """Tell the fabric the ports' capacity if it changed, once the instant's other
        changes are made: a block that ends and the next that starts at the same time (a
        chunk after a chunk) flip the capacity and back, which would re-share every flow on
        the ports twice for nothing (no byte moves in zero time). At the end of the instant
        (:attr:`_defer`) the capacity the streams then give is applied."""
        if self.on_ports is None or self._flush_due:
            return
        if self.port_capacity() != self._port_cap:
            self._flush_due = True
            self._defer(self._flush_ports)

    def _zero_delay(self, flush: Callable[..., None]) -> None:
        """:attr:`_defer` on a plain SimPy environment: a zero-delay event, queued behind
        what is due now."""
        self.env.timeout(0).callbacks.append(flush)

    def _flush_ports(self, _e: object = None) -> None:
        self._flush_due = False
        cap = self.port_capacity()
        if cap == self._port_cap:
            return
        now = self.env.now
        if self._capped_since is not None:
            self.port_capped_s += now - self._capped_since
        self._capped_since = now if math.isfinite(cap) else None
        self.port_cap_min = min(self.port_cap_min, cap)
        self._port_cap = cap
        self.on_ports(cap)

    def sm_factor(self) -> float:
        """Factor on math time from the SMs the running collectives take."""
        if self.shares is None or self._sm <= 0:
            return 1.0
        used = min(self._sm, self.units - 1)
        self.max_sm_used = max(self.max_sm_used, used)
        return self.units / (self.units - used)

    # ------------------------------------------------------------------ blocks
    def _parts(self, block) -> tuple[Any, Any]:
        """(bandwidth-bound part, latency-bound part) of a block for ``bound: auto``."""
        hit = self._split.get(id(block))
        if hit is None:
            from devices.memory import latency_bound

            lat = tuple(k for k in block.kernels if latency_bound(k, self.latency_below))
            bw = tuple(k for k in block.kernels if not latency_bound(k, self.latency_below))
            mk = type(block)
            hit = self._split[id(block)] = (mk(block.name, bw) if bw else None,
                                            mk(block.name, lat) if lat else None)
        return hit

    def price(self, acc, block, ps: int, in_step: bool = False) -> Price:
        """The cost of the whole of ``block`` on the accelerator agent ``acc`` at P-state
        ``ps`` if the streams running now ran beside all of it (nothing is accounted: a
        table draw is booked on the controller model, except alone, where the HBM factor is 1
        without a draw and :meth:`_account` books the level (0, 0) per piece that ran).

        An agent for a ``group`` of devices draws each member's factors and prices each
        member's block. Member ``j`` starts it ``lag_j`` ahead of the agent's clock (what the
        blocks since the members last met left, :meth:`sync`; none if ``in_step``) and the
        block lasts until the last member ends, ``max_j (d_j - lag_j)``, as the group's next
        TP collective waits for it: its price is that member's (energy, HBM factor) with that
        span, while ``hbm_s`` weights each part by the members' mean factor and ``members_s``
        is the members' mean duration (what their own blocks see)."""
        sm = self.sm_factor()
        mem = self.memory
        mix = self.mix
        n_req = 0
        bw_part = 0  # index of the bandwidth-bound part in parts (None: none)
        if mem is None:
            parts = [(block, _ALIKE)]
            bw_part = None
        elif self.latency is None:
            mix = mem.clip(mix, self.n)
            parts = [(block, _ALIKE if mix == (0, 0) else self._draws(mem, block, mix))]
            n_req = mem.request_class(block)
        else:
            bw, lat = self._parts(block)
            mix = mem.clip(mix, self.n)
            parts = []
            if bw is not None:
                n_req = mem.request_class(bw)
                parts.append((bw, self._draws(mem, bw, mix)))
            else:
                bw_part = None
            if lat is not None:
                parts.append((lat, self._latency_draws(lat, mix)))
        costs = [self._costs(acc, part, sm, ps, fs) for part, fs in parts]
        g = max(len(c) for c in costs)
        j = 0
        span = after = None
        if g > 1:  # the group's members priced apart: the last to end sets the block's price
            durs = ([h[0] for h in costs[0]] if len(costs) == 1 else
                    [sum(c[i if len(c) > 1 else 0][0] for c in costs) for i in range(g)])
            lags = None if in_step else self._lags
            ends = durs if lags is None else [d - x for d, x in zip(durs, lags, strict=True)]
            span = max(ends)
            j = ends.index(span)
            after = None if in_step else tuple(span - e for e in ends)
        dur = flops = e_dyn = e_mem = base = hbm = 0.0
        for c, (_, fs) in zip(costs, parts, strict=True):
            hit = c[j if len(c) > 1 else 0]
            dur += hit[0]
            flops += hit[1]
            e_dyn += hit[2]
            e_mem += hit[3]
            base += hit[4]
            hbm += hit[4] * (fs[0] if len(fs) == 1 else sum(fs) / len(fs))  # members' mean
        fs = parts[bw_part][1] if bw_part is not None else _ALIKE
        if span is None:
            return Price(dur, flops, e_dyn * acc.dev.dyn_scale[ps], e_mem, base, hbm, mix,
                         n_req, fs[0], sm, dur)
        return Price(span, flops, e_dyn * acc.dev.dyn_scale[ps], e_mem, base, hbm, mix, n_req,
                     fs[j if len(fs) > 1 else 0], sm, sum(durs) / g, after)

    def _costs(self, acc, part, sm: float, ps: int, fs) -> list[tuple]:
        """``(duration, GEMM FLOPs, dynamic energy at the top P-state's scale, memory energy,
        uncontended duration)`` of ``part`` on ``acc`` at P-state ``ps`` with SM factor
        ``sm`` on its math time, for each HBM factor of ``fs`` on its memory time (cached
        per part, SM factor, P-state, memory scale and factor)."""
        ms = acc.mem_scale
        key = (id(part), sm, ps, ms)
        by_f = self._cost_cache.get(key)
        if by_f is None:
            by_f = self._cost_cache[key] = {}
        out = []
        for f in fs:
            hit = by_f.get(f)
            if hit is None:
                math = acc.dev.math_scale[ps]
                c = acc.model.block_cost(part, math * sm, ms * f)
                hit = by_f[f] = (c.duration_s, c.gemm_flops, c.compute_j, c.memory_j,
                                 acc.model.block_cost(part, math, ms).duration_s)
            out.append(hit)
        return out

    def price_alone(self, acc, block, ps: int) -> Price:
        """:meth:`price` while :attr:`quiet` (cached: nothing beside the block, nothing drawn)."""
        key = (id(block), ps, acc.mem_scale)
        p = self._alone.get(key)
        if p is None:
            p = self._alone[key] = self.price(acc, block, ps, in_step=True)
        return p

    def ran_alone(self, block, p: Price) -> None:
        """Account the whole of ``block`` run alone at price ``p`` (:meth:`price_alone`)
        ahead of the clock: as :meth:`run_block` accounts it, its level (0, 0) kept in
        :attr:`_alone_w` until :meth:`book_alone`."""
        self._account(block, p, 1.0, book=False)
        self._alone_w += self._alone_op_w

    def book_alone(self) -> None:
        """Book the weight of the blocks run alone so far on the controller model (what
        their draws at level (0, 0) would have booked one by one)."""
        if self._alone_w:
            self.memory.record((0, 0), 1.0, self._alone_w)
            self._alone_w = 0.0

    @property
    def alone_key(self) -> tuple:
        """The price key (:meth:`_key`) of a block run alone."""
        return 0, (0, 0) if self.memory is not None else None

    def resumed(self, proc) -> None:
        """A block run alone ahead of the clock by the agent process ``proc`` and taken back
        now is the running block from now on, at its price key alone (before the streams
        change: see ``workloads.quiet``)."""
        self._running = (proc, self.alone_key)

    def checkpoint(self) -> tuple:
        """What :meth:`ran_alone` and :meth:`sync` change, as it stands now
        (:meth:`restore`)."""
        return self._w, self._w_hbm, self._w_dur, self._alone_w, self._lags

    def restore(self, cp: tuple) -> None:
        """Return to a :meth:`checkpoint` (blocks run alone since are taken back)."""
        self._w, self._w_hbm, self._w_dur, self._alone_w, self._lags = cp

    def sync(self) -> None:
        """The members of the group meet (a collective, a wait, a send): none is ahead of
        the agent's clock any more."""
        self._lags = None

    def run_block(self, acc, block, ps: int, stretch: float, first: Price,
                  start: float | None = None):
        """Process body: run ``block`` as a fluid job whose rate follows the streams beside
        it. ``first`` is its price at the start (:meth:`price`), ``stretch`` the factor the
        accelerator applies to every duration (degradation, jitter, power-cap duty cycle).
        ``start``: a block that started alone at ``start`` (s, before now), run ahead of the
        clock and taken back now as the streams change (``workloads.quiet``): it goes on as
        if it had run on the clock since then.

        The block runs at rate ``1 / (stretch x price(mix).duration_s)`` of its work while the
        mix holds; when a stream starts or ends the block is re-priced at the new mix and its
        remaining fraction of work continues at the new rate (processor sharing of a fluid
        job). Energy and FLOPs are the pieces' prices weighted by the fraction of the block
        each piece did. Returns ``(duration s, gemm FLOPs, dynamic J, memory J)``."""
        env = self.env
        left = 1.0
        p = first
        flops = e_dyn = e_mem = 0.0
        t0 = ts = env.now if start is None else start
        self._running = (env.active_process, self._key() if start is None else self.alone_key)
        self._ports()
        try:
            while True:
                total = p.duration_s * stretch
                if total > 0 and left > 0:
                    try:
                        yield (env.timeout(total * left) if ts == env.now
                               else env.timeout_at(ts + total * left))
                        f = left
                    except simpy.Interrupt as stop:
                        if stop.cause is not _REPRICE:
                            raise
                        f = min(left, (env.now - ts) / total)
                else:
                    f = left
                left -= f
                self._account(block, p, f)
                flops += f * p.gemm_flops
                e_dyn += f * p.compute_j
                e_mem += f * p.memory_j
                if left <= 1e-12:
                    break
                self.repriced += 1
                p = self.price(acc, block, ps)
                self._running = (self._running[0], self._key())
                ts = env.now
        finally:
            self._running = None
            self._ports()
            if p is not first:  # re-priced: the pieces' members are not tracked apart
                self._lags = None
            elif first.lags_after is not None:
                self._lags = first.lags_after
        return env.now - t0, flops, e_dyn, e_mem

    def _key(self) -> tuple:
        """What a block's price depends on among the streams: SMs taken and the mix."""
        return (self._sm if self.shares is not None else 0,
                self.mix if self.memory is not None else None)

    def _changed(self) -> None:
        """A stream started or ended: re-price the running block if its inputs changed, once
        the instant's other changes are made (as :meth:`_ports`): a stream that ends as the
        next starts (a TP chunk after a chunk) leaves the mix as it was, and re-pricing the
        block in between would redraw its HBM factor at an unchanged mix. The mix is compared
        at the end of the instant (:attr:`_defer`)."""
        if self._reprice_due or not self._must_reprice():
            return
        self._reprice_due = True
        self._defer(self._flush_reprice)

    def _must_reprice(self) -> bool:
        run = self._running
        if run is None or run[1] is None:
            return False
        proc, key = run
        if key == self._key() or proc is None or not proc.is_alive:
            return False
        # the block's own process (not inside the block): nothing to re-price
        return proc is not self.env.active_process

    def _flush_reprice(self, _e: object = None) -> None:
        self._reprice_due = False
        if self._must_reprice():
            proc = self._running[0]
            self._running = (proc, None)  # one interrupt at a time; the block re-reads the mix
            proc.interrupt(_REPRICE)

    def _draws(self, model, part, mix: tuple[int, int]) -> list[float]:
        """HBM factors of a part from the model's cached tables, one per member of the
        ``group``."""
        g = self.group
        rng = self._indices if model is self.memory and self._indices is not None else self.rng
        f = model.draw_block(part, mix, rng, self.n / g, g)
        return f if g > 1 else [f]

    def _latency_draws(self, lat, mix: tuple[int, int]) -> list[float]:
        """HBM factors of a latency-bound part (fresh queue batches, or a latency table), one
        per member of the ``group``."""
        model = self.latency
        if not hasattr(model, "fresh_latency"):
            return self._draws(model, lat, mix)
        n = model.requests_for(lat.bytes)
        draws = self._fresh(model, n, mix, self.group)
        model.record_many(mix, draws, self.n / self.group)
        return draws

    def _fresh(self, model, n: int, mix: tuple[int, int], count: int) -> list[float]:
        """The next ``count`` fresh latency draws of ``n`` requests at ``mix``, each rounded
        to the ``_LOG_STEP`` grid. Draws are made in blocks (``QueueContention.
        fresh_latencies``: independent batches solved in one pass, each used once), so every
        block still sees its own independent sample of the sojourn-time distribution at its
        mix; a block of a mix is 8 draws the first time and doubles up to 256 as the mix
        recurs."""
        key = (n, mix)
        buf = self._fresh_buf.get(key)
        out: list[float] = []
        while len(out) < count:
            if buf is None or buf[1] >= len(buf[0]):
                size = min(2 * len(buf[0]), _FRESH_MAX) if buf is not None else _FRESH_MIN
                s = model.fresh_latencies(n, mix, self.rng, size)
                s = np.exp(np.round(np.log(np.maximum(s, 1e-12)) / _LOG_STEP) * _LOG_STEP)
                buf = self._fresh_buf[key] = [s.tolist(), 0]
            i = buf[1]
            j = min(len(buf[0]), i + count - len(out))
            out.extend(buf[0][i:j])
            buf[1] = j
        return out

    def _account(self, block, p: Price, f: float, book: bool = True) -> None:
        """Account the fraction ``f`` of ``block`` done at price ``p`` (nothing if 0: a
        block re-priced in the instant it started ran nothing at its first price); a piece
        alone is booked on the controller model at level (0, 0) (``book``), as one op."""
        if f <= 0.0:
            return
        if book and self._alone_op_w and p.mix == (0, 0):
            self.memory.record((0, 0), 1.0, self._alone_op_w)
        mix = p.mix
        streams = 1 + mix[0] + mix[1]
        if self.memory is not None and streams > self.max_streams:
            self.max_streams = streams
        w = f * self.n
        self._w += p.base_s * w
        self._w_hbm += p.hbm_s * w
        self._w_dur += p.members_s * w
        if sum(mix) > 0 or f < 1.0:  # contended, or a piece of a re-priced block
            rec = self.records.setdefault(mix, [])
            if len(rec) < _KEEP:
                rec.append(BlockRecord(block.name, mix, int(p.n_requests), float(p.slowdown),
                                       float(p.sm_factor), float(self.env.now), float(f)))

    # ------------------------------------------------------------------ report
    def totals(self) -> tuple[float, float, float]:
        """(uncontended block seconds, HBM-factor-weighted seconds, contended seconds), all
        x devices."""
        return self._w, self._w_hbm, self._w_dur


def streams_report(agents: list[DeviceStreams]) -> dict[str, Any]:
    """Summary keys of the device agents: ``hbm_max_streams`` (the most streams, compute
    included, the HBM controller served during one block; 0 without a controller model),
    ``hbm_slowdown_mean`` (time-weighted mean HBM factor on the compute blocks' memory time,
    bandwidth- and latency-bound parts alike; weights: their uncontended durations),
    ``contention_slowdown_mean`` (compute time with contention over compute time without, HBM
    and SMs together) and
    ``sm_max_used`` (most SMs collectives took at once); with ``memory.transfer_cap``
    ``hbm_port_capped_s`` (mean over devices of the seconds their HBM ports were capped:
    network transfers limited by the DMA share a running block left them) and
    ``hbm_port_cap_min_gbps`` (the smallest port capacity set, GB/s of HBM traffic; None
    when no port was capped)."""
    w = sum(a.totals()[0] for a in agents)
    n = sum(a.n for a in agents)
    capped = sum(a.capped_s() * a.n for a in agents)
    low = min((a.port_cap_min for a in agents), default=math.inf)
    return {
        "hbm_max_streams": max((a.max_streams for a in agents), default=0),
        "hbm_slowdown_mean": sum(a.totals()[1] for a in agents) / w if w > 0 else 1.0,
        "contention_slowdown_mean": sum(a.totals()[2] for a in agents) / w if w > 0 else 1.0,
        "sm_max_used": max((a.max_sm_used for a in agents), default=0),
        "hbm_port_capped_s": capped / n if n else 0.0,
        "hbm_port_cap_min_gbps": low / 1e9 if math.isfinite(low) else None,
    }


def no_streams_report() -> dict[str, Any]:
    """:func:`streams_report` of a run without device agents (roofline, nothing shared)."""
    return {"hbm_max_streams": 0, "hbm_slowdown_mean": 1.0, "contention_slowdown_mean": 1.0,
            "sm_max_used": 0, "hbm_port_capped_s": 0.0, "hbm_port_cap_min_gbps": None}
