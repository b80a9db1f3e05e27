"""Sharded data parallelism (ZeRO 1-3, FSDP) against the ZeRO paper's accounting.

References derived here, not taken from the code under test: parameter counts from the model
dimensions; memory per device from Rajbhandari et al. 2020 (ZeRO, sec. 5 and Fig. 1: with
mixed-precision Adam a parameter costs 2 bytes of fp16 weight, 2 of gradient and K = 12 of
optimizer state, and stage k divides the first k of {states, gradients, weights} by N);
communication volume from sec. 7 (all-reduce = reduce-scatter + all-gather, 2 Psi per step;
ZeRO-3 adds the second all-gather, 3 Psi), with the ring's (N-1)/N per rank; the prefetch
overlap from a timeline worked out by hand from the alpha-beta cost of each all-gather.
"""

from __future__ import annotations

import pytest

from tests.conftest import DEVICE_TIME_KEYS, scenario_dict
from twin.build import build
from twin.cli import main
from twin.runner import run
from twin.scenario import load_scenario
from twin.trace import read_table

H, HEADS, KV, FFN, VOCAB, LAYERS = 512, 8, 2, 1024, 4096, 4
MODEL = {"name": "shardling", "arch": "llama", "layers": LAYERS, "hidden": H, "heads": HEADS,
         "kv_heads": KV, "ffn_hidden": FFN, "vocab": VOCAB, "seq_len": 256}
K_ADAM = 12.0  # fp32 master weight + momentum + variance (ZeRO sec. 3.1)


def layer_params() -> int:
    """q and o (h x h), k and v (h x kv*d), SwiGLU (3 h x f), two RMSNorm weights."""
    d = H // HEADS
    return 2 * H * H + 2 * H * KV * d + 3 * H * FFN + 2 * H


PSI = LAYERS * layer_params() + VOCAB * H + (VOCAB * H + H)  # + embedding + head and final norm
UNIT = max(layer_params(), VOCAB * H, VOCAB * H + H)          # largest gathered unit


def scen(tmp_path, strategy, microbatches=1, dp=8, group=None, prefetch=True, **extra):
    """dp ranks on a torus of 4 x 2 (ring collectives), one stage, no TP."""
    sharding = {"strategy": strategy, "prefetch": prefetch}
    if group is not None:
        sharding["group"] = group
    d = scenario_dict(workload__model=MODEL, workload__seq_len=256,
                      workload__global_batch=dp * microbatches, workload__micro_batch=1,
                      workload__parallelism={"dp": dp, "tp": 1, "pp": 1},
                      workload__sharding=sharding, workload__activation_memory="korthikanti",
                      network={"dp_algorithm": "ring"}, **extra)
    d["trace"] = {"path": str(tmp_path / f"{strategy}{microbatches}.h5"),
                  "tables": ["ops", "messages"]}
    return load_scenario(d)


# closed forms of the ZeRO paper (bytes per device of the model states), N shards
def zero_states(strategy: str, n: int) -> float:
    w, g, k = 2.0 * PSI, 2.0 * PSI, K_ADAM * PSI
    return {"none": w + g + k, "zero1": w + g + k / n, "zero2": w + (g + k) / n,
            "zero3": (w + g + k) / n, "full_shard": (w + g + k) / n,
            "shard_grad_op": w + (g + k) / n, "hybrid_shard": (w + g + k) / n}[strategy]


def buffers(strategy: str, prefetch: bool = True, bucket: float = 25e6) -> float:
    """Communication buffers: FULL_SHARD holds the gathered unit and the prefetched next one
    (2 bytes each) and two unsharded unit gradients awaiting their reduce-scatter; SHARD_GRAD_OP
    only the gradients (its weights are whole anyway); ZeRO-2 two gradient buckets."""
    if strategy in ("zero3", "full_shard", "hybrid_shard"):
        return (2 if prefetch else 1) * 2.0 * UNIT + 2 * 2.0 * UNIT
    if strategy == "shard_grad_op":
        return 2 * 2.0 * UNIT
    if strategy == "zero2":
        return 2 * min(2.0 * PSI, bucket + 2.0 * UNIT)
    return 0.0


def activations(s=256, b=1) -> float:
    """Korthikanti et al. 2022 without TP (the scenario asks for ``activation_memory:
    korthikanti``): 34 s b h bytes per layer (flash attention: no 5as/h), one microbatch in
    flight, and the fp32 logits 4 s b V."""
    return LAYERS * 34.0 * s * b * H + 4.0 * s * b * VOCAB


@pytest.mark.parametrize("strategy,group", [
    ("none", None), ("zero1", None), ("zero2", None), ("zero3", None), ("full_shard", None),
    ("shard_grad_op", None), ("hybrid_shard", 4)])
def test_memory_per_device_is_the_zero_closed_form(tmp_path, strategy, group):
    n = group or 8
    mem = build(scen(tmp_path, strategy, group=group)).stage_memory[0]
    expected = zero_states(strategy, n) + activations() + buffers(strategy)
    print(f"{strategy}: {mem.total / 1e6:.2f} MB (closed form {expected / 1e6:.2f} MB)")
    assert mem.total == pytest.approx(expected, rel=1e-9)
    if strategy in ("zero3", "full_shard"):  # the form: (2 + 2 + 12) Psi / N + acts
        assert mem.total - mem.buffers == pytest.approx(16.0 * PSI / 8 + activations(), rel=1e-9)


def test_zero2_buckets_smaller_than_the_gradients_bound_its_buffers(tmp_path):
    """4 MB buckets (`workload.grad_bucket_mb`, in 10^6 bytes): two buckets of at most 4 MB
    plus one unit's gradient each, not the whole 2 Psi."""
    s = scen(tmp_path, "zero2")
    mem = build(load_scenario(s.model_dump(mode="json"),
                              ["workload.grad_bucket_mb=4"])).stage_memory[0]
    assert 2 * (4e6 + 2.0 * UNIT) < 2 * 2.0 * PSI
    assert mem.total == pytest.approx(zero_states("zero2", 8) + activations()
                                      + buffers("zero2", bucket=4e6), rel=1e-9)


def test_prefetch_off_holds_one_gathered_unit_less(tmp_path):
    on = build(scen(tmp_path, "full_shard")).stage_memory[0]
    off = build(scen(tmp_path, "full_shard", prefetch=False)).stage_memory[0]
    assert on.total - off.total == pytest.approx(2.0 * UNIT, rel=1e-9)


def _sent_per_device(res, tmp_path, prefix: str | None = None) -> float:
    """Bytes the fabric carried, per device: from the fabric's own counter, or from the
    ``messages`` table's phases whose name starts with ``prefix``."""
    if prefix is None:
        return res.summary["bytes_sent"] / res.summary["devices"]
    msg = read_table(res.trace_path, "messages")
    return float(msg.loc[msg["name"].astype(str).str.startswith(prefix), "bytes"].sum()) / 8


# ZeRO sec. 7: volume in units of the parameter bytes 2 Psi, per step of m microbatches
VOLUME = {"none": lambda m: 2, "zero1": lambda m: 2, "zero2": lambda m: m + 1,
          "zero3": lambda m: 3 * m, "full_shard": lambda m: 3 * m,
          "shard_grad_op": lambda m: m + 1}


@pytest.mark.parametrize("strategy,m", [(s, 1) for s in VOLUME] + [
    ("zero2", 2), ("full_shard", 2), ("shard_grad_op", 2)])
def test_communication_volume_over_the_fabric(tmp_path, strategy, m):
    """Ring collectives over N = 8: each rank sends (N-1)/N of the buffer per all-gather or
    reduce-scatter, twice that per all-reduce (DDP)."""
    res = run(scen(tmp_path, strategy, microbatches=m))
    expected = VOLUME[strategy](m) * 2.0 * PSI * 7 / 8
    sent = _sent_per_device(res, tmp_path)
    print(f"{strategy} m={m}: {sent / 1e6:.3f} MB per device, ZeRO: {expected / 1e6:.3f} MB")
    assert sent == pytest.approx(expected, rel=0.01)
    if strategy != "none":
        assert _sent_per_device(res, tmp_path, "shard_") == pytest.approx(sent, rel=1e-12)


def test_zero2_buckets_fill_in_backward_order_and_flush_at_each_microbatch(tmp_path):
    """DDP's bucketing, by hand: gradients arrive in backward order (head, L3 .. L0,
    embedding), 2 bytes a parameter; a bucket is reduce-scattered once it holds at least
    `grad_bucket_mb`, and whatever is left when a microbatch's backward ends goes too. With
    14 MB buckets: head + L3 + L2 (13.1 MB) is short, + L1 (17.6 MB) goes; L0 + embedding
    (8.7 MB) goes at the end. Two microbatches: that pair twice. A ring reduce-scatter of n
    bytes over 8 ranks moves 7 n in all."""
    s = scen(tmp_path, "zero2", microbatches=2)
    res = run(load_scenario(s.model_dump(mode="json"), ["workload.grad_bucket_mb=14"]))
    layer, emb, head = 2.0 * layer_params(), 2.0 * VOCAB * H, 2.0 * (VOCAB * H + H)
    assert head + 2 * layer < 14e6 <= head + 3 * layer      # the cut worked out above
    msg = read_table(res.trace_path, "messages")
    rs = msg[msg["name"] == "shard_reduce_scatter"].sort_values("t_start")
    assert list(rs["bytes"] / 7) == pytest.approx([head + 3 * layer, layer + emb] * 2,
                                                  rel=1e-12)


def test_ddp_buckets_fill_in_backward_order(tmp_path):
    """Plain data parallelism's gradient buckets, by hand: 2-byte gradients arrive in
    backward order (head, L3 .. L0, embedding) and a bucket is all-reduced once it holds at
    least `grad_bucket_mb` (10^6 bytes): with 6 MB, head + L3, L2 + L1, L0 + embedding. A
    ring all-reduce of n bytes over 8 ranks moves 2 x 7 n in all."""
    s = scen(tmp_path, "none")
    res = run(load_scenario(s.model_dump(mode="json"), ["workload.grad_bucket_mb=6"]))
    layer, emb, head = 2.0 * layer_params(), 2.0 * VOCAB * H, 2.0 * (VOCAB * H + H)
    assert max(head, layer, emb) < 6e6 <= min(head + layer, 2 * layer, layer + emb)
    msg = read_table(res.trace_path, "messages")
    ar = msg[msg["name"] == "dp_allreduce"].sort_values("t_start")
    assert list(ar["bytes"] / 14) == pytest.approx([head + layer, 2 * layer, layer + emb],
                                                   rel=1e-12)


def test_full_shard_volume_with_pipeline_stages_of_one_layer(tmp_path):
    """pp 4 over the 4 layers (stage 1 and 2 hold one layer each, so in 1F1B's warm-up
    their forward passes of successive microbatches follow each other), dp 2, 4
    microbatches: every unit is still gathered in forward and in backward and reduce-
    scattered once per microbatch, 3 m x its 2-byte parameters; a ring over 2 ranks moves
    half of each buffer per rank, so over all 8 devices 2 x 3 m x 2 Psi / 2."""
    m = 4
    d = scenario_dict(workload__model=MODEL, workload__seq_len=256,
                      workload__global_batch=2 * m, workload__micro_batch=1,
                      workload__parallelism={"dp": 2, "tp": 1, "pp": 4},
                      workload__sharding={"strategy": "full_shard"},
                      network={"dp_algorithm": "ring"})
    d["trace"] = {"path": str(tmp_path / "pp4.h5"), "tables": ["messages"]}
    res = run(load_scenario(d))
    msg = read_table(res.trace_path, "messages")
    shard = float(msg.loc[msg["name"].astype(str).str.startswith("shard_"), "bytes"].sum())
    assert shard == pytest.approx(2 * 3 * m * 2.0 * PSI / 2, rel=1e-9)


def test_hybrid_shard_volume_inside_and_across_groups(tmp_path):
    """Groups of g = 4 of dp = 8: inside a group the FSDP 3 x 2 Psi (g-1)/g; across the two
    groups an all-reduce of each 1/g gradient shard: 2 (r-1)/r x 2 Psi / g, r = 2."""
    g, r = 4, 2
    res = run(scen(tmp_path, "hybrid_shard", group=g))
    inside = _sent_per_device(res, tmp_path, "shard_")
    across = _sent_per_device(res, tmp_path, "replica_")
    assert inside == pytest.approx(3 * 2.0 * PSI * (g - 1) / g, rel=0.01)
    assert across == pytest.approx(2 * (r - 1) / r * 2.0 * PSI / g, rel=0.01)
    assert _sent_per_device(res, tmp_path) == pytest.approx(inside + across, rel=1e-9)


def test_optimizer_steps_on_the_shard(tmp_path):
    """The optimizer block reads and writes the states of Psi / N parameters."""
    full = build(scen(tmp_path, "none")).blocks[0]["optimizer"]
    for strategy, n in (("zero1", 8), ("full_shard", 8), ("hybrid_shard", 4)):
        part = build(scen(tmp_path, strategy, group=4 if n == 4 else None)).blocks[0]
        assert part["optimizer"].bytes == pytest.approx(full.bytes / n, rel=1e-12)


# ----------------------------------------------------------------------------- prefetch
BIG = {"name": "compute-bound", "arch": "llama", "layers": 4, "hidden": 1024, "heads": 8,
       "kv_heads": 8, "ffn_hidden": 4096, "vocab": 8, "seq_len": 8192}


def _overlap_run(tmp_path, prefetch: bool):
    """dp 2 on a 2 x 1 torus, long sequences and few parameters: each layer computes far
    longer than its all-gather; a free link latency makes alpha = 0."""
    d = scenario_dict(cluster__topology={"kind": "torus2d", "shape": [2, 1]},
                      workload__model=BIG, workload__seq_len=8192, workload__global_batch=2,
                      workload__micro_batch=1, workload__parallelism={"dp": 2, "tp": 1, "pp": 1},
                      workload__sharding={"strategy": "full_shard", "prefetch": prefetch})
    d["trace"] = {"path": str(tmp_path / f"pf{prefetch}.h5"), "tables": ["ops", "messages"]}
    s = load_scenario(d, ["cluster.link.latency_us=0", "cluster.link.overhead_us=0",
                          "network.protocols=links"])  # no protocol latency: hand timeline
    return s, run(s)


def test_prefetch_hides_all_but_the_first_gathers(tmp_path):
    """Hand timeline (FIFO sharding stream; an all-gather of n bytes over two ranks moves n/2
    each way: a = n / (2 B); a reduce-scatter likewise). Units in order: embedding E, layers
    L0..L3, head H, then backward H, L3..L0, E.

    With prefetch the next unit's gather starts when the current unit starts computing, so
    only what nothing can hide is exposed: E's gather (the first), L0's minus E's compute,
    H's backward gather minus H's forward compute, and L3's backward gather minus H's
    backward compute: ``a_E + (a_L - c_Ef) + (a_H - c_Hf)+ + (a_L - c_Hb)``.
    Without it every gather is exposed, and in backward each queues behind the reduce-scatter
    issued just before it: ``2 a_E + 2 a_H + r_H + 8 a_L + 4 r_L``.
    """
    s, with_pf = _overlap_run(tmp_path, True)
    _, without = _overlap_run(tmp_path, False)
    (_u, _v, edge), = build(s).topo.graph.edges(data=True)  # one edge: both ways round
    bw = s.cluster.link.bytes_per_s * edge["count"]
    h, f, v = BIG["hidden"], BIG["ffn_hidden"], BIG["vocab"]
    a_l = 2.0 * (4 * h * h + 3 * h * f + 2 * h) / (2 * bw)  # 2-byte params, n/2 per rank
    a_e, a_h = 2.0 * v * h / (2 * bw), 2.0 * (v * h + h) / (2 * bw)
    ops = read_table(with_pf.trace_path, "ops")
    comp = ops[ops["kind"] == "compute"]

    def dur(name: str) -> float:
        rows = comp[comp["name"] == name]
        return float((rows["t_end"] - rows["t_start"]).iloc[0])

    layer_fwd = dur("attn_fwd") + dur("mlp_fwd")
    layer_bwd = dur("attn_bwd") + dur("mlp_bwd")
    assert layer_fwd > a_l and layer_bwd > 2 * a_l  # compute-bound, as intended
    want_with = (a_e + (a_l - dur("embed_fwd")) + max(0.0, a_h - dur("logits_fwd"))
                 + (a_l - dur("logits_bwd")))
    want_without = 2 * a_e + 2 * a_h + a_h + 8 * a_l + 4 * a_l  # r_H = a_H, r_L = a_L here
    got_with = with_pf.summary["sharding"]["allgather_wait_per_device_s"]
    got_without = without.summary["sharding"]["allgather_wait_per_device_s"]
    print(f"exposed all-gather: prefetch {got_with * 1e6:.1f} us (hand {want_with * 1e6:.1f}), "
          f"none {got_without * 1e6:.1f} us (hand {want_without * 1e6:.1f})")
    assert got_with == pytest.approx(want_with, rel=0.02)
    assert got_without == pytest.approx(want_without, rel=0.02)
    assert got_without - got_with == pytest.approx(want_without - want_with, rel=0.02)
    assert with_pf.summary["iteration_time_s"] < without.summary["iteration_time_s"]
    # the exposed all-gathers are exposed communication, and a part of each device's time
    for r in (with_pf, without):
        sm = r.summary
        wait = sm["sharding"]["allgather_wait_per_device_s"]
        assert sm["exposed_comm_fraction"] == pytest.approx(
            (sm["tp_comm_time_per_device_s"] + sm["dp_wait_per_device_s"] + wait)
            / sm["makespan_s"], rel=1e-9)
        busy = sum(sm[k] for k in DEVICE_TIME_KEYS)
        assert busy + wait == pytest.approx(sm["makespan_s"], rel=1e-9)


# ----------------------------------------------------------------------------- combinations
def test_sharding_with_tp_and_pp_is_symmetric_and_shards_each_slice(tmp_path):
    """tp 2 x pp 2 x dp 2 (hybrid would be full_shard here): every tp/pp slice is sharded over
    its dp group; rank symmetry gives the same run as simulating every rank."""
    base = dict(workload__model=MODEL, workload__seq_len=256, workload__global_batch=4,
                workload__parallelism={"dp": 2, "tp": 2, "pp": 2},
                workload__sharding={"strategy": "full_shard"})
    d1 = scenario_dict(**base)
    d2 = scenario_dict(**base, simulation={"symmetry": False})
    for d in (d1, d2):
        d["trace"] = {"enabled": False}
    s1, s2 = run(load_scenario(d1)).summary, run(load_scenario(d2)).summary
    assert s1["iteration_time_s"] == pytest.approx(s2["iteration_time_s"], rel=1e-9)
    assert s1["bytes_sent"] == pytest.approx(s2["bytes_sent"], rel=1e-9)
    mem = build(load_scenario(d1)).stage_memory
    slice0 = (2 * layer_params() + VOCAB * H) / 2   # stage 0: 2 layers + embedding, / tp
    assert mem[0].weights == pytest.approx(2.0 * slice0 / 2, rel=1e-12)  # / dp
    assert mem[0].optimizer == pytest.approx(K_ADAM * slice0 / 2, rel=1e-12)
    # FULL_SHARD over each slice's dp ring of 2: 3 m collectives of its 2-byte parameters per
    # step, half of each buffer per rank; the slices' parameters add up to Psi (each / tp)
    d3 = scenario_dict(**base)
    d3["trace"] = {"path": str(tmp_path / "tp.h5"), "tables": ["messages"]}
    msg = read_table(run(load_scenario(d3)).trace_path, "messages")
    shard = float(msg.loc[msg["name"].astype(str).str.startswith("shard_"), "bytes"].sum())
    m = 2
    assert shard == pytest.approx(2 * 3 * m * 2.0 * PSI / 2, rel=1e-9)
    # pipeline waits and exposed all-gathers are each a part of a device's time
    wait = s1["sharding"]["allgather_wait_per_device_s"]
    assert s1["pipeline_wait_per_device_s"] > 0 and wait > 0
    assert sum(s1[k] for k in DEVICE_TIME_KEYS) + wait == pytest.approx(s1["makespan_s"], rel=1e-9)


@pytest.mark.parametrize("sets,field", [
    (["workload.sharding.strategy=zero4"], "workload.sharding.strategy"),
    (["workload.sharding.group=4"], "workload.sharding.group"),
    (["workload.sharding.strategy=hybrid_shard"], "workload.sharding.group"),
    (["workload.sharding.strategy=hybrid_shard", "workload.sharding.group=3"],
     "workload.sharding.group"),
    (["workload.sharding.prefetch=maybe"], "workload.sharding.prefetch"),
    (["workload.sharding.stage=3"], "workload.sharding.stage"),
    # DDP's bucket knobs beside a sharded strategy: accepted, they changed nothing
    (["workload.sharding.strategy=zero1", "overlap.dp_buckets=false"], "overlap.dp_buckets"),
    (["workload.sharding.strategy=full_shard", "overlap.dp_streams=2"], "overlap.dp_streams"),
    # a gradient bucket size beside strategies that reduce-scatter unit by unit: the same
    (["workload.sharding.strategy=full_shard", "workload.grad_bucket_mb=5"],
     "workload.grad_bucket_mb"),
    (["workload.sharding.strategy=zero3", "workload.grad_bucket_mb=50"],
     "workload.grad_bucket_mb"),
    (["workload.sharding.strategy=shard_grad_op", "workload.grad_bucket_mb=1e6"],
     "workload.grad_bucket_mb"),
    (["workload.sharding.strategy=hybrid_shard", "workload.sharding.group=2",
      "workload.grad_bucket_mb=24.9"], "workload.grad_bucket_mb"),
    # no prefetch where no parameters are gathered unit by unit: the same
    (["workload.sharding.prefetch=false"], "workload.sharding.prefetch"),
    (["workload.sharding.strategy=zero1", "workload.sharding.prefetch=false"],
     "workload.sharding.prefetch"),
    (["workload.sharding.strategy=zero2", "workload.sharding.prefetch=false"],
     "workload.sharding.prefetch"),
])
def test_bad_sharding_input_is_a_field_error(tmp_path, capsys, sets, field):
    path = tmp_path / "s.yaml"
    import yaml

    path.write_text(yaml.safe_dump(scenario_dict()))
    args = ["check", str(path)]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    out = capsys.readouterr()
    assert field in out.out + out.err
    assert "Traceback" not in out.out + out.err


@pytest.mark.parametrize("strategy", ["none", "zero1", "zero2", "zero3", "full_shard",
                                      "shard_grad_op", "hybrid_shard"])
def test_only_ddp_and_zero1_2_programs_depend_on_the_bucket_size(strategy):
    """Why `workload.grad_bucket_mb` is refused beside the unit strategies: their programs
    (one stage, 2 microbatches, 3 layers of 100 gradient bytes) are the same with 50-byte
    buckets (a reduction per layer) as with one bucket of everything; DDP's, zero1's and
    zero2's are not."""
    same = _program(strategy, 50.0) == _program(strategy, 1e12)
    assert same == (strategy in ("zero3", "full_shard", "shard_grad_op", "hybrid_shard"))


@pytest.mark.parametrize("strategy", ["none", "zero1", "zero2", "zero3", "full_shard",
                                      "shard_grad_op", "hybrid_shard"])
def test_only_the_unit_strategies_programs_depend_on_prefetch(strategy):
    """Why `workload.sharding.prefetch: false` is refused beside none, zero1 and zero2: they
    gather no unit's parameters ahead of its use, and their programs are the same."""
    same = _program(strategy, 50.0, True) == _program(strategy, 50.0, False)
    assert same == (strategy in ("none", "zero1", "zero2"))


def _program(strategy: str, bucket: float, prefetch: bool = True) -> list[tuple]:
    """One stage's program: 2 microbatches, 3 layers of 100 gradient bytes, ``bucket``-byte
    buckets, sharded 4 ways (hybrid_shard: 2 replicas)."""
    from workloads.schedules import StageWork, build_program
    from workloads.sharding import ShardWork, shard_program

    work = StageWork(stage=0, pp=1, virtual=1, microbatches=2, chunk_layers=(3,), tp=1,
                     sequence_parallel=False, recompute="none", activation_bytes=1000.0,
                     layer_grad_bytes=100.0, embed_grad_bytes=7.0, head_grad_bytes=11.0,
                     bucket_bytes=bucket, load_input=False)
    sw = ShardWork(strategy, prefetch, 2 if strategy == "hybrid_shard" else 1, 4,
                   {"L": 50.0, "E": 3.5, "H": 5.5}, {"L": 100.0, "E": 7.0, "H": 11.0}, bucket)
    return shard_program(build_program(work, "1f1b"), sw)
