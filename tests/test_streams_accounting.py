"""The device agent's bookkeeping (devices.interference.DeviceStreams): stream counts, the
weights of its statistics, and the prices of blocks with nothing beside them.

References are independent of the code under test: the stream mix implied by the starts and
ends the test makes; the documented weights (a block's uncontended seconds x the devices the
agent stands for); the summary a run without agents reports (``no_streams_report``); and the
accelerator's own block cost (``Accelerator._block``, the path of runs without agents) for a
block priced with no stream beside it, at every P-state.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import simpy

from devices.interference import (
    DeviceStreams,
    Price,
    SmShares,
    no_streams_report,
    streams_report,
)
from twin.build import build
from twin.kernel.records import Recorder
from twin.runner import simulate
from twin.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SHARES = SmShares(collective_ctas=8, tp_overlap_ctas=4, copy_ctas=2)


def _agent(n: int = 1, shares=SHARES, on_network=None) -> DeviceStreams:
    return DeviceStreams(simpy.Environment(), n, 100, shares, on_network=on_network)


def test_streams_start_and_end_back_to_an_empty_mix():
    calls = []
    a = _agent(on_network=calls.append)
    for kind in ("dp", "tp", "h2d", "pp", "h2d"):
        a.start(kind)
    assert a.mix == (3, 2) and a._sm == 8 + 4 + 2 + 8 + 2
    for kind in ("h2d", "tp", "dp", "h2d", "pp"):
        a.end(kind)
    assert a.mix == (0, 0) and a._sm == 0
    # the PCIe switches count NIC flows: network streams other than TP, each start and end
    assert calls == [1, 1, -1, -1]


def test_block_weights_are_uncontended_seconds_times_devices():
    """An agent standing for 4 devices: pieces of 1/4 and 3/4 of a block of 0.2 s
    uncontended at HBM factors 1.5 and 1 (durations 0.26 s and 0.2 s; in the first the
    members' own blocks last 0.24 s on average, the slowest 0.26 s); the weights add up to
    less than one device-second, which must not matter."""
    a = _agent(n=4)
    assert a.totals() == (0.0, 0.0, 0.0)

    class Blk:
        name = "mlp_fwd"

    a._account(Blk, Price(0.26, 0.0, 0.0, 0.0, 0.2, 0.3, (2, 0), 1024, 1.5, 1.0, 0.24), 0.25)
    a._account(Blk, Price(0.2, 0.0, 0.0, 0.0, 0.2, 0.2, (0, 0), 0, 1.0, 1.0, 0.2), 0.75)
    w, w_hbm, w_dur = a.totals()
    assert w == pytest.approx(4 * 0.2, rel=1e-12)
    assert w_hbm == pytest.approx(4 * (0.25 * 0.3 + 0.75 * 0.2), rel=1e-12)
    assert w_dur == pytest.approx(4 * (0.25 * 0.24 + 0.75 * 0.2), rel=1e-12)
    rep = streams_report([a, _agent(n=2)])
    assert rep["hbm_slowdown_mean"] == pytest.approx(w_hbm / w, rel=1e-12)
    assert rep["contention_slowdown_mean"] == pytest.approx(w_dur / w, rel=1e-12)
    assert rep["hbm_slowdown_mean"] > 1.0
    # both pieces are recorded (one contended, one the rest of a re-priced block)
    assert sorted(r.fraction for rs in a.records.values() for r in rs) == [0.25, 0.75]


def test_pieces_that_ran_count_their_streams_and_book_the_alone_level_once_each():
    """``hbm_max_streams`` counts the compute stream, the network streams and the copies
    beside a piece (1 + 1 + 2 here); a piece of fraction 0 (a block re-priced in the instant
    it started) ran nothing and counts nothing; a piece alone books one op of the agent's
    weight at the controller's level (0, 0), and a piece alone run ahead of the clock books
    it only when its run stands (``book_alone``)."""
    booked = []

    class Mem:
        def record(self, k, s, w):
            booked.append((k, s, w))

    class Blk:
        name = "attn_fwd"

    a = DeviceStreams(simpy.Environment(), 3, 100, SHARES, memory=Mem())
    a._account(Blk, Price(0.3, 0.0, 0.0, 0.0, 0.2, 0.3, (1, 2), 1024, 1.5, 1.0, 0.3), 0.5)
    assert a.max_streams == 4 and streams_report([a])["hbm_max_streams"] == 4
    a._account(Blk, Price(0.3, 0.0, 0.0, 0.0, 0.2, 0.3, (5, 3), 1024, 1.5, 1.0, 0.3), 0.0)
    assert a.max_streams == 4 and sum(map(len, a.records.values())) == 1
    assert a.totals()[0] == pytest.approx(3 * 0.5 * 0.2, rel=1e-12) and booked == []
    alone = Price(0.2, 0.0, 0.0, 0.0, 0.2, 0.2, (0, 0), 1024, 1.0, 1.0, 0.2)
    a._account(Blk, alone, 0.5)
    assert booked == [((0, 0), 1.0, 3.0)]
    a._account(Blk, alone, 0.0)
    a.ran_alone(Blk, alone)
    a.ran_alone(Blk, alone)
    assert booked == [((0, 0), 1.0, 3.0)]
    a.book_alone()
    assert booked == [((0, 0), 1.0, 3.0), ((0, 0), 1.0, 6.0)]
    assert a.totals()[0] == pytest.approx(3 * (0.5 * 0.2 + 0.5 * 0.2 + 2 * 0.2), rel=1e-12)


def test_a_group_agent_books_one_op_alone_per_device():
    """An agent standing for 8 devices in TP groups of 4 (rank symmetry with
    ``memory.per_device_draws: false``): a piece alone books one op per device it stands for
    at the controller's level (0, 0), i.e. weight 8, whatever the group size."""
    booked = []

    class Mem:
        batches = 4

        def record(self, k, s, w):
            booked.append((k, s, w))

    class Blk:
        name = "mlp_fwd"

    for group in (1, 2, 4):
        booked.clear()
        a = DeviceStreams(simpy.Environment(), 8, 100, SHARES, memory=Mem(), group=group)
        a._account(Blk, Price(0.2, 0.0, 0.0, 0.0, 0.2, 0.2, (0, 0), 1024, 1.0, 1.0, 0.2), 0.5)
        assert booked == [((0, 0), 1.0, 8.0)], group


def test_one_sm_taken_slows_the_math_by_units_over_the_units_left():
    """A stream taking one SM of 100: math time x 100 / 99 (and nothing without it);
    streams asking for more SMs than there are leave the compute one."""
    a = _agent(shares=SmShares(collective_ctas=8, tp_overlap_ctas=4, copy_ctas=1))
    assert a.sm_factor() == 1.0
    a.start("h2d")
    assert a.sm_factor() == pytest.approx(100 / 99, rel=1e-15) and a.max_sm_used == 1
    a.start("dp")
    assert a.sm_factor() == pytest.approx(100 / 91, rel=1e-15)
    for _ in range(12):  # 13 collectives of 8 SMs and a copy: more than the 100 there are
        a.start("dp")
    assert a.sm_factor() == pytest.approx(100 / 1, rel=1e-15)  # compute keeps one SM
    assert a.max_sm_used == 99


def test_fresh_latency_draws_come_in_blocks_that_double_up_to_256():
    """Fresh latency batches of one (requests, mix) are solved 8 at a time the first time,
    then in blocks twice the last, up to 256 (a bounded cost per solve); every draw is used
    once, in order, rounded to the 0.2% log grid."""
    import numpy as np

    sizes = []

    class Lat:
        def fresh_latencies(self, n, mix, rng, size):
            sizes.append(size)
            return np.full(size, 1.5 + len(sizes))  # block j's draws: 2.5, 3.5, ...

    a = DeviceStreams(simpy.Environment(), 1, 100, SHARES, rng=np.random.default_rng(0))
    got = a._fresh(Lat(), 64, (1, 0), 8 + 16 + 32 + 64 + 128 + 256 + 10)
    assert sizes == [8, 16, 32, 64, 128, 256, 256]
    assert got[0] == pytest.approx(2.5, rel=0.002) and got[8] == pytest.approx(3.5, rel=0.002)
    assert got[-1] == pytest.approx(8.5, rel=0.002) and len(got) == 514
    assert abs(math_log_grid(got[0])) < 1e-6


def test_a_run_without_agents_reports_what_agents_that_saw_nothing_report():
    assert streams_report([]) == no_streams_report()
    assert no_streams_report() == {
        "hbm_max_streams": 0, "hbm_slowdown_mean": 1.0, "contention_slowdown_mean": 1.0,
        "sm_max_used": 0, "hbm_port_capped_s": 0.0, "hbm_port_cap_min_gbps": None}


@pytest.fixture(scope="module")
def slow_clock_run():
    """Quickstart on 8 devices, FULL_SHARD, SM sharing on and the clock fixed below the
    top (a P-state whose dynamic-energy scale is not 1)."""
    scen = load_scenario(ROOT / "scenarios" / "quickstart.yaml").replace([
        "cluster.topology.shape=[4,2]", "workload.parallelism.dp=8",
        "workload.sharding.strategy=full_shard", "workload.global_batch=16",
        "workload.micro_batch=2", "workload.iterations=1", "trace.enabled=false",
        "overlap.sm_contention=true", "power.dvfs.frequency_mhz=1260"])
    model = build(scen)
    _env, _fab, ex, _ = simulate(model, Recorder())
    return model, ex


def test_a_block_priced_with_nothing_beside_it_costs_what_the_accelerator_says(slow_clock_run):
    model, ex = slow_clock_run
    acc = ex.accelerators[0]
    streams = acc.streams
    assert streams is not None and streams.mix == (0, 0) and streams._sm == 0
    ps = acc.ps
    assert acc.dev.dyn_scale[ps] < 0.99          # the fixed clock is below the top
    for name, block in model.blocks[0].items():
        p = streams.price(acc, block, ps)
        dur, flops, e_dyn, e_mem, _ = acc._block(block, ps)
        assert (p.duration_s, p.gemm_flops, p.memory_j) == pytest.approx(
            (dur, flops, e_mem), rel=1e-12), name
        assert p.compute_j == pytest.approx(e_dyn, rel=1e-12), name
        assert p.mix == (0, 0) and p.sm_factor == 1.0 and p.slowdown == 1.0
        assert p.n_requests == 0  # no HBM controller model: no request class
    # SMs shared, no HBM controller model: no stream count to report
    rep = streams_report([a.streams for a in ex.accelerators])
    assert rep["hbm_max_streams"] == 0 and rep["sm_max_used"] > 0


def test_port_lookups_are_not_counted_as_clipped_blocks():
    from devices.memory import QueueContention
    from twin.kernel.queueing import service_distribution

    mem = QueueContention(op_load=0.5, dma_load=0.3, bytes_per_request=5120.0, batches=4,
                          max_streams=2, service=service_distribution("exponential",
                                                                      mean=1e-9))
    a = DeviceStreams(simpy.Environment(), 1, 100, None, memory=mem)
    for _ in range(3):
        a.start("dp")
    a._running = (None, a._key())
    # a lookup reads the mix clipped like a block's (3 network streams simulated as 2;
    # both mixes oversubscribe the controller, at different caps)
    cap2, cap3 = mem.dma_caps((2, 0))[0], mem.dma_caps((3, 0))[0]
    assert math.isfinite(cap2) and cap2 != cap3
    assert a.port_capacity() == cap2
    a.start("h2d")
    a.h2d_cap()
    assert mem._clipped == 0.0

    # saturated (op 0.6 + 3 x 0.2 network + 3 x 0.3 copies of the peak): capped while a
    # block runs; between blocks the controller serves the transfers what they offer
    busy = QueueContention(op_load=0.6, dma_load=0.2, h2d_load=0.3, bytes_per_request=5120.0,
                           batches=4, service=service_distribution("exponential", mean=1e-9))
    for mix in ((3, 0), (0, 3), (3, 3)):
        b = DeviceStreams(simpy.Environment(), 1, 100, None, memory=busy)
        for _ in range(mix[0]):
            b.start("dp")
        for _ in range(mix[1]):
            b.start("h2d")
        b._running = (None, b._key())
        assert (b.port_capacity() < math.inf) == (mix[0] > 0)
        assert (b.h2d_cap() < math.inf) == (mix[1] > 0)
        b._running = None
        assert b.port_capacity() == math.inf and b.h2d_cap() == math.inf


@pytest.fixture(scope="module")
def auto_run():
    """Quickstart on 8 devices with the queue controller, ``memory.bound: auto``."""
    scen = load_scenario(ROOT / "scenarios" / "quickstart.yaml").replace([
        "cluster.topology.shape=[4,2]", "workload.parallelism.dp=8", "workload.global_batch=16",
        "workload.micro_batch=2", "workload.iterations=1", "trace.enabled=false",
        "memory.model=queue", "memory.bound=auto", "memory.batches=8",
        "memory.requests_per_batch=256"])
    model = build(scen)
    _env, _fab, ex, _ = simulate(model, Recorder())
    return scen, model, ex


def test_bound_auto_prices_each_part_of_a_block_by_its_own_view(auto_run):
    """``memory.bound: auto``: the kernels the documented rule calls latency-bound (every
    non-GEMM kernel, GEMMs below ``memory.latency_below_mb``) are priced with the latency
    view's fresh draws (on its 0.2% log grid), the rest with the bandwidth view's table; the
    block costs the sum of its two parts at their factors (math slowed by the SMs three
    all-reduce kernels take), and its HBM-weighted time is each part's uncontended time times
    its factor."""
    from workloads.transformer import Block

    scen, model, ex = auto_run
    acc = ex.accelerators[0]
    agent = acc.streams
    assert agent.latency is not None and agent.memory is not None
    cut = scen.memory.latency_below_mb * 1e6
    for _ in range(3):
        agent.start("dp")
    checked = 0
    for name, block in model.blocks[0].items():
        lat = tuple(k for k in block.kernels if not k.gemm or k.bytes < cut)
        bw = tuple(k for k in block.kernels if k.gemm and k.bytes >= cut)
        if not lat or not bw:
            continue
        p = agent.price(acc, block, acc.ps)
        cm, ms, ps = acc.model, acc.mem_scale, acc.ps
        math = acc.dev.math_scale[ps]
        base_bw = cm.block_cost(Block(name, bw), math, ms).duration_s
        base_lat = cm.block_cost(Block(name, lat), math, ms).duration_s
        assert p.base_s == pytest.approx(base_bw + base_lat, rel=1e-12)
        s_bw = p.slowdown
        s_lat = (p.hbm_s - base_bw * s_bw) / base_lat
        assert s_bw >= 1.0 and s_lat > 0.0   # one fresh batch can beat the alone mean
        assert abs(math_log_grid(s_lat)) < 1e-6          # a fresh draw, rounded to the grid
        sm = p.sm_factor                   # the collectives' SMs (units / (units - taken))
        assert sm == agent.units / (agent.units - 3 * agent.shares.of("dp"))
        assert p.duration_s == pytest.approx(
            cm.block_cost(Block(name, bw), math * sm, ms * s_bw).duration_s
            + cm.block_cost(Block(name, lat), math * sm, ms * s_lat).duration_s, rel=1e-9)
        checked += 1
    assert checked >= 2
    # a block of latency-bound kernels only: no bandwidth part, so no request class and no
    # bandwidth factor; its time is its uncontended time at the latency draw
    block = next(b for b in model.blocks[0].values() if b.kernels)
    only_lat = Block("norm_only", tuple(k for k in block.kernels if not k.gemm))
    assert only_lat.kernels
    p = agent.price(acc, only_lat, acc.ps)
    assert p.n_requests == 0 and p.slowdown == 1.0
    assert p.hbm_s / p.base_s > 0.0 and abs(math_log_grid(p.hbm_s / p.base_s)) < 1e-6


def test_a_group_agent_lasts_as_long_as_its_slowest_members_own_block(auto_run, monkeypatch):
    """An agent for a TP group of four that meets after the block: each member's block is
    priced at that member's own factors, bandwidth part and latency part together; the
    group's block lasts as long as the slowest member's and costs its energy, its
    HBM-weighted time weights each part by the members' mean factor, and the members' mean
    duration is kept for the contention slowdown. The factors are chosen
    so that the slowest member has neither the largest bandwidth factor nor the largest
    latency factor: taking each part's largest factor would price a block no member runs."""
    from workloads.transformer import Block

    scen, model, ex = auto_run
    acc = ex.accelerators[0]
    one = acc.streams
    cut = scen.memory.latency_below_mb * 1e6
    agent = DeviceStreams(one.env, 4, one.units, one.shares, one.memory, one.latency, cut,
                          np.random.default_rng(0), group=4)
    bw_f, lat_f = [1.0, 12.0, 3.0, 1.0], [6.0, 1.0, 2.0, 1.0]  # member j: (bw_f[j], lat_f[j])
    monkeypatch.setattr(agent, "_draws", lambda *a: list(bw_f))
    monkeypatch.setattr(agent, "_latency_draws", lambda *a: list(lat_f))
    agent.start("dp")
    cm, ms, ps = acc.model, acc.mem_scale, acc.ps
    math = acc.dev.math_scale[ps] * agent.sm_factor()
    checked = apart = 0
    for name, block in model.blocks[0].items():
        bw = Block(name, tuple(k for k in block.kernels if k.gemm and k.bytes >= cut))
        lat = Block(name, tuple(k for k in block.kernels if not k.gemm or k.bytes < cut))
        if not bw.kernels or not lat.kernels:
            continue
        own = [(cm.block_cost(bw, math, ms * b), cm.block_cost(lat, math, ms * f))
               for b, f in zip(bw_f, lat_f, strict=True)]
        dur = [c1.duration_s + c2.duration_s for c1, c2 in own]
        j = int(np.argmax(dur))
        base_bw = cm.block_cost(bw, acc.dev.math_scale[ps], ms).duration_s
        base_lat = cm.block_cost(lat, acc.dev.math_scale[ps], ms).duration_s
        p = agent.price(acc, block, ps)
        assert p.duration_s == pytest.approx(dur[j], rel=1e-12), name
        assert p.members_s == pytest.approx(np.mean(dur), rel=1e-12), name
        assert p.compute_j == pytest.approx(
            (own[j][0].compute_j + own[j][1].compute_j) * acc.dev.dyn_scale[ps], rel=1e-12)
        assert p.slowdown == bw_f[j]
        assert p.hbm_s == pytest.approx(base_bw * np.mean(bw_f) + base_lat * np.mean(lat_f),
                                        rel=1e-12)
        largest = (cm.block_cost(bw, math, ms * max(bw_f)).duration_s
                   + cm.block_cost(lat, math, ms * max(lat_f)).duration_s)
        apart += largest > dur[j] * (1 + 1e-6)  # a block that tells the two rules apart
        checked += 1
    assert checked >= 2 and apart >= 1


def test_a_group_agent_keeps_its_slowest_members_clock_between_meetings(auto_run,
                                                                          monkeypatch):
    """Blocks one after another on a TP group's device agent with no meeting in between
    (the last stage's logits forward, logits backward and MLP backward): each member runs
    its own blocks back to back, so after every block the group's clock is its members'
    latest clock, each member's clock the sum of its own blocks' durations (worked out here
    block by block at its own factors); after a meeting (:meth:`sync`) the members start
    together again."""
    from workloads.transformer import Block

    scen, model, ex = auto_run
    acc = ex.accelerators[0]
    one = acc.streams
    cut = scen.memory.latency_below_mb * 1e6
    env = simpy.Environment()
    agent = DeviceStreams(env, 3, one.units, one.shares, one.memory, one.latency, cut,
                          np.random.default_rng(0), group=3)
    factors = iter([([12.0, 1.0, 1.0], [1.0, 1.0, 6.0]), ([1.0, 12.0, 1.0], [6.0, 1.0, 1.0]),
                    ([1.0, 1.0, 12.0], [1.0, 6.0, 1.0]), ([1.0, 3.0, 1.0], [1.0, 1.0, 6.0])])
    now: dict = {}
    monkeypatch.setattr(agent, "_draws", lambda *a: list(now["bw"]))
    monkeypatch.setattr(agent, "_latency_draws", lambda *a: list(now["lat"]))
    agent.start("dp")
    cm, ms, ps = acc.model, acc.mem_scale, acc.ps
    math = acc.dev.math_scale[ps] * agent.sm_factor()
    block = next(b for b in model.blocks[0].values()
                 if any(k.gemm and k.bytes >= cut for k in b.kernels)
                 and any(not k.gemm or k.bytes < cut for k in b.kernels))
    bw = Block(block.name, tuple(k for k in block.kernels if k.gemm and k.bytes >= cut))
    lat = Block(block.name, tuple(k for k in block.kernels if not k.gemm or k.bytes < cut))

    def run_one():
        now["bw"], now["lat"] = next(factors)
        own = [cm.block_cost(bw, math, ms * b).duration_s + cm.block_cost(lat, math, ms * f)
               .duration_s for b, f in zip(now["bw"], now["lat"], strict=True)]
        env.process(agent.run_block(acc, block, ps, 1.0, agent.price(acc, block, ps)))
        env.run()
        return own

    clocks = [0.0] * 3
    slowest = 0.0  # the clock if the group met after every block
    for _ in range(3):  # no meeting
        own = run_one()
        clocks = [c + d for c, d in zip(clocks, own, strict=True)]
        slowest += max(own)
        assert env.now == pytest.approx(max(clocks), rel=1e-12)
    assert env.now < slowest * (1 - 1e-3)  # each member slow in one block: the rules differ
    agent.sync()  # the members meet: the next block starts them together
    t = env.now
    own = run_one()
    assert env.now - t == pytest.approx(max(own), rel=1e-12)


def math_log_grid(s: float) -> float:
    """Distance of log(s) from the nearest multiple of the documented 0.2% log step, in
    steps."""
    from devices.interference import _LOG_STEP

    assert _LOG_STEP == 0.002
    x = math.log(s) / _LOG_STEP
    return x - round(x)


@pytest.mark.parametrize(("tp", "per_device"), [(2, True), (4, True), (2, False)])
def test_an_agent_for_a_tp_group_draws_for_each_member(tp, per_device):
    """Per-device draws on one agent per TP group, or rank symmetry (one agent per class of
    alike ranks): either way the agent stands for whole TP groups and draws one set of
    factors per member of the group that meets after each block (``DeviceStreams.group``
    equals the scenario's TP degree), down to groups of two."""
    scen = load_scenario(ROOT / "scenarios" / "quickstart.yaml").replace([
        "cluster.topology.shape=[4,2]", f"workload.parallelism.tp={tp}",
        f"workload.parallelism.dp={8 // tp}", "workload.global_batch=8",
        "workload.iterations=1", "trace.enabled=false", "memory.model=frfcfs",
        f"memory.per_device_draws={str(per_device).lower()}"])
    model = build(scen)
    _env, _fab, ex, _ = simulate(model, Recorder())
    assert model.layout.tp_groups == per_device and model.symmetric == (not per_device)
    assert {acc.streams.group for acc in ex.accelerators} == {tp}
