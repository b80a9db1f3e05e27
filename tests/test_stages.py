"""Uneven pipeline stages (workload.stage_layers), the activation tensor count and the Llama 3
405B layout.

References: per-stage memory worked out by hand from the layer split and the schedule's
microbatches in flight; the ``auto`` split against a brute-force search over every split;
the ``tensors`` activation count against Korthikanti et al. 2022's GPT closed forms.
"""

from __future__ import annotations

import itertools

import pytest

from devices.accelerator import ComputeModel
from tests.conftest import ROOT, scenario_dict
from twin.build import build
from twin.cli import main
from twin.runner import run
from twin.scenario import load_scenario
from twin.trace import read_table
from workloads.feasibility import stage_memory
from workloads.memory import layer_tensors
from workloads.spec import ModelSpec
from workloads.stages import resolve_split, stage_chunks
from workloads.transformer import TransformerCosts

H, VOCAB, S = 512, 32000, 256
GPT = {"name": "g10", "arch": "gpt", "layers": 10, "hidden": H, "heads": 8, "vocab": VOCAB,
       "seq_len": S}


def pipe(tmp_path, pp, m, layers=10, stage_layers=None, schedule="1f1b", v=1, vocab=VOCAB):
    model = dict(GPT, layers=layers, vocab=vocab)
    d = scenario_dict(cluster__topology={"kind": "ring", "shape": [pp]}, workload__model=model,
                      workload__seq_len=S, workload__global_batch=m,
                      workload__parallelism={"dp": 1, "tp": 1, "pp": pp},
                      workload__schedule=schedule, workload__virtual_stages=v,
                      workload__stage_layers=stage_layers)
    d["trace"] = {"path": str(tmp_path / f"p{pp}{schedule}{stage_layers}.h5"), "tables": ["ops"]}
    return load_scenario(d)


def gpt_params(layers: int) -> tuple[float, float, float]:
    """(layer, embedding, head) parameters of the GPT model: 4h^2 + 4h (attention + biases),
    8h^2 + 5h (MLP 4h wide + biases), 4h (two LayerNorms); V h + s h; untied V h + 2h."""
    layer = 12 * H * H + 13 * H
    return layer, VOCAB * H + S * H, VOCAB * H + 2 * H


def test_hand_split_memory_and_programs(tmp_path):
    """[3, 4, 3] layers on pp 3, 1F1B with m = 4 microbatches: stage s keeps pp - s
    microbatches in flight, each 34 s b h bytes per layer (Korthikanti, no TP), the last adds
    the fp32 logits 4 s b V; weights, gradients and Adam states 2 + 2 + 12 bytes per parameter.
    """
    scen = pipe(tmp_path, 3, 4, stage_layers=[3, 4, 3])
    res = run(scen)
    layer, emb, head = gpt_params(10)
    params = [3 * layer + emb, 4 * layer, 3 * layer + head]
    acts = [34.0 * S * H * n * (3 - s) for s, n in enumerate([3, 4, 3])]
    acts[2] += 4.0 * S * VOCAB
    want = [16.0 * p + a for p, a in zip(params, acts, strict=True)]
    got = res.summary["memory_per_device_gb"]
    for s in range(3):
        assert got[f"stage{s}"] * 1e9 == pytest.approx(want[s], rel=1e-12)
    ops = read_table(res.trace_path, "ops")
    fwd = ops[(ops["kind"] == "compute") & (ops["name"] == "attn_fwd")]
    assert fwd.groupby("cls").size().tolist() == [3 * 4, 4 * 4, 3 * 4]


def test_per_virtual_stage_split_walks_the_interleaved_schedule(tmp_path):
    """pp 2, v 2, model order [1, 2, 2, 1]: stage 0 holds chunks (1, 2), stage 1 (2, 1).
    With m = 2 stage 0 warms up with 2 (pp-1) + (v-1) pp = 4 forwards (all of them): 1 + 1 + 2
    + 2 = 6 layer activations at its peak; stage 1 runs 2 warm-up forwards of chunk 0, then
    chunk 1's first forward before the first backward: 2 + 2 + 1 = 5."""
    scen = pipe(tmp_path, 2, 2, layers=6, stage_layers=[1, 2, 2, 1], schedule="interleaved",
                v=2)
    mem = build(scen).stage_memory
    assert [m.layers for m in mem] == [3, 3]
    per_layer = 34.0 * S * H
    assert mem[0].activations == pytest.approx(6 * per_layer, rel=1e-12)
    assert mem[1].activations == pytest.approx(5 * per_layer + 4.0 * S * VOCAB, rel=1e-12)
    res = run(scen)
    assert res.summary["completed"]
    ops = read_table(res.trace_path, "ops")
    fwd = ops[(ops["kind"] == "compute") & (ops["name"] == "attn_fwd")]
    assert fwd.groupby(["cls", "chunk"]).size().tolist() == [2 * 1, 2 * 2, 2 * 2, 2 * 1]


def _costs(scen):
    """Per-microbatch forward + backward time of one layer, the embedding and the head, from
    the device's compute model (the input the balancing works from)."""
    w = scen.workload
    tc = TransformerCosts(w.model, w.precision, w.micro_batch, w.seq)
    cm = ComputeModel(scen.cluster.device, w.precision, scen.cluster.device.hbm_pj_per_bit)
    d = lambda *blocks: sum(cm.block_cost(b).duration_s for b in blocks)  # noqa: E731
    return (d(tc.attention_block(), tc.mlp_block(), tc.attention_block(True),
              tc.mlp_block(True)),
            d(tc.embedding_block(), tc.embedding_block(True)),
            d(tc.logits_block(), tc.logits_block(True)))


def _max_time(split, layer, first, last):
    times = [n * layer for n in split]
    times[0] += first
    times[-1] += last
    return max(times)


@pytest.mark.parametrize("layers,pp,v", [(10, 3, 1), (9, 4, 1), (10, 2, 2)])
def test_auto_split_is_the_brute_force_optimum(tmp_path, layers, pp, v):
    """Every composition of the layers into pp*v virtual stages; auto reaches the least
    possible largest virtual-stage time (a 32k vocabulary makes the head worth ~2 layers)."""
    m = pp if v > 1 else 4
    scen = pipe(tmp_path, pp, m, layers=layers, stage_layers="auto",
                schedule="interleaved" if v > 1 else "1f1b", v=v)
    layer, first, last = _costs(scen)
    assert last > layer  # the head is heavier than a layer: the last stage must get fewer
    k = pp * v
    best = min(_max_time(c, layer, first, last)
               for c in itertools.product(range(layers + 1), repeat=k) if sum(c) == layers)
    split = resolve_split(scen.workload, scen.cluster.device)
    assert sum(split) == layers and len(split) == k
    assert _max_time(split, layer, first, last) == pytest.approx(best, rel=1e-12)


def test_auto_is_no_worse_than_an_even_split_in_a_run(tmp_path):
    """12 layers on pp 3: even [4, 4, 4] leaves the head on top of 4 layers; auto moves layers
    off the last stage; the simulated busiest stage's compute and the iteration get shorter."""
    even, auto = pipe(tmp_path, 3, 6, layers=12), pipe(tmp_path, 3, 6, layers=12,
                                                       stage_layers="auto")
    split = resolve_split(auto.workload, auto.cluster.device)
    assert split[-1] < 4 and split[0] >= 4
    busy = []
    for scen in (even, auto):
        res = run(scen)
        ops = read_table(res.trace_path, "ops")
        comp = ops[ops["kind"] == "compute"]
        busy.append(float((comp["t_end"] - comp["t_start"]).groupby(comp["cls"]).sum().max()))
        busy.append(res.summary["iteration_time_s"])
    assert busy[2] < busy[0]   # busiest stage
    assert busy[3] < busy[1]   # iteration


def test_auto_on_llama3_405b_layout_gives_first_and_last_fewer_layers():
    scen = load_scenario(ROOT / "scenarios" / "llama3_405b.yaml")
    split = resolve_split(scen.workload, scen.cluster.device)
    per_stage = [sum(c) for c in stage_chunks(split, 16)]
    print("layers per stage:", per_stage)
    assert sum(split) == 126 and len(split) == 16 * 8
    assert split[0] == 0 and split[-1] == 0     # embedding alone, output layer + loss alone
    assert per_stage[0] == per_stage[-1] == 7 and set(per_stage[1:-1]) == {8}


def test_llama3_405b_fits_in_80_gb_and_checks(capsys):
    path = ROOT / "scenarios" / "llama3_405b.yaml"
    scen = load_scenario(path)
    w = scen.workload
    assert (w.parallelism.tp, w.parallelism.pp, w.parallelism.dp) == (8, 16, 64)
    assert w.recompute != "full" and w.schedule == "interleaved" and w.global_batch == 2048
    mem = stage_memory(w, scen.cluster.device)
    print("\nstage  layers  weights  grads  optimizer  activations  buffers  total (GB)")
    for m in mem:
        b = m.breakdown_gb()
        print(f"{m.stage:5d} {m.layers:7d} {b['weights']:8.2f} {b['gradients']:6.2f} "
              f"{b['optimizer']:10.2f} {b['activations']:12.2f} {b['buffers']:8.2f} "
              f"{b['total']:6.2f}")
    assert max(m.total for m in mem) <= scen.cluster.device.hbm_bytes == 80e9
    assert main(["check", str(path)]) == 0


@pytest.mark.slow
def test_llama3_405b_runs_one_iteration():
    scen = load_scenario(ROOT / "scenarios" / "llama3_405b.yaml", ["trace.enabled=false"])
    s = run(scen).summary
    print({k: s[k] for k in ("iteration_time_s", "mfu", "bubble_fraction", "wall_time_s")})
    assert s["completed"] and s["devices"] == 8192 and s["mfu"] > 0.2


def test_tensor_count_reproduces_korthikanti_for_gpt_and_counts_llama():
    """GPT (f = 4h, MHA, dropout): 10 replicated + 24 split, i.e. s b h (10 + 24/t) and 34/t
    with SP (Korthikanti et al. Table 2). Llama 3 405B: norms 8, no dropout; q 2, k and v
    4 x 8/128, output 2, SwiGLU 6 x 53248/16384."""
    gpt = ModelSpec(**GPT)
    assert layer_tensors(gpt) == (10.0, 24.0)
    llama = load_scenario(ROOT / "scenarios" / "llama3_405b.yaml").workload.model
    assert layer_tensors(llama) == pytest.approx((8.0, 2 + 4 * 8 / 128 + 2 + 6 * 53248 / 16384))


@pytest.mark.parametrize("value,needle", [
    ([5, 4, 1], "entries"), ([10], "entries"), ([11, -1], ">= 0"), ([4, 4], "sum to 8"),
    ("fast", "list of layer counts"), ([1.5, 8.5], "list"),
])
def test_bad_stage_layers_are_field_errors(tmp_path, capsys, value, needle):
    import yaml

    d = scenario_dict(cluster__topology={"kind": "ring", "shape": [2]}, workload__model=GPT,
                      workload__global_batch=4, workload__parallelism={"dp": 1, "pp": 2},
                      workload__stage_layers=value)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(d))
    assert main(["check", str(path)]) == 2
    cap = capsys.readouterr()
    out = cap.out + cap.err
    assert "workload.stage_layers" in out and needle in out and "Traceback" not in out


def test_uneven_layers_without_stage_layers_point_to_the_key(tmp_path):
    from twin.kernel.errors import ScenarioError

    with pytest.raises(ScenarioError) as exc:
        pipe(tmp_path, 3, 3, layers=10)
    assert "stage_layers" in str(exc.value)


def test_dvfs_stage_plan_follows_the_split(tmp_path):
    """The planner's per-stage busy time at the top clock is the compute the uneven stages
    really run (their programs), and grows with a stage's layers."""
    scen = pipe(tmp_path, 3, 4, stage_layers=[2, 5, 3], vocab=64).replace(
        {"power.dvfs.policy": "stage_plan"})
    res = run(scen)
    busy = res.summary["dvfs_plan"]["stage_busy_top_clock_s"]
    fixed = run(scen.replace({"power.dvfs.policy": "fixed"}))
    ops = read_table(fixed.trace_path, "ops")
    comp = ops[ops["kind"] == "compute"]
    ran = (comp["t_end"] - comp["t_start"]).groupby(comp["cls"]).sum().tolist()
    assert busy == pytest.approx(ran, rel=1e-9)
    assert busy[1] > busy[2] > busy[0]


@pytest.mark.parametrize("schedule,pp,v,m", [
    ("gpipe", 4, 1, 6), ("1f1b", 4, 1, 2), ("1f1b", 4, 1, 8), ("interleaved", 4, 2, 8),
    ("interleaved", 3, 3, 6), ("interleaved", 2, 4, 2)])
def test_schedule_walk_equals_the_closed_forms_on_an_even_split(schedule, pp, v, m):
    """The walk uneven stages use gives, on an even split, the in-flight closed forms (GPipe m,
    1F1B pp - s, interleaved 2 (pp-s-1) + (v-1) pp + 1 chunks)."""
    from workloads.memory import in_flight_microbatches
    from workloads.stages import peak_layer_activations

    per = 2
    for s in range(pp):
        walk = peak_layer_activations(schedule, s, pp, m, [per] * v)
        assert walk == in_flight_microbatches(schedule, pp, s, m, v) * per * v


def test_llama3_405b_activations_match_the_interleaved_closed_form():
    """Llama 3 405B layout (scenarios/llama3_405b.yaml): per layer and microbatch a rank keeps
    ``sbh (8 + 2 + 4 k/a + 2 + 6 f/h) / t`` bytes with sequence parallelism (hand count:
    31.75 sbh/t for h 16384, f 53248, 128 heads, 8 KV heads; below Korthikanti's GPT form
    34 sbh/t, which has GELU's 4h MLP and dropout masks); stage ``s`` of the interleaved
    schedule holds ``2 (p - s - 1) + (v - 1) p + 1`` one-layer chunks at its peak
    (Megatron-LM's warm-up + 1; on stage 0 this is Korthikanti's ``L (1 + (p - 1)/(p v))``
    layers for an even split)."""
    from devices.spec import DeviceSpec
    from twin.catalogs import catalog

    scen = load_scenario(ROOT / "scenarios" / "llama3_405b.yaml")
    w = scen.workload
    dev = DeviceSpec.model_validate(catalog("devices").get("h100-sxm").values)
    stages = stage_memory(w, dev)
    s, b, h, t, p, v = 8192, 1, 16384, 8, 16, 8
    per_layer = (8 + 2 + 4 * 8 / 128 + 2 + 6 * 53248 / 16384) * s * b * h / t
    assert per_layer < 34 * s * b * h / t
    for st in stages[1:-1]:  # middle stages: 8 layers, one per chunk
        chunks = 2 * (p - st.stage - 1) + (v - 1) * p + 1
        assert st.activations == pytest.approx(chunks * per_layer, rel=1e-9)
    assert max(st.total for st in stages) <= dev.hbm_bytes


@pytest.mark.parametrize("sp", [False, True])
def test_full_recompute_keeps_each_layers_input_only(sp):
    """``recompute: full`` (Korthikanti et al. sec. 4): a layer keeps only its input, 2 s b h
    bytes at 16 bits (``/ t`` with sequence parallelism); one stage of 1F1B holds one
    microbatch, plus the fp32 logits 4 s b V / t on the last stage. The breakdown is the same
    bytes in GB."""
    from workloads.memory import memory_per_stage

    t, b, layers = 4, 3, 10
    costs = TransformerCosts(ModelSpec(**GPT), "bf16", b, S, t, sp, "full", "flash")
    (mem,) = memory_per_stage(costs, 1, 1, "1f1b")
    per_layer = 2.0 * S * b * H / (t if sp else 1)
    assert mem.activations == pytest.approx(layers * per_layer + 4.0 * S * b * VOCAB / t,
                                            rel=1e-12)
    (sharded,) = memory_per_stage(costs, 1, 1, "1f1b", sharding="full_shard", shards=4)
    for m in (mem, sharded):
        gb = m.breakdown_gb()
        for part in ("weights", "gradients", "optimizer", "activations", "buffers", "total"):
            assert gb[part] * 1e9 == pytest.approx(getattr(m, part), rel=1e-12), part
    assert sharded.buffers > 0 and sharded.activations == mem.activations


def test_stage_lists_spread_over_chunks_with_the_remainder_last():
    """Layers per stage over ``v`` chunks, as even as possible with the remainder on the last
    chunks, then laid out in model order (virtual stage ``j`` = chunk ``j // pp`` of stage
    ``j % pp``); without a list every virtual stage holds ``layers / (pp v)``."""
    from workloads.stages import even_split, from_stage_list, spread_stage

    assert spread_stage(7, 3) == [2, 2, 3] and spread_stage(8, 3) == [2, 3, 3]
    assert spread_stage(6, 3) == [2, 2, 2] and spread_stage(2, 3) == [0, 1, 1]
    # stage 0: 5 -> [2, 3], stage 1: 3 -> [1, 2], stage 2: 4 -> [2, 2]; model order
    assert from_stage_list([5, 3, 4], 2) == [2, 1, 2, 3, 2, 2]
    assert from_stage_list([5, 3, 4], 1) == [5, 3, 4]
    assert even_split(12, 2, 3) == [2] * 6 and even_split(8, 4, 1) == [2] * 4


@pytest.mark.parametrize("layers,slots,layer_s,first_s,last_s", [
    (7, 3, 1.0, 1.5, 0.0), (9, 4, 1.0, 0.0, 2.5), (10, 3, 1.0, 1.5, 2.5), (6, 2, 1.0, 3.0, 0.2),
    (5, 1, 1.0, 0.7, 0.4)])
def test_balance_is_the_brute_force_optimum(layers, slots, layer_s, first_s, last_s):
    """``balance`` against every composition of the layers (extras on the first and last
    slot, both on one when there is one): the least possible largest slot time."""
    from workloads.stages import balance

    def worst(split):
        t = [n * layer_s for n in split]
        t[0] += first_s
        t[-1] += last_s
        return max(t)

    best = min(worst(c) for c in itertools.product(range(layers + 1), repeat=slots)
               if sum(c) == layers)
    got = balance(layers, slots, layer_s, first_s, last_s)
    assert sum(got) == layers and worst(got) == pytest.approx(best, rel=1e-12)


def test_block_times_are_a_layers_forward_and_backward(tmp_path):
    """One layer's time is its attention and MLP blocks forward and backward (plus any
    recomputation), the embedding's and the head's forward and backward: the test's own sums
    (``_costs``) of the device's block durations."""
    from workloads.stages import block_times

    scen = pipe(tmp_path, 2, 4)
    w = scen.workload
    tc = TransformerCosts(w.model, w.precision, w.micro_batch, w.seq)
    cm = ComputeModel(scen.cluster.device, w.precision, scen.cluster.device.hbm_pj_per_bit)
    got = block_times(tc, lambda b: cm.block_cost(b).duration_s)
    assert got == pytest.approx(_costs(scen), rel=1e-12)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("pp", [1, 2, 5])
def test_a_tied_output_matrix_is_held_twice_only_when_the_pipeline_splits_it(tied, pp):
    """With tied embeddings the input embedding and the output layer share one vocab x hidden
    matrix; split over pipeline stages, the last stage keeps its own copy (Megatron-LM's
    layout): the stages together hold
    V h / t parameters more than the model has, on the last stage only, and nothing more
    without a pipeline or without tying."""
    from workloads.memory import memory_per_stage

    t = 2
    costs = TransformerCosts(ModelSpec(**GPT, tied_embeddings=tied), "bf16", 1, S, t, False,
                             "none", "flash")
    alone = memory_per_stage(costs, 1, 4, "1f1b")
    split = memory_per_stage(costs, pp, 4, "1f1b")
    extra = VOCAB * H / t if tied and pp > 1 else 0.0
    assert sum(st.params for st in split) == pytest.approx(alone[0].params + extra, rel=1e-12)
    assert alone[0].params == pytest.approx(costs.total_params() / t, rel=1e-12)
    if pp > 1:
        # the last stage: its layers, the final norm (2 h for GPT), the head unless tied, the copy
        last = 10 // pp * costs.layer_params() / t + (2 * H + VOCAB * H) / t
        assert split[-1].params == pytest.approx(last, rel=1e-12)
