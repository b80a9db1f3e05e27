"""Issue 12: streams that overlap, shared HBM / SMs / PCIe at run time, heavy tails.

Every expected value comes from outside the code under test: iteration times pinned from the
main branch before this work, the roofline closed form, standalone runs of the FR-FCFS engine
with streams built here from catalog numbers, the fluid limit of a work-conserving server
(throughput 1/rho at load rho > 1, whatever the service distribution) and processor sharing.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import simpy

from devices.hbm import StreamSpec, effective_bandwidth, load_hbm_spec
from devices.memory import MemorySpec, ServiceSpec, build_memory_model
from devices.pcie import PcieFabric, load_pcie_spec
from twin.build import build, stage_compute_blocks
from twin.kernel.errors import ScenarioError
from twin.kernel.records import Recorder
from twin.runner import run, simulate
from twin.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SC = ROOT / "scenarios"
NO_TRACE = ["trace.enabled=false"]

# Iteration times (s) of the main branch before issue 12's streams (commit 65a9913, after issue
# 11's kernel model), printed by running
# these configurations against a checkout of main: ``PYTHONPATH=<main> python pin.py`` with
# the same scenario files and overrides as PINNED below. Re-taken at a468a38, whose only model
# change is the fused attention backward's executed matmuls (5/4 of the published count):
# +0.87%, +0.67%, +0.37%, +0.04%, +0.01% against the 65a9913 pins, all of it in the fused
# attention kernels (the same runs at a468a38^ gave the 65a9913 values). The pipelined cases
# untie the model's embeddings: tied, the first and last stage have since (session 39) also
# all-reduced the embedding's gradient, which main did not model; untied, each stage holds
# the same parameters as tied, so the pins stand.
UNTIED = ["workload.model.tied_embeddings=false"]
PINNED = {
    "quickstart": ("quickstart.yaml", [], 0.15552818305185362),
    "1f1b_dp4_pp2": ("hbm_frfcfs.yaml", ["memory.model=roofline", *UNTIED],
                     0.19336087185837414),
    "1f1b_tp2_sp_pp2_dp2": ("hbm_frfcfs.yaml", [
        "memory.model=roofline", "workload.parallelism.dp=2", "workload.parallelism.tp=2",
        "workload.sequence_parallel=true", *UNTIED], 0.23327783955986098),
    "full_shard_dp8": ("quickstart.yaml", [
        "cluster.topology.shape=[4,2]", "workload.parallelism.dp=8",
        "workload.sharding.strategy=full_shard", "workload.global_batch=32"],
        0.18789816132550619),
    "data_starved": ("data_starved.yaml", [], 0.20777663048031175),
}
OFF = ["overlap.tp_comm=false", "overlap.sm_contention=false", "overlap.dp_streams=1"]


def _scen(name: str, sets: list[str]):
    return load_scenario(SC / name).replace(sets + NO_TRACE)


@pytest.mark.parametrize("case", sorted(PINNED))
def test_no_contention_asked_iteration_time_equals_main(case):
    """Overlaps at today's behaviour, roofline memory, no SM sharing: main's iteration time
    within 0.1%."""
    name, sets, expected = PINNED[case]
    got = run(_scen(name, sets + OFF)).summary
    assert got["iteration_time_s"] == pytest.approx(expected, rel=1e-3)
    assert got["hbm_max_streams"] == 0 and got["hbm_slowdown_mean"] == 1.0


def test_every_overlap_off_roofline_is_the_sum_of_block_costs():
    """One device, every overlap off: nothing runs beside anything, so an iteration is the
    sum of the roofline costs of its blocks (``devices.accelerator.ComputeModel``, not the
    executor or the device agents)."""
    scen = _scen("quickstart.yaml", [
        "cluster.topology.shape=[1,1]", "workload.parallelism.dp=1", "workload.global_batch=4",
        "workload.iterations=2", "overlap.dp_buckets=false", "overlap.pipeline=false", *OFF])
    model = build(scen)
    expected = sum(model.compute.block_cost(b).duration_s
                   for b in stage_compute_blocks(model)[0])
    got = run(scen).summary["iteration_time_s"]
    assert got == pytest.approx(expected, rel=1e-3)


def _one_f1b_overlap(memory: list[str]):
    return _scen("hbm_frfcfs.yaml", [
        "workload.parallelism.dp=2", "workload.parallelism.tp=2",
        "workload.sequence_parallel=true", "overlap.tp_comm=true", "overlap.dp_buckets=true",
        "workload.iterations=1", *memory])


def test_1f1b_tp_overlap_dp_buckets_frfcfs_blocks_match_standalone_controller():
    """1F1B with TP overlap and DP buckets on: some blocks run beside >= 2 communication
    streams (the controller serves >= 3 streams), and such a block's slowdown is what the
    FR-FCFS engine gives when run standalone on the same request mix: streams built here from
    the catalog (op at memory_efficiency x peak, one DMA stream per transfer at link x
    efficiency x links_per_edge x 2 bytes/s, per stack), the same random numbers, within 2%;
    and the mix's mean over batches agrees with standalone runs on independent seeds within
    their combined standard error."""
    scen = _one_f1b_overlap(["memory.model=frfcfs", "memory.batches=32"])
    model = build(scen)
    _env, _fab, ex, _ = simulate(model, Recorder())
    assert max(a.max_streams for a in ex.streams) >= 3
    recs = [r for a in ex.streams for m, rs in a.records.items() if sum(m) >= 2 for r in rs
            if r.n_requests > 0]
    assert recs, "no block ran beside two communication streams"
    rec = max(recs, key=lambda r: (r.n_requests, r.slowdown))
    dev, link = scen.cluster.device, scen.cluster.link
    hbm = load_hbm_spec(dev.hbm_type)
    stacks = dev.hbm_stacks
    peak = dev.hbm_bandwidth_gbps * 1e9
    n, k = rec.n_requests, rec.mix[0]
    op = StreamSpec(n_requests=n, arrival="poisson",
                    rate_bytes_per_s=dev.memory_efficiency * peak / stacks,
                    read_fraction=2 / 3, row_locality=0.9)
    dma_rate = link.bandwidth_gbps * 1e9 * link.efficiency * scen.cluster.links_per_edge * 2

    def dma(m: int) -> StreamSpec:
        return StreamSpec(n_requests=m, arrival="poisson", rate_bytes_per_s=dma_rate / stacks,
                          read_fraction=0.5, row_locality=0.97, interleave="random")

    mm = ex.accelerators[0].memory
    tab = mm.table(n, rec.mix)
    r = int(np.flatnonzero(tab.samples == rec.slowdown)[0])  # the batch the block drew
    m = mm._streams(n, rec.mix)[1][0].n_requests  # its DMA streams' length (an input)
    alone = effective_bandwidth(hbm, stacks, op, [], mm._rng(0, n, r))
    same = effective_bandwidth(hbm, stacks, op, [dma(m)] * k, mm._rng(0, n, r),
                               op_alone_bytes_per_s=alone.op_bandwidth_bytes_per_s)
    assert rec.slowdown == pytest.approx(same.slowdown, rel=0.02)
    ratio = dma_rate / (dev.memory_efficiency * peak)
    long = int(n * ratio * 6 * (1 + k * ratio)) + 64  # DMA outlasts the op
    runs = [effective_bandwidth(hbm, stacks, op, [dma(long)] * k,
                                np.random.default_rng(100 + i)).slowdown for i in range(32)]
    se = math.hypot(np.std(runs, ddof=1) / math.sqrt(len(runs)), tab.standard_error)
    assert abs(tab.mean - np.mean(runs)) < 3 * se


def test_tp_overlap_hides_tp_communication():
    """Chunked TP overlap (roofline memory, so only the timeline changes): the exposed TP
    time shrinks and the iteration gets shorter, but never below the compute it contains."""
    off = run(_one_f1b_overlap(["memory.model=roofline", "overlap.tp_comm=false"])).summary
    on = run(_one_f1b_overlap(["memory.model=roofline"])).summary
    assert on["tp_comm_time_per_device_s"] < 0.6 * off["tp_comm_time_per_device_s"]
    assert on["iteration_time_s"] < off["iteration_time_s"]
    assert on["iteration_time_s"] > on["compute_time_per_device_s"] / on["iterations"]


def test_sm_share_of_collectives_slows_compute_beside_them():
    """A block next to one NCCL collective (8 CTAs, catalog) on a 132-SM H100 has its math
    time multiplied by 132 / (132 - 8)."""
    scen = _scen("hbm_frfcfs.yaml", ["memory.model=roofline", "overlap.sm_contention=true",
                                     "workload.iterations=1"])
    _env, _fab, ex, _ = simulate(build(scen), Recorder())
    factors = {r.sm_factor for a in ex.streams for m, rs in a.records.items() if m == (1, 0)
               for r in rs}
    assert any(f == pytest.approx(132 / 124, rel=1e-12) for f in factors)
    summary = run(scen).summary
    assert summary["sm_max_used"] >= 8 and summary["contention_slowdown_mean"] > 1.0


@pytest.mark.parametrize("service", [
    {"dist": "deterministic"}, {"dist": "exponential"}, {"dist": "lognormal", "cov": 2.5},
    {"dist": "pareto", "alpha": 2.5}, {"dist": "pareto", "alpha": 1.8},
    {"dist": "pareto", "alpha": 1.5}])
def test_bandwidth_bound_saturates_at_one_over_rho_for_every_distribution(service):
    """Bandwidth-bound streaming at offered load rho > 1 on a work-conserving server: the op's
    batch completes when all the work that arrived with it is done, so its efficiency is
    1 / rho whatever the service distribution (the fluid limit); at rho < 1 it keeps its
    rate. Tolerance: 5%, 10% for Pareto alpha < 2, whose sum of ~1e4 services fluctuates as
    N^(1/alpha - 1) (2% at alpha 1.5) per batch, worse in the tail."""
    scen = _scen("hbm_frfcfs.yaml", [])
    spec = MemorySpec(model="queue", service=ServiceSpec(**service), batches=24)
    mm = build_memory_model(spec, scen.cluster.device, scen.cluster.link,
                            scen.cluster.links_per_edge, np.random.default_rng(5))
    tol = 0.10 if service.get("alpha", 3) < 2 else 0.05
    k_hi = math.ceil((1.6 - mm.op_load) / mm.dma_load)
    rho = mm.rho(k_hi)
    assert rho > 1.5
    assert 1.0 / mm.table(4096, k_hi).mean == pytest.approx(1.0 / rho, rel=tol)
    k_lo = 1  # rho about 0.95: below saturation the stream keeps (nearly) its rate
    assert mm.rho(k_lo) < 1.0
    assert mm.table(4096, k_lo).mean < 1.0 + tol


def _latency_bound(service: list[str]):
    return _scen("quickstart.yaml", [
        "cluster.topology.shape=[2,1]", "workload.parallelism.dp=2", "workload.global_batch=8",
        "workload.micro_batch=1", "workload.seq_len=512", "workload.iterations=20",
        "memory.model=queue", "memory.bound=auto", "memory.batches=8", *service])


def test_heavy_tails_reach_latency_bound_iterations():
    """Latency-bound work (norms, element-wise, optimizer, small GEMMs) draws the queue's
    sojourn tail block by block: with Pareto alpha 1.5 the iteration-time running mean does
    not settle and the run is flagged; alpha 2.5 settles (relative standard error <= 5% in 20
    iterations). Lognormal service: ``test_lognormal_latency_bound_settles`` (slow)."""
    heavy = run(_latency_bound(["memory.service.dist=pareto", "memory.service.alpha=1.5"]))
    light = run(_latency_bound(["memory.service.dist=pareto", "memory.service.alpha=2.5"]))
    h = heavy.summary
    assert not h["iteration_time_converged"]
    assert h["iteration_time_mean_is"].startswith("sample mean")
    # flagged, either by its source (infinite-variance service) or by a drifting running mean
    assert any("does not settle" in w or "infinite variance" in w
               for w in h["iteration_time_warnings"])
    assert light.summary["iteration_time_converged"], light.summary["iteration_time_warnings"]


@pytest.mark.slow
def test_lognormal_latency_bound_settles():
    """Lognormal service (cov 2.5) has finite variance: its iterations vary more (cov about
    0.5 here), so the 5% relative standard error the convergence check asks for needs about
    (0.5 / 0.05)^2 = 100 iterations; with 160 the running mean settles and nothing is flagged
    as infinite variance."""
    logn = run(_latency_bound(["memory.service.dist=lognormal", "memory.service.cov=2.5",
                               "workload.iterations=160"])).summary
    assert logn["iteration_time_converged"], logn["iteration_time_warnings"]
    assert not any("infinite variance" in w for w in logn["iteration_time_warnings"])


def test_pcie_switch_shares_uplink_and_port():
    """Two copies to the two GPUs of one DGX H100 switch share its uplink (each at half
    rate, processor sharing of one x16 link); a GPU whose NIC carries a flow gets half its
    port."""
    spec = load_pcie_spec("dgx-h100")
    env = simpy.Environment()
    fab = PcieFabric(env, spec, gpus_per_node=8)
    started = []
    ports = [fab.port(0, started.append), fab.port(1, started.append), fab.port(2)]
    nbytes = 1e9
    ends = {}

    def copy(i):
        yield from ports[i].transfer(nbytes)
        ends[i] = env.now

    env.process(copy(0))
    env.process(copy(1))
    env.run()
    rate = spec.port_gbps * 1e9
    assert ends[0] == pytest.approx(nbytes / rate)           # first: uplink free
    assert ends[1] == pytest.approx(nbytes / (rate / 2))     # second: shares the uplink
    assert started == [1, 1, -1, -1]
    fab.nic([2], 1)
    sw, slot = fab.place(2)
    assert sw.copy_rate(slot) == pytest.approx(rate / 2)


@pytest.mark.parametrize("bad", ["overlap.tp_chunks=0", "overlap.tp_chunks=65",
                                 "overlap.dp_streams=99", "overlap.dp_streams=17",
                                 "overlap.dp_streams=0",
                                 "overlap.tp_comm=maybe", "memory.bound=sometimes",
                                 "data.pcie_switch=dgx-z9"])
def test_bad_overlap_keys_are_refused(bad):
    """New keys have domains (README: ``tp_chunks`` 1-64, ``dp_streams`` 1-16): a bad value
    names the field; the bounds themselves are accepted."""
    with pytest.raises(ScenarioError) as exc:
        load_scenario(SC / "data_starved.yaml").replace([bad])
    assert bad.split("=")[0] in str(exc.value)


def test_overlap_bounds_are_accepted_and_sm_sharing_is_off_by_default():
    scen = load_scenario(SC / "data_starved.yaml").replace(["overlap.tp_chunks=64",
                                                            "overlap.dp_streams=16"])
    assert (scen.overlap.tp_chunks, scen.overlap.dp_streams) == (64, 16)
    low = load_scenario(SC / "data_starved.yaml").replace(["overlap.tp_chunks=1",
                                                           "overlap.dp_streams=1"])
    assert (low.overlap.tp_chunks, low.overlap.dp_streams) == (1, 1)
    # a roofline run that does not ask for it shares no SMs with its collectives
    s = run(load_scenario(ROOT / "scenarios" / "quickstart.yaml").replace([
        "workload.iterations=1", "trace.enabled=false"])).summary
    assert s["sm_max_used"] == 0 and s["hbm_max_streams"] == 0


def test_contention_map_cli_writes_cells_and_marks_non_converged(tmp_path, capsys):
    """``twin contention`` on a small map: one row per cell in cells.csv (with the roofline
    cell as the efficiency reference), the PNG, and the Pareto 1.5 cell marked not
    converged (infinite-variance service)."""
    import pandas as pd
    import yaml

    from twin.cli import main

    spec = {"name": "mini", "iterations": 3, "configurations": {"lat": {
        "base": str(SC / "quickstart.yaml"),
        "set": ["cluster.topology.shape=[2,1]", "workload.parallelism.dp=2",
                "workload.global_batch=4", "workload.micro_batch=1", "workload.seq_len=256",
                "memory.bound=auto"]}},
        "concurrency": {"default": []},
        "services": {"exp": {"dist": "exponential"}, "p15": {"dist": "pareto", "alpha": 1.5}}}
    f = tmp_path / "map.yaml"
    f.write_text(yaml.safe_dump(spec))
    out = tmp_path / "runs" / "maps" / "out"  # folders still to be made
    assert main(["contention", str(f), "-o", str(out), "--workers", "0", "--quiet"]) == 0
    assert f"wrote {out / 'cells.csv'} and {out / 'contention_map.png'}" in \
        capsys.readouterr().out
    df = pd.read_csv(out / "cells.csv")
    assert sorted(df.service) == ["exp", "p15", "roofline"]
    from experiments.contention import COLUMNS

    assert tuple(df.columns) == COLUMNS  # no index column
    assert (out / "contention_map.png").stat().st_size > 0
    p15 = df[df.service == "p15"].iloc[0]
    assert not p15.converged and p15.iteration_time_p99_s >= p15.iteration_time_p50_s
    roof = df[df.service == "roofline"].iloc[0]
    assert p15.efficiency == pytest.approx(roof.iteration_time_mean_s / p15.iteration_time_mean_s)
    assert main(["check", str(f)]) == 0
    # resumed in the same (existing) folder: the same table
    assert main(["contention", str(f), "-o", str(out), "--workers", "0", "--quiet",
                 "--resume"]) == 0
    pd.testing.assert_frame_equal(df, pd.read_csv(out / "cells.csv"))
    spec["services"]["bad"] = {"dist": "pareto", "alpha": 0.5}
    f.write_text(yaml.safe_dump(spec))
    assert main(["check", str(f)]) == 2


def test_per_device_draws_false_keeps_symmetry():
    """``memory.per_device_draws: false``: one agent per class of equal ranks draws for all of
    them, so rank symmetry stays on (fewer simulated classes) with the contention model; the
    per-device run simulates every rank."""
    shared = run(_scen("hbm_frfcfs.yaml", ["memory.per_device_draws=false"])).summary
    each = run(_scen("hbm_frfcfs.yaml", [])).summary
    assert shared["symmetry_used"] and not each["symmetry_used"]
    assert shared["rank_classes"] < each["rank_classes"] == each["devices"]
    assert shared["hbm_max_streams"] >= 2 and shared["hbm_slowdown_mean"] > 1.0


@pytest.mark.parametrize("sets,n,group", [
    (["memory.per_device_draws=false"], 8, 2),    # a stage's 4 replicas x 2 TP ranks
    ([], 2, 2),                                   # one agent per TP group
    (["simulation.tp_group_agents=false"], 1, 1),  # one agent per rank
])
def test_each_device_agent_draws_once_per_member_of_the_tp_group_it_stands_for(sets, n, group):
    """DP 4 x TP 2 x PP 2 beside FR-FCFS: every device agent stands for the devices of its
    class and draws one factor per member of the TP group that meets after each block."""
    scen = _scen("hbm_frfcfs.yaml", ["workload.parallelism.dp=4", "workload.parallelism.tp=2",
                                     "cluster.topology.shape=[4,4]", "workload.iterations=1",
                                     *sets])
    _env, _fab, ex, _ = simulate(build(scen), Recorder())
    assert len(ex.streams) == 16 // n
    assert {(a.n, a.group) for a in ex.streams} == {(n, group)}


def test_copies_of_a_class_count_once_per_device():
    """The data path's host-to-device copies beside FR-FCFS, 16 loading ranks on two hosts
    (TP 4 x DP 4): a PCIe port copies one microbatch at a time, so a device serves at most
    the compute stream and one copy (2 streams; one agent per rank shows it). An agent that
    stands for several ranks (rank symmetry, or one agent per TP group) counts its ranks'
    copies running at once as that one copy per device, not one stream per rank."""
    sets = ["workload.parallelism.tp=4", "workload.parallelism.dp=4",
            "workload.iterations=2", "memory.model=frfcfs"]
    runs = {name: run(_scen("data_starved.yaml", sets + extra)).summary for name, extra in (
        ("symmetric", ["memory.per_device_draws=false"]), ("groups", []),
        ("ranks", ["simulation.tp_group_agents=false"]))}
    assert runs["symmetric"]["symmetry_used"]
    assert runs["groups"]["rank_classes"] == 4 and runs["ranks"]["rank_classes"] == 16
    assert [r["hbm_max_streams"] for r in runs.values()] == [2, 2, 2]
    assert all(r["data_wait_fraction"] > 0.1 for r in runs.values())  # the copies ran



def test_a_copy_beside_compute_is_a_stream_on_the_device():
    """Pure DP with its all-reduces after the backward pass (``overlap.dp_buckets: false``:
    nothing from the network beside compute) and a starved data path: the HBM controller
    serves the compute stream and the next batch's copy (2 streams, compute slowed); without
    the data path one stream at a time, nothing slowed."""
    sets = ["workload.iterations=2", "memory.model=frfcfs", "overlap.dp_buckets=false"]
    fed = run(_scen("data_starved.yaml", sets)).summary
    none = run(_scen("data_starved.yaml", [*sets, "data.enabled=false"])).summary
    assert fed["data_wait_fraction"] > 0.1  # the copies ran
    assert fed["hbm_max_streams"] == 2 and none["hbm_max_streams"] == 1
    assert fed["hbm_slowdown_mean"] > 1.0 and none["hbm_slowdown_mean"] == 1.0

def test_sm_sharing_without_a_memory_model_serves_no_hbm_streams():
    """Device agents for SM sharing alone (``overlap.sm_contention``, roofline memory): the
    collectives take SMs (``sm_max_used`` > 0), but no HBM controller is modelled, so it
    served no streams (``hbm_max_streams`` 0) and slowed nothing for HBM."""
    s = run(load_scenario(ROOT / "scenarios" / "quickstart.yaml").replace([
        "workload.iterations=1", "trace.enabled=false", "overlap.sm_contention=true"])).summary
    assert s["sm_max_used"] > 0
    assert s["hbm_max_streams"] == 0 and s["hbm_slowdown_mean"] == 1.0


def test_sm_contention_false_beside_a_memory_model_is_honoured():
    """``overlap.sm_contention`` unset follows the memory model (on with FR-FCFS, off with
    roofline); set, it is obeyed. ``false`` beside FR-FCFS used to be ignored: its collectives
    still took SMs. Now only HBM is shared then: no SM used, and the run lies between the
    roofline one and the one sharing both."""
    base = load_scenario(ROOT / "scenarios" / "hbm_frfcfs.yaml").replace(
        ["workload.iterations=1", "trace.enabled=false"])
    assert base.overlap.sm_contention is None and base.sm_shared
    assert not base.replace(["memory.model=roofline"]).sm_shared
    auto, off, on = (run(base.replace(sets)).summary for sets in (
        [], ["overlap.sm_contention=false"], ["overlap.sm_contention=true"]))
    roof = run(base.replace(["memory.model=roofline"])).summary
    assert auto["iteration_time_s"] == on["iteration_time_s"] and auto["sm_max_used"] > 0
    assert off["sm_max_used"] == 0 and off["hbm_max_streams"] > 0
    assert roof["iteration_time_s"] < off["iteration_time_s"] < on["iteration_time_s"]


def test_a_map_problem_shared_by_many_cells_is_reported_once_with_its_cells():
    """A bad concurrency override reaches every cell of its row (roofline + each service, in
    each configuration): one problem naming the first cell and how many more, not one per
    cell."""
    from experiments.contention import load_map

    def problems(concurrency, services):
        spec = {"name": "m", "iterations": 3,
                "configurations": {c: {"base": str(SC / "quickstart.yaml")} for c in "ab"},
                "concurrency": concurrency, "services": services}
        with pytest.raises(ScenarioError) as exc:
            load_map(spec)
        return [str(p) for p in exc.value.problems]

    three = {"e": {"dist": "exponential"}, "d": {"dist": "deterministic"}}
    (p,) = problems({"ok": [], "bad": ["overlap.tp_comm=maybe"]}, three)
    assert p.startswith("a/bad/roofline and 5 more cells: overlap.tp_comm") and "maybe" in p
    assert p.endswith("allowed: true or false")  # the cell's allowed values kept
    (p,) = problems({"ok": []}, {"e": {"dist": "pareto", "alpha": 0.5}})
    assert p.startswith("a/ok/e and 1 more cells: memory.service.alpha")
    (p,) = problems({"ok": [], "x": ["workload.micro_batch=3"]}, {"e": {"dist": "exponential"}})
    assert p.startswith("a/x/roofline and 3 more cells: workload.global_batch")
    # a service or concurrency given twice under two names would run its cells twice
    assert problems({"ok": [], "same": []}, {"e": {"dist": "exponential"},
                                              "f": {"dist": "exponential"}}) == [
        "services.f: the same as services.e: its cells would be run twice (given: "
        "{'dist': 'exponential'}); allowed: distinct services",
        "concurrency.same: the same as concurrency.ok: its cells would be run twice "
        "(given: []); allowed: distinct concurrency"]


@pytest.mark.parametrize("bound", ["auto", "bandwidth"])
def test_a_cells_record_is_its_runs_summary(bound):
    """``run_cell`` against the same scenario run here: the iteration statistics and HBM
    figures are the summary's, and ``rho_max`` the largest utilization over the summary's
    bandwidth levels and its latency levels (``bandwidth``: no latency levels)."""
    from experiments.contention import load_map, run_cell

    spec = {"name": "one", "iterations": 3, "configurations": {"lat": {
        "base": str(SC / "quickstart.yaml"),
        "set": ["cluster.topology.shape=[2,1]", "workload.parallelism.dp=2",
                "workload.global_batch=4", "workload.micro_batch=1", "workload.seq_len=256",
                f"memory.bound={bound}"]}},
        "concurrency": {"default": []}, "services": {"exp": {"dist": "exponential"}}}
    _spec, tasks = load_map(spec)
    (task,) = [t for t in tasks if t["service"] == "exp"]
    rec = run_cell(task)
    s = run(load_scenario(task["scenario"])).summary
    rhos = [lv["rho"] for lv in (s.get("memory_levels") or [])]
    rhos += [lv["rho"] for lv in ((s.get("memory_latency") or {}).get("levels") or [])]
    assert rhos and rec["rho_max"] == max(rhos)
    assert (rec["iteration_time_mean_s"], rec["iteration_time_p99_s"]) == (
        s["iteration_time_s"], s["iteration_time_p99_s"])
    assert rec["hbm_slowdown_mean"] == s["hbm_slowdown_mean"] and rec["error"] == ""


def test_a_map_whose_base_is_missing_names_its_configuration(tmp_path):
    from experiments.contention import load_map

    spec = {"name": "m", "configurations": {"a": {"base": str(tmp_path / "nope.yaml")}},
            "concurrency": {"default": []}, "services": {"e": {"dist": "exponential"}}}
    with pytest.raises(ScenarioError) as exc:
        load_map(spec)
    (p,) = exc.value.problems
    assert p.path == "configurations.a.base" and "not found" in p.message


@pytest.mark.parametrize(("bw", "lat"), [(False, False), (False, True), (True, False),
                                         (True, True)])
def test_the_summarys_memory_flags_join_the_bandwidth_and_latency_draws(monkeypatch, bw, lat):
    """With ``memory.bound: auto`` the run's HBM flags cover both kinds of draws: unstable or
    of infinite variance if either is, converged only if both are; the latency-bound draws'
    warnings follow the bandwidth-bound ones', prefixed. Each draw's report is a stub here."""
    from types import SimpleNamespace

    import devices.interference
    from twin.summary import _memory_keys

    def report(flag: bool, name: str) -> dict:
        return {"memory_model": "queue", "memory_bound": "auto", "memory_unstable": flag,
                "memory_variance_infinite": flag, "memory_converged": not flag,
                "memory_warnings": [f"{name} warning"] if flag else []}

    monkeypatch.setattr(devices.interference, "streams_report", lambda agents: {})
    memory = SimpleNamespace(report=lambda: report(bw, "bandwidth"))
    latency = SimpleNamespace(report=lambda: report(lat, "latency"))
    ex = SimpleNamespace(accelerators=[SimpleNamespace(memory=memory)],
                         streams=[SimpleNamespace(latency=latency)])
    out = _memory_keys(ex)
    either = bw or lat
    assert out["memory_unstable"] is either and out["memory_variance_infinite"] is either
    assert out["memory_converged"] is (not either)
    assert out["memory_warnings"] == (["bandwidth warning"] if bw else []) + (
        ["latency-bound kernels: latency warning"] if lat else [])
    assert out["memory_latency"]["unstable"] is lat


def test_a_map_cells_label_says_what_its_run_gave():
    """Mean and p99 in ms to 3 digits; a mean that did not settle is said and hatched; a
    cell whose run failed says so and nothing else."""
    from types import SimpleNamespace

    from experiments.contention import cell_label

    def cell(**kw):
        return SimpleNamespace(**{"error": None, "converged": True,
                                  "iteration_time_mean_s": 0.12345,
                                  "iteration_time_p99_s": 0.5, **kw})

    assert cell_label(cell()) == ("123\np99 500", False)
    assert cell_label(cell(converged=False)) == ("123\np99 500\nnot converged", True)
    assert cell_label(cell(error="MemoryError", converged=False)) == ("error", False)


def test_contention_map_settings_take_their_bounds():
    from pydantic import ValidationError

    from experiments.contention import ContentionMap

    def spec(**kw):
        return {"name": "m", "configurations": {"a": {"base": "x.yaml"}},
                "concurrency": {"q": []}, "services": {"e": {"dist": "exponential"}}, **kw}

    def named(n, value):
        return {f"k{i}": value for i in range(n)}

    assert ContentionMap.model_validate(spec()).iterations == 20  # the default
    for ok in ({"seed": 0}, {"seed": 2**63 - 1}, {"iterations": 2}, {"iterations": 100_000},
               {"concurrency": named(32, [])},
               {"services": named(32, {"dist": "exponential"})},
               {"configurations": named(16, {"base": "x.yaml"})}):
        ContentionMap.model_validate(spec(**ok))
    for bad in ({"seed": -1}, {"seed": 2**63}, {"iterations": 1}, {"iterations": 100_001},
                {"concurrency": named(33, [])},
                {"services": named(33, {"dist": "exponential"})},
                {"configurations": named(17, {"base": "x.yaml"})}):
        with pytest.raises(ValidationError):
            ContentionMap.model_validate(spec(**bad))


def test_a_failed_cell_keeps_its_error_cut_to_300_characters(tmp_path, monkeypatch):
    """A cell whose run raises is recorded (not converged) with the exception's type and
    message, cut to 300 characters, and the map goes on."""
    import pandas as pd
    import yaml

    import experiments.contention as ct
    from twin.cli import main

    def boom(task):
        raise RuntimeError("x" * 1000)

    monkeypatch.setattr(ct, "run_cell", boom)
    spec = {"name": "f", "iterations": 2, "configurations": {"a": {
        "base": str(SC / "quickstart.yaml")}}, "concurrency": {"q": []},
        "services": {"e": {"dist": "exponential"}}}
    f = tmp_path / "map.yaml"
    f.write_text(yaml.safe_dump(spec))
    assert main(["contention", str(f), "-o", str(tmp_path / "o"), "--workers", "0",
                 "--quiet"]) == 0
    df = pd.read_csv(tmp_path / "o" / "cells.csv")
    assert len(df) == 2 and not df.converged.any()
    assert (df.error == ("RuntimeError: " + "x" * 1000)[:300]).all()


def test_a_map_panel_puts_each_cell_of_its_configuration_in_its_place():
    """Rows are concurrencies and columns services in the map's order; a cell of another
    configuration, or of the same concurrency but another service, never lands in it; a
    missing cell is NaN and unlabelled; a failed one has no efficiency."""
    import math

    import pandas as pd

    from experiments.contention import map_panel

    def cell(conf, q, sv, eff, **kw):
        return {"configuration": conf, "concurrency": q, "service": sv, "efficiency": eff,
                "iteration_time_mean_s": 0.01, "iteration_time_p99_s": 0.02,
                "converged": True, "error": "", **kw}

    df = pd.DataFrame([cell("b", "q1", "s1", 0.9), cell("a", "q2", "s1", 0.5),
                       cell("a", "q1", "s2", 0.7, converged=False),
                       cell("a", "q1", "s1", 1.0),
                       cell("a", "q2", "s2", math.nan, error="boom", converged=False)])
    grid, labels = map_panel(df, "a", ["q1", "q2", "q3"], ["s1", "s2"])
    assert grid.shape == (3, 2)
    assert grid[:2].tolist()[0] == [1.0, 0.7] and grid[1, 0] == 0.5
    assert math.isnan(grid[1, 1]) and all(math.isnan(v) for v in grid[2])
    assert set(labels) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert labels[(0, 1)] == ("10\np99 20\nnot converged", True)
    assert labels[(1, 1)] == ("error", False)
