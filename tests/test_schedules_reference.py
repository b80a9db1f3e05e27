"""Pipeline programs run by a plain event-list reference, against the schedules' closed forms.

The reference below executes the per-stage programs of ``workloads.schedules.build_program``
with fixed block times (forward block ``A``, backward block ``2A``, recompute ``R``; embedding,
logits, collectives and sends free; a message is available to its receiver when sent). It knows
nothing of how the orders are built; it only follows the programs and their SEND/RECV tags, and
fails on a deadlock or an unmatched message. Its makespan is compared with the closed forms
(Huang et al. 2019 for GPipe, Narayanan et al. 2019/2021 for 1F1B and the interleaved
schedule): ``(m + p - 1)(t_f + t_b)`` for GPipe and 1F1B, ``m (t_f + t_b) + (p - 1)(t_f + t_b)/v``
interleaved, i.e. bubble fractions ``(p - 1)/(m + p - 1)`` and ``((p-1)/v)/(m + (p-1)/v)``.
All times are exact multiples of ``A``, so agreement is to rounding (rel 1e-12).
"""

from __future__ import annotations

from collections import Counter

import pytest

from workloads.schedules import (
    COMPUTE,
    DATA,
    DP_START,
    DP_WAIT,
    RECV,
    SEND,
    TP,
    StageWork,
    build_program,
    unit_order,
)

A = 1.0      # forward block (attention or MLP of one layer, one microbatch), s
R = 0.75     # recompute of one layer, s


def work(stage, pp, m, v=1, layers=2, tp=1, sp=False, recompute="none", load_input=False,
         bucket=1e9, embed=7.0, head=11.0):
    return StageWork(stage=stage, pp=pp, virtual=v, microbatches=m,
                     chunk_layers=tuple([layers] * v), tp=tp, sequence_parallel=sp,
                     recompute=recompute, activation_bytes=1000.0, layer_grad_bytes=100.0,
                     embed_grad_bytes=embed, head_grad_bytes=head, bucket_bytes=bucket,
                     load_input=load_input)


def block_time(name: str) -> float:
    return {"attn_fwd": A, "mlp_fwd": A, "attn_bwd": 2 * A, "mlp_bwd": 2 * A,
            "recompute": R}.get(name, 0.0)


def run_reference(programs: list[list[tuple]], pp: int) -> tuple[float, list[float]]:
    """Event-list execution of every stage's program; returns (end of the last backward
    block, busy seconds per stage)."""
    pos = [0] * pp
    clock = [0.0] * pp
    busy = [0.0] * pp
    # (receiving stage, sending stage, tag) -> time the message was sent; a RECV's direction
    # names its sender (-1: the previous stage, +1: the next), a SEND's its receiver
    sent: dict[tuple, float] = {}
    last_bwd = 0.0
    progress = True
    while progress:
        progress = False
        for s in range(pp):
            prog = programs[s]
            while pos[s] < len(prog):
                ins = prog[pos[s]]
                op = ins[0]
                if op == RECV:
                    key = (s, (s + ins[1]) % pp, ins[2])
                    if key not in sent:
                        break
                    clock[s] = max(clock[s], sent.pop(key))
                elif op == SEND:
                    dst = (s + ins[1]) % pp
                    key = (dst, s, ins[2])
                    assert key not in sent, f"message {key} sent twice"
                    sent[key] = clock[s]
                elif op == COMPUTE:
                    d = block_time(ins[1])
                    clock[s] += d
                    busy[s] += d
                    if ins[1] in ("attn_bwd", "mlp_bwd"):
                        last_bwd = max(last_bwd, clock[s])
                pos[s] += 1
                progress = True
    assert all(pos[s] == len(programs[s]) for s in range(pp)), f"deadlock at {pos}"
    assert not sent, f"messages never received: {sorted(sent)}"
    return last_bwd, busy


def programs(schedule, pp, m, v=1, **kw):
    return [build_program(work(s, pp, m, v, **kw), schedule) for s in range(pp)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 4), (3, 7), (4, 2), (1, 3)])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_makespan_is_the_closed_form(schedule, pp, m, recompute):
    layers = 2
    t_f = 2 * A * layers
    t_b = (4 * A + (R if recompute != "none" else 0.0)) * layers
    end, busy = run_reference(programs(schedule, pp, m, layers=layers, recompute=recompute), pp)
    assert end == pytest.approx((m + pp - 1) * (t_f + t_b), rel=1e-12)
    assert busy == pytest.approx([m * (t_f + t_b)] * pp, rel=1e-12)
    bubble = 1 - sum(busy) / pp / end
    assert bubble == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-12)


@pytest.mark.parametrize("pp, m, v", [(4, 8, 2), (4, 8, 4), (2, 4, 2), (4, 4, 2), (2, 6, 3)])
def test_interleaved_makespan_is_the_closed_form(pp, m, v):
    layers = 1  # per chunk
    t_f = 2 * A * layers * v    # forward of one microbatch over the stage's v chunks
    t_b = 4 * A * layers * v
    end, busy = run_reference(programs("interleaved", pp, m, v, layers=layers), pp)
    assert end == pytest.approx(m * (t_f + t_b) + (pp - 1) * (t_f + t_b) / v, rel=1e-12)
    assert busy == pytest.approx([m * (t_f + t_b)] * pp, rel=1e-12)


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_peak_microbatches_in_flight(schedule, v):
    """GPipe holds every microbatch's activations; 1F1B at most ``p - s`` on stage ``s``
    (Narayanan et al.); interleaved at most ``2(p - s - 1) + (v - 1) p + 1`` chunk-units."""
    pp, m = 4, 8
    for s in range(pp):
        live = peak = 0
        for kind, _c, _mb in unit_order(schedule, s, pp, m, v):
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        expect = {"gpipe": m * v, "1f1b": min(pp - s, m),
                  "interleaved": min(2 * (pp - s - 1) + (v - 1) * pp + 1, m * v)}[schedule]
        assert peak == expect


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_every_block_once_and_backward_in_reverse_layer_order(schedule, v):
    pp, m, layers = 4, 8, 3
    for s in range(pp):
        prog = build_program(work(s, pp, m, v, layers=layers), schedule)
        blocks = [(i[1], i[2], i[3], i[4]) for i in prog if i[0] == COMPUTE]
        count = Counter(blocks)
        for c in range(v):
            for mb in range(m):
                for lay in range(c * layers, (c + 1) * layers):
                    for blk in ("attn_fwd", "mlp_fwd", "mlp_bwd", "attn_bwd"):
                        assert count[(blk, mb, c, lay)] == 1
                bwd = [b[3] for b in blocks if b[0] == "attn_bwd" and b[1:3] == (mb, c)]
                assert bwd == sorted(bwd, reverse=True)
                # within a layer: forward attention before MLP, backward MLP before attention
                for lay in range(c * layers, (c + 1) * layers):
                    idx = {b: blocks.index((b, mb, c, lay)) for b in
                           ("attn_fwd", "mlp_fwd", "mlp_bwd", "attn_bwd")}
                    assert idx["attn_fwd"] < idx["mlp_fwd"] < idx["mlp_bwd"] < idx["attn_bwd"]
        ends = [b for b in blocks if b[0] in ("embed_fwd", "embed_bwd", "logits_fwd",
                                              "logits_bwd")]
        assert all(b[3] == -1 for b in ends)           # not a transformer layer
        first = {"embed_fwd": s == 0, "logits_fwd": s == pp - 1}
        for name, present in first.items():
            assert sum(1 for b in blocks if b[0] == name) == (m if present else 0)
        assert prog[-2] == (DP_WAIT,) and prog[-1] == (COMPUTE, "optimizer", -1, -1, -1)


@pytest.mark.parametrize("sp, recompute, per_layer", [
    (False, "none", {"allreduce": 4}),
    (False, "full", {"allreduce": 6}),
    (False, "selective", {"allreduce": 4}),
    (True, "none", {"allgather": 4, "reduce_scatter": 4}),
    (True, "full", {"allgather": 6, "reduce_scatter": 6}),
])
def test_tensor_parallel_collectives_per_layer(sp, recompute, per_layer):
    """Megatron-LM (Shoeybi 2019; Korthikanti 2022): without sequence parallelism 2 all-reduces
    per layer forward (after attention and MLP) and 2 backward; with it an all-gather before
    and a reduce-scatter after each block, both ways; full recompute repeats the forward's."""
    pp, m, layers = 2, 3, 2
    for s in range(pp):
        prog = build_program(work(s, pp, m, layers=layers, tp=4, sp=sp, recompute=recompute),
                             "1f1b")
        tps = [i for i in prog if i[0] == TP]
        assert Counter(i[1] for i in tps) == {k: n * m * layers for k, n in per_layer.items()}
        assert all(i[2] == 1000.0 for i in tps)
        sends = [i for i in prog if i[0] == SEND]
        assert all(i[3] == (1000.0 / 4 if sp else 1000.0) for i in sends)
        assert len(sends) == m * ((s < pp - 1) + (s > 0))
    assert not [i for i in build_program(work(0, 2, 3, tp=1), "1f1b") if i[0] == TP]


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("interleaved", 2), ("gpipe", 1)])
@pytest.mark.parametrize("bucket", [1.0, 250.0, 1e9])
def test_gradient_buckets_carry_every_gradient_once(schedule, v, bucket):
    """DP all-reduce buckets: the stage's layer gradients + the embedding's (first stage) +
    the untied head's (last stage), each bucket at least ``bucket_bytes`` except the last, all
    started during the last backward pass of their chunk (before DP_WAIT)."""
    pp, m, layers = 4, 8, 3
    for s in range(pp):
        prog = build_program(work(s, pp, m, v, layers=layers, bucket=bucket), schedule)
        dp = [i for i in prog if i[0] == DP_START]
        total = layers * v * 100.0 + (7.0 if s == 0 else 0.0) + (11.0 if s == pp - 1 else 0.0)
        assert sum(i[2] for i in dp) == pytest.approx(total)
        assert [i[1] for i in dp] == list(range(len(dp)))
        assert all(i[2] >= bucket for i in dp[:-1])
        if bucket >= 1e9:
            assert len(dp) == 1
        # a chunk's gradients are complete only in its final backward unit (the last B of
        # that chunk in the stage's order): no bucket starts before the earliest of those
        final = {}
        for kind, c, mb in unit_order(schedule, s, pp, m, v):
            if kind == "B":
                final[c] = mb
        starts = [min(k for k, i in enumerate(prog) if i[0] == COMPUTE and i[1] == "mlp_bwd"
                      and (i[2], i[3]) == (mb, c)) for c, mb in final.items()]
        assert all(prog.index(i) > min(starts) for i in dp)
        if v == 1:
            assert all(prog.index(i) > starts[0] for i in dp)
            assert final[0] == (0 if schedule == "gpipe" else m - 1)


def test_data_instructions_feed_the_first_stage():
    pp, m = 2, 4
    prog = build_program(work(0, pp, m, load_input=True), "1f1b")
    data = [k for k, i in enumerate(prog) if i[0] == DATA]
    assert [prog[k][1] for k in data] == list(range(m))
    assert all(prog[k + 1][:3] == (COMPUTE, "embed_fwd", prog[k][1]) for k in data)
    assert not [i for i in build_program(work(1, pp, m, load_input=True), "1f1b")
                if i[0] == DATA]


def test_interleaved_with_one_chunk_is_1f1b_and_tp2_has_collectives():
    for s in range(4):
        assert unit_order("interleaved", s, 4, 8, 1) == unit_order("1f1b", s, 4, 8, 1)
    prog = build_program(work(0, 2, 3, layers=2, tp=2), "1f1b")
    assert Counter(i[1] for i in prog if i[0] == TP) == {"allreduce": 4 * 3 * 2}


def test_stage_work_reads_no_input_by_default():
    w = StageWork(stage=0, pp=1, virtual=1, microbatches=2, chunk_layers=(1,), tp=1,
                  sequence_parallel=False, recompute="none", activation_bytes=1.0,
                  layer_grad_bytes=1.0, embed_grad_bytes=0.0, head_grad_bytes=0.0,
                  bucket_bytes=1.0)
    assert not w.load_input
    assert not [i for i in build_program(w, "1f1b") if i[0] == DATA]


def test_tiny_gradients_still_reach_a_bucket():
    w = StageWork(stage=0, pp=1, virtual=1, microbatches=2, chunk_layers=(3,), tp=1,
                  sequence_parallel=False, recompute="none", activation_bytes=1.0,
                  layer_grad_bytes=0.25, embed_grad_bytes=0.0, head_grad_bytes=0.0,
                  bucket_bytes=1e9)
    dp = [i for i in build_program(w, "1f1b") if i[0] == DP_START]
    assert [i[2] for i in dp] == [0.75]
