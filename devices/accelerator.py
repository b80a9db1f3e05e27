"""Accelerators: the roofline compute model and the device agent that executes blocks.

A kernel takes ``max(flops / F, bytes / M) + overhead`` seconds, where ``F`` is the achievable
GEMM throughput at the run's precision (datasheet peak x measured matmul efficiency) for GEMMs
and the fp32 vector peak for element-wise kernels, ``M`` the achievable HBM bandwidth, and
``overhead`` the per-kernel launch/tail time; all from the device catalog.

Power while a kernel runs (basic model, per device):

``P = idle_w + u_c * (tdp_w - idle_w - P_hbm_max) + hbm_bytes/s * e_hbm``

with ``u_c`` the fraction of the kernel's time its math units are busy
(``flops / F / duration``) and ``P_hbm_max`` the HBM power at full bandwidth, so a kernel that
saturates both never exceeds the TDP. Energy is integrated exactly per kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import simpy

from devices.spec import DeviceSpec
from twin.records import Recorder


@dataclass(frozen=True)
class BlockCost:
    """Duration and per-device energy of a compute block."""

    duration_s: float
    gemm_flops: float        # model FLOPs (GEMM/attention) of the block
    compute_j: float         # dynamic energy of the math units
    memory_j: float          # HBM access energy
    static_j: float          # baseline (idle-level) power during the block


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
        vec = "fp32" if "fp32" in spec.peak_tflops else precision
        self.vector_flops_per_s = spec.achievable_flops(vec)
        self.mem_bytes_per_s = spec.hbm_bytes_per_s
        self.overhead_s = spec.kernel_overhead_us * 1e-6
        self.hbm_j_per_byte = hbm_pj_per_bit * 8e-12
        self.hbm_max_w = spec.hbm_bandwidth_gbps * 1e9 * self.hbm_j_per_byte
        self.dynamic_max_w = max(spec.tdp_w - spec.idle_w - self.hbm_max_w, 0.0)
        self._cache: dict[object, BlockCost] = {}

    def block_cost(self, block, math_scale: float = 1.0, mem_scale: float = 1.0) -> BlockCost:
        """Cost of a ``workloads.transformer.Block``, cached.

        Args:
            block: the block.
            math_scale: multiplies every kernel's math time (e.g. ``f_max / f`` under DVFS).
            mem_scale: multiplies every kernel's memory time (e.g. HBM contention or
                degradation).
        """
        key = (block.kernels, math_scale, mem_scale)
        cost = self._cache.get(key)
        if cost is None:
            cost = self._compute(block, math_scale, mem_scale)
            self._cache[key] = cost
        return cost

    def _compute(self, block, math_scale: float, mem_scale: float) -> BlockCost:
        fl = np.array([k.flops for k in block.kernels], dtype=float)
        by = np.array([k.bytes for k in block.kernels], dtype=float)
        gemm = np.array([k.gemm for k in block.kernels], dtype=bool)
        rate = np.where(gemm, self.gemm_flops_per_s, self.vector_flops_per_s)
        t_math = fl / rate
        t_mem = by / self.mem_bytes_per_s * mem_scale
        dur = np.maximum(t_math * math_scale, t_mem) + self.overhead_s
        compute_j = float(np.sum(t_math * self.dynamic_max_w))  # u_c * dur * P_dyn
        memory_j = float(np.sum(by) * self.hbm_j_per_byte)
        total = float(dur.sum())
        return BlockCost(total, float(fl[gemm].sum()), compute_j, memory_j,
                         total * self.spec.idle_w)


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
    last_t: float = 0.0
    segments: list[tuple[float, float, float]] = field(default_factory=list)


class Accelerator:
    """Agent for the devices of one rank class: runs compute blocks and accounts their power.

    The executor calls :meth:`compute` for every compute instruction and :meth:`wait_start` /
    :meth:`wait_end` around the times the compute stream is blocked on communication (hooks for
    power policies). Power is piecewise constant: one segment per block at the block's mean
    power, idle segments in between; energy is integrated exactly.

    Args:
        env: SimPy environment.
        cls: rank class id.
        n_devices: devices this agent stands for.
        model: roofline/energy model of the device type.
        recorder: trace sink.
        jitter_sigma: lognormal sigma of compute-duration noise (0: none).
        rng: generator for the noise (required when ``jitter_sigma > 0``).
    """

    def __init__(self, env: simpy.Environment, cls: int, n_devices: int, model: ComputeModel,
                 recorder: Recorder, jitter_sigma: float = 0.0,
                 rng: np.random.Generator | None = None):
        self.env = env
        self.cls = cls
        self.n = n_devices
        self.model = model
        self.idle_w = model.spec.idle_w
        self.recorder = recorder
        self.jitter_sigma = jitter_sigma
        self.rng = rng
        self.stats = DeviceStats()
        self.slowdown = 1.0         # straggler factor on block durations (faults set it)
        self.mem_scale = 1.0        # factor on memory time (contention, HBM degradation)

    @staticmethod
    def sigma_for_cov(cov: float) -> float:
        """Lognormal sigma giving coefficient of variation ``cov``."""
        return math.sqrt(math.log1p(cov * cov)) if cov > 0 else 0.0

    def compute(self, block, iteration: int, mb: int, chunk: int, layer: int):
        """Process body: run ``block`` (a ``workloads.transformer.Block``) to completion."""
        env, st = self.env, self.stats
        c = self.model.block_cost(block, 1.0, self.mem_scale)
        dur = c.duration_s * self.slowdown
        if self.jitter_sigma > 0:
            s = self.jitter_sigma
            dur *= float(self.rng.lognormal(-0.5 * s * s, s))
        t0 = env.now
        self.idle_until(t0)
        yield env.timeout(dur)
        static = self.idle_w * dur
        st.compute_s += dur
        st.gemm_flops += c.gemm_flops
        st.compute_j += c.compute_j
        st.memory_j += c.memory_j
        st.static_j += static
        st.last_t = env.now
        watts = (c.compute_j + c.memory_j + static) / dur if dur > 0 else 0.0
        self._segment(t0, env.now, watts, block.name)
        self.recorder.op(self.cls, iteration, "compute", "compute", block.name, mb, chunk,
                         layer, t0, env.now, c.gemm_flops)

    def wait_start(self, kind: str) -> None:
        """The compute stream starts waiting (``tp``, ``recv``, ``dp_wait``)."""

    def wait_end(self, kind: str) -> None:
        """The compute stream stops waiting."""

    def idle_until(self, t: float) -> None:
        """Account idle power from the end of the last block up to ``t``."""
        st = self.stats
        if t > st.last_t:
            st.idle_j += (t - st.last_t) * self.idle_w
            self._segment(st.last_t, t, self.idle_w, "idle")
            st.last_t = t

    def _segment(self, t0: float, t1: float, watts: float, state: str) -> None:
        self.stats.segments.append((t0, t1, watts))
        self.recorder.power(self.cls, t0, t1, watts, state)

    def energy_breakdown(self) -> dict[str, float]:
        """Energy of all devices of this agent by component, J."""
        st, n = self.stats, self.n
        return {"compute": st.compute_j * n, "memory": st.memory_j * n, "static": st.static_j * n,
                "idle": st.idle_j * n, "regulator": st.regulator_j * n}


def peak_power(agents: list[Accelerator]) -> float:
    """Peak of the summed device power over the run, W (exact, from the power segments)."""
    times, deltas = [], []
    for a in agents:
        if not a.stats.segments:
            continue
        seg = np.asarray(a.stats.segments)
        times += [seg[:, 0], seg[:, 1]]
        deltas += [seg[:, 2] * a.n, -seg[:, 2] * a.n]
    if not times:
        return 0.0
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    order = np.lexsort((d, t))  # at equal times apply decreases first
    return float(np.cumsum(d[order]).max())
