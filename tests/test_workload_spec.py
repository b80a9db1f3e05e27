"""Schema bounds and documented defaults of the workload (workloads/spec.py) and of an HBM
stack (devices/hbm/spec.py): the smallest allowed value is accepted and the next one down
refused; defaults the README's key tables state."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from devices.hbm.spec import HbmSpec, load_hbm_spec
from tests.conftest import scenario_dict
from twin.kernel.errors import ScenarioError
from twin.scenario import load_scenario
from workloads.spec import ModelSpec, ParallelismSpec

LEAST_MODEL = {"name": "m", "layers": 1, "hidden": 1, "heads": 1, "kv_heads": 1,
               "ffn_hidden": 1, "vocab": 1, "seq_len": 1}


@pytest.mark.parametrize("field", ["layers", "hidden", "heads", "kv_heads", "ffn_hidden",
                                   "vocab", "seq_len"])
def test_a_model_of_ones_is_valid_and_zero_is_not(field):
    ModelSpec(**LEAST_MODEL)
    with pytest.raises(ValidationError, match=field):
        ModelSpec(**{**LEAST_MODEL, field: 0})


@pytest.mark.parametrize("field", ["dp", "tp", "pp"])
def test_parallel_degrees_start_at_one(field):
    """A degree left out is 1; 1 is the least."""
    assert getattr(ParallelismSpec(), field) == 1
    assert getattr(ParallelismSpec(**{field: 1}), field) == 1
    with pytest.raises(ValidationError, match=field):
        ParallelismSpec(**{field: 0})


def test_workload_defaults_and_least_values():
    """Without them a workload runs 1 iteration, micro batch 1, without sequence parallelism,
    and FSDP prefetches; 1 token and 1 sequence are the least sizes."""
    d = scenario_dict()
    del d["workload"]["iterations"]
    d["workload"]["sharding"] = {"strategy": "full_shard"}
    w = load_scenario(d).workload
    assert (w.iterations, w.sequence_parallel, w.sharding.prefetch) == (1, False, True)
    d = scenario_dict()
    del d["workload"]["micro_batch"]
    assert load_scenario(d).workload.micro_batch == 1
    one = scenario_dict(cluster__topology={"kind": "torus2d", "shape": [1, 1]})
    one["workload"].update(parallelism={"dp": 1}, seq_len=1, global_batch=1, micro_batch=1)
    w = load_scenario(one).workload
    assert (w.seq, w.global_batch, w.micro_batch) == (1, 1, 1)
    for key in ("seq_len", "global_batch", "micro_batch", "iterations"):
        d = scenario_dict()
        d["workload"][key] = 0
        with pytest.raises(ScenarioError, match=f"workload.{key}"):
            load_scenario(d)


def test_hbm_timings_may_be_zero_and_specs_are_frozen():
    """Every command timing may be 0 ns (an ideal part); the data rate must be positive; a
    spec cannot be changed once made (runs share it)."""
    base = load_hbm_spec("hbm3").model_dump()
    timings = [k for k in base if k.endswith("_ns") and k not in ("tREFI_ns",)]
    zero = HbmSpec(**{**base, **dict.fromkeys(timings, 0.0)})
    assert all(getattr(zero, k) == 0.0 for k in timings)
    assert HbmSpec(**{**base, "stack_ids": 1}).stack_ids == 1
    assert HbmSpec(**{**base, "bank_groups": 1}).bank_groups == 1
    with pytest.raises(ValidationError, match="bank_groups"):
        HbmSpec(**{**base, "bank_groups": 0})
    with pytest.raises(ValidationError, match="data_rate_gbps"):
        HbmSpec(**{**base, "data_rate_gbps": 0.0})
    with pytest.raises(ValidationError):
        zero.tCL_ns = 1.0  # type: ignore[misc]


def test_embeddings_untied_and_ddp_buckets_by_default():
    """A model entry that says nothing of it has separate input and output embeddings, and
    gradients go in buckets of 25 MB, PyTorch DDP's default ``bucket_cap_mb``."""
    from tests.conftest import scenario_dict
    from twin.scenario import load_scenario
    from workloads.spec import ModelSpec

    m = ModelSpec.model_validate({"name": "m", "layers": 2, "hidden": 64, "heads": 4,
                                  "vocab": 128, "seq_len": 32})
    assert m.tied_embeddings is False
    assert load_scenario(scenario_dict()).workload.grad_bucket_mb == 25.0
