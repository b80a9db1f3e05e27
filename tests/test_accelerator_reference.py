"""Laws of the accelerator agent's clock, jitter and empty-block handling (issue 15: the
surviving mutants of ``devices/accelerator.py``).

Each test states the rule in closed form: the jitter factors are the lognormal sequence a fresh
Generator with the same seed gives scalar by scalar; an empty block costs nothing; a disabled
throttle never lowers the clock; bubble down-clocking honours ``min_wait_us``; a block queued
behind a pending DVFS transition starts at the transition's end; DVFS stalls do no work.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from devices import accelerator as acc_mod
from devices.accelerator import Accelerator, ComputeModel
from devices.power import PowerSetup, PowerSpec
from tests.test_kernel_reference import ref_kernel
from tests.test_power_reference import _Null, device
from workloads.transformer import Block, Kernel

SMALL = Block("small", (Kernel("s", 1e6, 1e6, False),))


def _agent(spec: dict | None, s=None, **kw) -> tuple[simpy.Environment, Accelerator, _Null]:
    s = s if s is not None else device("h100-sxm")
    cm = ComputeModel(s, "bf16", s.hbm_pj_per_bit)
    env = simpy.Environment()
    rec = _Null()
    acc = Accelerator(env, 0, 1, cm, rec, power=PowerSetup(PowerSpec.model_validate(spec or {}),
                                                          cm), **kw)
    return env, acc, rec


def test_jitter_factors_are_a_fresh_generators_lognormal_draws_across_refills():
    """Block k lasts ``d * f_k`` with ``f_k`` the k-th scalar ``lognormal(-s^2/2, s)`` of a
    Generator seeded alike, also across the refill of the pre-drawn buffer; sigma < 1 jitters."""
    s = device("h100-sxm")
    sigma = 0.3
    n = acc_mod._JITTER_BLOCK + 5
    env, acc, rec = _agent({"thermal": {"enabled": False}}, s, jitter_sigma=sigma,
                           rng=np.random.default_rng(7))

    def body():
        for i in range(n):
            yield from acc.compute(SMALL, 0, i, 0, 0)

    env.process(body())
    env.run()
    d, _ = ref_kernel(s, SMALL.kernels[0], "bf16", 1.0)
    ref = np.random.default_rng(7)
    want = np.array([d * ref.lognormal(-0.5 * sigma * sigma, sigma) for _ in range(n)])
    got = np.array([r[9] - r[8] for r in rec.rows if r[3] == "compute"])
    assert len(got) == n
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_an_empty_block_takes_no_time_and_no_energy():
    """A block without kernels: zero duration, zero dynamic and HBM energy."""
    env, acc, _ = _agent({"thermal": {"enabled": False}})
    env.process(acc.compute(Block("empty", ()), 0, 0, 0, 0))
    env.run()
    st = acc.stats
    assert env.now == 0.0
    assert (st.compute_s, st.compute_j, st.memory_j, st.static_j) == (0.0, 0.0, 0.0, 0.0)
    assert acc.energy_at(0.0) == 0.0


def test_a_disabled_throttle_keeps_the_clock_above_the_limit():
    """``thermal.throttle: false``: a die above the limit runs the block at the top P-state,
    without a throttle step or a DVFS stall."""
    s = device("h100-sxm")
    env, acc, rec = _agent({"thermal": {"throttle": False}}, s)
    assert acc.thermal is not None          # the thermal model is on, only the throttle is off
    acc.temp_c = s.temp_limit_c + 5.0
    env.process(acc.compute(SMALL, 0, 0, 0, 0))
    env.run()
    assert acc.stats.throttle_steps == 0 and acc.stats.transitions == 0
    assert [r[3] for r in rec.rows] == ["compute"]
    assert acc.power_segments()[-1, 4] == 0


def _wait(env, acc, kind, length):
    acc.wait_start(kind)
    yield env.timeout(length)
    acc.wait_end(kind)


def test_bubble_downclock_only_after_a_previous_wait_of_at_least_min_wait():
    """min_wait_us = 100: the first wait (no history) down-clocks, a wait after a 50 us wait
    does not, a wait after a 200 us wait does; each down-clock costs one transition there and
    the next block one back (transitions 1 + 1, then 0, then 1)."""
    lat = 10e-6
    spec = {"thermal": {"enabled": False},
            "dvfs": {"bubble_downclock": True, "min_wait_us": 100.0,
                     "transition_latency_us": lat * 1e6}}
    env, acc, _ = _agent(spec)
    seen = []

    def body():
        yield from _wait(env, acc, "recv", 50e-6)       # no history: down-clocks
        seen.append(acc.stats.transitions)
        yield from acc.compute(SMALL, 0, 0, 0, 0)       # back up
        yield from _wait(env, acc, "recv", 200e-6)      # previous 50 us < 100 us: stays
        seen.append(acc.stats.transitions)
        yield from acc.compute(SMALL, 0, 1, 0, 0)
        acc.wait_start("recv")                          # previous 200 us >= 100 us: down
        seen.append(acc.stats.transitions)

    env.process(body())
    env.run()
    assert seen == [1, 2, 3]


def test_a_block_behind_a_pending_transition_starts_at_its_end():
    """A wait starts a down-clock transition at t = 0 (latency L = 100 us); the block arriving
    at 30 us waits for it to end at L, then for the transition back, and starts at 2 L. The
    DVFS stall (30 us .. 2 L) does no arithmetic."""
    lat = 100e-6
    spec = {"thermal": {"enabled": False},
            "dvfs": {"bubble_downclock": True, "transition_latency_us": lat * 1e6}}
    env, acc, rec = _agent(spec)

    def body():
        yield from _wait(env, acc, "recv", 30e-6)
        yield from acc.compute(SMALL, 0, 0, 0, 0)

    env.process(body())
    env.run()
    (dv,) = [r for r in rec.rows if r[3] == "dvfs"]
    (cp,) = [r for r in rec.rows if r[3] == "compute"]
    assert dv[8] == pytest.approx(30e-6, rel=1e-12)
    assert dv[9] == pytest.approx(2 * lat, rel=1e-12)
    assert cp[8] == pytest.approx(2 * lat, rel=1e-12)
    assert acc.stats.stall_s == pytest.approx(2 * lat - 30e-6, rel=1e-9)
    assert dv[10] == 0.0
    assert acc.stats.transitions == 2
