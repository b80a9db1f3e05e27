"""Faults that only change a device (stragglers, HBM degradation, cooling failures) in fast
mode: chained transfers, one agent per TP group with the targets' stages split into one agent
per rank (``Layout.solo_devices``), and every untouched class running ahead of the clock.

The reference is exact mode (every rank its own agent, every transfer and collective its own
process), which shares none of it: iteration time and energy within the fast mode's 0.5%
(measured: iteration time to 1e-13; energy to ~1e-6, the idle segments' thermal steps falling
at other instants).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_exact import _scenario
from topologies.graph import build_topology
from twin.build import build
from twin.runner import run, simulate_untraced
from twin.scenario import load_scenario
from workloads.parallel import Layout

W = {"parallelism": {"dp": 2, "tp": 2, "pp": 4}, "global_batch": 16}
FAULTS = {
    "straggler": {"kind": "straggler", "device": 5, "factor": 1.6, "time_s": 0.0,
                  "duration_s": 0.05},
    "straggler_late": {"kind": "straggler", "devices": [2, 9], "factor": 2.0, "time_s": 0.03,
                       "duration_s": 0.04},
    "hbm": {"kind": "hbm_degradation", "device": 12, "factor": 3.0, "time_s": 0.01,
            "duration_s": 0.05},
    "cooling": {"kind": "cooling_failure", "device": 0, "rise_k": 25.0, "time_s": 0.0,
                "duration_s": 0.1},
}


def _faulty(fault: str, exact: bool, jitter: float = 0.0, **sim) -> dict:
    d = _scenario(exact, **W)
    d["faults"] = [FAULTS[fault]]
    d["simulation"].update(compute_jitter_cov=jitter, **sim)
    return d


def test_a_fault_target_splits_its_stage_into_one_class_per_rank():
    """Ranks (d, p, t), TP fastest: a target in stage 1 gives every rank of stage 1 (in every
    replica: the data-parallel groups of the stage keep their own times) its own class; the
    TP groups of stage 0 keep one class each."""
    topo = build_topology("torus2d", (4, 4), "nvlink4", 4)
    plain = Layout(topo, 2, 2, 4, symmetric=False, tp_groups=True)
    solo = int(plain.device[6])  # rank 6 = (0, 1, 2)
    lay = Layout(topo, 2, 2, 4, symmetric=False, tp_groups=True, solo_devices=(solo,))
    assert [c.tolist() for c in plain.classes] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                                   [12, 13, 14, 15]]
    assert [c.tolist() for c in lay.classes] == [[0, 1, 2, 3], [4], [5], [6], [7],
                                                 [8, 9, 10, 11], [12], [13], [14], [15]]
    assert lay.class_stage.tolist() == [0, 1, 1, 1, 1, 0, 1, 1, 1, 1]
    # every data-parallel group's classes are whole (no class is in part of them)
    for g in range(lay.n_groups("dp")):
        for c in lay.group_classes("dp", np.array([g])):
            assert lay.class_groups("dp", int(c)).tolist() == [g] or lay.class_stage[c] == 0


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("jitter", [0.0, 0.05])
def test_device_faults_in_fast_mode_agree_with_exact_mode(fault, jitter):
    fast = run(load_scenario(_faulty(fault, False, jitter))).summary
    exact = run(load_scenario(_faulty(fault, True, jitter))).summary
    assert fast["completed"] and exact["completed"]
    assert {"chained_transfers", "tp_group_agents"} <= set(fast["shortcuts_used"])
    assert fast["rank_classes"] < exact["rank_classes"] == exact["devices"]
    assert fast["events"] < exact["events"]
    d = _faulty(fault, False, jitter)
    d["faults"] = []
    calm = run(load_scenario(d)).summary  # the fault changes the run
    assert (calm["makespan_s"], calm["energy_j"]) != (fast["makespan_s"], fast["energy_j"])
    for key in ("iteration_time_s", "energy_j", "makespan_s"):
        assert fast[key] == pytest.approx(exact[key], rel=5e-3), key
    if jitter == 0.0:  # nothing random: the same times to rounding
        assert fast["iteration_time_s"] == pytest.approx(exact["iteration_time_s"], rel=1e-9)


def test_the_classes_a_fault_changes_stay_on_the_clock():
    """The straggler's class never runs ahead (the fault changes its device at run time);
    every other class does."""
    model = build(load_scenario(_faulty("straggler", False, 0.05)))
    _env, _fabric, ex, _ = simulate_untraced(model)
    target = int(model.layout.rank_class[np.flatnonzero(model.layout.device == 5)[0]])
    assert ex.clocked == {target}
    assert ex.ahead_ops[target] == 0
    assert all(n > 0 for c, n in enumerate(ex.ahead_ops) if c != target)


def test_faults_that_abort_or_cut_keep_every_transfer_in_a_process():
    d = _faulty("straggler", False)
    d["faults"].append({"kind": "link_down", "link": [0, 1], "time_s": 0.02})
    s = run(load_scenario(d)).summary
    assert "chained_transfers" not in s["shortcuts_used"]
    assert "tp_group_agents" not in s["shortcuts_used"]
    assert s["rank_classes"] == s["devices"]


@pytest.mark.parametrize("fault", ["straggler", "straggler_late"])
def test_every_pipeline_message_is_received_once(fault):
    """A TP group's class after a split stage receives each message from every rank of it
    (one class each): it takes the message when the last has arrived, and nothing is left in
    the mailboxes when the run ends (a message taken at its first sender's arrival would
    leave the later arrivals behind, never received)."""
    model = build(load_scenario(_faulty(fault, False)))
    lay = model.layout
    _env, _fabric, ex, _ = simulate_untraced(model)
    several = {k: n for k, n in ex._senders.items() if n > 1}
    assert several and set(several.values()) == {lay.tp}  # a group after a split stage
    assert ex._mail == {} and ex._got == {}
