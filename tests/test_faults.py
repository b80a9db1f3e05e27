"""Fault injection against theory: alpha-beta with counted link sharing for detours, exact
retransmission times, renewal theory for lost work, conservation of bytes and energy."""

from __future__ import annotations

import copy
import math
import typing
from collections import Counter

import numpy as np
import pytest
import simpy
import yaml

from tests.conftest import ROOT, scenario_dict
from twin.kernel.errors import ScenarioError
from twin.runner import run
from twin.scenario import load_scenario
from twin.trace import read_table

# ----------------------------------------------------------------------------- helpers


def _scen(tmp_path=None, faults=(), trace=False, job=None, **updates):
    d = scenario_dict(**updates)
    d["faults"] = list(faults)
    if job is not None:
        d["job"] = job
    d["trace"] = ({"path": str(tmp_path / f"t{abs(hash(str(faults))) % 10**8}.h5")}
                  if trace else {"enabled": False})
    return d


def _run(d, overrides=None):
    return run(load_scenario(d, overrides or []))


def _paths(d):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(d)
    return [p.path for p in exc.value.problems]


JOB = {"checkpoint_interval_iterations": 2, "checkpoint_write_s": 0.01, "restart_s": 0.05}


# ----------------------------------------------------------------------------- schema
def test_scenario_library_fault_entries_round_trip():
    for path in sorted((ROOT / "scenarios").glob("fault_*.yaml")):
        s = load_scenario(path)
        again = s.replace({})
        assert again.faults == s.faults, path.name


@pytest.mark.parametrize("fault, path", [
    ({"kind": "straggler", "device": 1, "time_s": 0.1, "factor": -2}, "faults.0.factor"),
    ({"kind": "straggler", "device": 1, "factor": 2,
      "ttf": {"dist": "exponential", "mean_s": -1}}, "faults.0.ttf.mean_s"),
    ({"kind": "straggler", "device": 1, "factor": 2, "time_s": 1,
      "ttf": {"dist": "fixed", "value_s": 1}}, "faults.0"),
    ({"kind": "straggler", "factor": 2, "time_s": 1}, "faults.0"),
    ({"kind": "meteor", "time_s": 1}, "faults.0"),
    ({"kind": "straggler", "device": 99, "factor": 2, "time_s": 1}, "faults.0.device"),
    ({"kind": "nic_failure", "device": 1, "time_s": 1}, "faults.0.device"),
    ({"kind": "link_failure", "links": [[0, 1], [0, 5]], "time_s": 1}, "faults.0.links.1"),
    ({"kind": "link_failure", "link": [0, 1], "ttf": {"dist": "exponential",
                                                      "catalog": "nope"}}, "faults.0.ttf"),
    ({"kind": "hbm_degradation", "device": 1, "time_s": 0,
      "tail": {"name": "pareto", "alpha": 0.5, "mean": 2}}, "faults.0.tail"),
    ({"kind": "accelerator_failure", "device": 1, "time_s": 1, "duration_s": 2}, "faults.0"),
    # Gamma(1 + 1/k) overflows a float below k = 1/170: an error, not an OverflowError
    ({"kind": "link_failure", "link": [0, 1], "ttf": {"dist": "weibull", "shape": 1e-300,
                                                      "catalog": "link-brief"}}, "faults.0.ttf"),
    ({"kind": "link_failure", "link": [0, 1], "ttf": {"dist": "weibull", "shape": 0.005,
                                                      "scale_s": 10}}, "faults.0.ttf.shape"),
    # sigma^2 = log(1 + cov^2) overflows near cov 1e154: every draw was NaN
    ({"kind": "link_failure", "link": [0, 1], "duration_s": 0.1,
      "ttf": {"dist": "lognormal", "mean_s": 1, "cov": 1e300}}, "faults.0.ttf.cov"),
    ({"kind": "straggler", "device": 1, "factor": 2, "time_s": 0,
      "ttr": {"dist": "lognormal", "mean_s": 1, "cov": 2e3}}, "faults.0.ttr.cov"),
    # a tiny acceleration makes the catalog mean infinite: named as acceleration, not mean_s
    ({"kind": "link_failure", "link": [0, 1], "duration_s": 0.1,
      "ttf": {"dist": "exponential", "catalog": "link-brief", "acceleration": 1e-300}},
     "faults.0.ttf"),
    # a slowdown beyond 1e3 runs the simulated time (and its idle segments) away
    ({"kind": "straggler", "device": 1, "time_s": 0.1, "duration_s": 0.3, "factor": 1e9},
     "faults.0.factor"),
    ({"kind": "hbm_degradation", "device": 1, "time_s": 0, "factor": 1e4}, "faults.0.factor"),
    ({"kind": "hbm_degradation", "device": 1, "time_s": 0, "factor": 10,
      "tail": {"name": "deterministic", "mean": 200}}, "faults.0.tail"),
])
def test_fault_errors_name_the_field(fault, path):
    assert _paths(_scen(faults=[fault])) == [path]


def test_catalog_acceleration_that_overflows_the_mean_is_named():
    ttf = {"dist": "weibull", "shape": 1.5, "catalog": "link-brief", "acceleration": 1e-300}
    with pytest.raises(ScenarioError) as exc:
        load_scenario(_scen(faults=[{"kind": "link_failure", "link": [0, 1], "ttf": ttf}]))
    (problem,) = exc.value.problems
    assert problem.path == "faults.0.ttf" and "acceleration must be >=" in str(problem)
    assert "1e-300" in str(problem)


def test_an_acceleration_without_a_catalog_entry_is_refused_not_ignored():
    """``acceleration`` multiplies a catalog entry's rate. Beside a time given directly it
    was accepted and ignored (a straggler's ``ttf: {mean_s: 2, acceleration: 2}`` ran as
    ``mean_s: 2``); now it is an error naming the field to give instead. 1 stays allowed."""
    for ttf, field in (({"dist": "exponential", "mean_s": 2.0, "acceleration": 2}, "mean_s"),
                       ({"dist": "weibull", "shape": 0.7, "scale_s": 2.0,
                         "acceleration": "1e3"}, "scale_s")):
        with pytest.raises(ScenarioError) as exc:
            load_scenario(_scen(faults=[{"kind": "link_failure", "link": [0, 1], "ttf": ttf}]))
        (problem,) = exc.value.problems
        assert problem.path == "faults.0.ttf"
        assert f"without catalog it would be ignored: give the accelerated {field}" in str(
            problem)
    load_scenario(_scen(faults=[{"kind": "link_failure", "link": [0, 1], "ttf": {
        "dist": "exponential", "mean_s": 2.0, "acceleration": 1}}]))


def test_an_acceleration_or_shape_that_yaml_reads_as_text_is_read_as_a_number():
    """YAML 1.1 reads ``1e3`` as text; the schema reads such text as the number everywhere,
    and the catalog's rate conversion now does too (it refused ``acceleration: 1e3``)."""
    from scenarios.faults import Weibull

    w = Weibull.model_validate({"dist": "weibull", "shape": "7e-1", "catalog": "link-brief",
                                "acceleration": "1e3"})
    x = Weibull.model_validate({"dist": "weibull", "shape": 0.7, "catalog": "link-brief",
                                "acceleration": 1000.0})
    assert (w.shape, w.scale_s) == (x.shape, x.scale_s)
    for bad in (True, "nan", "x", -1):
        with pytest.raises(ValueError, match="acceleration must be a number > 0"):
            Weibull.model_validate({"dist": "weibull", "shape": 0.7, "catalog": "link-brief",
                                    "acceleration": bad})


def test_unknown_kind_and_catalog_name_list_what_is_allowed():
    with pytest.raises(ScenarioError) as exc:
        load_scenario(_scen(faults=[{"kind": "meteor"}]))
    assert "straggler" in str(exc.value) and "accelerator_failure" in str(exc.value)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(_scen(faults=[{"kind": "link_failure", "link": [0, 1],
                                     "ttf": {"dist": "exponential", "catalog": "nope"}}]))
    assert "llama3-gpu" in str(exc.value) and "link-brief" in str(exc.value)


def test_failure_without_checkpoints_restarts_from_the_start():
    """No job section: no checkpoint to fall back on, so the work of every iteration done
    before the failure is lost and the job runs them again."""
    clean = _run(_scen(workload__iterations=4)).summary
    t_f = clean["makespan_s"] * 0.6
    s = _run(_scen(faults=[{"kind": "accelerator_failure", "device": 2, "time_s": t_f}],
                   workload__iterations=4)).summary
    assert s["restarts"] == 1 and s["checkpoints"] == 0
    assert s["lost_work_s"] == pytest.approx(t_f, rel=1e-9)
    assert s["makespan_s"] == pytest.approx(clean["makespan_s"] + t_f, rel=1e-9)


def test_checkpoint_policy_is_the_job_section_not_a_fault():
    bad = {"kind": "checkpoint", "interval_iterations": 2}
    with pytest.raises(ScenarioError) as exc:
        load_scenario(_scen(faults=[bad]))
    assert exc.value.problems[0].path.startswith("faults.0")
    assert _paths(_scen(job={**JOB, "checkpoint_write_s": -1})) == ["job.checkpoint_write_s"]
    assert _paths(_scen(job={**JOB, "interval": 3})) == ["job.interval"]


def test_cooling_failure_needs_the_thermal_model():
    cool = {"kind": "cooling_failure", "device": 0, "rise_k": 10, "time_s": 0}
    assert _paths(_scen(faults=[cool], power={"thermal": {"enabled": False}})) == [
        "faults.0.kind"]


def test_catalog_rates_follow_the_published_counts():
    """mean time to failure = 3600 / (rate per unit-hour x acceleration), rates read here
    straight from the YAML files (Llama 3 Table 5 counts; Meta MTTF; the brief's 1e-6/h)."""
    from scenarios.faults import CATALOG_DIR, Exponential, Weibull

    expect = {"llama3-gpu": 148 / (54 * 24 * 16384), "llama3-hbm": 72 / (54 * 24 * 16384),
              "llama3-nic": 7 / (54 * 24 * 16384), "llama3-unexpected": 419 / (54 * 24 * 16384),
              "meta-rsc-1024gpu": 1 / (7.9 * 1024), "link-brief": 1e-6}
    names = sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))
    assert names == sorted(expect)
    for name, rate in expect.items():
        raw = yaml.safe_load((CATALOG_DIR / f"{name}.yaml").read_text())
        assert all(isinstance(v, dict) and v["source"] for k, v in raw.items()
                   if k not in ("description", "component"))
        e = Exponential.model_validate({"dist": "exponential", "catalog": name,
                                        "acceleration": 10.0})
        assert e.mean_s == pytest.approx(3600 / (rate * 10), rel=1e-12)
        assert name in e.source and "accelerated x10" in e.source
        w = Weibull.model_validate({"dist": "weibull", "shape": 0.7, "catalog": name})
        assert w.mean == pytest.approx(3600 / rate, rel=1e-12)


@pytest.mark.parametrize("spec", [
    {"dist": "exponential", "mean_s": 3.0},
    {"dist": "weibull", "shape": 0.7, "scale_s": 2.0},
    {"dist": "weibull", "shape": 3.0, "scale_s": 2.0},
    {"dist": "lognormal", "mean_s": 0.5, "cov": 1.5},
])
def test_time_distributions_have_their_mean(spec):
    from pydantic import TypeAdapter

    from scenarios.faults import Dist

    d = TypeAdapter(Dist).validate_python(spec)
    rng = np.random.default_rng(1)
    x = np.array([d.sample(rng) for _ in range(20000)])
    assert abs(x.mean() - d.mean) < 5 * x.std() / math.sqrt(len(x))


@pytest.mark.parametrize("cov", [0.3, 1.5, 40.0])
def test_lognormal_draws_are_the_normal_draws_of_its_sigma(cov):
    """A lognormal of mean m and coefficient of variation c has sigma^2 = ln(1 + c^2) and mu =
    ln m - sigma^2 / 2 (so that E = exp(mu + sigma^2 / 2) = m); NumPy draws it as
    exp(mu + sigma z) from the generator's standard normals z, so the log of each draw is
    that line through the same seed's normals."""
    from scenarios.faults import Lognormal

    d = Lognormal(dist="lognormal", mean_s=0.5, cov=cov)
    s2 = math.log(1.0 + cov**2)
    z = np.random.default_rng(7).standard_normal(50)
    rng = np.random.default_rng(7)
    got = np.log([d.sample(rng) for _ in range(50)])
    assert got == pytest.approx(math.log(0.5) - s2 / 2 + math.sqrt(s2) * z, rel=1e-12, abs=1e-12)


def test_weibull_shape_bound_is_one_over_170():
    """The least Weibull shape is 1/170 (Gamma(1 + 170) ~ 7e306 is still a float): a shape of
    exactly 1/170 is accepted with a finite mean, a hair below is refused at ``shape``."""
    from pydantic import ValidationError

    from scenarios.faults import Weibull

    w = Weibull(dist="weibull", shape=1.0 / 170.0, scale_s=1.0)
    assert math.isfinite(w.mean) and w.mean == pytest.approx(math.factorial(170), rel=1e-9)
    with pytest.raises(ValidationError, match="shape"):
        Weibull(dist="weibull", shape=1.0 / 170.0 * (1 - 1e-9), scale_s=1.0)


def test_readme_documents_every_fault_key():
    from scenarios.faults import DIST_TAGS, FAULT_TYPES, Exponential, Fixed, Lognormal, Weibull

    readme = (ROOT / "README.md").read_text()
    missing = [f"faults[].{k}" for t in FAULT_TYPES for k in t.model_fields
               if f"`faults[].{k}`" not in readme]
    for t in (Exponential, Weibull, Lognormal, Fixed):
        missing += [f"faults[].ttf.{k}" for k in t.model_fields
                    if f"`faults[].ttf.{k}`" not in readme]
    missing += [f"`{k}`" for k in DIST_TAGS if f"`{k}`" not in readme]
    assert not missing, missing
    from scenarios.faults import FaultSpec

    members = typing.get_args(typing.get_args(FaultSpec)[0])
    assert set(members) == set(FAULT_TYPES)


# ----------------------------------------------------------------------------- job control
def test_checkpoints_cost_their_write_time():
    """Synchronous checkpoints every 2 iterations add exactly n x write_s; the iteration after
    a checkpoint carries it."""
    base = _run(_scen(workload__iterations=6))
    ck = _run(_scen(faults=[], job=JOB, workload__iterations=6))
    s0, s1 = base.summary, ck.summary
    assert s1["checkpoints"] == 3 and s1["checkpoint_time_s"] == pytest.approx(0.03)
    assert s1["makespan_s"] == pytest.approx(s0["makespan_s"] + 0.03, rel=1e-12)
    diff = np.array(ck.iteration_times_s) - np.array(base.iteration_times_s)
    np.testing.assert_allclose(diff, [0, 0, 0.01, 0, 0.01, 0], atol=1e-12)
    assert s1["goodput"] == pytest.approx((s1["makespan_s"] - 0.03) / s1["makespan_s"])
    assert s1["availability"] == 1.0 and s1["symmetry_used"]
    # nothing failed: no work lost, no downtime, and no energy booked to either
    assert (s1["restarts"], s1["failures"], s1["lost_work_j"], s1["downtime_j"]) == (0, 0, 0, 0)
    # no job section: the fault-tolerance keys of a job that never stopped
    assert {k: s0[k] for k in ("restarts", "failures", "interruptions", "checkpoints",
                               "checkpoint_time_s", "lost_work_s", "lost_work_j",
                               "downtime_s", "downtime_j", "availability", "goodput")} == {
        "restarts": 0, "failures": 0, "interruptions": 0, "checkpoints": 0,
        "checkpoint_time_s": 0.0, "lost_work_s": 0.0, "lost_work_j": 0.0, "downtime_s": 0.0,
        "downtime_j": 0.0, "availability": 1.0, "goodput": 1.0}
    # an executor without a job controller reports what a controller that saw nothing does
    from workloads.job import job_metrics

    bare = job_metrics(None, [], None, s0["makespan_s"], 6, 1.0)
    assert {k: v for k, v in bare.items() if k != "goodput_tokens_per_s"} == {
        k: s0[k] for k in bare if k != "goodput_tokens_per_s"}
    assert bare["goodput_tokens_per_s"] == pytest.approx(6 / s0["makespan_s"], rel=1e-12)


def test_a_failure_after_the_last_iteration_finds_the_job_done():
    """An accelerator failure scheduled after the job's last iteration ends stops nothing:
    no failure is counted and the run is the clean run. (The run ends with the job, so such a
    fault never fires; a failure that reaches a finished job directly is ignored and says
    so, which the fault log records as ``ignored (job finished)``.)"""
    from types import SimpleNamespace

    from workloads.job import CheckpointPolicy, JobController

    clean = _run(_scen(faults=[], job=JOB, workload__iterations=2)).summary
    late = {"kind": "accelerator_failure", "device": 1, "time_s": 3 * clean["makespan_s"]}
    s = _run(_scen(faults=[late], job=JOB, workload__iterations=2)).summary
    assert (s["failures"], s["restarts"], s["lost_work_s"]) == (0, 0, 0.0)
    assert s["makespan_s"] == clean["makespan_s"] and s["completed"]
    env = simpy.Environment()
    job = JobController(env, CheckpointPolicy(None, 0.0, 0.0), 1)
    job.attach(SimpleNamespace(done=env.event().succeed()))
    assert job.fail("device 1") is False and job.log.failures == []


def test_energy_over_windows_by_hand():
    """Segments 0-2 s at 100 W and 2-3 s at 50 W; windows 1.5-2.5 s and 2.8-4 s: 0.5 x 100
    + 0.5 x 50 + 0.2 x 50 = 85 J; a window touching no segment adds nothing."""
    from workloads.job import window_overlap

    seg = [(0.0, 2.0, 100.0), (2.0, 3.0, 50.0)]
    assert window_overlap(seg, [(1.5, 2.5), (2.8, 4.0)]) == pytest.approx(85.0, rel=1e-12)
    assert window_overlap(seg, [(5.0, 6.0)]) == 0.0
    assert window_overlap(seg, []) == 0.0


def test_the_faults_table_is_in_time_order_across_kinds(tmp_path):
    """A straggler at 1 ms, then an accelerator failure and the job's restart: the table
    lists them by time, not by kind (alphabetically the failure would come first)."""
    faults = [{"kind": "straggler", "device": 1, "factor": 1.5, "time_s": 0.001},
              {"kind": "accelerator_failure", "device": 2, "time_s": 0.05}]
    res = _run(_scen(tmp_path, job=JOB, faults=faults, trace=True, workload__iterations=2))
    table = read_table(res.trace_path, "faults")
    assert list(table.kind) == ["straggler", "accelerator_failure", "restart"]
    assert table.time_s.is_monotonic_increasing


@pytest.mark.parametrize("where", [1.6, 0.6])
def test_accelerator_failure_loses_work_since_last_checkpoint(tmp_path, where):
    """Device 5 fails at t_f (inside the second checkpoint segment, or the first, before
    any commit): lost = t_f - last commit, the job is down restart_s, the makespan grows by
    exactly lost + restart_s; energy and bytes close.

    The thermal model is off here: with it, the work redone after the downtime runs on
    cooler dies (less leakage), so the energy identity holds only to ~1e-4."""
    cool = {"thermal": {"enabled": False}}
    ck = _run(_scen(faults=[], job=JOB, workload__iterations=6, power=cool))
    t_it = _run(_scen(workload__iterations=1, power=cool)).summary["iteration_time_s"]
    seg = 2 * t_it + JOB["checkpoint_write_s"]          # iterations per checkpoint x time + write
    t_f = where * seg
    fail = {"kind": "accelerator_failure", "device": 5, "time_s": t_f}
    res = _run(_scen(tmp_path, job=JOB, faults=[fail], trace=True, workload__iterations=6,
                     power=cool))
    s, s0 = res.summary, ck.summary
    lost = t_f - seg * int(where)  # since the last commit (none in the first segment)
    assert s["restarts"] == 1 and s["interruptions"] == 1 and s["completed"]
    assert s["lost_work_s"] == pytest.approx(lost, rel=1e-9)
    assert s["downtime_s"] == pytest.approx(JOB["restart_s"], rel=1e-9)
    assert s["makespan_s"] == pytest.approx(s0["makespan_s"] + lost + JOB["restart_s"],
                                            rel=1e-9)
    assert s["availability"] == pytest.approx(1 - JOB["restart_s"] / s["makespan_s"])
    assert s["goodput"] == pytest.approx(
        (s["makespan_s"] - 0.03 - lost - JOB["restart_s"]) / s["makespan_s"])
    # the failed run = the clean run + a replay of the lost window + the downtime
    assert s["energy_j"] - s0["energy_j"] == pytest.approx(s["lost_work_j"] + s["downtime_j"],
                                                           rel=1e-9)
    assert s["lost_work_j"] > 0 and s["downtime_j"] > 0
    assert s["bytes_sent"] == pytest.approx(s["bytes_received"] + s["bytes_dropped"],
                                            rel=1e-12)
    assert s["bytes_dropped"] > 0  # the DP all-reduce in flight was withdrawn
    faults = read_table(res.trace_path, "faults")
    assert list(zip(faults.kind, faults.action, strict=True)) == [
        ("accelerator_failure", "fail"), ("restart", "resume")]
    assert faults.time_s.iloc[1] == pytest.approx(t_f + JOB["restart_s"])
    # the restart lands on the first iteration redone (iteration 2, or 0 before any commit)
    extra = np.array(res.iteration_times_s) - np.array(ck.iteration_times_s)
    want = np.zeros(6)
    want[2 * int(where)] = lost + JOB["restart_s"]
    np.testing.assert_allclose(extra, want, atol=1e-9)


def test_a_failure_while_an_overlapped_tp_block_waits_for_its_gather():
    """Tensor parallelism 2 with sequence parallelism and chunked TP communication beside
    compute, every collective a fabric transfer (exact mode): device 5 fails at 1.175 x the
    checkpoint segment, while its agent waits for a chunk's all-gather between two compute
    chunks. The agent is interrupted (it is not inside a block), the job restarts, and the
    makespan grows by exactly the lost work and the restart time."""
    cool = {"thermal": {"enabled": False}}
    kw = dict(workload__parallelism={"dp": 4, "tp": 2, "pp": 1},
              workload__sequence_parallel=True, overlap={"tp_comm": True}, power=cool,
              simulation={"exact": True})
    clean_run = _run(_scen(job=JOB, workload__iterations=3, **kw))
    clean = clean_run.summary
    t_it = clean_run.iteration_times_s[0]  # (= a one-iteration run's, to the bit)
    seg = 2 * t_it + JOB["checkpoint_write_s"]
    t_f = 1.175 * seg
    s = _run(_scen(job=JOB, workload__iterations=3, **kw,
                   faults=[{"kind": "accelerator_failure", "device": 5, "time_s": t_f}])).summary
    assert s["completed"] and s["restarts"] == 1
    assert s["makespan_s"] == pytest.approx(clean["makespan_s"] + (t_f - seg) + JOB["restart_s"],
                                            rel=1e-9)


def test_failure_during_restart_and_during_checkpoint_write():
    t_it = _run(_scen(workload__iterations=1)).summary["iteration_time_s"]
    seg = 2 * t_it + 0.01
    ck = _run(_scen(faults=[], job=JOB, workload__iterations=4)).summary
    # a second failure while the job is down: no more work lost, the restart starts over
    f1, f2 = 0.5 * seg, 0.5 * seg + 0.03
    s = _run(_scen(job=JOB, faults=[{"kind": "accelerator_failure", "device": 1, "time_s": f1},
                           {"kind": "accelerator_failure", "device": 2, "time_s": f2}],
                   workload__iterations=4)).summary
    assert (s["failures"], s["interruptions"], s["restarts"]) == (2, 1, 1)
    assert s["lost_work_s"] == pytest.approx(f1, rel=1e-9)
    assert s["downtime_s"] == pytest.approx(f2 - f1 + 0.05, rel=1e-9)
    assert s["makespan_s"] == pytest.approx(ck["makespan_s"] + f1 + (f2 - f1) + 0.05, rel=1e-9)
    # a failure in the middle of a checkpoint write: the write is lost with the work
    t_f = 2 * t_it + 0.005
    s = _run(_scen(job=JOB, faults=[{"kind": "accelerator_failure", "device": 0, "time_s": t_f}],
                   workload__iterations=4)).summary
    assert s["lost_work_s"] == pytest.approx(t_f, rel=1e-9)
    assert s["checkpoints"] == 2  # 3 written, the first one never committed
    assert s["makespan_s"] == pytest.approx(ck["makespan_s"] + t_f + 0.05, rel=1e-9)


def test_job_abort_in_packet_mode_conserves_bytes():
    fail = {"kind": "accelerator_failure", "device": 3, "time_s": 0.05}
    s = _run(_scen(job=JOB, faults=[fail], workload__iterations=2,
                   network={"model": "packet", "packet_kib": 16384})).summary
    assert s["completed"] and s["restarts"] == 1
    assert s["bytes_sent"] == pytest.approx(s["bytes_received"] + s["bytes_dropped"],
                                            rel=1e-12)


def test_mean_lost_work_agrees_with_renewal_theory(tmp_path):
    """Poisson failures (8 devices, exponential each) on a job whose segments all last tau:
    lost work per interruption is X mod tau, X ~ Exp(lambda), with mean
    1/lambda - tau / (exp(lambda tau) - 1). The campaign's mean and its run-bootstrap
    interval must contain it (and exclude the naive tau / 2)."""
    from experiments.campaign import load_campaign, run_campaign

    job = {"checkpoint_interval_iterations": 2, "checkpoint_write_s": 0.003, "restart_s": 0.01}
    small = {"base": "llama3.2-1b", "layers": 2}   # the theory does not care about the model
    clean = _run(_scen(job=job, workload__iterations=8, workload__model=small)).summary
    tau = clean["makespan_s"] / 4
    lam = 1.0 / tau                            # lambda tau = 1
    base = _scen(job=job, faults=[{"kind": "accelerator_failure", "devices": "all",
                                   "ttf": {"dist": "exponential", "mean_s": 8 / lam}}],
                 workload__iterations=8, workload__model=small)
    camp = load_campaign({"name": "renewal", "base": base, "seeds": 40, "baseline": False,
                          "traces": False, "bootstrap": 1000})
    out = run_campaign(camp, tmp_path / "renewal", client=None, progress=False, plots=False)
    row = out.stats.set_index("metric").loc["lost_work_per_interruption_s"]
    theory = 1 / lam - tau / math.expm1(lam * tau)
    assert row["n"] >= 200
    assert row["mean_lo"] <= theory <= row["mean_hi"], (row["mean_lo"], theory, row["mean_hi"])
    assert not row["mean_lo"] <= tau / 2 <= row["mean_hi"]


# ----------------------------------------------------------------------------- links
def _fabric(kind, shape, links_per_edge=1, timeout=1e-3):
    from devices.fabric import Fabric
    from devices.spec import LinkSpec
    from topologies.graph import build_topology
    from topologies.routing import Router
    from twin.catalogs import catalog
    from twin.kernel.engine import Engine

    link = LinkSpec.model_validate(catalog("links").get("nvlink4").values)
    env = Engine()
    topo = build_topology(kind, shape, link.name, links_per_edge)
    fab = Fabric(env, topo, Router(topo), {link.name: link}, retransmit_timeout_s=timeout)
    return env, topo, fab, link


def _alpha(link, hops):
    return (link.overhead_us + hops * link.latency_us) * 1e-6


def _sharing(fab, src, dst) -> int:
    """Most flows of the phase on one directed link (counted from the routes)."""
    count = Counter(lid for a, b in zip(src, dst, strict=True)
                    for lid in fab.router.route(int(a), int(b)))
    return max(count.values())


def test_in_flight_bytes_resent_after_timeout_on_the_detour():
    """0 -> 1 on a 4x4 torus, link cut at t_c: B t_c bytes made it, the rest waits the timeout
    and goes round 0-4-5-1 (3 hops): t = t_c + T_o + (n - B t_c) / B + alpha(3 hops)."""
    from devices.fabric import Phase

    env, _topo, fab, link = _fabric("torus2d", (4, 4), timeout=2e-3)
    n, t_c, B = 100e6, 1e-4, link.bytes_per_s
    env.process((lambda: (yield env.timeout(t_c)) or fab.fail_edge(0, 1))())

    def body():
        yield from fab.run_phase(Phase(np.array([0]), np.array([1]), np.array([n])))
    env.process(body())
    env.run()
    rest = n - B * t_c
    assert env.now == pytest.approx(t_c + 2e-3 + rest / B + _alpha(link, 3), rel=1e-9)
    assert fab.retransmitted_bytes == pytest.approx(rest, rel=1e-9)
    assert fab.bytes_received.sum() == pytest.approx(n) == fab.bytes_sent.sum()
    assert fab.link_bytes.sum() == pytest.approx(B * t_c + 3 * rest, rel=1e-9)
    assert fab.reroutes == 1 and fab.router.hops(0, 1) == 3


@pytest.mark.parametrize("bidirectional", [False, True])
def test_mesh_corner_left_with_one_link(bidirectional):
    """Corner 0 of a 4x4 mesh loses link 0-1 and keeps only 0-4, which now carries the ring's
    traffic into and out of 0. One-way ring: links are full duplex, only the 2 extra hops of
    latency per step are paid. Bidirectional ring (half the buffer each way): the last link
    carries two flows per direction and the phase takes k = 2 times the bandwidth term.
    Prediction: steps x alpha(longest route) + k x bytes per flow / B, k counted from routes."""
    from devices.fabric import Phase
    from topologies.placement import device_order
    from workloads import collectives

    env, topo, fab, link = _fabric("mesh2d", (4, 4))
    ring = device_order(topo)[None, :]
    p, n = 16, 64e6
    assert list(topo.graph.neighbors(0)) == [1, 4] and {1, 4} == {ring[0, 1], ring[0, -1]}
    fab.fail_edge(0, 1)
    if bidirectional:
        fwd = collectives.ring_allreduce(ring, n / 2)[0]
        back = collectives.ring_allreduce(ring[:, ::-1], n / 2)[0]
        phase = Phase(np.concatenate([fwd.src, back.src]), np.concatenate([fwd.dst, back.dst]),
                      np.concatenate([fwd.nbytes, back.nbytes]), fwd.steps)
    else:
        (phase,) = collectives.ring_allreduce(ring, n)
    k = _sharing(fab, phase.src, phase.dst)
    assert k == (2 if bidirectional else 1)
    hops = max(fab.router.hops(int(a), int(b)) for a, b in zip(phase.src, phase.dst,
                                                                strict=True))
    assert hops == 3
    env.process(fab.run_phase(phase))
    env.run()
    per_flow = phase.steps * float(phase.nbytes[0])
    expect = phase.steps * _alpha(link, hops) + k * per_flow / link.bytes_per_s
    assert env.now == pytest.approx(expect, rel=1e-9)
    healthy = collectives.alpha_beta_time("allreduce", p, n, _alpha(link, 1), link.bytes_per_s)
    assert env.now > healthy


def test_mesh_edge_scenario_all_reduce_pays_two_hops_per_step(tmp_path):
    """scenarios/fault_mesh_edge.yaml against the same run without the fault: the exposed DP
    all-reduce (16-member ring, 2 x 15 steps) takes exactly 30 x 2 hop latencies longer (the
    ring edge 0 -> 1 goes round 0-4-5-1; no link is shared), and so does the iteration."""
    d = yaml.safe_load((ROOT / "scenarios" / "fault_mesh_edge.yaml").read_text())
    d["trace"] = {"path": str(tmp_path / "edge.h5")}
    res = _run(d)
    base = _run({**d, "faults": [], "trace": {"path": str(tmp_path / "edge0.h5")}})
    scen = load_scenario(d)
    extra = 2 * 15 * 2 * scen.cluster.link.latency_us * 1e-6

    def dp_time(r):
        ops = read_table(r.trace_path, "ops")
        return float((ops[ops.kind == "dp"].eval("t_end - t_start")).max())

    assert dp_time(res) - dp_time(base) == pytest.approx(extra, rel=1e-6)
    np.testing.assert_allclose(np.array(res.iteration_times_s)
                               - np.array(base.iteration_times_s), extra, rtol=1e-6)
    ranks = read_table(res.trace_path, "ranks")
    assert int(ranks[ranks.device == 0].degree.iloc[0]) == 2  # the healthy corner's links


def _dp_groups(layout):
    return [layout.group_devices("dp", g) for g in range(layout.pp * layout.tp)]


def test_link_failure_slows_iteration_by_hops_and_sharing(tmp_path):
    """DP 4 x TP 4 row-major on a 4x4 torus, one gradient bucket (the all-reduce is exposed).
    Link 0-4 (a ring edge of column 0) fails at t = 0: its detour shares a y-link with
    column 1's ring. Every DP group's all-reduce must take steps x alpha(its longest route) +
    k_g x bytes per flow / B, k_g its most shared link; the iteration slows by the slowest."""
    from twin.build import build

    ov = dict(cluster__topology={"kind": "torus2d", "shape": [4, 4]},
              workload__parallelism={"dp": 4, "tp": 4, "pp": 1},
              workload__placement="row-major", workload__global_batch=4,
              workload__grad_bucket_mb=1e6, simulation={"symmetry": False},
              network={"protocols": "links"})  # the links' alpha: the law derived below
    down = {"kind": "link_down", "link": [0, 4], "time_s": 0.0}
    base = _run(_scen(tmp_path, trace=True, **ov))
    res = _run(_scen(tmp_path, faults=[down], trace=True, **ov))
    s0, s = base.summary, res.summary
    scen = load_scenario(_scen(faults=[down], **ov))
    model = build(scen)
    model.router.fail_edge(0, 4)
    link = scen.cluster.link
    B = link.bytes_per_s * scen.cluster.links_per_edge
    groups = _dp_groups(model.layout)
    src = np.concatenate([g for g in groups])
    dst = np.concatenate([np.roll(g, -1) for g in groups])
    routes = [model.router.route(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
    load = Counter(lid for r in routes for lid in r)
    ops0 = read_table(base.trace_path, "ops")
    ops = read_table(res.trace_path, "ops")
    t_base = float((ops0[ops0.kind == "dp"].eval("t_end - t_start")).max())
    steps = 2 * (4 - 1)
    m0 = read_table(base.trace_path, "messages")
    dp0 = m0[m0.name.str.startswith("dp")]
    per_flow = float((dp0.bytes / dp0.n_pairs).iloc[0])  # steps x n/p, every DP flow alike
    ranks = model.layout
    predicted = []
    for g in groups:
        rts = [model.router.route(int(a), int(b)) for a, b in zip(g, np.roll(g, -1),
                                                                     strict=True)]
        k = max(load[lid] for r in rts for lid in r)
        hops = max(len(r) for r in rts)
        alpha = (link.overhead_us + hops * link.latency_us) * 1e-6
        predicted.append(steps * alpha + k * per_flow / B)
        # measured: the dp op of any rank of the group
        rank = int(np.flatnonzero(ranks.device == g[0])[0])
        cls = int(ranks.rank_class[rank])
        op = ops[(ops.kind == "dp") & (ops.cls == cls)]
        assert float(op.t_end.iloc[0] - op.t_start.iloc[0]) == pytest.approx(predicted[-1],
                                                                             rel=1e-6)
    assert sorted(predicted)[-1] == pytest.approx(2 * per_flow / B + steps * _alpha(link, 3),
                                                  rel=1e-9)
    assert s["iteration_time_s"] - s0["iteration_time_s"] == pytest.approx(
        max(predicted) - t_base, rel=1e-6)
    assert s["bytes_sent"] == pytest.approx(s["bytes_received"], rel=1e-12)
    msgs = read_table(res.trace_path, "messages")
    assert msgs[msgs.name.str.startswith("dp")].max_hops.max() == 3


def test_link_failure_mid_run_completes_and_shows_the_detour(tmp_path):
    """The scenario library's fault_link with the failure moved into the all-reduce: the cut
    flows are resent after the timeout on the detour; the run completes, bytes balance, the
    trace has the fault rows and 3-hop messages."""
    d = yaml.safe_load((ROOT / "scenarios" / "fault_link.yaml").read_text())
    d["trace"] = {"path": str(tmp_path / "fl.h5")}
    d["workload"]["iterations"] = 2
    d["network"] = {"retransmit_timeout_s": 0.002}
    base = _run(copy.deepcopy({**d, "faults": []}))
    ops = read_table(base.trace_path, "ops")
    dp = ops[ops.kind == "dp"]
    t_mid = float(dp.t_start.min() + 0.5 * (dp.t_end - dp.t_start).min())
    d["faults"] = [{"kind": "link_failure", "link": [0, 4], "time_s": t_mid,
                    "duration_s": 0.5}]
    res = _run(d)
    s = res.summary
    assert s["completed"] and s["reroutes"] >= 1 and s["retransmitted_bytes"] > 0
    assert s["bytes_sent"] == pytest.approx(s["bytes_received"], rel=1e-12)
    assert s["makespan_s"] > base.summary["makespan_s"] + 0.002
    faults = read_table(res.trace_path, "faults")
    assert list(faults.action) == ["down"]  # the run ended before the repair
    assert faults.time_s.iloc[0] == pytest.approx(t_mid)
    msgs = read_table(res.trace_path, "messages")
    assert (msgs[msgs.t_end > t_mid].max_hops == 3).any()


def test_partitioned_device_waits_for_repair_or_ends_cleanly():
    """Corner 0 of a 4x2 torus loses all three links: with no repair coming the run ends as
    not completed (no hang, no crash); with link_up at 0.3 s it waits and completes."""
    cut = [{"kind": "link_down", "link": [0, v], "time_s": 0.0} for v in (1, 3, 4)]
    s = _run(_scen(faults=cut, workload__iterations=2)).summary
    assert not s["completed"] and s["iterations_completed"] == 0
    res = _run(_scen(faults=[*cut, {"kind": "link_up", "link": [0, 4], "time_s": 0.3}],
                     workload__iterations=2))
    s = res.summary
    assert s["completed"] and s["route_stalls"] >= 1 and s["makespan_s"] > 0.3
    assert s["bytes_sent"] == pytest.approx(s["bytes_received"], rel=1e-12)
    # the phases that waited for a route move what they would have moved without the cut
    healthy = _run(_scen(workload__iterations=2)).summary
    assert s["bytes_sent"] == pytest.approx(healthy["bytes_sent"], rel=1e-12)


def test_a_fixed_link_up_leaves_no_repair_pending():
    """Link 5-6 goes down at 0 and up at 0.1 s (a fixed link_up: a repair pending until it
    fires, none after); at 0.2 s corner 0 of the 4x2 torus loses its three links for good. No
    repair is coming, so the run ends there as not completed (two iterations done), instead
    of waiting for one that the link_up already made."""
    other = [{"kind": "link_down", "link": [5, 6], "time_s": 0.0},
             {"kind": "link_up", "link": [5, 6], "time_s": 0.1}]
    cut = [{"kind": "link_down", "link": [0, v], "time_s": 0.2} for v in (1, 3, 4)]
    s = _run(_scen(faults=[*other, *cut], workload__iterations=3)).summary
    assert not s["completed"] and s["iterations_completed"] == 2


def test_a_link_down_at_one_second_happens_at_one_second():
    """Only a ``link_down`` at time 0 is applied before the run starts; one at 1 s leaves the
    first 12 iterations (0.083 s each) as fast as the healthy run's and slows the rest."""
    healthy = _run(_scen(workload__iterations=16)).iteration_times_s
    down = _run(_scen(faults=[{"kind": "link_down", "link": [0, 1], "time_s": 1.0}],
                      workload__iterations=16)).iteration_times_s
    assert sum(healthy[:12]) < 1.0 < sum(healthy[:13])
    assert down[:12] == pytest.approx(healthy[:12], rel=1e-12)
    assert all(d > h * (1 + 1e-4) for d, h in zip(down[13:], healthy[13:], strict=True))


def test_nic_failure_reroutes_through_the_nvswitch():
    """switched 2 nodes x 4 GPUs, one NIC per GPU: GPU 0's NIC edge fails; its traffic to the
    other node goes GPU 0 -> NVSwitch -> another GPU's NIC, never over the failed edge."""
    from devices.fabric import Fabric, Phase
    from devices.spec import LinkSpec
    from scenarios.faults import nic_edges
    from topologies.graph import build_topology
    from topologies.routing import Router
    from twin.catalogs import catalog
    from twin.kernel.engine import Engine

    specs = {n: LinkSpec.model_validate(catalog("links").get(n).values)
             for n in ("nvlink4", "ib-ndr400")}
    topo = build_topology("switched", (4, 2), "nvlink4", 18, nic_link="ib-ndr400")
    ft = topo.fat_tree
    (edge,) = nic_edges(topo, 0)
    assert edge == (0, ft.leaf(0, 0))
    assert nic_edges(build_topology("torus2d", (4, 4), "nvlink4"), 0) == []
    env = Engine()
    fab = Fabric(env, topo, Router(topo), specs, retransmit_timeout_s=1e-3)
    healthy = fab.router.hops(0, 4)
    fab.fail_edge(*edge)
    route = fab.router.route(0, 4)
    bad = {topo.link_id(*edge), topo.link_id(edge[1], edge[0])}
    assert not bad & set(route) and len(route) > healthy
    assert fab.router.nodes(0, 4)[1] == ft.nvswitch(0)
    env.process(fab.run_phase(Phase(np.array([0, 1]), np.array([4, 5]), np.array([1e8, 1e8]))))
    env.run()
    assert fab.bytes_received.sum() == pytest.approx(2e8) == fab.bytes_sent.sum()


def test_nic_failure_in_a_run(tmp_path):
    """scenarios/fault_nic.yaml: GPU 0's NIC is down for the first iteration; its inter-node
    traffic detours (longer routes in the messages table), that iteration is slower, the
    next one is back to normal, bytes balance."""
    d = yaml.safe_load((ROOT / "scenarios" / "fault_nic.yaml").read_text())
    d["trace"] = {"path": str(tmp_path / "nic.h5")}
    res = _run(d)
    d0 = {**d, "faults": [], "trace": {"path": str(tmp_path / "nic0.h5")}}
    base = _run(d0)
    s = res.summary
    assert s["completed"] and s["bytes_sent"] == pytest.approx(s["bytes_received"], rel=1e-12)
    faults = read_table(res.trace_path, "faults")
    assert list(faults.action) == ["down", "up"] and faults.target.iloc[0] == "nic:0"
    hops = read_table(res.trace_path, "messages").max_hops.max()
    assert hops > read_table(base.trace_path, "messages").max_hops.max()
    t, t0 = res.iteration_times_s, base.iteration_times_s
    assert t[0] > t0[0] and t[1] == pytest.approx(t0[1], rel=1e-9)


# ----------------------------------------------------------------------------- devices
def test_straggler_slows_the_job_by_its_factor(tmp_path):
    """A permanent 1.5x straggler: every all-reduce waits for it, so each iteration grows by
    0.5 x that rank's compute time per iteration (one gradient bucket, exposed)."""
    ov = dict(workload__iterations=2, workload__grad_bucket_mb=1e6,
              simulation={"symmetry": False})
    base = _run(_scen(tmp_path, trace=True, **ov))
    slow = _run(_scen(faults=[{"kind": "straggler", "device": 3, "factor": 1.5,
                               "time_s": 0.0}], **ov))
    ops = read_table(base.trace_path, "ops")
    comp = ops[(ops.kind == "compute") & (ops.iteration == 0)]
    per_rank = comp.assign(d=comp.t_end - comp.t_start).groupby("cls").d.sum()
    c = float(per_rank.iloc[0])
    assert per_rank.max() == pytest.approx(per_rank.min(), rel=1e-12)
    np.testing.assert_allclose(np.array(slow.iteration_times_s)
                               - np.array(base.iteration_times_s), 0.5 * c, rtol=1e-9)


def test_straggler_window_ends():
    """2x slower for the first half iteration: ~a quarter iteration later (blocks that start
    in the window are slowed whole), then back to normal."""
    ov = dict(workload__grad_bucket_mb=1e6)
    t_it = _run(_scen(workload__iterations=1, **ov)).summary["iteration_time_s"]
    res = _run(_scen(faults=[{"kind": "straggler", "device": 3, "factor": 2.0, "time_s": 0.0,
                              "duration_s": 0.5 * t_it}], workload__iterations=4, **ov))
    times = np.array(res.iteration_times_s)
    assert 1.15 * t_it < times[0] < 1.35 * t_it
    np.testing.assert_allclose(times[1:], t_it, rtol=1e-9)


def test_hbm_degradation_multiplies_memory_time(tmp_path):
    from twin.build import build

    d = _scen(tmp_path, trace=True, faults=[{"kind": "hbm_degradation", "device": 2,
                                             "factor": 3.0, "time_s": 0.0}],
              workload__iterations=1)
    res = _run(d)
    model = build(load_scenario(d))
    ops = read_table(res.trace_path, "ops")
    rank = int(np.flatnonzero(model.layout.device == 2)[0])
    cls = int(model.layout.rank_class[rank])
    blocks = model.blocks[0]
    for cl, factor in ((cls, 3.0), ((cls + 1) % 8, 1.0)):
        mine = ops[(ops.cls == cl) & (ops.kind == "compute")]
        for name, g in mine.groupby("name", observed=True):
            want = model.compute.block_cost(blocks[name], 1.0, factor).duration_s
            np.testing.assert_allclose(g.t_end - g.t_start, want, rtol=1e-9, err_msg=name)
    opt = blocks["optimizer"]
    assert (model.compute.block_cost(opt, 1.0, 3.0).duration_s
            > 2.5 * model.compute.block_cost(opt, 1.0, 1.0).duration_s)  # memory bound


def test_hbm_tail_draws_have_the_pareto_tail():
    """The per-block multiplier of a heavy-tailed window: Hill estimate of its tail index
    contains alpha; support starts at x_m = mean (alpha - 1) / alpha; factor multiplies."""
    from types import SimpleNamespace

    from scenarios.faults import FaultInjector, HbmDegradation
    from twin.kernel.queueing import hill_estimate

    f = HbmDegradation.model_validate({"kind": "hbm_degradation", "device": 0, "time_s": 0,
                                       "factor": 2.0, "tail": {"name": "pareto", "alpha": 1.5,
                                                               "mean": 3.0}})
    acc = SimpleNamespace(slowdown=1.0, mem_scale=1.0)
    inj = FaultInjector.__new__(FaultInjector)
    inj.executor = SimpleNamespace(accelerators=[acc])
    inj._mem = {0: [(f.factor, f.tail_distribution(), np.random.default_rng(5))]}
    draws = []
    for _ in range(20000):
        inj.before_block(0)
        draws.append(acc.mem_scale)
    x = np.array(draws) / 2.0
    assert x.min() >= 3.0 * 0.5 / 1.5 - 1e-12
    h = hill_estimate(x)
    assert h.ci_low <= 1.5 <= h.ci_high and h.variance_verdict == "infinite"


def test_a_blocks_memory_multiplier_is_the_product_of_its_effects():
    """Two HBM degradations on one class, factor 2 with a Pareto tail and factor 3 without:
    each block's memory-time multiplier is 2 x (the tail's next draw) x 3, the draws those of
    the fault's own stream."""
    from types import SimpleNamespace

    from scenarios.faults import FaultInjector, HbmDegradation

    tail = HbmDegradation.model_validate({"kind": "hbm_degradation", "device": 0, "time_s": 0,
                                          "factor": 2.0, "tail": {"name": "pareto",
                                                                  "alpha": 1.5, "mean": 3.0}})
    acc = SimpleNamespace(slowdown=1.0, mem_scale=1.0)
    inj = FaultInjector.__new__(FaultInjector)
    inj.executor = SimpleNamespace(accelerators=[acc])
    inj._mem = {0: [(2.0, tail.tail_distribution(), np.random.default_rng(5)), (3.0, None, None)]}
    expect = tail.tail_distribution().sample(np.random.default_rng(5), 4)
    got = []
    for _ in range(4):
        inj.before_block(0)
        got.append(acc.mem_scale)
    assert got == pytest.approx(2.0 * 3.0 * expect, rel=1e-12)


def test_device_faults_name_the_rank_classes_of_their_targets():
    """A straggler on devices 0 and 2 and a cooling failure on device 3, with device 0 in
    rank class 0, device 1 unused (-1), devices 2 and 3 in class 2: classes 0 and 2."""
    from types import SimpleNamespace

    from pydantic import TypeAdapter

    from scenarios.faults import FaultInjector, FaultSpec

    faults = TypeAdapter(list[FaultSpec]).validate_python([
        {"kind": "straggler", "devices": [0, 2], "factor": 2.0, "time_s": 0.0},
        {"kind": "cooling_failure", "device": 3, "rise_k": 5.0, "time_s": 0.0},
        {"kind": "link_down", "link": [0, 1], "time_s": 0.0}])
    inj = FaultInjector.__new__(FaultInjector)
    inj.faults = faults
    inj.fabric = SimpleNamespace(topo=SimpleNamespace(n_devices=4))
    inj._cls_of = np.array([0, -1, 2, 2])
    assert inj.device_classes() == {0, 2}


@pytest.mark.parametrize("shape", ["abc", -1, 0])
def test_a_catalog_weibull_with_a_bad_shape_is_one_problem_at_shape(shape):
    """A Weibull whose scale comes from the catalog needs a shape > 0 to turn the entry's mean
    into a scale: a text or a number <= 0 is reported at the fault's ``ttf``, saying the
    shape must be a number > 0 (not a comparison error, not the 1/170 bound)."""
    d = _scen(faults=[{"kind": "accelerator_failure", "device": 0,
                       "ttf": {"dist": "weibull", "shape": shape, "catalog": "llama3-gpu"}}])
    with pytest.raises(ScenarioError) as exc:
        load_scenario(d)
    text = str(exc.value)
    assert "faults.0.ttf" in text and "shape must be a number > 0" in text, text


def test_an_hbm_tail_beside_a_bad_factor_is_not_reported_twice():
    """A factor out of range is reported at ``factor``; the tail's bound (factor x tail mean
    <= 1e3) is then checked with the default factor 1, so a tail of mean 600 adds nothing."""
    d = _scen(faults=[{"kind": "hbm_degradation", "device": 0, "time_s": 0.0, "factor": 5e3,
                       "tail": {"name": "exponential", "mean": 600.0}}])
    paths = _paths(d)
    assert paths == ["faults.0.factor"], paths


def test_an_hbm_degradation_without_a_factor_has_the_readmes_default():
    """The README's key table gives ``faults[].factor``'s default per kind (straggler: required;
    hbm_degradation: a number): a degradation given only a tail has that factor."""
    import re

    from scenarios.faults import HbmDegradation

    row = next(line for line in (ROOT / "README.md").read_text().splitlines()
               if line.startswith("| `faults[].factor` |"))
    documented = float(re.search(r"`hbm_degradation`: `([0-9.e+-]+)`", row).group(1))
    f = HbmDegradation.model_validate({"kind": "hbm_degradation", "device": 0, "time_s": 0,
                                       "tail": {"name": "exponential", "mean": 2.0}})
    assert f.factor == documented == 1.0


def test_hbm_tail_run_is_reproducible():
    fault = {"kind": "hbm_degradation", "device": 2, "time_s": 0.0,
             "tail": {"name": "pareto", "alpha": 1.5, "mean": 2.0}}
    a = _run(_scen(faults=[fault], workload__iterations=2))
    b = _run(_scen(faults=[fault], workload__iterations=2))
    c = _run(_scen(faults=[fault], workload__iterations=2), ["seed=9"])
    assert a.iteration_times_s == b.iteration_times_s != c.iteration_times_s


def test_cooling_failure_raises_the_ambient_for_its_window():
    """Inlet air of devices 0-3 +20 K from 5 ms on: their accelerators see the new ambient
    during the window and the old one after it; their dies end hotter than the others'."""
    from twin.build import build
    from twin.kernel.records import Recorder
    from twin.runner import simulate

    d = _scen(faults=[{"kind": "cooling_failure", "devices": [0, 1, 2, 3], "rise_k": 20.0,
                       "time_s": 0.005, "duration_s": 0.1}], workload__iterations=3)
    model = build(load_scenario(d))
    _env, _fabric, ex, rows = simulate(model, Recorder())
    lay = model.layout
    cls_of = {int(lay.device[r]): int(lay.rank_class[r]) for r in range(lay.world)}
    hot = [ex.accelerators[cls_of[dv]] for dv in (0, 1, 2, 3)]
    cool = [ex.accelerators[cls_of[dv]] for dv in (4, 5, 6, 7)]
    base = cool[0].ambient_c
    assert all(a.ambient_c == base for a in hot + cool)  # window over
    assert [r[3] for r in rows if r[1] == "cooling_failure"] == ["start"] * 4 + ["end"] * 4
    assert min(a.stats.max_temp_c for a in hot) > max(a.stats.max_temp_c for a in cool)

    d["faults"][0]["duration_s"] = None
    model = build(load_scenario(d))
    _env, _fabric, ex, _rows = simulate(model, Recorder())
    assert ex.accelerators[cls_of[0]].ambient_c == pytest.approx(base + 20.0)


def test_stochastic_faults_are_reproducible_and_seeded(tmp_path):
    d = yaml.safe_load((ROOT / "scenarios" / "fault_mixed.yaml").read_text())
    d["workload"]["iterations"] = 10
    d["workload"]["model"] = {"base": "llama3.2-1b", "layers": 4}
    d["trace"] = {"path": str(tmp_path / "m.h5"), "tables": ["faults"]}
    a = _run(d)
    fa = read_table(a.trace_path, "faults")
    b = _run(d)
    fb = read_table(b.trace_path, "faults")
    c = _run(d, ["seed=5"])
    fc = read_table(c.trace_path, "faults")
    assert len(fa) > 0
    assert fa.equals(fb) and not fa.equals(fc)
    sa = {k: v for k, v in a.summary.items() if k != "wall_time_s"}
    sb = {k: v for k, v in b.summary.items() if k != "wall_time_s"}
    assert sa == sb
