"""Power: the scenario's ``power`` section and the electrical model of a device.

Electrical model of one device (chip + HBM on its board), at P-state ``k`` (frequency ``f_k``,
voltage ``V_k`` from the catalog's voltage-frequency table) and die temperature ``T``:

* leakage (static) ``P_leak = leakage_w (V_k / V_max)^n exp(a (T - T_ref))``;
* base ``P_base``: uncore, clocks, HBM background/refresh; constant;
* dynamic ``P_dyn = u * P_dyn,max (V_k / V_max)^2 (f_k / f_max)``, with ``u`` the fraction of a
  kernel's time its math units are busy: a kernel's math time grows as ``f_max / f_k`` while its
  switching energy ``C V^2`` per operation shrinks with ``V_k^2`` (so a block's dynamic energy
  is ``P_dyn,max (V_k / V_max)^2 t_math(f_max)``, independent of how long it takes);
* HBM access ``bytes x hbm_pj_per_bit``;
* the regulator's conversion loss on top (``devices.regulator``).

Two catalog figures pin the unknowns. ``idle_w`` is the board power of an idle device at its
lowest P-state and ``T_ref`` (what an idle-power measurement sees), which gives ``P_base``.
``tdp_w`` is the board power of a dense GEMM (math units fully busy, little HBM traffic) at the
top P-state at the temperature limit, which gives ``P_dyn,max``: dense GEMMs run at the board's
power limit (NVIDIA quotes the A100's HPL peak at the 1305 MHz it sustains at 400 W). A kernel
keeping both math and HBM busy may want more; the firmware power limit (``power.cap_w``,
default ``tdp_w``) holds the board at it by stretching the kernel. Without the
detailed catalog fields the model reduces to the basic one: one P-state, no leakage (all idle
power is ``P_base``), an ideal regulator, constant temperature:
``P = idle_w + u (tdp_w - idle_w) + HBM bytes/s x pJ/bit`` (held at ``tdp_w``).
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Literal

from pydantic import Field, model_validator

from devices.regulator import VoltageRegulator
from devices.thermal import ThermalRC
from twin.kernel.errors import InfeasibleConfig, Problem, ScenarioError
from twin.kernel.schema import (
    ABSOLUTE_ZERO_C,
    MAX_AMBIENT_C,
    AmbientCelsius,
    DieCelsius,
    Fraction,
    NonNegativeFloat,
    PositiveFloat,
    StrictModel,
)

WAIT_KINDS = ("tp", "recv", "dp_wait")
#: Die temperature (C) above which a steady state counts as a thermal runaway: far past any
#: silicon's destruction (~150-200 C junction limits), so a real fixed point is never cut off.
_RUNAWAY_C = 1000.0
#: Iterations of the die-temperature fixed point (converges in ~10-20 away from a tangency).
_FIXED_POINT_STEPS = 100_000


# ----------------------------------------------------------------------------- scenario schema
class DvfsSpec(StrictModel):
    """How the accelerators' clocks are chosen."""

    policy: Literal["fixed", "stage_plan"] = Field(
        default="fixed", description="fixed: one clock for every device; stage_plan: one clock "
                                     "per pipeline stage")
    frequency_mhz: PositiveFloat | None = Field(
        default=None, description="clock of the fixed policy, MHz (one of the device's "
                                  "P-states; default: the top one)")
    stage_frequency_mhz: list[PositiveFloat] | Literal["auto"] = Field(
        default="auto", description="stage_plan: one clock per stage, or auto (planned from the "
                                    "stages' compute times)")
    plan_slack: NonNegativeFloat = Field(
        default=0.01, description="auto plan: allowed growth of the estimated iteration time "
                                  "(fraction; 0.01 = EnvPipe's < 1% slowdown target)")
    bubble_downclock: bool = Field(
        default=False, description="drop to wait_frequency_mhz while the compute stream waits "
                                   "(pipeline bubbles, communication waits)")
    wait_frequency_mhz: PositiveFloat | None = Field(
        default=None, description="clock during waits, MHz (default: the lowest P-state)")
    wait_kinds: list[Literal["tp", "recv", "dp_wait", "data_wait"]] = Field(
        default=["recv", "dp_wait"], description="waits that down-clock")
    min_wait_us: NonNegativeFloat = Field(
        default=0.0, description="down-clock only if the previous wait of the same kind lasted "
                                 "at least this long, us")
    transition_latency_us: PositiveFloat | None = Field(
        default=None, description="DVFS transition time, us (default: the device's "
                                  "dvfs_transition_us)")


class ThermalSpec(StrictModel):
    """The lumped RC thermal model of every device."""

    enabled: bool = Field(default=True, description="false: die temperature stays at "
                                                    "initial_c (or the leakage reference)")
    ambient_c: AmbientCelsius = Field(default=25.0, description="inlet air temperature, C (ASHRAE "
                                                        "recommended range 18-27 C)")
    initial_c: DieCelsius | None = Field(
        default=None, description="die temperature at t = 0, C (default: see initial)")
    initial: Literal["warm", "idle"] = Field(
        default="warm", description="die temperature at t = 0 when initial_c is not given: "
                                    "warm = steady state of the stage's own compute load (a "
                                    "job already running: short runs do not understate "
                                    "leakage), idle = steady state of an idle device")
    inlet_gradient_k: float = Field(
        default=0.0, allow_inf_nan=False, description="inlet air temperature added across the "
        "grid by position, K (devices.position.inlet_offsets; nonzero turns symmetry off); "
        "ambient_c + inlet_gradient_k must stay an inlet temperature (absolute zero to "
        f"{MAX_AMBIENT_C:g} C)")
    inlet_gradient_along: Literal["x", "y", "center"] = Field(
        default="y", description="how the inlet gradient runs: along x or y (0 at coordinate "
                                 "0, the full gradient at the far side) or center (full at the "
                                 "grid's centre, 0 on its border)")
    throttle: bool = Field(default=True, description="lower the clock above temp_limit_c")
    throttle_interval_s: PositiveFloat = Field(
        default=0.5, description="throttle controller period: at most one P-state step per "
                                 "interval, s")
    hysteresis_k: PositiveFloat = Field(
        default=3.0, description="throttle releases (and temperature alerts re-arm) below "
                                 "limit - hysteresis, K")
    max_step_s: float = Field(
        default=1.0, ge=1e-6, allow_inf_nan=False,
        description="longest idle segment before leakage is re-evaluated at the new "
                    "temperature, s (at least 1e-6: the dies' RC time constants are tens of "
                    "seconds, and each step is an event of the run's budget)")

    @model_validator(mode="after")
    def _inlet_in_range(self) -> ThermalSpec:
        hottest = self.ambient_c + self.inlet_gradient_k
        if not ABSOLUTE_ZERO_C <= hottest <= MAX_AMBIENT_C:
            raise ValueError(
                f"inlet_gradient_k {self.inlet_gradient_k:g} K takes the inlet air of the far "
                f"devices to {hottest:g} C (ambient_c {self.ambient_c:g} C + the gradient); "
                f"allowed: ambient_c + inlet_gradient_k within [{ABSOLUTE_ZERO_C:g}, "
                f"{MAX_AMBIENT_C:g}] C")
        return self


class ManagerSpec(StrictModel):
    """Cluster power manager acting on delayed telemetry (off unless budget_w is set)."""

    budget_w: PositiveFloat | None = Field(
        default=None, description="facility power budget for accelerators + links, W")
    telemetry_delay_s: NonNegativeFloat = Field(
        default=0.0, description="age of the power reading the controller acts on, s")
    period_s: PositiveFloat = Field(
        default=0.1, description="telemetry sampling and control period, s")
    gain: PositiveFloat = Field(
        default=0.5, description="growth rate: cap <- cap * (1 + gain * headroom) per period")
    initial_frequency_mhz: PositiveFloat | None = Field(
        default=None, description="clock cap at t = 0, MHz (default: the lowest P-state)")


class AlertSpec(StrictModel):
    """Alert thresholds (second brief: 85% of supply design, MFU 30%, temperature limit)."""

    design_power_w: PositiveFloat | None = Field(
        default=None, description="power the supply is designed for, W (default: the manager "
                                  "budget, else devices x TDP + link idle power)")
    power_fraction: Fraction = Field(
        default=0.85, description="alert when the windowed power exceeds this fraction of "
                                  "design_power_w")
    window_s: float = Field(default=1.0, ge=1e-6, allow_inf_nan=False,
                            description="averaging window of power telemetry, s (>= 1 us: "
                                        "finer than any power sensor)")
    mfu_threshold: Fraction = Field(default=0.30,
                                    description="alert when MFU stays below this")
    mfu_iterations: int = Field(default=1, ge=1,
                                description="consecutive iterations below mfu_threshold")


class PowerSpec(StrictModel):
    """Power model options (the scenario's ``power`` section); defaults = fixed top clock, no
    cap, no manager, thermal model on."""

    dvfs: DvfsSpec = DvfsSpec()
    cap_w: PositiveFloat | None = Field(
        default=None, description="per-device board power cap, W")
    thermal: ThermalSpec = ThermalSpec()
    manager: ManagerSpec = ManagerSpec()
    alerts: AlertSpec = AlertSpec()
    communication_energy: bool = Field(
        default=False, description="collective and pipeline kernels draw device energy: "
        "their HBM bytes (read at the sender, written at the receiver) at hbm_pj_per_bit and "
        "the SMs they occupy as dynamic power (devices.interference catalog); false: "
        "communication costs the device only idle power")


# ----------------------------------------------------------------------------- device model
_LEAK = ("leakage_w", "leakage_ref_c", "leakage_per_k", "leakage_voltage_exponent")
_THERMAL = ("thermal_r_k_per_w", "thermal_c_j_per_k", "temp_limit_c")


class DevicePower:
    """Electrical model of one device type (see the module docstring).

    Attributes:
        mhz, volts: P-state table, fastest first (index 0 = top P-state).
        base_w: constant chip power (uncore, clocks, HBM background), W.
        dyn_max_w: dynamic power with math units fully busy at the top P-state, W.
        hbm_j_per_byte: HBM access energy, J/B.
        regulator: the core-rail regulator.
        thermal: RC model or ``None`` (no thermal data in the catalog).
    """

    def __init__(self, spec, hbm_pj_per_bit: float | None = None):
        self.spec = spec
        clock = spec.clock_mhz if spec.clock_mhz is not None else math.nan  # nan: unpublished
        table = sorted(spec.p_states or [(clock, 1.0)], key=lambda p: -p[0])
        self.mhz = [float(f) for f, _ in table]
        self.volts = [float(v) for _, v in table]
        self.has_pstates = spec.p_states is not None
        self.f_max, self.v_max = self.mhz[0], self.volts[0]
        self.math_scale = [self.f_max / f if self.has_pstates else 1.0 for f in self.mhz]
        self.dyn_scale = [(v / self.v_max) ** 2 for v in self.volts]
        self.has_leakage = spec.leakage_w is not None
        if self.has_leakage:
            self.leak_ref_w = spec.leakage_w
            self.leak_ref_c = spec.leakage_ref_c
            self.leak_per_k = spec.leakage_per_k
            n = spec.leakage_voltage_exponent
            self.leak_w = [self.leak_ref_w * (v / self.v_max) ** n for v in self.volts]
        else:
            self.leak_ref_w, self.leak_ref_c, self.leak_per_k = 0.0, 25.0, 0.0
            self.leak_w = [0.0] * len(self.mhz)
        if spec.thermal_r_k_per_w is not None:
            self.thermal: ThermalRC | None = ThermalRC(
                spec.thermal_r_k_per_w, spec.thermal_c_j_per_k, spec.temp_limit_c)
        else:
            self.thermal = None
        lat = spec.dvfs_transition_us * 1e-6 if spec.dvfs_transition_us else None
        cap = (spec.regulator_capacitance_mf or 0.0) * 1e-3
        self.regulator = VoltageRegulator(spec.regulator_efficiency, spec.tdp_w, lat, cap)
        pj = spec.hbm_pj_per_bit if hbm_pj_per_bit is None else hbm_pj_per_bit
        self.hbm_j_per_byte = pj * 8e-12
        self.hbm_max_w = spec.hbm_bandwidth_gbps * 1e9 * self.hbm_j_per_byte
        idle_chip = self.regulator.output_for_input(spec.idle_w)
        self.base_w = idle_chip - self.leakage(len(self.mhz) - 1, self.leak_ref_c)
        t_tdp = self.thermal.limit_c if self.thermal else self.leak_ref_c
        full_chip = self.regulator.output_for_input(spec.tdp_w)
        # tdp_w is what a dense GEMM draws at the top P-state and the temperature limit: the
        # tensor cores fully busy, its own HBM traffic small (dense GEMMs run at the board
        # power limit: NVIDIA quotes A100 HPL Rpeak at the 1305 MHz it sustains at 400 W,
        # glennklockwood.com/garden/peak-FLOPS). Math and HBM both busy can want more than
        # tdp_w; the firmware power limit (PowerSetup.cap_w, default tdp_w) then holds it.
        self.dyn_max_w = full_chip - self.base_w - self.leakage(0, t_tdp)

    @property
    def n_states(self) -> int:
        """Number of P-states."""
        return len(self.mhz)

    def leakage(self, ps: int, temp_c: float) -> float:
        """Leakage power at P-state ``ps`` and die temperature ``temp_c``, W."""
        if not self.has_leakage:
            return 0.0
        return self.leak_w[ps] * math.exp(self.leak_per_k * (temp_c - self.leak_ref_c))

    def idle_chip_w(self, ps: int, temp_c: float) -> float:
        """Chip power with no kernel running, W."""
        return self.base_w + self.leakage(ps, temp_c)

    def state_of(self, mhz: float) -> int | None:
        """Index of the P-state with exactly ``mhz`` (``None`` if there is none)."""
        for i, f in enumerate(self.mhz):
            if abs(f - mhz) < 1e-6:
                return i
        return None

    def floor_state(self, mhz: float) -> int:
        """Fastest P-state whose clock does not exceed ``mhz`` (the slowest if none)."""
        for i, f in enumerate(self.mhz):
            if f <= mhz + 1e-9:
                return i
        return len(self.mhz) - 1

    def transition_w(self, ps0: int, ps1: int) -> float:
        """Extra board power during a transition ``ps0 -> ps1`` (rail charge over the latency)."""
        lat = self.regulator.latency_s
        if not lat:
            return 0.0
        return self.regulator.transition_energy(self.volts[ps0], self.volts[ps1]) / lat


def check_device_power(spec) -> None:
    """Consistency of a device's power fields; raises ``ValueError`` (pydantic reports it)."""
    groups = {"leakage": _LEAK, "thermal": _THERMAL}
    for name, keys in groups.items():
        given = [k for k in keys if getattr(spec, k) is not None]
        if given and len(given) != len(keys):
            missing = [k for k in keys if getattr(spec, k) is None]
            raise ValueError(f"{name} fields come together: {', '.join(given)} given but "
                             f"{', '.join(missing)} missing")
    if spec.p_states is not None:
        table = sorted(spec.p_states, key=lambda p: -p[0])
        freqs = [f for f, _ in table]
        if len(set(freqs)) != len(freqs):
            raise ValueError(f"p_states has repeated frequencies: {freqs}")
        if spec.clock_mhz is None or abs(freqs[0] - spec.clock_mhz) > 1e-6:
            raise ValueError(f"the fastest P-state ({freqs[0]} MHz) must equal clock_mhz "
                             f"({spec.clock_mhz})")
        volts = [v for _, v in table]
        if any(b > a + 1e-12 for a, b in pairwise(volts)):
            raise ValueError(f"p_states voltages must not rise as the clock falls: {table}")
    model = DevicePower(spec)
    if model.base_w < 0:
        raise ValueError(
            f"idle_w ({spec.idle_w} W) is below the leakage at the lowest P-state plus "
            f"regulator loss; lower leakage_w ({spec.leakage_w} W) or raise idle_w")
    if model.dyn_max_w <= 0:
        raise ValueError(
            f"tdp_w ({spec.tdp_w} W) leaves no dynamic power: base {model.base_w:.1f} W + "
            f"leakage {model.leakage(0, model.thermal.limit_c if model.thermal else 0):.1f} W "
            f"(after regulator loss) exceed it")


# ----------------------------------------------------------------------------- run setup
def _state_problem(dev: DevicePower, path: str, mhz: float) -> Problem | None:
    if not dev.has_pstates:
        return Problem(path, f"{dev.spec.name} has no p_states table in its catalog entry",
                       mhz, "leave unset (top clock) or use a device with p_states")
    if dev.state_of(mhz) is None:
        return Problem(path, f"not a P-state of {dev.spec.name}", mhz,
                       ", ".join(f"{f:g}" for f in dev.mhz))
    return None


def check_power(spec: PowerSpec, device, pp: int) -> list[Problem]:
    """Cross-section checks of the ``power`` section against the device and pipeline depth."""
    dev = DevicePower(device)
    problems: list[Problem] = []
    d = spec.dvfs
    for path, value in (("power.dvfs.frequency_mhz", d.frequency_mhz),
                        ("power.dvfs.wait_frequency_mhz", d.wait_frequency_mhz)):
        if value is not None:
            p = _state_problem(dev, path, value)
            if p:
                problems.append(p)
    if d.policy == "stage_plan":
        if not dev.has_pstates:
            problems.append(Problem("power.dvfs.policy", f"{device.name} has no p_states table",
                                    d.policy, "fixed"))
        elif isinstance(d.stage_frequency_mhz, list):
            if len(d.stage_frequency_mhz) != pp:
                problems.append(Problem(
                    "power.dvfs.stage_frequency_mhz",
                    f"one clock per pipeline stage needed ({pp} stages)",
                    d.stage_frequency_mhz, f"a list of {pp} P-state clocks, or auto"))
            for i, f in enumerate(d.stage_frequency_mhz):
                p = _state_problem(dev, f"power.dvfs.stage_frequency_mhz.{i}", f)
                if p:
                    problems.append(p)
    needs_transitions = (d.bubble_downclock or spec.manager.budget_w is not None
                         or (spec.thermal.enabled and spec.thermal.throttle and dev.thermal))
    if needs_transitions and dev.has_pstates and dev.regulator.latency_s is None \
            and d.transition_latency_us is None:
        problems.append(Problem("power.dvfs.transition_latency_us",
                                f"{device.name} has no dvfs_transition_us in its catalog entry",
                                None, "a latency in us (the first brief: 10-100 us)"))
    if d.bubble_downclock and not dev.has_pstates:
        problems.append(Problem("power.dvfs.bubble_downclock",
                                f"{device.name} has no p_states table", True, "false"))
    if spec.manager.budget_w is not None and not dev.has_pstates:
        problems.append(Problem("power.manager.budget_w", f"{device.name} has no p_states "
                                "table for the manager to act on", spec.manager.budget_w,
                                "unset, or a device with p_states"))
    problems += _thermal_without_data(spec.thermal, dev)
    if spec.manager.initial_frequency_mhz is not None and dev.has_pstates:
        lo, hi = dev.mhz[-1], dev.mhz[0]
        if not lo <= spec.manager.initial_frequency_mhz <= hi:
            problems.append(Problem("power.manager.initial_frequency_mhz", "outside the "
                                    "device's clock range", spec.manager.initial_frequency_mhz,
                                    f"{lo:g}..{hi:g} MHz"))
    return problems


#: ``power.thermal`` settings that act only through the RC model (the die's temperature path,
#: its throttle and its idle re-evaluation), with what each does.
_RC_SETTINGS = {"initial": "the die's starting temperature",
                "inlet_gradient_k": "the inlet air by position",
                "throttle_interval_s": "the throttle's period",
                "hysteresis_k": "the throttle's release",
                "max_step_s": "leakage re-evaluated as the die warms"}


def _thermal_without_data(th: ThermalSpec, dev: DevicePower) -> list[Problem]:
    """Thermal settings changed from their defaults on a device whose catalog entry has no
    RC data: no die temperature is modelled, so they would be accepted and change nothing.

    ``initial_c`` still sets the held temperature when the device's leakage depends on it;
    ``ambient_c`` also sets the physical limits' heat bath (``twin.limits``), so it is never
    refused. With ``power.thermal.enabled: false`` on a device that has the data, the
    settings are inert by the user's choice (an ablation), and accepted."""
    if dev.thermal is not None:
        return []
    name = dev.spec.name
    why = f"{name} has no thermal data in its catalog entry ({', '.join(_THERMAL)})"
    allowed = f"the default, or a device with thermal data ({{base: {name}, {_THERMAL[0]}: ...}})"
    defaults = ThermalSpec.model_fields
    problems = [Problem(f"power.thermal.{key}", f"sets {what}, but {why}", getattr(th, key),
                        allowed)
                for key, what in _RC_SETTINGS.items()
                if getattr(th, key) != defaults[key].default]
    if th.initial_c is not None and not dev.has_leakage:
        problems.append(Problem("power.thermal.initial_c", f"sets the die temperature, but "
                                f"{why} and no leakage data: no power depends on it",
                                th.initial_c, "unset"))
    return problems


def _worst_temp_c(dev: DevicePower) -> float:
    """Temperature at which cap decisions evaluate leakage: the throttle limit, else the
    leakage reference temperature, C."""
    return dev.thermal.limit_c if dev.thermal else dev.leak_ref_c


def _transition_latency_s(spec: PowerSpec, dev: DevicePower) -> float | None:
    """The DVFS transition latency a run uses: the scenario's, else the device's, s."""
    lat_us = spec.dvfs.transition_latency_us
    return lat_us * 1e-6 if lat_us else dev.regulator.latency_s


def cap_problems(spec: PowerSpec, device) -> list[Problem]:
    """An infeasible ``power.cap_w``: below what ``device`` draws idle at its lowest clock,
    or idle at the top clock while its rail charges during a clock transition (the
    transition's energy over its latency), both at the temperature cap decisions use
    (:func:`_worst_temp_c`): the board could not stay under it doing nothing. Empty without
    a cap. Checked when a scenario is loaded (``twin check``, sweeps record the point as
    infeasible) and again when a run's :class:`PowerSetup` is built."""
    cap = spec.cap_w
    if cap is None:
        return []
    dev = DevicePower(device)
    t = _worst_temp_c(dev)
    need = dev.regulator.input_power(dev.idle_chip_w(dev.n_states - 1, t))
    latency = _transition_latency_s(spec, dev)
    if latency and dev.n_states > 1:
        e = dev.regulator.transition_energy(dev.volts[0], dev.volts[-1])
        need = max(need, dev.regulator.input_power(dev.idle_chip_w(0, t)) + e / latency)
    if cap >= need:
        return []
    return [Problem("power.cap_w", f"below what a {device.name} draws idle or during a clock "
                    f"transition at {t:g} C ({need:.1f} W)", cap, f">= {need:.1f} W")]


class PowerSetup:
    """Everything power-related that is fixed for a run: the device model, the clock each
    stage works at, the cap ceilings, transition latency, thermal settings and the manager.

    Args:
        spec: the scenario's ``power`` section.
        compute: the run's ``devices.accelerator.ComputeModel`` (owns the device model).
        stage_blocks: compute blocks one rank of each stage executes per iteration (needed by
            the power cap and the ``auto`` stage plan; ``None``: not known).
        microbatches: microbatches per iteration and replica (for the stage planner).
        devices: devices in the run (for default alert thresholds).

    Raises:
        ScenarioError: a power option does not fit the device (field path named).
        InfeasibleConfig: the power cap is below what the device draws doing nothing.
    """

    def __init__(self, spec: PowerSpec | None, compute, stage_blocks: dict[int, list] | None
                 = None, microbatches: int = 1, devices: int = 1):
        self.spec = spec = spec or PowerSpec()
        self.compute = compute
        self.dev = dev = compute.power
        self.devices = devices
        stage_blocks = stage_blocks or {}
        pp = max(len(stage_blocks), 1)
        problems = check_power(spec, dev.spec, pp)
        if problems:
            raise ScenarioError(problems)
        d = spec.dvfs
        self.latency_s = _transition_latency_s(spec, dev)
        self.thermal = dev.thermal if spec.thermal.enabled else None
        self.ambient_c = spec.thermal.ambient_c
        self.class_ambient_c: dict[int, float] = {}  # per-class inlet air (position), C
        # warm die: mean dynamic chip power of each stage's compute blocks at the top clock
        self._warm_w: dict[int, float] = {}
        if spec.thermal.initial == "warm":
            costs: dict = {}  # id(block) -> BlockCost: a program repeats a few Block objects
            for s, blocks in stage_blocks.items():
                busy = e_act = 0.0
                for b in blocks:
                    c = costs.get(id(b))
                    if c is None:
                        c = costs[id(b)] = compute.block_cost(b)
                    busy += c.duration_s
                    e_act += c.compute_j + c.memory_j
                if busy > 0:
                    self._warm_w[s] = e_act / busy
        top = dev.state_of(d.frequency_mhz) if d.frequency_mhz is not None else 0
        self.plan = None
        self.stage_ps: dict[int, int] = {s: top for s in range(pp)}
        if d.policy == "stage_plan":
            if isinstance(d.stage_frequency_mhz, list):
                self.stage_ps = {s: dev.state_of(f) for s, f in
                                 enumerate(d.stage_frequency_mhz)}
            else:
                from devices.dvfs import plan_stages

                self.plan = plan_stages(self, stage_blocks, microbatches, d.plan_slack)
                self.stage_ps = dict(enumerate(self.plan.states))
        self.wait_ps = (dev.state_of(d.wait_frequency_mhz) if d.wait_frequency_mhz is not None
                        else dev.n_states - 1)
        # the board's power limit: the scenario's cap, else the firmware default (tdp_w)
        self.cap_w = spec.cap_w if spec.cap_w is not None else dev.spec.tdp_w
        self.cap_ps = {s: 0 for s in range(pp)}
        if spec.cap_w is not None:
            problems = cap_problems(spec, dev.spec)
            if problems:
                raise InfeasibleConfig(problems)
            self.cap_ps = {s: self._cap_state(stage_blocks.get(s, []), spec.cap_w)
                           for s in range(pp)}
        self.manager = None
        self.alert_rows: list[tuple] = []  # temperature alerts raised during the run
        self.alerts: list[tuple] | None = None  # all alerts, set after the run

    # ------------------------------------------------------------------ derived settings
    @property
    def worst_temp_c(self) -> float:
        """Temperature at which cap decisions evaluate leakage (the throttle limit), C."""
        return _worst_temp_c(self.dev)

    def initial_temp_c(self, ambient_c: float | None = None, stage: int | None = None) -> float:
        """Die temperature at t = 0 at the ambient (the scenario's, or ``ambient_c`` for a
        device with its own inlet air): given (``initial_c``); warm (default, for ``stage``):
        the steady state of the stage's compute blocks back to back at the top clock, the
        temperature of a job that has been running (bubbles and communication not counted:
        slightly warm-biased); idle (or no stage given): the idle steady state."""
        th = self.spec.thermal
        amb = th.ambient_c if ambient_c is None else ambient_c
        if th.initial_c is not None:
            return th.initial_c
        if self.thermal is None:
            return self.dev.leak_ref_c if self.dev.has_leakage else amb
        warm = self._warm_w.get(stage) if stage is not None else None
        # the lowest fixed point of T = T_amb + R P(T) (leakage grows with T): T_k rises
        # monotonically from the ambient to it, so a warm die that passes the throttle limit
        # ends at the limit, and one past _RUNAWAY_C has no physical steady state
        t = amb
        ps = self.dev.n_states - 1 if warm is None else 0
        for _ in range(_FIXED_POINT_STEPS):
            nxt = self.thermal.steady(self.dev.idle_chip_w(ps, t) + (warm or 0.0), amb)
            if warm is not None and nxt >= self.thermal.limit_c:
                return self.thermal.limit_c
            if not nxt <= _RUNAWAY_C:
                self._runaway(amb)
            if abs(nxt - t) <= 1e-12 * abs(nxt):
                return nxt
            t = nxt
        return t  # at a tangency (R dP/dT = 1) the steps shrink without end: t is within them

    def _runaway(self, amb: float) -> None:
        """No steady die temperature below ``_RUNAWAY_C``: leakage grows with temperature
        faster than the heat path removes it (``R dP/dT >= 1``)."""
        dev = self.dev
        raise InfeasibleConfig([Problem(
            "power.thermal", f"thermal runaway: with inlet air at {amb:g} C, thermal resistance "
            f"{self.thermal.r:g} K/W, idle_w {dev.spec.idle_w:g} W and leakage_w "
            f"{dev.spec.leakage_w} W growing by leakage_per_k {dev.spec.leakage_per_k}/K an "
            f"idle die has no steady temperature below {_RUNAWAY_C:g} C (leakage rises with "
            "temperature faster than cooling removes it, or the idle power alone is too high)",
            None, "less power (cluster.device.tdp_w, leakage_w), a smaller "
            "thermal_r_k_per_w or leakage_per_k, cooler inlet air, or power.thermal.initial_c")])

    def ambient_for(self, cls: int) -> float:
        """Inlet air temperature of rank class ``cls``, C (``class_ambient_c`` when the run set
        one per class, e.g. by position; else the scenario's ``ambient_c``)."""
        return self.class_ambient_c.get(cls, self.ambient_c)

    def block_power(self, block, ps: int, temp_c: float, mem_scale: float = 1.0) -> float:
        """Board power of ``block`` run at P-state ``ps`` and die temperature ``temp_c``, W."""
        dev = self.dev
        c = self.compute.block_cost(block, dev.math_scale[ps], mem_scale)
        if c.duration_s <= 0:
            return dev.regulator.input_power(dev.idle_chip_w(ps, temp_c))
        chip = (c.compute_j * dev.dyn_scale[ps] + c.memory_j) / c.duration_s \
            + dev.idle_chip_w(ps, temp_c)
        return dev.regulator.input_power(chip)

    def _cap_state(self, blocks: list, cap: float) -> int:
        """Fastest P-state at which every block of a stage stays under ``cap`` (at the
        temperature limit); the slowest if none does (then blocks are stretched at run time)."""
        unique = {id(b): b for b in blocks}.values()
        for ps in range(self.dev.n_states):
            if all(self.block_power(b, ps, self.worst_temp_c) <= cap for b in unique):
                return ps
        return self.dev.n_states - 1

    def design_power_w(self, link_idle_w: float) -> float:
        """Power the alerts compare against, W."""
        a = self.spec.alerts
        if a.design_power_w is not None:
            return a.design_power_w
        if self.spec.manager.budget_w is not None:
            return self.spec.manager.budget_w
        return self.devices * self.dev.spec.tdp_w + link_idle_w
