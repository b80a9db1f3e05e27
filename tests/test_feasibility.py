"""Layout and memory feasibility messages (workloads/feasibility.py): what is refused, with the
divisors a user can pick written out here, and the busiest stage named."""

from __future__ import annotations

import pytest

from tests.conftest import scenario_dict
from twin.kernel.errors import ScenarioError
from twin.scenario import load_scenario


def _problems(**workload) -> dict[str, list]:
    d = scenario_dict()
    d["workload"].update(workload)
    d["trace"] = {"enabled": False}
    with pytest.raises(ScenarioError) as exc:
        load_scenario(d)
    out: dict[str, list] = {}
    for p in exc.value.problems:
        out.setdefault(p.path, []).append(p)
    return out


def test_layout_errors_list_the_divisors():
    """Llama 3.2 1B: 32 heads (8 KV heads), MLP width 8192, 16 layers; dp 8 on 8 devices."""
    tp = _problems(parallelism={"dp": 2, "tp": 3, "pp": 1}, global_batch=16)[
        "workload.parallelism.tp"]
    allowed = {p.message.split(" the ")[-1]: p.allowed for p in tp}
    assert allowed["32 attention heads"] == "1, 2, 4, 8, 16, 32"
    assert allowed["MLP width 8192"] == "1, 2, 4, 8, 16, 32, 64"  # capped at 64
    pp = _problems(parallelism={"dp": 2, "tp": 1, "pp": 3}, global_batch=16)[
        "workload.parallelism.pp"]
    assert pp[0].allowed == "1, 2, 4, 8, 16"
    group = _problems(sharding={"strategy": "hybrid_shard", "group": 3})[
        "workload.sharding.group"]
    assert group[0].allowed == "1, 2, 4, 8"


def test_a_stage_may_hold_no_transformer_layer():
    """``stage_layers`` counts may be 0 (a stage with only the embedding or the output
    layer); negative ones are refused."""
    d = scenario_dict()
    d["workload"].update(parallelism={"dp": 4, "tp": 1, "pp": 2}, stage_layers=[16, 0])
    d["trace"] = {"enabled": False}
    assert load_scenario(d).workload.stage_layers == [16, 0]
    bad = _problems(parallelism={"dp": 4, "tp": 1, "pp": 2}, stage_layers=[17, -1])
    assert "must be >= 0" in bad["workload.stage_layers"][0].message


def test_memory_check_names_the_busiest_stage():
    """1F1B over 2 stages at 8192 tokens, micro batch 8: stage 0 keeps two microbatches'
    activations and needs more than the H100's 80 GB, stage 1 keeps one and would fit; the
    job is refused and the message names stage 0. Micro batch 4 fits."""
    mem = _problems(seq_len=8192, micro_batch=8, global_batch=64,
                    parallelism={"dp": 4, "tp": 1, "pp": 2})["workload"]
    assert "out of HBM: stage 0 needs" in mem[0].message
    d = scenario_dict()
    d["workload"].update(seq_len=8192, micro_batch=4, global_batch=32,
                         parallelism={"dp": 4, "tp": 1, "pp": 2})
    d["trace"] = {"enabled": False}
    load_scenario(d)
