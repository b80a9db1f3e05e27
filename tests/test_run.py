"""End-to-end runs: determinism, FLOPs and bytes accounting, traces, atomic writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from tests.conftest import DEVICE_TIME_KEYS, ROOT
from twin.runner import run
from twin.summary import SUMMARY_KEYS
from twin.trace import list_tables, read_attrs, read_table
from workloads import collectives
from workloads.transformer import closed_form_flops


def _datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        f.visititems(visit)
        attrs = {k: f.attrs[k] for k in ("seed", "scenario")}
    return out, attrs


def test_summary_has_contract_keys(tiny):
    import time

    t0 = time.perf_counter()
    res = run(tiny())
    # the run's own wall time, trace included: within the call's (a mutant reported the
    # clock's reading instead of the difference)
    assert 0 < res.summary["wall_time_s"] <= time.perf_counter() - t0
    for k in SUMMARY_KEYS:
        assert k in res.summary
    assert set(res.summary["energy_breakdown_j"]) == {"compute", "memory", "network", "static",
                                                      "idle", "regulator"}
    assert res.summary["devices"] == 8
    assert 0 < res.summary["mfu"] < 1


def test_same_seed_same_trace_different_seed_differs(tiny, tmp_path):
    """Compute jitter is the random element here; symmetry is off because of it."""
    ov = ["simulation.compute_jitter_cov=0.05"]
    a = run(tiny(ov), tmp_path / "a.h5")
    b = run(tiny(ov), tmp_path / "b.h5")
    c = run(tiny([*ov, "seed=8"]), tmp_path / "c.h5")
    da, aa = _datasets(a.trace_path)
    db, ab = _datasets(b.trace_path)
    dc, _ = _datasets(c.trace_path)
    assert da.keys() == db.keys()
    for k in da:
        np.testing.assert_array_equal(da[k], db[k], err_msg=k)
    assert aa["scenario"] == ab["scenario"]
    assert not np.array_equal(da["ops/t_end"], dc["ops/t_end"])
    assert a.summary["symmetry_used"] is False


def test_flops_equal_closed_form(tiny):
    """GPT, no recompute: executed GEMM FLOPs = 72 B s l h^2 (1 + s/6h + V/12lh)."""
    s = tiny(workload__model="gpt-1.7b", workload__seq_len=1024)
    res = run(s)
    w = s.workload
    expect = closed_form_flops(w.model, w.global_batch, w.seq)
    assert res.summary["executed_flops_per_iteration"] == pytest.approx(expect, rel=1e-9)
    assert res.summary["model_flops_per_iteration"] == pytest.approx(expect, rel=1e-9)


def test_full_recompute_flops(tiny):
    """Full recompute runs the layers' forward twice: the 96 form differs only by the logits
    term being counted once in forward; layers-only check against the 96 formula."""
    s = tiny(workload__model="gpt-1.7b", workload__seq_len=1024, workload__recompute="full")
    res = run(s)
    w = s.workload
    m = w.model
    extra = 24.0 * w.global_batch * w.seq * m.layers * m.hidden ** 2 * (1 + w.seq / (6 * m.hidden))
    base = closed_form_flops(m, w.global_batch, w.seq)
    assert res.summary["executed_flops_per_iteration"] == pytest.approx(base + extra, rel=1e-9)
    assert closed_form_flops(m, w.global_batch, w.seq, "full") == pytest.approx(
        base + extra, rel=1e-9)


@pytest.mark.parametrize("net", ["flow", "packet"])
def test_bytes_sent_equal_received(tiny, net):
    res = run(tiny([f"network.model={net}"]))
    s = res.summary
    assert s["bytes_sent"] > 0
    assert s["bytes_sent"] == pytest.approx(s["bytes_received"], rel=1e-12)


def test_dp_allreduce_matches_alpha_beta(tiny):
    """One bucket holding every gradient, nothing else on the links: the all-reduce of the
    trace takes the ring alpha-beta time over the snake ring of the torus."""
    s = tiny(["workload.grad_bucket_mb=1e6"])
    res = run(s)
    ops = read_table(res.trace_path, "ops")
    dp = ops[ops["kind"] == "dp"]
    assert len(dp) == 1
    link = s.cluster.link
    alpha = (link.overhead_us + link.latency_us) * 1e-6
    bw = link.bytes_per_s * s.cluster.links_per_edge
    nbytes = res.summary["bytes_sent"] / (2 * 7)  # p * 2(p-1)/p * n  with p = 8
    expect = collectives.alpha_beta_time("allreduce", 8, nbytes, alpha, bw)
    assert float(dp["t_end"].iloc[0] - dp["t_start"].iloc[0]) == pytest.approx(expect, rel=0.01)


def test_trace_layout_and_read_table(tiny):
    res = run(tiny(["workload.iterations=2"]))
    tables = set(list_tables(res.trace_path))
    assert {"ops", "messages", "links", "power", "ranks"} <= tables
    attrs = read_attrs(res.trace_path)
    assert attrs["schema_version"] == 1 and attrs["complete"]
    assert attrs["seed"] == 7 and "llama3.2-1b" in attrs["scenario"]
    assert attrs["summary"]["iterations"] == 2
    ops = read_table(res.trace_path, "ops")
    assert set(ops["kind"].cat.categories) >= {"compute", "dp"}
    assert (ops["t_end"] >= ops["t_start"]).all()
    assert ops.attrs["units"]["t_start"] == "s"
    links = read_table(res.trace_path, "links")
    assert len(links) == 2 * 8 * 2 - 2 * 4  # 4x2 torus: 4 x-edges per row, 4 y-edges (doubled)
    with h5py.File(res.trace_path) as f:
        ds = f["ops/t_start"]
        assert ds.chunks is not None and ds.compression == "gzip"


def test_energy_closure_of_device_power(tiny):
    """Device energy components equal the integral of the power trace."""
    res = run(tiny(["workload.iterations=2"]))
    pw = read_table(res.trace_path, "power")
    ranks = read_table(res.trace_path, "ranks")
    size = ranks.groupby("cls").size()
    integral = float(((pw["t_end"] - pw["t_start"]) * pw["watts"] * pw["cls"].map(size)).sum())
    b = res.summary["energy_breakdown_j"]
    device = b["compute"] + b["memory"] + b["static"] + b["idle"] + b["regulator"]
    assert integral == pytest.approx(device, rel=1e-9)
    # every class is covered from 0 to the makespan without gaps
    for _, g in pw.groupby("cls"):
        g = g.sort_values("t_start")
        assert g["t_start"].iloc[0] == 0.0
        np.testing.assert_allclose(g["t_start"].to_numpy()[1:], g["t_end"].to_numpy()[:-1])
        assert g["t_end"].iloc[-1] == pytest.approx(res.summary["makespan_s"])


def test_symmetry_gives_same_answer_as_full(tiny):
    """Simulating one representative per stage equals simulating every rank."""
    base = ["workload.parallelism.dp=2", "workload.parallelism.tp=2",
            "workload.parallelism.pp=2", "workload.global_batch=8"]
    a = run(tiny(base)).summary
    b = run(tiny([*base, "simulation.symmetry=false"])).summary
    assert a["symmetry_used"] and not b["symmetry_used"]
    assert a["rank_classes"] == 2 and b["rank_classes"] == 8
    for k in ("iteration_time_s", "energy_j", "bytes_sent", "bubble_fraction"):
        assert a[k] == pytest.approx(b[k], rel=1e-9), k


def test_killed_run_leaves_no_trace(tmp_path):
    """SIGKILL in the middle of a run: nothing at the final trace path."""
    out = tmp_path / "killed.h5"
    cmd = [sys.executable, "-m", "twin.cli", "run", str(ROOT / "scenarios/quickstart.yaml"),
           "-o", str(out), "--set", "workload.iterations=400", "--set", "network.model=packet",
           "--set", "simulation.limits.max_events=1000000000"]  # a long run, on purpose
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    partial = []
    while time.time() < deadline and not partial:
        partial = list(tmp_path.glob("killed.h5.partial-*"))
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, "run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert partial, "the run never opened its temporary trace"
    assert not out.exists()


def test_exception_removes_partial(tmp_path):
    from twin.kernel.trace import TraceWriter

    path = tmp_path / "x.h5"
    with pytest.raises(RuntimeError), TraceWriter(path) as w:
        w.table("t", {"a": "float64"}).append(1.0)
        raise RuntimeError("boom")
    assert not path.exists() and not list(tmp_path.iterdir())


def test_run_cli_writes_summary_and_plot(tmp_path, capsys):
    from twin.cli import main

    out = tmp_path / "q.h5"
    png = tmp_path / "q.png"
    code = main(["run", str(ROOT / "scenarios/quickstart.yaml"), "-o", str(out),
                 "--plot", str(png), "--set", "workload.iterations=1"])
    assert code == 0 and out.exists() and png.stat().st_size > 1000
    assert "iteration_time_s" in capsys.readouterr().out
    assert main(["summary", str(out), "--json"]) == 0
    assert '"mfu"' in capsys.readouterr().out


@pytest.mark.parametrize(("sets", "words"), [
    (["trace.tables=[power]"], "--plot: needs the trace's ops table(s)"),
    (["trace.tables=[ops]"], "--report: needs the trace's power table(s)"),
    (["trace.enabled=false"], "--plot: needs the run's trace (trace.enabled is false)"),
])
def test_a_plot_or_report_the_trace_cannot_serve_is_refused_before_the_run(
        tmp_path, capsys, sets, words):
    """``--plot`` reads the ops table and ``--report`` ops and power: a scenario whose
    ``trace.tables`` leaves them out gave a KeyError traceback (plot) or an error after the
    whole run (report), and without a trace ``--plot`` was skipped silently. Now each is
    refused before anything is simulated or written."""
    from twin.cli import main

    out = tmp_path / "q.h5"
    code = main(["run", str(ROOT / "scenarios/quickstart.yaml"), "-o", str(out),
                 "--plot", str(tmp_path / "q.png"), "--report", str(tmp_path / "q.html"),
                 *[a for s in sets for a in ("--set", s)]])
    assert code == 2 and words in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_the_packet_model_cuts_messages_at_the_scenarios_packet_size(tiny):
    """``network.packet_kib`` is KiB: the fabric the run builds cuts packets of 64 x 1024 B
    (a mutant of the runner made them 64 x 1025 B)."""
    from twin.build import build
    from twin.runner import simulate_untraced

    scen = tiny(["network.model=packet", "network.packet_kib=64", "workload.iterations=1",
                 "cluster.topology.shape=[2,1]", "workload.parallelism.dp=2",
                 "workload.global_batch=2", "workload.model.layers=1"])
    _env, fabric, _ex, _faults = simulate_untraced(build(scen))
    assert fabric.packet_bytes == 64 * 1024


def test_public_api_after_submodules_are_imported(tiny):
    """``twin.run`` is the function even after every submodule has been imported (a module
    named ``twin.run`` would shadow it)."""
    import importlib

    import twin

    for mod in ("twin.runner", "twin.api", "twin.summary", "twin.validate"):
        importlib.import_module(mod)
    assert callable(twin.run) and callable(twin.load_scenario)
    assert twin.run(tiny()).summary["devices"] == 8


def test_message_record_fields_are_the_messages_columns():
    from devices.fabric import MessageRecord
    from twin.recording import MESSAGES_COLUMNS

    assert list(MessageRecord._fields) == list(MESSAGES_COLUMNS)


def test_summary_fractions_and_memory_are_its_own_parts(tiny):
    """Keys that restate others in other units: the exposed communication share is the TP
    and data-parallel waits per device over the makespan; memory per device in GB is each
    stage's bytes (``workloads.feasibility.stage_memory``, the check's path) / 1e9."""
    from workloads.feasibility import stage_memory

    scen = tiny(["workload.parallelism.dp=2", "workload.parallelism.tp=2",
                 "workload.parallelism.pp=2", "workload.global_batch=8",
                 "overlap.dp_buckets=false"])
    s = run(scen).summary
    assert s["tp_comm_time_per_device_s"] > 0 and s["dp_wait_per_device_s"] > 0
    assert s["exposed_comm_fraction"] == pytest.approx(
        (s["tp_comm_time_per_device_s"] + s["dp_wait_per_device_s"]) / s["makespan_s"],
        rel=1e-9)
    assert sum(s[k] for k in DEVICE_TIME_KEYS) == pytest.approx(s["makespan_s"], rel=1e-9)
    mem = stage_memory(scen.workload, scen.cluster.device)
    assert s["memory_per_device_gb"] == pytest.approx(
        {f"stage{m.stage}": m.total / 1e9 for m in mem}, rel=1e-12)
    assert min(s["memory_per_device_gb"].values()) > 0.01


def test_headline_rates_restate_the_totals(tiny):
    """Average power is the energy over the makespan; TFLOP/s per device is the model FLOPs
    of an iteration over its time and the devices, which is MFU times the H100's bf16 peak
    (989 TFLOP/s, catalog); shortcuts that were not taken are not listed and count 0."""
    from twin.catalogs import catalog

    s = run(tiny(["workload.parallelism.dp=4", "workload.parallelism.pp=2",
                  "workload.global_batch=16"])).summary
    assert s["avg_power_w"] * s["makespan_s"] == pytest.approx(s["energy_j"], rel=1e-12)
    assert s["tflops_per_device"] * 1e12 * s["iteration_time_s"] * s["devices"] == (
        pytest.approx(s["model_flops_per_iteration"], rel=1e-12))
    peak = catalog("devices").get("h100-sxm").values["peak_tflops"]["bf16"]
    assert s["tflops_per_device"] == pytest.approx(s["mfu"] * peak, rel=1e-12)
    for key in ("tp_optimistic", "tp_fluid"):
        assert key not in s["shortcuts_used"]
        assert s[f"{key}_collectives"] == 0
    assert s["tp_optimistic_rewinds"] == s["tp_fluid_handoffs"] == 0


@pytest.mark.parametrize("sharding", ["none", "full_shard"])
def test_device_times_add_up_with_input_waits(sharding):
    """A data path slower than the compute (``scenarios/data_starved.yaml``), with and without
    FULL_SHARD: the compute stream's input waits are one of the per-device times that add up
    to the makespan (with the all-gather waits when sharded)."""
    from twin.scenario import load_scenario

    s = run(load_scenario(ROOT / "scenarios" / "data_starved.yaml",
                          ["trace.enabled=false",
                           f"workload.sharding.strategy={sharding}"])).summary
    assert s["data_wait_per_device_s"] > 0
    shard = (s.get("sharding") or {}).get("allgather_wait_per_device_s") or 0.0
    assert (shard > 0) == (sharding != "none")
    assert sum(s[k] for k in DEVICE_TIME_KEYS) + shard == pytest.approx(s["makespan_s"],
                                                                         rel=1e-9)


def test_latency_bound_warnings_say_so():
    """``memory.bound: auto`` with Pareto 1.8 service: the latency-bound kernels' queue
    adds its own warnings to ``memory_warnings``, each marked as theirs."""
    from twin.scenario import load_scenario

    s = run(load_scenario(ROOT / "scenarios" / "hbm_queue_pareto.yaml",
                          ["memory.bound=auto", "trace.enabled=false"])).summary
    lat = [w for w in s["memory_warnings"] if w.startswith("latency-bound kernels: ")]
    assert lat and len(lat) < len(s["memory_warnings"])
    assert any("infinite service variance" in w for w in lat)


def test_lockstep_rings_are_listed_as_a_shortcut_only_under_the_step_model():
    """TP 4 x PP 4 on a 4x4 mesh without symmetry (pipeline sends cross the TP rings, so the
    rings go to the flow engine): under ``network.ring_model: step`` the fast mode runs each
    TP ring as one lock-step flow and says so; with ``simulation.lockstep_rings: false`` it
    does not; under the default lock-step ring model that is the model, not a shortcut."""
    from twin.scenario import load_scenario

    base = {"name": "grid", "seed": 3,
            "cluster": {"topology": {"kind": "mesh2d", "shape": [4, 4]}, "device": "h100-sxm",
                        "link": "nvlink4", "links_per_edge": 4},
            "workload": {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 1024,
                         "global_batch": 8, "micro_batch": 1,
                         "parallelism": {"dp": 1, "tp": 4, "pp": 4}, "iterations": 1},
            "trace": {"enabled": False}}
    step = ["network.ring_model=step", "simulation.symmetry=false"]
    s = run(load_scenario(base, step)).summary
    assert "lockstep_rings" in s["shortcuts_used"] and s["lockstep_ring_transfers"] > 0
    s = run(load_scenario(base, [*step, "simulation.lockstep_rings=false"])).summary
    assert "lockstep_rings" not in s["shortcuts_used"] and s["lockstep_ring_transfers"] == 0
    s = run(load_scenario(base, ["simulation.symmetry=false"])).summary
    assert "lockstep_rings" not in s["shortcuts_used"] and s["lockstep_ring_transfers"] > 0


def test_peak_power_counts_the_networks_constant_power(tiny):
    """The peak power is the largest sum of the devices' board power at any instant (a plain
    sweep over every segment start here, each class's watts times its devices) plus what
    the network draws all the time: every link's idle power and its share of switches, NICs
    and transceivers (catalog ``idle_w + device_w`` per link, both directions, 4 links per
    torus edge)."""
    from twin.build import build
    from twin.catalogs import catalog
    from twin.runner import simulate_untraced
    from twin.summary import summarize

    model = build(tiny(["workload.parallelism.dp=4", "workload.parallelism.pp=2",
                        "workload.global_batch=16", "trace.enabled=false"]))
    env, fabric, ex, _ = simulate_untraced(model)
    s = summarize(model, env, fabric, ex, 0.0)
    segs = [(a.power_segments(), a.n) for a in ex.accelerators]
    peak_dev = max(sum(w * n for seg, n in segs for t0, t1, w, *_ in seg if t0 <= t < t1)
                   for seg, _n in segs for t in seg[:, 0])
    link = catalog("links").get("nvlink4").values
    # a 4 x 2 torus: a ring of 4 along x in each of 2 rows (8 edges), a ring of 2 along y in
    # each of 4 columns (its two edges join the same pair: 8 edges)
    links = (8 + 8) * 4
    network_w = links * (link["idle_w"] + link.get("device_w", 0.0))
    assert s["peak_power_w"] == pytest.approx(peak_dev + network_w, rel=1e-9)


def test_a_clean_run_completes_every_iteration(tiny):
    s = run(tiny(["workload.iterations=2", "trace.enabled=false"])).summary
    assert s["completed"] is True and s["iterations_completed"] == 2


def test_the_shannon_bound_is_per_iteration(tiny):
    """Link bytes and link energy enter the Shannon-Hartley bound per iteration: two
    identical iterations are as far from it as one (the same bytes per iteration)."""
    one, two = (run(tiny([f"workload.iterations={n}", "trace.enabled=false",
                          "power.thermal.enabled=false"])).summary for n in (1, 2))
    a = one["limits_orders_of_magnitude"]["shannon_hartley"]
    b = two["limits_orders_of_magnitude"]["shannon_hartley"]
    assert a is not None and b == pytest.approx(a, abs=0.01)


def test_static_tables_place_ranks_and_rate_links(tiny, tmp_path):
    """The ``ranks`` table puts each rank's device at the coordinates the topology documents
    (torus3d ``[X, Y, Z]``: device d at ``(d % X, d // X % Y, d // (X*Y))``), and the
    ``links`` table's utilization is each link's bytes over its capacity times the makespan
    (a run well under a second)."""
    scen = tiny(["cluster.topology.kind=torus3d", "cluster.topology.shape=[2,2,2]",
                 "trace.tables=[ranks,links]"])
    res = run(scen, tmp_path / "t.h5")
    ranks = read_table(res.trace_path, "ranks")
    d = ranks["device"].to_numpy()
    assert sorted(d) == list(range(8))
    np.testing.assert_array_equal(ranks["x"], d % 2)
    np.testing.assert_array_equal(ranks["y"], d // 2 % 2)
    np.testing.assert_array_equal(ranks["z"], d // 4)
    links = read_table(res.trace_path, "links")
    makespan = res.summary["makespan_s"]
    assert 0 < makespan < 1 and links["bytes"].max() > 0
    np.testing.assert_allclose(links["utilization"],
                               links["bytes"] / (links["capacity"] * makespan), rtol=1e-12)


def test_max_link_utilization_is_the_busiest_links_bytes_over_its_capacity(tmp_path):
    """The summary's ``max_link_utilization``: the most bytes any directed link carried over
    what it could carry in the makespan (its capacity x makespan), from the trace's links
    table. A DP ring on the 4x4 torus loads one direction of its links: between 0 and 1."""
    from twin.cli import main

    out = tmp_path / "q.h5"
    assert main(["run", str(ROOT / "scenarios/quickstart.yaml"), "-o", str(out),
                 "--set", "workload.iterations=1"]) == 0
    links = read_table(out, "links")
    summary = read_attrs(out)["summary"]
    expect = float((links["bytes"] / (links["capacity"] * summary["makespan_s"])).max())
    assert 0.0 < expect < 1.0
    assert summary["max_link_utilization"] == pytest.approx(expect, rel=1e-12)


def test_a_run_that_completes_no_iteration_reports_no_throughput():
    """Corner 0 of the tiny 4x2 torus is cut off for good at time 0: the run stops without an
    iteration, so no FLOP/s and no MFU are reported (not a rate over a partial iteration),
    and a run without the replica quotient reports an orbit of 1."""
    from tests.conftest import scenario_dict
    from twin.scenario import load_scenario

    d = scenario_dict()
    d["faults"] = [{"kind": "link_down", "link": [0, v], "time_s": 0.0} for v in (1, 3, 4)]
    s = run(load_scenario(d)).summary
    assert not s["completed"] and s["iterations_completed"] == 0 and s["makespan_s"] > 0
    assert s["iteration_time_s"] is None
    assert s["tflops_per_device"] == 0.0 and s["mfu"] == 0.0
    assert s["replica_orbit"] == 1 and "replica_quotient" not in s["shortcuts_used"]


def test_compute_rows_name_their_microbatch(tiny):
    """The tiny run: 16 sequences over dp 8 at micro batch 1 is 2 microbatches per rank;
    with 1F1B on one stage each microbatch's forward then backward. Every compute row of an
    iteration belongs to microbatch 0 or 1 (one model chunk, 0), the forward layers of each
    microbatch in order, and both microbatches carry the same kernels; the optimizer step is
    the iteration's, of no microbatch (-1)."""
    res = run(tiny(workload__iterations=2))
    ops = read_table(res.trace_path, "ops")
    comp = ops[(ops.kind == "compute") & (ops.stream == "compute")]
    for it in (0, 1):
        rows = comp[comp.iteration == it]
        assert set(rows[rows.mb < 0].name) == {"optimizer"}
        rows = rows[rows.mb >= 0]
        assert set(rows.mb) == {0, 1} and set(rows.chunk) == {0}
        names = [rows[rows.mb == m].name.tolist() for m in (0, 1)]
        assert names[0] == names[1]
        for m in (0, 1):
            fwd = rows[(rows.mb == m) & rows.name.str.endswith("_fwd") & (rows.layer >= 0)]
            assert fwd.layer.is_monotonic_increasing and fwd.layer.iloc[0] == 0


@pytest.mark.parametrize("streams", [1, 2, 3])
def test_an_iteration_waits_for_every_gradient_streams_all_reduce(tiny, streams):
    """Gradient buckets all-reduce on ``overlap.dp_streams`` concurrent streams beside the
    backward pass: an iteration ends (its optimizer step starts) only after the last bucket's
    all-reduce on every stream has ended, whichever stream finishes first."""
    res = run(tiny(workload__iterations=2, workload__grad_bucket_mb=5,
                   overlap={"dp_streams": streams}))
    ops = read_table(res.trace_path, "ops")
    for it in (0, 1):
        rows = ops[ops.iteration == it]
        dp = rows[(rows.kind == "dp") & (rows.name == "allreduce")]
        assert len(dp) > streams  # several buckets per stream
        opt = rows[rows.name == "optimizer"]
        assert opt.t_start.min() >= dp.t_end.max() - 1e-15
