"""Independent references for board power per segment and HBM energy (issue 15, part 2).

The device's electrical model is pinned by two catalog figures (``devices/power.py``
docstring): ``idle_w`` is the board power of an idle device at its lowest P-state at the
leakage reference temperature, ``tdp_w`` the board power of a dense GEMM (math units fully
busy, no HBM traffic) at the top P-state at the temperature limit. Here the two unknowns
(base power and full dynamic power) are solved from those definitions with ``brentq`` and the
leakage law written from the catalog fields; the per-segment board power of blocks run by the
accelerator agent is then rebuilt kernel by kernel from the roofline reference of
``tests/test_kernel_reference.py`` and HBM energy as ``bytes x 8 x pJ/bit``. Only the
regulator's efficiency curve is taken from ``VoltageRegulator`` (checked against ``np.interp``
and ``brentq`` in ``tests/test_thermal_reference.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import simpy
from scipy.optimize import brentq

from devices.accelerator import Accelerator, ComputeModel
from devices.power import PowerSetup, PowerSpec
from devices.spec import DeviceSpec
from tests.test_kernel_reference import ref_kernel
from twin.catalogs import catalog
from twin.kernel.records import Recorder
from workloads.transformer import Block, Kernel

DETAILED = ("p_states", "leakage_w", "leakage_ref_c", "leakage_per_k",
            "leakage_voltage_exponent", "thermal_r_k_per_w", "thermal_c_j_per_k",
            "temp_limit_c", "regulator_efficiency", "dvfs_transition_us",
            "regulator_capacitance_mf")


def device(name: str, basic: bool = False, **over) -> DeviceSpec:
    vals = dict(catalog("devices").get(name).values)
    if basic:
        for k in DETAILED:
            vals.pop(k, None)
    return DeviceSpec.model_validate({**vals, **over})


class _Null(Recorder):
    def __init__(self):
        self.rows: list[tuple] = []

    def op(self, *args) -> None:
        self.rows.append(args)


def ref_leak(s: DeviceSpec, volts: float, temp_c: float) -> float:
    """Leakage ``leakage_w (V / V_max)^n exp(a (T - T_ref))`` from the catalog fields, W."""
    if s.leakage_w is None:
        return 0.0
    v_max = max(s.p_states, key=lambda p: p[0])[1]
    return (s.leakage_w * (volts / v_max) ** s.leakage_voltage_exponent
            * math.exp(s.leakage_per_k * (temp_c - s.leakage_ref_c)))


def ref_unknowns(s: DeviceSpec, reg) -> tuple[float, float]:
    """``(P_base, P_dyn,max)`` solved from the idle_w and tdp_w definitions, W."""
    states = sorted(s.p_states or [(s.clock_mhz or 1.0, 1.0)], key=lambda p: -p[0])
    v_top, v_low = states[0][1], states[-1][1]
    t_ref = s.leakage_ref_c if s.leakage_w is not None else 25.0
    t_lim = s.temp_limit_c if s.thermal_r_k_per_w is not None else t_ref
    leak_idle = ref_leak(s, v_low, t_ref)
    base = brentq(lambda b: reg.input_power(b + leak_idle) - s.idle_w, -s.idle_w, s.idle_w,
                  xtol=1e-12)
    leak_top = ref_leak(s, v_top, t_lim)
    dyn = brentq(lambda d: reg.input_power(base + leak_top + d) - s.tdp_w, 0.0, 2 * s.tdp_w,
                 xtol=1e-12)
    return base, dyn


def ref_block_energy(s: DeviceSpec, blk: Block, dyn_w: float, math_scale: float = 1.0,
                     v_ratio: float = 1.0) -> tuple[float, float, float]:
    """``(duration, dynamic J, HBM J)`` of a block from the per-kernel reference: each kernel's
    math units are busy for its math time, at the full dynamic power for GEMMs and at the
    vector units' share for element-wise kernels; switching energy scales with V^2."""
    d = e_dyn = 0.0
    for k in blk.kernels:
        dur, t_math = ref_kernel(s, k, "bf16", math_scale)
        d += dur
        e_dyn += t_math * (1.0 if k.gemm else s.vector_power_fraction) * dyn_w * v_ratio ** 2
    e_hbm = sum(k.bytes for k in blk.kernels) * 8.0 * s.hbm_pj_per_bit * 1e-12
    return d, e_dyn, e_hbm


def _blocks() -> list[Block]:
    """A dense GEMM (near the limit), an HBM-bound element-wise block, a mixed block whose
    math and HBM power together exceed the limit, and an empty one."""
    n = 8192
    gemm = Kernel("gemm", 2.0 * n ** 3, 3.0 * n * n * 2, True, (1.0, n, n), depth=n)
    ew = Kernel("ew", 4.0 * 2 ** 28, 6.0 * 2 ** 28, False)
    mixed = Kernel("mixed", 2.0 * 4096 * 4096 * 160, 2.6e9, True, (1.0, 4096, 4096), depth=160)
    return [Block("gemm", (gemm,)), Block("ew", (ew, ew)), Block("mixed", (mixed, ew)),
            Block("small", (Kernel("s", 1e6, 1e6, False),))]


def _run(spec: DeviceSpec, blocks: list[Block], gap_s: float, power: PowerSpec | None = None):
    cm = ComputeModel(spec, "bf16", spec.hbm_pj_per_bit)
    setup = PowerSetup(power, cm)
    env = simpy.Environment()
    acc = Accelerator(env, 0, 1, cm, _Null(), power=setup)
    t0 = acc.temp_c

    def probe():  # telemetry read half-way through the first block
        yield env.timeout(0.5 * cm.block_cost(blocks[0]).duration_s)
        acc._probe, acc._probe_t = acc.energy_at(env.now), env.now

    env.process(probe())

    def body():
        for i, b in enumerate(blocks):
            yield from acc.compute(b, 0, i, 0, 0)
            yield env.timeout(gap_s)
            acc.idle_until(env.now)

    env.process(body())
    env.run()
    return acc, cm, t0


def test_basic_model_segment_power_is_idle_plus_utilised_dynamic_plus_hbm():
    """Without the detailed fields: ``P = idle_w + u (tdp_w - idle_w) + HBM W``, held at tdp_w
    by stretching the block (the catalog's basic model); idle stretches draw idle_w."""
    s = device("h100-sxm", basic=True)
    blocks = _blocks()
    acc, _, _ = _run(s, blocks, 1e-3)
    seg = acc.power_segments()
    names = acc.state_names()
    comp = [r for r in seg if names[int(r[3])] != "idle"]
    idle = [r for r in seg if names[int(r[3])] == "idle"]
    assert len(comp) == len(blocks) and len(idle) == len(blocks)
    for r in idle:
        assert r[2] == pytest.approx(s.idle_w, rel=1e-12)
        assert r[1] - r[0] == pytest.approx(1e-3, rel=1e-9)
    stretched = 0
    stretch_s = 0.0
    for r, b in zip(comp, blocks, strict=True):
        d, e_dyn, e_hbm = ref_block_energy(s, b, s.tdp_w - s.idle_w)
        p = s.idle_w + (e_dyn + e_hbm) / d
        if p > s.tdp_w:
            d0 = d
            d = (e_dyn + e_hbm) / (s.tdp_w - s.idle_w)
            stretch_s += d - d0
            p = s.tdp_w
            stretched += 1
        assert r[1] - r[0] == pytest.approx(d, rel=1e-9), b.name
        assert r[2] == pytest.approx(p, rel=1e-9), b.name
    assert stretched == 1   # the mixed block: the case really is exercised
    assert acc.stats.cap_stretch_s == pytest.approx(stretch_s, rel=1e-9)
    # telemetry in the middle of the first block: energy so far at its board power
    assert comp[0][0] == 0.0 and 0.0 < acc._probe_t < comp[0][1]
    assert acc._probe == pytest.approx(acc._probe_t * comp[0][2], rel=1e-9)
    # HBM energy = bytes x 8 x pJ/bit, summed over the blocks
    e_hbm = sum(k.bytes for b in blocks for k in b.kernels) * 8 * s.hbm_pj_per_bit * 1e-12
    assert acc.stats.memory_j == pytest.approx(e_hbm, rel=1e-12)
    # the components and the telemetry counter add up to the integral of the recorded power
    total = float(((seg[:, 1] - seg[:, 0]) * seg[:, 2]).sum())
    assert sum(acc.energy_breakdown().values()) == pytest.approx(total, rel=1e-9)
    assert acc.energy_at(float(seg[-1, 1])) == pytest.approx(total, rel=1e-9)


def test_a_die_at_the_limit_throttles_one_p_state_at_the_first_block():
    """Thermal throttle rule: at the first check (t = 0) a die at or above the limit steps one
    P-state down, so the first block runs at the second P-state's clock."""
    s = device("h100-sxm")
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    setup = PowerSetup(PowerSpec(), cm)
    env = simpy.Environment()
    rec = _Null()
    acc = Accelerator(env, 0, 1, cm, rec, power=setup)
    acc.temp_c = s.temp_limit_c + 1.0
    blk = _blocks()[0]
    env.process(acc.compute(blk, 0, 0, 0, 0))
    env.run()
    seg = acc.power_segments()
    names = acc.state_names()
    comp = [r for r in seg if names[int(r[3])] == "gemm"]
    assert acc.stats.throttle_steps == 1
    # the trace: a DVFS stall (no microbatch / chunk / layer) for the transition, then the block
    (dv,) = [r for r in rec.rows if r[3] == "dvfs"]
    assert dv[5:8] == (-1, -1, -1)
    assert dv[9] - dv[8] == pytest.approx(s.dvfs_transition_us * 1e-6, rel=1e-9)
    assert [int(r[4]) for r in comp] == [1]
    f_top, f1 = sorted((p[0] for p in s.p_states), reverse=True)[:2]
    d, _ = ref_kernel(s, blk.kernels[0], "bf16", f_top / f1)
    assert comp[0][1] - comp[0][0] == pytest.approx(d, rel=1e-9)


@pytest.mark.parametrize("dev", ["h100-sxm", "a100-sxm-80gb"])
def test_catalog_definitions_pin_base_and_dynamic_power(dev):
    """idle_w = board power idle at the lowest P-state at T_ref; tdp_w = board power of a
    pure-math kernel at the top P-state at the temperature limit."""
    s = device(dev, kernel_overhead_us=0.0)
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    base, dyn = ref_unknowns(s, cm.power.regulator)
    assert cm.power.base_w == pytest.approx(base, rel=1e-9)
    assert cm.power.dyn_max_w == pytest.approx(dyn, rel=1e-9)
    setup = PowerSetup(None, cm)
    n = 16384
    full = Block("g", (Kernel("g", 2.0 * n ** 3, 0.0, True),))
    assert setup.block_power(full, 0, s.temp_limit_c) == pytest.approx(s.tdp_w, rel=1e-9)
    dev_ = cm.power
    idle = dev_.regulator.input_power(dev_.idle_chip_w(dev_.n_states - 1, s.leakage_ref_c))
    assert idle == pytest.approx(s.idle_w, rel=1e-9)
    # HBM at full bandwidth: bytes/s x 8 x pJ/bit
    assert dev_.hbm_max_w == pytest.approx(s.hbm_bandwidth_gbps * 1e9 * 8 * s.hbm_pj_per_bit
                                           * 1e-12, rel=1e-12)
    # an HBM-bound block at nominal memory speed (block_power's default): t = bytes / BW
    ew = Kernel("ew", 1.0, 4.0e9, False)
    d = 4.0e9 / (s.hbm_bandwidth_gbps * 1e9 * s.memory_efficiency)
    chip = 4.0e9 * 8 * s.hbm_pj_per_bit * 1e-12 / d + base + ref_leak(
        s, max(s.p_states)[1], 50.0) + 1.0 / (s.vector_tflops["fp32"] * 1e12) * dyn * \
        s.vector_power_fraction / d
    assert setup.block_power(Block("e", (ew,)), 0, 50.0) == pytest.approx(
        dev_.regulator.input_power(chip), rel=1e-9)
    # clocks: the fastest P-state not above a given clock, the slowest when none is
    mhz = sorted((p[0] for p in s.p_states), reverse=True)
    assert dev_.floor_state(mhz[1] + 1.0) == 1
    assert dev_.floor_state(mhz[-1] - 1.0) == len(mhz) - 1
    assert dev_.floor_state(1e9) == 0


@pytest.mark.parametrize("mhz", [None, 1350.0])
def test_detailed_model_segment_power_from_the_reference(mhz):
    """H100 with P-states, leakage, thermal RC and regulator: each block's board power is
    ``eta^-1(E_dyn (V/V_max)^2 / d + E_hbm / d + P_base + P_leak(V, T_start))``, held at the
    cap by stretching; idle segments ``eta^-1(P_base + P_leak)``."""
    s = device("h100-sxm")
    power = PowerSpec.model_validate({"dvfs": {"frequency_mhz": mhz}} if mhz else {})
    blocks = _blocks()
    acc, cm, temp0 = _run(s, blocks, 2e-3, power)
    reg = cm.power.regulator
    base, dyn = ref_unknowns(s, reg)
    states = sorted(s.p_states, key=lambda p: -p[0])
    f_top, v_top = states[0]
    f, v = next(p for p in states if mhz is None or p[0] == mhz)
    cap_chip = brentq(lambda c: reg.input_power(c) - s.tdp_w, 0.0, s.tdp_w, xtol=1e-12)
    seg = acc.power_segments()
    names = acc.state_names()
    temp = temp0
    bi = 0
    r_th, tau = s.thermal_r_k_per_w, s.thermal_r_k_per_w * s.thermal_c_j_per_k
    amb = acc.ambient_c
    for r in seg:
        leak = ref_leak(s, v, temp)
        if names[int(r[3])] == "idle":
            chip = base + leak
            assert r[2] == pytest.approx(reg.input_power(chip), rel=1e-9)
        else:
            b = blocks[bi]
            bi += 1
            d, e_dyn, e_hbm = ref_block_energy(s, b, dyn, f_top / f, v / v_top)
            chip = (e_dyn + e_hbm) / d + base + leak
            p = reg.input_power(chip)
            if p > s.tdp_w:
                d = (e_dyn + e_hbm) / (cap_chip - base - leak)
                chip, p = cap_chip, s.tdp_w
            assert r[1] - r[0] == pytest.approx(d, rel=1e-9), b.name
            assert r[2] == pytest.approx(p, rel=1e-9), b.name
        # die temperature over the constant-power segment: C dT/dt = P_chip - (T - T_amb) / R
        ss = amb + r_th * chip
        expect = ss + (temp - ss) * math.exp(-(r[1] - r[0]) / tau)
        assert r[5] == pytest.approx(expect, abs=1e-9)
        temp = r[5]
    assert bi == len(blocks)


def test_energy_per_flop_of_a_dense_gemm_is_board_power_over_effective_rate():
    """Law: a compute-bound GEMM's board energy per FLOP = P_board x d / FLOPs with d from the
    roofline reference and P_board from the catalog definitions. At the temperature limit with
    no HBM traffic and no launch overhead P_board = tdp_w exactly, so the energy per FLOP is
    tdp_w / (peak x matmul efficiency x wave efficiency / (1 + k_half / k)). The reference is
    exact up to the root finder's tolerance (1e-12 W), hence rel 1e-9."""
    s = device("h100-sxm", kernel_overhead_us=0.0)
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    setup = PowerSetup(None, cm)
    n, k = 8192, 4096
    g = Kernel("g", 2.0 * n * n * k, 0.0, True, (1.0, n, n), depth=k)
    blk = Block("g", (g,))
    c = cm.block_cost(blk)
    d, _ = ref_kernel(s, g, "bf16")
    per_flop = setup.block_power(blk, 0, s.temp_limit_c) * c.duration_s / g.flops
    assert per_flop == pytest.approx(s.tdp_w * d / g.flops, rel=1e-9)
    # below the limit the die leaks less: the same law with P_leak(T)
    base, dyn = ref_unknowns(s, cm.power.regulator)
    t = 60.0
    v_top = max(s.p_states)[1]
    p = cm.power.regulator.input_power(dyn + base + ref_leak(s, v_top, t))
    per_flop_60 = setup.block_power(blk, 0, t) * c.duration_s / g.flops
    assert per_flop_60 == pytest.approx(p * d / g.flops, rel=1e-9)
    assert per_flop_60 < per_flop


@pytest.mark.parametrize("initial", ["warm", "idle"])
def test_initial_die_temperature_is_the_steady_state_of_the_stage_load(initial):
    """``warm``: the fixed point of ``T = T_amb + R (P_act + P_base + P_leak(V_top, T))`` with
    ``P_act`` the stage's mean dynamic + HBM chip power over its blocks back to back, capped
    at the limit; ``idle``: the same at the lowest P-state with no activity. Solved with
    ``brentq`` here."""
    s = device("h100-sxm")
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    blocks = _blocks()[1:3]
    setup = PowerSetup(PowerSpec.model_validate({"thermal": {"initial": initial}}), cm,
                       stage_blocks={0: blocks})
    base, dyn = ref_unknowns(s, cm.power.regulator)
    states = sorted(s.p_states, key=lambda p: -p[0])
    amb = setup.ambient_c
    if initial == "warm":
        parts = [ref_block_energy(s, b, dyn) for b in blocks]
        p_act = sum(e + h for _, e, h in parts) / sum(d for d, _, _ in parts)
        v = states[0][1]
    else:
        p_act, v = 0.0, states[-1][1]
    r = s.thermal_r_k_per_w
    t = brentq(lambda x: amb + r * (p_act + base + ref_leak(s, v, x)) - x, amb, 150.0,
               xtol=1e-10)
    if initial == "warm":
        t = min(t, s.temp_limit_c)
    assert setup.initial_temp_c(amb, 0) == pytest.approx(t, abs=1e-6)


def _cap_reference(s: DeviceSpec):
    """The compute model of ``s``, its P-states fastest first, and the reference board power
    ``board(block, f, v)`` of a block at P-state (f, v) at the temperature limit, W."""
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    reg = cm.power.regulator
    base, dyn = ref_unknowns(s, reg)
    states = sorted(s.p_states, key=lambda p: -p[0])
    f_top, v_top = states[0]

    def board(b, f, v):
        d, e_dyn, e_hbm = ref_block_energy(s, b, dyn, f_top / f, v / v_top)
        return reg.input_power((e_dyn + e_hbm) / d + base + ref_leak(s, v, s.temp_limit_c))

    return cm, states, board


def test_power_cap_plans_the_fastest_p_state_whose_blocks_fit():
    """``power.cap_w``: each stage runs at the fastest P-state at which every one of its blocks
    draws at most the cap at the temperature limit (board power from the reference), the
    slowest when none does."""
    from twin.kernel.errors import InfeasibleConfig

    cm, states, board = _cap_reference(device("h100-sxm"))
    blocks = _blocks()[:3]
    seen_mid = False
    for cap in (690.0, 600.0, 500.0, 400.0, 300.0, 250.0, 200.0):
        try:
            setup = PowerSetup(PowerSpec.model_validate({"cap_w": cap}), cm,
                               stage_blocks={0: blocks})
        except InfeasibleConfig:
            continue
        fits = [i for i, (f, v) in enumerate(states)
                if all(board(b, f, v) <= cap for b in blocks)]
        expect = fits[0] if fits else len(states) - 1
        seen_mid |= bool(fits) and 0 < fits[0]
        assert setup.cap_ps[0] == expect, cap
    assert seen_mid  # (on H100 no feasible cap is below every P-state of these blocks)


def _two_state_h100() -> DeviceSpec:
    """H100 with only its two fastest P-states (both high voltage): every block draws far more
    than idle at either, so a cap between the two exists that no P-state meets."""
    states = sorted(device("h100-sxm").p_states, key=lambda p: -p[0])[:2]
    return device("h100-sxm", p_states=states)


def _ref_cap_floor(s: DeviceSpec) -> tuple[float, float]:
    """(idle at the lowest P-state, idle at the top voltage during a clock transition) of
    ``s`` at its temperature limit, W: the catalog definitions solved with brentq
    (``ref_unknowns``) and the rail charge ``C/2 |V0^2 - V1^2|`` over the transition latency
    written here."""
    reg = ComputeModel(s, "bf16", s.hbm_pj_per_bit).power.regulator
    base, _dyn = ref_unknowns(s, reg)
    states = sorted(s.p_states, key=lambda p: -p[0])
    v0, v1 = states[0][1], states[-1][1]  # the widest swing: top and lowest voltage
    t = s.temp_limit_c
    idle_low = reg.input_power(base + ref_leak(s, v1, t))
    rail_j = 0.5 * s.regulator_capacitance_mf * 1e-3 * abs(v0 ** 2 - v1 ** 2)
    transition = reg.input_power(base + ref_leak(s, v0, t)) + rail_j / (s.dvfs_transition_us
                                                                         * 1e-6)
    return idle_low, transition


@pytest.mark.parametrize("two_states", [True, False])
def test_cap_floor_is_idle_or_a_transition_at_the_limit_temperature(two_states):
    """``power.cap_w`` below what the board draws idle at the lowest P-state, or during a clock
    transition (idle at the top voltage + the rail charge ``C/2 |V0^2 - V1^2|`` spread over the
    latency), both at the temperature limit, is refused; just above it is accepted."""
    from twin.kernel.errors import InfeasibleConfig

    s = _two_state_h100() if two_states else device("h100-sxm")
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    idle_low, transition = _ref_cap_floor(s)
    assert transition > idle_low + 1.0  # the transition sets the floor on this device
    blocks = _blocks()[:3]
    for cap in (transition * (1 - 1e-6), 0.5 * (idle_low + transition)):
        with pytest.raises(InfeasibleConfig):
            PowerSetup(PowerSpec.model_validate({"cap_w": cap}), cm, stage_blocks={0: blocks})
    PowerSetup(PowerSpec.model_validate({"cap_w": transition * (1 + 1e-6)}), cm,
               stage_blocks={0: blocks})


def test_an_infeasible_cap_is_refused_when_the_scenario_is_loaded():
    """The cap floor is checked when a scenario is read (``twin check`` reports it, a sweep
    records the point as infeasible), not only when its run is built: just below the
    reference floor an InfeasibleConfig naming ``power.cap_w``, just above a scenario."""
    import yaml

    from twin.kernel.errors import InfeasibleConfig
    from twin.scenario import load_scenario

    with open(Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml") as f:
        raw = yaml.safe_load(f)
    raw["trace"] = {"enabled": False}
    floor = max(_ref_cap_floor(device("h100-sxm")))
    with pytest.raises(InfeasibleConfig, match=r"power\.cap_w"):
        load_scenario({**raw, "power": {"cap_w": floor * (1 - 1e-6)}})
    assert load_scenario({**raw, "power": {"cap_w": floor * (1 + 1e-6)}}).power.cap_w > floor


def test_cap_below_every_p_state_falls_back_to_the_slowest():
    """A feasible cap that no P-state's blocks meet: the stage runs at the slowest P-state (the
    blocks are then stretched at run time), checked against the reference board power."""
    cm, states, board = _cap_reference(_two_state_h100())
    blocks = _blocks()[:3]
    cap = 300.0
    for f, v in states:
        assert max(board(b, f, v) for b in blocks) > cap  # some block exceeds the cap
    setup = PowerSetup(PowerSpec.model_validate({"cap_w": cap}), cm,
                       stage_blocks={0: blocks, 1: blocks[:1]})
    assert setup.cap_ps == {0: len(states) - 1, 1: len(states) - 1}


@pytest.mark.parametrize("enabled,throttle,thermal_data,needed", [
    (True, True, True, True), (False, True, True, False), (True, False, True, False),
    (True, True, False, False), (False, False, True, False)])
def test_a_transition_latency_is_required_only_when_the_clock_can_change(
        enabled, throttle, thermal_data, needed):
    """Without the device's ``dvfs_transition_us`` (and no ``transition_latency_us``), the run
    is refused exactly when something changes clocks at run time: here the thermal throttle,
    which needs the thermal model on, throttling on and the device's thermal data."""
    from devices.power import check_power

    over = {"dvfs_transition_us": None}
    if not thermal_data:
        over.update(thermal_r_k_per_w=None, thermal_c_j_per_k=None, temp_limit_c=None)
    s = device("h100-sxm", **over)
    spec = PowerSpec.model_validate({"thermal": {"enabled": enabled, "throttle": throttle}})
    paths = [p.path for p in check_power(spec, s, 1)]
    assert ("power.dvfs.transition_latency_us" in paths) == needed, paths
    with_latency = PowerSpec.model_validate({"thermal": {"enabled": enabled, "throttle": throttle},
                                             "dvfs": {"transition_latency_us": 20.0}})
    assert check_power(with_latency, s, 1) == []


_NO_LAT = {"dvfs_transition_us": None}
_COOL = {"thermal": {"enabled": False}}


@pytest.mark.parametrize("dev,over,power,pp,expect", [
    ("h100-sxm", {}, {}, 1, []),
    ("h100-sxm", {}, {"dvfs": {"frequency_mhz": 1000.0}}, 1, ["power.dvfs.frequency_mhz"]),
    ("h100-sxm", {}, {"dvfs": {"frequency_mhz": 1980.0, "wait_frequency_mhz": 810.0}}, 1, []),
    ("h100-sxm", {}, {"dvfs": {"wait_frequency_mhz": 800.0}}, 1,
     ["power.dvfs.wait_frequency_mhz"]),
    ("basic", {}, {"dvfs": {"frequency_mhz": 1980.0}}, 1, ["power.dvfs.frequency_mhz"]),
    ("basic", {}, {"dvfs": {"policy": "stage_plan"}}, 2, ["power.dvfs.policy"]),
    ("h100-sxm", {}, {"dvfs": {"policy": "stage_plan", "stage_frequency_mhz": [1980.0]}}, 2,
     ["power.dvfs.stage_frequency_mhz"]),
    ("h100-sxm", {}, {"dvfs": {"policy": "stage_plan",
                               "stage_frequency_mhz": [1980.0, 1000.0]}}, 2,
     ["power.dvfs.stage_frequency_mhz.1"]),
    ("h100-sxm", {}, {"dvfs": {"policy": "stage_plan",
                               "stage_frequency_mhz": [1980.0, 810.0]}}, 2, []),
    ("h100-sxm", {}, {"dvfs": {"policy": "stage_plan"}}, 2, []),
    ("h100-sxm", _NO_LAT, {**_COOL, "dvfs": {"bubble_downclock": True}}, 1,
     ["power.dvfs.transition_latency_us"]),
    ("h100-sxm", _NO_LAT, {**_COOL, "manager": {"budget_w": 5000.0}}, 1,
     ["power.dvfs.transition_latency_us"]),
    ("h100-sxm", _NO_LAT, _COOL, 1, []),
    ("h100-sxm", _NO_LAT, {**_COOL, "manager": {"budget_w": 5000.0},
                           "dvfs": {"transition_latency_us": 30.0}}, 1, []),
    ("basic", {}, {"dvfs": {"bubble_downclock": True}}, 1, ["power.dvfs.bubble_downclock"]),
    ("basic", {}, {"manager": {"budget_w": 5000.0}}, 1, ["power.manager.budget_w"]),
    ("basic", {}, {"manager": {"initial_frequency_mhz": 5000.0}}, 1, []),
    ("h100-sxm", {}, {"manager": {"initial_frequency_mhz": 5000.0}}, 1,
     ["power.manager.initial_frequency_mhz"]),
    ("h100-sxm", {}, {"manager": {"initial_frequency_mhz": 800.0}}, 1,
     ["power.manager.initial_frequency_mhz"]),
    ("h100-sxm", {}, {"manager": {"initial_frequency_mhz": 810.0}}, 1, []),
    ("h100-sxm", {}, {"manager": {"initial_frequency_mhz": 1980.0}}, 1, []),
    ("h100-sxm", {}, {"manager": {"initial_frequency_mhz": 1200.0}}, 1, []),
])
def test_power_section_problems_name_exactly_the_offending_fields(dev, over, power, pp, expect):
    """``check_power``: each option that does not fit the device (a clock that is not one of
    its P-states, a policy or manager without a P-state table, one clock per stage, a clock
    change without a transition latency, a manager start clock outside the clock range) is
    reported under its own field path, and nothing else is; an H100's P-states span
    810-1980 MHz, the basic device has none and no thermal data."""
    from devices.power import check_power

    s = device("h100-sxm", basic=True) if dev == "basic" else device(dev, **over)
    problems = check_power(PowerSpec.model_validate(power), s, pp)
    assert [p.path for p in problems] == expect
    for p in problems:  # each names the value given at its path
        node = {"power": power}
        for part in p.path.split("."):
            node = node[int(part)] if isinstance(node, list) else node.get(part) \
                if isinstance(node, dict) else None
        if node is not None:
            assert p.value == node, p


def test_device_power_fields_that_come_together_name_the_missing_ones():
    """Leakage (or thermal) fields are all given or none: a partial group is refused, the
    message naming the given and the missing fields."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        device("h100-sxm", leakage_per_k=None)
    msg = str(err.value)
    assert "leakage_per_k missing" in msg and "leakage_w, leakage_ref_c" in msg
    with pytest.raises(ValidationError, match="temp_limit_c missing"):
        device("h100-sxm", temp_limit_c=None)


def test_transition_power_is_the_rail_charge_over_the_latency():
    """Extra board power while the clock moves ``ps0 -> ps1``: the core rail's capacitor
    ``C/2 |V0^2 - V1^2|`` charged or drained over the transition latency (0 between equal
    voltages, and 0 on a device without a published latency)."""
    from devices.power import DevicePower

    s = device("h100-sxm")
    dev = DevicePower(s)
    states = sorted(s.p_states, key=lambda p: -p[0])
    c_f, lat_s = s.regulator_capacitance_mf * 1e-3, s.dvfs_transition_us * 1e-6
    for a, b in ((0, len(states) - 1), (len(states) - 1, 0), (0, 1), (11, 13)):
        expect = 0.5 * c_f * abs(states[a][1] ** 2 - states[b][1] ** 2) / lat_s
        assert dev.transition_w(a, b) == pytest.approx(expect, rel=1e-12)
    assert dev.transition_w(0, len(states) - 1) > 1.0
    assert DevicePower(device("h100-sxm", dvfs_transition_us=None)).transition_w(0, 5) == 0.0
    assert DevicePower(device("h100-sxm", regulator_capacitance_mf=None)).transition_w(0, 5) \
        == 0.0  # no published rail capacitance: no charge to move


@pytest.mark.parametrize("margin_w,ok", [(0.5, True), (-0.5, False)])
def test_idle_w_must_cover_leakage_and_regulator_loss(margin_w, ok):
    """A device whose ``idle_w`` leaves base power ``margin_w`` above zero is accepted, below
    zero refused: idle_w built from the definition (regulator input for base + leakage at the
    lowest P-state and the leakage reference temperature)."""
    from pydantic import ValidationError

    from devices.power import DevicePower

    s = device("h100-sxm")
    reg = DevicePower(s).regulator  # depends on tdp_w, not on idle_w
    v_low = min(s.p_states, key=lambda p: p[0])[1]
    idle = reg.input_power(margin_w + ref_leak(s, v_low, s.leakage_ref_c))
    if ok:
        assert DevicePower(device("h100-sxm", idle_w=idle)).base_w == pytest.approx(margin_w,
                                                                                     abs=1e-6)
    else:
        with pytest.raises(ValidationError, match="idle_w"):
            device("h100-sxm", idle_w=idle)


@pytest.mark.parametrize("margin_w,ok", [(0.5, True), (-0.5, False)])
def test_tdp_w_must_leave_dynamic_power(margin_w, ok):
    """``tdp_w`` with full dynamic power ``margin_w`` above / below zero is accepted / refused:
    tdp_w solved with brentq so that regulator output(tdp) - base - leakage(top, T_limit) =
    margin (the regulator curve is scaled by tdp_w, so it is rebuilt for every candidate)."""
    from pydantic import ValidationError

    from devices.regulator import VoltageRegulator

    s = device("h100-sxm")
    v_top = max(s.p_states, key=lambda p: p[0])[1]
    leak_idle = ref_leak(s, min(s.p_states, key=lambda p: p[0])[1], s.leakage_ref_c)

    def dyn(tdp: float) -> float:
        reg = VoltageRegulator(s.regulator_efficiency, tdp, None, 0.0)
        base = brentq(lambda b: reg.input_power(b + leak_idle) - s.idle_w, -s.idle_w,
                      s.idle_w, xtol=1e-12)
        return reg.output_for_input(tdp) - base - ref_leak(s, v_top, s.temp_limit_c) - margin_w

    tdp = brentq(dyn, s.idle_w, s.tdp_w, xtol=1e-9)
    if ok:
        device("h100-sxm", tdp_w=tdp)
    else:
        with pytest.raises(ValidationError, match="tdp_w"):
            device("h100-sxm", tdp_w=tdp)


def _check_cap_feasibility(spec: PowerSpec, cm: ComputeModel, ok: bool) -> None:
    """Planning one block under ``spec`` succeeds when ``ok``, else is an InfeasibleConfig."""
    from twin.kernel.errors import InfeasibleConfig

    if ok:
        PowerSetup(spec, cm, stage_blocks={0: _blocks()[:1]})
    else:
        with pytest.raises(InfeasibleConfig):
            PowerSetup(spec, cm, stage_blocks={0: _blocks()[:1]})


@pytest.mark.parametrize("cap_w,ok", [(0.6, True), (0.4, False)])
def test_a_cap_just_above_a_sub_watt_idle_board_is_feasible(cap_w, ok):
    """A board without P-states or a transition latency (basic model) that idles at 0.5 W:
    the cap floor is its idle power alone, so 0.6 W is feasible and 0.4 W is not."""
    s = device("h100-sxm", basic=True, idle_w=0.5)
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    spec = PowerSpec.model_validate({"cap_w": cap_w})
    _check_cap_feasibility(spec, cm, ok)


def test_design_power_is_the_alert_figure_else_the_budget_else_boards_plus_links():
    """``power.alerts.design_power_w`` (README key table): given, else the manager budget,
    else devices x tdp_w + the links' idle power (one device when the count is not given)."""
    s = device("h100-sxm")
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    blocks = {0: _blocks()[:1]}
    assert PowerSetup(PowerSpec(), cm, blocks, devices=8).design_power_w(40.0) == \
        pytest.approx(8 * s.tdp_w + 40.0, rel=1e-15)
    assert PowerSetup(PowerSpec(), cm, blocks).design_power_w(40.0) == \
        pytest.approx(s.tdp_w + 40.0, rel=1e-15)
    budget = PowerSpec.model_validate({"manager": {"budget_w": 3000.0}})
    assert PowerSetup(budget, cm, blocks, devices=8).design_power_w(40.0) == 3000.0
    both = PowerSpec.model_validate({"manager": {"budget_w": 3000.0},
                                     "alerts": {"design_power_w": 2500.0}})
    assert PowerSetup(both, cm, blocks, devices=8).design_power_w(40.0) == 2500.0


def test_a_basic_device_has_one_operating_point_at_its_clock():
    """Without a P-state table the device runs at its catalog clock_mhz at nominal voltage."""
    from devices.power import DevicePower

    s = device("h100-sxm", basic=True)
    dev = DevicePower(s)
    assert (dev.mhz, dev.volts, dev.n_states) == ([s.clock_mhz], [1.0], 1)
    assert dev.state_of(s.clock_mhz) == 0 and dev.math_scale == [1.0]


def test_power_schema_bounds_are_the_documented_ones():
    """README key table: ``power.alerts.window_s`` >= 1e-6 s and finite,
    ``power.alerts.mfu_iterations`` >= 1."""
    from pydantic import ValidationError

    for ok in ({"window_s": 1e-6}, {"window_s": 1.5e-6}, {"mfu_iterations": 1}):
        PowerSpec.model_validate({"alerts": ok})
    for bad in ({"window_s": 0.9e-6}, {"window_s": float("inf")}, {"mfu_iterations": 0}):
        with pytest.raises(ValidationError):
            PowerSpec.model_validate({"alerts": bad})


def test_a_warm_start_above_the_limit_starts_at_the_limit():
    """``thermal.initial: warm``: the steady state of the stage's blocks at the top clock,
    ``T = T_amb + R (P_idle(T) + P_dyn)`` (fixed point written here), clipped at the throttle
    limit when the load would heat the die beyond it (the throttle holds it there); an idle
    start is never clipped (the idle steady state is far below the limit)."""
    s = device("h100-sxm")
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    reg = cm.power.regulator
    base, dyn = ref_unknowns(s, reg)
    blocks = [b for b in _blocks() if any(k.gemm for k in b.kernels)][:1]
    d, e_dyn, e_hbm = ref_block_energy(s, blocks[0], dyn)
    warm_w = (e_dyn + e_hbm) / d
    v_top = max(s.p_states, key=lambda p: p[0])[1]
    amb = 45.0
    t = amb
    for _ in range(200):
        t = amb + s.thermal_r_k_per_w * (base + ref_leak(s, v_top, t) + warm_w)
    assert t > s.temp_limit_c + 1.0  # the load alone would heat the die past the limit
    setup = PowerSetup(PowerSpec.model_validate({"thermal": {"ambient_c": amb}}), cm,
                       stage_blocks={0: blocks})
    assert setup.initial_temp_c(stage=0) == pytest.approx(s.temp_limit_c, abs=1e-9)
    v_low = min(s.p_states, key=lambda p: p[0])[1]
    t_idle = amb
    for _ in range(200):
        t_idle = amb + s.thermal_r_k_per_w * (base + ref_leak(s, v_low, t_idle))
    assert setup.initial_temp_c() == pytest.approx(t_idle, rel=1e-9)


def test_an_idle_start_is_the_idle_steady_state_at_the_lowest_p_state():
    """``thermal.initial: idle``: the fixed point of ``T = T_amb + R (P_base + leak(V_low, T))``
    at the lowest P-state's voltage (on a two-state H100, 1.02 V, not the top state's 1.08)."""
    s = _two_state_h100()
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    base, _ = ref_unknowns(s, cm.power.regulator)
    v_low = min(s.p_states, key=lambda p: p[0])[1]
    t = 25.0
    for _ in range(200):
        t = 25.0 + s.thermal_r_k_per_w * (base + ref_leak(s, v_low, t))
    setup = PowerSetup(PowerSpec.model_validate({"thermal": {"initial": "idle"}}), cm,
                       stage_blocks={0: _blocks()[:1]})
    assert setup.initial_temp_c(stage=0) == pytest.approx(t, rel=1e-9)
    assert setup.initial_temp_c() == pytest.approx(t, rel=1e-9)


@pytest.mark.parametrize("factor,ok", [(1 + 1e-6, True), (1 - 1e-6, False)])
def test_without_transitions_the_cap_floor_is_idle_at_the_lowest_p_state(factor, ok):
    """No transition latency (and nothing that changes clocks: throttling off): the cap floor
    is the board's idle power at the lowest P-state (1.02 V on the two-state H100) at the
    temperature limit, from the catalog definitions."""
    s = device("h100-sxm", p_states=_two_state_h100().p_states, dvfs_transition_us=None)
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    reg = cm.power.regulator
    base, _ = ref_unknowns(s, reg)
    v_low = min(s.p_states, key=lambda p: p[0])[1]
    floor = reg.input_power(base + ref_leak(s, v_low, s.temp_limit_c))
    spec = PowerSpec.model_validate({"cap_w": floor * factor, "thermal": {"throttle": False}})
    _check_cap_feasibility(spec, cm, ok)


def test_bubble_clock_defaults_to_the_lowest_p_state():
    """``power.dvfs.wait_frequency_mhz`` default (README): the lowest P-state."""
    s = _two_state_h100()
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    setup = PowerSetup(PowerSpec.model_validate({"dvfs": {"bubble_downclock": True}}), cm,
                       stage_blocks={0: _blocks()[:1]})
    assert setup.dev.mhz[setup.wait_ps] == min(f for f, _ in s.p_states)
    h = device("h100-sxm")
    cm = ComputeModel(h, "bf16", h.hbm_pj_per_bit)
    setup = PowerSetup(PowerSpec.model_validate({"dvfs": {"bubble_downclock": True}}), cm,
                       stage_blocks={0: _blocks()[:1]})
    assert setup.dev.mhz[setup.wait_ps] == 810.0


def test_p_states_are_ordered_by_clock_whatever_order_the_catalog_lists_them():
    """A P-state table given slowest first (equal voltages at the bottom, as on H100) is the
    same device: fastest first by clock, ties in voltage do not reorder clocks; a voltage that
    rises as the clock falls is refused."""
    from pydantic import ValidationError

    from devices.power import DevicePower

    s = device("h100-sxm")
    fastest_first = DevicePower(s)
    slowest_first = DevicePower(device("h100-sxm", p_states=sorted(s.p_states)))
    assert slowest_first.mhz == fastest_first.mhz == sorted((f for f, _ in s.p_states),
                                                            reverse=True)
    assert slowest_first.volts == fastest_first.volts
    with pytest.raises(ValidationError, match="must not rise"):
        device("h100-sxm", p_states=[(1980.0, 1.0), (1890.0, 1.05)])


@pytest.mark.parametrize("side", [0.98, 1.02])
def test_idle_die_runs_away_exactly_beyond_the_critical_thermal_resistance(side):
    """Idle steady state ``T = T_a + R (P_b + L e^{k (T - T_ref)})`` (``L`` the leakage at
    the lowest P-state's voltage). ``phi(T) = T_a + R P(T) - T`` is convex with its minimum
    where ``R L k e^{k (T* - T_ref)} = 1``, i.e. ``phi(T*) = T_a + R P_b + 1/k - T*``: a fixed
    point exists iff ``phi(T*) <= 0``. The critical ``R_c`` (``phi(T*) = 0``) is solved
    here with brentq; 2% below it the twin returns the lower root of ``phi``, 2% above it
    reports a thermal runaway (InfeasibleConfig on ``power.thermal``) instead of overflowing
    ``exp`` (a fuzzed ``tdp_w`` of 1e5 W raised OverflowError)."""
    from twin.kernel.errors import InfeasibleConfig

    s0 = device("h100-sxm")
    amb = 25.0
    v_low = min(s0.p_states, key=lambda p: p[0])[1]

    def phi_min(r: float) -> float:
        s = device("h100-sxm", thermal_r_k_per_w=r)
        base, _ = ref_unknowns(s, ComputeModel(s, "bf16", s.hbm_pj_per_bit).power.regulator)
        lk = ref_leak(s, v_low, s.leakage_ref_c)  # L, the leakage at T_ref
        k = s.leakage_per_k
        t_star = s.leakage_ref_c + math.log(1.0 / (r * lk * k)) / k
        return amb + r * base + 1.0 / k - t_star

    r_c = brentq(phi_min, 1e-3, 50.0, xtol=1e-12)
    s = device("h100-sxm", thermal_r_k_per_w=side * r_c)
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    base, _ = ref_unknowns(s, cm.power.regulator)
    setup = PowerSetup(PowerSpec.model_validate({"thermal": {"ambient_c": amb}}), cm)
    if side > 1:
        with pytest.raises(InfeasibleConfig) as err:
            setup.initial_temp_c()
        assert [p.path for p in err.value.problems] == ["power.thermal"]
        assert "thermal runaway" in err.value.problems[0].message
        return
    r = s.thermal_r_k_per_w
    t_star = s.leakage_ref_c + math.log(
        1.0 / (r * ref_leak(s, v_low, s.leakage_ref_c) * s.leakage_per_k)) / s.leakage_per_k
    t = brentq(lambda x: amb + r * (base + ref_leak(s, v_low, x)) - x, amb, t_star, xtol=1e-12)
    assert setup.initial_temp_c() == pytest.approx(t, rel=1e-9)


@pytest.mark.parametrize("t_ss", [900.0, 1100.0])
def test_a_steady_state_counts_as_runaway_above_1000_c(t_ss):
    """Without leakage the idle steady state is the closed form ``T = T_a + R P_b``. Choosing
    R puts it at 900 C (returned, to 1e-9) or 1100 C: past the 1000 C the twin treats as a
    thermal runaway (far above any die's destruction), so an InfeasibleConfig."""
    from twin.kernel.errors import InfeasibleConfig

    amb = 25.0
    s0 = device("h100-sxm", leakage_w=0.0)
    base, _ = ref_unknowns(s0, ComputeModel(s0, "bf16", s0.hbm_pj_per_bit).power.regulator)
    s = device("h100-sxm", leakage_w=0.0, thermal_r_k_per_w=(t_ss - amb) / base)
    setup = PowerSetup(PowerSpec.model_validate({"thermal": {"ambient_c": amb}}),
                       ComputeModel(s, "bf16", s.hbm_pj_per_bit))
    if t_ss > 1000.0:
        with pytest.raises(InfeasibleConfig, match="thermal runaway"):
            setup.initial_temp_c()
    else:
        assert setup.initial_temp_c() == pytest.approx(t_ss, rel=1e-9)
