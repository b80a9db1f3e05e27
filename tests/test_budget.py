"""The resource estimate made before a run (twin/budget.py) against what the runs and the
topologies really are: link counts of the built graphs, the iteration-time lower bound against
measured runs, the failure rate at which a job can never finish, the limits' own bounds."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from tests.conftest import scenario_dict
from topologies.graph import build_topology
from twin.budget import KERNELS_PER_MICROBATCH_LAYER, LimitsSpec, check_budget, estimate
from twin.runner import run
from twin.scenario import load_scenario


@pytest.mark.parametrize(("kind", "shape", "exact"), [
    ("torus2d", (4, 4), True), ("torus3d", (3, 3, 3), True), ("ring", (8,), True),
    ("dragonfly2d", (4, 3), True), ("mesh2d", (4, 4), False), ("torus2d", (4, 2), False)])
def test_link_estimate_against_the_built_graph(kind, shape, exact):
    """Directed links: exact for tori whose rings have 3 or more members, rings and the
    dragonfly; an upper bound for meshes (no wrap) and tori with a ring of 2 (one edge)."""
    d = scenario_dict(cluster__topology={"kind": kind, "shape": list(shape)})
    n = math.prod(shape)
    d["workload"].update(parallelism={"dp": n, "tp": 1, "pp": 1}, global_batch=n)
    if kind == "dragonfly2d":
        d["cluster"]["global_link"] = "nvlink4"
    est = estimate(load_scenario(d)).links
    extra = {"global_link": "nvlink4"} if kind == "dragonfly2d" else {}
    real = build_topology(kind, shape, "nvlink4", 1, **extra).n_links
    assert est == real if exact else est > real


@pytest.mark.parametrize(("topo", "pp", "layers", "bound_s"), [
    ({"kind": "torus2d", "shape": [1, 1]}, 1, 16, 7.68e-3),
    ({"kind": "ring", "shape": [16]}, 16, 1, 4.8e-4)])
def test_iteration_bound_of_a_kernel_bound_rank_is_below_the_run(topo, pp, layers, bound_s):
    """16-token microbatches: FLOPs take nothing and next to nothing is sent, so the bound is
    the kernels' launch overhead, 30 kernels x 4 microbatches x the stage's layers x 4 us
    (``kernel_overhead_us`` of the H100): one device with Llama 3.2 1B's 16 layers, or
    sixteen stages of one layer each (pp 16 on a ring of 16); the simulated iteration takes
    longer. The embeddings are untied: tied, the first and last of sixteen stages would
    all-reduce the 525 MB embedding gradient, a bound of its own (tested below)."""
    d = scenario_dict(cluster__topology=topo)
    d["workload"].update(seq_len=16, global_batch=4, parallelism={"dp": 1, "tp": 1, "pp": pp})
    d["power"] = {"thermal": {"enabled": False}}
    d["trace"] = {"enabled": False}
    scen = load_scenario(d, ["workload.model.tied_embeddings=false"])
    est = estimate(scen)
    want = (KERNELS_PER_MICROBATCH_LAYER * 4 * layers
            * scen.cluster.device.kernel_overhead_us * 1e-6)
    assert est.iteration_s == pytest.approx(want, rel=1e-12) == pytest.approx(bound_s)
    assert est.iteration_s < run(scen).summary["iteration_time_s"]
    assert est.packets == 0.0 and est.thermal_steps == 0.0 and est.fault_events == 0.0


def test_iteration_bound_counts_a_tied_embeddings_exchange_and_stays_below_the_run():
    """Sixteen one-layer stages of Llama 3.2 1B (tied embeddings) on a ring: the first and
    last stage exchange the embedding's gradient (vocab x hidden x 2 B = 525 MB), which the
    byte bound spreads over the ranks (2 of 16 send it) and puts through one rank's links
    (4 x 25 GB/s x 0.817): with the activations, 66.2 MB / 81.7 GB/s = 0.81 ms, above the
    launch-overhead bound (0.48 ms) and below the run."""
    d = scenario_dict(cluster__topology={"kind": "ring", "shape": [16]})
    d["workload"].update(seq_len=16, global_batch=4, parallelism={"dp": 1, "tp": 1, "pp": 16})
    d["power"] = {"thermal": {"enabled": False}}
    d["trace"] = {"enabled": False}
    scen = load_scenario(d)
    link = scen.cluster.link
    act = 16 * 2048 * 2.0  # one 16-token microbatch's activations, 2 per microbatch
    per_rank = 2 * act * 4 + 2 / 16 * 128256 * 2048 * 2.0
    want = per_rank / (link.bytes_per_s * scen.cluster.links_per_edge)
    est = estimate(scen)
    assert est.iteration_s == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(8.1e-4, rel=0.01)
    assert est.iteration_s < run(scen).summary["iteration_time_s"]


def _link_faults(mean_s: float, link: dict | None = None):
    d = scenario_dict()
    d["workload"]["grad_bucket_mb"] = 25
    d["faults"] = [{"kind": "link_failure", "links": "all",
                    "ttf": {"dist": "exponential", "mean_s": mean_s}}]
    d["trace"] = {"enabled": False}
    d["simulation"] = {"limits": {"max_events": 2**50}}  # only the never-finishing check
    if link is not None:
        d["cluster"]["link"] = {"base": "nvlink4", **link}
    return d


@pytest.mark.parametrize("link", [None, {"latency_us": 400.0, "overhead_us": 300.0}])
def test_links_failing_faster_than_a_bucket_crosses_never_finish(link):
    """A 25 MB bucket crosses one NVLink bundle in latency + overhead + 25e6 B / bandwidth; a
    link failing 20 times in that is a slow job (e^20 attempts), 40 times one that never
    finishes (more than 30 expected failures per attempt). Also with a slow-starting link
    whose latency and overhead (0.7 ms) outweigh the bytes' time (~0.25 ms)."""
    scen = load_scenario(_link_faults(1.0, link))
    link_spec = scen.cluster.link
    alpha = (link_spec.latency_us + link_spec.overhead_us) * 1e-6
    beta = 25e6 / (link_spec.bytes_per_s * scen.cluster.links_per_edge)
    assert (alpha > 2 * beta) == (link is not None)
    t = alpha + beta
    ok = load_scenario(_link_faults(t / 20, link))
    assert not [p for p in check_budget(ok) if "never finish" in p.message]
    from twin.kernel.errors import ScenarioError

    with pytest.raises(ScenarioError, match="never finish"):
        load_scenario(_link_faults(t / 40, link))


def test_faults_that_slow_no_device_do_not_stretch_the_estimate():
    """Cooling failures and link failures in fixed windows slow no device's blocks (their
    factor is 1): the thermal estimate's run is as long as without them (the product of
    straggler factors would otherwise grow by one factor per such fault)."""
    from twin.budget import _slowdown

    d = scenario_dict(faults=[
        {"kind": "cooling_failure", "devices": [0], "time_s": 0.0, "rise_k": 10.0},
        {"kind": "link_failure", "link": [0, 1], "time_s": 0.0, "duration_s": 1.0},
        {"kind": "cooling_failure", "devices": [1], "time_s": 0.0, "duration_s": 1.0,
         "rise_k": 5.0}])
    assert _slowdown(load_scenario(d), 10.0, 0.1) == 1.0


def test_limits_bounds():
    """Each limit's smallest and largest allowed values are accepted, one beyond refused."""
    for key, lo, hi in (("max_devices", 1, 2**40), ("max_events", 1, 2**50),
                        ("max_power_samples", 1, 2**50)):
        LimitsSpec(**{key: lo})
        LimitsSpec(**{key: hi})
        for bad in (lo - 1, hi + 1):
            with pytest.raises(ValidationError, match=key):
                LimitsSpec(**{key: bad})


def test_the_failure_named_is_the_one_that_stops_the_job_most():
    """Two link-failure processes, every 0.5 s and every 1 ns: the job never finishes, and the
    problem names the second (more failures per bucket transfer), not the first."""
    from twin.kernel.errors import ScenarioError

    d = _link_faults(0.5)
    d["faults"].append({"kind": "link_failure", "links": "all",
                        "ttf": {"dist": "exponential", "mean_s": 1e-9}})
    with pytest.raises(ScenarioError) as exc:
        load_scenario(d)
    (p,) = [p for p in exc.value.problems if "never finish" in p.message]
    assert p.path == "faults.1.ttf" and "every 1e-09 s" in p.message


def test_memory_estimate_counts_the_events_of_an_iteration():
    """Symmetry off, 1000 microbatches of 16 ranks x 16 layers: about 30 x 16 x 1000 x 16 =
    7.7e6 events of one iteration held at 200 B each, 1.5 GB beside the 0.4 GB base: a 1 GB
    memory limit refuses the run; the same run with 10 microbatches fits."""
    from twin.kernel.errors import ScenarioError

    def scen(microbatches: int) -> dict:
        d = scenario_dict(cluster__topology={"kind": "torus2d", "shape": [4, 4]})
        d["workload"].update(parallelism={"dp": 16, "tp": 1, "pp": 1},
                             global_batch=16 * microbatches)
        d["simulation"] = {"symmetry": False,
                           "limits": {"max_memory_gb": 1.0, "max_events": 2**40}}
        d["trace"] = {"enabled": False}
        return d

    with pytest.raises(ScenarioError, match="max_memory_gb"):
        load_scenario(scen(1000))
    load_scenario(scen(10))


def test_event_message_names_idle_segments_only_when_they_count():
    """Too many events from microbatches alone: the message counts ranks x microbatches x
    iterations and says nothing of the thermal model's idle segments (a few per device)."""
    from twin.kernel.errors import ScenarioError

    d = scenario_dict()
    d["workload"]["global_batch"] = 8 * 10**6
    d["trace"] = {"enabled": False}
    with pytest.raises(ScenarioError) as exc:
        load_scenario(d)
    (p,) = [p for p in exc.value.problems if p.path == "simulation.limits.max_events"]
    assert "simulated ranks x" in p.message and "idle segments" not in p.message


def test_memory_estimate_counts_the_power_window_samples():
    """4e7 power-window samples (under the 5e7 sample limit) at 64 B each are 2.6 GB: a 2 GB
    memory limit refuses the run; 4e5 samples fit (a long run, so that the windows stay
    above their 1 us floor)."""
    from twin.kernel.errors import ScenarioError

    d = scenario_dict()
    d["trace"] = {"enabled": False}
    d["workload"]["iterations"] = 2000
    sim_s = estimate(load_scenario(d)).sim_time_s
    assert sim_s / 4e7 >= 1e-6
    d["simulation"] = {"limits": {"max_memory_gb": 2.0}}
    d["power"] = {"alerts": {"window_s": sim_s / 4e7}}
    with pytest.raises(ScenarioError, match="max_memory_gb"):
        load_scenario(d)
    d["power"] = {"alerts": {"window_s": sim_s / 4e5}}
    load_scenario(d)


@pytest.mark.parametrize(("topo", "par"), [
    ({"kind": "ring", "shape": [2]}, {"dp": 1, "tp": 1, "pp": 2}),
    ({"kind": "ring", "shape": [2]}, {"dp": 1, "tp": 2, "pp": 1}),
    ({"kind": "torus2d", "shape": [4, 2]}, {"dp": 2, "tp": 2, "pp": 2}),
    ({"kind": "torus2d", "shape": [4, 2]}, {"dp": 8, "tp": 1, "pp": 1})])
def test_bytes_estimate_against_the_run(topo, par):
    """Bytes a rank sends per iteration, estimated before the run from its TP, pipeline and
    data-parallel ring volumes, against the bytes the run sent per device: within [0.75, 2]
    of it (the estimate leaves the embedding's gradients out of the data-parallel volume,
    about -20%, and counts both directions of pipeline sends, which a two-stage pipeline's
    edge stages send one way: 2x); a degree of 2 counts like any other."""
    from twin.budget import _bytes_per_rank
    from workloads.feasibility import microbatches
    from workloads.transformer import TransformerCosts

    d = scenario_dict(workload__parallelism=par, cluster__topology=topo)
    d["trace"] = {"enabled": False}
    scen = load_scenario(d, ["overlap.dp_buckets=false"])
    w = scen.workload
    tc = TransformerCosts(w.model, w.precision, w.micro_batch, w.seq, par["tp"],
                          w.sequence_parallel, w.recompute, w.attention)
    est = _bytes_per_rank(scen, tc, microbatches(w), w.model.layers // par["pp"])
    s = run(scen).summary
    sent = s["bytes_sent"] / s["devices"]
    assert 0.75 * sent <= est <= 2.0 * sent


def test_a_trickling_dma_stream_is_refused_only_by_a_simulated_memory_model():
    """A transfer's HBM traffic of 1e-7 GB/s (100 B/s): the FR-FCFS and queue models simulate
    HBM batches over the DMA stream's arrival span and refuse it at ``memory.dma.rate_gbps``;
    the roofline model simulates no batch and accepts it; 1e-3 GB/s is the least accepted."""
    from twin.kernel.errors import ScenarioError

    for model in ("frfcfs", "queue"):
        d = scenario_dict(memory={"model": model, "dma": {"rate_gbps": 1e-7}})
        with pytest.raises(ScenarioError) as exc:
            load_scenario(d)
        assert [p.path for p in exc.value.problems] == ["memory.dma.rate_gbps"]
        load_scenario(scenario_dict(memory={"model": model, "dma": {"rate_gbps": 1e-3}}))
    load_scenario(scenario_dict(memory={"model": "roofline", "dma": {"rate_gbps": 1e-7}}))


def test_failures_faster_than_the_restart_make_the_job_unfinishable():
    """Accelerator failures every 100 s per device on 8 devices stop the job every 12.5 s.
    With a 1-hour restart an attempt (an iteration plus the restart) expects ~290 failures,
    past the 30 an attempt may expect: the scenario is refused naming the fault's ``ttf``.
    With a 1 s restart (about 0.1 failures per attempt) the same failures are accepted."""
    from twin.kernel.errors import ScenarioError

    fault = {"kind": "accelerator_failure", "devices": "all",
             "ttf": {"dist": "exponential", "mean_s": 100.0}}
    job = {"restart_s": 3600.0, "checkpoint_interval_iterations": 1}
    d = scenario_dict(faults=[fault], job=job)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(d)
    assert any(p.path.startswith("faults.0") for p in exc.value.problems), exc.value.problems
    load_scenario(scenario_dict(faults=[fault], job={**job, "restart_s": 1.0}))


def test_the_estimates_tensor_parallel_bytes_are_the_runs():
    """A tensor-parallel-only run (tp 8): the estimate's bytes per rank (4 ring all-reduces of
    the activations per layer and microbatch, 2 (tp - 1) / tp of them each) equal the bytes
    the simulated run sends per device, to rounding."""
    from twin.budget import _bytes_per_rank
    from workloads.feasibility import microbatches
    from workloads.transformer import TransformerCosts

    d = scenario_dict(workload__parallelism={"dp": 1, "tp": 8, "pp": 1})
    d["trace"] = {"enabled": False}
    scen = load_scenario(d)
    w = scen.workload
    tc = TransformerCosts(w.model, w.precision, w.micro_batch, w.seq, 8, w.sequence_parallel,
                          w.recompute, w.attention)
    est = _bytes_per_rank(scen, tc, microbatches(w), w.model.layers)
    s = run(scen).summary
    assert est == pytest.approx(s["bytes_sent"] / s["devices"], rel=1e-12)


def test_fixed_fault_windows_stretch_the_run_by_their_own_delays_closed_form():
    """Worked by hand: windows (onset, length, factor) (0, 1, 2) and (0.5, 1, 3) overlap, so
    each counts 2 x 3 = 6; (5, 1, 1.5) stands alone. Base run 10 s, blocks of 0.1 s: each
    window delays the run by its length plus one block at its factor: (1 + 0.6) + (1 + 0.6)
    + (1 + 0.15) = 4.35 s, bound 1 + 4.35 / 10 = 1.435 (below the product 9). A straggler
    without a window (factor 2) lasts the whole run: it doubles the blocks and the result:
    2 x (1 + (3 + 1.2 + 1.2 + 0.3) / 10) = 3.14. Sixty 1.5x windows of 20 ms, 50 ms apart:
    1 + 60 x (0.02 + 0.15) / 10 = 2.02, not 1.5^60."""
    from twin.budget import _slowdown

    def scen(faults):
        d = scenario_dict(faults=[{"kind": "straggler", "device": dev, "factor": f,
                                   "time_s": t, **({"duration_s": w} if w is not None else {})}
                                  for dev, t, w, f in faults])
        return load_scenario(d)

    windows = [(0, 0.0, 1.0, 2.0), (1, 0.5, 1.0, 3.0), (2, 5.0, 1.0, 1.5)]
    assert _slowdown(scen(windows), 10.0, 0.1) == pytest.approx(1.435, rel=1e-12)
    assert _slowdown(scen([*windows, (3, 0.0, None, 2.0)]), 10.0, 0.1) == pytest.approx(
        3.14, rel=1e-12)
    short = [(i % 8, 0.05 * i, 0.02, 1.5) for i in range(60)]
    assert _slowdown(scen(short), 10.0, 0.1) == pytest.approx(2.02, rel=1e-12)
    # windows longer than the run: their product is the smaller bound
    assert _slowdown(scen([(0, 0.0, 1e6, 10.0), (1, 0.0, 1e6, 10.0)]), 10.0, 0.1) == 100.0


def test_fixed_fault_windows_bound_the_simulated_run(tmp_path):
    """The bound against the simulator, given the clean run's makespan and its longest op
    (a block): (1) a 20x straggler whose window opens just before the longest compute block
    of device 0 and closes just after it starts stretches that block whole, a delay of
    ~19 blocks that the bound's ``F b`` term must cover (the windows' lengths alone would
    not); (2) random straggler windows on the tiny scenario, each run's makespan below the
    clean one's times :func:`twin.budget._slowdown`."""
    import random

    from twin.budget import _slowdown
    from twin.kernel.trace import read_table

    d = scenario_dict(trace={"path": str(tmp_path / "clean.h5")})
    clean = run(load_scenario(d))
    base = clean.summary["makespan_s"]
    ops = read_table(clean.trace_path, "ops")
    dur = ops.t_end - ops.t_start
    block = float(dur.max())
    comp = ops[(ops.cls == 0) & (ops.kind == "compute")]
    t_c, b_c = (float(x) for x in comp.loc[dur[comp.index].idxmax(), ["t_start", "t_end"]])
    b_c -= t_c

    def faulted(faults):
        scen = load_scenario(scenario_dict(faults=faults, trace={"enabled": False}))
        return run(scen).summary["makespan_s"], base * _slowdown(scen, base, block)

    got, bound = faulted([{"kind": "straggler", "device": 0, "factor": 20.0,
                           "time_s": t_c - 1e-7, "duration_s": 2e-7}])
    assert got - base > 10 * b_c + 2e-7 + block  # far beyond the window and one block
    assert got <= bound
    rng = random.Random(5)
    for _ in range(4):
        faults = [{"kind": "straggler", "device": rng.randrange(8),
                   "factor": rng.choice([1.5, 4.0, 20.0]), "time_s": rng.uniform(0, base),
                   "duration_s": rng.uniform(0, 0.2 * base)} for _ in range(rng.randint(2, 5))]
        got, bound = faulted(faults)
        assert got <= bound, faults
