"""Issue 12: transfers pay for HBM contention too (``memory.transfer_cap``).

A device's network flows cross a virtual HBM port in the flow engine whose capacity is the
bandwidth the memory controller gives DMA beside the running compute at the current mix.
Expected values come from outside the code under test: the max-min closed form of two flows
into one port, derived here; the FR-FCFS engine (``devices.hbm.effective_bandwidth``) run
standalone on streams built here from catalog numbers with the model's random numbers; the
first level of progressive filling (``min over links of capacity / flows``) for the "never
faster" property; the PCIe copy time ``bytes / min(port, cap)``.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from devices.fabric import Fabric, Phase
from devices.hbm import effective_bandwidth
from devices.interference import DeviceStreams
from devices.memory import build_memory_model
from devices.pcie import PcieFabric, PcieSpec
from tests.test_contention_streams import standalone_streams
from twin.build import build
from twin.kernel.engine import Engine
from twin.kernel.errors import ScenarioError
from twin.kernel.flows import FlowNetwork
from twin.scenario import load_scenario
from workloads import collectives

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------- engine: the closed form
def test_two_flows_into_one_port_get_the_max_min_share():
    """Flows A->C (link cap ``a``) and B->C (link cap ``b``) both cross C's port of capacity
    ``P``. Max-min: if ``a < P / 2`` A is held by its link and B gets the rest,
    ``min(b, P - a)``; otherwise each gets ``P / 2`` (``b >= P / 2``). A capacity change
    mid-transfer re-shares at once: bytes done before it at the old rates, after it at the
    new ones."""
    for a, b, cap in [(10.0, 100.0, 30.0), (40.0, 100.0, 30.0), (10.0, 12.0, 30.0)]:
        env = simpy.Environment()
        net = FlowNetwork(env, np.array([a, b, np.inf]),
                          variable=np.array([False, False, True]))
        net.set_capacity([2], cap)
        size = 600.0
        tr = net.transfer([[0, 2], [1, 2]], [size, size])
        ra = a if a < cap / 2 else cap / 2
        rb = min(b, cap - ra)
        got = net.rates()[tr.id]
        assert got == pytest.approx([ra, rb], rel=1e-12)
        # halve the port at t = tau: rates follow the closed form at the new capacity
        tau = 0.5 * size / max(ra, rb)
        env.run(until=tau)
        cap2 = cap / 2
        net.set_capacity([2], cap2)
        ra2 = a if a < cap2 / 2 else cap2 / 2
        rb2 = min(b, cap2 - ra2)
        assert net.rates()[tr.id] == pytest.approx([ra2, rb2], rel=1e-12)
        env.run(until=tr.done)
        # the flow that finishes first frees the port for the other: integrate by hand
        left = [size - ra * tau, size - rb * tau]
        t_first = min(left[0] / ra2, left[1] / rb2)
        first = int(np.argmin([left[0] / ra2, left[1] / rb2]))
        other = 1 - first
        rest = left[other] - (ra2, rb2)[other] * t_first
        alone = min((a, b)[other], cap2)
        assert env.now == pytest.approx(tau + t_first + rest / alone, rel=1e-9)


def test_a_cached_allocation_follows_the_port_capacity():
    """The same route pattern (one ``key``) alone at port capacity ``P`` and again at ``P /
    4``: max-min rate ``min(link, P)`` each time, so the allocation cached for the pattern
    must not be reused across capacities; a change while it runs re-shares at once."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([8.0, np.inf]), variable=np.array([False, True]))
    for cap in (6.0, 1.5, 6.0):
        net.set_capacity([1], cap)
        tr = net.transfer([[0, 1]], [12.0], key="p2p")
        assert net.rates()[tr.id] == pytest.approx([min(8.0, cap)], rel=1e-12)
        t0 = env.now
        env.run(until=tr.done)
        assert env.now - t0 == pytest.approx(12.0 / min(8.0, cap), rel=1e-12)
    tr = net.transfer([[0, 1]], [12.0], key="p2p")
    t0 = env.now
    env.run(until=t0 + 1.0)
    net.set_capacity([1], 3.0)  # 6 bytes done at 6 B/s, the other 6 at 3 B/s
    assert net.rates()[tr.id] == pytest.approx([3.0], rel=1e-12)
    net.set_capacity([1], 3.0)  # no change: nothing to do
    env.run(until=tr.done)
    assert env.now - t0 == pytest.approx(1.0 + 2.0, rel=1e-12)


def test_set_capacity_refuses_fixed_links_and_non_positive_capacity():
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([1.0, np.inf]), variable=np.array([False, True]))
    with pytest.raises(ValueError, match="variable"):
        net.set_capacity([0], 2.0)
    with pytest.raises(ValueError, match="> 0"):
        net.set_capacity([1], 0.0)
    net.set_capacity([1], 0.25)  # any positive capacity, however small
    tr = net.transfer([[0, 1]], [1.0])
    assert net.rates()[tr.id] == pytest.approx([0.25], rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_port_caps_never_speed_up_a_transfer(seed):
    """A collective's flows all carry the same bytes, so the transfer ends when its slowest
    flow does; the slowest rate of a max-min allocation is progressive filling's first level,
    ``min over links (capacity / flows on it)``, which a finite port (one more link, or a
    smaller capacity) can only lower. Random networks and random port capacities: the
    transfer's time with the ports is never shorter than without, and equals the closed form
    ``size / first level`` as long as no flow finishes early."""
    g = np.random.default_rng(seed)
    n_links, n_dev = 12, 6
    link_cap = g.uniform(1.0, 10.0, n_links)
    routes, ported = [], []
    for _ in range(8):
        a, b = g.choice(n_dev, 2, replace=False)
        r = g.choice(n_links, int(g.integers(1, 4)), replace=False).tolist()
        routes.append(r)
        ported.append([*r, n_links + int(a), n_links + int(b)])
    port_cap = np.where(g.random(n_dev) < 0.5, g.uniform(1.0, 15.0, n_dev), np.inf)
    times = []
    for caps, rts in [(link_cap, routes), (np.concatenate([link_cap, port_cap]), ported)]:
        env = simpy.Environment()
        tr = FlowNetwork(env, caps).transfer(rts, [100.0] * len(rts), steps=4)
        env.run(until=tr.done)
        cnt = np.bincount(np.concatenate(rts), minlength=len(caps))
        first = min(caps[i] / cnt[i] for i in range(len(caps)) if cnt[i])
        assert env.now == pytest.approx(100.0 / first, rel=1e-9)
        times.append(env.now)
    assert times[1] >= times[0] * (1 - 1e-12)


# ----------------------------------------------------------------- the fabric's ports
def _ring4():
    scen = load_scenario(ROOT / "scenarios" / "quickstart.yaml").replace([
        "cluster.topology.kind=ring", "cluster.topology.shape=[4]", "workload.parallelism.dp=4",
        "workload.global_batch=8", "workload.iterations=1", "network.protocols=links",
        "network.dp_algorithm=ring", "trace.enabled=false"])
    return scen, build(scen)


def test_fabric_port_shares_one_receiver_between_two_senders():
    """Devices 0 and 2 of a 4-ring both send to device 1 (one hop each, on different links);
    with device 1's port at ``P`` below twice the link rate each gets ``P / 2``; capping
    device 0's port at ``c < P / 2`` leaves ``P - c`` to device 2. Times are bytes / rate +
    the per-step latency; the ports count every byte at both ends; without ports the rate is
    the link's."""
    scen, model = _ring4()
    link = float(scen.cluster.link.bytes_per_s * scen.cluster.links_per_edge)
    size = 64e6
    for caps, expect in [({}, (link, link)), ({1: link}, (link / 2, link / 2)),
                         ({1: link, 0: link / 4}, (link / 4, 3 * link / 4))]:
        env = simpy.Environment()
        fab = Fabric(env, model.topo, model.router, scen.cluster.link_specs(), hbm_ports=True)
        for d, c in caps.items():
            fab.set_port_capacity([d], c)
        ph = [Phase(np.array([0]), np.array([1]), np.array([size])),
              Phase(np.array([2]), np.array([1]), np.array([size]))]
        ends: list[tuple[int, float]] = []

        def body(p, fab=fab, env=env, ends=ends):
            yield from fab.run_phase(p, "p2p")
            ends.append((int(p.src[0]), env.now))

        for p in ph:
            env.process(body(p))
        env.run()
        alpha = fab.step_latency(model.router.route(0, 1))
        # the first to finish frees the port: the other's remainder at the link's rate
        t = {s: size / r for s, r in zip((0, 2), expect, strict=True)}
        fast, slow = sorted(t, key=t.get)
        rate_slow = expect[(0, 2).index(slow)]
        rest = size - rate_slow * t[fast]
        t[slow] = t[fast] + rest / min(link, caps.get(1, math.inf), caps.get(slow, math.inf))
        for s, t_end in ends:
            assert t_end == pytest.approx(t[s] + alpha, rel=1e-9)
        assert fab.port_bytes[1] == pytest.approx(2 * size, rel=1e-9)
        assert fab.link_bytes.sum() == pytest.approx(2 * size, rel=1e-9)  # no port in it


def test_a_fabric_built_without_ports_ignores_port_caps():
    """A fabric made with its defaults has no HBM ports: capping device 0's port at a tenth
    of the link changes nothing, the one-hop send takes bytes / link rate + the step latency
    and no port bytes are counted."""
    scen, model = _ring4()
    link = float(scen.cluster.link.bytes_per_s * scen.cluster.links_per_edge)
    size = 64e6
    env = simpy.Environment()
    fab = Fabric(env, model.topo, model.router, scen.cluster.link_specs())
    fab.set_port_capacity([0], link / 10)
    env.process(fab.run_phase(Phase(np.array([0]), np.array([1]), np.array([size])), "p2p"))
    env.run()
    alpha = fab.step_latency(model.router.route(0, 1))
    assert env.now == pytest.approx(size / link + alpha, rel=1e-9)
    assert not np.asarray(fab.port_bytes).any()


@pytest.mark.parametrize(("dst", "steps"), [(2, 1), (1, 3)])
def test_a_send_cut_by_a_failure_is_resent_to_its_own_receiver_through_the_ports(dst, steps):
    """Device 0 sends ``steps`` rounds to device ``dst`` of a 4-ring on a fabric with HBM
    ports; the first hop's edge fails halfway: after the retransmission timeout the rest goes
    the other way round (two hops to device 2 as before, three to device 1), still into the
    receiver's port. Every byte leaves device 0's port and enters the receiver's; no other
    port carries any; the message row counts the detour's hops; the send ends at the cut +
    timeout + the other half at the link's rate + ``steps`` step latencies of the longer
    route (the detour to device 1 adds a hop per step)."""
    scen, model = _ring4()
    link = float(scen.cluster.link.bytes_per_s * scen.cluster.links_per_edge)
    size = 64e6
    env = simpy.Environment()
    rows: list = []
    fab = Fabric(env, model.topo, model.router, scen.cluster.link_specs(), hbm_ports=True,
                 record=rows.append, retransmit_timeout_s=0.25)
    route = model.router.route(0, dst)
    first = route[0]
    u, v = int(model.topo.link_src[first]), int(model.topo.link_dst[first])
    total = size * steps
    t_cut = 0.5 * total / link

    def cut():
        yield env.timeout(t_cut)
        fab.fail_edge(u, v)

    env.process(fab.run_phase(Phase(np.array([0]), np.array([dst]), np.array([size]),
                                    steps=steps), "p2p"))
    env.process(cut())
    env.run()
    ports = np.asarray(fab.port_bytes)
    assert ports[0] == pytest.approx(total, rel=1e-9)
    assert ports[dst] == pytest.approx(total, rel=1e-9)
    assert not np.delete(ports, [0, dst]).any()
    detour = model.router.route(0, dst)
    assert first not in detour and len(detour) == 4 - len(route)
    assert rows[-1].max_hops == len(detour) and rows[-1].dst == dst
    alpha = max(fab.step_latency(route), fab.step_latency(detour))
    assert env.now == pytest.approx(t_cut + 0.25 + 0.5 * total / link + steps * alpha,
                                    rel=1e-12)


def test_run_closed_with_a_message_sink_ends_where_the_clocked_closed_form_ends():
    """``Fabric.run_closed`` from t = 0.3 s with a message sink gives the end time and the
    message rows that ``start_closed`` gives on the clock from 0.3 s (a 4-rank ring
    all-gather)."""
    from workloads import collectives

    scen, model = _ring4()
    phases = collectives.ring("allgather", np.array([[0, 1, 2, 3]]), 32e6)
    out = []
    for clocked in (False, True):
        env = simpy.Environment()
        rows: list = []
        fab = Fabric(env, model.topo, model.router, scen.cluster.link_specs(),
                     record=rows.append)
        assert fab.closed_form(phases[0]) is not None
        if clocked:
            env.run(until=0.3)
            env.run(until=fab.start_closed(phases, "tp", 1))
            end = env.now
        else:
            end = fab.run_closed(phases, 0.3, "tp", 1)
        out.append((end, rows))
    (t_ahead, rows_ahead), (t_clock, rows_clock) = out
    assert t_ahead == t_clock and t_ahead > 0.3
    assert rows_ahead == rows_clock and rows_ahead[0].t_start == 0.3


def test_no_ports_without_a_controller_model():
    """Roofline memory (or ``transfer_cap: false``): the fabric has no ports, its flow engine
    the links only."""
    from twin.runner import transfers_capped

    scen, _ = _ring4()
    assert not transfers_capped(scen)
    assert not transfers_capped(scen.replace(["memory.model=frfcfs",
                                              "memory.transfer_cap=false"]))
    assert transfers_capped(scen.replace(["memory.model=frfcfs"]))
    assert not transfers_capped(scen.replace(["memory.model=frfcfs", "network.model=packet"]))


# ----------------------------------------------------------------- the rate the controller gives
def _standalone_dma(scen, mm, n: int, k: int, r: int) -> float:
    """All ``k`` DMA streams' bandwidth while the op ran, from the FR-FCFS engine run
    standalone on streams built from catalog numbers
    (``tests.test_contention_streams.standalone_streams``), with the model's random numbers
    of batch ``r``."""
    hbm, stacks, op, dma = standalone_streams(scen, mm, n, k)
    eb = effective_bandwidth(hbm, stacks, op, [dma] * k, mm._rng(0, n, r))
    return sum(eb.dma_window_bytes_per_s)


class _Compute:
    """The compute side of a device agent's block (a test double: the transfer under test
    does not depend on it): one ``duration_s`` per block whatever the factors."""

    def __init__(self, duration_s: float):
        self.d = duration_s

    def block_cost(self, part, math_s, mem_s):
        return SimpleNamespace(duration_s=self.d, gemm_flops=0.0, compute_j=0.0, memory_j=0.0)


def _rig(scen, model, memory_model: str, k: int, capped: bool, batches: int = 8):
    """A 4-ring whose devices all run one long compute block (1 s) while ``k`` ring
    all-reduces of 64 MB per rank run beside it, started at t = 1 ms (streams ``dp``);
    returns (transfer durations, the memory model, per-step latency x steps)."""
    sc = scen.replace([f"memory.model={memory_model}", f"memory.batches={batches}"])
    env = simpy.Environment()
    fab = Fabric(env, model.topo, model.router, sc.cluster.link_specs(), hbm_ports=capped)
    cl = sc.cluster
    mm = build_memory_model(sc.memory, cl.device, cl.link, cl.links_per_edge,
                            np.random.default_rng(7))
    blk = model.blocks[0]["mlp_fwd"]
    acc = SimpleNamespace(model=_Compute(1.0), dev=SimpleNamespace(math_scale=[1.0],
                                                                   dyn_scale=[1.0]),
                          mem_scale=1.0)
    agents = [DeviceStreams(env, 1, None, None, mm, rng=np.random.default_rng(d),
                            on_ports=(lambda cap, d=d: fab.set_port_capacity([d], cap)))
              for d in range(4)]
    for a in agents:
        env.process(a.run_block(acc, blk, 0, 1.0, a.price(acc, blk, 0)))
    groups = np.array([[0, 1, 2, 3]])
    out = []

    def allreduce(i):
        yield env.timeout(1e-3)
        for a in agents:
            a.start("dp")
        phases = collectives.ring("allreduce", groups, 64e6 * (1 + 0.01 * i))
        t0 = env.now
        for ph in phases:
            yield from fab.run_phase(ph, "dp")
        out.append((i, env.now - t0, phases[0]))
        for a in agents:
            a.end("dp")

    for i in range(k):
        env.process(allreduce(i))
    env.run(until=0.9)
    assert len(out) == k, "the all-reduces must end while the blocks still run"
    alpha = fab.step_latency(model.router.route(0, 1))
    return sorted(out), mm, alpha


def test_transfer_beside_a_block_moves_at_the_controllers_dma_share():
    """One ring all-reduce beside compute blocks on all 4 devices, FR-FCFS: each device's
    port carries its outgoing and its incoming flow (one HBM byte per byte at each end), so
    each flow runs at ``D / 2``, D the bandwidth the standalone FR-FCFS engine gives one DMA
    stream beside the op while it runs (mean over the model's batches, same random numbers),
    when that is below the link rate; within 2%."""
    scen, model = _ring4()
    out, mm, alpha = _rig(scen, model, "frfcfs", 1, True)
    _, dur, ph = out[0]
    n = mm.requests_per_batch
    d_ref = float(np.mean([_standalone_dma(scen, mm, n, 1, r) for r in range(mm.batches)]))
    link = float(scen.cluster.link.bytes_per_s * scen.cluster.links_per_edge)
    rate = min(link, d_ref / 2)
    assert d_ref / 2 < link  # the controller, not the link, sets the rate here
    per_flow = float(ph.nbytes[0]) * ph.steps
    assert dur - alpha * ph.steps == pytest.approx(per_flow / rate, rel=0.02)


@pytest.mark.parametrize("env_type", [Engine, simpy.Environment])
def test_back_to_back_blocks_leave_the_ports_capped_and_a_stream_end_uncaps_them(env_type):
    """One device, a DMA stream from t = 0 and two 1 s blocks back to back, the stream
    ending at 1.5 s: the ports are told the controller's DMA share once at 0 and ``inf``
    once at 1.5 s (the first block's end and the second's start at 1 s are one instant: no
    flip to ``inf`` and back), and the capped seconds are the 1.5 s in between. On the
    run's engine (changes applied at the end of the instant, ``Engine.at_instant_end``) and
    on a plain SimPy environment (a zero-delay event)."""
    scen, model = _ring4()
    sc = scen.replace(["memory.model=frfcfs", "memory.batches=8"])
    cl = sc.cluster
    mm = build_memory_model(sc.memory, cl.device, cl.link, cl.links_per_edge,
                            np.random.default_rng(7))
    cap = mm.dma_caps((1, 0))[0]
    assert math.isfinite(cap)  # one stream beside an op is capped in this controller
    env = env_type()
    told: list[tuple[float, float]] = []
    agent = DeviceStreams(env, 1, None, None, mm, rng=np.random.default_rng(1),
                          on_ports=lambda c: told.append((env.now, c)))
    blk = model.blocks[0]["mlp_fwd"]
    acc = SimpleNamespace(model=_Compute(1.0), dev=SimpleNamespace(math_scale=[1.0],
                                                                   dyn_scale=[1.0]),
                          mem_scale=1.0)

    def blocks():
        agent.start("dp")
        for _ in range(2):
            yield from agent.run_block(acc, blk, 0, 1.0, agent.price(acc, blk, 0))

    def stream_end():
        yield env.timeout(1.5)
        agent.end("dp")

    env.process(blocks())
    env.process(stream_end())
    env.run()
    assert told == [(0.0, cap), (1.5, math.inf)]
    assert agent.capped_s() == pytest.approx(1.5, rel=1e-12)


@pytest.mark.parametrize(("swaps", "repriced"), [
    ([(0.5, 0.5)], 0),              # the next stream starts as one ends: the mix holds
    ([(0.5, None)], 1),             # a stream ends: the block runs on at the new mix
    ([(0.5, 0.6)], 2),              # ends, then another starts later: two changes
    ([(0.3, 0.3), (0.7, 0.7)], 0),  # two swaps, each within an instant
])
@pytest.mark.parametrize("env_type", [Engine, simpy.Environment])
def test_a_block_is_repriced_only_when_the_mix_changes_across_an_instant(swaps, repriced,
                                                                          env_type):
    """One device runs a 1 s block beside DMA streams; each of ``swaps`` ends one stream at
    its first time and starts another at its second (None: none), from separate processes.
    The running block is re-priced (its HBM factor drawn again) once per instant at which
    the mix it runs at differs from the mix at the end of that instant, and never for a
    swap within one instant (before, the end alone re-priced it and the start again)."""
    scen, model = _ring4()
    sc = scen.replace(["memory.model=frfcfs", "memory.batches=8"])
    cl = sc.cluster
    mm = build_memory_model(sc.memory, cl.device, cl.link, cl.links_per_edge,
                            np.random.default_rng(7))
    env = env_type()
    agent = DeviceStreams(env, 1, None, None, mm, rng=np.random.default_rng(1))
    blk = model.blocks[0]["mlp_fwd"]
    acc = SimpleNamespace(model=_Compute(1.0), dev=SimpleNamespace(math_scale=[1.0],
                                                                   dyn_scale=[1.0]),
                          mem_scale=1.0)
    for _ in swaps:
        agent.start("dp")
    out = []

    def block():
        out.append((yield from agent.run_block(acc, blk, 0, 1.0, agent.price(acc, blk, 0))))

    def at(t, fn):
        yield env.timeout(t)
        fn("dp")

    env.process(block())
    for t_end, t_start in swaps:
        env.process(at(t_end, agent.end))
        if t_start is not None:
            env.process(at(t_start, agent.start))
    env.run()
    assert agent.repriced == repriced
    assert out[0][0] == pytest.approx(1.0, rel=1e-12)  # the fractions of work still add up


@pytest.mark.parametrize("memory_model", ["frfcfs", "queue"])
def test_the_cap_never_makes_a_transfer_faster(memory_model):
    """For 1 to 4 concurrent all-reduces beside the blocks, every all-reduce takes at least
    as long with the HBM ports as without (``transfer_cap: false``: the fabric's rate), the
    same time where the controller serves the DMA all it offers (cap ``inf``), and the caps
    the model reports are never above the offered DMA traffic."""
    scen, model = _ring4()
    for k in range(1, 5):
        free, mm, _ = _rig(scen, model, memory_model, k, False)
        capped, _, _ = _rig(scen, model, memory_model, k, True)
        cap = mm.dma_caps((k, 0))[0]
        for (_, d0, _p0), (_, d1, _p1) in zip(free, capped, strict=True):
            assert d1 >= d0 * (1 - 1e-12)
            if math.isinf(cap):
                assert d1 == pytest.approx(d0, rel=1e-12)
        assert cap == math.inf or cap < k * mm.offered_bytes_per_s()[0]


# ----------------------------------------------------------------- host copies
def test_host_copy_rate_is_capped_at_its_hbm_share():
    """A copy moves ``bytes / min(port rate, HBM cap)``; an infinite cap leaves the port
    rate; the cap is read after the copy counted itself as a stream."""
    spec = PcieSpec(gpus_per_switch=1, port_gbps=25.0, uplink_gbps=25.0)
    for cap, rate in [(math.inf, 25e9), (10e9, 10e9), (40e9, 25e9)]:
        env = simpy.Environment()
        seen: list = []

        def hbm_cap(c=cap, seen=seen):
            seen.append("cap")
            return c

        port = PcieFabric(env, spec, 8).port(0, on_copy=seen.append, hbm_cap=hbm_cap)
        env.process(port.transfer(1e9))
        env.run()
        assert env.now == pytest.approx(1e9 / rate, rel=1e-12)
        assert seen == [1, "cap", -1]
        assert port.hbm_capped == (1 if cap < 25e9 else 0)


# ----------------------------------------------------------------- a whole run
def test_whole_run_caps_the_ports_while_blocks_run_beside_transfers():
    """``scenarios/hbm_frfcfs.yaml`` (DP buckets beside the backward pass, pipeline sends):
    the ports are capped for part of the run, at no more than the controller's DMA share
    of one stream (the smallest mix that caps), and ``transfer_cap: false`` leaves them
    uncapped; the fabric of a roofline run has no ports."""
    from twin.runner import run

    base = load_scenario(ROOT / "scenarios" / "hbm_frfcfs.yaml").replace([
        "trace.enabled=false", "workload.iterations=1", "memory.batches=8"])
    on = run(base).summary
    off = run(base.replace(["memory.transfer_cap=false"])).summary
    assert 0.0 < on["hbm_port_capped_s"] < on["makespan_s"]
    cl = base.cluster
    mm = build_memory_model(base.memory, cl.device, cl.link, cl.links_per_edge,
                            np.random.default_rng(0))
    assert on["hbm_port_cap_min_gbps"] <= mm.offered_bytes_per_s()[0] / 1e9
    assert off["hbm_port_capped_s"] == 0.0 and off["hbm_port_cap_min_gbps"] is None
    assert run(base.replace(["memory.model=roofline"])).summary["hbm_port_capped_s"] == 0.0


def test_host_copies_draw_hbm_energy_and_the_power_integral_still_closes():
    """``power.communication_energy``: every microbatch's host-to-device copy of
    ``micro_batch x seq x h2d_bytes_per_token`` bytes is written to the HBM of each of the
    16 loading devices at the catalog's pJ/bit; the devices' power segments still integrate
    to their energy (the summary's energy minus the network's)."""
    from twin.kernel.records import Recorder
    from twin.runner import simulate
    from twin.summary import summarize

    scen = load_scenario(ROOT / "scenarios" / "data_starved.yaml").replace([
        "workload.iterations=2", "trace.enabled=false", "power.communication_energy=true"])
    model = build(scen)
    env, fab, ex, _ = simulate(model, Recorder())
    s = summarize(model, env, fab, ex, 0.0)
    w = scen.workload
    m = w.global_batch // (w.parallelism.dp * w.micro_batch)
    nbytes = w.micro_batch * w.seq_len * scen.data.h2d_bytes_per_token
    expect = 16 * m * w.iterations * nbytes * scen.cluster.device.hbm_pj_per_bit * 8e-12
    got = sum(a.stats.h2d_j * a.n for a in ex.accelerators)
    assert expect > 0 and got == pytest.approx(expect, rel=1e-9)
    seg = sum(float((g[:, 1] - g[:, 0]) @ g[:, 2]) * a.n
              for a in ex.accelerators for g in [a.power_segments()])
    assert seg == pytest.approx(s["energy_j"] - s["energy_breakdown_j"]["network"], rel=1e-9)
    off = summarize(*_sim(scen.replace(["power.communication_energy=false"])), 0.0)
    assert off["iteration_time_s"] == s["iteration_time_s"]


def _sim(scen):
    from twin.kernel.records import Recorder
    from twin.runner import simulate

    model = build(scen)
    env, fab, ex, _ = simulate(model, Recorder())
    return model, env, fab, ex


def test_a_trickle_of_dma_is_never_capped_and_a_slower_one_is_refused():
    """A DMA stream of 1 MB/s beside ops on a 3 TB/s HBM offers no request in the ops'
    windows: nothing is measured, and a stream that far below saturation is served in full,
    so the ports stay uncapped (a 'measured' 0 B/s capped them at 0 and the run failed).
    Below 1 MB/s the HBM batches would simulate the trickle's whole arrival span (1 B/s: ~1000
    s of HBM time): refused before the run, naming the key."""
    from twin.runner import run

    base = load_scenario(ROOT / "scenarios" / "hbm_frfcfs.yaml").replace([
        "trace.enabled=false", "workload.iterations=1", "memory.dma.rate_gbps=1e-3"])
    summary = run(base).summary
    assert summary["hbm_port_capped_s"] == 0.0 and summary["hbm_port_cap_min_gbps"] is None
    with pytest.raises(ScenarioError) as err:
        base.replace(["memory.dma.rate_gbps=1e-9"])
    assert [p.path for p in err.value.problems] == ["memory.dma.rate_gbps"]
