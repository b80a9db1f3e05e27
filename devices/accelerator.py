"""Accelerators: the roofline compute model and the device agent that executes blocks.

A kernel takes ``max(flops / F * f_max / f, bytes / M) + overhead`` seconds, where ``F`` is the
achievable GEMM throughput at the kernel's precision (datasheet peak x measured matmul
efficiency, times the wave-quantization efficiency of the GEMM's output shape for the best of
the device's tiles, divided by ``1 + k_half / k`` for a reduction of length ``k``) for GEMMs,
the device's fused-attention efficiency for FlashAttention kernels (executing the causal half
of the scores), and the vector (fp32 CUDA-core / VPU) peak for element-wise kernels, ``M`` the
achievable HBM bandwidth,
``overhead`` the per-kernel launch/tail time (all from the device catalog) and ``f`` the clock:
math time scales with the clock, memory time does not.

Power (``devices.power``): while a block runs, a device draws

``P_chip = E_dyn / d + E_hbm / d + P_base + P_leak(V, T)``,  ``P_board = P_chip / eta(P_chip)``

with ``E_dyn = P_dyn,max (V / V_max)^2 t_math(f_max)`` the switching energy of its math,
``E_hbm`` its HBM traffic energy and ``d`` its duration; between blocks it draws the idle power
``P_base + P_leak`` of its current P-state. Power is piecewise constant: one segment per block,
idle stretch or DVFS transition, each integrated exactly, and the die temperature is advanced
over each segment with the RC model's closed form (``devices.thermal``); leakage uses the
temperature at the segment's start. Energy goes into the components ``compute`` (dynamic),
``memory`` (HBM access), ``static`` (leakage + base while computing), ``idle`` (leakage + base
while not computing, including DVFS stalls) and ``regulator`` (conversion loss + rail charge of
DVFS transitions); they add up to the integral of the recorded board power.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from devices.factors import Factors, draw_after
from devices.power import DevicePower, PowerSetup
from devices.spec import DeviceSpec
from twin.kernel.records import Recorder

#: one power segment's 6 float64 as bytes (``array.frombytes`` of them: a third of the cost
#: of ``array.extend`` with a tuple, which converts item by item; the same doubles)
_SEGMENT = struct.Struct("6d").pack


@dataclass(frozen=True)
class BlockCost:
    """Duration and per-device energy of a compute block (at the given clock scale)."""

    duration_s: float
    gemm_flops: float        # model FLOPs (GEMM/attention) of the block
    compute_j: float         # dynamic energy of the math units at the top P-state's voltage
    memory_j: float          # HBM access energy
    static_j: float          # basic-model baseline (idle_w x duration), for reference
    math_s: float            # math time at the top clock, s


def best_wave_efficiency(shape: tuple[float, float, float] | None, units: int | None,
                         tiles: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> float:
    """Wave efficiency of the GEMM's best tile among ``tiles`` (the library's heuristic picks
    the tile configuration that keeps the units busiest; NVIDIA Deep Learning Performance
    Guide, "Matrix Multiplication Background": cuBLAS chooses among several tile sizes)."""
    if not tiles:
        return 1.0
    return max(wave_efficiency(shape, units, t) for t in tiles)


def wave_efficiency(shape: tuple[float, float, float] | None, units: int | None,
                    tile: tuple[int, int] | None) -> float:
    """Fraction of the compute units busy over a GEMM's waves of output tiles.

    A GEMM with output ``(batch, rows, cols)`` is split into ``batch * ceil(rows / TM) *
    ceil(cols / TN)`` tiles; ``units`` tiles run at a time, so the last wave may leave units
    idle (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background: wave
    quantization"). 1 when the shape or the device's tiling is unknown.
    """
    if shape is None or units is None or tile is None:
        return 1.0
    batch, rows, cols = shape
    tiles = max(round(batch), 1) * math.ceil(rows / tile[0]) * math.ceil(cols / tile[1])
    waves = math.ceil(tiles / units)
    return tiles / (waves * units)


class ComputeModel:
    """Roofline durations and energies of kernels on one device type.

    Args:
        spec: the device.
        precision: GEMM precision.
        hbm_pj_per_bit: HBM access energy.
    """

    def __init__(self, spec: DeviceSpec, precision: str, hbm_pj_per_bit: float):
        self.spec = spec
        self.precision = precision
        self.gemm_flops_per_s = spec.achievable_flops(precision)
        self.vector_flops_per_s = spec.vector_flops()
        self.vector_power = spec.vector_power_fraction
        self.tiles = spec.tile_candidates()
        self._rates: dict[tuple[str, str | None], float] = {}
        self.mem_bytes_per_s = spec.hbm_bytes_per_s
        self.overhead_s = spec.kernel_overhead_us * 1e-6
        self.power = DevicePower(spec, hbm_pj_per_bit)
        self.hbm_j_per_byte = self.power.hbm_j_per_byte
        self.hbm_max_w = self.power.hbm_max_w
        self.dynamic_max_w = max(self.power.dyn_max_w, 0.0)
        self._cache: dict[object, BlockCost] = {}

    def block_cost(self, block, math_scale: float = 1.0, mem_scale: float = 1.0) -> BlockCost:
        """Cost of a ``workloads.transformer.Block``, cached.

        Args:
            block: the block.
            math_scale: multiplies every kernel's math time (``f_max / f`` under DVFS).
            mem_scale: multiplies every kernel's memory time (e.g. HBM contention or
                degradation).
        """
        key = (block.kernels, math_scale, mem_scale)
        cost = self._cache.get(key)
        if cost is None:
            cost = self._compute(block, math_scale, mem_scale)
            self._cache[key] = cost
        return cost

    def _rate(self, kernel) -> float:
        """Math throughput of one kernel before wave quantization, FLOP/s: the GEMM peak of
        its precision x the measured matmul efficiency (x the fused-attention efficiency for
        FlashAttention kernels), or the vector (CUDA-core / VPU) peak for element-wise ones."""
        if not kernel.gemm:
            return self.vector_flops_per_s
        key = (kernel.precision or self.precision, kernel.fused, kernel.impl)
        r = self._rates.get(key)
        if r is None:
            prec = key[0] if self.spec.supports(key[0]) else self.precision
            r = self.spec.achievable_flops(prec)
            if kernel.fused is not None:
                r = self.spec.peak_flops(prec) * self.spec.attention_fraction(kernel.fused,
                                                                              kernel.impl)
            self._rates[key] = r
        return r

    def _times(self, block, math_scale: float = 1.0, mem_scale: float = 1.0):
        """Per-kernel ``(duration, math time at the top clock, vector?)`` arrays."""
        ks = block.kernels
        fl = np.array([k.flops * k.executed for k in ks], dtype=float)
        by = np.array([k.bytes for k in ks], dtype=float)
        gemm = np.array([k.gemm for k in ks], dtype=bool)
        units = self.spec.compute_units
        waves = np.array([best_wave_efficiency(k.shape, units, self.tiles) if k.fused is None
                          else 1.0 for k in ks])
        rate = np.array([self._rate(k) for k in ks]) * waves
        kh = self.spec.gemm_k_half
        if kh > 0:  # short main loops: the tile prologue / epilogue is not amortised
            rate = rate / np.array([1.0 + kh / k.depth if k.depth else 1.0 for k in ks])
        t_math = fl / rate
        t_mem = by / self.mem_bytes_per_s * mem_scale
        dur = np.maximum(t_math * math_scale, t_mem) + self.overhead_s
        return dur, t_math, gemm

    def kernel_times(self, block) -> np.ndarray:
        """Duration of each kernel of ``block`` at the top clock and nominal memory, s."""
        return self._times(block)[0]

    def _compute(self, block, math_scale: float, mem_scale: float) -> BlockCost:
        dur, t_math, gemm = self._times(block, math_scale, mem_scale)
        fl = np.array([k.flops for k in block.kernels], dtype=float)
        by = np.array([k.bytes for k in block.kernels], dtype=float)
        math_s = float(np.sum(t_math))
        # u_c * dur * P_dyn, summed over kernels: tensor-core math at the full dynamic power,
        # vector math (element-wise kernels) at the vector units' share of it
        compute_j = float(t_math[gemm].sum() + self.vector_power * t_math[~gemm].sum()
                          ) * self.dynamic_max_w
        memory_j = float(np.sum(by) * self.hbm_j_per_byte)
        total = float(dur.sum())
        return BlockCost(total, float(fl[gemm].sum()), compute_j, memory_j,
                         total * self.spec.idle_w, math_s)


@dataclass
class DeviceStats:
    """Per-device time and energy of one accelerator agent (all its devices alike)."""

    compute_s: float = 0.0
    gemm_flops: float = 0.0
    compute_j: float = 0.0
    memory_j: float = 0.0
    static_j: float = 0.0
    idle_j: float = 0.0
    regulator_j: float = 0.0
    transition_j: float = 0.0      # rail-charge part of regulator_j
    transitions: int = 0
    stall_s: float = 0.0           # compute stream stalled by DVFS transitions
    cap_stretch_s: float = 0.0     # blocks lengthened to respect the power cap
    throttle_steps: int = 0
    busy_mhz_s: float = 0.0        # integral of the clock over compute time
    comm_j: float = 0.0            # communication kernels' HBM + SM energy (in memory/compute)
    h2d_j: float = 0.0             # of it: host-to-device copies' HBM writes (in memory)
    max_temp_c: float = -math.inf
    source: Callable[[], np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def segments(self) -> np.ndarray:
        """``(t_start, t_end, watts)`` rows of every power segment so far (W per device)."""
        return self.source()[:, :3] if self.source is not None else np.empty((0, 3))


class Accelerator:
    """Agent for the devices of one rank class: runs compute blocks, owns their clock,
    temperature and power accounting.

    The executor calls :meth:`compute` for every compute instruction and :meth:`wait_start` /
    :meth:`wait_end` around the times the compute stream is blocked on communication (used by
    bubble-aware down-clocking). The clock is the slowest of: the DVFS policy's clock for this
    stage, the power-cap ceiling, the thermal-throttle ceiling and the cluster manager's cap;
    a change takes effect at the next block after a transition that stalls the device.

    Args:
        env: SimPy environment.
        cls: rank class id.
        n_devices: devices this agent stands for.
        model: roofline/energy model of the device type.
        recorder: trace sink (ops; DVFS stalls are recorded as ops of kind ``dvfs``).
        jitter_sigma: lognormal sigma of compute-duration noise (0: none).
        rng: generator for the noise (required when ``jitter_sigma > 0``).
        power: the run's power setup (default: the basic settings of an empty ``power``).
        stage: pipeline stage of the class (selects the stage's clock and cap ceiling).
        member_rngs: a tensor-parallel group as one agent (``twin.build.uses_tp_groups``):
            one generator per member, the stream that member's own agent would draw its
            jitter from; a block then lasts until its last member ends (each member starts
            as far behind the group's clock as it was left by the blocks since the last
            :meth:`sync`), and its energy is booked for the members' mean busy time, the rest
            of the span idle.
    """

    def __init__(self, env: simpy.Environment, cls: int, n_devices: int, model: ComputeModel,
                 recorder: Recorder, jitter_sigma: float = 0.0,
                 rng: np.random.Generator | None = None, power: PowerSetup | None = None,
                 stage: int = 0, member_rngs: list[np.random.Generator] | None = None):
        self.env = env
        self.cls = cls
        self.n = n_devices
        self.model = model
        self.idle_w = model.spec.idle_w
        self.recorder = recorder
        self.jitter_sigma = jitter_sigma
        self.rng = rng
        # pre-drawn duration factors and the next one's index (see _jitter, _group_span)
        self._factors = Factors([], [], [])
        self._jitter_i = 0
        # a TP group as one agent: its members' streams and how far each member is behind the
        # group's clock, s (see _group_span: () after a sync, a block's (span, dur, flat
        # factors, block) until another block needs the values)
        self._members = member_rngs if jitter_sigma > 0 and member_rngs else None
        self._lags: list[float] | tuple | None = () if self._members else None
        self.stats = DeviceStats(source=self.power_segments)
        self.slowdown = 1.0         # straggler factor on block durations (faults set it)
        self.mem_scale = 1.0        # factor on memory time (contention, HBM degradation)
        self.memory = None          # HBM contention model (devices.memory) of the device agent
        self.streams = None         # shared HBM / SMs (devices.interference), None: roofline
        self.power = setup = power if power is not None else PowerSetup(None, model)
        self.dev = dev = setup.dev
        self.reg = dev.regulator
        self.stage = stage
        spec = setup.spec
        # clock: policy, cap, thermal and manager ceilings (P-state indices, 0 = fastest)
        # PowerSetup holds both for every stage 0..pp-1; a missing stage is a builder bug
        self.work_ps = setup.stage_ps[stage]
        self.cap_ps = setup.cap_ps[stage]
        self.cap_w = setup.cap_w
        self._chip_cap = (self.reg.output_for_input(self.cap_w) if math.isfinite(self.cap_w)
                          else math.inf)
        self.thermal_ps = 0
        self.manager_ps = 0
        self.ps = self._target()
        self._started = False
        self.latency_s = setup.latency_s
        self._tr_end = -math.inf
        self._tr_to = self._tr_hi = self.ps
        self._tr_w = 0.0
        # leakage and thermal
        self._base = dev.base_w
        self._leak_w = dev.leak_w
        self._leak_k = dev.leak_per_k
        self._leak_ref = dev.leak_ref_c
        self.thermal = setup.thermal
        self.ambient_c = setup.ambient_for(cls)
        self._ambient_next: float | None = None
        self.temp_c = setup.initial_temp_c(self.ambient_c, stage)
        self.stats.max_temp_c = self.temp_c
        th = spec.thermal
        self.temp_limit_c = self.thermal.limit_c if self.thermal else math.inf
        self._throttle = self.thermal is not None and th.throttle and dev.n_states > 1
        self._throttle_dt = th.throttle_interval_s
        self._next_throttle_t = 0.0
        self._hyst = th.hysteresis_k
        self._alert_armed = True
        self._max_step = th.max_step_s if self.thermal is not None else math.inf
        # bubble-aware down-clocking
        d = spec.dvfs
        self._bubble = d.bubble_downclock and dev.n_states > 1
        self._wait_kinds = frozenset(d.wait_kinds)
        self._wait_ps = setup.wait_ps
        self._min_wait = d.min_wait_us * 1e-6
        self._wait_pred: dict[str, float] = {}
        self._wait: tuple[str, float] | None = None
        # accounting
        self.last_t = 0.0
        self.energy_j = 0.0          # per device, accounted up to last_t
        self._busy: tuple[float, float] | None = None
        # power segments, 6 float64 per segment (see power_segments): a flat array, not a list
        # of tuples (a 1024-device run holds 4M of them: 4x the memory, and the heap the
        # garbage collector and the caches walk through)
        self._seg = array("d")
        self._packed = np.empty((0, 6))
        self._codes: dict[str, int] = {}
        self._costs: dict[tuple, tuple] = {}

    def _jitter(self) -> float:
        """The next lognormal factor (mean 1) on a block's duration (``devices.factors``)."""
        i = self._jitter_i
        buf = self._factors
        if i >= len(buf.f):
            buf = self._factors = draw_after(buf, self.jitter_sigma, self.rng, None)
            i = 0
        self._jitter_i = i + 1
        return buf.f[i]

    def _group_span(self, dur: float) -> tuple[float, float]:
        """``(span, mean busy)`` of a block of duration ``dur`` (s) on a TP-group agent:
        member ``j`` runs ``dur * f_j`` (its own stream's next factor, as :meth:`_jitter`
        draws it) from ``lag_j`` before the group's clock; the clock moves to the last
        member's end, and every member's lag to how far it is then behind it. The mean busy
        time is ``dur`` times the factors' mean.

        Most blocks start with the members in step (a collective or a send came before):
        then the span is ``dur`` times the largest factor (rounding is monotone, so that is
        the largest ``dur * f_j`` to the bit) and the lags are kept as ``(span, dur, flat
        factors, block)`` (see ``devices.factors``), worked out only if another block follows
        before the members meet."""
        i = self._jitter_i
        buf = self._factors
        if i >= len(buf.fmax):
            buf = self._factors = draw_after(buf, self.jitter_sigma, self.rng, self._members)
            i = 0
        self._jitter_i = i + 1
        lags = self._lags
        if not lags:  # in step
            span = dur * buf.fmax[i]
            self._lags = (span, dur, buf.f, i)
            return span, dur * buf.fmean[i]
        k = len(self._members)
        if type(lags) is tuple:  # the lags the previous block left
            last, d0, flat, r = lags
            lags = [last - d0 * f for f in flat[r * k:r * k + k]]
        # (plain floats: a handful of members, where NumPy's per-call cost dominates)
        d = [dur * f for f in buf.f[i * k:i * k + k]]
        span = max([x - lag for x, lag in zip(d, lags, strict=True)])
        self._lags = [lag + span - x for x, lag in zip(d, lags, strict=True)]
        return span, dur * buf.fmean[i]

    def sync(self) -> None:
        """The members of a TP-group agent meet (a collective, a wait, a send): none is
        behind the group's clock any more (nor its device agent's). Nothing to do for a
        one-rank agent."""
        if self._lags is not None:
            self._lags = ()
        if self.streams is not None:
            self.streams.sync()

    def checkpoint(self) -> tuple:
        """Everything :meth:`run_at`, :meth:`sync`, :meth:`communication` and the idle
        accounting change, as it stands now: :meth:`restore` takes the agent back here
        (``workloads.optimistic``: work run ahead of the clock that other traffic reached)."""
        return (tuple(vars(self.stats).values()), self.last_t, self.energy_j, len(self._seg),
                self.temp_c, self._alert_armed, len(self.power.alert_rows), self.ambient_c,
                self._ambient_next, self._started, self.ps, self._jitter_i, self._factors,
                self._lags)  # (lags: replaced, never changed in place)

    def restore(self, cp: tuple) -> None:
        """Return to a :meth:`checkpoint` of this agent (the random factors drawn since are
        drawn again, the same ones; power segments and temperature alerts since are gone)."""
        (stats, self.last_t, self.energy_j, n_seg, self.temp_c, self._alert_armed, n_alerts,
         self.ambient_c, self._ambient_next, self._started, self.ps, self._jitter_i,
         self._factors, self._lags) = cp
        vars(self.stats).update(zip(vars(self.stats), stats, strict=True))
        del self._seg[n_seg:]
        rows, me = self.power.alert_rows, f"cls{self.cls}"
        rows[n_alerts:] = [r for r in rows[n_alerts:] if r[2] != me]

    @property
    def has_temperature(self) -> bool:
        """Whether the die temperature enters the model: its thermal model, or the leakage at
        a held temperature (``power.thermal.enabled: false``). Without either (a device with
        no thermal and no leakage data) ``temp_c`` is a placeholder, reported as NaN."""
        return self.thermal is not None or self.dev.has_leakage

    @staticmethod
    def sigma_for_cov(cov: float) -> float:
        """Lognormal sigma giving coefficient of variation ``cov``."""
        return math.sqrt(math.log1p(cov * cov)) if cov > 0 else 0.0

    # ------------------------------------------------------------------ execution
    def _target(self) -> int:
        return max(self.work_ps, self.cap_ps, self.thermal_ps, self.manager_ps)

    def _block(self, block, ps: int, mem_scale: float | None = None) -> tuple:
        dev = self.dev
        ms = self.mem_scale if mem_scale is None else mem_scale
        c = self.model.block_cost(block, dev.math_scale[ps], ms)
        return (c.duration_s, c.gemm_flops, c.compute_j * dev.dyn_scale[ps], c.memory_j, block)

    def compute(self, block, iteration: int, mb: int, chunk: int, layer: int):
        """Process body: run ``block`` (a ``workloads.transformer.Block``) to completion."""
        env = self.env
        t0 = env.now
        if t0 > self.last_t:
            self._idle_to(t0)
        self._started = True
        if self._throttle and t0 >= self._next_throttle_t:
            self._throttle_check(t0)
        ps = self._target()
        if ps != self.ps or self._tr_end > t0:
            yield from self._switch(iteration)
            t0 = env.now
            ps = self.ps
        if self.streams is not None:  # HBM and SMs shared with the streams running now
            yield from self._fluid(block, t0, ps, self.streams.price(self, block, ps),
                                   (iteration, mb, chunk, layer))
            return
        c = self._cost(block, ps)
        dur, flops, e_dyn, e_mem, p_static, p_chip, p_board, span = self._price(c)
        self._busy = (t0, p_board)
        yield env.timeout(span)
        self._busy = None
        # the clock itself, except on a TP-group agent (t0 + its mean member's duration)
        self._account(block, t0, t0 + dur, flops, e_dyn, e_mem, p_static, p_chip, p_board, ps,
                      iteration, mb, chunk, layer)

    def _fluid(self, block, t0: float, ps: int, first, at: tuple, resumed: bool = False):
        """Process body: ``block`` from ``t0`` (s) at its starting price ``first``, re-priced as
        the streams beside it change (``DeviceStreams.run_block``); ``at``: (iteration, mb,
        chunk, layer); ``resumed``: ``t0`` is before now (taken back: :meth:`resume`)."""
        p_static, p_board, stretch = self._fluid_start(block, first)
        self._busy = (t0, p_board)
        _d, flops, e_dyn, e_mem = yield from self.streams.run_block(
            self, block, ps, stretch, first, t0 if resumed else None)
        self._busy = None
        self._fluid_account(block, t0, self.env.now, flops, e_dyn, e_mem, p_static, ps, at)

    def _fluid_start(self, block, first) -> tuple[float, float, float]:
        """(static W, board W, stretch) of a fluid block at its starting price ``first``
        (stretch: degradation, jitter and power-cap duty cycle on the agent's durations)."""
        c = (first.duration_s, first.gemm_flops, first.compute_j, first.memory_j, block)
        dur, _f, _d, _m, p_static, _c, p_board, _span = self._price(c)
        return p_static, p_board, dur / c[0] if c[0] > 0 else 1.0

    def _fluid_account(self, block, t0: float, t1: float, flops: float, e_dyn: float,
                       e_mem: float, p_static: float, ps: int, at: tuple) -> None:
        """Book a fluid block that ran from ``t0`` to ``t1`` (s) and did its work."""
        d = t1 - t0
        p_chip = (e_dyn + e_mem) / d + p_static if d > 0 else p_static
        self._account(block, t0, t1, flops, e_dyn, e_mem, p_static, p_chip,
                      self.reg.input_power(p_chip), ps, *at)

    def resume(self, block, t0: float, at: tuple):
        """Process body: :meth:`compute` of ``block`` from ``t0`` (s, before now) on, a block
        :meth:`run_at` ran alone and ``workloads.quiet`` took back, the agent restored."""
        if t0 > self.last_t:
            self._idle_to(t0)
        self._started = True
        yield from self._fluid(block, t0, self.ps, self.streams.price_alone(
            self, block, self.ps), at, resumed=True)

    def run_at(self, block, t0: float, iteration: int, mb: int, chunk: int,
               layer: int) -> float | None:
        """Run ``block`` from ``t0`` (s, not before the clock) without the clock: what
        :meth:`compute` does, at once; returns the block's end, s. None (nothing done beyond
        the idle time up to ``t0``) when the block needs the clock: a P-state change or
        transition, a throttle decision due, or a stream running on the device agent (beside
        none: :meth:`_alone_at`, taken back by ``workloads.quiet`` if one starts). Only where
        nothing else reads or changes this agent meanwhile (``Executor``'s ``run_ahead``);
        bit-identical to :meth:`compute`."""
        streams = self.streams
        if streams is not None and not streams.quiet:
            return None
        if t0 > self.last_t:
            self._idle_to(t0)
        self._started = True
        if self._throttle and t0 >= self._next_throttle_t:
            return None
        ps = self._target()
        if ps != self.ps or self._tr_end > t0:
            return None
        if streams is not None:
            return self._alone_at(block, t0, ps, (iteration, mb, chunk, layer))
        dur, flops, e_dyn, e_mem, p_static, p_chip, p_board, span = self._price(
            self._cost(block, ps))
        # what the clock reads after a timeout started at t0 (a group's span: its last member)
        self._account(block, t0, t0 + dur, flops, e_dyn, e_mem, p_static, p_chip, p_board, ps,
                      iteration, mb, chunk, layer)
        return t0 + span

    def _alone_at(self, block, t0: float, ps: int, at: tuple) -> float:
        """:meth:`run_at` beside no stream of the device agent: :meth:`_fluid` of a block
        nothing re-prices (one piece of fraction 1), the same operations in the same order."""
        first = self.streams.price_alone(self, block, ps)
        p_static, _b, stretch = self._fluid_start(block, first)
        total = first.duration_s * stretch
        t1 = t0 + total * 1.0 if total > 0 else t0
        self.streams.ran_alone(block, first)
        self._fluid_account(block, t0, t1, 0.0 + first.gemm_flops, 0.0 + first.compute_j,
                            0.0 + first.memory_j, p_static, ps, at)
        return t1

    def _cost(self, block, ps: int) -> tuple:
        """(duration s, FLOPs, dynamic J, HBM J, block) of ``block`` at P-state ``ps`` with the
        memory time as it is now, without a device agent (cached per block, state and memory
        factor; with one, :meth:`compute` asks the agent's ``price``)."""
        ms = self.mem_scale
        key = (id(block), ps, ms)
        c = self._costs.get(key)
        if c is None:
            c = self._costs[key] = self._block(block, ps, ms)
        return c

    def _price(self, c: tuple) -> tuple[float, float, float, float, float, float, float, float]:
        """Duration (straggler and jitter factors applied, duty-cycled down to the power cap)
        and power of a block of cost ``c`` at the current temperature: (duration s, FLOPs,
        dynamic J, HBM J, static W, chip W, board W, span s). The span is the time the agent
        is occupied: the duration, except on a TP-group agent (the members' mean busy time
        is the duration there, the span lasts until the last member ends)."""
        dur, flops, e_dyn, e_mem, _ = c
        dur *= self.slowdown
        span = None
        if self._members is not None:
            span, dur = self._group_span(dur)
        elif self.jitter_sigma > 0:
            dur *= self._jitter()
        leak = self._leak_w[self.ps]
        if self._leak_k:
            leak *= math.exp(self._leak_k * (self.temp_c - self._leak_ref))
        p_static = self._base + leak
        if dur <= 0:  # an empty block takes no time and no energy
            e_dyn = e_mem = 0.0
        e_act = e_dyn + e_mem
        p_chip = e_act / dur + p_static if dur > 0 else p_static
        p_board = self.reg.input_power(p_chip)
        if p_board > self.cap_w and dur > 0:
            chip_cap = self._chip_cap
            if chip_cap > p_static:  # duty-cycle the block down to the cap
                new = e_act / (chip_cap - p_static)
                self.stats.cap_stretch_s += new - dur
                if span is not None:  # a group: its mean member is stretched as much
                    span += new - dur
                dur = new
                p_chip = e_act / dur + p_static
                p_board = self.reg.input_power(p_chip)
        return dur, flops, e_dyn, e_mem, p_static, p_chip, p_board, dur if span is None else span

    def _account(self, block, t0: float, t1: float, flops: float, e_dyn: float, e_mem: float,
                 p_static: float, p_chip: float, p_board: float, ps: int, iteration: int,
                 mb: int, chunk: int, layer: int) -> None:
        """Book a block that ran from ``t0`` to ``t1`` (s): stats, power segment, trace op."""
        st = self.stats
        d = t1 - t0
        st.compute_s += d
        st.gemm_flops += flops
        st.compute_j += e_dyn
        st.memory_j += e_mem
        st.static_j += p_static * d
        st.regulator_j += (p_board - p_chip) * d
        st.busy_mhz_s += self.dev.mhz[ps] * d
        self.last_t = t1
        self._segment(t0, t1, p_board, block.name, ps, p_chip)
        if self._ambient_next is not None:
            self.ambient_c, self._ambient_next = self._ambient_next, None
        self.recorder.op(self.cls, iteration, "compute", "compute", block.name, mb, chunk,
                         layer, t0, t1, flops)

    def _switch(self, iteration: int):
        """Process body: finish a pending transition, then move to the target P-state."""
        env = self.env
        t0 = env.now
        if self._tr_end > t0:
            yield env.timeout(self._tr_end - t0)
            self._idle_to(max(env.now, self._tr_end))
        ps = self._target()
        if ps != self.ps:
            self._start_transition(ps)
            if self.latency_s:
                yield env.timeout(self.latency_s)
                self._idle_to(max(env.now, self._tr_end))
        t1 = env.now
        if t1 > t0:
            self.stats.stall_s += t1 - t0
            self.recorder.op(self.cls, iteration, "compute", "dvfs", "dvfs", -1, -1, -1, t0, t1,
                             0.0)

    def _start_transition(self, ps: int) -> None:
        """Begin moving from the current P-state to ``ps`` (accounting is up to now)."""
        st = self.stats
        st.transitions += 1
        if not self.latency_s:
            self.ps = ps
            return
        dev = self.dev
        self._tr_to = ps
        self._tr_hi = min(self.ps, ps)
        self._tr_end = self.env.now + self.latency_s
        self._tr_w = self.reg.transition_energy(dev.volts[self.ps], dev.volts[ps]) / self.latency_s

    def _throttle_check(self, t: float) -> None:
        """Thermal throttle: one P-state down above the limit, one up below limit - hyst."""
        self._next_throttle_t = t + self._throttle_dt
        if self.temp_c >= self.temp_limit_c:
            if self.thermal_ps < self.dev.n_states - 1:
                self.thermal_ps += 1
                self.stats.throttle_steps += 1
        elif self.temp_c < self.temp_limit_c - self._hyst and self.thermal_ps > 0:
            self.thermal_ps -= 1

    # ------------------------------------------------------------------ hooks
    def downclocks(self, kind: str) -> bool:
        """Whether waits of ``kind`` (``tp``, ``recv``, ...) may change the clock (bubble-aware
        down-clocking): such a wait needs the simulation clock."""
        return self._bubble and kind in self._wait_kinds

    def wait_start(self, kind: str) -> None:
        """The compute stream starts waiting (``tp``, ``recv``, ``dp_wait``)."""
        if not self._bubble or kind not in self._wait_kinds:
            return
        now = self.env.now
        self._wait = (kind, now)
        pred = self._wait_pred.get(kind)
        if pred is not None and pred < self._min_wait:
            return
        if now > self.last_t:
            self._idle_to(now)
        self._started = True
        target = max(self._wait_ps, self._target())
        if target != self.ps and self._tr_end <= now:
            self._start_transition(target)

    def wait_end(self, kind: str) -> None:
        """The compute stream stops waiting."""
        w = self._wait
        if w is not None and w[0] == kind:
            self._wait_pred[kind] = self.env.now - w[1]
            self._wait = None

    def set_frequency_cap(self, mhz: float) -> None:
        """Cluster manager: run no faster than ``mhz`` (from the next block on)."""
        self.manager_ps = self.dev.floor_state(mhz)
        if not self._started:
            self.ps = self._tr_to = self._tr_hi = self._target()

    def set_ambient(self, celsius: float) -> None:
        """Change the inlet air temperature (e.g. a cooling failure), C. Takes effect now, or,
        if a block is running, when it ends (its segment keeps the old ambient)."""
        if self._busy is not None:
            self._ambient_next = float(celsius)
            return
        if self.env.now > self.last_t:
            self._idle_to(self.env.now)
        self.ambient_c = float(celsius)

    def energy_at(self, t: float) -> float:
        """Energy of one device from 0 to ``t`` (``t`` = now), J (telemetry)."""
        if self._busy is not None:
            t0, watts = self._busy
            return self.energy_j + watts * (t - t0)
        if t > self.last_t:
            self._idle_to(t)
        return self.energy_j

    # ------------------------------------------------------------------ communication
    def communication(self, t0: float, t1: float, hbm_bytes: float, sms: float,
                      activity: float, copy: bool = False) -> None:
        """Energy of a communication kernel on each of the agent's devices from ``t0`` to
        ``t1`` (s): its ``hbm_bytes`` (per device, B) at the HBM access energy (memory) and
        ``sms`` of the device's SMs at ``activity`` of a GEMM's dynamic power at the current
        P-state for its duration (compute). Added on top of whatever the device did meanwhile,
        as a power segment of its own (``comm``) overlapping the others; the regulator loss
        and the heat of it are not modelled. ``copy``: a host-to-device copy's HBM writes
        (``sms`` 0: copy engines), also counted in ``stats.h2d_j``."""
        d = t1 - t0
        if d <= 0:
            return
        dev = self.dev
        units = self.model.spec.compute_units or 0
        e_mem = hbm_bytes * dev.hbm_j_per_byte
        e_dyn = (d * min(sms, units) / units * dev.dyn_max_w * activity * dev.dyn_scale[self.ps]
                 if units else 0.0)
        if e_mem + e_dyn <= 0:
            return
        st = self.stats
        st.memory_j += e_mem
        st.compute_j += e_dyn
        st.comm_j += e_mem + e_dyn
        if copy:
            st.h2d_j += e_mem
        self.energy_j += e_mem + e_dyn
        code = self._codes.get("comm")
        if code is None:
            code = self._codes["comm"] = len(self._codes)
        self._seg.frombytes(_SEGMENT(t0, t1, (e_mem + e_dyn) / d, code, self.ps, self.temp_c))

    # ------------------------------------------------------------------ accounting
    def idle_until(self, t: float) -> None:
        """Account idle power (and any DVFS transition in progress) up to ``t``."""
        if t > self.last_t:
            self._idle_to(t)

    def _idle_to(self, t: float) -> None:
        st, dev = self.stats, self.dev
        while self.last_t < t:
            t0 = self.last_t
            moving = self._tr_end > t0
            if moving:
                t1 = t if t < self._tr_end else self._tr_end
                ps = self._tr_hi
                chip = self._base + dev.leakage(ps, self.temp_c)
                extra = self._tr_w
                state = "dvfs"
            else:
                t1 = t if t - t0 <= self._max_step else t0 + self._max_step
                ps = self.ps
                chip = self._base + dev.leakage(ps, self.temp_c)
                extra = 0.0
                state = "idle"
            p_board = self.reg.input_power(chip) + extra
            d = t1 - t0
            st.idle_j += chip * d
            st.regulator_j += (p_board - chip) * d
            st.transition_j += extra * d
            self.last_t = t1
            self._segment(t0, t1, p_board, state, ps, chip)
            if moving and t1 >= self._tr_end:
                self.ps = self._tr_to

    def _segment(self, t0: float, t1: float, watts: float, state: str, ps: int,
                 heat_w: float) -> None:
        """Record one constant-power segment; advance the temperature over it."""
        d = t1 - t0
        self.energy_j += watts * d
        th = self.thermal
        if th is not None and d > 0:
            temp0 = self.temp_c
            ss = self.ambient_c + th.r * heat_w  # closed form of the RC model (devices.thermal)
            temp1 = ss + (temp0 - ss) * math.exp(-d / th.tau)
            lim = self.temp_limit_c
            if self._alert_armed and temp1 >= lim:
                dt = th.crossing(temp0, heat_w, lim, self.ambient_c)
                self.power.alert_rows.append((t0 + min(dt, d), "temperature", f"cls{self.cls}",
                                              temp1, lim))
                self._alert_armed = False
            elif temp1 < lim - self._hyst:
                self._alert_armed = True
            self.temp_c = temp1
            if temp1 > self.stats.max_temp_c:
                self.stats.max_temp_c = temp1
        code = self._codes.get(state)
        if code is None:
            code = self._codes[state] = len(self._codes)
        self._seg.frombytes(_SEGMENT(t0, t1, watts, code, ps, self.temp_c))

    def power_segments(self) -> np.ndarray:
        """All power segments so far, shape (n, 6): t_start, t_end, watts (per device),
        state code, P-state index, temperature at t_end (C). Read-only; packed once and
        reused until new segments arrive (the summary asks for it several times per agent)."""
        if 6 * len(self._packed) != len(self._seg):
            # a copy: the array keeps growing, and a NumPy view would pin its buffer
            self._packed = np.array(self._seg, dtype=float).reshape(-1, 6)
            self._packed.flags.writeable = False
        return self._packed

    def state_names(self) -> list[str]:
        """Names of the state codes of :meth:`power_segments` (block names, idle, dvfs)."""
        return sorted(self._codes, key=self._codes.__getitem__)

    def energy_breakdown(self) -> dict[str, float]:
        """Energy of all devices of this agent by component, J."""
        st, n = self.stats, self.n
        return {"compute": st.compute_j * n, "memory": st.memory_j * n, "static": st.static_j * n,
                "idle": st.idle_j * n, "regulator": st.regulator_j * n}

