"""Cluster power manager on delayed telemetry (second brief) and the alerts.

The scenario of ``scenarios/power_manager_tau0.yaml`` with a shorter run and period (0.3 s) so
two runs take a few seconds: no delay vs a 1.5 s delay (5 periods).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import ROOT
from twin.runner import run
from twin.scenario import load_scenario
from twin.trace import read_table

SHORT = ["workload.iterations=80", "power.manager.period_s=0.3", "power.alerts.window_s=0.3"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for tau in (0.0, 1.5):
        path = tmp_path_factory.mktemp("pm") / f"tau{tau}.h5"
        scen = load_scenario(ROOT / "scenarios/power_manager_tau0.yaml",
                             [*SHORT, f"power.manager.telemetry_delay_s={tau}"])
        res = run(scen, path)
        out[tau] = (scen, res, read_table(path, "telemetry"))
    return out


def test_no_delay_approaches_the_budget_smoothly(runs):
    scen, _res, tel = runs[0.0]
    b = scen.power.manager.budget_w
    p = tel["power_w"].to_numpy() / b
    first = int(np.argmax(p >= 0.95))
    assert first > 0
    assert np.all(np.diff(p[:first + 1]) > 0)      # monotone approach from below
    # then it stays near the budget: within one P-state step (~6% here) above, never collapsing
    assert p.max() < 1.10
    assert p[first:].min() > 0.85
    # never collapsing: the cap stays well above the lowest clock (810 MHz), more than four
    # 90 MHz P-state steps away from it
    assert tel["cap_mhz"].iloc[first:].min() > 810.0 + 4 * 90.0


def test_long_delay_overshoots_then_collapses(runs):
    scen, _res, tel = runs[1.5]
    b = scen.power.manager.budget_w
    p = tel["power_w"].to_numpy() / b
    cap = tel["cap_mhz"].to_numpy()
    peak = int(np.argmax(p))
    assert p[peak] > 1.3                            # overshoot past the red line
    assert cap[peak:].min() == 810.0                # collapse to the lowest clock
    assert p[peak:].min() < 0.7                     # the collapse undershoots the budget
    # the controller acted on readings 5 periods old
    used = tel["reading_w"].to_numpy()
    k = 5
    np.testing.assert_allclose(used[k:], tel["power_w"].to_numpy()[:-k], rtol=1e-12)
    assert np.isnan(used[:k]).all()
    slower = runs[1.5][1].summary["iteration_time_s"] / runs[0.0][1].summary["iteration_time_s"]
    assert slower > 1.05


def _windowed_power(path, window, makespan, network_w) -> tuple[np.ndarray, np.ndarray]:
    """Reference: average cluster power per window from the power table, by plain loops."""
    pw = read_table(path, "power")
    size = read_table(path, "ranks").groupby("cls").size()
    n = math.ceil(makespan / window - 1e-9)
    ends = np.minimum(window * np.arange(1, n + 1), makespan)
    energy = np.zeros(n)
    for t0, t1, w, c in zip(pw["t_start"], pw["t_end"], pw["watts"], pw["cls"], strict=True):
        for i in range(int(t0 // window), min(int(t1 // window) + 1, n)):
            lo, hi = max(t0, i * window), min(t1, ends[i])
            if hi > lo:
                energy[i] += (hi - lo) * w * size[c]
    dur = np.diff(np.concatenate([[0.0], ends]))
    return ends, energy / dur + network_w


@pytest.mark.parametrize("tau", [0.0, 1.5])
def test_the_manager_measures_boards_plus_idle_links(runs, tau):
    """Each sample is the boards' average power over its period (the power table, windowed by
    plain loops) plus the links' idle power, each direction half of its NVLink links' idle
    power (catalog ``nvlink4``, 0.25 W a link): on the 4x2 torus, 16 directed x links of 4
    links and 8 directed y links of 8 (a ring of 2 wraps onto the same pair: its two edges are
    one, doubled)."""
    _scen, res, tel = runs[tau]
    ends, board = _windowed_power(res.trace_path, 0.3, res.summary["makespan_s"], 0.0)
    k = len(tel)
    np.testing.assert_allclose(tel["time_s"], ends[:k], rtol=1e-9)
    from twin.catalogs import catalog

    link_w = catalog("links").get("nvlink4").values["idle_w"]  # one link, both directions
    idle = 16 * link_w * 4 / 2 + 8 * link_w * 8 / 2
    np.testing.assert_allclose(tel["power_w"], board[:k] + idle, rtol=1e-9)


def test_an_unreachable_budget_lets_the_clock_reach_the_top(tiny):
    """Far under budget, the cap grows until it is clipped at the top P-state (1980 MHz)."""
    from twin.catalogs import catalog

    res = run(tiny(["workload.iterations=60", "power.manager.budget_w=1e6",
                    "power.manager.period_s=0.05", "power.manager.gain=0.5"]))
    tel = read_table(res.trace_path, "telemetry")
    top = catalog("devices").get("h100-sxm").values["clock_mhz"]
    assert tel["cap_mhz"].max() == top == 1980.0
    assert tel["cap_mhz"].iloc[-1] == top


@pytest.mark.parametrize("tau", [0.0, 1.5])
def test_power_alerts_fire_at_85_percent_of_design(runs, tau):
    scen, res, _tel = runs[tau]
    s = res.summary
    ends, watts = _windowed_power(res.trace_path, 0.3, s["makespan_s"],
                                  s["energy_breakdown_j"]["network"] / s["makespan_s"])
    limit = 0.85 * scen.power.manager.budget_w           # design power = the budget here
    over = watts > limit
    onsets = ends[over & ~np.concatenate([[False], over[:-1]])]
    alerts = read_table(res.trace_path, "alerts")
    got = alerts[alerts["kind"] == "power"]
    np.testing.assert_allclose(got["time_s"].to_numpy(), onsets, rtol=1e-9)
    np.testing.assert_allclose(got["threshold"].to_numpy(), limit)
    assert len(got) >= 1


@pytest.mark.parametrize("tau", [0.0, 1.5])
def test_mfu_alerts_fire_below_30_percent(runs, tau):
    _scen, res, _tel = runs[tau]
    s = res.summary
    its = np.array(res.iteration_times_s)
    mfu = s["model_flops_per_iteration"] / (its * s["devices"] * 989e12)
    low = mfu < 0.30
    start = low & ~np.concatenate([[False], low[:-1]])     # one alert per streak (of >= 1)
    onsets = np.cumsum(its)[start]
    alerts = read_table(res.trace_path, "alerts")
    got = alerts[alerts["kind"] == "mfu"]
    np.testing.assert_allclose(got["time_s"].to_numpy(), onsets, rtol=1e-9)
    np.testing.assert_allclose(got["value"].to_numpy(), mfu[start], rtol=1e-9)
    assert s["alerts_by_kind"]["mfu"] == start.sum() >= 1
    assert s["alerts"] == len(alerts)


def test_mfu_streak_and_thresholds_are_settable(tiny):
    base = run(tiny(["workload.iterations=3"])).summary
    assert base["mfu"] < 0.30 and base["alerts_by_kind"]["mfu"] == 1   # one streak, once
    s = run(tiny(["workload.iterations=3", "power.alerts.mfu_iterations=3"])).summary
    assert s["alerts_by_kind"]["mfu"] == 1
    s = run(tiny(["workload.iterations=3", "power.alerts.mfu_iterations=4"])).summary
    assert s["alerts_by_kind"]["mfu"] == 0                  # the streak is too short
    s = run(tiny(["workload.iterations=3", "power.alerts.mfu_threshold=0.05"])).summary
    assert s["alerts_by_kind"]["mfu"] == 0
    s = run(tiny(["power.alerts.design_power_w=1000"])).summary
    assert s["alerts_by_kind"]["power"] == 1                # 8 H100 draw more than 850 W
    assert base["alerts_by_kind"]["power"] == 0             # vs 8 x 700 W + links


def test_experiment_writes_plot_and_csv(tmp_path):
    import pandas as pd

    from experiments.power_manager import main

    assert main(["-o", str(tmp_path), "--delays", "0", "1.5", "--set", "workload.iterations=25",
                 "--set", "power.manager.period_s=0.3"]) == 0
    df = pd.read_csv(tmp_path / "power_manager.csv")
    assert set(df["delay_s"]) == {0.0, 1.5}
    assert {"time_s", "power_w", "reading_w", "cap_mhz", "budget_w"} <= set(df.columns)
    assert (tmp_path / "power_manager.png").stat().st_size > 10_000


@pytest.mark.parametrize("tau", [0.0, 1.5])
def test_the_summary_restates_the_telemetry(runs, tau):
    """The manager's summary keys are the telemetry table's: its largest sampled power, its
    lowest and its last clock cap."""
    _scen, res, tel = runs[tau]
    pm = res.summary["power_manager"]
    assert pm["peak_sampled_power_w"] == pytest.approx(tel["power_w"].max(), rel=1e-12)
    assert pm["min_cap_mhz"] == pytest.approx(tel["cap_mhz"].min(), rel=1e-12)
    assert pm["final_cap_mhz"] == pytest.approx(tel["cap_mhz"].iloc[-1], rel=1e-12)
