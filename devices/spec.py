"""Typed hardware specs: accelerators and links.

These models validate both catalog entries (``devices/catalog/*/*.yaml``) and specs given
inline in a scenario. Units are in the key names: ``_tflops`` = 1e12 FLOP/s, ``_gbps`` =
1e9 bytes/s (gigaBYTES per second, the convention of vendor datasheets), ``_gb`` = 1e9 bytes,
``_us`` = microseconds, ``_w`` = watts, ``_mhz`` = megahertz, ``_pj_per_bit`` = picojoules.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from twin.kernel.schema import (
    DieCelsius,
    Fraction,
    NonNegativeFloat,
    PositiveFloat,
    StrictModel,
)

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4"]

#: Bytes per element of each precision (storage format of operands).
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5,
}

class DeviceSpec(StrictModel):
    """An accelerator (GPU or TPU chip)."""

    name: str = Field(description="catalog name")
    description: str = ""
    kind: Literal["gpu", "tpu"] = Field(default="gpu", description="a label (no model reads "
                                        "it; the numbers below make the device)")
    peak_tflops: dict[Precision, PositiveFloat] = Field(
        description="dense peak per precision at clock_mhz, TFLOP/s (1e12 FLOP/s)")
    matmul_efficiency: dict[Precision, Fraction] = Field(
        description="best achievable fraction of peak for large GEMMs, per precision")
    kernel_overhead_us: Annotated[float, Field(ge=0, le=1e6)] = Field(
        description="fixed launch/tail overhead per kernel, microseconds")
    compute_units: int | None = Field(
        default=None, gt=0, description="units that each take one GEMM output tile at a time "
                                        "(GPU SMs); None: no wave quantization")
    nccl_channels: int | None = Field(
        default=None, ge=1, le=64, description="channels NCCL's ring collectives of large "
                                               "messages run on this device's node, one CTA "
                                               "(one SM) each (at most NCCL's 64; None: the "
                                               "interference catalog's collective_ctas)")
    gemm_tile: tuple[Annotated[int, Field(ge=1, le=1 << 16)],
                     Annotated[int, Field(ge=1, le=1 << 16)]] | None = Field(
        default=None, description="GEMM output tile [rows, cols] one unit computes")
    gemm_tiles: list[tuple[Annotated[int, Field(ge=1, le=1 << 16)],
                           Annotated[int, Field(ge=1, le=1 << 16)]]] | None = Field(
        default=None, max_length=64,
        description="further GEMM output tiles the GEMM library may pick; the one with the "
                    "best wave efficiency is used (gemm_tile is always a candidate)")
    gemm_k_half: Annotated[float, Field(ge=0, le=1e6)] = Field(
        default=0.0, description="reduction length at which a GEMM's main loop runs at half "
                                 "its peak: math time x (1 + gemm_k_half / k) for the tile "
                                 "prologue / epilogue (0: no k dependence)")
    vector_tflops: dict[Precision, PositiveFloat] | None = Field(
        default=None, description="peak of the vector units (CUDA cores / VPU) that run "
                                  "element-wise kernels, per precision, TFLOP/s; element-wise "
                                  "math runs in fp32")
    vector_power_fraction: Fraction = Field(
        default=1.0, description="dynamic power of the vector units at their peak, as a "
                                 "fraction of the dynamic power of dense tensor-core GEMMs")
    attention_efficiency: dict[Literal["fwd", "bwd"], Fraction] | None = Field(
        default=None, description="fused (FlashAttention) kernels: achieved fraction of the "
                                  "GEMM peak, forward and backward, of the best fused kernel "
                                  "for this device (`workload.attention: flash`; None: "
                                  "matmul_efficiency)")
    attention_kernels: dict[str, dict[Literal["fwd", "bwd"], Fraction]] | None = Field(
        default=None, description="named fused-attention implementations (flash1, flash2, "
                                  "triton, ...): achieved fraction of the GEMM peak, forward and "
                                  "backward, for `workload.attention: <name>`")
    hbm_gb: PositiveFloat = Field(description="HBM capacity, 1e9 bytes")
    hbm_bandwidth_gbps: PositiveFloat = Field(description="peak HBM bandwidth, GB/s")
    memory_efficiency: Fraction = Field(
        description="achievable fraction of peak HBM bandwidth for streaming kernels")
    hbm_type: str = Field(description="HBM generation (name in devices/catalog/hbm)")
    hbm_stacks: int = Field(gt=0, description="number of HBM stacks")
    hbm_pj_per_bit: PositiveFloat = Field(le=1e4, description="HBM access energy, pJ per bit "
                                          "moved (at most 1e4: a thousand times DRAM's ~10)")
    router_pj_per_bit: NonNegativeFloat | None = Field(
        default=None, description="on-chip router of a mesh / torus node: energy per bit it "
                                  "switches between its links and the device (injected, "
                                  "ejected or forwarded), pJ (None: not modelled)")
    clock_mhz: PositiveFloat | None = Field(
        default=None, description="boost clock at which peak_tflops is quoted (None: unpublished)")
    tdp_w: PositiveFloat = Field(le=1e5, description="board power limit (TDP/TGP), W (at most "
                                 "1e5: a hundred times any accelerator board)")
    idle_w: PositiveFloat = Field(le=1e5, description="board power when powered on and idle, W "
                                  "(at the lowest P-state and leakage_ref_c; at most 1e5)")
    # --- detailed power model (devices.power); absent fields give the basic model -----------
    p_states: list[tuple[PositiveFloat, PositiveFloat]] | None = Field(
        default=None, min_length=1, max_length=1024,
        description="voltage-frequency table: [[MHz, V], ...]; the highest frequency must "
                    "equal clock_mhz")
    leakage_w: NonNegativeFloat | None = Field(
        default=None, le=1e5, description="leakage (static) power at the top P-state's voltage and "
                                  "leakage_ref_c, W (part of idle_w)")
    leakage_ref_c: DieCelsius | None = Field(
        default=None, description="die temperature at which leakage_w and idle_w are given, C")
    leakage_per_k: Annotated[float, Field(ge=0, le=0.2)] | None = Field(
        default=None, description="leakage growth with die temperature: "
                                  "P_leak ~ exp(leakage_per_k * (T - leakage_ref_c)), 1/K")
    leakage_voltage_exponent: NonNegativeFloat | None = Field(
        default=None, description="leakage power ~ V ** exponent")
    thermal_r_k_per_w: PositiveFloat | None = Field(
        default=None, description="lumped thermal resistance die -> inlet air, K/W")
    thermal_c_j_per_k: PositiveFloat | None = Field(
        default=None, description="lumped thermal capacitance (die + heat sink), J/K")
    temp_limit_c: DieCelsius | None = Field(
        default=None, description="die temperature at which the device throttles, C")
    regulator_efficiency: list[tuple[NonNegativeFloat, Fraction]] | None = Field(
        default=None, description="voltage-regulator efficiency curve [[load, efficiency], ...] "
                                  "with load = output power / tdp_w")
    dvfs_transition_us: PositiveFloat | None = Field(
        default=None, description="voltage/frequency transition time (device stalls), us")
    regulator_capacitance_mf: NonNegativeFloat | None = Field(
        default=None, description="regulator output capacitance charged at a voltage change, mF")

    @model_validator(mode="after")
    def _consistent(self) -> DeviceSpec:
        missing = sorted(set(self.peak_tflops) - set(self.matmul_efficiency))
        if missing:
            raise ValueError(
                f"matmul_efficiency lacks precision(s) {missing} listed in peak_tflops")
        if not self.vector_tflops and "fp32" not in self.peak_tflops:
            raise ValueError("vector_tflops is required when peak_tflops has no fp32 entry "
                             "(element-wise kernels run on the vector units)")
        if (self.nccl_channels is not None and self.compute_units is not None
                and self.nccl_channels >= self.compute_units):
            raise ValueError(f"nccl_channels ({self.nccl_channels}) must be below "
                             f"compute_units ({self.compute_units}): a collective leaves at "
                             "least one SM to compute")
        if self.idle_w >= self.tdp_w:
            raise ValueError(f"idle_w ({self.idle_w}) must be below tdp_w ({self.tdp_w})")
        from devices.power import check_device_power  # the power model owns these rules

        check_device_power(self)
        return self

    def supports(self, precision: str) -> bool:
        """Whether the device has a peak figure for ``precision``."""
        return precision in self.peak_tflops

    def peak_flops(self, precision: str) -> float:
        """Dense peak for ``precision`` in FLOP/s."""
        return self.peak_tflops[precision] * 1e12  # type: ignore[index]

    def achievable_flops(self, precision: str) -> float:
        """Achievable GEMM throughput for ``precision`` in FLOP/s."""
        return self.peak_flops(precision) * self.matmul_efficiency[precision]  # type: ignore[index]

    def vector_flops(self) -> float:
        """Peak of the vector units for element-wise math (fp32), FLOP/s: ``vector_tflops``
        (fp32 entry, else its largest), else the fp32 entry of ``peak_tflops``."""
        if self.vector_tflops:
            v = self.vector_tflops.get("fp32") or max(self.vector_tflops.values())
            return v * 1e12
        if "fp32" in self.peak_tflops:
            return self.peak_tflops["fp32"] * 1e12
        raise ValueError(f"device {self.name}: no vector_tflops and no fp32 peak_tflops for "
                         "element-wise kernels")

    def attention_fraction(self, direction: str, impl: str = "flash") -> float:
        """Achieved fraction of the GEMM peak of a fused attention kernel: ``impl`` ``flash``
        is the device's best fused kernel (``attention_efficiency``), any other name an entry
        of ``attention_kernels`` (KeyError if the device has none of that name)."""
        if impl != "flash":
            return (self.attention_kernels or {})[impl][direction]  # type: ignore[index]
        if self.attention_efficiency and direction in self.attention_efficiency:
            return self.attention_efficiency[direction]  # type: ignore[index]
        return min(self.matmul_efficiency.values())

    def attention_names(self) -> tuple[str, ...]:
        """Values of ``workload.attention`` this device can run: flash, its named fused
        kernels, standard."""
        return ("flash", *sorted(self.attention_kernels or {}), "standard")

    def tile_candidates(self) -> tuple[tuple[int, int], ...]:
        """GEMM output tiles the library may choose from (empty: no wave quantization)."""
        if self.compute_units is None or self.gemm_tile is None:
            return ()
        return (tuple(self.gemm_tile), *tuple(tuple(t) for t in self.gemm_tiles or ()))

    @property
    def hbm_bytes(self) -> float:
        """HBM capacity in bytes."""
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        """Achievable HBM bandwidth in bytes/s."""
        return self.hbm_bandwidth_gbps * 1e9 * self.memory_efficiency

class LinkSpec(StrictModel):
    """One physical link type (one lane bundle of the kind the vendor counts as a link)."""

    name: str
    description: str = ""
    medium: Literal["nvlink", "infiniband", "ici", "pcie", "ethernet", "nvswitch"] = "nvlink"
    bandwidth_gbps: PositiveFloat = Field(description="nominal bandwidth per direction, GB/s")
    efficiency: Fraction = Field(
        description="achievable fraction of nominal bandwidth for bulk transfers")
    latency_us: NonNegativeFloat = Field(description="per-hop latency (wire + router), us")
    overhead_us: NonNegativeFloat = Field(
        description="per-message software/protocol overhead at the sender, us")
    energy_pj_per_bit: NonNegativeFloat = Field(le=1e4, description="transfer energy, pJ per "
                                                "bit (at most 1e4)")
    idle_w: NonNegativeFloat = Field(le=1e6, description="power of an idle link (both "
                                     "directions), W (at most 1e6, as device_w)")
    device_w: Annotated[float, Field(ge=0, le=1e6)] = Field(
        default=0.0, description="constant power of the network hardware serving one link "
                                 "while powered: its share of the switch ASIC(s), the NIC "
                                 "and the transceivers at its ends, W (counted with idle_w)")
    lanes: int | None = Field(
        default=None, gt=0, description="electrical lanes per direction (Shannon-Hartley bound "
                                        "of twin.limits; None: bound not available)")
    symbol_rate_gbaud: PositiveFloat | None = Field(
        default=None, le=1e6, description="symbol rate of one lane, GBd (at most 1e6: a "
                                          "petabaud lane); its Nyquist bandwidth "
                                          "symbol_rate / 2 is the channel bandwidth of the bound")
    links_per_gpu: int | None = Field(
        default=None, gt=0, le=1024, description="links of this type one device has (e.g. "
                                                  "NVLinks per GPU to its node NVSwitch)")
    noise_figure_db: NonNegativeFloat = Field(
        default=0.0, le=100.0, description="receiver noise figure of the bound, dB (0: only "
                                            "the thermal noise k T of the heat bath)")

    @property
    def bytes_per_s(self) -> float:
        """Achievable bandwidth per direction in bytes/s."""
        return self.bandwidth_gbps * 1e9 * self.efficiency
