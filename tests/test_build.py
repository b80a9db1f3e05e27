"""The optimizer block a stage runs (``twin.build.stage_blocks``) against AdamW's memory
traffic worked out here (it found the catalog's fp32 figure, 24 bytes a parameter, short of
its own derivation: 28)."""

from __future__ import annotations

import pytest

from tests.conftest import scenario_dict
from twin.build import stage_blocks
from twin.scenario import load_scenario
from workloads.transformer import TransformerCosts

P = 1e9  # parameters on the rank


@pytest.mark.parametrize("precision,grad_bytes,update_bytes", [
    # mixed: fp32 master, momentum and variance read and written (3 x 8), the 2-byte
    # gradient read and the 2-byte weight copy written: 28 B a parameter
    ("bf16", 2, 3 * 8 + 2 + 2),
    # fp32: the weight is the master: it, momentum and variance read and written, the
    # 4-byte gradient read
    ("fp32", 4, 3 * 8 + 4)])
def test_the_optimizer_clips_the_gradients_and_updates_the_states(precision, grad_bytes,
                                                                  update_bytes):
    model = load_scenario(scenario_dict()).workload.model
    tc = TransformerCosts(model, precision, 1, 256, 1)
    clip, adam = stage_blocks(tc, P)["optimizer"].kernels
    # the gradient norm reads every gradient, the scaling reads and writes it again
    assert clip.name == "grad_clip" and clip.bytes == pytest.approx(3 * grad_bytes * P)
    assert adam.name == "adam" and adam.bytes == pytest.approx(update_bytes * P)
    # FLOPs: the norm squares and adds, the scaling multiplies (3 a parameter); the Adam
    # step's dozen (the catalog's estimate, workloads/catalog/optimizers/adam.yaml)
    assert clip.flops == pytest.approx(3 * P) and adam.flops == pytest.approx(12 * P)
    assert not clip.gemm and not adam.gemm
