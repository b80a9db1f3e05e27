"""Closed-form intra-node tensor-parallel collectives (issue 14, ``tp_closed_form``).

A TP collective whose links no other traffic can use is costed as the flow engine would cost
it alone on the network (``Fabric.start_closed``) instead of as flow transfers. References:
the alpha-beta / NCCL formula derived here from the catalog constants; the flow engine itself
(``Fabric.run_phase``) on the same phase; and ``simulation.exact: true`` (every rank, every
transfer a process, no shortcut) for whole runs, within 0.5% (in fact to rounding: with
nothing else on those links the two are the same arithmetic).
"""

from __future__ import annotations

import numpy as np
import pytest

from devices.fabric import Fabric, Phase
from devices.spec import LinkSpec
from topologies.graph import build_topology
from topologies.routing import Router
from twin.catalogs import catalog
from twin.kernel.engine import Engine
from twin.runner import run
from twin.scenario import load_scenario
from workloads import collectives as C
from workloads import nccl


def _switched_fabric(nodes: int = 1, record=None):
    spec = LinkSpec.model_validate(catalog("links").get("nvlink4-switch").values)
    nic = LinkSpec.model_validate(catalog("links").get("ib-ndr400-port").values)
    env = Engine()
    topo = build_topology("switched", (8, nodes), spec.name, 18, nic_link=nic.name)
    fab = Fabric(env, topo, Router(topo), {spec.name: spec, nic.name: nic}, model="flow",
                 record=record)
    return env, topo, fab, spec


def _nccl_ring_time(op: str, p: int, n: float, bus: float) -> float:
    """NCCL's ring model inside one NVLink node (tuning.cc): the fastest protocol's
    base + steps x hw latency + n / (f B p / steps), constants from the catalog."""
    k = nccl.ring_constants()
    steps = 2 * (p - 1) if op == "allreduce" else p - 1
    best = np.inf
    for proto in ("LL", "LL128", "simple"):
        f = {"LL": k["ll_bandwidth_fraction"]["allreduce_or_multinode" if op == "allreduce"
                                                else "other"],
             "LL128": k["ll128_bandwidth_fraction"], "simple": 1.0}[proto]
        lat = (k["base_latency_us"][proto] + steps * k["step_latency_nvlink_us"][proto]) * 1e-6
        best = min(best, lat + n / (f * bus * p / steps))
    return best


@pytest.mark.parametrize("op", C.OPS)
@pytest.mark.parametrize("n", [4e3, 2e6, 256e6])  # LL, LL128 and Simple sizes
def test_closed_form_is_the_nccl_alpha_beta_ring(op, n):
    env, topo, fab, spec = _switched_fabric()
    group = np.arange(8)[None, :]
    phases = nccl.tune_phases(op, C.collective_phases(op, "ring", group, n, topo), n, 8, fab)
    bus = spec.bytes_per_s * 18  # one GPU's 18 links to the NVSwitch: the ring's bottleneck
    expect = _nccl_ring_time(op, 8, n, bus)
    ev = fab.start_closed(phases)
    env.run(ev)
    assert env.now == pytest.approx(expect, rel=1e-12)
    # the bytes: every GPU sends (p-1)/p n per ring pass, over its uplink and downlink
    passes = 2 if op == "allreduce" else 1
    per_gpu = passes * 7 / 8 * n
    assert fab.bytes_sent.sum() == pytest.approx(8 * per_gpu, rel=1e-12)
    assert fab.bytes_received.sum() == pytest.approx(8 * per_gpu, rel=1e-12)
    lb = fab.link_bytes
    assert lb.sum() == pytest.approx(2 * 8 * per_gpu, rel=1e-12)  # two hops a message
    assert np.count_nonzero(lb) == 16
    drain = passes * 7 / 8 * n / bus
    assert fab.link_busy_s.max() == pytest.approx(drain, rel=1e-12)


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring"])
def test_closed_form_equals_the_flow_engine_alone(algorithm):
    rows_a, rows_b = [], []
    env_a, topo, fab_a, _ = _switched_fabric(2, rows_a.append)
    env_b, _, fab_b, _ = _switched_fabric(2, rows_b.append)
    groups = np.arange(16).reshape(2, 8)  # both nodes' TP groups at once
    n = 24e6
    phases = nccl.tune_phases("allreduce", C.collective_phases(
        "allreduce", algorithm, groups, n, topo), n, 8, fab_a)

    def body():
        for ph in phases:
            yield from fab_b.run_phase(ph)
    env_a.run(fab_a.start_closed(phases))
    env_b.run(env_b.process(body()))
    assert env_a.now == pytest.approx(env_b.now, rel=1e-12)
    for attr in ("link_bytes", "link_busy_s", "bytes_sent", "bytes_received"):
        np.testing.assert_allclose(getattr(fab_a, attr), getattr(fab_b, attr), rtol=1e-12,
                                   atol=1e-9, err_msg=attr)
    np.testing.assert_allclose([r[:2] for r in rows_a], [r[:2] for r in rows_b], rtol=1e-12)
    assert [r[2:-1] for r in rows_a] == [r[2:-1] for r in rows_b]  # but the plan serial


def test_no_closed_form_when_flows_of_a_phase_drain_at_different_times():
    """Flows that share a link unequally park at step barriers: the flow engine's business."""
    _env, _topo, fab, _ = _switched_fabric()

    ph = Phase(np.array([0, 0, 3]), np.array([1, 2, 4]), np.array([1e6, 1e6, 1e6]), 2)
    assert fab.closed_form(ph) is None  # GPU 0's uplink carries two flows, GPU 3's one
    ok = Phase(np.array([0, 1]), np.array([1, 2]), np.array([1e6, 1e6]), 2)
    assert fab.closed_form(ok) is not None


# ----------------------------------------------------------------- whole runs
def _run(exact: bool, shape=(8, 4), dp=2, tp=8, pp=2, topology=None, **extra) -> dict:
    d = {"name": "tp-closed", "seed": 3,
         "cluster": {"topology": {"kind": "switched", "shape": list(shape), **(topology or {})},
                     "device": "h100-sxm", "link": "nvlink4-switch", "links_per_edge": 18,
                     "nic_link": "ib-ndr400-port"},
         "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 1024,
                      "global_batch": 8 * dp, "micro_batch": 1,
                      "parallelism": {"dp": dp, "tp": tp, "pp": pp}, "iterations": 1},
         "simulation": {"exact": exact}, "trace": {"enabled": False}}
    for k, v in extra.items():
        d.setdefault(k, {}).update(v) if isinstance(v, dict) else d.__setitem__(k, v)
    return run(load_scenario(d)).summary


CASES = {  # 2-4 DGX-like nodes; TP 8 fills a node, p2p and DP traffic leave by the NICs
    "tp8_pp2_dp2": {},
    "tp8_dp4_no_pp": {"dp": 4, "pp": 1},
    "tp8_pp2_dp2_tp_overlap": {"overlap": {"tp_comm": True}},
    "tp8_pp4_interleaved": {"dp": 1, "pp": 4, "workload": {"schedule": "interleaved",
                                                           "virtual_stages": 2}},
    # TP 2 fills a two-GPU node: a pair's collectives are closed forms too
    "tp2_pp2_dp2_two_gpu_nodes": {"shape": (2, 4), "dp": 2, "tp": 2, "pp": 2},
}


@pytest.mark.parametrize("case", list(CASES))
def test_closed_form_runs_agree_with_exact_mode(case):
    kw = CASES[case]
    fast, exact = _run(False, **kw), _run(True, **kw)
    assert "tp_closed_form" in fast["shortcuts_used"]
    assert fast["tp_closed_form_collectives"] > 0
    assert exact["shortcuts_used"] == [] and exact["tp_closed_form_collectives"] == 0
    for key in ("iteration_time_s", "energy_j", "makespan_s"):
        assert fast[key] == pytest.approx(exact[key], rel=5e-3), key
    # nothing shares those links, so it is the same arithmetic: agreement to rounding
    for key in ("iteration_time_s", "energy_j", "link_bytes", "bytes_sent",
                "max_link_utilization", "exposed_comm_fraction"):
        assert fast[key] == pytest.approx(exact[key], rel=1e-9), key


def test_jitter_runs_use_it_per_group():
    """Without rank symmetry every TP group's ranks rendezvous; the collective still costs
    the closed form, and the run equals the same run on the flow network."""
    jit = {"simulation": {"compute_jitter_cov": 0.05, "tp_group_agents": False}}
    fast = _run(False, **jit)
    assert not fast["symmetry_used"] and fast["tp_closed_form_collectives"] > 0
    # communication_energy on: device energy of the collectives is accounted either way
    both = _run(False, **jit, power={"communication_energy": True})
    ref = _run(True, **jit, power={"communication_energy": True})
    assert both["tp_closed_form_collectives"] > 0
    for key in ("iteration_time_s", "energy_j", "link_bytes"):
        assert both[key] == pytest.approx(ref[key], rel=1e-9), key


def _grid_run(kind: str, exact: bool, jitter: float = 0.0) -> dict:
    """llama3.2-1b on a 4x4 grid, tp 4 x pp 4 (snake placement: on the torus each TP group
    is a row)."""
    sim = {"exact": exact, **({"compute_jitter_cov": jitter, "tp_group_agents": False}
                              if jitter else {})}
    return run(load_scenario({
        "name": "grid", "seed": 3,
        "cluster": {"topology": {"kind": kind, "shape": [4, 4]}, "device": "h100-sxm",
                    "link": "nvlink4", "links_per_edge": 4},
        "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 1024,
                     "global_batch": 8, "micro_batch": 1,
                     "parallelism": {"dp": 1, "tp": 4, "pp": 4}, "iterations": 1},
        "simulation": sim, "trace": {"enabled": False}})).summary


@pytest.mark.parametrize("jitter", [0.0, 0.05])
def test_torus_rows_closed_into_tp_rings_take_it(jitter):
    """A grid has no nodes, but on a torus each row is its TP group's ring and pipeline sends
    run along the columns: nothing else routes over the ring, so the closed form applies (with
    and without rank symmetry) and the run equals the flow network's to rounding."""
    fast, exact = _grid_run("torus2d", False, jitter), _grid_run("torus2d", True, jitter)
    assert "tp_closed_form" in fast["shortcuts_used"]
    assert fast["tp_closed_form_collectives"] > 0 and fast["events"] < exact["events"]
    for key in ("iteration_time_s", "energy_j", "makespan_s", "link_bytes", "bytes_sent",
                "max_link_utilization", "exposed_comm_fraction"):
        assert fast[key] == pytest.approx(exact[key], rel=1e-9), key
    # on the mesh the snake tiles 2x2 TP blocks, and pipeline sends between blocks route
    # over their ring links: the static check must refuse
    assert _grid_run("mesh2d", False, jitter)["tp_closed_form_collectives"] == 0


@pytest.mark.slow  # 10 s: make test-slow
def test_falls_back_where_tp_links_are_shared_or_can_fail():
    # a torus with tp 2 x pp 4: TP pairs share links with DP / p2p routes
    torus = run(load_scenario({
        "name": "torus", "seed": 3,
        "cluster": {"topology": {"kind": "torus2d", "shape": [4, 4]}, "device": "h100-sxm",
                    "link": "nvlink4", "links_per_edge": 4},
        "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 1024,
                     "global_batch": 16, "micro_batch": 1,
                     "parallelism": {"dp": 2, "tp": 2, "pp": 4}, "iterations": 1},
        "trace": {"enabled": False}})).summary
    assert "tp_closed_form" not in torus["shortcuts_used"]
    assert torus["tp_closed_form_collectives"] == 0
    # TP 4: two stages in a node, so pipeline sends cross the TP groups' NVSwitch links
    shared = _run(False, shape=(8, 2), dp=2, tp=4, pp=2)
    assert shared["tp_closed_form_collectives"] == 0
    assert "chained_transfers" in shared["shortcuts_used"]
    # NICs on the NVSwitch (2 per node): inter-node traffic uses the GPUs' NVSwitch links
    nic = _run(False, topology={"nics_per_node": 2})
    assert nic["tp_closed_form_collectives"] == 0
    # a fault on an NVLink of a TP group: its transfers must be cut and rerouted
    faulty = _run(False, faults=[{"kind": "link_failure", "link": [0, 32], "time_s": 0.001,
                                  "duration_s": 0.002}])
    assert "tp_closed_form" not in faulty["shortcuts_used"]
    assert faulty["tp_closed_form_collectives"] == 0
    # HBM ports (memory.transfer_cap under FR-FCFS) with overlapped TP: a chunk's collective
    # runs beside a GEMM chunk, whose mix caps the ports, so no TP cost is fixed in advance
    capped = _run(False, memory={"model": "frfcfs"}, overlap={"tp_comm": True})
    assert capped["tp_closed_form_collectives"] == 0
    uncapped = _run(False, memory={"model": "frfcfs", "transfer_cap": False},
                    overlap={"tp_comm": True})
    assert uncapped["tp_closed_form_collectives"] > 0
    # the healthy layout does take it
    assert _run(False)["tp_closed_form_collectives"] > 0


@pytest.mark.parametrize("memory", [{"model": "frfcfs"},
                                    {"model": "frfcfs", "per_device_draws": False}])
def test_blocking_tp_beside_hbm_ports_takes_the_closed_form(memory, monkeypatch):
    """HBM ports are capped only while a compute block of their device runs
    (``DeviceStreams.port_capacity``); a blocking TP collective (no TP overlap) has no block
    beside it on any device taking part, so its ports are uncapped and its cost is the
    closed form's. The run equals the same run with the closed form refused (every TP
    collective through the flow engine and its ports, the same random draws) to rounding,
    with and without rank symmetry."""
    from workloads.executor import Executor

    fast = _run(False, memory=memory)
    assert fast["tp_closed_form_collectives"] > 0 and fast["hbm_port_capped_s"] > 0
    monkeypatch.setattr(Executor, "tp_closed_form_groups", lambda self, ports=True: set())
    flows = _run(False, memory=memory)  # (so no fluid jobs either: devices.fluid)
    assert flows["tp_closed_form_collectives"] == 0 and fast["events"] < flows["events"]
    for key in ("iteration_time_s", "energy_j", "makespan_s", "link_bytes", "bytes_sent",
                "hbm_port_capped_s", "hbm_slowdown_mean", "exposed_comm_fraction"):
        assert fast[key] == pytest.approx(flows[key], rel=1e-9), key


def test_static_check_sees_every_other_route():
    """The exclusive groups of a mixed layout: direct check of the link sets."""
    from twin.build import build
    from twin.kernel.records import Recorder
    from twin.runner import simulate

    d = {"name": "mixed", "seed": 3,
         "cluster": {"topology": {"kind": "switched", "shape": [8, 4]}, "device": "h100-sxm",
                     "link": "nvlink4-switch", "links_per_edge": 18,
                     "nic_link": "ib-ndr400-port"},
         "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 1024,
                      "global_batch": 16, "micro_batch": 1,
                      "parallelism": {"dp": 2, "tp": 8, "pp": 2}, "iterations": 1},
         "trace": {"enabled": False}}
    model = build(load_scenario(d))
    _env, fabric, ex, _ = simulate(model, Recorder())
    ok = ex.tp_closed_form_groups()
    assert ok == {(0,), (1,)}  # both stage classes: every TP group fills one node
    # every link a TP group's collective uses is an NVSwitch link of its own node, and no
    # pipeline or DP route touches it
    topo, lay = model.topo, model.layout
    for g in range(lay.n_groups("tp")):
        devs = lay.group_devices("tp", g)
        node = set((devs // 8).tolist())
        assert len(node) == 1
        for a, b in zip(devs, np.roll(devs, -1), strict=True):
            for lk in fabric.router.route(int(a), int(b)):
                assert not fabric.network[lk]
                ends = {int(topo.link_src[lk]), int(topo.link_dst[lk])}
                assert ends & set(devs.tolist())
