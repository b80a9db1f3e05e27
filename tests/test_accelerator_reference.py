"""Laws of the accelerator agent's clock, jitter and empty-block handling (issue 15: the
surviving mutants of ``devices/accelerator.py``).

Each test states the rule in closed form: the jitter factors are the lognormal sequence a fresh
Generator with the same seed gives scalar by scalar; an empty block costs nothing; a disabled
throttle never lowers the clock; bubble down-clocking honours ``min_wait_us``; a block queued
behind a pending DVFS transition starts at the transition's end; DVFS stalls do no work.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from devices.accelerator import Accelerator, ComputeModel
from devices.factors import JITTER_BLOCK
from devices.power import PowerSetup, PowerSpec
from tests.test_kernel_reference import ref_kernel
from tests.test_power_reference import _Null, device, ref_block_energy, ref_unknowns
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
    n = JITTER_BLOCK + 5
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
    the next block one back (transitions 1 + 1, then 0, then 1). The waits start 1 ms in: a
    wait's length is its end minus its start, not the clock at its end."""
    lat = 10e-6
    spec = {"thermal": {"enabled": False},
            "dvfs": {"bubble_downclock": True, "min_wait_us": 100.0,
                     "transition_latency_us": lat * 1e6}}
    env, acc, _ = _agent(spec)
    seen = []

    def body():
        yield env.timeout(1e-3)
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


# ---------------------------------------------------------------- thermal, telemetry, memory
# (issue 15, branch mut4: the survivors of the seed-1 sample of devices/accelerator.py)

NOLEAK = {"leakage_w": None, "leakage_ref_c": None, "leakage_per_k": None,
          "leakage_voltage_exponent": None}


def _rc(s) -> tuple[float, float]:
    """``(R K/W, tau s)`` of the lumped RC node from the catalog fields."""
    return s.thermal_r_k_per_w, s.thermal_r_k_per_w * s.thermal_c_j_per_k


def _rc_step(temp0: float, ambient: float, r: float, tau: float, watts: float, d: float
             ) -> float:
    """``T(d)`` of ``C dT/dt = P - (T - T_amb) / R`` from ``T(0) = temp0`` at constant ``P``:
    ``T = T_ss + (T0 - T_ss) exp(-d / tau)``, ``T_ss = T_amb + R P``, ``tau = R C``."""
    ss = ambient + r * watts
    return ss + (temp0 - ss) * math.exp(-d / tau)


def _heat_block(flops: float) -> Block:
    """One dense bf16 GEMM kernel of ``flops`` with little HBM traffic (a single segment of
    constant power just below the TDP, so the default cap does not stretch it)."""
    n = 8192
    return Block("heat", (Kernel("g", flops, 1e6, True, (1.0, n, n), depth=n),))


def test_an_ambient_change_while_idle_applies_from_that_instant():
    """Idle die (no leakage: constant chip power P_base), T0 = 40 C at 25 C inlet air; the inlet
    goes to 45 C at 0.3 s, and, 0.2 s into a block that starts at 0.8 s, back to 25 C. The RC
    closed form over [0, 0.3] at 25 C, [0.3, 0.8] at 45 C, the block at 45 C (a running
    block keeps the ambient it started with) and the idle stretch after it at 25 C gives the
    temperatures at 0.8 s and at the end."""
    s = device("h100-sxm", **NOLEAK)
    env, acc, _ = _agent({"thermal": {"initial_c": 40.0, "ambient_c": 25.0}}, s)
    base, dyn = ref_unknowns(s, acc.reg)
    r, tau = _rc(s)
    blk = _heat_block(2.0e14)
    seen = {}

    def body():
        yield env.timeout(0.3)
        acc.set_ambient(45.0)
        yield env.timeout(0.5)
        acc.idle_until(env.now)
        seen["t08"] = acc.temp_c
        yield from acc.compute(blk, 0, 0, 0, 0)
        seen["block_end"] = env.now
        yield env.timeout(0.5)
        acc.idle_until(env.now)

    def change():
        yield env.timeout(1.0)
        acc.set_ambient(25.0)

    env.process(body())
    env.process(change())
    env.run()
    t03 = _rc_step(40.0, 25.0, r, tau, base, 0.3)
    t08 = _rc_step(t03, 45.0, r, tau, base, 0.5)
    assert seen["t08"] == pytest.approx(t08, rel=1e-12)
    d, e_dyn, e_hbm = ref_block_energy(s, blk, dyn)
    assert seen["block_end"] - 0.8 == pytest.approx(d, rel=1e-9)
    assert d > 0.2                              # the change at 1.0 s falls inside the block
    t_blk = _rc_step(t08, 45.0, r, tau, (e_dyn + e_hbm) / d + base, d)
    want = _rc_step(t_blk, 25.0, r, tau, base, 0.5)
    assert acc.temp_c == pytest.approx(want, rel=1e-9)
    assert acc.ambient_c == 25.0


def test_max_temperature_is_the_peak_of_the_rc_trajectory():
    """From 40 C at 25 C inlet air a dense GEMM heats the die (chip power E/d + P_base, no
    leakage), then 5 s idle cool it: the run's maximum is the closed-form temperature at the
    block's end, not the final one nor the initial one."""
    s = device("h100-sxm", **NOLEAK)
    env, acc, _ = _agent({"thermal": {"initial_c": 40.0}}, s)
    base, dyn = ref_unknowns(s, acc.reg)
    r, tau = _rc(s)
    blk = _heat_block(5.0e15)

    def body():
        yield from acc.compute(blk, 0, 0, 0, 0)
        yield env.timeout(5.0)
        acc.idle_until(env.now)

    env.process(body())
    env.run()
    d, e_dyn, e_hbm = ref_block_energy(s, blk, dyn)
    peak = _rc_step(40.0, 25.0, r, tau, (e_dyn + e_hbm) / d + base, d)
    end = _rc_step(peak, 25.0, r, tau, base, 5.0)
    assert peak > 40.0 + 0.5 and end < peak - 0.5   # it did heat up, then cool down
    assert acc.stats.max_temp_c == pytest.approx(peak, rel=1e-12)
    assert acc.temp_c == pytest.approx(end, rel=1e-12)


def test_temperature_alerts_rearm_only_below_limit_minus_hysteresis():
    """Alerts (``thermal.hysteresis_k`` = 3 K, limit 83 C, no throttle, no leakage, 35 C
    inlet air): a hot GEMM crosses the limit (alert 1, at the RC crossing time); 2 s idle cool
    the die to between 80 and 83 C, so the next hot block crossing 83 C again raises none;
    after cooling below 80 C the next crossing raises alert 2. Times and temperatures from the
    closed form ``t = tau ln((T0 - T_ss) / (T_lim - T_ss))``."""
    s = device("h100-sxm", **NOLEAK)
    amb = 35.0
    env, acc, _ = _agent({"thermal": {"initial_c": 82.5, "ambient_c": amb, "throttle": False}},
                         s)
    base, dyn = ref_unknowns(s, acc.reg)
    r, tau = _rc(s)
    lim, hyst = s.temp_limit_c, 3.0
    hot = _heat_block(1.0e16)
    d, e_dyn, e_hbm = ref_block_energy(s, hot, dyn)
    p_hot = (e_dyn + e_hbm) / d + base
    plan = [("hot", d), ("idle", 2.0), ("hot", d), ("idle", 15.0)] + [("hot", d)] * 6

    def body():
        for kind, length in plan:
            if kind == "hot":
                yield from acc.compute(hot, 0, 0, 0, 0)
            else:
                yield env.timeout(length)
                acc.idle_until(env.now)

    env.process(body())
    env.run()
    # reference: walk the plan, arming as the rule says
    temp, t, armed, alerts, path = 82.5, 0.0, True, [], []
    for kind, length in plan:
        p = p_hot if kind == "hot" else base
        new = _rc_step(temp, amb, r, tau, p, length)
        if armed and new >= lim:
            ss = amb + r * p
            alerts.append(t + tau * math.log((temp - ss) / (lim - ss)))
            armed = False
        elif new < lim - hyst:
            armed = True
        temp, t = new, t + length
        path.append(new)
    # premises of the plan: over the limit, between limit - hysteresis and the limit, over
    # again, below limit - hysteresis, and over the limit again at the end
    assert path[0] > lim and lim - hyst < path[1] < lim and path[2] > lim
    assert path[3] < lim - hyst and path[-1] > lim
    assert len(alerts) == 2
    got = [row[0] for row in acc.power.alert_rows]
    assert got == pytest.approx(alerts, rel=1e-9)
    assert [row[1] for row in acc.power.alert_rows] == ["temperature"] * 2


def test_the_throttle_steps_at_most_once_per_interval():
    """Die 5 K above the limit (it cools by < 0.1 K/s), ``throttle_interval_s`` = 1: the first
    block steps the clock down one P-state (check at t = 0, next check due at 1 s); 20 more
    blocks and a block at 0.9 s do not; a block at 1.01 s steps once more."""
    s = device("h100-sxm")
    env, acc, _ = _agent({"thermal": {"throttle_interval_s": 1.0,
                                      "initial_c": s.temp_limit_c + 5.0}}, s)
    steps = []

    def body():
        for i in range(21):
            yield from acc.compute(SMALL, 0, i, 0, 0)
            steps.append(acc.stats.throttle_steps)
        yield env.timeout(0.9 - env.now)
        yield from acc.compute(SMALL, 0, 21, 0, 0)
        steps.append(acc.stats.throttle_steps)
        yield env.timeout(1.01 - env.now)
        yield from acc.compute(SMALL, 0, 22, 0, 0)
        steps.append(acc.stats.throttle_steps)

    env.process(body())
    env.run()
    assert acc.temp_c > s.temp_limit_c          # still above the limit at the last check
    assert steps == [1] * 22 + [2]
    seg = acc.power_segments()
    names = acc.state_names()
    ps = [int(row[4]) for row in seg if names[int(row[3])] == "small"]
    assert ps == [1] * 22 + [2]


def test_power_segments_keep_every_segment_when_read_mid_run():
    """Many blocks back to back, the segments read after the first part and again at the end:
    one segment per block, contiguous, the first reading unchanged by what came later, and
    their energy adds up to the device's energy."""
    n, first = 5000, 1234
    env, acc, _ = _agent({"thermal": {"enabled": False}})
    mid = {}

    def body():
        for i in range(n):
            if i == first:
                mid["seg"] = acc.power_segments()
                mid["t"] = env.now
            yield from acc.compute(SMALL, 0, i, 0, 0)

    env.process(body())
    env.run()
    seg = acc.power_segments()
    assert len(mid["seg"]) == first and len(seg) == n
    np.testing.assert_array_equal(mid["seg"], seg[:first])
    assert mid["seg"][-1, 1] == mid["t"]
    np.testing.assert_array_equal(seg[1:, 0], seg[:-1, 1])
    assert seg[0, 0] == 0.0 and seg[-1, 1] == env.now
    assert float(np.sum(seg[:, 2] * (seg[:, 1] - seg[:, 0]))) == pytest.approx(
        acc.energy_at(env.now), rel=1e-12)


def test_a_memory_factor_multiplies_the_memory_time():
    """``mem_scale`` 4.5 (e.g. a degraded HBM): the HBM-bound block lasts
    ``max(t_math, 4.5 t_mem) + overhead``, the roofline reference at memory factor 4.5."""
    s = device("h100-sxm")
    env, acc, _ = _agent({"thermal": {"enabled": False}}, s)
    acc.mem_scale = 4.5
    env.process(acc.compute(SMALL, 0, 0, 0, 0))
    env.run()
    want, t_math = ref_kernel(s, SMALL.kernels[0], "bf16", 1.0, 4.5)
    assert want - s.kernel_overhead_us * 1e-6 > 2 * t_math    # memory-bound at this factor
    assert env.now == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("units", [132, None])
def test_communication_energy_is_hbm_bytes_plus_the_sm_share_of_dynamic_power(units):
    """A communication kernel of ``b`` HBM bytes on ``c`` of the device's ``U`` SMs at
    activity ``a`` for ``d`` seconds: ``E_mem = 8 b pJ/bit``, ``E_dyn = d (c / U) a P_dyn``
    (``c`` capped at ``U``); a device whose SM count is unknown draws only the HBM part."""
    s = device("h100-sxm", compute_units=units)
    _env, acc, _ = _agent({"thermal": {"enabled": False}}, s)
    _, dyn = ref_unknowns(s, acc.reg)
    d, b = 2e-3, 5e8
    acc.communication(1.0, 1.0 + d, b, 24, 0.5)
    acc.communication(2.0, 2.0 + d, 0.0, 500, 1.0)           # more SMs than the device has
    e_mem = b * 8.0 * s.hbm_pj_per_bit * 1e-12
    e_dyn = (d * 24 / units * 0.5 * dyn + d * 1.0 * dyn) if units else 0.0
    st = acc.stats
    assert st.memory_j == pytest.approx(e_mem, rel=1e-12)
    assert st.compute_j == pytest.approx(e_dyn, rel=1e-9, abs=1e-15)
    assert st.comm_j == pytest.approx(e_mem + e_dyn, rel=1e-9)
    comm = [row for row in acc.power_segments() if acc.state_names()[int(row[3])] == "comm"]
    want_w = [(e_mem + (d * 24 / units * 0.5 * dyn if units else 0.0)) / d]
    if units:
        want_w.append(dyn)
    assert [row[2] for row in comm] == pytest.approx(want_w, rel=1e-9)


def test_the_throttle_releases_only_below_limit_minus_hysteresis():
    """Throttle (limit 83 C, hysteresis 3 K, interval 1 s): a die just above the limit steps
    down one P-state at the first block; idle cooling to between 80 and 83 C keeps it there at
    the next check; below 80 C the next check steps back up to the top P-state."""
    s = device("h100-sxm")
    lim = s.temp_limit_c
    env, acc, _ = _agent({"thermal": {"throttle_interval_s": 1.0, "initial_c": lim + 0.05}}, s)
    seen = []

    def body():
        for t in (0.0, 1.5, 8.0):
            yield env.timeout(t - env.now)
            acc.idle_until(env.now)
            temp = acc.temp_c
            yield from acc.compute(SMALL, 0, 0, 0, 0)
            seen.append((temp, acc.thermal_ps, int(acc.power_segments()[-1, 4])))

    env.process(body())
    env.run()
    (t0, th0, ps0), (t1, th1, ps1), (t2, th2, ps2) = seen
    assert t0 >= lim and lim - 3.0 < t1 < lim and t2 < lim - 3.0   # premises
    assert (th0, ps0) == (1, 1)
    assert (th1, ps1) == (1, 1)
    assert (th2, ps2) == (0, 0)


@pytest.mark.parametrize("cov", [0.0, 0.05, 0.3, 1.0])
def test_jitter_sigma_gives_the_lognormal_coefficient_of_variation(cov):
    """A lognormal of sigma ``s`` has ``CoV^2 = exp(s^2) - 1``: the sigma for a requested CoV
    inverts that (0 for no jitter)."""
    s = Accelerator.sigma_for_cov(cov)
    assert math.sqrt(math.expm1(s * s)) == pytest.approx(cov, rel=1e-12, abs=1e-15)


def test_communication_energy_with_one_data_parallel_rank():
    """dp 1: the gradient buckets' all-reduces are groups of one rank, with no phases: they
    book nothing (the run died in np.concatenate of no phases before), while the TP
    collectives' HBM bytes and SMs still add energy."""
    from tests.test_exact import CASES, _scenario
    from twin.runner import run
    from twin.scenario import load_scenario

    d = _scenario(False, **CASES["tp8_pp2"])
    base = run(load_scenario(d)).summary
    d["power"] = {"communication_energy": True}
    s = run(load_scenario(d)).summary
    assert s["completed"] and s["iteration_time_s"] == base["iteration_time_s"]
    assert s["energy_j"] > base["energy_j"]


def test_a_tp_group_agent_keeps_its_slowest_members_clock():
    """One agent for a TP group of 4 (``member_rngs``) against the members' own clocks kept
    one by one (plain loop): member j draws its factors from its own generator, as its own
    agent would; it runs each block from its own clock; at a sync every member waits for the
    last. The agent's clock after every block is the latest member clock, across the refill
    of the pre-drawn factors, and each block is booked for the members' mean busy time."""
    s = device("h100-sxm")
    sigma, members = 0.4, 4
    n = JITTER_BLOCK + 7
    syncs = {3, 4, 10, 500, JITTER_BLOCK}  # sync before these blocks
    env, acc, rec = _agent({"thermal": {"enabled": False}}, s, jitter_sigma=sigma,
                           rng=np.random.default_rng(99),
                           member_rngs=[np.random.default_rng(10 + j) for j in range(members)])
    ends = []

    def body():
        for i in range(n):
            if i in syncs:
                acc.sync()
            yield from acc.compute(SMALL, 0, i, 0, 0)
            ends.append(env.now)

    env.process(body())
    env.run()
    d, _ = ref_kernel(s, SMALL.kernels[0], "bf16", 1.0)
    gens = [np.random.default_rng(10 + j) for j in range(members)]
    clock = [0.0] * members
    want_end, want_busy = [], []
    for i in range(n):
        if i in syncs:
            clock = [max(clock)] * members
        durs = [d * g.lognormal(-0.5 * sigma * sigma, sigma) for g in gens]
        clock = [c + x for c, x in zip(clock, durs, strict=True)]
        want_end.append(max(clock))
        want_busy.append(sum(durs) / members)
    np.testing.assert_allclose(ends, want_end, rtol=1e-9)
    got_busy = [r[9] - r[8] for r in rec.rows if r[3] == "compute"]
    np.testing.assert_allclose(got_busy, want_busy, rtol=1e-9)
    assert acc.stats.compute_s == pytest.approx(sum(want_busy), rel=1e-9)


@pytest.mark.parametrize("members", [0, 4])
@pytest.mark.parametrize("drawn", [0, 1, JITTER_BLOCK - 1, JITTER_BLOCK])
def test_a_restored_agent_draws_the_factors_it_drew_after_its_checkpoint(members, drawn):
    """``restore`` takes an agent back to a ``checkpoint`` and the blocks it then runs draw
    the same factors as the first time (``workloads.optimistic`` takes runs back and runs
    them again), also where the checkpoint fell on a used-up buffer of pre-drawn factors
    (``drawn`` a multiple of the block) and the first run drew the next buffer: the blocks
    after the restore end where those of an agent that never went back end."""
    s = device("h100-sxm")
    ends = {}
    for back in (False, True):
        _env, acc, _ = _agent(
            {"thermal": {"enabled": False}}, s, jitter_sigma=0.3, rng=np.random.default_rng(5),
            member_rngs=[np.random.default_rng(20 + j) for j in range(members)] or None)
        t = 0.0
        for i in range(drawn):
            t = acc.run_at(SMALL, t, 0, i, 0, 0)
        acc.sync()
        if back:
            cp = acc.checkpoint()
            for i in range(3):
                acc.run_at(SMALL, t + i, 0, i, 0, 0)
            acc.restore(cp)
        ends[back] = [acc.run_at(SMALL, t, 0, 0, 0, 0) - t for _ in range(3)]
    assert ends[True] == ends[False]
