"""Fault campaigns: Dask workers, kill + resume without lost or duplicated runs, determinism,
statistics whose intervals cover at their stated rate."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import ROOT, scenario_dict
from twin.cli import main
from twin.trace import read_attrs, read_table


def _campaign_file(tmp_path, name="kill", seeds=8, iterations=8, layers=16, **extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    base = scenario_dict(workload__iterations=iterations,
                         workload__model={"base": "llama3.2-1b", "layers": layers})
    base["job"] = {"checkpoint_interval_iterations": 2, "checkpoint_write_s": 0.005,
                   "restart_s": 0.02}
    base["faults"] = [
        {"kind": "accelerator_failure", "devices": "all",
         "ttf": {"dist": "exponential", "mean_s": 2.0}},
        {"kind": "straggler", "devices": "all", "factor": 1.5,
         "ttf": {"dist": "exponential", "mean_s": 1.0}, "ttr": {"dist": "fixed", "value_s": 0.05}},
    ]
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    camp = {"name": name, "base": "base.yaml", "seeds": seeds, "baseline": False,
            "bootstrap": 200, **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(camp))
    return path


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the campaign driver and the worker processes it started (by pid)."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for c in children:
        try:
            c.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=10)


@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")  # another cluster's dashboard
def test_kill_midway_then_resume_gives_each_run_once(tmp_path, capsys):
    """8 seeds on 2 local Dask workers; the driver and its workers are killed after a few runs
    finished; --resume (in this process) runs the rest: exactly 8 rows, 8 records, 8 complete
    traces; runs done on the workers come out the same when redone in this process."""
    camp = _campaign_file(tmp_path, layers=4)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "twin.cli", "campaign", str(camp), "-o", str(out),
           "--workers", "2", "--quiet", "--no-plots"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    runs = out / "runs"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            done = list(runs.glob("*.json")) if runs.exists() else []
            if len(done) >= 2:
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            _kill_tree(proc)
    done_before = len(list(runs.glob("*.json")))
    assert 2 <= done_before < 8, f"kill did not land midway ({done_before} runs finished)"
    assert not (out / "results.parquet").exists()

    # resumed in this process (without Dask: the journal is the same whatever runs the rest)
    assert main([*cmd[3:-4], "--workers", "0", "--resume", "--quiet", "--no-plots"]) == 0
    assert f"ran {8 - done_before}, kept {done_before}" in capsys.readouterr().out
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 8 and table.run_id.is_unique
    assert sorted(table.seed) == list(range(8))
    assert len(list(runs.glob("*.json"))) == 8
    traces = sorted((out / "traces").iterdir())
    assert [t.suffix for t in traces] == [".h5"] * 8  # no partial files left
    for t in traces:
        assert read_attrs(t)["complete"]
        assert len(read_table(t, "ops")) > 0
    assert table.completed.all() and (table.restarts > 0).any()

    # runs done on the Dask workers before the kill, computed again in this process (their
    # records and traces deleted, --resume without Dask): the same table
    first = sorted(runs.glob("*.json"))[:done_before]
    for rec in first:
        rec.unlink()
        (out / "traces" / f"{rec.stem}.h5").unlink()
    assert main(["campaign", str(camp), "-o", str(out), "--workers", "0", "--resume",
                 "--quiet", "--no-plots"]) == 0
    pd.testing.assert_frame_equal(table, pd.read_parquet(out / "results.parquet"))


def test_campaign_grid_baseline_tables_and_plots(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a run that wrote its scenario's trace would write it here
    camp = _campaign_file(tmp_path, name="grid", seeds=3, iterations=4, layers=2,
                          baseline=True, grid={"faults.1.factor": [1.5, 3.0]}, traces=False)
    out = tmp_path / "g"
    t0 = time.perf_counter()
    assert main(["campaign", str(camp), "-o", str(out), "--workers", "0", "--quiet"]) == 0
    elapsed = time.perf_counter() - t0
    assert not list(tmp_path.rglob("*.h5"))  # traces: false writes no trace anywhere
    for rec in (out / "runs").glob("*.json"):
        assert 0 < json.loads(rec.read_text())["timing"]["wall_s"] < elapsed
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 2 * 2 * 3
    assert set(table.variant) == {"faults", "baseline"}
    assert sorted(table["faults.1.factor"].unique()) == [1.5, 3.0]
    base = table[table.variant == "baseline"]
    assert (base.restarts == 0).all() and (base.availability == 1.0).all()
    assert (table.bytes_sent == table.bytes_received + table.bytes_dropped).all()
    its = pd.read_parquet(out / "iterations.parquet")
    assert len(its) == table.iterations_completed.sum()
    stats = pd.read_csv(out / "stats.csv")
    assert {"iteration_time_s(pooled)", "energy_j", "goodput"} <= set(stats.metric)
    for (point, variant), runs in table.groupby(["point", "variant"]):
        cell = stats[(stats.point == point) & (stats.variant == variant)].set_index("metric")
        pooled = its[its.run_id.isin(runs.run_id)].iteration_time_s.to_numpy()
        row = cell.loc["iteration_time_s(pooled)"]
        assert row.n == len(pooled) and row["mean"] == pytest.approx(pooled.mean(), rel=1e-12)
        for q in (50, 95, 99):  # the estimates themselves (their intervals: tests below)
            assert row[f"p{q}"] == pytest.approx(np.quantile(pooled, q / 100), rel=1e-12)
        energy = cell.loc["energy_j"]
        assert energy["mean"] == pytest.approx(runs.energy_j.mean(), rel=1e-12)
        assert energy.p50 == pytest.approx(np.median(runs.energy_j), rel=1e-12)
    for png in ("ccdf_iteration_time.png", "energy_vs_availability.png"):
        assert (out / png).stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "p99 [CI]" in printed and "goodput" in printed
    # the same campaign with the same seeds: the same tables
    again = tmp_path / "g2"
    assert main(["campaign", str(camp), "-o", str(again), "--workers", "0", "--quiet",
                 "--no-plots"]) == 0
    pd.testing.assert_frame_equal(table, pd.read_parquet(again / "results.parquet"))
    pd.testing.assert_frame_equal(its, pd.read_parquet(again / "iterations.parquet"))
    pd.testing.assert_frame_equal(stats, pd.read_csv(again / "stats.csv"))
    # the directory holds this campaign now: without --resume it is refused (exit 2)
    assert main(["campaign", str(camp), "-o", str(out), "--workers", "0"]) == 2
    assert main(["campaign", str(camp), "-o", str(out), "--workers", "0", "--resume",
                 "--quiet", "--no-plots"]) == 0
    assert "ran 0, kept 12" in capsys.readouterr().out


def test_campaign_input_errors_exit_2(tmp_path, capsys):
    camp = _campaign_file(tmp_path, name="valid", seeds=2)
    raw = yaml.safe_load(camp.read_text())
    for change, where in (({"sedes": 3}, "sedes"),
                          ({"grid": {"faults.1.factor": [-1.0]}}, "faults.1.factor"),
                          ({"base": "missing.yaml"}, "base"),
                          ({"seeds": 0}, "seeds")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({**raw, **change}))
        assert main(["campaign", str(bad), "-o", str(tmp_path / "x"), "--workers", "0"]) == 2
        assert where in capsys.readouterr().err
    other = _campaign_file(tmp_path / "o_src", name="other", seeds=1, iterations=2,
                           layers=2)
    assert main(["campaign", str(other), "-o", str(tmp_path / "o"), "--workers", "0",
                 "--quiet", "--no-plots"]) == 0
    capsys.readouterr()
    assert main(["campaign", str(camp), "-o", str(tmp_path / "o"), "--workers", "0",
                 "--resume"]) == 2
    assert "different campaign" in capsys.readouterr().err


def test_a_scheduler_address_that_is_not_one_is_a_field_error(tmp_path, capsys):
    """``--scheduler nonsense`` (no port): exit 2 naming ``--scheduler``, no traceback, no
    run made."""
    camp = _campaign_file(tmp_path, name="bad_sched", seeds=2, iterations=1, layers=2)
    assert main(["campaign", str(camp), "-o", str(tmp_path / "o"), "--scheduler",
                 "nonsense", "--quiet", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "--scheduler" in err and "nonsense" in err and "Traceback" not in err
    assert not list((tmp_path / "o").glob("runs/*.json"))


def test_campaign_on_an_existing_scheduler(tmp_path):
    """--scheduler ADDRESS: the tasks go to a cluster that was already running (here an
    in-process one with 2 thread workers) and the table equals the in-process run's."""
    from dask.distributed import LocalCluster

    camp = _campaign_file(tmp_path, name="sched", seeds=3, iterations=2, layers=2)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster:
        assert main(["campaign", str(camp), "-o", str(tmp_path / "a"), "--scheduler",
                     cluster.scheduler_address, "--quiet", "--no-plots"]) == 0
    assert main(["campaign", str(camp), "-o", str(tmp_path / "b"), "--workers", "0",
                 "--quiet", "--no-plots"]) == 0
    a = pd.read_parquet(tmp_path / "a" / "results.parquet")
    assert len(a) == 3 and len(list((tmp_path / "a" / "traces").glob("*.h5"))) == 3
    pd.testing.assert_frame_equal(a, pd.read_parquet(tmp_path / "b" / "results.parquet"))


def _square_or_fail(x: int) -> int:
    if x == 7:
        raise ValueError("seven")
    return x * x


def test_the_task_runner_keeps_a_window_of_tasks_in_flight():
    """On Dask at most ``window`` tasks are unfinished at once (the next one is submitted
    before a finished one is handed back, so the caller sees at most window + 1 tasks out);
    every task comes back once, with its result or its own exception."""
    from dask.distributed import Client, LocalCluster

    from experiments.many import TaskRunner

    class Counting:  # a client that counts the futures handed out and not yet yielded
        def __init__(self, client):
            self.client, self.live, self.peak = client, 0, 0

        def submit(self, *args, **kwargs):
            self.live += 1
            self.peak = max(self.peak, self.live)
            return self.client.submit(*args, **kwargs)

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        counting = Counting(client)
        seen = {}
        for task, result in TaskRunner(_square_or_fail, counting, progress=False,
                                       window=3).map(range(20)):
            counting.live -= 1
            seen[task] = result
    assert counting.peak == 3 + 1
    assert sorted(seen) == list(range(20))
    assert isinstance(seen.pop(7), ValueError)
    assert seen == {x: x * x for x in seen}
    with pytest.raises(ValueError, match="window"):
        TaskRunner(_square_or_fail, window=0)


def test_campaign_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["campaign", "--help"])
    assert exc.value.code == 0 and "--resume" in capsys.readouterr().out


def test_campaign_in_the_library_validates():
    from experiments.campaign import load_campaign

    camp = load_campaign(ROOT / "scenarios" / "campaign_faults.yaml")
    assert len(camp.runs) == 2 * 2 * 16
    assert len({r.run_id for r in camp.runs}) == len(camp.runs)


def test_order_statistic_intervals_cover():
    """Distribution-free quantile intervals cover the true quantile at least at their level
    (exponential data, where the quantiles are known: -ln(1 - q))."""
    from experiments.campaign import quantile_ci

    rng = np.random.default_rng(11)
    for q, n in ((0.5, 30), (0.95, 100), (0.99, 600)):
        truth = -np.log(1 - q)
        hits = []
        for _ in range(400):
            _, lo, hi = quantile_ci(rng.exponential(size=n), q, 0.95)
            hits.append(lo <= truth <= hi)
        cover = np.mean(hits)
        assert cover >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / 400), (q, n, cover)
    _est, lo, hi = quantile_ci(rng.exponential(size=8), 0.99)
    assert np.isfinite(lo) and np.isnan(hi)  # too few runs for an upper bound: said so


def _order_statistic_ranks(n: int, q: float, confidence: float) -> tuple[int, int]:
    """1-based ranks of the equal-tailed distribution-free interval, from the Binomial(n, q)
    CDF summed here: the lower rank is the smallest k with P(B <= k) >= a, the upper one more
    than the smallest k with P(B <= k) >= 1 - a, a = (1 - confidence) / 2."""
    a = (1.0 - confidence) / 2.0
    cdf = np.cumsum([math.comb(n, k) * q ** k * (1 - q) ** (n - k) for k in range(n + 1)])
    return int(np.argmax(cdf >= a)), int(np.argmax(cdf >= 1 - a)) + 1


@pytest.mark.parametrize(("n", "q", "confidence"), [(100, 0.5, 0.95), (30, 0.9, 0.9),
                                                    (200, 0.99, 0.95), (12, 0.25, 0.8)])
def test_order_statistic_intervals_are_the_binomial_ranks(n, q, confidence):
    """On the sample 1..n the interval is its ranks: the textbook 95% interval of the median
    of 100 is [x_(40), x_(61)]; the others from the binomial written out in the test."""
    from experiments.campaign import quantile_ci

    lo_rank, hi_rank = _order_statistic_ranks(n, q, confidence)
    if (n, q) == (100, 0.5):
        assert (lo_rank, hi_rank) == (40, 61)
    x = np.arange(1.0, n + 1.0)
    est, lo, hi = quantile_ci(x[::-1], q, confidence)  # (the order of the runs is irrelevant)
    assert est == np.quantile(x, q)
    assert lo == x[lo_rank - 1] if lo_rank >= 1 else math.isnan(lo)
    assert hi == x[hi_rank - 1] if hi_rank <= n else math.isnan(hi)


def test_campaign_statistics_settings_take_their_documented_bounds():
    """``bootstrap`` 100..100000 and ``stats_seed`` 0..2**63-1 are accepted at their ends and
    refused one past them."""
    from experiments.campaign import load_campaign
    from twin.kernel.errors import ScenarioError

    base = scenario_dict()
    for key, ok, bad in (("bootstrap", (100, 100_000), (99, 100_001)),
                         ("stats_seed", (0, 2**63 - 1), (-1, 2**63))):
        for value in ok:
            load_campaign({"name": "c", "base": base, key: value})
        for value in bad:
            with pytest.raises(ScenarioError, match=key):
                load_campaign({"name": "c", "base": base, key: value})


def test_run_bootstrap_intervals_cover_the_mean():
    """Run bootstrap of a pooled mean (ratio of sums, what the campaign uses) and the generic
    group bootstrap: coverage of the true mean 1 of exponential data, 30 runs of 5-15."""
    from experiments.campaign import bootstrap_ci, ratio_ci

    rng = np.random.default_rng(3)
    hits, hits_generic = [], []
    for i in range(400):
        groups = [rng.exponential(size=rng.integers(5, 15)) for _ in range(30)]
        _, lo, hi = ratio_ci([g.sum() for g in groups], [len(g) for g in groups], 1000, 0.95,
                             rng)
        hits.append(lo <= 1.0 <= hi)
        if i < 60:
            _, lo, hi = bootstrap_ci(groups, lambda gs: float(np.mean(np.concatenate(gs))),
                                     200, 0.95, rng)
            hits_generic.append(lo <= 1.0 <= hi)
    # the percentile bootstrap undercovers a little at 30 runs: allow 2 points besides noise
    assert np.mean(hits) >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / 400) - 0.02
    assert np.mean(hits_generic) >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / 60) - 0.02


def test_a_seed_among_the_overrides_or_a_repeated_grid_value_is_refused():
    """The campaign sets each run's seed itself, so a ``seed`` in ``overrides`` or ``grid``
    would be silently ignored; a grid value given twice would run the same point twice under
    two ids. Both are errors naming the field; the distinct version of each loads."""
    from experiments.campaign import load_campaign
    from twin.kernel.errors import ScenarioError

    base = scenario_dict()
    for change, field in (({"overrides": {"seed": 5}}, "overrides.seed"),
                          ({"grid": {"seed": [1, 2]}}, "grid.seed"),
                          ({"grid": {"workload.iterations": [1, 2, 1]}},
                           "grid.workload.iterations")):
        with pytest.raises(ScenarioError) as err:
            load_campaign({"name": "c", "base": base, "seeds": 1, **change})
        assert [p.path for p in err.value.problems] == [field]
    camp = load_campaign({"name": "c", "base": base, "seeds": 1,
                          "grid": {"workload.iterations": [1, 2]}})
    assert len(camp.runs) == 2 * 2  # two points, with and without faults


def test_repeated_seeds_and_runs_past_the_limit_are_refused():
    """A seed listed twice would run twice under one id; a negative one is the schema's
    error. The run count is seeds x variants (2 with the baseline) x grid points: 50,001
    seeds make 100,002 runs with the baseline, past the limit of 100,000, and 50,001
    without it."""
    from experiments.campaign import load_campaign
    from experiments.many import MAX_RUNS
    from twin.kernel.errors import ScenarioError

    base = scenario_dict()
    for seeds, words in (([3, 1, 3], "seeds must be distinct"), ([1, -1], "seeds")):
        with pytest.raises(ScenarioError, match=words):
            load_campaign({"name": "c", "base": base, "seeds": seeds})
    n = MAX_RUNS // 2 + 1
    with pytest.raises(ScenarioError, match=f"would make {2 * n} runs"):
        load_campaign({"name": "c", "base": base, "seeds": n})
    assert len(load_campaign({"name": "c", "base": base, "seeds": n,
                              "baseline": False}).runs) == n


def test_a_bootstrap_interval_of_a_mean_is_the_normal_one():
    """100 standard normal values, one per group: the 95% percentile-bootstrap interval of
    the mean is mean +- 1.96 s / sqrt(n) (s with divisor n, the bootstrap's), within 10%
    on each side (2000 resamples: the 2.5% and 97.5% quantiles of the resampled means are
    each within a few % of their normal values)."""
    from experiments.campaign import bootstrap_ci

    rng = np.random.default_rng(11)
    x = rng.standard_normal(100)
    est, lo, hi = bootstrap_ci([np.array([v]) for v in x],
                               lambda gs: float(np.mean(np.concatenate(gs))), 2000, 0.95,
                               np.random.default_rng(12))
    half = 1.96 * x.std() / np.sqrt(len(x))
    assert est == pytest.approx(x.mean(), rel=1e-12)
    assert est - lo == pytest.approx(half, rel=0.10)
    assert hi - est == pytest.approx(half, rel=0.10)


def test_campaign_statistics_by_hand():
    """Per-run metrics: the quantile columns are the order-statistic interval around the
    sample quantile (lo <= estimate <= hi); lost work per interruption is sum(lost) /
    sum(interruptions) (a single interruption is enough for the row)."""
    import pandas as pd

    from experiments.campaign import STAT_METRICS, campaign_stats, quantile_ci

    n = 40
    rng = np.random.default_rng(5)
    res = pd.DataFrame({"point": 0, "variant": "faults", "run_id": [f"r{i}" for i in range(n)],
                        **{m: rng.exponential(size=n) for m in STAT_METRICS},
                        "interruptions": [1] + [0] * (n - 1)})
    res["lost_work_s"] = [2.5] + [0.0] * (n - 1)
    its = pd.DataFrame({"point": 0, "variant": "faults", "run_id": res["run_id"],
                        "iteration_time_s": res["iteration_time_s"]})
    st = campaign_stats(res, its).set_index("metric")
    row = st.loc["energy_j"]
    for q in (50, 95):
        est, lo, hi = quantile_ci(res["energy_j"].to_numpy(), q / 100, 0.95)
        assert (row[f"p{q}"], row[f"p{q}_lo"]) == (est, lo)
        assert math.isnan(hi) if math.isnan(row[f"p{q}_hi"]) else row[f"p{q}_hi"] == hi
        assert lo < est
    assert row["mean"] == pytest.approx(res["energy_j"].mean(), rel=1e-12)
    lost = st.loc["lost_work_per_interruption_s"]
    assert lost["n"] == 1 and lost["mean"] == pytest.approx(2.5)
    # two interruptions losing 1 s and 4 s: 2.5 s each on average, an interval around it
    res["interruptions"] = [1, 1] + [0] * (n - 2)
    res["lost_work_s"] = [1.0, 4.0] + [0.0] * (n - 2)
    lost = campaign_stats(res, its).set_index("metric").loc["lost_work_per_interruption_s"]
    assert lost["n"] == 2 and lost["mean"] == pytest.approx(2.5)
    assert lost["mean_lo"] < 2.5 < lost["mean_hi"]
