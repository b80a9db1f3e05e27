"""Issue 12 / 15: every communication stream, the FSDP sharding stream's all-gathers and
reduce-scatters included, goes through the device's shared SMs and HBM controller, at the
streams actually running beside each part of a block.

Expected values come from outside the interference code: the SM count of the NCCL kernel in
the catalog file and the device's SM count (read here), the roofline block cost of
``devices.accelerator.ComputeModel`` at the factor they give, the fluid closed form of a block
whose neighbour ends part way through it, and the FR-FCFS engine run standalone on streams
built here from catalog numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from devices.hbm import StreamSpec, effective_bandwidth, load_hbm_spec
from twin.build import build
from twin.kernel.records import Recorder
from twin.runner import simulate
from twin.scenario import load_scenario
from workloads.schedules import DP_START

ROOT = Path(__file__).resolve().parents[1]
NCCL = ROOT / "devices" / "catalog" / "interference" / "nccl.yaml"


class _Ops(Recorder):
    """Keeps the ops table: (stream, kind, name, t0, t1)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []

    def op(self, cls, iteration, stream, kind, name, mb, chunk, layer, t0, t1, flops):
        self.ops.append((stream, kind, name, t0, t1))


def _fsdp(sets: list[str]):
    """FULL_SHARD over 8 H100s, one iteration: every layer's all-gather is prefetched when the
    previous layer starts, so it runs beside that layer's attention block (all of it) and the
    first part of its MLP block."""
    scen = load_scenario(ROOT / "scenarios" / "quickstart.yaml").replace([
        "cluster.topology.shape=[4,2]", "workload.parallelism.dp=8",
        "workload.sharding.strategy=full_shard", "workload.global_batch=64",
        "workload.micro_batch=8", "workload.iterations=1", "trace.enabled=false", *sets])
    model = build(scen)
    rec = _Ops()
    _env, _fab, ex, _ = simulate(model, rec)
    return scen, model, ex, rec.ops


def _beside_gather(ops):
    """Forward blocks with exactly one communication op (a sharding all-gather) beside them:
    (block name, t0, t1, gather t0, gather t1)."""
    comm = [o for o in ops if o[0] == "comm"]
    out = []
    for o in ops:
        if o[0] != "compute" or o[1] != "compute" or not o[2].endswith("_fwd"):
            continue
        near = [c for c in comm if c[3] < o[4] and c[4] > o[3]]
        if len(near) == 1 and near[0][1] == "shard" and near[0][2] == "allgather":
            out.append((o[2], o[3], o[4], near[0][3], near[0][4]))
    return out


def test_sharding_allgather_takes_sms_from_the_block_beside_it():
    """SM share: with ``c`` of the device's ``U`` SMs taken by the all-gather's NCCL kernel,
    a block fully beside it lasts ``D(U / (U - c))`` (the roofline block cost at that math
    factor), and a block the all-gather leaves after ``tau`` lasts
    ``tau + (1 - tau / D_sm) D`` (the fraction of its work done beside it at the slow rate,
    the rest at the full rate); the summary's ``sm_max_used`` is ``c``."""
    scen, model, ex, ops = _fsdp(["overlap.sm_contention=true"])
    ctas = yaml.safe_load(NCCL.read_text())["collective_ctas"]["value"]
    units = scen.cluster.device.compute_units
    factor = units / (units - ctas)
    blocks = model.blocks[0]
    full = part = 0
    for name, t0, t1, g0, g1 in _beside_gather(ops):
        d = model.compute.block_cost(blocks[name]).duration_s
        d_sm = model.compute.block_cost(blocks[name], factor).duration_s
        shows = d_sm > d * 1.01  # math-bound enough to show it (not the embedding gather)
        if g0 <= t0 and g1 >= t1:
            assert t1 - t0 == pytest.approx(d_sm, rel=1e-9)
            full += shows
        elif g0 <= t0 < g1 < t1:
            tau = g1 - t0
            assert t1 - t0 == pytest.approx(tau + (1 - tau / d_sm) * d, rel=1e-9)
            part += shows
    assert full >= 4 and part >= 4
    assert max(a.max_sm_used for a in ex.streams) == ctas


def standalone_streams(scen, mm, n: int, k: int):
    """The HBM spec, stack count, compute stream of ``n`` requests and one of the ``k`` DMA
    streams of a standalone FR-FCFS run, built here from catalog numbers (as
    ``tests/test_contention.py``), not by the model under test."""
    dev, link = scen.cluster.device, scen.cluster.link
    hbm = load_hbm_spec(dev.hbm_type)
    stacks = dev.hbm_stacks
    peak = dev.hbm_bandwidth_gbps * 1e9
    op = StreamSpec(n_requests=n, arrival="poisson",
                    rate_bytes_per_s=dev.memory_efficiency * peak / stacks,
                    read_fraction=2 / 3, row_locality=0.9)
    dma_rate = link.bandwidth_gbps * 1e9 * link.efficiency * scen.cluster.links_per_edge * 2
    m = mm._streams(n, (k, 0))[1][0].n_requests  # its DMA streams' length (an input)
    dma = StreamSpec(n_requests=m, arrival="poisson", rate_bytes_per_s=dma_rate / stacks,
                     read_fraction=0.5, row_locality=0.97, interleave="random")
    return hbm, stacks, op, dma


def _standalone_slowdown(scen, mm, n: int, k: int, r: int) -> float:
    """The FR-FCFS engine run standalone on ``n`` compute requests beside ``k`` DMA streams
    (:func:`standalone_streams`), with the model's random numbers of batch ``r``."""
    hbm, stacks, op, dma = standalone_streams(scen, mm, n, k)
    alone = effective_bandwidth(hbm, stacks, op, [], mm._rng(0, n, r))
    return effective_bandwidth(hbm, stacks, op, [dma] * k, mm._rng(0, n, r),
                               op_alone_bytes_per_s=alone.op_bandwidth_bytes_per_s).slowdown


def test_sharding_allgather_is_an_hbm_stream_of_the_block_beside_it():
    """HBM: under ``memory.model: frfcfs`` the all-gather is a second stream at the
    controller (``hbm_max_streams`` 2); the part of a block done beside it has the slowdown
    the standalone FR-FCFS engine gives for that request mix (same inputs and random numbers,
    within 2%), and the block's duration is the fluid closed form of its two parts."""
    scen, model, ex, ops = _fsdp(["memory.model=frfcfs", "memory.batches=8"])
    agent = ex.streams[0]
    assert agent.max_streams == 2
    mm = ex.accelerators[0].memory
    beside = [r for r in agent.records.get((1, 0), []) if r.name == "mlp_fwd" and r.fraction < 1]
    assert beside, "no MLP block was re-priced when the all-gather beside it ended"
    rec = beside[0]
    tab = mm.table(rec.n_requests, rec.mix)
    r = int(np.flatnonzero(tab.samples == rec.slowdown)[0])  # the batch the piece drew
    assert rec.slowdown > 1.0
    assert rec.slowdown == pytest.approx(_standalone_slowdown(scen, mm, rec.n_requests, 1, r),
                                         rel=0.02)
    # the same block's closing piece, alone at the controller
    after = [r for r in agent.records.get((0, 0), []) if r.name == "mlp_fwd" and r.t > rec.t]
    assert after
    alone = after[0]
    blk = model.blocks[0]["mlp_fwd"]
    d_beside = model.compute.block_cost(blk, rec.sm_factor, rec.slowdown).duration_s
    d_alone = model.compute.block_cost(blk, alone.sm_factor, alone.slowdown).duration_s
    # the op of that block in the table: ends when its second piece was accounted
    t0, t1 = next((o[3], o[4]) for o in ops if o[2] == "mlp_fwd" and o[4] == alone.t)
    tau = rec.t - t0
    assert rec.fraction == pytest.approx(tau / d_beside, rel=1e-9)
    assert t1 - t0 == pytest.approx(tau + (1 - tau / d_beside) * d_alone, rel=1e-9)


class _Comm(Recorder):
    """Keeps the communication ops: (kind, name, t0, t1)."""

    def __init__(self):
        super().__init__()
        self.comm: list[tuple] = []

    def op(self, cls, iteration, stream, kind, name, mb, chunk, layer, t0, t1, flops):
        if stream == "comm":
            self.comm.append((kind, name, t0, t1))


def _ring_dp(on: bool):
    scen = load_scenario(ROOT / "scenarios" / "quickstart.yaml").replace([
        "cluster.topology.kind=ring", "cluster.topology.shape=[4]", "workload.parallelism.dp=4",
        "workload.global_batch=8", "workload.iterations=1", "network.protocols=links",
        "network.dp_algorithm=ring", f"power.communication_energy={str(on).lower()}",
        "trace.enabled=false"])
    model = build(scen)
    rec = _Comm()
    env, fab, ex, _ = simulate(model, rec)
    from twin.summary import summarize

    return scen, model, ex, rec.comm, summarize(model, env, fab, ex, 0.0)


def test_collectives_draw_hbm_energy_and_sm_dynamic_power():
    """``power.communication_energy``: a ring all-reduce of ``S`` bytes over ``n`` devices
    sends ``2 (n - 1)`` chunks of ``S / n`` from every device and receives as many, each read
    from HBM at the sender and written at the receiver, so it adds ``4 (n - 1) / n x S`` HBM
    bytes per device at the catalog's pJ/bit; its NCCL kernel's ``c`` SMs (catalog) draw
    ``c / U x activity`` of a GEMM's dynamic power for the all-reduce's duration. Nothing
    else changes: same iteration time, same compute-kernel energy."""
    scen, model, _, _, off = _ring_dp(False)
    _, _, ex, comm, on = _ring_dp(True)
    n = 4
    cat = yaml.safe_load(NCCL.read_text())
    ctas, act = cat["collective_ctas"]["value"], cat["collective_sm_activity"]["value"]
    units = scen.cluster.device.compute_units
    grad = sum(ins[2] for ins in model.programs[0] if ins[0] == DP_START)
    assert grad > 0
    dev = ex.accelerators[0].dev
    hbm_j = 4 * (n - 1) / n * grad * scen.cluster.device.hbm_pj_per_bit * 8e-12 * n
    dp = [c for c in comm if c[0] == "dp"]
    assert len(dp) == sum(1 for ins in model.programs[0] if ins[0] == DP_START)
    sm_j = sum(t1 - t0 for *_x, t0, t1 in dp) * ctas / units * act * dev.dyn_max_w * n
    assert hbm_j > 0 and sm_j > 0
    b_on, b_off = on["energy_breakdown_j"], off["energy_breakdown_j"]
    assert on["iteration_time_s"] == off["iteration_time_s"]
    assert b_on["memory"] - b_off["memory"] == pytest.approx(hbm_j, rel=1e-9)
    assert b_on["compute"] - b_off["compute"] == pytest.approx(sm_j, rel=1e-9)
    assert on["energy_j"] - off["energy_j"] == pytest.approx(hbm_j + sm_j, rel=1e-9)
    # the power segments carry it too (their integral is the devices' energy)
    seg = sum(float((s[:, 1] - s[:, 0]) @ s[:, 2]) * a.n
              for a in ex.accelerators for s in [a.power_segments()])
    assert seg == pytest.approx(on["energy_j"] - b_on["network"], rel=1e-9)


def _queue_latency_model(*sets: str):
    from devices.memory import build_memory_model

    scen = load_scenario(ROOT / "scenarios" / "quickstart.yaml").replace([
        "memory.model=queue", "memory.bound=auto", *sets])
    cl = scen.cluster
    return build_memory_model(scen.memory, cl.device, cl.link, cl.links_per_edge,
                              np.random.default_rng(0), bound="latency")


@pytest.mark.parametrize("sets,n,count", [
    ((), 128, 12),
    (("memory.service={dist: pareto, alpha: 1.5}",), 64, 200),
])
def test_fresh_latency_draws_in_blocks_are_independent_queues(sets, n, count):
    """Fresh latency draws made in blocks: the batches laid end to end on one time axis are
    each their own queue, so the batched slowdowns (one running sum and running minimum
    over all of them) equal the plain Lindley recursion (``lindley_reference``) run on each
    batch alone, to rounding; also for a Pareto 1.5 service, whose rare huge services make
    the running sum's magnitude, and so its rounding, largest."""
    from twin.kernel.queueing.engine import lindley_reference

    m = _queue_latency_model(*sets)
    gaps, services, ops = m.fresh_inputs(n, (2, 1), np.random.default_rng(5), count)
    got = m.solve_fresh(n, count, gaps, services, ops)
    times = np.cumsum(gaps)
    is_op = np.zeros(times.size, dtype=bool)
    is_op[ops] = True
    assert ops.size == n * count and ops[-1] == times.size - 1
    first = 0
    for b in range(count):
        last = int(ops[(b + 1) * n - 1])  # a batch ends at its n-th op point
        sel = slice(first, last + 1)
        first = last + 1
        t = times[sel] - times[sel][0]
        waits = np.asarray(lindley_reference(t, services[sel]))
        soj = (waits + services[sel])[is_op[sel]]
        assert is_op[sel].sum() == n
        assert got[b] == pytest.approx(soj.mean() / m.alone_sojourn_cached(n), rel=1e-9)


def test_compiled_sojourns_are_the_numpy_closed_form_to_the_bit():
    """``devices.lindley.op_sojourns`` (one compiled pass) gives the sojourns of the NumPy
    form of the closed-form Lindley recursion (difference array, ``cumsum``,
    ``minimum.accumulate``, gathers) exactly, on Pareto 1.5 batches laid end to end, and on
    arrivals whose ops are the first and the last point."""
    from devices.lindley import op_sojourns

    m = _queue_latency_model("memory.service={dist: pareto, alpha: 1.5}")
    gaps, services, ops = m.fresh_inputs(256, (3, 1), np.random.default_rng(9), 40)
    cases = [(gaps, services, ops),
             (gaps[:1000], services[:1000], np.array([0, 17, 999], dtype=np.int64))]
    for g, sv, o in cases:
        c = np.zeros(sv.size)
        np.cumsum(sv[:-1] - g[1:], out=c[1:])
        want = c[o] - np.minimum.accumulate(c)[o] + sv[o]
        np.testing.assert_array_equal(op_sojourns(g, sv, o), want)


@pytest.mark.parametrize("n", [64, 2048])
def test_fresh_latency_draws_in_blocks_have_the_single_draw_distribution(n):
    """Blocked draws have the law of one-at-a-time :meth:`fresh_latency` draws: a two-sample
    Kolmogorov-Smirnov test of 300 draws each does not reject at the 0.1% level, and the
    means agree within 4 combined standard errors."""
    from scipy import stats

    m = _queue_latency_model()
    g1, g2 = np.random.default_rng(11), np.random.default_rng(12)
    one = np.array([m.fresh_latency(n, (2, 0), g1) for _ in range(300)])
    many = np.concatenate([m.fresh_latencies(n, (2, 0), g2, 100) for _ in range(3)])
    assert stats.ks_2samp(one, many).pvalue > 1e-3
    se = math.hypot(one.std(ddof=1), many.std(ddof=1)) / math.sqrt(300)
    assert abs(one.mean() - many.mean()) < 4 * se


def test_a_repriced_block_draws_its_energy_over_its_stretched_duration():
    """Board power of a fluid block whose SM share changes part way (the all-gather beside it
    ends): its dynamic and HBM energy are the block's (math time at the top clock x P_dyn, and
    bytes x pJ/bit: neither depends on how long the SMs were shared), drawn over the block's
    actual duration ``d`` on top of the static power, so the segment's board power is
    ``eta^-1(E / d + P_base + P_leak)`` (thermal model off: leakage at its reference
    temperature; ``P_base`` and ``P_dyn`` solved from the catalog's idle and TDP figures)."""
    from tests.test_power_reference import ref_block_energy, ref_leak, ref_unknowns

    scen, model, ex, ops = _fsdp(["overlap.sm_contention=true", "power.thermal.enabled=false"])
    s = scen.cluster.device
    acc = ex.accelerators[0]
    base, dyn = ref_unknowns(s, acc.reg)
    v_top = max(s.p_states, key=lambda p: p[0])[1]
    p_static = base + ref_leak(s, v_top, s.leakage_ref_c)
    seg = acc.power_segments()
    names = acc.state_names()
    checked = 0
    for name, t0, t1, _g0, g1 in _beside_gather(ops):
        if not t0 < g1 < t1:
            continue                     # only blocks re-priced part way
        (row,) = [r for r in seg if r[0] == t0 and r[1] == t1 and names[int(r[3])] == name]
        _, e_dyn, e_hbm = ref_block_energy(s, model.blocks[0][name], dyn)
        d = t1 - t0
        want = acc.reg.input_power((e_dyn + e_hbm) / d + p_static)
        assert row[2] == pytest.approx(want, rel=1e-9)  # fractions of work sum to 1 - 1e-12
        checked += 1
    assert checked >= 4


def test_table_indices_are_the_generators_own_draws_across_refills():
    """``TableIndices`` (indices drawn ahead in blocks) gives what one ``integers`` call per
    draw on the same generator gives, for single and grouped draws that cross its block
    boundary; it refuses another bound (the draws would no longer be the same numbers)."""
    from devices.interference import TableIndices

    sizes = [None, 3, None, 8, 1, None, 5, 8, 8, None] * 7
    ref = np.random.default_rng(11)
    want = [int(ref.integers(32)) if n is None else ref.integers(32, size=n).tolist()
            for n in sizes]
    idx = TableIndices(np.random.default_rng(11), 32, block=7)
    got = [idx.integers(32) if n is None else list(idx.integers(32, size=n)) for n in sizes]
    assert got == want
    with pytest.raises(ValueError, match="below 32"):
        idx.integers(16)


def test_a_fluid_block_is_stretched_by_the_agents_slowdown():
    """A block on a device agent runs at its price stretched by what the agent's own clock
    does to durations: a straggler factor of 1.5 (``Accelerator.slowdown``; no jitter, and
    only blocks the power cap does not duty-cycle) stretches it by exactly 1.5."""
    _scen, model, ex, _ops = _fsdp(["overlap.sm_contention=true", "power.thermal.enabled=false"])
    acc = ex.accelerators[0]
    checked = 0
    for block in model.blocks[0].values():
        first = acc.streams.price_alone(acc, block, acc.ps)
        if first.duration_s <= 0:
            continue
        acc.slowdown = 1.0
        if acc._fluid_start(block, first)[2] != 1.0:
            continue  # duty-cycled down to the power cap
        acc.slowdown = 1.5
        assert acc._fluid_start(block, first)[2] == pytest.approx(1.5, rel=1e-12), block.name
        assert first.duration_s < 1.0
        checked += 1
    assert checked >= 4
