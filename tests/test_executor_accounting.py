"""The executor's bookkeeping (workloads.executor): streams that start also end, the seconds
it reports are the rows it writes, and the SMs communication energy is booked with.

References are independent of the code under test: conservation (every transfer and stream
the run starts has ended when it finishes, so every counter is back at zero), the ops rows
the executor writes for the same waits and streams (a report must equal the sum of the
intervals it stands for), the program's own microbatch numbers, and the SM shares of the
catalog file ``devices/catalog/interference/nccl.yaml`` (Transformer Engine's kernels for
overlapped TP chunks, NCCL's for every other collective and send).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import scenario_dict
from twin.build import build
from twin.kernel.records import Recorder
from twin.runner import simulate
from twin.scenario import load_scenario

NCCL = Path(__file__).resolve().parents[1] / "devices" / "catalog" / "interference" / "nccl.yaml"


class _Ops(Recorder):
    def __init__(self):
        super().__init__()
        self.rows: list[tuple] = []

    def op(self, cls, iteration, stream, kind, name, mb, chunk, layer, t0, t1, flops):
        self.rows.append((cls, iteration, stream, kind, name, mb, chunk, layer, t0, t1))


def _run(sets: list[str], **updates):
    d = scenario_dict(**updates)
    d["trace"] = {"enabled": False}
    model = build(load_scenario(d, sets))
    rec = _Ops()
    _env, _fab, ex, _ = simulate(model, rec)
    return model, ex, rec.rows


PP2 = dict(workload__parallelism={"dp": 4, "tp": 1, "pp": 2}, workload__global_batch=16)
TP2 = dict(workload__parallelism={"dp": 2, "tp": 2, "pp": 2}, workload__global_batch=8)
CASES = {
    "pipeline sends overlapped": ([], PP2),
    "pipeline sends waited for": (["overlap.pipeline=false"], PP2),
    "pipeline, exact (processes)": (["simulation.exact=true"], PP2),
    "serial data-parallel all-reduce": (["overlap.dp_buckets=false"], {}),
    "data-parallel buckets on two streams, SMs shared": (
        ["overlap.dp_streams=2", "overlap.sm_contention=true"], {}),
    "TP overlap, FR-FCFS, sequence parallel": (
        ["overlap.tp_comm=true", "memory.model=frfcfs", "memory.batches=4",
         "memory.requests_per_batch=256", "workload.sequence_parallel=true"], TP2),
    "TP overlap, exact": (["overlap.tp_comm=true", "simulation.exact=true"], TP2),
    "full_shard, SMs shared": (["workload.sharding.strategy=full_shard",
                                "overlap.sm_contention=true"], {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_stream_started_has_ended(case):
    sets, updates = CASES[case]
    _model, ex, rows = _run(sets, **updates)
    assert rows
    if ex.streams is not None:
        assert all(s.mix == (0, 0) and s._sm == 0 for s in ex.streams), case
    else:
        assert not any("sm_contention" in s or "frfcfs" in s for s in sets)


@pytest.mark.parametrize("sets", [["overlap.pipeline=false"], []])
def test_pipeline_wait_is_its_rows_and_names_the_microbatch(sets):
    """pp 2, 4 microbatches per rank: the seconds a class waited for pipeline sends and
    receives are the durations of its send_wait and recv rows, and those rows name
    microbatches 0-3 (the program's), in chunk 0; a send_wait row names its direction: stage
    0 only sends activations forward (F), stage 1 only gradients back (B). The model's tied
    embeddings add the two ends' exchange of their gradient (E, after its empty "ready"
    message ER): no microbatch, no chunk."""
    model, ex, rows = _run(sets, **PP2)
    waited = set()
    for c, st in enumerate(ex.stats):
        mine = [r for r in rows if r[0] == c and r[3] in ("send_wait", "recv")]
        assert st.recv_s == pytest.approx(sum(r[9] - r[8] for r in mine), rel=1e-12, abs=1e-15)
        pipe = [r for r in mine if r[4] in ("F", "B")]
        assert all(r[6] == 0 and r[7] == -1 for r in pipe)
        assert all(r[4] in ("E", "ER") and r[5:8] == (-1, -1, -1)
                   for r in mine if r not in pipe)
        waited |= {r[5] for r in pipe if r[3] == "send_wait"}
        if sets:
            sent = {r[4] for r in mine if r[3] == "send_wait"}
            assert sent == {"F" if model.layout.class_stage[c] == 0 else "B", "E", "ER"}
    if sets:                                   # the sender waits for every delivery
        assert waited == set(range(model.microbatches))
    assert sum(st.recv_s for st in ex.stats) > 0


def test_sharding_stream_time_and_waits_are_their_rows():
    _model, ex, rows = _run(["workload.sharding.strategy=hybrid_shard",
                             "workload.sharding.group=4"])
    for c, st in enumerate(ex.stats):
        comm = [r for r in rows if r[0] == c and r[2] == "comm" and r[3] in ("shard", "replica")]
        assert st.shard_stream_s == pytest.approx(sum(r[9] - r[8] for r in comm), rel=1e-12)
        waits = [r for r in rows if r[0] == c and r[3] == "shard_wait"]
        assert st.shard_wait_s == pytest.approx(sum(r[9] - r[8] for r in waits), rel=1e-12,
                                                abs=1e-15)
        assert all(r[6] == -1 and r[7] == -1 for r in waits)
    assert sum(st.shard_stream_s for st in ex.stats) > 0


@pytest.mark.parametrize("sets", [[], ["simulation.exact=true"]])
@pytest.mark.parametrize("overlap", [True, False])
def test_communication_energy_books_each_kernels_sms(monkeypatch, sets, overlap):
    """With ``power.communication_energy``, each finished collective or send books its
    kernel's SMs on the devices: overlapped TP chunks hold Transformer Engine's
    ``tp_overlap_ctas``, every other collective (blocking TP included) NCCL's
    ``collective_ctas``; chained runs and processes (exact mode) alike."""
    from devices.accelerator import Accelerator

    ctas = {k: v["value"] for k, v in yaml.safe_load(NCCL.read_text()).items()
            if isinstance(v, dict) and "value" in v}
    assert ctas["tp_overlap_ctas"] != ctas["collective_ctas"]
    booked: list[int] = []
    orig = Accelerator.communication

    def spy(self, t0, t1, hbm_bytes, sms, activity):
        booked.append(sms)
        return orig(self, t0, t1, hbm_bytes, sms, activity)

    monkeypatch.setattr(Accelerator, "communication", spy)
    _run(["power.communication_energy=true", f"overlap.tp_comm={str(overlap).lower()}",
          "workload.sequence_parallel=true", *sets],
         workload__parallelism={"dp": 1, "tp": 4, "pp": 2}, workload__global_batch=4)
    want = ctas["tp_overlap_ctas"] if overlap else ctas["collective_ctas"]
    assert booked and set(booked) == {want, ctas["collective_ctas"]}
    assert booked.count(want) > booked.count(ctas["collective_ctas"]) or not overlap


@pytest.mark.parametrize("sp", [False, True])
def test_a_block_after_an_overlapped_one_waits_for_its_last_chunk(sp):
    """Chunked TP overlap (3 chunks): the next layer consumes the reduced output, so no
    compute block starts before the last chunk of the previous block's all-reduce (or
    reduce-scatter) has ended."""
    n = 3
    _model, _ex, rows = _run(["overlap.tp_comm=true", f"overlap.tp_chunks={n}",
                              f"workload.sequence_parallel={str(sp).lower()}"], **TP2)
    tp_rows = [r for r in rows if r[2] == "comm" and r[3] == "tp"]
    assert {r[5] for r in tp_rows} == set(range(n))       # the chunk index, in the mb column
    assert all(r[6] == -1 and r[7] == -1 for r in tp_rows)
    checked = 0
    for c in {r[0] for r in rows}:
        mine = [r for r in rows if r[0] == c]
        starts = sorted(r[8] for r in mine if r[2] == "compute" and r[3] == "compute")
        for r in mine:
            if r[2] == "comm" and r[3] == "tp" and r[4] in ("allreduce", "reduce_scatter") \
                    and r[5] == n - 1:
                later = [t for t in starts if t >= r[8]]
                if later:
                    assert later[0] >= r[9] * (1 - 1e-12), (c, r)
                    checked += 1
    assert checked > 10


def test_concurrent_buckets_of_a_straggling_group_are_matched_by_sequence():
    """Symmetry off (every rank its own class), two data-parallel streams, rank 3 computing
    1.5x slower from the start: buckets b and b+1 of the fast ranks are in flight together
    while rank 3 has not issued b. A bucket's all-reduce is one collective of all 8 ranks, so
    it ends at one instant for all of them, never before the straggler has issued it."""
    _model, _ex, rows = _run(["overlap.dp_streams=2", "simulation.symmetry=false"],
                            faults=[{"kind": "straggler", "device": 3, "factor": 1.5,
                                     "time_s": 0.0}])
    dp = [r for r in rows if r[2] == "comm" and r[3] == "dp"]
    buckets = sorted({r[5] for r in dp})
    assert len(buckets) >= 2 and len({r[0] for r in dp}) == 8
    for b in buckets:
        mine = [r for r in dp if r[5] == b]
        assert len(mine) == 8
        ends = [r[9] for r in mine]
        assert max(ends) - min(ends) <= 1e-12 * max(ends), b
        slow = [r for r in mine if r[0] == 3]
        assert min(ends) >= max(r[8] for r in slow)


def test_a_failure_inside_a_block_lets_the_block_finish(tmp_path):
    """abort(): an agent inside a compute block is not interrupted; it finishes the block
    (its row ends where it ends in the run without the failure) and leaves."""
    from tests.test_faults import JOB, _scen
    from tests.test_faults import _run as run_fault
    from twin.trace import read_table

    cool = {"thermal": {"enabled": False}}
    clean = run_fault(_scen(tmp_path, job=JOB, trace=True, workload__iterations=3, power=cool))
    ops = read_table(clean.trace_path, "ops")
    comp = ops[(ops.stream == "compute") & (ops.kind == "compute") & (ops.iteration == 1)]
    row = comp.loc[(comp.t_end - comp.t_start).idxmax()]      # the longest block
    t_f = 0.5 * (row.t_start + row.t_end)
    fail = {"kind": "accelerator_failure", "device": 5, "time_s": float(t_f)}
    res = run_fault(_scen(tmp_path, job=JOB, faults=[fail], trace=True,
                          workload__iterations=3, power=cool))
    assert res.summary["restarts"] == 1
    got = read_table(res.trace_path, "ops")
    spans = got[(got.stream == "compute") & (got.kind == "compute") & (got.t_start < t_f)
                & (got.t_end > t_f)]
    assert len(spans) >= 1
    assert spans.t_end.max() == pytest.approx(row.t_end, rel=1e-12)


@pytest.mark.parametrize("sets", [["overlap.tp_comm=true", "workload.sharding.strategy=zero2"],
                                  ["overlap.dp_buckets=false"]])
def test_ops_flops_add_up_to_the_executed_flops(tmp_path, sets):
    """The ops table's FLOPs column (per device) weighted by the devices each class stands
    for is the run's executed FLOPs; communication rows (overlapped or serial all-reduces,
    sharding, TP chunks) carry none."""
    from twin.build import class_sizes
    from twin.runner import run
    from twin.trace import read_table

    d = scenario_dict(**TP2)
    d["trace"] = {"path": str(tmp_path / "f.h5"), "tables": ["ops"]}
    scen = load_scenario(d, sets)
    res = run(scen)
    ops = read_table(res.trace_path, "ops")
    comm = ops.loc[ops.stream == "comm"]
    assert len(comm) and (comm.flops == 0.0).all()
    # the compute stream's waits for TP (blocking collectives, or the last chunk of an
    # overlapped block) carry no FLOPs and no microbatch, chunk or layer either
    tp = ops.loc[(ops.stream == "compute") & (ops.kind == "tp")]
    assert len(tp) and (tp.flops == 0.0).all()
    assert ((tp.mb == -1) & (tp.chunk == -1) & (tp.layer == -1)).all()
    if sets == ["overlap.dp_buckets=false"]:
        assert (comm.kind == "dp").any()
    sizes = class_sizes(build(scen))
    total = float((ops.flops * ops.cls.map(lambda c: sizes[int(c)])).sum())
    s = res.summary
    assert total == pytest.approx(s["executed_flops_per_iteration"] * s["iterations"],
                                  rel=1e-9)


@pytest.mark.parametrize("sets", [[], ["overlap.dp_buckets=false"],
                                  ["workload.sharding.strategy=zero2"]])
def test_data_parallel_wait_is_its_rows(sets):
    """The seconds a class's compute stream waited at the end of its backward for gradient
    collectives are its dp_wait rows (mb, chunk, layer -1); reduce-scatter rows carry no
    bucket number (mb -1)."""
    _model, ex, rows = _run(sets)
    for c, st in enumerate(ex.stats):
        waits = [r for r in rows if r[0] == c and r[3] == "dp_wait"]
        assert st.dp_wait_s == pytest.approx(sum(r[9] - r[8] for r in waits), rel=1e-12,
                                             abs=1e-15)
        assert all(r[5:8] == (-1, -1, -1) for r in waits)
        dp = [r for r in rows if r[0] == c and r[2] == "comm" and r[3] == "dp"]
        rs = [r for r in rows if r[0] == c and r[4] == "reduce_scatter"]
        sharded = bool(sets and "zero2" in sets[0])
        assert all(r[6:8] == (-1, -1) for r in dp) and bool(dp) != sharded
        assert all(r[5] == -1 for r in rs) and bool(rs) == sharded
    assert sum(st.dp_wait_s for st in ex.stats) > 0


@pytest.mark.parametrize("sets", [[], ["simulation.exact=true"]])
def test_tp_and_replica_rows_carry_no_microbatch_and_sends_are_named_by_direction(sets):
    """A blocking TP collective's row on the compute stream has no microbatch, chunk or layer
    (-1); hybrid sharding's all-reduce across shard groups has no bucket (mb -1); a forward
    send (activations, stage s to s + 1) is named ``p2p_fwd`` in the messages table and a
    backward one (gradients, s + 1 to s) ``p2p_bwd``, the ends' exchange of a tied
    embedding's gradient ``p2p_embed``: chained sends (fast mode) and sends in processes
    (exact mode) alike."""

    d = scenario_dict(workload__parallelism={"dp": 2, "tp": 2, "pp": 2},
                      workload__global_batch=8)
    d["trace"] = {"enabled": False}
    model = build(load_scenario(d, ["workload.sharding.strategy=hybrid_shard",
                                    "workload.sharding.group=1", *sets]))
    rec, messages = _Ops(), []
    simulate(model, rec, message_sink=messages.append)
    tp = [r for r in rec.rows if r[2] == "compute" and r[3] == "tp"]
    replica = [r for r in rec.rows if r[3] == "replica"]
    assert tp and all(r[5:8] == (-1, -1, -1) for r in tp)
    assert {r[4] for r in tp} == {"allreduce"}  # Megatron's TP all-reduces (no sequence par.)
    assert replica and all(r[5:8] == (-1, -1, -1) for r in replica)
    lay = model.layout
    stage_of = {int(dev): int(lay.class_stage[lay.rank_class[r]])
                for r, dev in enumerate(lay.device)}
    sends = [m for m in messages if m.name.startswith("p2p")]
    # the model's tied embeddings: the two ends also exchange its gradient (``p2p_embed``)
    assert {m.name for m in sends} == {"p2p_fwd", "p2p_bwd", "p2p_embed"}
    # each pair's bytes: a microbatch's activations (or their gradient), micro x seq x
    # hidden at 2 bytes (bf16, no sequence parallelism: every TP rank sends them whole);
    # the embedding's gradient, vocab x hidden / tp at 2 bytes, after an empty "ready"
    act = 1 * 512 * 2048 * 2.0
    embed = 128256 * 2048 / 2 * 2.0
    for m in sends:
        if m.name == "p2p_embed":
            assert {stage_of[m.src], stage_of[m.dst]} == {0, 1}, m
            assert m.bytes in (0.0, m.n_pairs * embed), m
            continue
        step = stage_of[m.dst] - stage_of[m.src]
        assert step == (1 if m.name == "p2p_fwd" else -1), m
        assert m.bytes == m.n_pairs * act, m
    assert any(m.bytes > 0 for m in sends if m.name == "p2p_embed")


def test_only_tp_collectives_are_costed_in_closed_form():
    """Closed forms stand in for TP collectives whose links nothing else uses; a data-parallel
    all-reduce of the same class is a flow-engine transfer (its ring shares links with
    pipeline sends and other rings): the count of closed-form collectives is the count of
    TP instructions the classes executed."""
    from workloads.schedules import TP

    model, ex, _rows = _run([], cluster={
        "topology": {"kind": "switched", "shape": [8, 4], "nodes_per_leaf": 2},
        "device": "h100-sxm", "link": "nvlink4-switch", "links_per_edge": 18,
        "nic_link": "ib-ndr400-port"},  # TP groups of 8 inside a node, DP across nodes
        workload__parallelism={"dp": 2, "tp": 8, "pp": 2}, workload__global_batch=8)
    n_tp = sum(sum(1 for ins in ex.programs[int(model.layout.class_stage[c])] if ins[0] == TP)
               for c in range(len(ex.stats))) * model.scenario.workload.iterations
    assert n_tp > 0 and ex.closed_form_collectives == n_tp


@pytest.mark.parametrize("n,sp", [(2, False), (3, False), (4, False), (2, True), (3, True)])
def test_chunked_tp_overlap_executes_the_blocks_work_once(n, sp):
    """Cutting each overlapped block into ``n`` chunks (``overlap.tp_chunks``) divides every
    kernel's FLOPs and bytes by ``n`` and runs ``n`` of them, and its collectives likewise: the
    executed FLOPs and the bytes sent per iteration are those of the run without overlap
    (with and without sequence parallelism)."""
    from twin.runner import run

    def work(sets):
        d = scenario_dict(**TP2)
        d["trace"] = {"enabled": False}
        s = run(load_scenario(d, [*sets, f"workload.sequence_parallel={str(sp).lower()}"]))
        return s.summary["executed_flops_per_iteration"], s.summary["bytes_sent"]

    base = work(["overlap.tp_comm=false"])
    assert base[0] > 0 and base[1] > 0
    assert work(["overlap.tp_comm=true", f"overlap.tp_chunks={n}"]) == pytest.approx(
        base, rel=1e-12)


def test_with_sequence_parallelism_every_tp_collective_beside_a_block_is_chunked():
    """TP overlap with sequence parallelism: every block sits between an all-gather and a
    reduce-scatter, both fused with it (``workloads.overlap.fuse_tp``), so each TP collective
    is 2 chunks on the communication stream (their index in the mb column) and one row on the
    compute stream (the part it waits for: the first all-gather chunk, the last
    reduce-scatter chunk); a collective left blocking would add a compute-stream row without
    chunks."""
    from collections import Counter

    _model, _ex, rows = _run(["overlap.tp_comm=true", "overlap.tp_chunks=2",
                              "workload.sequence_parallel=true"], **TP2)
    tp_rows = [r for r in rows if r[3] == "tp"]
    assert all(r[5] in (0, 1) for r in tp_rows if r[2] == "comm")
    n = Counter((r[2], r[4]) for r in tp_rows)
    for kind in ("allgather", "reduce_scatter"):
        assert n[("compute", kind)] > 0 and n[("comm", kind)] == 2 * n[("compute", kind)], kind


def test_the_tp_stream_runs_jobs_in_order_and_fires_each_after_the_next_started():
    """``workloads.overlap.Fifo``: three 1 s jobs submitted at 0 start at 0, 1 and 2 s; a
    waiter on the first resumes at 1 s seeing the second started; a job nobody waits on when
    it ends is processed then, without an event of its own (a waiter that comes later goes
    on at once), and the run takes one timeout per job, the waiters' own events and nothing
    else; a stream whose epoch ended starts nothing more."""
    from twin.kernel.engine import Engine
    from workloads.overlap import Fifo

    env = Engine()
    started: list[tuple[float, int]] = []
    alive = [True]

    def job(i):
        started.append((env.now, i))
        return env.timeout(1.0)

    fifo = Fifo(env, lambda: alive[0])
    done = [fifo.submit(job, i) for i in range(3)]
    seen: list[tuple[float, list]] = []

    def waiter(ev, at):
        yield env.timeout(at)
        yield ev
        seen.append((env.now, list(started)))

    env.process(waiter(done[0], 0.0))
    env.process(waiter(done[1], 2.5))  # ended at 2 s, nobody waiting then
    env.run()
    assert started == [(0.0, 0), (1.0, 1), (2.0, 2)]
    assert seen == [(1.0, [(0.0, 0), (1.0, 1)]), (2.5, started)]
    assert done[1].processed and done[2].processed
    # 3 jobs' timeouts; per waiter: start, its timeout, end; done[0]'s resume of the first
    assert env.events_processed == 3 + 2 * 3 + 1
    alive[0] = False
    late = fifo.submit(job, 3)
    env.run()
    assert started[-1] == (2.0, 2) and not late.triggered


def test_fuse_tp_fuses_each_block_with_its_adjacent_collectives_and_keeps_the_rest():
    """``workloads.overlap.fuse_tp`` on a program written by hand: a receive first, an
    all-gather + block + reduce-scatter run (fused with both sides), a block with only an
    all-reduce after it, a block with only an all-gather before it, a block alone, a TP
    collective between two blocks that belongs to neither side (kept blocking), and the
    optimizer (never fused), against the expected program written out."""
    from workloads.overlap import TPO, fuse_tp
    from workloads.schedules import COMPUTE, RECV, SEND, TP

    prog = [(RECV, 0, 0), (TP, "allgather", 8.0), (COMPUTE, "attn_fwd", 0, 0, 3),
            (TP, "reduce_scatter", 8.0), (COMPUTE, "mlp_fwd", 0, 0, 3), (TP, "allreduce", 4.0),
            (TP, "allgather", 2.0), (COMPUTE, "attn_bwd", 1, 0, 3), (SEND, 1, 0),
            (COMPUTE, "embed_fwd", 1, 0, -1), (TP, "allreduce", 1.0), (TP, "allgather", 6.0),
            (SEND, 2, 0), (TP, "allgather", 5.0), (COMPUTE, "optimizer", -1, -1, -1)]
    assert fuse_tp(prog) == [
        (RECV, 0, 0),
        (TPO, "attn_fwd", 0, 0, 3, ("allgather", 8.0), ("reduce_scatter", 8.0)),
        (TPO, "mlp_fwd", 0, 0, 3, None, ("allreduce", 4.0)),
        (TPO, "attn_bwd", 1, 0, 3, ("allgather", 2.0), None),
        (SEND, 1, 0),
        (TPO, "embed_fwd", 1, 0, -1, None, ("allreduce", 1.0)),
        (TP, "allgather", 6.0), (SEND, 2, 0), (TP, "allgather", 5.0),
        (COMPUTE, "optimizer", -1, -1, -1)]
    assert fuse_tp([(COMPUTE, "mlp_bwd", 2, 0, 1)]) == [(COMPUTE, "mlp_bwd", 2, 0, 1)]
