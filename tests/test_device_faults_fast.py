"""Faults that only change a device (stragglers, HBM degradation, cooling failures) in fast
mode: chained transfers, one agent per TP group with the targets' groups split into one agent
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


def test_a_split_group_gives_each_of_its_ranks_a_class_and_keeps_the_others_grouped():
    topo = build_topology("torus2d", (4, 4), "nvlink4", 4)
    plain = Layout(topo, 2, 2, 4, symmetric=False, tp_groups=True)
    solo = int(plain.device[6])  # rank 6: group 1 (ranks 4..7)
    lay = Layout(topo, 2, 2, 4, symmetric=False, tp_groups=True, solo_devices=(solo,))
    assert [c.tolist() for c in plain.classes] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                                   [12, 13, 14, 15]]
    assert [c.tolist() for c in lay.classes] == [[0, 1, 2, 3], [4], [5], [6], [7],
                                                 [8, 9, 10, 11], [12, 13, 14, 15]]
    assert lay.class_stage.tolist() == [0, 1, 1, 1, 1, 0, 1]
    assert (lay.rank_class[lay.classes[3]] == 3).all()


def test_the_collective_of_a_split_group_and_whole_ones_is_closed_over_their_groups():
    """Data-parallel groups are (p, t); a whole TP group's class is in every t of its stage,
    a split one's class in its own t only: each class's collective is over every such group
    and every class with a rank in them, the same for all of them."""
    topo = build_topology("torus2d", (4, 4), "nvlink4", 4)
    lay = Layout(topo, 2, 2, 4, symmetric=False, tp_groups=True,
                 solo_devices=(int(Layout(topo, 2, 2, 4).device[6]),))
    got = {c: lay.collective_of("dp", c) for c in range(len(lay.classes))}
    stage1 = [c for c in got if lay.class_stage[c] == 1]
    for c in stage1:
        gids, parts = got[c]
        assert gids.tolist() == [4, 5, 6, 7]  # p = 1, t = 0..3
        assert parts.tolist() == stage1
    gids, parts = got[0]  # stage 0: nothing split, the groups of its own ranks
    assert gids.tolist() == [0, 1, 2, 3] and parts.tolist() == [0, 5]


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
