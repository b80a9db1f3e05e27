"""Fast mode (symmetry, chained transfers) against ``simulation.exact: true``.

Exact mode simulates every rank and runs every pipeline send and tensor-parallel collective
as its own SimPy process; it shares none of the shortcuts, so it is the reference the
shortcuts are checked against: iteration time and energy within 0.5% (DESIGN, performance
targets). With nothing random the shortcuts are exact, so the agreement is in fact to
floating-point rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from twin.aggregate import REL_TOL
from twin.runner import run
from twin.scenario import load_scenario


def _scenario(exact: bool, rings: str = "auto", **workload) -> dict:
    w = {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 1024, "global_batch": 16,
         "micro_batch": 1, "parallelism": {"dp": 2, "tp": 2, "pp": 4}, "iterations": 2}
    w.update(workload)
    return {"name": "exact-check", "seed": 3,
            "cluster": {"topology": {"kind": "torus2d", "shape": [4, 4]}, "device": "h100-sxm",
                        "link": "nvlink4", "links_per_edge": 4},
            "workload": w, "simulation": {"exact": exact}, "network": {"ring_model": rings},
            "trace": {"enabled": False}}


CASES = {
    "1f1b": {},
    # dp 1: no replica quotient; TP 8 rings cross the torus, not closed form
    "tp8_pp2": {"parallelism": {"dp": 1, "tp": 8, "pp": 2}, "global_batch": 8},
    "interleaved": {"schedule": "interleaved", "virtual_stages": 2},
    "dp_tp": {"parallelism": {"dp": 4, "tp": 4, "pp": 1}, "global_batch": 8},
}


@pytest.mark.parametrize("rings", ["step", "auto"])
@pytest.mark.parametrize("case", list(CASES))
def test_fast_mode_agrees_with_exact_mode(case, rings):
    fast = run(load_scenario(_scenario(False, rings, **CASES[case]))).summary
    exact = run(load_scenario(_scenario(True, rings, **CASES[case]))).summary
    assert fast["symmetry_used"] and "symmetry" in fast["shortcuts_used"]
    assert "chained_transfers" in fast["shortcuts_used"]
    # the step model keeps its rings per flow under symmetry; auto is the lock-step model
    assert fast["ring_model"] == exact["ring_model"] == ("step" if rings == "step"
                                                         else "lockstep")
    assert (fast["lockstep_ring_transfers"] > 0) == (rings == "auto")
    assert (exact["lockstep_ring_transfers"] > 0) == (rings == "auto")
    assert exact["exact_mode"] and exact["shortcuts_used"] == []
    assert not exact["symmetry_used"] and exact["rank_classes"] == exact["devices"]
    assert exact["rank_classes"] > fast["rank_classes"]
    for key in ("iteration_time_s", "energy_j", "makespan_s"):
        assert fast[key] == pytest.approx(exact[key], rel=5e-3), key


@pytest.mark.parametrize("case", ["1f1b", pytest.param("interleaved", marks=pytest.mark.slow)])
def test_fast_mode_without_symmetry_agrees_with_exact_mode(case):
    """Compute jitter: every rank draws its own durations, the same draws in both modes;
    under the step ring model the fast mode chains transfers and sends tensor-parallel rings
    as lock-step flows (``devices.phase.lockstep_ok``), the exact mode runs every flow of
    every ring step by step in its own process."""
    runs = {}
    for exact in (False, True):
        d = _scenario(exact, "step", **CASES[case])
        d["simulation"].update(compute_jitter_cov=0.05, tp_group_agents=False)
        runs[exact] = run(load_scenario(d)).summary
    fast, exact = runs[False], runs[True]
    assert not fast["symmetry_used"] and "lockstep_rings" in fast["shortcuts_used"]
    assert fast["lockstep_ring_transfers"] > 0 == exact["lockstep_ring_transfers"]
    for key in ("iteration_time_s", "energy_j", "makespan_s"):
        assert fast[key] == pytest.approx(exact[key], rel=5e-3), key
    d = _scenario(False, "step", **CASES[case])
    d["simulation"].update(compute_jitter_cov=0.05, lockstep_rings=False, tp_group_agents=False)
    off = run(load_scenario(d)).summary
    assert off["lockstep_ring_transfers"] == 0 and "lockstep_rings" not in off["shortcuts_used"]
    assert off["iteration_time_s"] == pytest.approx(exact["iteration_time_s"], rel=5e-3)
    # nor with HBM ports (memory.transfer_cap under a contention model): each member's port
    # follows its own device's blocks, so the members' rates differ (the lock-step ring
    # model runs with ports as its own model: tests/test_lockstep.py)
    d = _scenario(False, "step", **CASES[case])
    d["simulation"]["compute_jitter_cov"] = 0.05
    d["memory"] = {"model": "frfcfs"}
    d["overlap"] = {"tp_comm": True}
    capped = run(load_scenario(d)).summary
    assert capped["hbm_port_capped_s"] > 0 and capped["lockstep_ring_transfers"] == 0
    assert capped["ring_model"] == "step"


@pytest.mark.parametrize("power", [{}, {"communication_energy": True}])
def test_a_chained_tp_rendezvous_is_the_process_it_replaces(monkeypatch, power):
    """Without symmetry a TP collective is a rendezvous of its group's classes; chained runs
    start it without a process (``Executor._chain_collective``). The same transfers at the
    same times: every summary number equal to the process path's, with fewer events (with
    the collectives' energy booked on the devices too)."""
    from workloads.executor import Executor

    d = _scenario(False, **CASES["tp8_pp2"])
    d["simulation"].update(compute_jitter_cov=0.05, tp_group_agents=False)
    d["power"] = power
    chained = run(load_scenario(d)).summary

    def as_process(self, parts, gids, algo, nbytes, owner, start, done):
        proc = self._spawn(self._run_collective("tp", parts, gids, algo, nbytes, owner, start))
        proc.callbacks.append(lambda _e: done.succeed())

    monkeypatch.setattr(Executor, "_chain_collective", as_process)
    process = run(load_scenario(d)).summary
    assert chained["events"] < process["events"]
    for key in ("iteration_time_s", "energy_j", "makespan_s", "bytes_sent", "link_bytes",
                "tp_comm_time_per_device_s", "compute_time_per_device_s"):
        assert chained[key] == process[key], key
    assert chained["energy_breakdown_j"] == process["energy_breakdown_j"]


# ----------------------------------------------------------------- microbatch aggregation
# Deterministic symmetric runs without thermal dynamics and without a trace simulate three
# reduced microbatch counts and extrapolate (twin.aggregate); the exact mode simulates every
# microbatch of every rank, so it is the independent reference.
COOL = {"thermal": {"enabled": False}}  # die temperature constant: energy affine in m
AGG_CASES = {  # the reduced runs simulate at most half the microbatches (twin.aggregate.plan)
    "1f1b_pp4_m30": {"global_batch": 60},
    "1f1b_pp2_m18": {"parallelism": {"dp": 4, "tp": 2, "pp": 2}, "global_batch": 72},
    "interleaved_pp4_v2_m72": {"schedule": "interleaved", "virtual_stages": 2,
                               "global_batch": 144},
    "gpipe_pp4_m30": {"schedule": "gpipe", "global_batch": 60},
    "1f1b_pp2_m18_3iter": {"parallelism": {"dp": 4, "tp": 2, "pp": 2}, "global_batch": 72,
                           "iterations": 3},
    # per-layer all-gathers of every microbatch (their waits in the exposed communication)
    "1f1b_pp2_m18_full_shard": {"parallelism": {"dp": 4, "tp": 2, "pp": 2}, "global_batch": 72,
                                "sharding": {"strategy": "full_shard"}},
}


#: summary keys that describe how a run was simulated, not its results
HOW_RUN = {"events", "wall_time_s", "symmetry_used", "exact_mode", "shortcuts_used",
           "replica_orbit", "lockstep_ring_transfers", "run_ahead_ops", "rank_classes",
           "microbatches_simulated", "aggregation", "undefined_keys",
           "iteration_time_cov"}  # rounding noise of equal iterations (twin.aggregate)


def _numeric_leaves(a, b, path=""):
    """(path, a's number, b's value) for every number of the nested summary ``a``."""
    if isinstance(a, dict):
        for k, v in a.items():
            if not (path == "" and k in HOW_RUN):
                yield from _numeric_leaves(v, (b or {}).get(k), f"{path}.{k}" if path else k)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(b) == len(a), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _numeric_leaves(x, y, f"{path}.{i}")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        yield path, a, b


def _cool(exact: bool, **workload) -> dict:
    d = _scenario(exact, **workload)
    d["power"] = COOL
    return d


#: the plainest cases run only in `make test-slow` (their layouts recur in the others)
_AGG_SLOW = ("1f1b_pp2_m18", "1f1b_pp4_m30", "1f1b_pp2_m18_3iter")


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in _AGG_SLOW
                                  else c for c in AGG_CASES])
def test_aggregated_mode_agrees_with_exact_mode(case):
    res = run(load_scenario(_cool(False, **AGG_CASES[case])))
    fast = res.summary
    exact_res = run(load_scenario(_cool(True, **AGG_CASES[case])))
    exact = exact_res.summary
    assert "microbatch_aggregation" in fast["shortcuts_used"]
    assert max(fast["microbatches_simulated"]) < exact["microbatches"]
    assert 2 * sum(fast["microbatches_simulated"]) <= exact["microbatches"]
    assert fast["microbatches"] == exact["microbatches"]
    assert exact["microbatches_simulated"] == [exact["microbatches"]]
    assert exact["aggregation"] is None and "microbatch_aggregation" not in exact[
        "shortcuts_used"]
    assert fast["events"] == sum(fast["aggregation"]["events_simulated"]) < exact["events"]
    for key in ("iteration_time_s", "energy_j", "makespan_s"):
        assert fast[key] == pytest.approx(exact[key], rel=5e-3), key
    # deterministic: the extrapolation is in fact exact to rounding, ratios included
    for key in ("iteration_time_s", "energy_j", "mfu", "bubble_fraction", "avg_power_w",
                "exposed_comm_fraction", "max_link_utilization", "bytes_sent",
                "model_flops_per_iteration", "compute_time_per_device_s",
                "goodput_tokens_per_s"):
        assert fast[key] == pytest.approx(exact[key], rel=1e-9), key
    for k, v in exact["energy_breakdown_j"].items():
        assert fast["energy_breakdown_j"][k] == pytest.approx(v, rel=1e-9, abs=1e-9), k
    # and every other number of the summary (ratios recomputed from the extrapolated totals,
    # lists extrapolated entry by entry), except what says how the run was made
    for path, want, got in _numeric_leaves(exact, fast):
        if path in fast["undefined_keys"]:
            continue
        # a spread over devices is the square root of a quadratic in m, not affine: it is
        # extrapolated within the projected error the aggregation accepts (REL_TOL)
        rel = REL_TOL if path.endswith(".std") else 1e-9
        assert got == pytest.approx(want, rel=rel, abs=1e-12), path
    # constant for 1F1B past the warm-up; GPipe keeps every microbatch's activations (affine)
    assert fast["memory_per_device_gb"] == pytest.approx(exact["memory_per_device_gb"],
                                                         rel=1e-12)
    # each iteration's own time (they differ in the last digits: the stages that sync their
    # tied embeddings start the next iteration later than the others)
    its = res.iteration_times_s
    assert len(its) == exact["iterations"]
    assert its == pytest.approx(exact_res.iteration_times_s, rel=1e-9)
    # what is not known from the reduced runs is None and named, never a guess
    for key in fast["undefined_keys"]:
        node = fast
        for part in key.split("."):
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert node is None, key
    if fast["peak_power_w"] is not None:
        assert fast["peak_power_w"] == pytest.approx(exact["peak_power_w"], rel=1e-9)


def test_aggregation_is_off_where_microbatches_differ():
    """Thermal dynamics (the default), jitter, a trace or exact mode: every microbatch."""
    from twin.aggregate import blockers, plan

    base = _cool(False, global_batch=60)
    assert plan(load_scenario(base)) is not None
    warm = dict(base, power={})
    jitter = dict(base, simulation={"compute_jitter_cov": 0.05})
    traced = dict(base, trace={"enabled": True, "path": "unused.h5"})
    exact = _cool(True, global_batch=60)
    for d, why in ((warm, "power.thermal"), (jitter, "simulation.compute_jitter_cov"),
                   (traced, "trace enabled"), (exact, "simulation.exact")):
        s = load_scenario(d)
        assert why in blockers(s) and plan(s) is None
    s = run(load_scenario(warm)).summary
    assert "microbatch_aggregation" not in s["shortcuts_used"]
    assert s["microbatches_simulated"] == [s["microbatches"]] == [30]
    # the reduced runs (4 + 5 + 6) would simulate more than half of 28: the full run
    assert plan(load_scenario(_cool(False, global_batch=56))) is None


def test_warmup_reaches_a_steady_phase_on_every_stage():
    """From m0 on, more microbatches only lengthen the steady phase: every stage's unit order
    (workloads.schedules) starts with as many forwards before its first backward at m0 as at
    any larger allowed count; one allowed count fewer, some stage's warm-up is cut short."""
    from twin.aggregate import warmup_microbatches
    from workloads.schedules import unit_order

    def leading(schedule: str, pp: int, m: int, v: int) -> list[int]:
        out = []
        for s in range(pp):
            u = unit_order(schedule, s, pp, m, v)
            out.append(next(i for i, x in enumerate(u) if x[0] == "B"))
        return out

    for schedule, v, step in (("1f1b", 1, 1), ("gpipe", 1, 1), ("interleaved", 2, None),
                              ("interleaved", 4, None)):
        for pp in (2, 4, 8, 16):
            inc = step or pp
            m0 = warmup_microbatches(schedule, pp, v)
            assert m0 % inc == 0
            at = leading(schedule, pp, m0, v)
            if schedule == "gpipe":  # all forwards first: the warm-up is m itself (affine)
                assert at == [m0 * v] * pp
                continue
            for m in range(m0 + inc, m0 + 4 * inc, inc):
                assert leading(schedule, pp, m, v) == at, (schedule, pp, v, m)
            if m0 - inc >= inc:
                assert leading(schedule, pp, m0 - inc, v) != at, (schedule, pp, v)


def _gpipe_on_nodes(exact: bool) -> dict:
    """GPipe over two stages of TP 4 on four nodes of two GPUs: each stage's TP group spans
    two nodes over InfiniBand, so stage 1's TP collectives use the NIC links into its GPUs
    that stage 0's forward sends arrive on. 18 microbatches of 2 sequences, blocking sends."""
    d = _cool(exact, parallelism={"dp": 1, "tp": 4, "pp": 2}, schedule="gpipe", seq_len=256,
              micro_batch=2, global_batch=36)
    d["cluster"] = {"topology": {"kind": "switched", "shape": [2, 4]}, "device": "h100-sxm",
                    "link": "nvlink4-switch", "links_per_edge": 18,
                    "nic_link": "ib-ndr400-port"}
    d["overlap"] = {"pipeline": False}  # the sender waits for each delivery
    return d


def test_gpipe_stages_whose_traffic_meets_are_not_aggregated(monkeypatch):
    """Under GPipe the first stage runs ahead of the second by more at every microbatch; where
    their transfers share links they meet at another offset each time and the iteration is not
    affine in the microbatches, though the three reduced counts (2, 3, 4) lie on a line to
    ~1e-13. The fast mode simulates every microbatch there."""
    from twin import aggregate

    full = run(load_scenario(_gpipe_on_nodes(False))).summary
    assert "microbatch_aggregation" not in full["shortcuts_used"]
    assert full["aggregation"]["fallback"].startswith("gpipe stages run free")
    assert full["aggregation"]["events_simulated"] == []  # refused before simulating
    assert full["microbatches_simulated"] == [18]  # (the full run agrees with exact mode:
    # session 38's differential draw, and every case above)
    # what the extrapolation gave: off by more than the aggregation's own tolerance, with a
    # projected error of ~1e-13
    monkeypatch.setattr(aggregate, "unsteady", lambda model: None)
    agg = run(load_scenario(_gpipe_on_nodes(False))).summary
    assert "microbatch_aggregation" in agg["shortcuts_used"]
    assert agg["aggregation"]["max_projected_error"] < REL_TOL
    assert abs(agg["iteration_time_s"] / full["iteration_time_s"] - 1) > REL_TOL


@pytest.mark.parametrize("shape, tp, pp", [([2, 4], 4, 2), ([1, 6], 2, 3)])
def test_links_shared_by_stages_in_one_gpipe_phase(shape, tp, pp):
    """TP groups across nodes (four nodes of two GPUs, TP 4 x pp 2; six one-GPU nodes, TP 2 x
    pp 3): the NIC link into each GPU of a later stage carries the previous stage's forward
    send and the GPU's own TP traffic from another node (routes read from the router, pair by
    pair); on the 4 x 4 torus of the aggregated GPipe case, no link carries two stages'
    traffic in one phase (that run aggregates and agrees with exact mode to 1e-9 above)."""
    from twin.build import build
    from workloads.tp_isolation import links_shared_by_stages

    d = _gpipe_on_nodes(False)
    d["cluster"]["topology"]["shape"] = shape
    d["workload"].update(parallelism={"dp": 1, "tp": tp, "pp": pp}, stage_layers="auto")
    m = build(load_scenario(d))
    lay, route = m.layout, m.router.route
    shared = set(links_shared_by_stages(lay, route).tolist())
    checked = 0
    for c in np.flatnonzero(lay.class_stage < pp - 1).tolist():
        ranks, peers = lay.peer_ranks(c, 1)
        for a_rank, b_rank in zip(ranks.tolist(), peers.tolist(), strict=True):
            a, b = int(lay.device[a_rank]), int(lay.device[b_rank])
            into_b = route(a, b)[-1]
            group = lay.group_devices("tp", int(lay.group_id("tp", np.array([b_rank]))[0]))
            assert any(route(x, b)[-1] == into_b for x in group.tolist() if x != b)
            assert into_b in shared
            checked += 1
    assert checked == tp * (pp - 1)
    torus = build(load_scenario(_cool(False, **AGG_CASES["gpipe_pp4_m30"])))
    assert len(links_shared_by_stages(torus.layout, torus.router.route)) == 0


def test_the_ends_embedding_exchange_counts_among_the_stages_traffic():
    """Three stages on a mesh row of three GPUs: the pipeline sends use each link by one
    stage only, but with tied embeddings the two ends exchange their gradient through GPU 1,
    over the links GPU 1 -> 0 (stage 1's backward sends) and GPU 1 -> 2 (its forward sends):
    shared, so GPipe would not aggregate. Untied, nothing is shared."""
    from tests.conftest import scenario_dict
    from twin.build import build
    from workloads.tp_isolation import links_shared_by_stages

    d = scenario_dict(cluster__topology={"kind": "mesh2d", "shape": [3, 1]},
                      workload__parallelism={"dp": 1, "tp": 1, "pp": 3},
                      workload__global_batch=4, workload__stage_layers=[6, 5, 5],
                      workload__schedule="gpipe")
    m = build(load_scenario(d))
    lay, route = m.layout, m.router.route
    assert len(links_shared_by_stages(lay, route)) == 0
    shared = set(links_shared_by_stages(lay, route, ends_exchange=True).tolist())
    assert shared == {route(1, 0)[0], route(1, 2)[0]}


def _uneven_interleaved(exact: bool) -> dict:
    """Interleaved 1F1B, three stages of two chunks, 16 layers placed by compute (`auto`: one
    stage computes 2.4% more than the next per microbatch), 54 microbatches on a 3 x 2
    torus (a differential draw of session 38, `--seed 15 --aggregation 1`)."""
    d = _cool(exact, parallelism={"dp": 2, "tp": 1, "pp": 3}, schedule="interleaved",
              virtual_stages=2, stage_layers="auto", seq_len=256, micro_batch=2,
              global_batch=216)
    d["cluster"]["topology"]["shape"] = [3, 2]
    return d


def test_a_pipeline_still_filling_its_idle_slots_is_not_aggregated(monkeypatch):
    """Up to ~15 microbatches the busiest device hides part of its work in the pipeline's
    idle slots and the run grows by less per microbatch than that device computes; the
    reduced counts 6, 9, 12 lie on a line (projected error ~1e-13) that misses the
    54-microbatch run by 1.4%. The fast mode refuses to extrapolate from a growth below the
    busiest device's compute and simulates every microbatch (the full run agrees with exact
    mode to 1e-15: session 38's differential draw)."""
    from twin import aggregate

    full = run(load_scenario(_uneven_interleaved(False))).summary
    assert "microbatch_aggregation" not in full["shortcuts_used"]
    assert full["aggregation"]["fallback"].startswith("not yet steady at 9-12 microbatches")
    assert full["microbatches_simulated"] == [54]
    monkeypatch.setattr(aggregate, "short_of_busiest", lambda *a: None)
    agg = run(load_scenario(_uneven_interleaved(False))).summary
    assert agg["aggregation"]["max_projected_error"] < REL_TOL
    assert agg["iteration_time_s"] < full["iteration_time_s"] * (1 - 5e-3)  # past 0.5%


def test_growth_below_the_busiest_devices_compute_is_not_steady():
    """Closed form: counts 6, 9, 12 (step 3); the run grows 0.3 s per step = 0.1 s per
    microbatch. A device computing 0.11 s per microbatch: not steady; one computing exactly
    0.1 s (compute-bound), or less, or 0.1 s plus rounding: steady."""
    from twin.aggregate import Plan, short_of_busiest

    p = Plan(54, (6, 9, 12))
    spans = [1.0, 1.3, 1.6]

    def busy(*rates):
        return [np.array([r * k for r in rates]) for k in p.counts]

    why = short_of_busiest(p, spans, busy(0.05, 0.11))
    assert why is not None and "grows by 0.1 s per microbatch" in why and "(0.11 s)" in why
    assert short_of_busiest(p, spans, busy(0.05, 0.1)) is None
    assert short_of_busiest(p, spans, busy(0.1 * (1 + 1e-12))) is None
    assert short_of_busiest(p, spans, busy(0.02, 0.07)) is None
    assert short_of_busiest(p, spans, [np.zeros(0)] * 3) is None


def test_projected_error_of_a_quadratic_is_its_true_error():
    """v = a + b k + c k^2 sampled at m1, m2, m3: the line through the last two misses v(m)
    by c (m - m2)(m - m3), which is what the check projects; an affine v projects 0."""
    from twin.aggregate import Plan, _Combiner

    p = Plan(100, (10, 12, 14))
    cmb = _Combiner(p)

    def f(k: float, c: float) -> float:
        return 3.0 + 2.0 * k + c * k * k

    for c in (0.0, 1e-4, -2e-3):
        x, err = cmb.extrapolate(f(10, c), f(12, c), f(14, c))
        assert abs(x - f(100, c)) == pytest.approx(abs(c) * 88 * 86, abs=1e-9)
        assert err * max(abs(x), abs(f(14, c))) == pytest.approx(abs(c) * 88 * 86, abs=1e-9)


def test_combiner_keeps_equal_peaks_and_names_what_it_cannot_know():
    """Peaks (maxima over time) are never extrapolated: equal up to rounding in the three
    reduced runs, the last one is kept; different, None and listed. A key that is None in
    every run is simply None (not listed), one that bends (10, 12, 12) is None and listed;
    lists of equal length go entry by entry, an affine entry extrapolated to m = 100 from
    10, 12, 14."""
    from twin.aggregate import Plan, _Combiner

    cmb = _Combiner(Plan(100, (10, 12, 14)))
    assert cmb.value(700.0, 700.0 * (1 + 1e-12), 700.0 * (1 - 1e-12), "peak_power_w") == (
        700.0 * (1 - 1e-12))
    assert cmb.value(700.0, 701.0, 700.0, "peak_power_w") is None
    assert cmb.value(None, None, None, "tp_comm_time_per_device_s") is None
    assert cmb.value(None, 1.0, 1.0, "x") is None
    assert cmb.value(10.0, 12.0, 12.0, "bent") is None  # flat after a step: not affine
    assert cmb.undefined == ["peak_power_w", "x", "bent"]
    assert cmb.value([1.0, 10.0], [1.0, 12.0], [1.0, 14.0], "v") == [1.0, 100.0]
    # words and truth values: kept when the three runs agree, else None and listed
    assert cmb.value("lockstep", "lockstep", "lockstep", "ring_model") == "lockstep"
    assert cmb.value(True, True, True, "completed") is True
    assert cmb.value("a", "a", "b", "mode") is None
    assert cmb.value(False, True, True, "flag") is None
    assert cmb.undefined == ["peak_power_w", "x", "bent", "mode", "flag"]


def test_combine_falls_back_when_a_core_key_bends():
    """A summary whose energy is not affine in the microbatches is not aggregated."""
    from twin.aggregate import Plan, combine

    p = Plan(100, (10, 11, 12))
    sums = []
    for k in p.counts:
        sums.append({"iteration_time_s": 1.0 + k, "makespan_s": 1.0 + k,
                     "energy_j": 10.0 + k + 0.01 * k * k, "events": 5,
                     "shortcuts_used": ["symmetry"]})
    out, why = combine(p, sums, [np.zeros(0)] * 3, np.zeros(0))
    assert out is None and "energy_j" in why


def _tp_groups_against_exact(case: str, extra: dict) -> tuple[dict, dict]:
    """One agent per TP group (fast mode), one per rank (fast mode) and exact mode of a case
    with ``extra`` set; checks the shortcut's bookkeeping and returns (group, exact)."""
    runs = {}
    for mode, sim in (("group", {}), ("rank", {"tp_group_agents": False}),
                      ("exact", {"exact": True})):
        d = _scenario(mode == "exact", **CASES[case])
        d["simulation"].update(**extra.get("simulation", {}), **sim)
        d.update({k: v for k, v in extra.items() if k != "simulation"})
        runs[mode] = run(load_scenario(d)).summary
    group, rank, exact = runs["group"], runs["rank"], runs["exact"]
    tp = CASES[case].get("parallelism", {"tp": 2})["tp"]
    assert "tp_group_agents" in group["shortcuts_used"]
    assert "tp_group_agents" not in rank["shortcuts_used"] + exact["shortcuts_used"]
    assert group["rank_classes"] == group["devices"] // tp
    assert rank["rank_classes"] == exact["rank_classes"] == exact["devices"]
    assert group["events"] < rank["events"]
    return group, exact


@pytest.mark.parametrize("case", list(CASES))
def test_one_agent_per_tp_group_agrees_with_exact_mode(case):
    """Compute jitter only: one agent per tensor-parallel group (``tp_group_agents``), each
    member drawing from its own stream as its own agent would, against exact mode (every
    rank, every flow): iteration time, energy and makespan within 0.5%, with fewer agents
    and fewer events than one agent per rank in fast mode."""
    group, exact = _tp_groups_against_exact(case, {"simulation": {"compute_jitter_cov": 0.05}})
    for key in ("iteration_time_s", "energy_j", "makespan_s"):
        assert group[key] == pytest.approx(exact[key], rel=5e-3), key


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow)
                                  if c in ("1f1b", "interleaved") else c for c in CASES])
# (1f1b and interleaved: in make test-slow only; tp8_pp2 and dp_tp stay in make test)
def test_one_agent_per_tp_group_with_per_device_hbm_draws_agrees_with_exact_mode(case):
    """FR-FCFS HBM contention drawn per device (the default): one agent per tensor-parallel
    group whose device agent draws each member's factors, against exact mode (one agent and
    one device agent per rank, every flow; other draws of the same tables): iteration time,
    energy, makespan and the contention summary within the fast mode's 0.5%, with fewer
    agents and fewer events than one agent per rank."""
    group, exact = _tp_groups_against_exact(case, {"memory": {"model": "frfcfs"}})
    assert group["hbm_max_streams"] == exact["hbm_max_streams"]
    for key in ("iteration_time_s", "energy_j", "makespan_s", "hbm_slowdown_mean",
                "contention_slowdown_mean"):
        assert group[key] == pytest.approx(exact[key], rel=5e-3), key


def test_tp_group_agents_stay_off_where_more_than_jitter_tells_ranks_apart():
    """A fault, a memory model drawing per device beside jitter, per-device HBM draws with
    sharded data parallelism (the members would issue their gathers apart), fresh
    heavy-tailed latency draws (the queue model, ``bound: auto``) or a device fault, or a TP
    of one: one agent per rank. (Short runs: what is checked is which agents the run made.)"""
    base = _scenario(False, seq_len=256, iterations=1)
    base["simulation"]["compute_jitter_cov"] = 0.05
    sharded = _scenario(False, sharding={"strategy": "full_shard"}, seq_len=256, iterations=1)
    for extra in ({"memory": {"model": "frfcfs"}},
                  {"workload": {**base["workload"], "parallelism": {"dp": 4, "tp": 1, "pp": 4}}},
                  {"simulation": {**base["simulation"], "tp_group_agents": False}},
                  {"simulation": sharded["simulation"], "workload": sharded["workload"],
                   "memory": {"model": "frfcfs"}},
                  {"simulation": {"exact": False}, "memory": {"model": "queue", "bound": "auto"}},
                  {"simulation": {"exact": False}, "memory": {"model": "frfcfs"},
                   "faults": [{"kind": "straggler", "device": 5, "factor": 1.6, "time_s": 0.0,
                               "duration_s": 1.0}]}):
        s = run(load_scenario(base | extra)).summary
        assert "tp_group_agents" not in s["shortcuts_used"]
        assert s["rank_classes"] == s["devices"]


@pytest.mark.parametrize("strategy", ["zero2", "full_shard"])
def test_jittered_sharded_runs_agree_with_exact_mode(strategy):
    """Sharding's gathers and reduce-scatters are issued by each rank at its own time: one
    agent per TP group would issue them at its slowest member (measured 0.7% / 1.0% off
    exact mode here), so sharded runs keep one agent per rank, and agree."""
    runs = {}
    for exact in (False, True):
        d = _scenario(exact, sharding={"strategy": strategy})
        d["simulation"]["compute_jitter_cov"] = 0.05
        runs[exact] = run(load_scenario(d)).summary
    fast, exact = runs[False], runs[True]
    assert "tp_group_agents" not in fast["shortcuts_used"]
    for key in ("iteration_time_s", "energy_j", "makespan_s"):
        assert fast[key] == pytest.approx(exact[key], rel=5e-3), key


def test_warmup_microbatches_against_the_schedules_unit_order():
    """Interleaved 1F1B, pp 1-8 stages, v 2-5 chunks: stage 0's warm-up is read off the
    schedule itself (``workloads.schedules.unit_order`` with many microbatches: the forward
    units before its first backward, less the first steady forward); the count is the
    smallest multiple of ``pp`` whose ``m v`` units exceed it."""
    from twin.aggregate import warmup_microbatches
    from workloads.schedules import unit_order

    for pp in range(1, 9):
        for v in range(2, 6):
            kinds = [u[0] for u in unit_order("interleaved", 0, pp, 20 * pp, v)]
            warm = kinds.index("B") - 1
            want = next(k * pp for k in range(1, 20) if k * pp * v > warm)
            assert warmup_microbatches("interleaved", pp, v) == want, (pp, v)


@pytest.mark.parametrize("schedule,pp,v,want", [
    ("gpipe", 3, 1, 3), ("1f1b", 4, 1, 4),
    ("1f1b", 4, 2, 4),          # chunks only matter to the interleaved schedule
    ("interleaved", 4, 1, 4),   # one chunk per stage: plain 1F1B
    ("interleaved", 4, 2, 8),   # warm-up 2 x 3 + 1 x 4 = 10 units: 8 x 2 = 16 > 10, 4 x 2 not
    ("interleaved", 2, 3, 4),   # warm-up 2 + 2 x 2 = 6 units: 4 x 3 = 12 > 6, 2 x 3 = 6 not
])
def test_warmup_microbatches_by_hand(schedule, pp, v, want):
    """The smallest microbatch count with a steady phase on every stage, worked out from the
    rule: ``pp`` for GPipe and 1F1B; for interleaved 1F1B with ``v > 1`` chunks the smallest
    multiple of ``pp`` whose ``m v`` units exceed stage 0's ``2 (pp - 1) + (v - 1) pp``."""
    from twin.aggregate import warmup_microbatches

    assert warmup_microbatches(schedule, pp, v) == want


@pytest.mark.parametrize("fault", [None, "accelerator_failure"])
def test_communication_energy_of_tp_groups_a_class_stands_for(fault):
    """Under symmetry one class stands for the six TP groups of a 4x3 mesh (dp 6, tp 2);
    hybrid sharding over all six loads some groups' links more, so their collectives end
    apart. Each group's devices end their NCCL kernel with their own group's transfers
    (``workloads.comm_accounting.CommEnergy.per_group``), as in exact mode, in the chained
    path and in the process path (an accelerator failure: runs that can abort); booked
    until the slowest group's end, the energy was 4.5e-4 (4.2e-4) above exact mode's.
    Nothing is random here, so the agreement is to rounding (measured 2e-9)."""
    out = {}
    for exact in (False, True):
        d = {"name": "tp-groups", "seed": 1,
             "cluster": {"topology": {"kind": "mesh2d", "shape": [4, 3]}, "device": "h100-sxm",
                         "link": "nvlink4"},
             "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 256,
                          "global_batch": 6, "micro_batch": 1,
                          "parallelism": {"dp": 6, "tp": 2, "pp": 1}, "iterations": 1,
                          "sharding": {"strategy": "hybrid_shard", "group": 6}},
             "overlap": {"tp_comm": True}, "network": {"ring_model": "step"},
             "power": {"communication_energy": True, "thermal": {"initial": "idle"}},
             "faults": [{"kind": fault, "device": 0, "time_s": 0.02}] if fault else [],
             "simulation": {"exact": exact}, "trace": {"enabled": False}}
        out[exact] = run(load_scenario(d)).summary
    fast, ref = out[False], out[True]
    assert fast["symmetry_used"] and ("chained_transfers" in fast["shortcuts_used"]) == (
        fault is None)
    assert fast["iteration_time_s"] == pytest.approx(ref["iteration_time_s"], rel=1e-9)
    assert fast["energy_j"] == pytest.approx(ref["energy_j"], rel=1e-6)


def test_communication_energy_of_sends_to_a_tp_group_agent():
    """One agent per TP group (a straggler turns symmetry off; nothing else tells the ranks
    apart): a pipeline send from one rank of a group of four is booked on that rank alone,
    not on the four devices its agent stands for (``CommEnergy.charge``). Found by the
    differential tests (`--seed 11`): energy +1.6e-3 against exact mode; to rounding after
    (measured 2e-14)."""
    out = {}
    for exact in (False, True):
        d = {"name": "tp-group-sends", "seed": 765,
             "cluster": {"topology": {"kind": "switched", "shape": [4, 2]},
                         "device": "h100-sxm", "link": "nvlink4-switch", "links_per_edge": 18,
                         "nic_link": "ib-ndr400-port"},
             "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 512,
                          "global_batch": 16, "micro_batch": 2, "iterations": 1,
                          "parallelism": {"dp": 1, "tp": 4, "pp": 2}},
             "overlap": {"pipeline": False},
             "power": {"communication_energy": True, "thermal": {"enabled": False}},
             "faults": [{"kind": "straggler", "device": 0, "factor": 1.5, "time_s": 0.01,
                         "duration_s": 0.2}],
             "simulation": {"exact": exact}, "trace": {"enabled": False}}
        out[exact] = run(load_scenario(d)).summary
    fast, ref = out[False], out[True]
    assert "tp_group_agents" in fast["shortcuts_used"]
    assert fast["iteration_time_s"] == pytest.approx(ref["iteration_time_s"], rel=1e-9)
    assert fast["energy_j"] == pytest.approx(ref["energy_j"], rel=1e-9)
