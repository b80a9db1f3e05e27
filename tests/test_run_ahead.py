"""Agents running ahead of the clock (issue 14, ``run_ahead``).

An agent whose next instructions are compute blocks and closed-form TP collectives that nothing
outside it can see or change runs them on a local clock and rejoins the SimPy clock with one
event (``Executor``'s ``run_ahead``, ``Accelerator.run_at``, ``Fabric.run_closed``,
``Engine.timeout_at``). The reference is the same model simulated step by step (one event per
block and per collective, ``twin.runner.uses_run_ahead`` patched off): every result must be the
same to the last bit, power segment by power segment, because the same floating-point
operations run in the same order per agent; only the event count differs.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import twin.runner as R
from twin.build import build
from twin.kernel.engine import Engine
from twin.kernel.records import Recorder
from twin.scenario import load_scenario
from twin.summary import summarize

_BASE = {
    "name": "run-ahead",
    "cluster": {"topology": {"kind": "switched", "shape": [8, 4], "nodes_per_leaf": 2},
                "device": "h100-sxm", "link": "nvlink4-switch", "links_per_edge": 18,
                "nic_link": "ib-ndr400-port"},
    "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 1024,
                 "global_batch": 16, "micro_batch": 1,
                 "parallelism": {"dp": 2, "tp": 8, "pp": 2}, "schedule": "interleaved",
                 "virtual_stages": 2, "iterations": 2},
    "trace": {"enabled": False},
}


def _variant(name: str) -> dict:
    d = copy.deepcopy(_BASE)
    if name == "throttled":  # a die at the limit in hot air: the throttle steps mid-run
        d["power"] = {"thermal": {"ambient_c": 45.0, "initial_c": 90.0,
                                  "throttle_interval_s": 0.01}}
    elif name == "capped":  # blocks duty-cycled down to the board cap
        d["power"] = {"cap_w": 450.0}
    elif name == "stage_clocks":  # a clock per stage, bubbles down-clocked (not TP waits)
        d["power"] = {"dvfs": {"policy": "stage_plan", "bubble_downclock": True,
                               "wait_kinds": ["recv", "dp_wait"]}}
    elif name == "jitter":  # no symmetry: TP collectives rendezvous, blocks run ahead alone
        d["simulation"] = {"compute_jitter_cov": 0.2}
    elif name == "checkpoints":  # every class meets at a checkpoint after each iteration
        d["job"] = {"checkpoint_interval_iterations": 1, "checkpoint_write_s": 0.01}
    elif name.startswith("frfcfs") or name == "queue":
        # device agents: blocks run ahead only beside no stream, taken back when one starts
        mem = ({"model": "queue", "service": {"dist": "exponential"}} if name == "queue"
               else {"model": "frfcfs"})
        d["memory"] = mem | {"per_device_draws": name != "frfcfs"}
        if name != "frfcfs":  # an agent per device: TP groups of one rank run ahead
            d["workload"] |= {"parallelism": {"dp": 16, "tp": 1, "pp": 2}, "global_batch": 64}
        if name == "frfcfs_jitter":
            d["simulation"] = {"compute_jitter_cov": 0.2}
        if name == "frfcfs_sync_sends":  # a sender waits for delivery: streams start
            d["overlap"] = {"pipeline": False}  # at the instants blocks do
    elif name == "torus":  # no closed-form TP (no nodes): compute blocks only
        d["cluster"] = {"topology": {"kind": "torus2d", "shape": [4, 8]}, "device": "h100-sxm",
                        "link": "nvlink4-switch"}
    return d


def _both(d: dict, monkeypatch) -> dict:
    model = build(load_scenario(d))
    out = {}
    for ahead in (True, False):
        with monkeypatch.context() as m:
            if not ahead:
                m.setattr(R, "uses_run_ahead", lambda scen, rec: False)
            env, fab, ex, _ = R.simulate(model, Recorder())
        out[ahead] = (summarize(model, env, fab, ex, 0.0), fab, ex)
    return out


#: Device-agent variants; two run only in `make test-slow` (`make test` keeps plain FR-FCFS,
#: jitter and the queue model within its 5 minutes).
_AGENTS = ["frfcfs", pytest.param("frfcfs_per_device", marks=pytest.mark.slow),
           "frfcfs_jitter", pytest.param("frfcfs_sync_sends", marks=pytest.mark.slow), "queue"]


@pytest.mark.parametrize("name", ["interleaved", "throttled", "capped", "stage_clocks",
                                  "jitter", "checkpoints", "torus", *_AGENTS])
def test_running_ahead_gives_the_step_by_step_run_bit_for_bit(name, monkeypatch):
    out = _both(_variant(name), monkeypatch)
    (sa, fa, xa), (ss, fs, xs) = out[True], out[False]
    assert "run_ahead" in sa["shortcuts_used"] and sa["run_ahead_ops"] > 0
    assert "run_ahead" not in ss["shortcuts_used"] and ss["run_ahead_ops"] == 0
    assert sa["events"] < ss["events"]
    if name == "throttled":
        assert ss["throttle_steps"] > 0  # the bail-out to the clock was exercised
    if name == "checkpoints":
        assert ss["checkpoints"] == 2
    if name in ("interleaved", "capped"):
        assert sa["tp_closed_form_collectives"] == ss["tp_closed_form_collectives"] > 0
    for key in ("iteration_time_s", "makespan_s", "energy_j", "energy_breakdown_j",
                "max_temperature_c", "peak_power_w", "link_bytes", "tp_comm_time_per_device_s",
                "pipeline_wait_per_device_s", "throttle_steps", "cap_stretch_s",
                "checkpoints", "checkpoint_time_s", "iteration_time_p99_s",
                "executed_flops_per_iteration", "mfu", "compute_time_per_device_s",
                "avg_compute_frequency_mhz",
                "hbm_max_streams", "hbm_slowdown_mean", "contention_slowdown_mean",
                "hbm_port_capped_s", "memory_slowdown_max"):
        if key in ss:
            assert sa[key] == ss[key], key
    np.testing.assert_array_equal(fa.bytes_sent, fs.bytes_sent)
    np.testing.assert_array_equal(fa.bytes_received, fs.bytes_received)
    np.testing.assert_array_equal(fa.link_bytes, fs.link_bytes)
    np.testing.assert_array_equal(fa.link_busy_s, fs.link_busy_s)
    for a, b in zip(xa.accelerators, xs.accelerators, strict=True):
        np.testing.assert_array_equal(a.power_segments(), b.power_segments())
    for a, b in zip(xa.stats, xs.stats, strict=True):
        assert a == b
    for a, b in zip(xa.accelerators, xs.accelerators, strict=True):  # FLOPs, energy parts
        assert ({k: v for k, v in vars(a.stats).items() if k != "source"}
                == {k: v for k, v in vars(b.stats).items() if k != "source"})


def test_nothing_runs_ahead_where_something_watches_the_devices(monkeypatch):
    d = _variant("interleaved")
    d["power"] = {"manager": {"budget_w": 20000.0}}  # reads every device's energy as it goes
    s = R.run(load_scenario(d)).summary
    assert "run_ahead" not in s["shortcuts_used"] and s["run_ahead_ops"] == 0
    d = _variant("interleaved")  # TP waits that down-clock need the clock at every TP op
    d["power"] = {"dvfs": {"bubble_downclock": True, "wait_kinds": ["tp", "recv"]}}
    s = R.run(load_scenario(d)).summary
    assert s["run_ahead_ops"] == 0 and s["tp_closed_form_collectives"] > 0
    d = _variant("frfcfs")  # an agent per device, TP groups of several: they rendezvous
    d["memory"]["per_device_draws"] = True  # at the clock, nothing to gain from running
    d["simulation"] = {"tp_group_agents": False}  # ahead of it in between
    s = R.run(load_scenario(d)).summary
    assert s["run_ahead_ops"] == 0
    d = _variant("interleaved")
    d["simulation"] = {"exact": True}
    s = R.run(load_scenario(d)).summary
    assert s["run_ahead_ops"] == 0


def test_timeout_at_fires_at_the_absolute_time_not_now_plus_the_difference():
    # pairs where now + (t - now) rounds away from t: a timeout would miss t by an ulp
    grid = [(i / 7, j * 1.37) for i in range(1, 30) for j in range(1, 30)]
    pairs = [(a, b) for a, b in grid if b > a and a + (b - a) != b]
    assert pairs
    for now, t in pairs:
        env = Engine()
        seen = []

        def proc(now=now, t=t, env=env, seen=seen):
            yield env.timeout(now)
            yield env.timeout_at(t)
            seen.append(env.now)

        env.process(proc())
        env.run()
        assert seen == [t]
    env = Engine()
    env.run(until=1.0)
    with pytest.raises(ValueError):
        env.timeout_at(0.5)


def test_at_instant_end_runs_after_every_event_of_the_instant_before_the_clock_moves():
    """``Engine.at_instant_end``: the callback sees every event of its instant processed,
    also those queued after it was registered (a zero-delay event, and one queued by such an
    event), and none of the next instant; callbacks run in registration order, may queue
    events at the instant (processed before the clock moves on) and register again; the
    last instant's callbacks run when the queue empties; none counts as an event."""
    env = Engine()
    log: list[tuple[float, str]] = []

    def note(what):
        return lambda *_a: log.append((env.now, what))

    def proc():
        yield env.timeout(1.0)
        env.at_instant_end(note("end a"))
        env.at_instant_end(again)
        env.timeout(0).callbacks.append(lambda _e: (log.append((env.now, "zero")),
                                                    env.timeout(0).callbacks.append(
                                                        note("zero of zero"))))
        env.timeout(1.0).callbacks.append(note("later"))

    def again():
        log.append((env.now, "end b"))
        env.timeout(0).callbacks.append(note("queued at the end"))
        env.at_instant_end(note("end c"))

    env.process(proc())
    env.timeout(2.0).callbacks.append(lambda _e: env.at_instant_end(note("end of run")))
    env.run()
    assert log == [(1.0, "zero"), (1.0, "zero of zero"), (1.0, "end a"), (1.0, "end b"),
                   (1.0, "queued at the end"), (1.0, "end c"), (2.0, "later"),
                   (2.0, "end of run")]
    # init, the timeout, the process end, two zero-delay, one queued at the end, two at 2 s
    assert env.events_processed == 8


@pytest.mark.parametrize("name", _AGENTS)
def test_beside_device_agents_what_runs_ahead_is_taken_back_when_a_stream_starts(
        name, monkeypatch):
    """``workloads.quiet``: with an HBM controller model every block that a stream reaches
    while its agent has run ahead is taken back and re-priced at the stream's start, so
    the device agents see the same pieces of the same blocks at the same mixes as step by
    step (their records and re-price counts), and the blocks that ran alone are booked
    at the controller's level (0, 0) in sums per run instead of one by one (rounding)."""
    out = _both(_variant(name), monkeypatch)
    (sa, _fa, xa), (ss, _fs, xs) = out[True], out[False]
    assert xa.quiet is not None and xs.quiet is None
    assert xa.quiet.rewinds > 0  # streams reached blocks run ahead
    assert sum(a.repriced for a in xs.streams) > 0  # and cut blocks in flight
    assert [a.repriced for a in xa.streams] == [a.repriced for a in xs.streams]
    assert [a.records for a in xa.streams] == [a.records for a in xs.streams]
    assert [a.max_sm_used for a in xa.streams] == [a.max_sm_used for a in xs.streams]
    for key in ("memory_slowdown_mean", "memory_contended_fraction"):
        assert sa[key] == pytest.approx(ss[key], rel=1e-12, abs=1e-15), key
    assert sa["memory_max_transfers"] == ss["memory_max_transfers"]
    assert sa["memory_slowdown_mean"] > 1.0  # contention did reach blocks


def test_latency_draws_and_fresh_batches_keep_the_agents_on_the_clock():
    """A block's latency-bound part draws a fresh queue batch even alone
    (``memory.bound: auto``): no block can be priced ahead, so nothing runs ahead."""
    d = _variant("queue")
    d["memory"]["bound"] = "auto"
    s = R.run(load_scenario(d)).summary
    assert s["run_ahead_ops"] == 0
