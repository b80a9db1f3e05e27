"""Ring collectives: the per-step barrier model, its refinement, and the lock-step model.

``network.ring_model: step`` sends each member's chunk of a ring step as its own flow and holds
every member at a barrier until the slowest has finished the step; ``ring_substeps`` cuts each
chunk into that many barrier-synchronised parts (the model's discretization). ``lockstep``
sends the ring as one flow whose members share one rate, the slowest's (``devices.phase.
lockstep_ok``). The reference here is the step model itself, refined: as its barriers get finer
its result must move towards the lock-step one (the fluid limit of a ring pipelined in small
slices), which is the claim the ``lockstep`` model rests on.
"""

from __future__ import annotations

import pytest

from twin.kernel.errors import ScenarioError
from twin.runner import run
from twin.scenario import load_scenario


def _scenario(ring_model: str, substeps: int = 1, exact: bool = False,
              hop_latency_us: float | None = None) -> dict:
    """GPT 1.7B on an 8x8 torus, tp 4 x pp 2 x dp 8, compute jitter (every rank simulated, so
    the data-parallel rings run out of step beside pipeline and tensor-parallel traffic);
    ``hop_latency_us`` replaces the NVLink4 catalog's per-hop latency."""
    link = ("nvlink4" if hop_latency_us is None
            else {"base": "nvlink4", "latency_us": hop_latency_us})
    return {
        "name": "rings", "seed": 3,
        "cluster": {"topology": {"kind": "torus2d", "shape": [8, 8]}, "device": "h100-sxm",
                    "link": link},
        "workload": {"model": "gpt-1.7b", "precision": "bf16", "global_batch": 16,
                     "micro_batch": 1, "parallelism": {"dp": 8, "tp": 4, "pp": 2},
                     "recompute": "selective", "sequence_parallel": True, "iterations": 1},
        "network": {"ring_model": ring_model, "ring_substeps": substeps},
        "simulation": {"compute_jitter_cov": 0.05, "exact": exact},
        "trace": {"enabled": False},
    }


def _summary(*args, **kwargs) -> dict:
    return run(load_scenario(_scenario(*args, **kwargs))).summary


@pytest.mark.slow  # seven runs of the jittered 8x8 torus (~20 s): `make test-slow`
def test_step_model_converges_to_lockstep_as_barriers_get_finer():
    """The barrier's discretization alone: the links' hop latency is set to 0 (the data-
    parallel rings' members here are 2-4 hops apart, and what they pay beyond the nearest
    pair's latency shifts the jittered replicas' rings against the other traffic; with the
    catalog's 1 us, and 2 or 5 us, the two models' runs then differ by 3e-4 to 5e-4 in ways
    finer barriers do not remove, while at 0 and 0.5 us the error shrinks as below)."""
    lock = _summary("lockstep", hop_latency_us=0.0)
    assert lock["ring_model"] == "lockstep" and lock["lockstep_ring_transfers"] > 0
    assert "lockstep_rings" not in lock["shortcuts_used"]  # the model, not a shortcut
    errors = {}
    for k in (1, 4, 16):
        s = _summary("step", k, hop_latency_us=0.0)
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
    # with the catalog's hop latency the two ring models stay within 1e-3 of each other
    lock = _summary("lockstep")
    for k in (1, 16):
        s = _summary("step", k)
        assert abs(s["iteration_time_s"] / lock["iteration_time_s"] - 1) < 1e-3, k


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


def test_ring_model_auto_is_lockstep_where_it_applies():
    """The default (``auto``) runs rings lock-step in the flow model, HBM ports or not, and
    the step model in the packet model; the summary says which."""
    d = _scenario("step")
    del d["network"]["ring_model"], d["network"]["ring_substeps"]
    assert load_scenario(d).network.ring_model == "auto"
    assert load_scenario(d).rings == "lockstep"
    d["memory"] = {"model": "frfcfs"}  # (transfer_cap on by default: HBM ports)
    assert load_scenario(d).rings == "lockstep"
    d["network"]["ring_model"] = "lockstep"
    assert load_scenario(d).rings == "lockstep"
    d.pop("memory")
    d["network"]["model"] = "packet"
    d["network"]["ring_model"] = "auto"
    assert load_scenario(d).rings == "step"


def _ports(ring_model: str, substeps: int = 1) -> dict:
    """:func:`_scenario` on a 4x4 torus (dp 2) with HBM ports (FR-FCFS, ``transfer_cap``
    on by default) and overlapped TP chunks: each member's port is capped by its own
    device's blocks, and with jitter those run out of step, so a ring's members get
    different rates."""
    d = _scenario(ring_model, substeps)
    d["cluster"]["topology"]["shape"] = [4, 4]
    d["workload"]["parallelism"]["dp"] = 2
    d["workload"]["global_batch"] = 4
    d["memory"] = {"model": "frfcfs"}
    d["overlap"] = {"tp_comm": True}
    return d


@pytest.mark.slow  # 15 s: make test-slow
def test_with_hbm_ports_the_step_model_converges_to_lockstep():
    """The claim of the first test where HBM ports cap the members' rates: the lock-step
    ring (at its slowest member's port) is the limit of the step model as its barriers get
    finer."""
    lock = run(load_scenario(_ports("lockstep"))).summary
    assert lock["ring_model"] == "lockstep" and lock["lockstep_ring_transfers"] > 0
    assert lock["hbm_port_capped_s"] > 0 and not lock["symmetry_used"]
    errors = {}
    for k in (1, 4, 16):
        s = run(load_scenario(_ports("step", k))).summary
        assert s["ring_model"] == "step" and s["lockstep_ring_transfers"] == 0
        errors[k] = {key: s[key] / lock[key] - 1 for key in ("iteration_time_s", "energy_j")}
    for key in ("iteration_time_s", "energy_j"):
        e = [abs(errors[k][key]) for k in (1, 4, 16)]
        assert e[0] > e[1] > e[2], (key, errors)
        assert e[2] <= e[0] / 4, (key, errors)
    assert abs(errors[1]["iteration_time_s"]) > 1e-5  # (the models do differ here)


def test_ring_substeps_need_the_step_model():
    d = _scenario("lockstep", 4)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(d)
    assert "ring_substeps" in str(exc.value) and "ring_model: step" in str(exc.value)
    del d["network"]["ring_model"]  # auto
    with pytest.raises(ScenarioError):
        load_scenario(d)


@pytest.mark.parametrize("t_cut", [0.0, 2e-4])
def test_a_cut_lockstep_ring_waits_the_timeout_and_goes_on_along_the_detour(t_cut):
    """A 16-member ring all-reduce on a 4x4 torus as one lock-step flow; link 0 -> 1 (a ring
    edge) fails at ``t_cut`` (0: before the ring starts, so its plan routes round it). Each
    member has sent ``B t_cut`` of its ``S`` bytes; the whole ring waits the retransmission
    timeout ``T`` (lock-step: no member runs ahead of the cut one) and then goes on with the
    cut member on its detour; its members' rate is ``B / k``, ``k`` the most members on one
    directed link of the new routes (counted here from the router's routes). Closed form:
    ``t_cut + T + (S - B t_cut) k / B + steps x alpha(longest route)`` (the per-step latency
    of the longest route, paid at the end as in the step model); bytes conserved, link bytes
    ``16 B t_cut`` before the cut plus the rest once per link of the new routes."""
    from collections import Counter

    import numpy as np

    from topologies.placement import device_order
    from workloads import collectives

    timeout = 1e-3
    env, fab, link = _torus_fabric(timeout=timeout)
    ring = device_order(fab.topo)[None, :]
    (phase,) = collectives.ring_allreduce(ring, 64e6)
    pairs = list(zip(phase.src.tolist(), phase.dst.tolist(), strict=True))
    assert (0, 1) in pairs or (1, 0) in pairs
    B, S = link.bytes_per_s, phase.steps * float(phase.nbytes[0])
    if t_cut == 0.0:
        fab.fail_edge(0, 1)
    else:
        env.process((lambda: (yield env.timeout(t_cut)) or fab.fail_edge(0, 1))())
    env.process(fab.run_phase(phase))
    env.run()
    routes = [fab.router.route(a, b) for a, b in pairs]
    k = max(Counter(lk for r in routes for lk in r).values())
    hops = max(len(r) for r in routes)
    assert hops == 3 and fab.lockstep_transfers == 1
    alpha = (link.overhead_us + hops * link.latency_us) * 1e-6
    wait = timeout if t_cut > 0 else 0.0
    rest = S - B * t_cut
    assert env.now == pytest.approx(t_cut + wait + rest * k / B + phase.steps * alpha,
                                    rel=1e-9)
    assert fab.bytes_received.sum() == pytest.approx(16 * S) == fab.bytes_sent.sum()
    links_after = sum(len(r) for r in routes)
    assert fab.link_bytes.sum() == pytest.approx(16 * B * t_cut + links_after * rest,
                                                 rel=1e-9)
    assert fab.reroutes == (1 if t_cut > 0 else 0)
    assert fab.retransmitted_bytes == pytest.approx(rest if t_cut > 0 else 0.0, rel=1e-9)
    assert np.all(fab.bytes_dropped == 0)


def _torus_fabric(lockstep: bool | str = "all", timeout: float = 1e-3):
    """A 4x4 NVLink torus fabric, lock-step rings on (``"all"``), engine and link spec."""
    from devices.fabric import Fabric
    from devices.spec import LinkSpec
    from topologies.graph import build_topology
    from topologies.routing import Router
    from twin.catalogs import catalog
    from twin.kernel.engine import Engine

    link = LinkSpec.model_validate(catalog("links").get("nvlink4").values)
    env = Engine()
    topo = build_topology("torus2d", (4, 4), link.name, 1)
    return env, Fabric(env, topo, Router(topo), {link.name: link}, retransmit_timeout_s=timeout,
                       lockstep_rings=lockstep), link


def test_a_phase_of_unequal_members_is_not_sent_lock_step():
    """Two pairs on their own links, ``S`` and ``2S`` bytes per step, 2 steps: a ring of
    unequal chunks is not one lock-step flow. Per step the barrier waits for the larger
    chunk: end ``2 x (2S / B + alpha)``, and each link carries its own pair's bytes."""
    import numpy as np

    from devices.fabric import Phase

    env, fab, link = _torus_fabric()
    r01, r23 = fab.router.route(0, 1), fab.router.route(2, 3)
    assert len(r01) == len(r23) == 1 and r01 != r23
    S, B = 8e6, link.bytes_per_s
    env.process(fab.run_phase(Phase(np.array([0, 2]), np.array([1, 3]),
                                    np.array([S, 2 * S]), steps=2)))
    env.run()
    alpha = (link.overhead_us + link.latency_us) * 1e-6
    assert env.now == pytest.approx(2 * (2 * S / B + alpha), rel=1e-9)
    assert fab.link_bytes[r01[0]] == pytest.approx(2 * S)
    assert fab.link_bytes[r23[0]] == pytest.approx(4 * S)
    assert fab.lockstep_transfers == 0


def test_a_one_step_phase_is_not_coupled_lock_step():
    """One step of two equal pairs is not a ring: its members are not held to each other's
    rate. Beside a background send on link 0 -> 1 the pair 0 -> 1 runs at ``B / 2`` while
    2 -> 3 runs alone at ``B``, so link 2 -> 3 is busy ``S / B``, not ``2S / B``."""
    import numpy as np

    from devices.fabric import Phase

    env, fab, link = _torus_fabric()
    S, B = 8e6, link.bytes_per_s
    env.process(fab.run_phase(Phase(np.array([0, 2]), np.array([1, 3]), np.array([S, S]))))
    env.process(fab.run_phase(Phase(np.array([0]), np.array([1]), np.array([S]))))
    env.run()
    (r23,) = fab.router.route(2, 3)
    assert fab.link_busy_s[r23] == pytest.approx(S / B, rel=1e-9)
    assert fab.lockstep_transfers == 0


def test_a_ring_of_sub_byte_chunks_is_still_sent_lock_step():
    """Equal chunks of any positive size couple: a 1-byte all-reduce over four ranks sends
    0.25 B per step. Two pairs on their own links, 2 steps: one lock-step flow, ending at
    ``2 x (0.25 / B + alpha)`` like the per-step model."""
    import numpy as np

    from devices.fabric import Phase

    env, fab, link = _torus_fabric()
    S, B = 0.25, link.bytes_per_s
    env.process(fab.run_phase(Phase(np.array([0, 2]), np.array([1, 3]), np.array([S, S]),
                                    steps=2)))
    env.run()
    alpha = (link.overhead_us + link.latency_us) * 1e-6
    assert env.now == pytest.approx(2 * (S / B + alpha), rel=1e-9)
    assert fab.lockstep_transfers == 1
