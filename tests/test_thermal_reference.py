"""Thermal RC node and voltage regulator against references independent of their code.

The thermal node is checked against ``C dT/dt = P - (T - T_amb) / R`` integrated numerically
by ``scipy.integrate.solve_ivp`` (RK45 with rtol = atol = 1e-10: the integration error is far
below the 1e-6 K tolerance), crossing times against the solver's event location. The
regulator's efficiency curve is checked against ``numpy.interp`` (piecewise linear, constant
beyond the end points: exactly the documented curve), its inverse against ``brentq`` on that
reference, and the transition energy against ``C/2 |V1^2 - V0^2|`` evaluated here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.optimize import brentq

from devices.regulator import VoltageRegulator
from devices.thermal import ThermalRC

TOL = dict(rtol=1e-10, atol=1e-10)
# (R K/W, C J/K, T0 C, P W, T_amb C): heating and cooling, several time constants
CASES = [(0.084, 700.0, 40.0, 600.0, 30.0), (0.2, 50.0, 90.0, 100.0, 25.0),
         (0.05, 3000.0, 35.0, 0.0, 35.0), (1.3, 2.0, 20.0, 45.0, 40.0)]


def _ode(r: float, c: float, p: float, amb: float):
    return lambda _t, y: [(p - (y[0] - amb) / r) / c]


def _solve(r, c, t0, p, amb, t_end, **kw):
    return solve_ivp(_ode(r, c, p, amb), (0.0, t_end), [t0], **TOL, **kw)


@pytest.mark.parametrize("r, c, t0, p, amb", CASES)
def test_advance_matches_the_ode(r, c, t0, p, amb):
    th = ThermalRC(r, c, 83.0)
    tau = r * c
    times = np.array([0.0, 0.01, 0.3, 1.0, 2.5, 7.0]) * tau
    sol = _solve(r, c, t0, p, amb, times[-1], t_eval=times)
    for t, ref in zip(times, sol.y[0], strict=True):
        assert th.advance(t0, p, float(t), amb) == pytest.approx(ref, abs=1e-6)


@pytest.mark.parametrize("r, c, t0, p, amb", CASES)
def test_steady_state_is_where_the_ode_settles(r, c, t0, p, amb):
    th = ThermalRC(r, c, 83.0)
    sol = _solve(r, c, t0, p, amb, 40 * r * c)
    assert th.steady(p, amb) == pytest.approx(sol.y[0, -1], abs=1e-6)
    assert th.advance(t0, p, 40 * r * c, amb) == pytest.approx(sol.y[0, -1], abs=1e-6)


def test_time_constant_is_the_63_percent_time():
    """The ODE reaches 1 - 1/e of its step response at t = R C."""
    r, c = 0.3, 20.0
    th = ThermalRC(r, c, 83.0)
    target = 30.0 + (1 - math.exp(-1)) * (r * 100.0)
    ev = lambda _t, y: y[0] - target  # noqa: E731
    sol = _solve(r, c, 30.0, 100.0, 30.0, 10 * r * c, events=ev)
    assert th.tau == pytest.approx(sol.t_events[0][0], rel=1e-7)


@pytest.mark.parametrize("t0, p, level, amb", [
    (50.0, 600.0, 83.0, 35.0),     # heating through the limit
    (95.0, 50.0, 60.0, 30.0),      # cooling down through a lower level
    (20.0, 300.0, 21.0, 20.0),     # just above the start
    (30.0, 900.0, 100.0, 25.0),
])
def test_crossing_matches_the_ode_event(t0, p, level, amb):
    r, c = 0.084, 700.0
    th = ThermalRC(r, c, 83.0)
    ev = lambda _t, y: y[0] - level  # noqa: E731
    sol = _solve(r, c, t0, p, amb, 50 * r * c, events=ev)
    assert th.crossing(t0, p, level, amb) == pytest.approx(sol.t_events[0][0], rel=1e-6)


SS = 35.0 + 0.084 * 600.0  # steady state of the edge cases at 600 W, 35 C inlet


@pytest.mark.parametrize("t0, p, level, amb, expect", [
    (50.0, 100.0, 83.0, 35.0, math.inf),   # settles at 43.4 C, below the level
    (50.0, 600.0, 40.0, 35.0, math.inf),   # heating: a lower level is never reached
    (90.0, 0.0, 95.0, 35.0, math.inf),     # cooling: a higher level is never reached
    (50.0, 600.0, SS, 35.0, math.inf),     # the steady state itself: approached, never reached
    (83.0, 600.0, 83.0, 35.0, 0.0),        # already at the level
    (SS, 600.0, SS, 35.0, 0.0),            # at the steady state and the level
    (SS, 600.0, 90.0, 35.0, math.inf),     # at the steady state, level elsewhere
])
def test_crossing_edge_cases_against_the_ode(t0, p, level, amb, expect):
    """Never-reached levels: the ODE trajectory over 30 time constants stays on one side."""
    r, c = 0.084, 700.0
    th = ThermalRC(r, c, 83.0)
    assert th.crossing(t0, p, level, amb) == expect
    if expect == math.inf:
        sol = _solve(r, c, t0, p, amb, 30 * r * c, t_eval=np.linspace(0, 30 * r * c, 400))
        gap = sol.y[0] - level
        side = np.sign(gap[np.abs(gap) > 1e-6])  # ignore the solver's noise at the asymptote
        assert (side == side[0]).all()


def test_limit_is_kept():
    assert ThermalRC(0.1, 10.0, 91.5).limit_c == 91.5


# ----------------------------------------------------------------------------- regulator
CURVE = [(0.5, 0.93), (0.05, 0.80), (1.0, 0.90), (0.2, 0.91)]  # unsorted on purpose


def test_efficiency_is_the_piecewise_linear_curve():
    reg = VoltageRegulator(CURVE, rated_w=700.0)
    xs = np.array(sorted(x for x, _ in CURVE)) * 700.0
    es = np.array([e for _, e in sorted(CURVE)])
    for p in np.concatenate([np.linspace(0.0, 1000.0, 301), xs]):
        assert reg.efficiency(float(p)) == pytest.approx(float(np.interp(p, xs, es)), abs=1e-12)
    assert reg.efficiency(-5.0) == 0.80 and reg.efficiency(1e6) == 0.90


def test_input_power_divides_by_the_efficiency():
    reg = VoltageRegulator(CURVE, rated_w=700.0)
    xs = np.array(sorted(x for x, _ in CURVE)) * 700.0
    es = np.array([e for _, e in sorted(CURVE)])
    for p in (1.0, 35.0, 100.0, 140.0, 333.0, 700.0, 900.0):
        assert reg.input_power(p) == pytest.approx(p / np.interp(p, xs, es), rel=1e-12)


def test_output_for_input_inverts_input_power():
    reg = VoltageRegulator(CURVE, rated_w=700.0)
    xs = np.array(sorted(x for x, _ in CURVE)) * 700.0
    es = np.array([e for _, e in sorted(CURVE)])
    for p_in in (0.5, 2.0, 50.0, 160.0, 400.0, 780.0, 1200.0):
        ref = brentq(lambda q, p_in=p_in: q / np.interp(q, xs, es) - p_in, 0.0, p_in,
                     xtol=1e-12)
        assert reg.output_for_input(p_in) == pytest.approx(ref, rel=1e-9)


def test_ideal_regulator_is_lossless():
    reg = VoltageRegulator(None, rated_w=700.0)
    assert reg.ideal and reg.efficiency(123.0) == 1.0
    assert reg.input_power(123.0) == 123.0 and reg.output_for_input(321.0) == 321.0
    assert VoltageRegulator([], rated_w=1.0).ideal


def test_transition_energy_is_half_c_delta_v_squared():
    reg = VoltageRegulator(CURVE, rated_w=700.0, latency_s=2e-5, capacitance_f=0.03)
    assert reg.latency_s == 2e-5
    up = 0.5 * 0.03 * (0.9 ** 2 - 0.7 ** 2)
    assert reg.transition_energy(0.7, 0.9) == pytest.approx(up, rel=1e-12)
    assert reg.transition_energy(0.9, 0.7) == pytest.approx(up, rel=1e-12)
    assert reg.transition_energy(0.8, 0.8) == 0.0
    assert VoltageRegulator(None, 1.0).transition_energy(0.7, 0.9) == 0.0
