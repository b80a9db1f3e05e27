"""``twin report``: the critical-path attribution tiles every iteration (checked on several
scenarios against the summary's iteration times), runs that differ only in how the clock was
reached agree on their compute time (a cap vs the same clock set directly), fault recovery is
the lost work plus downtime the job controller reports, and planted bottlenecks (a power cap,
a slow link, a slow data path) are named."""

from __future__ import annotations

import json

import pytest

from tests.conftest import scenario_dict
from twin.cli import main
from twin.report import build_report
from twin.runner import run
from twin.scenario import load_scenario

JOB = {"checkpoint_interval_iterations": 2, "checkpoint_write_s": 0.01, "restart_s": 0.05}


def _run(tmp_path, name, overrides=(), **updates):
    raw = scenario_dict(**updates)
    raw["name"] = name
    raw.setdefault("trace", {})["path"] = str(tmp_path / f"{name}.h5")
    return run(load_scenario(raw, list(overrides)))


def _compute(rep) -> float:
    return sum(v for k, v in rep["time"]["mean"].items() if k.startswith("compute: "))


CASES = {
    "dp8": [],
    "dp2-tp2-pp2-nosym": ["workload.parallelism.dp=2", "workload.parallelism.tp=2",
                          "workload.parallelism.pp=2", "workload.global_batch=16",
                          "simulation.symmetry=false", "workload.iterations=2"],
    "pp4-interleaved": ["workload.parallelism.dp=2", "workload.parallelism.pp=4",
                        "workload.schedule=interleaved", "workload.virtual_stages=2",
                        "workload.iterations=2"],
    "memory-queue": ["memory.model=queue", "workload.parallelism.dp=4",
                     "workload.parallelism.pp=2"],
    "cap-bubble-downclock": ["power.cap_w=300", "workload.parallelism.dp=4",
                             "workload.parallelism.pp=2", "power.dvfs.bubble_downclock=true"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attribution_adds_up_to_every_iteration(tmp_path, case):
    res = _run(tmp_path, case, CASES[case])
    rep = build_report(res.trace_path)
    its = rep["time"]["iterations"]
    assert len(its) == res.summary["iterations"]
    for it, t in zip(its, res.iteration_times_s, strict=True):
        assert it["time_s"] == pytest.approx(t, rel=1e-9)          # the summary's windows
        named = sum(v for k, v in it["categories"].items() if k != "unattributed")
        assert named == pytest.approx(t, rel=0.01)
        assert sum(it["categories"].values()) == pytest.approx(t, rel=1e-9)


def test_fault_recovery_is_lost_work_plus_downtime(tmp_path):
    cool = {"thermal": {"enabled": False}}
    t_it = _run(tmp_path, "one", power=cool).summary["iteration_time_s"]
    seg = 2 * t_it + JOB["checkpoint_write_s"]  # a checkpoint commits after 2 iterations
    res = _run(tmp_path, "fail", [], faults=[{"kind": "accelerator_failure", "device": 5,
                                              "time_s": 1.6 * seg}],
               job=JOB, workload__iterations=6, power=cool)
    s = res.summary
    assert s["restarts"] == 1 and s["lost_work_s"] == pytest.approx(0.6 * seg, rel=1e-6)
    rep = build_report(res.trace_path)
    rec = sum(it["categories"].get("fault recovery", 0.0) for it in rep["time"]["iterations"])
    # the window of the first redone iteration starts at the last kept iteration's end, so it
    # holds the lost work, the downtime and the checkpoint write that followed that iteration
    assert rec == pytest.approx(s["lost_work_s"] + s["downtime_s"] + JOB["checkpoint_write_s"],
                                rel=0.01)
    for it, t in zip(rep["time"]["iterations"], res.iteration_times_s, strict=True):
        assert sum(v for k, v in it["categories"].items() if k != "unattributed") \
            == pytest.approx(t, rel=0.01)


def test_power_cap_is_named_and_its_throttling_is_the_clock_difference(tmp_path):
    """Planted: a 300 W cap. Its compute time equals the uncapped run's, and compute plus
    cap throttling equals a run at the capped clock set directly."""
    big = ["workload.seq_len=2048", "workload.micro_batch=2", "workload.global_batch=32"]
    capped = _run(tmp_path, "cap", [*big, "power.cap_w=300"])
    clock = capped.summary["avg_compute_frequency_mhz"]
    top = _run(tmp_path, "top", big)
    fixed = _run(tmp_path, "fixed", [*big, f"power.dvfs.frequency_mhz={clock:.0f}"])
    rc, rt, rf = (build_report(r.trace_path) for r in (capped, top, fixed))
    assert rc["verdict"]["layer"] == "power wall"
    assert "power wall" in rc["verdict"]["text"] and "300 W cap" in rc["verdict"]["text"]
    assert _compute(rc) == pytest.approx(_compute(rt), rel=1e-9)
    assert _compute(rc) + rc["time"]["mean"]["power-cap throttling"] == pytest.approx(
        _compute(rf), rel=1e-9)
    assert "power-cap throttling" not in rf["time"]["mean"]
    assert rt["verdict"]["layer"] != "power wall"


def test_slow_link_is_named_interconnect(tmp_path):
    """Planted: links at 1/10 of their bandwidth; the evidence names the exposed share and
    the link utilisation."""
    res = _run(tmp_path, "slow", ["cluster.link.bandwidth_gbps=2.5"])
    rep = build_report(res.trace_path)
    v = rep["verdict"]
    assert v["layer"] == "interconnect"
    share = rep["time"]["fractions"]["exposed DP communication"]
    assert f"{100 * share:.0f}% of the iteration is exposed communication" in v["text"]
    assert f"(DP {100 * share:.0f}%) on links at" in v["text"]  # only the kinds it has
    from twin.reading import TraceData

    links = TraceData(res.trace_path, need=("links",)).table("links")
    top = links.loc[links["busy_s"].idxmax()]
    busy = top["busy_s"] / res.summary["makespan_s"]
    assert f"on links at {100 * busy:.0f}% utilisation (busiest link " in v["text"]
    assert f"{int(top['src'])}->{int(top['dst'])} busy {100 * busy:.0f}% of the run" in v["text"]
    assert res.summary["mfu"] < 0.30
    assert any(a.startswith("MFU ") for a in v["alerts"])


#: long sequences and micro batches of 4 of a 1B model on eight data-parallel devices
DENSE = ["workload.seq_len=2048", "workload.micro_batch=4", "workload.global_batch=64"]


def test_hbm_bound_kernels_are_named_memory_bandwidth_without_an_mfu_alert(tmp_path):
    """Long sequences and micro batches of 4 of a 1B model on eight data-parallel devices:
    MFU above 50%, so the MFU alert (below 30%) stays silent, and the largest layer is the
    time its memory-bound kernels (norms, element-wise, the optimizer) spend beyond their
    math roof: the verdict names memory bandwidth with that share and no contention."""
    res = _run(tmp_path, "dense", DENSE)
    rep = build_report(res.trace_path)
    v, t = rep["verdict"], rep["time"]
    assert res.summary["mfu"] > 0.5
    assert not any(a.startswith("MFU ") for a in v["alerts"])
    # the scenario's own MFU floor, not the brief's default 30%
    strict = _run(tmp_path, "dense-strict", [*DENSE, "power.alerts.mfu_threshold=0.9"])
    alerts = build_report(strict.trace_path)["verdict"]["alerts"]
    assert f"MFU {strict.summary['mfu']:.1%} < 90%: check data loading" in " ".join(alerts)
    assert v["layer"] == "memory bandwidth"
    share = t["hbm_bound_s"] / t["iteration_time_s"]
    assert v["layer_shares"]["memory bandwidth"] == pytest.approx(share, rel=1e-12)
    assert (f"{100 * share:.0f}% of the iteration is compute waiting on HBM "
            f"({100 * share:.0f}% beyond the math roof, 0% contention") in v["text"]


def test_pipeline_bubble_is_named_scheduling(tmp_path):
    """Planted: 8 pipeline stages over 2 microbatches (1F1B: a bubble of (p - 1) / (m + p - 1)
    = 7/9 of the ideal iteration); the verdict names scheduling with the summary's bubble
    fraction. The model's embeddings are untied here: tied, the first and last stage also
    all-reduce the 525 MB embedding gradient (15% of this iteration, interconnect)."""
    res = _run(tmp_path, "bubble", ["workload.parallelism.dp=1", "workload.parallelism.pp=8",
                                    "workload.global_batch=2",
                                    "workload.model.tied_embeddings=false"])
    rep = build_report(res.trace_path)
    v = rep["verdict"]
    assert v["layer"] == "scheduling"
    assert f"(bubble fraction {res.summary['bubble_fraction']:.3f})" in v["text"]
    assert v["layer_shares"]["scheduling"] > 0.5


def test_layer_times_group_the_attribution_categories():
    """The verdict's layers from a hand-made attribution: each category to its layer of the
    second brief's checklist, the HBM-bound time to memory bandwidth, compute and
    unattributed time to none, an unknown wait kind to scheduling."""
    from twin.report.verdict import layer_times

    mean = {"compute: MLP": 5.0, "unattributed": 0.5, "power-cap throttling": 0.1,
            "thermal throttling": 0.2, "DVFS stalls": 0.4, "memory contention": 0.8,
            "exposed TP communication": 1.6, "exposed DP communication": 3.2,
            "exposed pipeline communication": 6.4, "data wait": 12.8, "pipeline bubble": 25.6,
            "some new wait": 51.2, "fault recovery": 102.4, "checkpointing": 204.8,
            "straggler": 409.6}
    got = layer_times({"mean": mean, "hbm_bound_s": 0.03})
    assert got == pytest.approx({"power wall": 0.7, "memory bandwidth": 0.83,
                                 "interconnect": 11.2, "data loading": 12.8,
                                 "scheduling": 76.8, "reliability": 716.8}, rel=1e-12)


def test_slow_data_path_is_named_data_loading(tmp_path):
    """Planted: two preprocessing workers at 400 ms per sample cannot keep up with the GPUs;
    the verdict names the data-loading layer with the share of the iteration spent waiting,
    and the attributed wait is the `data_wait` ops' own time."""
    res = _run(tmp_path, "starved", ["data.enabled=true", "data.host=dgx-h100",
                                     "data.workers=2", "data.preprocess_ms_per_sample=400",
                                     "workload.iterations=3"])
    rep = build_report(res.trace_path)
    v = rep["verdict"]
    assert v["layer"] == "data loading"
    share = rep["time"]["fractions"]["data wait"]
    assert f"{100 * share:.0f}% of the iteration waits for input data" in v["text"]
    # with symmetry every rank waits alike, so the critical path's share is the device average
    assert share == pytest.approx(res.summary["data_wait_fraction"], rel=0.01)
    assert share > 0.5


def test_report_cli_html_json_and_run_report(tmp_path, capsys):
    res = _run(tmp_path, "cli", ["workload.parallelism.dp=4", "workload.parallelism.pp=2"])
    html = tmp_path / "r.html"
    assert main(["report", str(res.trace_path), "-o", str(html)]) == 0
    out = capsys.readouterr().out
    assert "verdict:" in out and "time per iteration" in out
    text = html.read_text()
    assert text.count("data:image/png;base64,") >= 3 and "Verdict" in text
    # every section the trace has tables for: the 4x2 torus's heatmaps, power over time, the
    # timeline, and the energy by position (one position, "all")
    for title in ("Timeline excerpt", "Per-device heatmaps", "Power and temperature"):
        assert f"<h2>{title}</h2><img" in text, title
    assert "<th>network share</th>" in text and "<td>all</td>" in text
    assert main(["report", str(res.trace_path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert {"time", "energy", "verdict"} <= set(rep)
    assert set(rep["energy"]["by_position"]) == {"all"}
    scen = tmp_path / "s.yaml"
    import yaml

    scen.write_text(yaml.safe_dump(scenario_dict()))
    assert main(["run", str(scen), "-o", str(tmp_path / "run.h5"),
                 "--report", str(tmp_path / "run.html")]) == 0
    assert (tmp_path / "run.html").is_file() and "verdict:" in capsys.readouterr().out


def test_report_errors_are_clear(tmp_path, capsys):
    res = _run(tmp_path, "nopower", [], trace={"tables": ["ops", "ranks"]})
    assert main(["report", str(res.trace_path)]) == 2
    assert "lacks table(s) power" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "none.h5")]) == 2


def test_sweep_names_the_next_best_point(tmp_path):
    import pandas as pd

    res = _run(tmp_path, "sw")
    t = res.summary["iteration_time_s"]
    e = res.summary["energy_per_iteration_j"]
    pd.DataFrame({"label": ["this", "faster", "fastest-but-invalid", "slower"],
                  "strategy": ["8-1-1", "4-2-1", "2-4-1", "1-8-1"],
                  "status": ["ok", "ok", "invalid", "ok"],
                  "iteration_time_s": [t, t / 2, t / 4, 2 * t],
                  "energy_per_iteration_j": [e, 1.5 * e, e, e]}).to_csv(
        tmp_path / "points.csv", index=False)
    v = build_report(res.trace_path, sweep=tmp_path)["verdict"]
    assert v["next_best"]["label"] == "faster"
    assert v["next_best"]["speedup"] == pytest.approx(2.0)
    assert "faster runs an iteration" in v["what_would_move_it"] and "1.50x the energy" in \
        v["what_would_move_it"]
    assert main(["report", str(res.trace_path), "--sweep", str(tmp_path / "none")]) == 2
    # this run the fastest feasible point: the next best is the slower one, not itself
    pd.DataFrame({"label": ["this", "slower"], "strategy": ["8-1-1", "1-8-1"],
                  "status": ["ok", "ok"], "iteration_time_s": [t, 2 * t],
                  "energy_per_iteration_j": [e, e]}).to_csv(tmp_path / "own.csv", index=False)
    nb = build_report(res.trace_path, sweep=tmp_path / "own.csv")["verdict"]["next_best"]
    assert nb["label"] == "slower" and nb["speedup"] == pytest.approx(0.5)
    for drop in ("status", "iteration_time_s"):  # a CSV that is not a points.csv
        bad = tmp_path / f"no-{drop}.csv"
        pd.read_csv(tmp_path / "points.csv").drop(columns=drop).to_csv(bad, index=False)
        assert main(["report", str(res.trace_path), "--sweep", str(bad)]) == 2
    # times that are not numbers: refused by column, not a traceback from the sort
    words = pd.read_csv(tmp_path / "points.csv").astype({"iteration_time_s": str})
    words.loc[1, "iteration_time_s"] = "fast"
    words.to_csv(tmp_path / "words.csv", index=False)
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["report", str(res.trace_path), "--sweep", str(tmp_path / "words.csv")])
    assert code == 2 and "iteration_time_s" in err.getvalue()


def _compute_op_seconds(res, rep) -> float:
    """Seconds the critical class of each iteration spent in compute blocks inside its
    window, read from the trace's ops table (not through the attribution)."""
    from twin.reading import TraceData

    ops = TraceData(res.trace_path).table("ops")
    total = 0.0
    for it in rep["time"]["iterations"]:
        c = ops[(ops["cls"] == it["critical_class"]) & (ops["kind"] == "compute")
                & (ops["t_end"] > it["start_s"]) & (ops["t_start"] < it["end_s"])]
        total += float((c["t_end"].clip(upper=it["end_s"])
                        - c["t_start"].clip(lower=it["start_s"])).sum())
    return total / len(rep["time"]["iterations"])


SLOW_CATEGORIES = ("power-cap throttling", "thermal throttling", "memory contention",
                   "straggler")
STRAGGLER = {"kind": "straggler", "device": 0, "factor": 1.5, "time_s": 0.0,
             "duration_s": 1e3}
HOT = ["power.thermal.ambient_c=50", "power.thermal.initial_c=95",
       "power.thermal.throttle_interval_s=0.005", "cluster.device.thermal_c_j_per_k=12"]
#: a die too hot to throttle draws more than the board's limit (the device's tdp_w, the
#: firmware default): its blocks are stretched to it
HOT_UNTHROTTLED = [*HOT, "power.thermal.throttle=false"]
#: name -> (overrides, extra scenario keys, the plain run's overrides, the slow-down
#: categories the planted run must name)
PLANTED = {
    "memory": (["memory.model=queue"], {}, [], {"memory contention"}),
    "cap+memory": (["memory.model=queue", "power.cap_w=300"], {}, [],
                   {"memory contention", "power-cap throttling"}),
    "straggler": ([], {"faults": [STRAGGLER]}, [], {"straggler"}),
    "straggler+memory": (["memory.model=queue"], {"faults": [STRAGGLER]}, [],
                         {"memory contention"}),  # the memory model takes the whole rest
    "thermal": (HOT, {}, HOT_UNTHROTTLED, {"thermal throttling"}),
    "stretch+memory": ([*HOT_UNTHROTTLED, "memory.model=queue"], {}, HOT_UNTHROTTLED,
                       {"memory contention", "power-cap throttling"}),
    "manager": (["power.manager.budget_w=2000"], {}, [], {"power-cap throttling"}),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_slowed_compute_keeps_its_nominal_time_and_names_the_rest(tmp_path, case):
    """Planted slow-downs of the compute blocks (memory contention, a power cap beside it, a
    straggler at 1.5x for the whole run, a hot die that throttles or is held at the board's
    power limit, a cluster power budget): the attributed compute time is the plain run's
    (nominal blocks at the policy clock; one pipeline stage, so the critical class runs the
    same blocks), and the slow-down categories grow by the time the critical class's compute
    blocks took beyond the plain run's, read from the two traces' ops tables. Categories not
    planted stay at zero."""
    overrides, extra, plain_overrides, named = PLANTED[case]
    base = ["workload.iterations=2"]
    plain = _run(tmp_path, "plain", base + plain_overrides)
    slow = _run(tmp_path, case.replace("+", "-"), base + overrides, **extra)
    rp, rs = build_report(plain.trace_path), build_report(slow.trace_path)
    assert _compute(rs) == pytest.approx(_compute(rp), rel=1e-9)
    mean = rs["time"]["mean"]
    extra_s = _compute_op_seconds(slow, rs) - _compute_op_seconds(plain, rp)
    assert extra_s > 0
    slow_s = [sum(r["time"]["mean"].get(k, 0.0) for k in SLOW_CATEGORIES) for r in (rs, rp)]
    assert slow_s[0] - slow_s[1] == pytest.approx(extra_s, rel=1e-6)
    assert {k for k in SLOW_CATEGORIES if mean.get(k, 0.0) > 0} == named


def test_hbm_bound_time_is_what_infinitely_fast_memory_would_save(tmp_path):
    """``hbm_bound_s`` (compute time beyond the math roof) against a second run whose HBM is
    10^6 times faster: its compute blocks are their math alone, so the attributed compute
    time drops by the first run's HBM-bound time (to the 1e-6 the fast memory leaves)."""
    from twin.catalogs import catalog

    base = ["workload.iterations=2", "power.thermal.enabled=false"]
    bw = catalog("devices").get(scenario_dict()["cluster"]["device"]).values[
        "hbm_bandwidth_gbps"]
    slow = build_report(_run(tmp_path, "hbm", base).trace_path)
    fast = build_report(_run(tmp_path, "hbm-fast", [*base,
                             f"cluster.device.hbm_bandwidth_gbps={bw * 1e6}"]).trace_path)
    bound = slow["time"]["hbm_bound_s"]
    assert 0 < bound < _compute(slow)
    assert _compute(slow) - _compute(fast) == pytest.approx(bound, rel=1e-5)
    assert fast["time"]["hbm_bound_s"] == pytest.approx(0.0, abs=1e-6 * bound)


def test_energy_per_iteration_by_component_and_position_add_up(tmp_path):
    """Over two iterations, the energy attribution per iteration sums to the summary's energy
    per iteration, by component and by position class."""
    res = _run(tmp_path, "energy", ["workload.iterations=2", "simulation.symmetry=false"])
    e = build_report(res.trace_path)["energy"]
    per_it = res.summary["energy_per_iteration_j"]
    assert sum(e["by_component_j_per_iteration"].values()) == pytest.approx(per_it, rel=1e-9)
    assert sum(e["by_component_share"].values()) == pytest.approx(1.0, rel=1e-12)
    pos = e["by_position"].values()
    assert sum(p["energy_j_per_iteration"] for p in pos) == pytest.approx(per_it, rel=1e-9)
    assert sum(p["devices"] for p in pos) == res.summary["devices"]


def test_energy_of_a_one_iteration_run_and_each_positions_network_share(tmp_path):
    """One iteration: the per-iteration energy is the run's. Each position class's network
    share is its devices' network energy over their energy, from the devices table by hand."""
    from twin.trace import read_table

    res = _run(tmp_path, "one", ["workload.iterations=1", "simulation.symmetry=false"])
    e = build_report(res.trace_path)["energy"]
    total = sum(res.summary["energy_breakdown_j"].values())
    assert sum(e["by_component_j_per_iteration"].values()) == pytest.approx(total, rel=1e-9)
    dev = read_table(res.trace_path, "devices")
    for pos, x in dev.groupby("position"):
        got = e["by_position"][str(pos)]
        assert 0 < got["network_share"] < 1
        assert got["network_share"] == pytest.approx(
            sum(x["network_j"]) / sum(x["energy_j"]), rel=1e-12)
        assert got["mean_device_j_per_iteration"] == pytest.approx(
            sum(x["energy_j"]) / len(x), rel=1e-12)


def test_resources_near_their_limit_are_flagged(tmp_path):
    """The brief's early signals: a die too hot to throttle is held at the board's limit
    (the device's tdp_w here): its power is flagged at 100% of that limit; links at 1 Gb/s
    stay busy nearly all the run and the busiest is flagged. A dense run on cool dies and
    fast links raises neither."""
    hot = _run(tmp_path, "hot", ["workload.iterations=2", *HOT_UNTHROTTLED,
                                 "cluster.link.bandwidth_gbps=1"])
    rep = build_report(hot.trace_path)
    limit = rep["time"]["board_limit_w"]
    assert limit == load_scenario(scenario_dict()).cluster.device.tdp_w
    alerts = " | ".join(rep["verdict"]["alerts"])
    assert f"board power up to {limit:.0f} W, 100% of its {limit:.0f} W limit" in alerts
    util = hot.summary["max_link_utilization"]
    assert util >= 0.95
    assert f"the busiest link carries {util:.0%} of its capacity over the run" in alerts
    dense = _run(tmp_path, "cool", [*DENSE, "power.thermal.enabled=false"])
    assert not [a for a in build_report(dense.trace_path)["verdict"]["alerts"]
                if "limit" in a]


def test_the_attribution_plot_stacks_each_iterations_categories_in_order():
    """Bar i, segment k: starts where the iteration's earlier categories end and is as wide
    as the category's seconds in that iteration (0 where it has none)."""
    from twin.report.html import attribution_figure

    its = [{"iteration": 0, "categories": {"compute": 2.0, "idle": 0.5}},
           {"iteration": 1, "categories": {"compute": 1.5, "interconnect": 0.25}}]
    rep = {"time": {"iterations": its, "mean": {"compute": 1.75, "idle": 0.25,
                                                 "interconnect": 0.125}}}
    ax = attribution_figure(rep).axes[0]
    bars = [[(r.get_x(), r.get_width()) for r in c.patches] for c in ax.containers]
    assert bars == [[(0.0, 2.0), (0.0, 1.5)],       # compute
                    [(2.0, 0.5), (1.5, 0.0)],       # idle
                    [(2.5, 0.0), (1.5, 0.25)]]      # interconnect
    assert [t.get_text() for t in ax.get_yticklabels()] == ["iteration 0", "iteration 1"]


@pytest.mark.parametrize("damage", ["no rows", "no time"])
def test_a_trace_whose_ops_hold_no_timed_compute_is_refused(tmp_path, capsys, damage):
    """A run always records compute ops that take time. A trace whose ops table was emptied
    (every column cut to no rows: a zip of the iteration starts and ends failed with a
    traceback) or whose ops all start and end at 0 (every layer's share was 0 / 0) has no
    iteration to attribute: a clear error, exit 2."""
    import shutil

    import h5py

    from twin.kernel.errors import ScenarioError

    res = _run(tmp_path, "cut")
    bad = tmp_path / "bad.h5"
    shutil.copy(res.trace_path, bad)
    with h5py.File(bad, "a") as f:
        for col, data in f["ops"].items():
            if damage == "no rows":
                data.resize((0,))
            elif col in ("t_start", "t_end"):
                data[...] = 0.0
    with pytest.raises(ScenarioError, match="no compute op that takes time"):
        build_report(bad)
    assert main(["report", str(bad)]) == 2
    assert "no iteration to attribute" in capsys.readouterr().err
    assert main(["report", str(res.trace_path)]) == 0  # the undamaged trace


def test_the_near_power_alert_starts_at_90_percent_of_the_limit():
    """Board power exactly 90% of the limit is near it (the comparison allows rounding of
    the product); 0.1 W below it is not."""
    import pandas as pd

    from twin.report.verdict import _alerts

    class _Trace:  # the parts of a TraceData the alerts read
        summary = {"mfu": 0.5, "max_link_utilization": 0.1}
        scenario: dict = {}

        def __init__(self, peak):
            self.peak = peak

        def table(self, name):
            assert name == "power"
            return pd.DataFrame({"watts": [100.0, self.peak]})

    for limit in (700.0, 400.0, 1000.0, 333.0):
        edge = 0.9 * limit
        near = _alerts(_Trace(edge), {"board_limit_w": limit})
        assert any("board power up to" in a for a in near)
        assert not any("board power" in a
                       for a in _alerts(_Trace(edge - 0.1), {"board_limit_w": limit}))


def test_energy_of_a_summary_that_names_no_iteration_count_is_the_runs():
    """A summary without ``iterations`` / ``iterations_completed`` (a hand-edited trace) is
    taken as one iteration; shares by hand; no devices table, no position classes."""
    from types import SimpleNamespace

    import pandas as pd

    from twin.report.attribution import energy_attribution

    td = SimpleNamespace(summary={"energy_breakdown_j": {"compute_j": 6.0, "network_j": 2.0}},
                         table=lambda name: pd.DataFrame())
    e = energy_attribution(td)
    assert e == {"by_component_j_per_iteration": {"compute_j": 6.0, "network_j": 2.0},
                 "by_component_share": {"compute_j": 0.75, "network_j": 0.25}}


def test_heatmap_grids_place_each_device_per_iteration_on_its_coordinates(tmp_path):
    """Over two iterations on a 4x4 mesh each grid cell ``[y, x]`` holds that device's
    energy / 2 (J), its forwarded bytes / 2 in GB and its max temperature, from the devices
    table by hand."""
    from twin.reading import TraceData
    from twin.report.html import heatmap_grids
    from twin.trace import read_table

    res = _run(tmp_path, "grid", [
        "cluster.topology.kind=mesh2d", "cluster.topology.shape=[4,4]",
        "workload.parallelism.dp=16", "workload.global_batch=16", "workload.micro_batch=1",
        "network.dp_algorithm=torus2d", "workload.iterations=2", "simulation.symmetry=false"])
    dev = read_table(res.trace_path, "devices")
    assert (dev["forwarded_bytes"] > 0).any()  # the mesh's interior forwards
    grids = dict(heatmap_grids(TraceData(res.trace_path, need=("devices",))))
    assert list(grids) == ["energy per iteration (J)", "forwarded GB per iteration",
                           "max die temperature (C)"]
    assert grids["energy per iteration (J)"].shape == (4, 4)
    for r in dev.itertuples(index=False):
        assert grids["energy per iteration (J)"][r.y, r.x] == pytest.approx(r.energy_j / 2)
        assert grids["forwarded GB per iteration"][r.y, r.x] == pytest.approx(
            r.forwarded_bytes / 2e9)
        assert grids["max die temperature (C)"][r.y, r.x] == r.max_temp_c


@pytest.mark.parametrize("xyz", [
    [(0, 0, 0), (1, 0, 0), (0, 1, 0)],             # a 2x2 grid one device short
    [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 1)],  # four devices, one on a second layer
])
def test_devices_that_do_not_fill_one_flat_grid_get_no_heatmaps(xyz):
    from types import SimpleNamespace

    import pandas as pd

    from twin.report.html import heatmap_grids, heatmaps

    dev = pd.DataFrame(xyz, columns=["x", "y", "z"]).assign(
        energy_j=1.0, forwarded_bytes=0.0, max_temp_c=40.0)
    td = SimpleNamespace(table=lambda name: dev, summary={"iterations": 1})
    assert heatmap_grids(td) is None and heatmaps(td) is None


def test_the_html_lists_the_alerts_and_the_layer_shares(tmp_path):
    """A hot run with slow links raises alerts: each is an item of one list in the page;
    the layer shares of the verdict are a table under their heading, one row each."""
    import html

    from twin.reading import TraceData
    from twin.report import REPORT_TABLES
    from twin.report.html import render

    res = _run(tmp_path, "alerts", ["workload.iterations=2", *HOT_UNTHROTTLED,
                                     "cluster.link.bandwidth_gbps=1"])
    rep = build_report(res.trace_path)
    alerts, shares = rep["verdict"]["alerts"], rep["verdict"]["layer_shares"]
    assert alerts and shares
    page = render(rep, TraceData(res.trace_path, need=REPORT_TABLES))
    items = "".join(f"<li>{html.escape(a)}</li>" for a in alerts)
    assert f"<ul>{items}</ul>" in page
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{x:.2%}</td></tr>"
                   for k, x in shares.items())
    assert f"<h2>Layers</h2><table><tr><th>layer</th><th>share</th></tr>{rows}</table>" in page


@pytest.mark.parametrize("bubble_s, layer", [(0.07, "scheduling"), (0.04, "compute")])
def test_the_verdict_names_a_layer_from_5_percent_of_the_iteration(bubble_s, layer):
    """The default ``min_share``, 5%: a pipeline bubble of 7% of a 1 s iteration is named
    (scheduling); one of 4% leaves the run compute-bound."""
    from types import SimpleNamespace

    import pandas as pd

    from twin.report.attribution import BUBBLE
    from twin.report.verdict import verdict

    attr = {"iteration_time_s": 1.0, "mean": {"compute: mlp": 1 - bubble_s, BUBBLE: bubble_s},
            "fractions": {"compute: mlp": 1 - bubble_s, BUBBLE: bubble_s},
            "board_limit_w": 700.0}
    td = SimpleNamespace(summary={"bubble_fraction": bubble_s}, scenario={},
                         table=lambda name: pd.DataFrame())
    v = verdict(attr, td)
    assert v["min_share"] == 0.05 and v["layer"] == layer
