"""Ring collectives: the per-step barrier model, its refinement, and the lock-step model.

``network.ring_model: step`` sends each member's chunk of a ring step as its own flow and holds
every member at a barrier until the slowest has finished the step; ``ring_substeps`` cuts each
chunk into that many barrier-synchronised parts (the model's discretization). ``lockstep``
sends the ring as one flow whose members share one rate, the slowest's (``devices.fabric.
_lockstep``). The reference here is the step model itself, refined: as its barriers get finer
its result must move towards the lock-step one (the fluid limit of a ring pipelined in small
slices), which is the claim the ``lockstep`` model rests on.
"""

from __future__ import annotations

import pytest

from twin.kernel.errors import ScenarioError
from twin.runner import run
from twin.scenario import load_scenario


def _scenario(ring_model: str, substeps: int = 1, exact: bool = False) -> dict:
    """GPT 1.7B on an 8x8 torus, tp 4 x pp 2 x dp 8, compute jitter (every rank simulated, so
    the data-parallel rings run out of step beside pipeline and tensor-parallel traffic)."""
    return {
        "name": "rings", "seed": 3,
        "cluster": {"topology": {"kind": "torus2d", "shape": [8, 8]}, "device": "h100-sxm",
                    "link": "nvlink4"},
        "workload": {"model": "gpt-1.7b", "precision": "bf16", "global_batch": 16,
                     "micro_batch": 1, "parallelism": {"dp": 8, "tp": 4, "pp": 2},
                     "recompute": "selective", "sequence_parallel": True, "iterations": 1},
        "network": {"ring_model": ring_model, "ring_substeps": substeps},
        "simulation": {"compute_jitter_cov": 0.05, "exact": exact},
        "trace": {"enabled": False},
    }


def _summary(*args, **kwargs) -> dict:
    return run(load_scenario(_scenario(*args, **kwargs))).summary


def test_step_model_converges_to_lockstep_as_barriers_get_finer():
    lock = _summary("lockstep")
    assert lock["ring_model"] == "lockstep" and lock["lockstep_ring_transfers"] > 0
    assert "lockstep_rings" not in lock["shortcuts_used"]  # the model, not a shortcut
    errors = {}
    for k in (1, 4, 16):
        s = _summary("step", k)
        assert s["ring_model"] == "step"
        errors[k] = {key: s[key] / lock[key] - 1 for key in ("iteration_time_s", "energy_j")}
    for key in ("iteration_time_s", "energy_j"):
        e = [abs(errors[k][key]) for k in (1, 4, 16)]
        # a discretization error: it shrinks as the barriers get finer (about as 1/k here;
        # 4x finer twice must leave at most a quarter of the one-barrier-per-chunk error)
        assert e[0] > e[1] > e[2], (key, errors)
        assert e[2] <= e[0] / 4, (key, errors)
    # and the one-barrier-per-chunk model does differ from its limit in this configuration
    assert abs(errors[1]["iteration_time_s"]) > 1e-4


def test_lockstep_exact_and_fast_modes_agree():
    """With the lock-step ring model the fast mode's rings are the exact mode's: what is left
    between them is the fast mode's other shortcuts (the 0.5% of DESIGN.md)."""
    fast, exact = _summary("lockstep"), _summary("lockstep", exact=True)
    assert exact["exact_mode"] and exact["shortcuts_used"] == []
    assert exact["lockstep_ring_transfers"] > 0  # data-parallel rings included
    for key in ("iteration_time_s", "energy_j"):
        assert fast[key] == pytest.approx(exact[key], rel=5e-3)


@pytest.mark.parametrize("ring_model, substeps", [("lockstep", 1), ("step", 4)])
def test_lockstep_and_substeps_need_the_flow_model(ring_model, substeps):
    d = _scenario(ring_model, substeps)
    d["network"]["model"] = "packet"
    with pytest.raises(ScenarioError) as exc:
        load_scenario(d)
    assert "network" in str(exc.value) and "model: flow" in str(exc.value)
    d["network"].update(ring_model="step", ring_substeps=1)
    assert load_scenario(d).network.model == "packet"


@pytest.mark.parametrize("value", [0, 65, 2.5, "many"])
def test_ring_substeps_is_a_bounded_integer(value):
    d = _scenario("step")
    d["network"]["ring_substeps"] = value
    with pytest.raises(ScenarioError) as exc:
        load_scenario(d)
    assert "network.ring_substeps" in str(exc.value)


def test_ring_substeps_count_in_the_event_budget():
    """Out of step (here: jitter, no symmetry) each barrier part can cost an event per
    member, so the up-front estimate grows with ``ring_substeps``; in-step symmetric runs are
    not charged for it."""
    from twin.budget import estimate

    def events(substeps: int, jitter: float) -> float:
        """The estimate's simulation events (without idle segments and failure events)."""
        d = _scenario("step", substeps)
        d["simulation"]["compute_jitter_cov"] = jitter
        e = estimate(load_scenario(d))
        return e.events - e.thermal_steps - e.fault_events

    assert events(16, 0.05) == pytest.approx(16 * events(1, 0.05))
    assert events(16, 0.0) == pytest.approx(events(1, 0.0))
