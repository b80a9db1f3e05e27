"""Pareto sweeps: sweep-file validation, exhaustive and NSGA-II search, deformation under
boundary conditions, robust (multi-seed) fronts and the ``twin pareto`` command.

Fast tests use either a cheap twin configuration (4 layers, 4 devices, one iteration) or, for
the optimizer, a table of points evaluated by a surrogate cost model: NSGA-II and exhaustive
enumeration see identical inputs, so the comparison is exact.
"""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import ValidationError

from experiments import front as fr
from experiments.pareto import RunTask, run_point, run_sweep, write_outputs
from experiments.sweep import factorizations, load_sweep
from twin.kernel.errors import ScenarioError

ROOT = Path(__file__).resolve().parent.parent
OBJ = ["iteration_time_s", "energy_per_iteration_j"]

CHEAP4 = {
    "name": "cheap4", "seed": 7,
    "cluster": {"topology": {"kind": "torus2d", "shape": [2, 2]}, "device": "h100-sxm",
                "link": "nvlink4", "links_per_edge": 4},
    "workload": {"model": {"base": "llama3.2-1b", "layers": 4}, "precision": "bf16",
                 "seq_len": 256, "global_batch": 8, "micro_batch": 1,
                 "parallelism": {"dp": 4, "tp": 1, "pp": 1}, "iterations": 1},
}


def sweep_dict(**kw) -> dict:
    d = {"name": "t", "base": copy.deepcopy(CHEAP4),
         "space": {"parallelism": "all", "power.dvfs.frequency_mhz": [1980, 1260]}}
    d.update(kw)
    return d


def test_a_key_with_an_empty_part_is_one_problem_in_every_part_of_a_sweep_and_a_campaign():
    """``a..b`` is refused as what it is, at its place in the file, wherever a scenario key
    may be written: a sweep's ``set``, a dimension, an option's ``set``, a boundary
    condition's ``set``; a campaign's ``grid`` and ``overrides``."""
    from experiments.campaign import load_campaign

    cases = [
        (sweep_dict(set={"a..b": 1}), "set.a..b"),
        (sweep_dict(space={"a..b": [1, 2]}), "space.a..b"),
        (sweep_dict(space={"x": [{"label": "y", "set": {"a..b": 1}}]}), "space.x[0].a..b"),
        (sweep_dict(boundary_conditions=[{"name": "n", "set": {"workload.": 1}}]),
         "boundary_conditions[0].set.workload."),
    ]
    for d, path in cases:
        with pytest.raises(ScenarioError) as exc:
            load_sweep(d)
        (p,) = exc.value.problems
        assert p.path == path
        assert p.message.startswith("not a dotted scenario key: a part is empty")
    for change in ({"grid": {"a..b": [1]}}, {"overrides": {"": 1}}):
        with pytest.raises(ScenarioError) as exc:
            load_campaign({"name": "c", "base": copy.deepcopy(CHEAP4), "seeds": 1, **change})
        (p,) = exc.value.problems
        assert p.message == "not a dotted scenario key: a part is empty"


def test_a_constraint_whose_min_is_above_its_max_is_refused():
    """An empty interval would make every point infeasible after every run; it is an error
    of the sweep file. min == max is a (narrow) interval."""
    with pytest.raises(ScenarioError) as exc:
        load_sweep(sweep_dict(constraints={"avg_power_w": {"min": 10, "max": 1}}))
    (p,) = exc.value.problems
    assert p.path == "constraints.avg_power_w" and p.message.startswith("min is above max")
    load_sweep(sweep_dict(constraints={"avg_power_w": {"min": 5, "max": 5}}))


def brute_front(df: pd.DataFrame, cols: list[str]) -> set[str]:
    """Labels of the non-dominated feasible rows, by the definition."""
    ok = df[df.feasible.astype(bool)]
    F = ok[cols].to_numpy(dtype=float)
    keep = set()
    for i in range(len(F)):
        if not any((F[j] <= F[i]).all() and (F[j] < F[i]).any() for j in range(len(F))):
            keep.add(ok["label"].iloc[i])
    return keep


# ----------------------------------------------------------------------------- sweep files
def test_factorizations_are_all_triples():
    for n in (1, 6, 8, 16, 64):
        brute = {(a, b, c) for a in range(1, n + 1) for b in range(1, n + 1)
                 for c in range(1, n + 1) if a * b * c == n}
        assert set(factorizations(n)) == brute and len(factorizations(n)) == len(brute)


def test_space_enumerates_overrides_and_labels():
    sw = load_sweep(sweep_dict(space={
        "parallelism": {"tp": [1, 2]},
        "workload.micro_batch": [1, 2],
        "schedule": [{"label": "1f1b", "set": {"workload.schedule": "1f1b"}},
                     {"label": "gpipe", "set": {"workload.schedule": "gpipe"}}]}))
    sp = sw.space
    assert sp.shape == (5, 2, 2) and sp.size == 20 and len(list(sp.points())) == 20
    x = (3, 1, 1)  # factorizations of 4 with tp in {1, 2}, sorted by (tp, pp)
    assert sp.label(x) == "dp2-tp2-pp1 micro_batch=2 gpipe"
    assert sp.strategy(x) == "dp2-tp2-pp1"
    ov = sw.overrides("nominal", x, seed=5)
    assert ov["workload.parallelism.dp"] == 2 and ov["workload.parallelism.tp"] == 2
    assert ov["workload.micro_batch"] == 2 and ov["workload.schedule"] == "gpipe"
    assert ov["seed"] == 5 and ov["trace.enabled"] is False
    assert sp.decode(sp.values(x)) == x


def test_microbatches_dimension_sets_global_batch():
    sw = load_sweep(sweep_dict(space={"parallelism": [[4, 1, 1], [2, 2, 1]],
                                      "workload.micro_batch": [1, 2],
                                      "microbatches": [2, 4]},
                               objectives=["time_per_sequence_s", "energy_per_sequence_j"]))
    ov = sw.space.overrides((1, 1, 1))
    assert ov["workload.global_batch"] == 2 * 2 * 4


def _problems(d) -> list[str]:
    with pytest.raises(ScenarioError) as ei:
        load_sweep(d)
    return [str(p) for p in ei.value.problems]


def test_a_search_larger_than_the_run_limit_is_refused_before_any_run():
    """400 x 250 clocks x 2 boundary conditions = 200,000 exhaustive runs > 100,000; NSGA-II
    over the same space runs at most 24 x 21 points x 2; with a population of 10,000 over
    10,000 generations it could evaluate the whole space, and is refused too."""
    from experiments.many import MAX_RUNS

    big = {"workload.seq_len": list(range(64, 64 + 400)),
           "power.dvfs.frequency_mhz": list(range(1000, 1250))}
    two = [{"name": "a"}, {"name": "b", "set": {"cluster.link.bandwidth_gbps": 5}}]
    probs = _problems(sweep_dict(space=big, method="exhaustive", boundary_conditions=two))
    assert len(probs) == 1 and "space" in probs[0] and "200000 runs" in probs[0]
    assert f"limit of {MAX_RUNS}" in probs[0] and "nsga2" in probs[0]
    sw = load_sweep(sweep_dict(space=big, boundary_conditions=two))  # auto: NSGA-II
    assert sw.method_for() == "nsga2" and sw.most_runs("nsga2") == 24 * 21 * 2
    with pytest.raises(ScenarioError, match="exhaustive search could make 200000"):
        sw.method_for("exhaustive")  # `twin pareto --method exhaustive`
    probs = _problems(sweep_dict(space=big, boundary_conditions=two,
                                 nsga2={"pop_size": 10_000, "generations": 10_000}))
    assert len(probs) == 1 and "nsga2 search could make 200000" in probs[0]
    capped = sweep_dict(space=big, boundary_conditions=two, robust={"seeds": [1, 2]},
                        nsga2={"pop_size": 10_000, "generations": 10_000,
                               "max_evaluations": 25_000})
    assert load_sweep(capped).most_runs("nsga2") == 25_000 * 2 * 2


def test_sweep_errors_name_the_field_and_the_allowed_values(tmp_path):
    probs = _problems(sweep_dict(
        bogus=1,
        space={"workload.micro_batchx": [1, 2], "workload.schedule": ["1f1b", "zigzag"],
               "parallelism": [[2, 1, 1]]},
        objectives=["iteration_time", "energy_per_iteration_j"],
        boundary_conditions=[{"name": "a", "set": {"workload.schedule": "gpipe"}}]))
    text = "\n".join(probs)
    assert "bogus: unknown key" in text  # pydantic stage stops first
    probs = _problems(sweep_dict(
        space={"workload.micro_batchx": [1, 2], "workload.schedule": ["1f1b", "zigzag"],
               "parallelism": [[2, 1, 1]]},
        objectives=["iteration_time", "energy_per_iteration_j"],
        boundary_conditions=[{"name": "a", "set": {"workload.schedule": "gpipe"}}]))
    text = "\n".join(probs)
    assert "space.workload.micro_batchx[0].workload.micro_batchx: unknown key" in text
    assert "micro_batch" in text  # the allowed keys are listed
    assert "space.workload.schedule[1].workload.schedule" in text and "zigzag" in text
    assert "space.parallelism[0]: dp*tp*pp = 2 but the base cluster has 4 devices" in text
    assert "objectives[0]: unknown metric (given: 'iteration_time')" in text
    assert "boundary_conditions[0].set.workload.schedule: is also set by the design" in text
    missing = _problems({"name": "t", "base": str(tmp_path / "nope.yaml"),
                         "space": {"parallelism": "all"}})
    assert any(p.startswith("base: base scenario file not found") for p in missing)
    per_it = _problems(sweep_dict(space={"parallelism": "all", "microbatches": [1, 2]}))
    assert any("objectives: the global batch varies" in p for p in per_it)


def test_a_repeated_boundary_condition_name_is_reported_at_each_repeat_only():
    probs = _problems(sweep_dict(boundary_conditions=[{"name": "a"}, {"name": "b"},
                                                      {"name": "a"}, {"name": "a"}]))
    assert [p.split(":")[0] for p in probs] == ["boundary_conditions[2].name",
                                                "boundary_conditions[3].name"]


@pytest.mark.parametrize("bad", [[0, 4, 1], [4, -1, -1], [True, 4, 1], [2.0, 2, 1],
                                 ["4", 1, 1], [4, 1]])
def test_a_parallelism_option_is_three_positive_integers(bad):
    (p,) = _problems(sweep_dict(space={"parallelism": [[4, 1, 1], bad]}))
    assert p.startswith("space.parallelism")


def test_a_key_inside_a_list_of_fault_kinds_is_left_to_each_point():
    """``faults.0.factor``: the list's items are a union of fault kinds, so the key's type
    cannot be followed when the file is read; the dimension is accepted and each point's
    scenario checks it (a bad value makes that point invalid, not the file)."""
    base = copy.deepcopy(CHEAP4)
    base["faults"] = [{"kind": "straggler", "device": 0, "factor": 1.5, "time_s": 0.0}]
    sw = load_sweep(sweep_dict(base=base, space={"faults.0.factor": [1.5, 3.0]}))
    assert sw.space.shape == (2,)


def test_sweep_settings_take_their_documented_bounds():
    """Each bounded setting of a sweep file is accepted at its ends and refused past them."""
    from experiments.sweep import SweepSpec

    def ok(**kw):
        SweepSpec.model_validate(sweep_dict(**kw))

    def bad(**kw):
        with pytest.raises(ValidationError):
            SweepSpec.model_validate(sweep_dict(**kw))

    for n in (4, 10_000):
        ok(nsga2={"pop_size": n})
    for n in (1, 10_000):
        ok(nsga2={"generations": n})
    for n in (0, 2**63 - 1):
        ok(nsga2={"seed": n})
    for n in (1, 1_000_000):
        ok(exhaustive_limit=n)
    bad(nsga2={"pop_size": 3})
    bad(nsga2={"pop_size": 10_001})
    bad(nsga2={"generations": 0})
    bad(nsga2={"generations": 10_001})
    bad(nsga2={"seed": -1})
    bad(nsga2={"seed": 2**63})
    bad(exhaustive_limit=0)
    bad(exhaustive_limit=1_000_001)
    ok(robust={"seeds": [1]})
    bad(robust={"seeds": []})
    ok(shape={"jump_fraction": 1.0, "jump_median_factor": 1.0, "concavity_tol": 0.0})
    bad(shape={"jump_median_factor": 0.99})
    bad(shape={"concavity_tol": -0.001})


def test_the_readme_sweep_file_states_the_defaults():
    """The README's annotated sweep file shows every setting at its default (except the
    example's space, boundary conditions and seeds): the schema must use those values."""
    from experiments.sweep import SweepSpec

    text = (ROOT / "README.md").read_text()
    block = text.split("A sweep file:", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    shown = yaml.safe_load(block)
    spec = SweepSpec.model_validate({"name": "t", "base": "x.yaml", "space": {"a": [1]}})
    assert (shown["method"], shown["exhaustive_limit"]) == (spec.method, spec.exhaustive_limit)
    assert shown["nsga2"] == spec.nsga2.model_dump()
    assert shown["shape"] == spec.shape.model_dump()
    assert shown["objectives"] == list(spec.objectives)
    assert shown["reference_point"] == spec.reference_point
    robust = {k: v for k, v in shown["robust"].items() if k != "seeds"}
    assert robust == SweepSpec.model_validate(
        {"name": "t", "base": "x.yaml", "space": {"a": [1]},
         "robust": {"seeds": [1]}}).robust.model_dump(exclude={"seeds"})


def test_base_must_run_as_it_is():
    d = sweep_dict(set={"workload.parallelism.dp": 3})
    probs = _problems(d)
    assert any(p.startswith("base.workload.parallelism") for p in probs)


def test_every_sweep_file_in_the_library_loads():
    files = sorted((ROOT / "scenarios").glob("sweep_*.yaml"))
    assert len(files) >= 2
    for f in files:
        sw = load_sweep(f)
        assert sw.space.size >= 2


# ----------------------------------------------------------------------------- real runs
def test_run_point_records_invalid_and_infeasible_points():
    sw = load_sweep(sweep_dict(space={"parallelism": [[4, 1, 1]],
                                      "workload.precision": ["bf16", "fp4"],
                                      "cluster.device.hbm_gb": [80, 1]}))
    res = run_sweep(sw, progress=False)
    p = res.points.set_index("label")
    assert p.loc["dp4-tp1-pp1 precision=bf16 hbm_gb=80", "status"] == "ok"
    assert p.loc["dp4-tp1-pp1 precision=fp4 hbm_gb=80", "status"] == "invalid"
    assert "workload.precision" in p.loc["dp4-tp1-pp1 precision=fp4 hbm_gb=80", "reason"]
    infeasible = p.loc["dp4-tp1-pp1 precision=bf16 hbm_gb=1"]
    assert infeasible["status"] == "infeasible" and "out of HBM" in infeasible["reason"]
    assert res.meta["twin_runs"] == 1  # invalid / infeasible points cost no simulation
    assert list(res.fronts["nominal"]["label"]) == ["dp4-tp1-pp1 precision=bf16 hbm_gb=80"]


def test_an_option_that_never_runs_is_pointed_out():
    sw = load_sweep(sweep_dict(space={"parallelism": [[4, 1, 1], [1, 1, 4]],
                                      "power.dvfs.frequency_mhz": [1980, 1380]}))
    res = run_sweep(sw, progress=False)
    dead = res.meta["dead_options"]
    assert len(dead) == 1 and dead[0]["option"] == "1380" and dead[0]["points"] == 2
    assert "power.dvfs.frequency_mhz" in dead[0]["reason"]
    from experiments.pareto import format_report

    assert "space.power.dvfs.frequency_mhz = 1380 was invalid" in format_report(res)


def test_power_cap_constraint_marks_points():
    sw = load_sweep(sweep_dict(space={"parallelism": [[4, 1, 1]],
                                      "power.dvfs.frequency_mhz": [1980, 1530, 1080]}))
    free = run_sweep(sw, progress=False).points
    cap = float(free.avg_power_w.median())
    table = {tuple(int(i) for i in r.x.split("-")): r for _, r in free.iterrows()}

    def replay(task: RunTask) -> dict:  # the same runs, replayed: only the cap differs
        r = table[task.x]
        return {"status": "ok", "reason": "", **{c: float(r[c]) for c in
                                                 (*OBJ, "avg_power_w", "mfu")}}

    capped = run_sweep(load_sweep(sweep_dict(
        space={"parallelism": [[4, 1, 1]], "power.dvfs.frequency_mhz": [1980, 1530, 1080]},
        constraints={"avg_power_w": {"max": cap}})), progress=False, run_fn=replay).points
    for _, r in capped.iterrows():
        assert (r.status == "constraint") == (r.avg_power_w > cap)
        if r.status == "constraint":
            assert "avg_power_w" in r.reason and not r.feasible


@pytest.fixture(scope="module")
def deformed():
    """8 design points (4 strategies x 2 clocks) under four boundary conditions."""
    sw = load_sweep(sweep_dict(space={
        "parallelism": [[4, 1, 1], [2, 2, 1], [1, 2, 2], [1, 1, 4]],
        "power.dvfs.frequency_mhz": [1980, 1260]}, boundary_conditions=[
        {"name": "nominal"},
        {"name": "slow-links", "set": {"cluster.link.bandwidth_gbps": 2.5}},
        {"name": "link-down",
         "set": {"faults": [{"kind": "link_down", "time_s": 0.0, "link": [0, 1]}]}},
        # heavy-tailed HBM service: per-block memory-time multiplier, Pareto with x_m = 1
        {"name": "hbm-alpha-1.8",
         "set": {"faults": [{"kind": "hbm_degradation", "devices": "all", "time_s": 0.0,
                             "tail": {"name": "pareto", "alpha": 1.8, "mean": 1.8 / 0.8}}]}},
    ]))
    return sw, run_sweep(sw, progress=False)


def test_exhaustive_front_equals_brute_force(deformed):
    sw, res = deformed
    assert res.method == "exhaustive"
    assert len(res.points) == sw.space.size * 4
    for bc, f in res.fronts.items():
        pts = res.points[res.points.boundary == bc]
        assert set(f["label"]) == brute_front(pts, OBJ)


def test_boundary_conditions_deform_the_front(deformed):
    """Slower links cannot make any point faster; here they push the tensor-parallel
    strategies off the front, and the report says so."""
    _, res = deformed
    p = res.points.pivot(index="label", columns="boundary", values="iteration_time_s")
    for bc in ("slow-links", "link-down", "hbm-alpha-1.8"):  # none of them can speed up a run
        assert (p[bc] >= p["nominal"] * (1 - 1e-9)).all(), bc
    d = res.deformation
    assert d["baseline"] == "nominal"
    slow = d["boundaries"]["slow-links"]
    base_front = set(res.fronts["nominal"]["label"])
    slow_front = set(res.fronts["slow-links"]["label"])
    assert slow["left"] == sorted(base_front - slow_front)
    assert slow["joined"] == sorted(slow_front - base_front)
    assert slow["left"], "a 10x slower fabric should change the front here"
    assert all(slow["left_became"][lab] == "dominated" for lab in slow["left"])
    # hypervolume against the common reference point, recomputed independently
    ref = np.array(d["reference_point"])
    hv = {bc: fr.hypervolume(f[OBJ].to_numpy(), ref) for bc, f in res.fronts.items()}
    assert slow["hv"] == pytest.approx(hv["slow-links"])
    assert slow["hv_change"] == pytest.approx(hv["slow-links"] / hv["nominal"] - 1)
    assert slow["hv_change"] < -0.05
    assert d["boundaries"]["link-down"]["hv_change"] <= 1e-12
    hbm = d["boundaries"]["hbm-alpha-1.8"]
    assert hbm["hv_change"] < 0  # memory service never faster, sometimes much slower
    assert hbm["left"] == sorted(base_front - set(res.fronts["hbm-alpha-1.8"]["label"]))
    nominal = res.points[res.points.boundary == "nominal"].set_index("label")
    left_strats = {nominal.loc[lab, "strategy"] for lab in slow["left"]}
    assert set(slow["strategies_left"]) <= left_strats
    tab = res.deformation_table
    rows = tab[(tab.boundary == "slow-links") & (tab.change == "left")]
    assert sorted(rows.label) == slow["left"]


def test_heavy_tailed_hbm_service_is_flagged_not_passed_off_as_finite():
    """memory.service Pareto alpha 1.8 (infinite variance): the twin says its mean waits have
    no finite limit; the sweep carries that into points.csv and the report."""
    from experiments.pareto import format_report

    sw = load_sweep(sweep_dict(
        space={"parallelism": [[4, 1, 1]], "power.dvfs.frequency_mhz": [1980, 1260]},
        boundary_conditions=[
            {"name": "nominal"},
            {"name": "hbm-pareto-1.8", "set": {"memory.model": "queue",
                                               "memory.service": {"dist": "pareto",
                                                                  "alpha": 1.8}}}]))
    res = run_sweep(sw, progress=False)
    tail = res.points[res.points.boundary == "hbm-pareto-1.8"]
    assert tail.memory_variance_infinite.astype(bool).all()
    assert not res.points[res.points.boundary == "nominal"].memory_variance_infinite.any()
    cav = res.meta["caveats"]
    assert cav["nominal"] == {} and cav["hbm-pareto-1.8"]["memory_variance_infinite"][
        "points"] == 2
    assert "memory_variance_infinite" in res.deformation["boundaries"]["hbm-pareto-1.8"][
        "caveats"]
    assert "caveat: 2 point(s) with memory_variance_infinite" in format_report(res)


def test_outputs_are_written(deformed, tmp_path):
    _, res = deformed
    paths = {p.name for p in write_outputs(res, tmp_path)}
    assert {"points.csv", "runs.csv", "pareto.csv", "pareto.png", "shape.json",
            "deformation.json", "deformation.csv", "deformation.png", "report.txt",
            "report.json"} <= paths
    pts = pd.read_csv(tmp_path / "points.csv")
    assert {"boundary", "label", "strategy", "parallelism", "power.dvfs.frequency_mhz",
            "status", "feasible", "reason", *OBJ, "mfu", "avg_power_w"} <= set(pts.columns)
    par = pd.read_csv(tmp_path / "pareto.csv")
    for bc, g in par.groupby("boundary"):
        assert set(g.label) == brute_front(pts[pts.boundary == bc], OBJ)
    shape = json.loads((tmp_path / "shape.json").read_text())
    assert set(shape) == {"nominal", "slow-links", "link-down", "hbm-alpha-1.8"}
    assert (tmp_path / "pareto.png").stat().st_size > 10_000


def test_robust_fronts_of_mean_and_quantile():
    sw = load_sweep(sweep_dict(
        space={"parallelism": [[4, 1, 1], [1, 1, 4]],
               "power.dvfs.frequency_mhz": [1980, 1260]},
        set={"simulation.compute_jitter_cov": 0.2},
        robust={"seeds": [1, 2, 3], "quantile": 0.9}))
    res = run_sweep(sw, progress=False)
    runs, pts = res.runs, res.points
    assert len(runs) == 4 * 3
    assert runs.groupby("x").iteration_time_s.nunique().min() == 3  # seeds matter
    for _, r in pts.iterrows():
        v = runs[runs.x == r.x].iteration_time_s.to_numpy()
        assert r.iteration_time_s == pytest.approx(v.mean())
        assert r.iteration_time_s_p90 == pytest.approx(np.quantile(v, 0.9))
        assert r.iteration_time_s_std == pytest.approx(v.std(ddof=1))
    rob = res.robust["boundaries"]["nominal"]
    assert set(rob["mean"]["labels"]) == brute_front(pts, OBJ)
    assert set(rob["p90"]["labels"]) == brute_front(pts, [f"{c}_p90" for c in OBJ])
    assert set(res.robust_fronts.statistic) <= {"mean", "p90"}


def test_a_points_record_from_its_runs_by_hand():
    """``aggregate``: a dimension's value keeps its type (a number stays a number, a list or
    mapping is JSON); with two seeds the mean, the sample standard deviation (ddof 1) and the
    quantile of the two runs; a broken constraint's violation is the relative excess summed
    over the constraints, (700 - 500) / 500 + (0.6 - 0.5) / 0.6."""
    from experiments.pareto.evaluate import aggregate

    def run(t, e, w, mfu):
        return {"status": "ok", "reason": "", "iteration_time_s": t,
                "energy_per_iteration_j": e, "avg_power_w": w, "mfu": mfu}

    limits = {"avg_power_w": {"max": 500.0}, "mfu": {"min": 0.6}}
    one = load_sweep(sweep_dict(space={"parallelism": [[4, 1, 1]],
                                       "workload.micro_batch": [1, 2],
                                       "faults": [[]]},
                                constraints=limits))
    row = aggregate(one, "nominal", (0, 1, 0), [run(1.0, 2.0, 700.0, 0.5)])
    assert row["workload.micro_batch"] == 2 and row["faults"] == "[]"
    assert row["status"] == "constraint" and not row["feasible"]
    assert row["violation"] == pytest.approx(200.0 / 500.0 + 0.1 / 0.6, rel=1e-12)
    two = load_sweep(sweep_dict(space={"parallelism": [[4, 1, 1]]},
                                robust={"seeds": [1, 2], "quantile": 0.95}))
    row = aggregate(two, "nominal", (0,), [run(1.0, 2.0, 400.0, 0.7),
                                           run(3.0, 6.0, 450.0, 0.6)])
    assert row["status"] == "ok" and row["n_seeds"] == 2
    assert row["iteration_time_s"] == 2.0 and row["energy_per_iteration_j"] == 4.0
    assert row["iteration_time_s_std"] == pytest.approx(np.sqrt(2.0), rel=1e-12)
    assert row["iteration_time_s_p95"] == pytest.approx(1.0 + 0.95 * 2.0, rel=1e-12)


def test_same_scenario_same_points():
    sw = load_sweep(sweep_dict(space={"parallelism": [[4, 1, 1], [2, 2, 1]]}))
    a = run_sweep(sw, progress=False).points
    assert (a.energy_delay_product_js.to_numpy() == pytest.approx(
        (a.iteration_time_s * a.energy_per_iteration_j).to_numpy(), rel=1e-12))
    assert (a.time_per_sequence_s.to_numpy() == pytest.approx(
        (a.iteration_time_s / a.global_batch).to_numpy(), rel=1e-12))
    b = run_sweep(sw, progress=False).points
    pd.testing.assert_series_equal(a.iteration_time_s, b.iteration_time_s)
    pd.testing.assert_series_equal(a.energy_per_iteration_j, b.energy_per_iteration_j)


# ----------------------------------------------------------------------------- NSGA-II
PSTATES = {1980: 1.08, 1710: 0.915, 1530: 0.83, 1350: 0.765, 1170: 0.72, 990: 0.70,
           900: 0.70, 810: 0.70}


def surrogate(task: RunTask) -> dict:
    """A cheap cost model of 64 devices (alpha-beta communication, pipeline bubble, C V^2 f
    power): a realistic landscape for the optimizer with invalid and out-of-memory regions."""
    o = task.overrides
    dp, tp, pp = (o[f"workload.parallelism.{k}"] for k in ("dp", "tp", "pp"))
    mb, f = o["workload.micro_batch"], o["power.dvfs.frequency_mhz"]
    gb, n = 256, 64
    if tp > 8:
        return {"status": "invalid", "reason": "workload.parallelism.tp: > kv heads"}
    if gb % (dp * mb):
        return {"status": "invalid", "reason": "workload.global_batch: not a multiple"}
    m = gb // (dp * mb)
    mem = 120.0 / (tp * pp) + 6.0 * mb * pp / tp
    if mem > 80:
        return {"status": "infeasible", "reason": f"workload: out of HBM ({mem:.0f} GB)"}
    slow = 1980 / f
    t_comp = 1.0 / n * slow * (1 + 0.3 * (tp - 1) / (tp * mb) + 0.2 / mb)
    t_tp = 0.004 * (tp - 1) / tp * (1 + 0.5 * math.log2(tp))
    t_bubble = (pp - 1) / m * t_comp
    t_dp = 0.06 * (dp - 1) / dp / (tp * pp) ** 0.7
    t = t_comp + t_tp + t_bubble + t_dp
    util = t_comp / t
    v = PSTATES[f] / 1.08
    p_dev = 90 + 560 * util * v ** 2 * (f / 1980) + 40 * v ** 2
    return {"status": "ok", "reason": "", "iteration_time_s": t,
            "energy_per_iteration_j": n * p_dev * t, "avg_power_w": n * p_dev,
            "mfu": 0.4 * util / slow}


def surrogate_sweep(**nsga2) -> dict:
    return {
        "name": "surrogate",
        "base": {"name": "b64", "cluster": {"topology": {"kind": "torus2d", "shape": [8, 8]},
                                            "device": "h100-sxm", "link": "nvlink4"},
                 "workload": {"model": "llama3.2-1b", "seq_len": 512, "global_batch": 256,
                              "parallelism": {"dp": 64}}},
        "space": {"parallelism": "all", "power.dvfs.frequency_mhz": list(PSTATES),
                  "workload.micro_batch": [1, 2, 4, 8]},
        "nsga2": {"pop_size": 20, "generations": 15, **nsga2},
    }


@pytest.fixture(scope="module")
def exhaustive_surrogate():
    sw = load_sweep(surrogate_sweep())
    res = run_sweep(sw, method="exhaustive", run_fn=surrogate, progress=False)
    F = res.fronts["nominal"][OBJ].to_numpy()
    ref = fr.reference_point([F])
    return res, ref, fr.hypervolume(F, ref)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_nsga2_reaches_95_percent_of_the_exhaustive_hypervolume(exhaustive_surrogate, seed):
    ex, ref, hv_ex = exhaustive_surrogate
    assert ex.meta["space_size"] == 28 * 8 * 4 and len(ex.fronts["nominal"]) >= 8
    sw = load_sweep(surrogate_sweep(seed=seed))
    res = run_sweep(sw, method="nsga2", run_fn=surrogate, progress=False)
    F = res.fronts["nominal"][OBJ].to_numpy()
    assert fr.hypervolume(F, ref) >= 0.95 * hv_ex
    assert res.meta["fraction_of_space"]["nominal"] < 0.4
    # every NSGA-II point is a real point with the exhaustive run's values
    merged = res.points.merge(ex.points, on="label", suffixes=("", "_ex"))
    assert len(merged) == len(res.points)
    ok = merged.status == "ok"
    assert (merged[ok].iteration_time_s == merged[ok].iteration_time_s_ex).all()
    conv = res.convergence
    assert conv.evaluated_points.is_monotonic_increasing
    assert conv.hv.is_monotonic_increasing  # the archive's front only improves


def test_nsga2_same_seed_same_front_and_no_point_run_twice():
    calls: Counter = Counter()

    def counting(task: RunTask) -> dict:
        calls[(task.boundary, task.x, task.seed)] += 1
        return surrogate(task)

    sw = load_sweep(surrogate_sweep(seed=7, generations=10))
    a = run_sweep(sw, method="nsga2", run_fn=counting, progress=False)
    assert max(calls.values()) == 1
    assert sum(calls.values()) == len(a.points)
    b = run_sweep(sw, method="nsga2", run_fn=surrogate, progress=False)
    assert list(a.points.label) == list(b.points.label)
    assert list(a.fronts["nominal"].label) == list(b.fronts["nominal"].label)
    c = run_sweep(sw, method="nsga2", seed=8, run_fn=surrogate, progress=False)
    assert list(c.points.label) != list(a.points.label)


@pytest.mark.parametrize("method", ["exhaustive", "nsga2"])
def test_a_sweep_where_nothing_runs_still_reports(tmp_path, method):
    d = surrogate_sweep()
    d["space"] = {"parallelism": [[64, 1, 1]], "power.dvfs.frequency_mhz": [1980, 1530],
                  "workload.micro_batch": [1, 2]}  # dp64 does not fit: all infeasible
    d["boundary_conditions"] = [{"name": "a"}, {"name": "b", "set": {"seed": 3}}]
    d["robust"] = {"seeds": [1, 2]}
    res = run_sweep(load_sweep(d), method=method, run_fn=surrogate, progress=False)
    assert (res.points.status == "infeasible").all()
    assert all(f.empty for f in res.fronts.values())
    names = {p.name for p in write_outputs(res, tmp_path)}
    assert {"points.csv", "pareto.csv", "pareto.png", "report.txt"} <= names
    text = (tmp_path / "report.txt").read_text()
    assert "infeasible" in text and "out of HBM" in text  # the reason reaches the report
    assert res.deformation["boundaries"]["b"]["hv_change"] is None


def test_auto_method_picks_by_space_size():
    sw = load_sweep(surrogate_sweep())
    assert sw.method_for("auto") == "nsga2"
    small = load_sweep(sweep_dict())
    assert small.method_for("auto") == "exhaustive"


def test_errors_in_runs_are_recorded_not_raised():
    def broken(task: RunTask) -> dict:
        if task.x[0] == 0:
            raise RuntimeError("simulated crash")
        return surrogate(task)

    sw = load_sweep(surrogate_sweep())
    sw2 = load_sweep({**surrogate_sweep(), "space": {
        "parallelism": [[64, 1, 1], [32, 2, 1]], "power.dvfs.frequency_mhz": [1980],
        "workload.micro_batch": [1]}})
    assert sw.space.size > sw2.space.size
    res = run_sweep(sw2, run_fn=broken, progress=False)
    p = res.points.set_index("x")
    assert p.loc["0-0-0", "status"] == "error" and "simulated crash" in p.loc["0-0-0", "reason"]
    assert p.loc["1-0-0", "status"] == "ok"


def test_run_point_is_a_twin_run():
    sw = load_sweep(sweep_dict(space={"parallelism": [[4, 1, 1]],
                                      "power.dvfs.frequency_mhz": [1980]}))
    x = (0, 0)
    row = run_point(RunTask("nominal", x, None, sw.base, sw.overrides("nominal", x, None)))
    from twin.api import load_scenario, run

    direct = run(load_scenario(sw.base, sw.overrides("nominal", x, None))).summary
    assert row["status"] == "ok"
    assert row["iteration_time_s"] == direct["iteration_time_s"]
    assert row["time_per_sequence_s"] == pytest.approx(direct["iteration_time_s"] / 8)


# ----------------------------------------------------------------------------- CLI
def test_cli_pareto_on_dask(tmp_path, capsys):
    from twin.cli import main

    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(sweep_dict(space={
        "parallelism": [[4, 1, 1], [1, 1, 4]], "power.dvfs.frequency_mhz": [1980, 1260]})))
    out = tmp_path / "out"
    assert main(["pareto", str(sweep), "-o", str(out), "--workers", "1", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "front:" in text and "points.csv" in text
    pts = pd.read_csv(out / "points.csv")
    assert len(pts) == 4 and (pts.status == "ok").all()
    assert (out / "pareto.png").is_file()


def test_cli_resume_reuses_recorded_runs(tmp_path, capsys):
    from twin.cli import main

    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(sweep_dict(space={
        "parallelism": [[4, 1, 1], [2, 2, 1]], "power.dvfs.frequency_mhz": [1980, 1260]})))
    out = tmp_path / "out"
    args = ["pareto", str(sweep), "-o", str(out), "--workers", "0", "--quiet", "--no-plots"]
    assert main(args) == 0
    first = pd.read_csv(out / "points.csv")
    journal = out / "runs.jsonl"
    lines = journal.read_text().splitlines()
    assert len(lines) == 4
    journal.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])  # torn
    assert main([*args, "--resume"]) == 0
    meta = json.loads((out / "report.json").read_text())["meta"]
    assert meta["resumed_runs"] == 3 and meta["twin_runs"] == 1
    again = pd.read_csv(out / "points.csv")
    pd.testing.assert_frame_equal(first.drop(columns="wall_time_s"),
                                  again.drop(columns="wall_time_s"))
    # a record whose point lies outside the space (an edited journal, or a sweep that lost
    # options) is run again, not reused or fingerprinted
    recs = []
    for line in journal.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass  # the torn line written before
    assert len(recs) == 4
    recs[0]["x"] = [0, 7]
    journal.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main([*args, "--resume"]) == 0
    meta = json.loads((out / "report.json").read_text())["meta"]
    assert meta["resumed_runs"] == 3 and meta["twin_runs"] == 1
    # a changed sweep invalidates the recorded runs of the points it changes
    sweep.write_text(yaml.safe_dump(sweep_dict(
        space={"parallelism": [[4, 1, 1], [2, 2, 1]], "power.dvfs.frequency_mhz": [1980, 1260]},
        set={"cluster.link.bandwidth_gbps": 20})))
    assert main([*args, "--resume"]) == 0
    meta = json.loads((out / "report.json").read_text())["meta"]
    assert meta["resumed_runs"] == 0 and meta["twin_runs"] == 4
    capsys.readouterr()


def test_cli_bad_sweep_exits_2(tmp_path, capsys):
    from twin.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbase: nope.yaml\nspace: {parallelism: all}\n")
    assert main(["pareto", str(bad), "-o", str(tmp_path / "o")]) == 2
    assert "base: base scenario file not found" in capsys.readouterr().err
    assert main(["pareto", str(tmp_path / "missing.yaml"), "-o", str(tmp_path / "o")]) == 2
    # the search seed given on the command line: the range nsga2.seed allows, named as given
    good = ROOT / "scenarios" / "sweep_small.yaml"
    for seed in ("-1", str(2**63)):
        capsys.readouterr()
        assert main(["pareto", str(good), "-o", str(tmp_path / "o"), "--method", "nsga2",
                     "--seed", seed, "--workers", "0"]) == 2
        assert f"--seed: out of range (given: {seed})" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # a reference front without the sweep's objective columns, or not a CSV: named, not a
    # traceback (nor silently left out of the convergence table)
    for name, content in (("cols.csv", b"a,b\n1,2\n"), ("bin.csv", b"\xff\x00\x01")):
        (tmp_path / name).write_bytes(content)
        capsys.readouterr()
        assert main(["pareto", str(good), "-o", str(tmp_path / "o"), "--method", "nsga2",
                     "--reference", str(tmp_path / name), "--workers", "0"]) == 2
        assert "--reference: reference front file" in capsys.readouterr().err


def test_cli_help(capsys):
    from twin.cli import main

    with pytest.raises(SystemExit) as ei:
        main(["pareto", "--help"])
    assert ei.value.code == 0
    assert "--scheduler" in capsys.readouterr().out


# ----------------------------------------------------------------------------- real twin
def test_nsga2_on_the_real_twin_reaches_95_percent_of_exhaustive():
    """The small library sweep (60 points, nominal boundary): NSGA-II with a population of 10
    for 4 generations vs the enumerated front, on identical twin runs, on average over ten
    seeds (one search is a sample: in session 39 seeds 1-10 reached 93-100% of the front's
    hypervolume, seeds 1-20 69-100%, mean 98%)."""
    d = load_sweep(ROOT / "scenarios" / "sweep_small.yaml")
    spec = d.spec.model_dump()
    spec["boundary_conditions"] = [{"name": "nominal"}]
    spec["base"] = str(ROOT / "scenarios" / "quickstart.yaml")
    spec["nsga2"] = {"pop_size": 10, "generations": 4, "seed": 1}
    sw = load_sweep(spec)
    ex = run_sweep(sw, method="exhaustive", progress=False)
    assert len(ex.points) == sw.space.size
    runs = {r.x: r for _, r in ex.runs.iterrows()}

    def replay(task: RunTask) -> dict:  # the exhaustive run's twin results, not new runs
        return dict(runs["-".join(map(str, task.x))].dropna())

    F_ex = ex.fronts["nominal"][OBJ].to_numpy()
    ref = fr.reference_point([F_ex])
    reached = []
    for seed in range(1, 11):
        spec["nsga2"]["seed"] = seed
        res = run_sweep(load_sweep(spec), method="nsga2", run_fn=replay, progress=False)
        reached.append(fr.hypervolume(res.fronts["nominal"][OBJ].to_numpy(), ref)
                       / fr.hypervolume(F_ex, ref))
        assert res.meta["fraction_of_space"]["nominal"] < 1.0
    assert np.mean(reached) >= 0.95, reached


@pytest.mark.parametrize("ref", [[0.0, 1.0], [1.0, -2.0], [math.inf, 1.0], [1.0, math.nan]])
def test_a_reference_point_must_be_two_finite_positive_numbers(ref):
    from twin.kernel.errors import ScenarioError

    with pytest.raises(ScenarioError, match="reference_point"):
        load_sweep(sweep_dict(reference_point=ref))
    assert load_sweep(sweep_dict(reference_point=[0.5, 1e3])).spec.reference_point == (0.5,
                                                                                       1e3)


def test_a_runs_record_carries_the_per_sequence_figures_and_the_limits():
    """``metrics_row`` from a scenario and a summary written here: time and energy per
    sequence are the iteration's over the global batch, the microbatches per replica
    global / (dp x micro), and each limit's orders of magnitude a column of its own."""
    from experiments.pareto.evaluate import metrics_row
    from twin.scenario import load_scenario

    scen = load_scenario(CHEAP4, ["workload.global_batch=16", "workload.micro_batch=2",
                                  "workload.parallelism.dp=2", "workload.parallelism.tp=2"])
    summary = {"iteration_time_s": 2.0, "energy_per_iteration_j": 800.0,
               "limits_orders_of_magnitude": {"roofline": 0.5, "landauer": None}}
    row = metrics_row(scen, summary)
    assert row["time_per_sequence_s"] == 2.0 / 16 and row["energy_per_sequence_j"] == 50.0
    assert row["energy_delay_product_js"] == 1600.0 and row["microbatches"] == 4
    assert row["roofline_orders_of_magnitude"] == 0.5
    assert math.isnan(row["landauer_orders_of_magnitude"])
