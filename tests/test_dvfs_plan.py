"""The per-stage clock planner (devices/dvfs.py) on hand-built stages.

A stand-in setup gives each stage a chosen amount of work, each P-state a chosen time scale
and power, and no idle power, so every estimate of the planner is a sum the test writes out:
busy = work x scale, energy = busy x power, iteration estimate
``T = (m - 1) / m max busy + sum busy / m``. The greedy steps are worked by hand from the
module's rule (the step that saves the most energy per second it adds, within the slack).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from devices.dvfs import plan_stages

SCALE = [1.0, 1.25, 1.6]  # time of a block at P-states 0, 1, 2 relative to the top clock


class _Block:
    """``work_s`` of math at the top clock, ``mem_s`` of HBM traffic at the nominal memory
    speed (a roofline: the longer of the two), ``power_w`` per P-state."""

    def __init__(self, work_s: float, power_w: list[float], mem_s: float = 0.0):
        self.work_s, self.power_w, self.mem_s = work_s, power_w, mem_s


def _setup(idle_w=(0.0, 0.0, 0.0), efficiency=1.0):
    dev = SimpleNamespace(n_states=3, mhz=[1980.0, 1600.0, 1200.0], math_scale=SCALE,
                          idle_chip_w=lambda k, temp: idle_w[k],
                          regulator=SimpleNamespace(input_power=lambda w: w / efficiency))
    compute = SimpleNamespace(block_cost=lambda b, scale, mem: SimpleNamespace(
        duration_s=max(b.work_s * scale, b.mem_s * mem)))
    return SimpleNamespace(dev=dev, compute=compute, initial_temp_c=lambda: 40.0,
                           block_power=lambda b, k, temp: b.power_w[k])


def test_unlimited_slack_takes_every_stage_to_the_lowest_clock():
    """Energy per unit of work 100, 75, 48 J at the three states: with any slowdown allowed
    both stages end at the lowest state; busy and energies by hand (two blocks of stage 0
    of 0.5 s each count as 1 s)."""
    a = _Block(0.5, [100.0, 60.0, 30.0])
    b = _Block(2.0, [100.0, 60.0, 30.0])
    plan = plan_stages(_setup(), {0: [a, a], 1: [b]}, microbatches=4, slack=10.0)
    assert plan.states == [2, 2] and plan.mhz == [1200.0, 1200.0]
    assert plan.base_busy_s == [1.0, 2.0]
    assert plan.busy_s == [pytest.approx(1.6), pytest.approx(3.2)]
    assert plan.base_iteration_s == pytest.approx(3 / 4 * 2.0 + 3.0 / 4)
    assert plan.est_iteration_s == pytest.approx(3 / 4 * 3.2 + 4.8 / 4)
    assert plan.base_energy_j == pytest.approx(100.0 * 3.0)
    assert plan.est_energy_j == pytest.approx(48.0 * 3.0)
    assert plan.predicted_saving == pytest.approx(1.0 - 48.0 / 100.0)
    assert plan.predicted_slowdown == pytest.approx(3.6 / 2.25 - 1.0)


def test_greedy_takes_the_most_energy_per_added_second_first():
    """One microbatch (T = sum of busy). Stage A (1 s): state 1 saves 25 J for 0.25 s
    (100 J/s), state 2 then 27 J for 0.35 s. Stage B (4 s): state 1 saves 40 J for 1 s
    (40 J/s). Slack 0.21 of T0 = 5 s allows T <= 6.05 s: A goes down first (more J per
    second), then again (5.6 s); B's step would then reach 6.6 s. A rule that ranked steps by
    the energy alone would lower B first (40 J > 25 J) and stop there."""
    a = _Block(1.0, [100.0, 60.0, 30.0])
    b = _Block(4.0, [100.0, 72.0, 50.0])
    plan = plan_stages(_setup(), {0: [a], 1: [b]}, microbatches=1, slack=0.21)
    assert plan.states == [2, 0]
    assert plan.est_iteration_s == pytest.approx(1.6 + 4.0)
    assert plan.est_energy_j == pytest.approx(48.0 + 400.0)


def test_no_slack_and_no_saving_keep_the_top_clock():
    """Slack 0: every step adds time, none is taken. A state that costs more energy (power
    falling slower than time grows) is never taken either. Steps go one state at a time."""
    a = _Block(1.0, [100.0, 60.0, 30.0])
    assert plan_stages(_setup(), {0: [a], 1: [a]}, microbatches=8, slack=0.0).states == [0, 0]
    hot = _Block(1.0, [100.0, 90.0, 80.0])  # 112.5 and 128 J per unit of work
    assert plan_stages(_setup(), {0: [hot]}, microbatches=8, slack=1.0).states == [0]
    # one P-state at a time: slack 0.3 admits state 1 (1.25 s) but not state 2 (1.6 s)
    assert plan_stages(_setup(), {0: [a]}, microbatches=1, slack=0.3).states == [1]


def test_idle_power_and_a_memory_bound_stage():
    """Two microbatches. Stage 0 computes 1 s; stage 1 is memory-bound (0.5 s of HBM
    traffic, 0.2 s of math: 0.32 s even at the lowest clock), so its clock costs no time.
    Idle chip power 20 / 15 / 10 W at the three states through a 90% regulator, counted for
    the rest of T. By hand: T0 = 1/2 x 1 + 1.5 / 2 = 1.25 s; E0 = 100 + 20/0.9 x 0.25
    + 80 x 0.5 + 20/0.9 x 0.75 J. With no slack only steps that add no time are taken:
    stage 1 goes to the lowest state (65 x 0.5 + 10/0.9 x 0.75 J), stage 0 stays."""
    setup = _setup(idle_w=(20.0, 15.0, 10.0), efficiency=0.9)
    a = _Block(1.0, [100.0, 60.0, 30.0])
    mem = _Block(0.2, [80.0, 70.0, 65.0], mem_s=0.5)
    plan = plan_stages(setup, {0: [a], 1: [mem]}, microbatches=2, slack=0.0)
    assert plan.base_busy_s == [1.0, 0.5] and plan.busy_s == [1.0, 0.5]
    assert plan.base_iteration_s == pytest.approx(1.25)
    assert plan.est_iteration_s == pytest.approx(1.25)
    stage0 = 100.0 + 20.0 / 0.9 * 0.25
    assert plan.base_energy_j == pytest.approx(stage0 + 80.0 * 0.5 + 20.0 / 0.9 * 0.75)
    assert plan.states == [0, 2]
    assert plan.est_energy_j == pytest.approx(stage0 + 65.0 * 0.5 + 10.0 / 0.9 * 0.75)


def test_a_plan_of_nothing_predicts_no_change():
    """A plan whose baseline has no time and no energy (stages with nothing to run) predicts
    neither a slowdown nor a saving: 0, not a division by zero or a made-up 100%."""
    from devices.dvfs import StagePlan

    p = StagePlan([0], [1980.0], [0.0], [0.0], 0.0, 0.0, 0.0, 0.0)
    assert (p.predicted_slowdown, p.predicted_saving) == (0.0, 0.0)
    d = p.as_dict()
    assert (d["predicted_slowdown"], d["predicted_energy_saving"]) == (0.0, 0.0)
