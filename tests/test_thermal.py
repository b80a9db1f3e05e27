"""Thermal model: closed form vs a numerical ODE solution, leakage feedback, throttling, heat
soak and the temperature alert."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy
from scipy.integrate import solve_ivp
from scipy.optimize import brentq

from devices.accelerator import Accelerator, ComputeModel
from devices.power import PowerSetup, PowerSpec
from devices.spec import DeviceSpec
from devices.thermal import ThermalRC
from tests.conftest import ROOT
from twin.catalogs import catalog
from twin.kernel.records import Recorder
from twin.runner import run
from twin.trace import read_table


def test_closed_form_matches_ode_over_segments():
    th = ThermalRC(0.084, 700.0, 83.0)
    rng = np.random.default_rng(3)
    powers = rng.uniform(50, 700, 12)
    durs = rng.uniform(0.5, 40.0, 12)
    amb = 30.0
    t_c = 40.0
    y = [40.0]
    for p, d in zip(powers, durs, strict=True):
        t_c = th.advance(t_c, p, d, amb)
        sol = solve_ivp(lambda _t, yy, p=p: [(p - (yy[0] - amb) / th.r) / th.c], (0, d), y,
                        rtol=1e-11, atol=1e-11)
        y = [sol.y[0, -1]]
        assert t_c == pytest.approx(y[0], abs=1e-6)


def test_crossing_time_matches_ode_event():
    th = ThermalRC(0.084, 700.0, 83.0)
    t_cross = th.crossing(50.0, 600.0, 83.0, 35.0)
    ev = lambda _t, yy: yy[0] - 83.0  # noqa: E731
    ev.terminal = True
    sol = solve_ivp(lambda _t, yy: [(600.0 - (yy[0] - 35.0) / th.r) / th.c], (0, 1000), [50.0],
                    events=ev, rtol=1e-11, atol=1e-11)
    assert t_cross == pytest.approx(sol.t_events[0][0], rel=1e-6)
    assert th.crossing(50.0, 100.0, 83.0, 35.0) == math.inf   # steady state below the level
    assert th.crossing(83.0, 600.0, 83.0, 35.0) == 0.0


def _idle_agent(ambient: float, initial: float, enabled: bool = True):
    spec = DeviceSpec.model_validate(catalog("devices").get("h100-sxm").values)
    cm = ComputeModel(spec, "bf16", spec.hbm_pj_per_bit)
    ps = PowerSpec.model_validate({"thermal": {"ambient_c": ambient, "initial_c": initial,
                                               "max_step_s": 0.5, "enabled": enabled}})
    env = simpy.Environment()
    return env, Accelerator(env, 0, 1, cm, Recorder(), power=PowerSetup(ps, cm)), cm.power


def test_idle_device_settles_at_the_leakage_feedback_fixed_point():
    """Idle for 20 time constants: the temperature solves T = T_amb + R P_idle(T), P_idle
    growing with T through leakage (solved here with brentq)."""
    _env, acc, dev = _idle_agent(35.0, 35.0)
    th = dev.thermal
    acc.idle_until(20 * th.tau)
    ps = acc.ps  # the idle clock: the policy's (top) P-state
    f = lambda t: t - 35.0 - th.r * dev.idle_chip_w(ps, t)  # noqa: E731
    t_star = brentq(f, 0.0, 200.0)
    assert acc.temp_c == pytest.approx(t_star, abs=0.05)
    seg = acc.power_segments()
    # leakage feedback: later (hotter) idle segments draw more, exactly as the model says
    assert seg[-1, 2] > seg[0, 2]
    expect = dev.regulator.input_power(dev.idle_chip_w(ps, seg[-2, 5]))  # T at its start
    assert seg[-1, 2] == pytest.approx(expect, rel=1e-12)


def test_raising_the_ambient_during_a_run():
    """A cooling failure: the inlet jumps by 15 K at t = 60 s; the temperature then follows
    the closed form towards the new steady state."""
    env, acc, dev = _idle_agent(25.0, 40.0)

    def fault():
        yield env.timeout(60.0)
        acc.set_ambient(40.0)

    env.process(fault())
    env.run(until=60.0)
    acc.idle_until(60.0)
    t60 = acc.temp_c
    env.run(until=60.0 + 3 * dev.thermal.tau)
    acc.idle_until(env.now)
    assert acc.ambient_c == 40.0
    assert acc.temp_c > t60 + 10.0


@pytest.fixture
def hot(tiny):
    """Tiny job on hot inlet air with a small heat capacity (tau ~ 1 s), so a heat soak fits
    in a few simulated seconds."""
    def make(extra=()):
        return tiny(["workload.iterations=30", "workload.seq_len=1024",
                     "workload.global_batch=64", "workload.micro_batch=4",
                     "cluster.device.thermal_c_j_per_k=12",
                     "power.thermal.throttle_interval_s=0.05", "power.thermal.initial=idle",
                     *extra])
    return make


def test_heat_soak_throttles_and_alerts_at_the_limit(hot, capsys):
    res = run(hot(["power.thermal.ambient_c=50"]))
    s = res.summary
    lim = 83.0
    assert s["throttle_steps"] > 0
    assert s["max_temperature_c"] >= lim
    assert s["max_temperature_c"] < lim + 3.0          # throttling holds it near the limit
    pw = read_table(res.trace_path, "power")
    g = pw[pw["cls"] == 0].sort_values("t_start")
    first_hot = int(np.argmax(g["temp_c"].to_numpy() >= lim))
    t_hot = float(g["t_end"].iloc[first_hot])
    before = g[g["t_end"] <= float(g["t_start"].iloc[first_hot])]
    after = g[g["t_start"] > t_hot + 0.2]
    assert (before["freq_mhz"] == 1980).all()          # full clock until the limit
    assert after["freq_mhz"].min() < 1980              # throttled afterwards
    its = np.array(res.iteration_times_s)
    assert its[-10:].mean() > its[:5].mean() * 1.02    # iterations got slower
    alerts = read_table(res.trace_path, "alerts")
    temp = alerts[alerts["kind"] == "temperature"]
    assert len(temp) >= 1
    row = g.iloc[first_hot]
    t0_c = float(g["temp_c"].iloc[first_hot - 1])
    r, c = 0.084, 12.0  # the device's R (catalog) and the C set above
    # the segment's dissipated power, recovered from its end temperature (closed form of the
    # RC step response), then the crossing time found by integrating the ODE numerically
    # (an event of solve_ivp), not with the ThermalRC.crossing the accelerator calls
    d = float(row["t_end"] - row["t_start"])
    a = math.exp(-d / (r * c))
    heat = ((float(row["temp_c"]) - t0_c * a) / (1 - a) - 50.0) / r
    ev = lambda _t, yy: yy[0] - lim  # noqa: E731
    ev.terminal = True
    sol = solve_ivp(lambda _t, yy: [(heat - (yy[0] - 50.0) / r) / c], (0.0, d), [t0_c],
                    events=ev, rtol=1e-12, atol=1e-12)
    expect = float(row["t_start"]) + float(sol.t_events[0][0])
    assert float(temp["time_s"].iloc[0]) == pytest.approx(expect, rel=1e-9, abs=1e-9)
    with capsys.disabled():
        print(f"\nheat soak: limit reached at {expect:.2f} s, {s['throttle_steps']} throttle "
              f"steps, iteration time {its[:5].mean():.4f} -> {its[-10:].mean():.4f} s")


def test_cool_inlet_does_not_throttle(hot):
    s = run(hot(["power.thermal.ambient_c=20"])).summary
    assert s["throttle_steps"] == 0 and s["alerts_by_kind"]["temperature"] == 0
    assert s["max_temperature_c"] < 83.0


def test_thermal_disabled_keeps_temperature(tiny):
    res = run(tiny(["power.thermal.enabled=false", "power.thermal.initial_c=60"]))
    pw = read_table(res.trace_path, "power")
    assert (pw["temp_c"] == 60.0).all()


@pytest.mark.slow
def test_heat_soak_scenario():
    from twin.scenario import load_scenario

    s = load_scenario(ROOT / "scenarios/heat_soak.yaml", ["trace.enabled=false"])
    res = run(s)
    assert res.summary["throttle_steps"] > 0
    its = np.array(res.iteration_times_s)
    assert its[-50:].mean() > its[:50].mean()


def test_ambient_change_during_a_block_applies_after_it():
    from workloads.transformer import Block, Kernel

    env, acc, dev = _idle_agent(25.0, 50.0)
    blk = Block("gemm", (Kernel("gemm", 2.0 * 32768 ** 3, 1e9, True),))   # ~0.1 s block

    def job():
        yield from acc.compute(blk, 0, 0, 0, 0)

    def fault():
        yield env.timeout(0.01)
        acc.set_ambient(45.0)

    env.process(job())
    env.process(fault())
    env.run()
    seg = acc.power_segments()
    t0, t1, watts = seg[0, :3]
    assert seg.shape[0] == 1 and t0 == 0.0 and t1 > 0.01
    assert acc.ambient_c == 45.0
    th = dev.thermal
    leak = dev.leakage(acc.ps, 50.0)
    heat = dev.regulator.output_for_input(watts)        # chip power of the block
    assert heat > dev.base_w + leak
    assert seg[0, 5] == pytest.approx(th.advance(50.0, heat, t1 - t0, 25.0), abs=1e-6)


@pytest.mark.parametrize(("gradient", "ok"), [(75.0, True), (75.0 + 1e-9, False),
                                              (-298.15, True), (-298.15 - 1e-9, False),
                                              (1e308, False)])
def test_the_inlet_gradient_keeps_every_inlet_a_temperature(gradient, ok):
    """``ambient_c + inlet_gradient_k`` is the far devices' inlet air: it must lie in
    [absolute zero, 100 C] like ``ambient_c`` itself (a fuzzed 1e308 K overflowed exp in the
    leakage); the error names power.thermal and both values."""
    from pydantic import ValidationError

    spec = {"thermal": {"ambient_c": 25.0, "inlet_gradient_k": gradient}}
    if ok:
        assert PowerSpec.model_validate(spec).thermal.inlet_gradient_k == gradient
        return
    with pytest.raises(ValidationError, match="ambient_c \\+ inlet_gradient_k within"):
        PowerSpec.model_validate(spec)


def test_the_idle_step_is_bounded_and_counted_in_the_event_budget(tiny):
    """``max_step_s`` cuts idle time into segments, each an event: 1e-308 s hung a run (the
    steps never added up to a kernel's gap). Below 1e-6 s it is a field error; a step that
    would cut the run into more segments than ``simulation.limits.max_events`` allows is
    refused before the run, naming the key; the same run with the default step fits."""
    from twin.budget import check_budget, estimate
    from twin.kernel.errors import ScenarioError

    for bad in ("1e-7", ".inf", ".nan"):  # an infinite step is not a step either
        with pytest.raises(ScenarioError, match="max_step_s"):
            tiny([f"power.thermal.max_step_s={bad}"])
    base = tiny()
    e = estimate(base)
    # a budget with room for 10x the run's other events, but not for one segment per 1e-6 s
    limit = int(10 * e.events) + 1
    assert e.classes * e.sim_time_s / 1e-6 > limit
    fits = tiny([f"simulation.limits.max_events={limit}"])  # loading checks the budget
    assert check_budget(fits) == []
    with pytest.raises(ScenarioError) as err:
        tiny([f"simulation.limits.max_events={limit}", "power.thermal.max_step_s=1e-6"])
    problems = err.value.problems
    assert [p.path for p in problems] == ["simulation.limits.max_events"]
    assert "power.thermal.max_step_s" in problems[0].message


def test_idle_time_is_cut_only_for_the_thermal_model():
    """``max_step_s`` cuts idle time so that leakage follows the temperature: 10 s idle at a
    0.5 s step is 20 segments with the thermal model; without it the temperature stays where
    it started, so the same 10 s is one segment at one power (the same energy)."""
    _env, on, _dev = _idle_agent(35.0, 35.0)
    _env, off, _dev = _idle_agent(35.0, 35.0, enabled=False)
    on.idle_until(10.0)
    off.idle_until(10.0)
    assert len(on.power_segments()) == 20
    seg = off.power_segments()
    assert len(seg) == 1 and (seg[0, 0], seg[0, 1]) == (0.0, 10.0)
    assert off.temp_c == 35.0 and off.energy_j == pytest.approx(seg[0, 2] * 10.0, rel=1e-12)
