"""What a loaded scenario decides about its run (``twin.scenario.Scenario``'s properties and
defaults), case by case against the rules their docstrings state: which shortcut a run may
take, which ring model and whether transfers pay for HBM contention; and ``--set`` on list
items."""

from __future__ import annotations

import pytest

from tests.conftest import scenario_dict
from twin.kernel.errors import ScenarioError
from twin.runner import run
from twin.scenario import load_scenario

TP = ["workload.parallelism.tp=2", "workload.parallelism.dp=4"]


def _scen(*overrides: str, **updates):
    return load_scenario(scenario_dict(**updates), list(overrides))


def test_documented_defaults():
    raw = scenario_dict()
    del raw["seed"], raw["cluster"]["links_per_edge"]
    s = load_scenario(raw)
    assert s.seed == 0 and s.cluster.links_per_edge == 1
    assert s.simulation.lockstep_rings is True


def test_ring_model_resolved():
    assert _scen().rings == "lockstep"                                  # flow model, auto
    assert _scen("network.ring_model=lockstep").rings == "lockstep"
    assert _scen("network.ring_model=step").rings == "step"
    assert _scen("network.model=packet").rings == "step"


def test_transfers_pay_for_hbm_contention_only_with_a_controller_in_the_flow_model():
    assert not _scen().transfers_capped                                 # roofline
    assert _scen("memory.model=frfcfs").transfers_capped
    assert not _scen("memory.model=frfcfs", "memory.transfer_cap=false").transfers_capped
    assert not _scen("memory.model=frfcfs", "network.model=packet").transfers_capped


@pytest.mark.parametrize("extra,groups", [
    ([], False),                                                 # symmetric: no agents at all
    (["simulation.compute_jitter_cov=0.05"], True),              # jitter alone
    (["simulation.compute_jitter_cov=0.05", "workload.parallelism.tp=1",
      "workload.parallelism.dp=8"], False),                      # no TP group to stand for
    (["simulation.compute_jitter_cov=0.05", "simulation.tp_group_agents=false"], False),
    (["simulation.compute_jitter_cov=0.05", "simulation.exact=true"], False),
    (["simulation.compute_jitter_cov=0.05", "power.thermal.inlet_gradient_k=1"], False),
    (["simulation.compute_jitter_cov=0.05", "overlap.tp_comm=true"], False),
    (["memory.model=frfcfs"], True),                             # per-device draws alone
    (["memory.model=frfcfs", "overlap.tp_comm=true"], True),     # streams as asked
    (["memory.model=frfcfs", "simulation.compute_jitter_cov=0.05"], False),
    (["memory.model=queue"], True),
    (["memory.model=queue", "memory.bound=auto"], False),        # fresh heavy-tailed draws
    (["memory.model=queue", "memory.bound=bandwidth"], True),
])
def test_tp_group_agents_as_documented(extra, groups):
    s = _scen(*TP, *extra)
    assert s.tp_groups is groups
    if groups:
        assert not s.symmetric


def test_a_list_item_is_set_by_its_index_and_only_if_it_exists():
    s = _scen("cluster.topology.shape.1=4", "workload.parallelism.dp=16",
              "workload.global_batch=32")
    assert s.cluster.topology.shape == (4, 4)
    for bad in ("cluster.topology.shape.2=4", "cluster.topology.shape.x=4"):
        with pytest.raises(ScenarioError, match=r"no such list index.*allowed: 0\.\.1"):
            _scen(bad)
    # an index into a list the scenario does not give: the list is named, not made a mapping
    # ("faults: must be a list (given: {'0': ...})")
    with pytest.raises(ScenarioError, match=r"faults\.0: no such list index: faults is not set"):
        _scen("faults.0.factor=2")
    with pytest.raises(ScenarioError, match="allowed: none: empty"):
        _scen("faults=[]", "faults.0={kind: straggler}")


def test_an_explicit_dp_algorithm_must_fit_hybrid_shard_groups_too():
    """torus2d all-reduces over a 2D sub-grid: the data-parallel group of a 4x2 torus is one
    (full sharding is accepted), but hybrid sharding also runs it over shard groups of 2
    devices in a row, which are not, and is refused naming them."""
    full = _scen("network.dp_algorithm=torus2d", "workload.sharding.strategy=full_shard")
    assert full.network.dp_algorithm == "torus2d"
    with pytest.raises(ScenarioError, match="does not fit the shard groups"):
        _scen("network.dp_algorithm=torus2d", "workload.sharding.strategy=hybrid_shard",
              "workload.sharding.group=2")


@pytest.mark.parametrize("algorithm", ["torus2d", "hierarchical", "rail_rings"])
def test_an_algorithm_that_needs_another_topology_is_refused_before_the_run(algorithm):
    """``rail_rings`` on a torus passed the scenario check and raised ``NotApplicable`` inside
    the run (a traceback); every explicit algorithm but the rings is checked against the
    groups now. On the switched library scenario rail_rings and hierarchical run."""
    from tests.conftest import ROOT

    d = scenario_dict(cluster__topology={"kind": "ring", "shape": [8]},
                      workload__parallelism={"dp": 4, "tp": 2, "pp": 1})
    for kind in ("tp", "dp"):
        with pytest.raises(ScenarioError, match=f"network.{kind}_algorithm: {algorithm} does "
                                                f"not fit the {kind} groups of ring"):
            load_scenario(d, [f"network.{kind}_algorithm={algorithm}"])
    if algorithm != "torus2d":
        s = load_scenario(ROOT / "scenarios" / "switched.yaml",
                          [f"network.dp_algorithm={algorithm}", "trace.enabled=false"])
        assert run(s).summary["iteration_time_s"] > 0


@pytest.mark.parametrize("key,ok,bad", [
    ("nics_per_node", ["1", "8"], ["0", "9"]),             # 1..GPUs of a node
    ("nodes_per_leaf", ["1", "2"], ["0"]),
    ("oversubscription", ["1.0", "2.5"], ["0.5", ".inf", ".nan"]),  # down- per up-link
])
def test_switched_options_at_their_bounds(key, ok, bad):
    from tests.conftest import ROOT

    path = ROOT / "scenarios" / "switched.yaml"
    for value in ok:
        s = load_scenario(path, [f"cluster.topology.{key}={value}"])
        assert getattr(s.cluster.topology, key) == pytest.approx(float(value))
    for value in bad:
        with pytest.raises(ScenarioError, match=f"cluster.topology.{key}"):
            load_scenario(path, [f"cluster.topology.{key}={value}"])
