"""Representative replica on the quotient network (issue 14, ``replica_quotient``).

References: max-min rates derived by hand for two small networks (a shared link, and a ring
whose representative crosses one link cycle twice); the flow engine on every flow of the same
transfers; and whole runs simulated with every flow (``twin.runner.simulate`` without the
quotient), which the quotient runs must reproduce to rounding (1e-9 relative: the same
max-min levels reached in another summation order), link by link.
"""

from __future__ import annotations

import numpy as np
import pytest

import twin.runner as R
from devices.fabric import Fabric, Phase
from devices.replicas import QuotientBroken, ReplicaQuotient, shift_permutation
from devices.spec import LinkSpec
from topologies.graph import build_topology
from topologies.routing import Router
from twin.build import build
from twin.catalogs import catalog
from twin.kernel.engine import Engine
from twin.kernel.flows import FlowNetwork
from twin.kernel.records import Recorder
from twin.scenario import load_scenario
from twin.summary import summarize


def _quotient(sigma, order, domain, cap):
    cap = np.asarray(cap, dtype=float)
    return ReplicaQuotient(np.asarray(sigma), order, np.asarray(domain, dtype=bool),
                           lambda ids: cap[np.asarray(ids)], len(cap))


def _finish_times(cap, routes, nbytes):
    env = Engine()
    net = FlowNetwork(env, np.asarray(cap, dtype=float))
    tr = net.transfer(routes, nbytes)
    env.run()
    return env.now, tr, net


def test_a_shared_link_splits_into_the_quotient_capacity_of_its_cycle():
    # replica 0 sends 0 -> 2 over [l0, l2], replica 1 sends 1 -> 3 over [l1, l2]; l0, l1
    # private (10 B/s), l2 shared (12 B/s): max-min gives each flow 12 / 2 = 6 B/s
    cap = [10.0, 10.0, 12.0]
    q = _quotient([1, 0, 3, 2], 2, [True, False, True, False], cap)
    reps, nbytes, new = q.reduce(np.array([0, 1]), np.array([2, 3]), [(0, 2), (1, 2)],
                                 np.array([60.0, 60.0]))
    assert reps == [(0, 2)] and nbytes.tolist() == [60.0]
    assert sorted(new.tolist()) == [0, 2]
    qcap = np.array(cap)
    qcap[new] *= q.capacity_scale(new)  # l0: 10 * 2 / 2, l2: 12 * 1 / 2
    assert qcap.tolist() == [10.0, 10.0, 6.0]
    t_full, _, full = _finish_times(cap, [(0, 2), (1, 2)], [60.0, 60.0])
    t_q, _, quo = _finish_times(qcap, reps, nbytes)
    assert t_full == pytest.approx(60.0 / 6.0) and t_q == pytest.approx(t_full)
    # real link bytes: l0, l1 carry 60 each, l2 carries 120 (weight n / |C| = 2)
    expanded = quo.link_bytes[q.canon] * q.weight(np.arange(3))
    assert expanded.tolist() == pytest.approx(full.link_bytes.tolist())
    assert full.link_bytes.tolist() == [60.0, 60.0, 120.0]


def test_a_representative_crossing_one_cycle_twice_counts_twice():
    # ring 0 -> 1 -> 2 -> 3 -> 0 (link i: i -> i + 1), every device sends two hops ahead;
    # the shift i -> i + 1 (order 4) puts all four links in one cycle, so the representative
    # 0 -> 2 crosses the quotient link twice. Each real link carries 2 flows: c / 2 each.
    c = 8.0
    q = _quotient([1, 2, 3, 0], 4, [True, False, False, False], [c] * 4)
    routes = [(i, (i + 1) % 4) for i in range(4)]
    reps, nbytes, new = q.reduce(np.arange(4), (np.arange(4) + 2) % 4, routes,
                                 np.full(4, 40.0))
    assert reps == [(0, 0)] and new.tolist() == [0]
    assert q.capacity_scale(new).tolist() == [1.0]
    t_full, _, full = _finish_times([c] * 4, routes, [40.0] * 4)
    t_q, _, quo = _finish_times([c] * 4, reps, nbytes)
    assert t_full == pytest.approx(40.0 / (c / 2)) and t_q == pytest.approx(t_full)
    expanded = quo.link_bytes[q.canon] * q.weight(np.arange(4))
    assert expanded.tolist() == pytest.approx(full.link_bytes.tolist())


@pytest.mark.parametrize("case", ["missing image", "other bytes", "two images",
                                  "other capacity", "not one per orbit"])
def test_a_phase_that_treats_replicas_differently_is_refused(case):
    cap = [10.0, 10.0, 12.0, 12.0]
    sigma = [1, 0, 3, 2]
    src, dst = np.array([0, 1]), np.array([2, 3])
    routes, nbytes, domain = [(0, 2), (1, 2)], np.array([5.0, 5.0]), [True, False, True, False]
    if case == "missing image":  # the image of 0 -> 2 is 1 -> 3, not sent
        dst = np.array([2, 2])
    if case == "other bytes":
        nbytes = np.array([5.0, 6.0])
    if case == "other capacity":
        routes = [(0, 2), (1, 3)]
        cap = [10.0, 10.0, 12.0, 13.0]
    q = _quotient(sigma, 2, domain, cap)
    if case == "two images":  # l2 maps onto l2 in one phase, onto l3 in the next
        q.reduce(src, dst, routes, nbytes)
        routes = [(0, 2), (1, 3)]
    if case == "not one per orbit":
        domain = [True, True, True, True]
        q = _quotient(sigma, 2, domain, cap)
    with pytest.raises(QuotientBroken):
        q.reduce(src, dst, routes, nbytes)



def test_a_fabric_link_that_is_its_own_image_reads_every_orbit_flows_bytes():
    # Four single-GPU nodes, two per leaf, one spine (oversubscription 2): nodes 0 and 1
    # send to nodes 2 and 3 across the spine. The shift (0 1)(2 3) fixes both leaves and the
    # spine, so the leaf-spine links are their own images (|C| = 1, n = 2): the one
    # representative flow crosses them at half their capacity and each carried 2 x B bytes,
    # busy as long as the private links. Fabric.link_bytes must weight by n / |C| = 2,
    # link_busy_s must not.
    links = catalog("links")
    nic = LinkSpec.model_validate(links.get("ib-ndr400-port").values)
    nbytes = 1e9

    def run(quotient: bool):
        env = Engine()
        topo = build_topology("switched", (1, 4), nic.name, 1, nic_link=nic.name,
                              nodes_per_leaf=2, oversubscription=2)
        fab = Fabric(env, topo, Router(topo), {nic.name: nic}, model="flow")
        if quotient:
            fab.set_quotient(ReplicaQuotient(np.array([1, 0, 3, 2]), 2,
                                             np.array([True, False, True, False]),
                                             fab.real_capacity, topo.n_links))
        fab.start([Phase(np.array([0, 1]), np.array([2, 3]), np.full(2, nbytes))], "send")
        env.run()
        return env.now, fab

    t_full, full = run(False)
    t_q, quo = run(True)
    weight = quo.quotient.weight(np.arange(quo.topo.n_links))
    shared = np.flatnonzero(weight == 2)
    assert len(shared) == 2  # leaf 0 -> spine, spine -> leaf 1
    drain = 2 * nbytes / nic.bytes_per_s  # both flows through one link of one NIC's rate
    assert t_full == pytest.approx(drain, rel=1e-3)  # plus microseconds of latency
    assert t_q == pytest.approx(t_full, rel=1e-12)
    np.testing.assert_allclose(quo.link_bytes[shared], 2 * nbytes, rtol=1e-12)
    np.testing.assert_allclose(quo.link_bytes, full.link_bytes, rtol=1e-12)
    np.testing.assert_allclose(quo.link_busy_s, full.link_busy_s, rtol=1e-12)
    used = full.link_bytes > 0
    np.testing.assert_allclose(quo.link_busy_s[used], quo.link_busy_s[shared[0]], rtol=1e-9)

def test_the_shift_moves_each_rank_k_replicas_on():
    # rank r = (d * pp + p) * tp + t on device 3r mod 8 (any placement): dp 4, pp 1, tp 2
    device = (3 * np.arange(8)) % 8
    sigma = shift_permutation(device, 4, 1, 2, 1)
    for r in range(8):
        assert sigma[device[r]] == device[(r + 2) % 8]
    assert sorted(sigma.tolist()) == list(range(8))


# ------------------------------------------------------------------ whole runs, every flow
_SWITCHED = {
    "name": "quotient-switched",
    "cluster": {"topology": {"kind": "switched", "shape": [8, 8], "nodes_per_leaf": 4},
                "device": "h100-sxm", "link": "nvlink4-switch", "links_per_edge": 18,
                "nic_link": "ib-ndr400-port"},
    "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 1024,
                 "global_batch": 32, "micro_batch": 1,
                 "parallelism": {"dp": 4, "tp": 4, "pp": 4}, "schedule": "interleaved",
                 "virtual_stages": 2, "iterations": 1},
    "trace": {"enabled": False},
}


def _variant(name: str) -> dict:
    import copy

    d = copy.deepcopy(_SWITCHED)
    w = d["workload"]
    if name == "full_shard":
        w["sharding"] = {"strategy": "full_shard"}
    elif name == "hybrid_shard":
        w["sharding"] = {"strategy": "hybrid_shard", "group": 2}
    elif name.startswith("hbm_ports"):  # ports whose capacity follows the memory mix
        d["memory"] = {"model": "frfcfs", "per_device_draws": False}
        if name == "hbm_ports_tp_overlap":  # NVLink-rate TP chunks beside blocks: caps bind
            d["overlap"] = {"tp_comm": True}
    elif name == "torus":
        d["cluster"] = {"topology": {"kind": "torus2d", "shape": [8, 8]}, "device": "h100-sxm",
                        "link": "nvlink4-switch"}
        w["parallelism"] = {"dp": 4, "tp": 4, "pp": 4}
        d["network"] = {"ring_model": "step"}  # (the default, auto, is lock-step here)
    elif name == "torus_lockstep":  # lock-step rings on the quotient (network.ring_model)
        d["cluster"] = {"topology": {"kind": "torus2d", "shape": [8, 8]}, "device": "h100-sxm",
                        "link": "nvlink4-switch"}
        d["network"] = {"ring_model": "lockstep"}
    elif name == "mesh":
        d["cluster"] = {"topology": {"kind": "mesh2d", "shape": [8, 8]}, "device": "h100-sxm",
                        "link": "nvlink4-switch"}
    return d


def _both(d: dict):
    model = build(load_scenario(d))
    out = {}
    for q in (True, False):
        env, fab, ex, _ = R.simulate(model, Recorder(), quotient=q)
        out[q] = (summarize(model, env, fab, ex, 0.0), fab)
    return out


@pytest.mark.parametrize("name,orbit", [("interleaved", 2), ("full_shard", 2),
                                        ("hybrid_shard", 2), ("hbm_ports", 2),
                                        ("hbm_ports_tp_overlap", 2),
                                        ("torus", 4), ("torus_lockstep", 4), ("mesh", 1)])
def test_a_quotient_run_is_the_run_with_every_flow(name, orbit):
    out = _both(_variant(name))
    (sq, fq), (sf, ff) = out[True], out[False]
    # switched: 4 replicas, 2 per leaf of 4 nodes, so the shift is by one leaf (order 2);
    # torus: a shift by one replica is a translation (order 4); mesh: none is (its edges),
    # the data-parallel ring's wrap-around pair has a longer route than its image
    assert sq["replica_orbit"] == orbit
    assert ("replica_quotient" in sq["shortcuts_used"]) == (orbit > 1)
    assert sf["replica_orbit"] == 1 and "replica_quotient" not in sf["shortcuts_used"]
    # rings are lock-step by default (ring_model auto, HBM ports too), step where asked
    assert sq["ring_model"] == sf["ring_model"] == ("step" if name == "torus" else "lockstep")
    assert (sq["lockstep_ring_transfers"] > 0) == (sq["ring_model"] == "lockstep")
    assert sq["lockstep_ring_transfers"] == sf["lockstep_ring_transfers"]
    for key in ("iteration_time_s", "energy_j", "router_energy_j", "link_bytes",
                "max_link_utilization"):
        assert sq[key] == pytest.approx(sf[key], rel=1e-9, abs=1e-12), key
    for part, joules in sf["energy_breakdown_j"].items():
        assert sq["energy_breakdown_j"][part] == pytest.approx(joules, rel=1e-9, abs=1e-9), part
    np.testing.assert_allclose(fq.link_bytes, ff.link_bytes, rtol=1e-9, atol=1e-3)
    np.testing.assert_allclose(fq.link_busy_s, ff.link_busy_s, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(fq.port_bytes, ff.port_bytes, rtol=1e-9, atol=1e-3)
    np.testing.assert_array_equal(fq.bytes_sent, ff.bytes_sent)
    np.testing.assert_array_equal(fq.bytes_received, ff.bytes_received)



def _breaking_reduce(after: int):
    """A ``ReplicaQuotient.reduce`` that refuses the phase of its ``after + 1``-th call and that
    same phase whenever it is planned again (as a phase that is not replica-symmetric is), and
    reduces every other one: the probe that chooses a quotient still finds one, so a second
    attempt on a quotient would meet the phase again."""
    real = ReplicaQuotient.reduce
    state = {"n": 0, "broken": None}

    def reduce(self, src, dst, *a):
        state["n"] += 1
        key = (np.asarray(src).tobytes(), np.asarray(dst).tobytes())
        if state["n"] == after + 1:
            state["broken"] = key
        if key == state["broken"]:
            raise QuotientBroken("test: a phase that is not symmetric")
        return real(self, src, dst, *a)

    return reduce, state


def test_a_run_that_breaks_the_quotient_is_simulated_again_with_every_flow(monkeypatch):
    model = build(load_scenario(_variant("interleaved")))
    env, fab, ex, _ = R.simulate(model, Recorder())
    ref = summarize(model, env, fab, ex, 0.0)
    flaky, state = _breaking_reduce(15)  # half-way through the run (30 plans)
    monkeypatch.setattr(ReplicaQuotient, "reduce", flaky)
    env, fab, ex, _ = R.simulate_untraced(model)
    got = summarize(model, env, fab, ex, 0.0)
    assert state["broken"] is not None
    assert got["replica_quotient_fallback"] == "test: a phase that is not symmetric"
    assert got["replica_orbit"] == 1
    assert got["iteration_time_s"] == ref["iteration_time_s"]
    assert got["energy_j"] == ref["energy_j"]


def _datasets(path) -> dict[str, np.ndarray]:
    import h5py

    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def _assert_same_trace(a, b) -> None:
    da, db = _datasets(a), _datasets(b)
    assert sorted(da) == sorted(db)
    for name, x in da.items():
        y = db[name]
        if x.dtype.kind in "fc":
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12, err_msg=name)
        else:
            np.testing.assert_array_equal(x, y, err_msg=name)


def test_a_traced_quotient_run_writes_the_trace_of_every_flow(tmp_path, monkeypatch):
    d = _variant("full_shard")
    d["trace"] = {"enabled": True, "tables": ["ops", "messages", "links", "devices"]}
    scen = load_scenario(d)
    q = R.run(scen, tmp_path / "quotient.h5")
    assert q.summary["replica_orbit"] == 2
    monkeypatch.setattr(R, "uses_quotient", lambda _s: False)
    full = R.run(scen, tmp_path / "full.h5")
    assert full.summary["replica_orbit"] == 1
    _assert_same_trace(q.trace_path, full.trace_path)


def test_a_traced_run_that_breaks_the_quotient_starts_its_trace_again(tmp_path, monkeypatch):
    d = _variant("interleaved")
    d["trace"] = {"enabled": True, "tables": ["ops", "messages", "links", "devices"]}
    scen = load_scenario(d)
    flaky, state = _breaking_reduce(15)
    monkeypatch.setattr(ReplicaQuotient, "reduce", flaky)
    got = R.run(scen, tmp_path / "redone.h5")
    assert state["broken"] is not None
    assert got.summary["replica_quotient_fallback"] == "test: a phase that is not symmetric"
    assert list(tmp_path.iterdir()) == [tmp_path / "redone.h5"]  # no partial file left
    monkeypatch.setattr(R, "uses_quotient", lambda _s: False)
    full = R.run(scen, tmp_path / "full.h5")
    _assert_same_trace(got.trace_path, full.trace_path)


def test_a_phase_without_flows_reduces_to_nothing():
    """An empty phase plan has no representative, no bytes and no new link."""
    q = _quotient([1, 0], 2, [True, False], np.ones(4))
    routes, nbytes, new = q.reduce(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                   [], np.zeros(0))
    assert routes == [] and len(nbytes) == 0 and len(new) == 0


def test_a_link_whose_image_was_link_0_cannot_map_elsewhere_later():
    """Two replicas swapped by the shift (devices 0 <-> 1). A first plan sends 0 -> 1 over link
    3 and 1 -> 0 over link 0, so the shift maps link 3 onto link 0; a later plan whose image of
    link 3 is link 2 is not invariant under the same shift and is refused (link 0 is a link
    like any other)."""
    q = _quotient([1, 0], 2, [True, False], np.ones(4))
    src, dst = np.array([0, 1]), np.array([1, 0])
    q.reduce(src, dst, [[3], [0]], np.ones(2))
    assert q.image[3] == 0 and q.image[0] == 3
    with pytest.raises(QuotientBroken, match="differs between phases"):
        q.reduce(src, dst, [[3], [2]], np.ones(2))
