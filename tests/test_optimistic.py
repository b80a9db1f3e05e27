"""Optimistic TP collectives (``workloads.optimistic``, ``simulation.optimistic_tp``) against
the flow engine they stand in for.

The reference is the same run with ``optimistic_tp: false``: every TP collective that is not
statically isolated goes to the flow engine (``twin.kernel.flows``) as a lock-step transfer,
which shares nothing with the optimistic code. Taking a run back must leave no trace, so the
two runs agree on iteration time, energy, and every link and device counter, to floating-point
rounding; and the pieces the mechanism is made of are checked alone: a partly delivered
transfer drains in the time left (closed form), an accelerator restored to a checkpoint runs
the same blocks again with the same draws and the same energy.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from tests.test_accelerator_reference import SMALL, _agent
from tests.test_exact import CASES, _scenario
from tests.test_power_reference import device
from twin.build import build
from twin.kernel.flows import FlowNetwork
from twin.runner import simulate_untraced
from twin.scenario import load_scenario
from twin.summary import summarize
from workloads import optimistic


def _run(case: str, opt: bool, monkeypatch=None, workload: dict | None = None, **sim):
    d = _scenario(False, **CASES[case] | (workload or {}))
    d["simulation"].update(compute_jitter_cov=0.05, optimistic_tp=opt, **sim)
    model = build(load_scenario(d))
    env, fabric, ex, _ = simulate_untraced(model)
    return summarize(model, env, fabric, ex, 0.0), fabric


@pytest.mark.parametrize("case", ["1f1b", "tp8_pp2", "interleaved"])
def test_optimistic_tp_collectives_are_the_flow_engine_to_rounding(case, monkeypatch):
    """Jittered runs whose TP rings share links with pipeline sends (not statically
    isolated): with and without optimistic collectives, the same iteration time, energy,
    makespan, bytes and busy time per link and bytes per device (1e-9), with runs taken back
    (see the next test for both kinds), and fewer events."""
    kinds = {"in flight": 0, "not started": 0}
    real = optimistic.Rewind.__init__

    def spy(self, index, at=float("nan"), event=None, **kw):
        kinds["in flight" if event is not None else "not started"] += 1
        real(self, index, at, event, **kw)

    monkeypatch.setattr(optimistic.Rewind, "__init__", spy)
    on, fab_on = _run(case, True)
    off, fab_off = _run(case, False)
    assert "tp_optimistic" in on["shortcuts_used"]
    assert "tp_optimistic" not in off["shortcuts_used"]
    assert on["tp_optimistic_collectives"] > 0 and off["tp_optimistic_collectives"] == 0
    assert on["tp_optimistic_rewinds"] == sum(kinds.values()) > 0
    assert on["events"] < off["events"] / 2
    # every TP collective is either run ahead (and stands) or a lock-step flow-engine transfer
    # (the rest of one taken back in flight included); without, all of them are transfers
    assert (on["tp_optimistic_collectives"] + on["lockstep_ring_transfers"]
            == off["lockstep_ring_transfers"])
    for key in ("iteration_time_s", "energy_j", "makespan_s", "router_energy_j",
                "tp_comm_time_per_device_s"):
        assert on[key] == pytest.approx(off[key], rel=1e-9), key
    for arr in ("link_bytes", "link_busy_s", "bytes_sent", "bytes_received"):
        np.testing.assert_allclose(getattr(fab_on, arr), getattr(fab_off, arr), rtol=1e-9,
                                   atol=1e-6, err_msg=arr)


def test_runs_are_taken_back_both_in_flight_and_before_a_collective_starts(monkeypatch):
    """Across the cases of the previous test, runs are taken back while a collective was in
    flight (its rest goes to the flow engine) and before the first reserved collective
    started (the agent goes on at its start with the clock)."""
    seen = []
    real = optimistic.Rewind.__init__

    def spy(self, index, at=float("nan"), event=None, **kw):
        seen.append(event is None)
        real(self, index, at, event, **kw)

    monkeypatch.setattr(optimistic.Rewind, "__init__", spy)
    for case in ("1f1b", "tp8_pp2", "interleaved"):
        _run(case, True)
    assert any(seen) and not all(seen)


def test_optimistic_collectives_stay_off_in_exact_mode():
    d = _scenario(True, **CASES["1f1b"])
    d["simulation"]["compute_jitter_cov"] = 0.05
    model = build(load_scenario(d))
    s = summarize(model, *simulate_untraced(model)[:3], 0.0)
    assert s["tp_optimistic_collectives"] == 0 and "tp_optimistic" not in s["shortcuts_used"]


def test_only_lock_step_phases_run_optimistically():
    """A collective is reserved, costed and resumed as one lock-step flow
    (``Fabric.start_partial``). With sequence parallelism a TP group of two ranks all-gathers
    and reduce-scatters in one exchange, a one-step phase, which is never lock-step
    (``devices.phase.lockstep_ok``: rounds of a ring); so no TP collective runs
    optimistically, although the run is otherwise eligible (jitter, a torus whose pipeline
    sends cross the TP rings, as in the runs above where they do)."""
    s, _fab = _run("1f1b", True, workload={"sequence_parallel": True})
    assert s["run_ahead_ops"] > 0
    assert s["tp_optimistic_collectives"] == 0 and s["tp_optimistic_rewinds"] == 0


def test_a_partly_delivered_transfer_drains_in_the_time_left():
    """A transfer of 40 B over links of 4 B/s that ran alone for 3 s outside the engine
    (``done_fraction`` 12/40) ends 28 / 4 + latency after it joins; its links carry all 40 B
    and were busy 3 + 7 s; a second transfer joining at the same instant on one of its links
    splits the rest max-min fairly (closed form: both at 2 B/s until the 8 B one ends)."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.full(3, 4.0))
    tr = net.transfer([[0, 1]], [40.0], latency=0.5, done_fraction=12.0 / 40.0, busy_s=3.0)
    ends = {}
    tr.on_done.append(lambda t: ends.setdefault("a", env.now))
    env.run()
    assert ends["a"] == pytest.approx(28.0 / 4.0 + 0.5)
    assert net.link_bytes[[0, 1]] == pytest.approx([40.0, 40.0])
    assert net.link_busy[[0, 1]] == pytest.approx([10.0, 10.0])

    env = simpy.Environment()
    net = FlowNetwork(env, np.full(3, 4.0))
    a = net.transfer([[0, 1]], [40.0], done_fraction=0.5, busy_s=5.0)
    b = net.transfer([[1, 2]], [8.0])
    for name, t in (("a", a), ("b", b)):
        t.on_done.append(lambda _t, n=name: ends.__setitem__(n, env.now))
    env.run()
    # both at 2 B/s: b's 8 B end at 4 s, a has 20 - 8 = 12 B left at 4 B/s: 3 s more
    assert ends["b"] == pytest.approx(4.0)
    assert ends["a"] == pytest.approx(7.0)


def test_join_hook_sees_every_transfer_before_its_rates_change():
    """``before_join`` is called with each joining transfer while the engine still holds the
    rates from before it (here: the first transfer alone, at full link speed)."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.full(2, 4.0))
    first = net.transfer([[0]], [40.0])
    seen = []
    net.before_join = lambda tr: seen.append((tr.id, net.rates()[first.id].tolist()))
    second = net.transfer([[0, 1]], [8.0])
    assert seen == [(second.id, [4.0])]
    assert net.rates()[first.id].tolist() == [2.0]


def test_a_restored_accelerator_runs_the_same_blocks_again_the_same_way():
    """Blocks run ahead (``run_at``) after a checkpoint, then the checkpoint restored and the
    same blocks run again: the same ends, energy, stats and power segments as an agent that
    ran them once (the jitter factors drawn again are the same), for a one-rank agent and a
    TP-group agent whose members lag behind its clock at the checkpoint."""
    s = device("h100-sxm")
    for members in (None, 4):
        kw = {"jitter_sigma": 0.3, "rng": np.random.default_rng(5)}
        if members:
            kw["member_rngs"] = [np.random.default_rng(20 + j) for j in range(members)]
        runs = []
        for rewind in (False, True):
            for g in kw.get("member_rngs", []):
                g.bit_generator.state = np.random.default_rng(
                    20 + kw["member_rngs"].index(g)).bit_generator.state
            kw["rng"] = np.random.default_rng(5)
            _env, acc, _rec = _agent({"thermal": {"enabled": False}}, s, **kw)
            t = acc.run_at(SMALL, 0.0, 0, 0, 0, 0)
            t = acc.run_at(SMALL, t + 1e-6, 0, 1, 0, 0)  # a gap: idle accounting
            cp = acc.checkpoint()
            if rewind:
                u = t
                for mb in range(2, 40):
                    u = acc.run_at(SMALL, u, 0, mb, 0, 0)
                acc.sync()
                acc.restore(cp)
            ends = []
            for mb in range(2, 40):
                t = acc.run_at(SMALL, t, 0, mb, 0, 0)
                ends.append(t)
            runs.append((ends, acc.energy_j, dict(vars(acc.stats)), acc.power_segments().copy()))
        (e0, j0, st0, seg0), (e1, j1, st1, seg1) = runs
        assert e0 == e1 and j0 == j1
        assert {k: v for k, v in st0.items() if k != "source"} == {
            k: v for k, v in st1.items() if k != "source"}
        np.testing.assert_array_equal(seg0, seg1)


def test_tp_groups_whose_links_other_tp_groups_use_stay_in_the_flow_engine():
    """``spread`` placement puts TP peers far apart, so the groups' rings cross each other's
    links: no group is exclusive, none runs ahead, and the run is the flow engine's."""
    d = _scenario(False, placement="spread", **CASES["1f1b"])
    d["simulation"]["compute_jitter_cov"] = 0.05
    runs = {}
    for opt in (True, False):
        d["simulation"]["optimistic_tp"] = opt
        model = build(load_scenario(d))
        runs[opt] = summarize(model, *simulate_untraced(model)[:3], 0.0)
    on, off = runs[True], runs[False]
    assert on["tp_optimistic_collectives"] == 0 and on["lockstep_ring_transfers"] > 0
    assert on["iteration_time_s"] == off["iteration_time_s"]
    assert on["energy_j"] == off["energy_j"]


def test_a_message_sink_keeps_collectives_off_the_optimistic_path():
    """Message rows cannot be taken back: with a message sink (even beside the base
    Recorder, where agents may run ahead) no TP collective is run optimistically, and every
    TP message of the run is recorded once, as the flow engine sends it; the times are the
    optimistic run's to rounding."""
    from twin.kernel.records import Recorder
    from twin.runner import simulate

    d = _scenario(False, **CASES["1f1b"])
    d["simulation"].update(compute_jitter_cov=0.05, optimistic_tp=True)
    model = build(load_scenario(d))
    rows: list = []
    env, fabric, ex, _ = simulate(model, Recorder(), message_sink=rows.append)
    s = summarize(model, env, fabric, ex, 0.0)
    ref, _fab = _run("1f1b", True)
    assert ref["tp_optimistic_collectives"] > 0
    assert s["tp_optimistic_collectives"] == 0
    assert any(str(r.name).startswith("tp_") for r in rows)
    assert s["iteration_time_s"] == pytest.approx(ref["iteration_time_s"], rel=1e-9)
