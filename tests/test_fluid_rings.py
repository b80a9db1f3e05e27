"""Lock-step ring phases as fluid jobs at their HBM ports' caps (``devices.fluid``, issue 12).

References: the fluid drain worked out by hand here (bytes moved at one rate up to a port
change, the rest at the other, then the latency); the flow engine itself running the same
phases through the same port changes and competing transfers (``Fabric.run_phase``); and
whole runs with the fluid jobs turned off (every overlapped TP collective through the flow
engine and its ports), which must agree to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from devices.fabric import Fabric, Phase
from devices.fluid import FluidRings
from devices.spec import LinkSpec
from topologies.graph import build_topology
from topologies.routing import Router
from twin.catalogs import catalog
from twin.kernel.engine import Engine
from workloads import collectives as C
from workloads import nccl

N_BYTES = 48e6  # a TP all-gather chunk of a large model (Simple protocol)


def _fabric(fluid: bool, record=None, lockstep="all"):
    spec = LinkSpec.model_validate(catalog("links").get("nvlink4-switch").values)
    nic = LinkSpec.model_validate(catalog("links").get("ib-ndr400-port").values)
    env = Engine()
    topo = build_topology("switched", (8, 2), spec.name, 18, nic_link=nic.name)
    fab = Fabric(env, topo, Router(topo), {spec.name: spec, nic.name: nic}, model="flow",
                 record=record, hbm_ports=True, lockstep_rings=lockstep)
    group = np.arange(8)[None, :]
    phases = nccl.tune_phases("allgather", C.collective_phases(
        "allgather", "ring", group, N_BYTES, topo), N_BYTES, 8, fab)
    if fluid:
        fab.fluid = FluidRings(fab)
        fab.fluid.allow(phases)
    return env, fab, phases, spec


def _at(env, t: float, fn) -> None:
    env.timeout_at(t).callbacks.append(lambda _e: fn())


T0 = 1e-5  # the ring starts after the clock's origin (its start enters busy seconds)


def _drive(fluid: bool, caps=(), sends=(), record=None, t0=T0, twice=False):
    """Run the phases (``twice``: the list twice over) from ``t0`` with port capacity changes
    ``caps`` ((t, devices, bytes/s)) and point-to-point ``sends`` ((t, src, dst, bytes)) on
    the side, scheduled before the ring at equal times; returns the fabric, the time the
    phases ended and the phases."""
    env, fab, phases, _spec = _fabric(fluid, record)
    if twice:
        phases = [phases[0], phases[0]]
        if fluid:
            fab.fluid.allow(phases)
    for t, devs, cap in caps:
        _at(env, t, lambda d=devs, c=cap: fab.set_port_capacity(d, c))
    for t, a, b, nb in sends:
        ph = Phase(np.array([a]), np.array([b]), np.array([nb]), 1)
        _at(env, t, lambda p=ph: fab.start([p], "send"))
    end = []

    def go():
        fab.start(phases, "tp_ring", 0).callbacks.append(lambda _e: end.append(env.now))
    _at(env, t0, go)
    env.run()
    return fab, end[0], phases


def test_only_lock_step_phases_with_bytes_are_taken():
    _env, fab, phases, _spec = _fabric(True)
    assert fab.fluid.takes(phases)
    _env, fab, phases, _spec = _fabric(False, lockstep=False)  # flow by flow, step by step
    fab.fluid = FluidRings(fab)
    fab.fluid.allow(phases)
    assert not fab.fluid.takes(phases)
    _env, fab, phases, _spec = _fabric(True)
    empty = [Phase(phases[0].src, phases[0].dst, np.zeros(8), phases[0].steps)]
    fab.fluid.allow(empty)
    assert not fab.fluid.takes(empty) and not fab.fluid.takes([phases[0]])  # (not allowed)


def test_fire_runs_the_waiters_at_once_inside_the_current_event():
    """``Engine.fire``: an event fired from a callback runs its callbacks then and there (as
    the firing timeout's own would), not after what is already queued at the instant; a
    process waiting on it resumes at the same time; it adds no event to the count."""
    env = Engine()
    ev, order = env.event(), []

    def waiter():
        yield ev
        order.append(("waiter", env.now))
    env.process(waiter())
    first = env.timeout(1.0)
    first.callbacks.append(lambda _e: (order.append(("first", env.now)), env.fire(ev)))
    env.timeout(1.0).callbacks.append(lambda _e: order.append(("queued", env.now)))
    env.run()
    # the waiting process resumed inside "first", before what was queued at the instant
    assert order == [("first", 1.0), ("waiter", 1.0), ("queued", 1.0)]
    assert ev.processed and ev.ok
    counts = {}
    for how in ("fire", "succeed"):
        env2 = Engine()
        ev2, seen = env2.event(), []
        ev2.callbacks.append(lambda _e, s=seen, e=env2: s.append(e.now))
        fire = env2.fire if how == "fire" else (lambda e: e.succeed())
        env2.timeout(2.0).callbacks.append(lambda _e, f=fire, e=ev2: f(e))
        env2.timeout(2.0).callbacks.append(lambda _e, s=seen: s.append("after"))
        env2.run()
        assert seen == ([2.0, "after"] if how == "fire" else ["after", 2.0])
        counts[how] = env2.events_processed
    assert counts["fire"] == counts["succeed"] - 1


def test_uncapped_it_is_the_closed_form():
    fab, end, phases = _drive(True)
    drain, lat, _links, _per = fab.closed_form(phases[0])
    assert end == pytest.approx(T0 + drain + lat, rel=1e-12)
    assert fab.fluid.jobs == 1 and fab.fluid.handoffs == 0
    assert fab.link_busy_s.max() == pytest.approx(drain, rel=1e-12)


def test_a_port_cap_mid_drain_moves_the_rest_at_the_new_rate():
    """Worked by hand: the ring's one lock-step flow crosses every port twice (each GPU
    sends and receives), so under a cap C on all ports it moves min(r0, C / 2) bytes/s,
    r0 its uncapped rate; capped t1 after its start it has moved r0 t1 bytes by then."""
    _f, end0, phases = _drive(True)
    _env, fab, _p, _spec = _fabric(True)
    drain, lat, _l, _b = fab.closed_form(phases[0])
    nbytes = fab._plan(phases[0])[10][0]  # one flow's bytes (every member's share)
    r0 = nbytes / drain
    t1, cap = 0.3 * drain, 0.5 * r0  # C / 2 = r0 / 4
    fab2, end, _p = _drive(True, caps=[(T0 + t1, np.arange(8), cap)])
    busy = t1 + (nbytes - r0 * t1) / (cap / 2)
    assert end == pytest.approx(T0 + busy + lat, rel=1e-12)
    assert end0 < end
    # its links were busy while it drained; the ports carried every byte sent and received
    assert fab2.link_busy_s.max() == pytest.approx(busy, rel=1e-12)
    np.testing.assert_allclose(fab2.port_bytes[:8], 2 * nbytes, rtol=1e-12)
    assert fab2.port_bytes[8:].sum() == 0
    # capped before it starts: the whole phase at C / 2
    _fab3, end3, _p = _drive(True, caps=[(0.5 * T0, np.arange(8), cap)])
    assert end3 == pytest.approx(T0 + nbytes / (cap / 2) + lat, rel=1e-12)


CAPS = [(5e-6, np.arange(8), 80e9), (2e-5, np.arange(8), 60e9), (5e-5, np.arange(4), 30e9),
        (9e-5, np.arange(8), np.inf), (1.1e-4, np.array([3]), 20e9)]
SIDE = {  # other traffic on the ports: none; mid-drain; as it starts; on a port before it
    "alone": [],
    "send_mid_drain": [(4e-5, 2, 9, 8e6)],
    "send_into_port": [(3e-5, 9, 5, 4e6), (6e-5, 12, 1, 2e6)],
    "send_at_start": [(T0, 1, 10, 3e6)],
    "send_before_start": [(0.2 * T0, 14, 6, 30e6)],
}


@pytest.mark.parametrize("twice", [False, True])
@pytest.mark.parametrize("side", list(SIDE))
def test_same_as_the_flow_engine(side, twice):
    """Port changes and competing sends: the fluid job (handed over to the engine when a
    send reaches one of its ports, or starting there when one is on them) against the
    engine alone: end time, every link's bytes and busy seconds, port and device bytes and
    message rows, to rounding."""
    rows_f, rows_e = [], []
    fab_f, end_f, _p = _drive(True, CAPS, SIDE[side], rows_f.append, twice=twice)
    fab_e, end_e, _p = _drive(False, CAPS, SIDE[side], rows_e.append, twice=twice)
    assert end_f == pytest.approx(end_e, rel=1e-12)
    for attr in ("link_bytes", "link_busy_s", "port_bytes", "bytes_sent", "bytes_received"):
        np.testing.assert_allclose(getattr(fab_f, attr), getattr(fab_e, attr), rtol=1e-12,
                                   atol=1e-6, err_msg=attr)
    assert len(rows_f) == len(rows_e)
    for a, b in zip(sorted(rows_f, key=lambda r: (r.name, r.t_start)),
                    sorted(rows_e, key=lambda r: (r.name, r.t_start)), strict=True):
        assert a[2:-1] == b[2:-1]  # name, owner, pairs, steps, bytes, hops, ends (not plan)
        assert (a.t_start, a.t_end) == pytest.approx((b.t_start, b.t_end), rel=1e-12)
    handed = 0 if side == "alone" else 1
    assert fab_f.fluid.handoffs == handed and fab_f.fluid.jobs == 1


def test_a_send_during_the_latency_meets_the_next_phase_in_the_engine():
    """Two phases back to back; a send reaches a port after the first drained, while it
    waits out its latency: nothing to hand over then; the second phase starts in the engine
    (the send is still on the port), as the engine alone gives it. A shorter send that has
    left by then lets the second phase run here."""
    _env, fab, phases, _spec = _fabric(True)
    drain, lat, _l, _b = fab.closed_form(phases[0])
    assert lat > 0
    t = T0 + drain + 0.5 * lat
    for nbytes, handed in ((64e6, 1), (1e3, 0)):
        fab_f, end_f, _p = _drive(True, sends=[(t, 9, 3, nbytes)], twice=True)
        fab_e, end_e, _p = _drive(False, sends=[(t, 9, 3, nbytes)], twice=True)
        assert fab_f.fluid.jobs == 1 and fab_f.fluid.handoffs == handed
        assert end_f == pytest.approx(end_e, rel=1e-12)
        np.testing.assert_allclose(fab_f.link_busy_s, fab_e.link_busy_s, rtol=1e-12,
                                   atol=1e-15)
        np.testing.assert_allclose(fab_f.port_bytes, fab_e.port_bytes, rtol=1e-12)
    assert end_f == pytest.approx(T0 + 2 * (drain + lat), rel=1e-12)  # (the short send)


# ----------------------------------------------------------------- whole runs
RUNS = {  # overlapped TP beside HBM ports (memory.transfer_cap): FR-FCFS device agents
    "symmetric": {"memory": {"model": "frfcfs", "per_device_draws": False}},
    "per_device": {"memory": {"model": "frfcfs"}},
    "queue_pareto": {"memory": {"model": "queue", "per_device_draws": False,
                                "service": {"dist": "pareto", "alpha": 1.8}}},
    "blocking_sends": {"memory": {"model": "frfcfs", "per_device_draws": False},
                       "overlap": {"tp_comm": True, "pipeline": False}},
}
KEYS = ("iteration_time_s", "makespan_s", "energy_j", "link_bytes", "bytes_sent",
        "hbm_port_capped_s", "hbm_port_cap_min_gbps", "hbm_slowdown_mean", "hbm_max_streams",
        "exposed_comm_fraction", "tp_comm_time_per_device_s", "memory_slowdown_mean")


@pytest.mark.parametrize("case", list(RUNS))
def test_runs_agree_with_the_flow_engine(case, monkeypatch):
    """Whole runs (2 nodes, TP 8 x PP 2 x DP 2: pipeline sends and DP rings share the TP
    groups' ports): with fluid TP jobs against every TP collective through the flow engine
    (``Executor._allow_fluid`` off), the same random draws; to rounding."""
    from tests.test_tp_closed_form import _run
    from workloads.executor import Executor

    kw = {"overlap": {"tp_comm": True}} | RUNS[case]
    fluid = _run(False, **kw)
    assert fluid["tp_fluid_collectives"] > 0 and "tp_fluid" in fluid["shortcuts_used"]
    # overlapped TP beside HBM ports has no closed form (its ports' caps change under it)
    assert fluid["tp_closed_form_collectives"] == 0
    assert fluid["tp_fluid_handoffs"] > 0  # pipeline sends and DP rings reached the ports
    assert fluid["hbm_port_capped_s"] > 0
    monkeypatch.setattr(Executor, "_allow_fluid", lambda self, parts, phases: None)
    flows = _run(False, **kw)
    assert flows["tp_fluid_collectives"] == 0 and fluid["events"] < flows["events"]
    for key in KEYS:
        assert fluid[key] == pytest.approx(flows[key], rel=1e-9), key


_FLUID_KW = {"overlap": {"tp_comm": True}, "memory": {"model": "frfcfs"}}


@pytest.mark.slow  # (32 devices in exact mode; exact mode's empty shortcut list: test_exact.py)
def test_exact_mode_takes_no_fluid_jobs():
    from tests.test_tp_closed_form import _run

    assert _run(True, **_FLUID_KW)["tp_fluid_collectives"] == 0


def test_without_ports_tp_collectives_take_the_closed_form_not_fluid_jobs():
    from tests.test_tp_closed_form import _run

    no_cap = _run(False, **_FLUID_KW | {"memory": {"model": "frfcfs", "transfer_cap": False}})
    assert no_cap["tp_fluid_collectives"] == 0 and no_cap["tp_closed_form_collectives"] > 0


def test_a_lock_step_phase_that_is_not_a_ring_counts_as_the_engine_does():
    """One GPU sending to two (equal flows, two steps: lock-step, but not every member sends
    what it receives): device and port bytes, with a cap mid-drain, against the engine."""
    out = {}
    for fluid in (True, False):
        env, fab, _p, _spec = _fabric(False)
        fan = [Phase(np.array([0, 0]), np.array([1, 2]), np.array([4e6, 4e6]), 2)]
        if fluid:
            fab.fluid = FluidRings(fab)
            fab.fluid.allow(fan)
            assert fab.fluid.takes(fan)
        _at(env, 2e-6, lambda f=fab: f.set_port_capacity(np.arange(3), 50e9))
        env.run(fab.start(fan, "fan_out"))
        out[fluid] = (env.now, fab.bytes_sent, fab.bytes_received, fab.port_bytes)
    assert out[True][0] == pytest.approx(out[False][0], rel=1e-12)
    for i in (1, 2, 3):
        np.testing.assert_allclose(out[True][i], out[False][i], rtol=1e-12)
    assert out[True][1][0] == 16e6 and out[True][2][1] == 8e6  # 2 steps x 4 MB each way
