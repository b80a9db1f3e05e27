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
    assert "utilisation" in v["text"]


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
