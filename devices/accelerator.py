"""Accelerator compute model: roofline kernel times and the energy of each block.

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

from dataclasses import dataclass

import numpy as np

from devices.spec import DeviceSpec


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

    def block_cost(self, block) -> BlockCost:
        """Cost of a ``workloads.transformer.Block`` (cached by identity of its kernels)."""
        key = block.kernels
        cost = self._cache.get(key)
        if cost is None:
            cost = self._compute(block)
            self._cache[key] = cost
        return cost

    def _compute(self, block) -> BlockCost:
        fl = np.array([k.flops for k in block.kernels], dtype=float)
        by = np.array([k.bytes for k in block.kernels], dtype=float)
        gemm = np.array([k.gemm for k in block.kernels], dtype=bool)
        rate = np.where(gemm, self.gemm_flops_per_s, self.vector_flops_per_s)
        t_math = fl / rate
        t_mem = by / self.mem_bytes_per_s
        dur = np.maximum(t_math, t_mem) + self.overhead_s
        compute_j = float(np.sum(t_math * self.dynamic_max_w))  # u_c * dur * P_dyn
        memory_j = float(np.sum(by) * self.hbm_j_per_byte)
        total = float(dur.sum())
        return BlockCost(total, float(fl[gemm].sum()), compute_j, memory_j,
                         total * self.spec.idle_w)
