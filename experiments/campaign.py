"""Fault campaigns: many runs of one scenario with random faults, as Dask tasks.

A campaign file (YAML) names a base scenario, replicate seeds and optionally a grid of
overrides::

    name: accel_failures
    base: fault_campaign_base.yaml     # relative to the campaign file (or an inline mapping)
    seeds: 8                           # seeds seed_start .. seed_start+7 (or a list of seeds)
    overrides: {workload.iterations: 40}            # applied to every run
    grid: {faults.1.ttf.mean_s: [0.5, 1.0]}         # cartesian product, one point per combination
    baseline: true                     # also run every point and seed without its faults

Every (grid point, variant, seed) is one run with a stable id (``p000-faults-s0003``). A run is
one task on Dask (a ``LocalCluster`` of single-threaded processes by default, an existing
cluster with ``--scheduler``): it writes its own trace ``traces/<id>.h5`` (temporary name, then
rename) and its own record ``runs/<id>.json`` (atomically), and returns the record, a few
hundred bytes. The driver rebuilds ``results.parquet`` (one row per run), ``iterations.parquet``
(one row per completed iteration) and ``stats.csv`` from the records, prints the statistics
with confidence intervals and draws the plots.

``--resume`` continues a killed campaign: a run whose record and complete trace exist is not
repeated; the others run again (their stale partial files are removed). Since every run is a
pure function of its scenario and seed, and records are keyed by run id and replaced
atomically, no run is lost or duplicated and the tables come out the same as in one go.

Statistics (``stats.csv``): for every variant and metric, the mean with a percentile-bootstrap
interval and p50 / p95 / p99 with distribution-free order-statistic intervals (binomial ranks;
empty when the campaign is too small for them). Per-iteration times are pooled over runs and
their intervals come from a bootstrap that resamples whole runs (iterations of one run are not
independent). Lost work per interruption is a ratio estimate with the same run bootstrap.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from experiments.many import (
    MAX_RUNS,
    ManyRunsCommand,
    RecordDir,
    TaskRunner,
    atomic_write_json,
    atomic_write_table,
    load_spec_file,
    read_base,
)
from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.schema import StrictModel

#: Summary keys copied into the results table (scalars; SI units in the names).
SUMMARY_COLUMNS = (
    "completed", "iterations_completed", "iteration_time_s", "iteration_time_p50_s",
    "iteration_time_p99_s", "iteration_time_max_s", "iteration_time_cov",
    "iteration_time_converged", "data_wait_fraction", "makespan_s", "energy_j",
    "energy_per_iteration_j", "avg_power_w", "mfu", "availability", "goodput",
    "goodput_tokens_per_s", "restarts", "failures", "interruptions", "checkpoints",
    "checkpoint_time_s", "lost_work_s", "lost_work_j", "downtime_s", "downtime_j", "reroutes",
    "retransmitted_bytes", "route_stalls", "bytes_sent", "bytes_received", "bytes_dropped",
    "events",
)
#: Per-run metrics summarised with confidence intervals.
STAT_METRICS = ("iteration_time_s", "energy_j", "goodput", "availability", "lost_work_s",
                "lost_work_j", "restarts")
VARIANTS = ("faults", "baseline")


# ----------------------------------------------------------------------------- spec
class CampaignSpec(StrictModel):
    """A campaign file."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str = ""
    base: str | dict[str, Any] = Field(description="scenario file (relative to the campaign "
                                                   "file) or an inline scenario mapping")
    seeds: Annotated[int, Field(ge=1, le=MAX_RUNS)] | Annotated[
        list[Annotated[int, Field(ge=0, le=2**63 - 1)]], Field(min_length=1,
                                                               max_length=MAX_RUNS)] = Field(
        default=8, description="number of replicate seeds, or the list of seeds")
    seed_start: int = Field(default=0, ge=0, le=2**62,
                            description="first seed when seeds is a number")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="dotted.key: value for every run")
    grid: dict[str, list[Any]] = Field(default_factory=dict,
                                       description="dotted.key: [values], cartesian product")
    baseline: bool = Field(default=True, description="also run without the faults")
    traces: bool = Field(default=True, description="write one trace per run")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    bootstrap: int = Field(default=2000, ge=100, le=100_000, description="bootstrap resamples")
    stats_seed: int = Field(default=0, ge=0, le=2**63 - 1, description="seed of the bootstrap")



@dataclass(frozen=True)
class RunTask:
    """One run of a campaign."""

    run_id: str
    point: int
    variant: str
    seed: int
    params: dict[str, Any]
    overrides: dict[str, Any]


@dataclass
class Campaign:
    """A validated campaign: its spec, the base scenario mapping and the run list."""

    spec: CampaignSpec
    base: dict[str, Any]
    runs: list[RunTask]
    source: str = "<campaign>"

    @property
    def digest(self) -> str:
        """Hash of what determines the results (spec and base scenario)."""
        blob = json.dumps({"spec": self.spec.model_dump(mode="json"), "base": self.base},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _seeds(spec: CampaignSpec) -> list[int]:
    if isinstance(spec.seeds, int):
        return list(range(spec.seed_start, spec.seed_start + spec.seeds))
    return list(spec.seeds)


def load_campaign(path: str | Path | dict[str, Any]) -> Campaign:
    """Read and validate a campaign file; every grid point's scenario is validated too.

    Raises:
        ScenarioError: every problem, with its field path (``grid.<key>``, ``seeds``, ...).
    """
    spec, where, root = load_spec_file(path, CampaignSpec, "campaign",
                                       "name, base, seeds, grid, ...")
    problems: list[Problem] = []
    seeds = _seeds(spec)
    if not seeds:
        problems.append(Problem("seeds", "no seeds", spec.seeds, "a number >= 1 or a list"))
    if len(set(seeds)) != len(seeds):  # (each >= 0 by the schema)
        problems.append(Problem("seeds", "seeds must be distinct", spec.seeds))
    for key, values in spec.grid.items():
        if not values:
            problems.append(Problem(f"grid.{key}", "no values", values, "a non-empty list"))
        elif len({json.dumps(v, sort_keys=True, default=str) for v in values}) < len(values):
            problems.append(Problem(f"grid.{key}", "a value is repeated (its runs would be "
                                    "run twice under two point ids)", values,
                                    "distinct values"))
    for where_, keys in (("overrides", spec.overrides), ("grid", spec.grid)):
        if "seed" in keys:
            problems.append(Problem(f"{where_}.seed", "the campaign sets every run's seed from "
                                    "`seeds` (and `seed_start`); this one would be ignored",
                                    keys["seed"], "seeds: N or a list of seeds"))
    base = read_base(spec.base, root, problems)
    n_runs = len(seeds) * (2 if spec.baseline else 1) * math.prod(len(v) for v in
                                                                  spec.grid.values())
    if n_runs > MAX_RUNS:
        problems.append(Problem("seeds", f"the campaign would make {n_runs} runs (seeds x "
                                "grid points x variants), more than the limit of "
                                f"{MAX_RUNS}", None, "fewer seeds or grid values"))
    if problems:
        raise ScenarioError(problems, source=where)
    keys = list(spec.grid)
    points = list(itertools.product(*(spec.grid[k] for k in keys))) or [()]
    runs: list[RunTask] = []
    variants = VARIANTS if spec.baseline else VARIANTS[:1]
    for i, combo in enumerate(points):
        params = dict(zip(keys, combo, strict=True))
        over = {**spec.overrides, **params}
        _validate_point(base, over, f"{where}: grid point {i} {params}" if params else where)
        for variant in variants:
            for s in seeds:
                runs.append(RunTask(f"p{i:03d}-{variant}-s{s:04d}", i, variant, s, params,
                                    over))
    return Campaign(spec, base, runs, where)


def _validate_point(base: dict, overrides: dict, where: str) -> None:
    from twin.scenario import load_scenario

    try:
        load_scenario(base, {**overrides, "trace.enabled": False})
    except ScenarioError as exc:
        raise ScenarioError(exc.problems, source=where) from None


# ----------------------------------------------------------------------------- one run
def _scalar(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return v


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Run one campaign run (on a worker): simulate, write the trace and the record.

    Args:
        task: ``run_id, point, variant, seed, params, overrides, base`` (scenario mapping),
            ``trace_path`` (None: no trace) and ``record_path``.

    Returns:
        the record also written to ``record_path``: ids, params, the summary's scalar keys,
        per-iteration times and timing (wall time, worker).
    """
    from twin.runner import run
    from twin.scenario import load_scenario

    t0 = time.perf_counter()
    over = {**task["overrides"], "seed": task["seed"]}
    if task["trace_path"] is None:
        over["trace.enabled"] = False
    scen = load_scenario(task["base"], over)
    if task["variant"] == "baseline":  # no faults; the job's checkpoint policy stays
        scen = scen.replace({"faults": []})
    res = run(scen, trace_path=task["trace_path"])
    record = {
        "run_id": task["run_id"], "point": task["point"], "variant": task["variant"],
        "seed": task["seed"], "params": task["params"],
        "summary": {k: _scalar(res.summary.get(k)) for k in SUMMARY_COLUMNS},
        "iteration_times_s": list(res.iteration_times_s),
        "trace": Path(task["trace_path"]).name if task["trace_path"] else None,
        "timing": {"wall_s": time.perf_counter() - t0, "worker": f"{os.getpid()}"},
    }
    atomic_write_json(task["record_path"], record)
    return record


# ----------------------------------------------------------------------------- driver
@dataclass
class CampaignResult:
    """What a campaign produced (tables as pandas DataFrames)."""

    results: Any
    iterations: Any
    stats: Any
    errors: dict[str, str] = field(default_factory=dict)
    ran: int = 0
    skipped: int = 0
    wall_s: float = 0.0
    out_dir: Path | None = None


def _valid_record(records: RecordDir, run_id: str, trace: Path | None) -> dict | None:
    """The record of a finished run worth keeping: readable, its own, with a complete trace
    whose data still matches the checksum stored when it was written."""
    rec = records.get(run_id)
    if rec is None or rec.get("run_id") != run_id:
        return None
    if trace is not None:
        from twin.kernel.trace import TraceError, open_trace

        try:
            open_trace(trace, verify=True)
        except TraceError:
            return None
    return rec


def run_campaign(campaign: Campaign, out_dir: str | Path, client=None, resume: bool = False,
                 progress: bool = True, plots: bool = True) -> CampaignResult:
    """Run (or continue) a campaign and write its tables, statistics and plots.

    Args:
        campaign: from :func:`load_campaign`.
        out_dir: output directory.
        client: a ``dask.distributed.Client`` (see ``experiments.many.dask_client``);
            None runs the tasks one after the other in this process.
        resume: continue the campaign already in ``out_dir`` (finished runs are kept).
        progress: show a progress bar.
        plots: draw the PNG plots.

    Raises:
        ScenarioError: ``out_dir`` holds another campaign, or holds this one without
            ``resume``.
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    records, traces_dir = RecordDir(out / "runs"), out / "traces"
    meta_path = out / "campaign.json"
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise ScenarioError([Problem("-o", "the directory's campaign.json is unreadable "
                                         "or corrupted", str(meta_path), "a new directory, "
                                         "or remove the damaged file")]) from None
        if not isinstance(meta, dict):
            meta = {}
        if meta.get("digest") != campaign.digest:
            raise ScenarioError([Problem("-o", "the directory holds a different campaign "
                                         f"({meta.get('name')!r}, digest {meta.get('digest')})",
                                         str(out), "a new directory, or the same campaign "
                                         "file to --resume")])
        if not resume:
            raise ScenarioError([Problem("-o", "the directory already holds this campaign",
                                         str(out), "--resume to continue it, or another "
                                         "directory")])
    records.start()
    if campaign.spec.traces:
        traces_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(meta_path, {
        "name": campaign.spec.name, "digest": campaign.digest, "source": campaign.source,
        "spec": campaign.spec.model_dump(mode="json"), "base": campaign.base,
        "runs": [r.run_id for r in campaign.runs]}, indent=1, default=str)
    for stale in [*traces_dir.glob(".*.partial-*"), *traces_dir.glob("*.partial-*")]:
        stale.unlink(missing_ok=True)

    kept: dict[str, dict] = {}
    todo: list[dict[str, Any]] = []
    for r in campaign.runs:
        trace = traces_dir / f"{r.run_id}.h5" if campaign.spec.traces else None
        rec = _valid_record(records, r.run_id, trace)
        if rec is not None:
            kept[r.run_id] = rec
            continue
        todo.append({"run_id": r.run_id, "point": r.point, "variant": r.variant,
                     "seed": r.seed, "params": r.params, "overrides": r.overrides,
                     "base": campaign.base, "trace_path": str(trace) if trace else None,
                     "record_path": str(records.path(r.run_id))})
    skipped = len(kept)
    errors: dict[str, str] = {}
    for task, res in TaskRunner(run_task, client, progress).map(todo, campaign.spec.name):
        rid = task["run_id"]
        if isinstance(res, BaseException):
            errors[rid] = f"{type(res).__name__}: {res}"
            continue
        records.add(rid, res)  # when the worker could not (no shared file system)
        kept[rid] = res
    results_df, iters_df = tables(campaign, kept)
    stats = campaign_stats(results_df, iters_df, campaign.spec.confidence,
                           campaign.spec.bootstrap, campaign.spec.stats_seed)
    atomic_write_table(results_df, out / "results.parquet")
    atomic_write_table(iters_df, out / "iterations.parquet")
    atomic_write_table(stats, out / "stats.csv")
    if errors:
        atomic_write_json(out / "errors.json", errors, indent=1)
    if plots and len(results_df):
        from experiments.campaign_plots import ccdf_iteration_time, energy_vs_availability

        ccdf_iteration_time(iters_df, out / "ccdf_iteration_time.png")
        energy_vs_availability(results_df, out / "energy_vs_availability.png")
    return CampaignResult(results_df, iters_df, stats, errors, len(todo) - len(errors),
                          skipped, time.perf_counter() - t0, out)


def tables(campaign: Campaign, records: dict[str, dict]):
    """``(results, iterations)`` DataFrames from run records, in run-id order.

    ``results``: one row per finished run: ``run_id, point, variant, seed``, one column per
    grid key, then :data:`SUMMARY_COLUMNS`. ``iterations``: ``run_id, point, variant, seed,
    iteration, iteration_time_s``. Timing (wall clock) is left out so that the same campaign
    gives the same tables.
    """
    import pandas as pd

    keys = list(campaign.spec.grid)
    rows, its = [], []
    for r in campaign.runs:
        rec = records.get(r.run_id)
        if rec is None:
            continue
        row = {"run_id": r.run_id, "point": r.point, "variant": r.variant, "seed": r.seed}
        for k in keys:
            row[k] = r.params[k]
        # null in a record is an undefined number (twin.summary.finite_summary): NaN here
        row.update({k: math.nan if (v := rec["summary"].get(k)) is None else v
                    for k in SUMMARY_COLUMNS})
        rows.append(row)
        for i, t in enumerate(rec["iteration_times_s"]):
            its.append((r.run_id, r.point, r.variant, r.seed, i, t))
    cols = ["run_id", "point", "variant", "seed", *keys, *SUMMARY_COLUMNS]
    results = pd.DataFrame(rows, columns=cols)
    iters = pd.DataFrame(its, columns=["run_id", "point", "variant", "seed", "iteration",
                                       "iteration_time_s"])
    return results, iters


# ----------------------------------------------------------------------------- statistics
def quantile_ci(x, q: float, confidence: float = 0.95) -> tuple[float, float, float]:
    """Sample quantile ``q`` of ``x`` with a distribution-free order-statistic interval.

    The interval is ``[x_(l), x_(u)]`` with ranks from the Binomial(n, q) distribution of the
    number of samples below the true quantile (coverage >= ``confidence`` up to the binomial's
    discreteness); a side that needs a rank outside ``1..n`` is NaN (too few samples).
    """
    from scipy import stats

    x = np.sort(np.asarray(x, dtype=float))
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    est = float(np.quantile(x, q))
    a = (1.0 - confidence) / 2.0
    lo_rank = int(stats.binom.ppf(a, n, q))          # P(B <= lo_rank - 1) <= a
    hi_rank = int(stats.binom.ppf(1.0 - a, n, q)) + 1
    lo = float(x[lo_rank - 1]) if lo_rank >= 1 else math.nan
    hi = float(x[hi_rank - 1]) if hi_rank <= n else math.nan
    return est, lo, hi


def bootstrap_ci(groups: list[np.ndarray], stat, n_boot: int, confidence: float,
                 rng: np.random.Generator) -> tuple[float, float, float]:
    """Statistic of the pooled groups with a percentile bootstrap that resamples groups.

    Args:
        groups: one array per run (a run is the unit of resampling).
        stat: function of the list of groups -> float.
    """
    if not groups:
        return math.nan, math.nan, math.nan
    est = float(stat(groups))
    n = len(groups)
    idx = rng.integers(0, n, size=(n_boot, n))
    boots = np.array([stat([groups[i] for i in row]) for row in idx], dtype=float)
    boots = boots[np.isfinite(boots)]
    if not len(boots):
        return est, math.nan, math.nan
    a = (1.0 - confidence) / 2.0
    return est, float(np.quantile(boots, a)), float(np.quantile(boots, 1.0 - a))


def ratio_ci(num, den, n_boot: int, confidence: float,
             rng: np.random.Generator) -> tuple[float, float, float]:
    """``sum(num) / sum(den)`` over runs with a percentile bootstrap resampling runs
    (vectorized; a mean is the ratio with ``den`` = 1 per sample)."""
    num = np.asarray(num, dtype=float)
    den = np.asarray(den, dtype=float)
    n = len(num)
    if n == 0 or den.sum() <= 0:
        return math.nan, math.nan, math.nan
    est = float(num.sum() / den.sum())
    idx = rng.integers(0, n, size=(n_boot, n))
    d = den[idx].sum(axis=1)
    ok = d > 0
    boots = num[idx].sum(axis=1)[ok] / d[ok]
    a = (1.0 - confidence) / 2.0
    return est, float(np.quantile(boots, a)), float(np.quantile(boots, 1.0 - a))


def campaign_stats(results, iterations, confidence: float = 0.95, n_boot: int = 2000,
                   seed: int = 0):
    """Statistics with confidence intervals, one row per (grid point, variant, metric).

    Columns: ``point, variant, metric, n, mean, mean_lo, mean_hi, p50, p50_lo, p50_hi, p95,
    p95_lo, p95_hi, p99, p99_lo, p99_hi``. Metric ``iteration_time_s(pooled)`` pools every
    iteration of every run (n = iterations; intervals from a bootstrap that resamples runs);
    ``lost_work_per_interruption_s`` is sum(lost) / sum(interruptions) (run bootstrap; no
    quantiles); the others are per-run values (n = runs; mean: percentile bootstrap,
    quantiles: order statistics).
    """
    import pandas as pd

    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    rows = []

    def pooled(q):
        return lambda gs: float(np.quantile(np.concatenate(gs), q)) if gs else math.nan

    cells = [(int(pt), v) for pt in sorted(set(results["point"]))
             for v in VARIANTS if v in set(results["variant"])]
    for point, variant in cells:
        res = results[(results["variant"] == variant) & (results["point"] == point)]
        its = iterations[(iterations["variant"] == variant) & (iterations["point"] == point)]
        if not len(res):
            continue
        groups = [g["iteration_time_s"].to_numpy(float)
                  for _, g in its.groupby("run_id", sort=True)]
        if groups:
            row = {"point": point, "variant": variant, "metric": "iteration_time_s(pooled)",
                   "n": int(sum(len(g) for g in groups))}
            m = ratio_ci([g.sum() for g in groups], [len(g) for g in groups], n_boot,
                         confidence, rng)
            row.update(mean=m[0], mean_lo=m[1], mean_hi=m[2])
            for q in (50, 95, 99):
                e = bootstrap_ci(groups, pooled(q / 100), n_boot, confidence, rng)
                row.update({f"p{q}": e[0], f"p{q}_lo": e[1], f"p{q}_hi": e[2]})
            rows.append(row)
        for metric in STAT_METRICS:
            x = res[metric].to_numpy(float)
            x = x[np.isfinite(x)]
            row = {"point": point, "variant": variant, "metric": metric, "n": len(x)}
            m = ratio_ci(x, np.ones_like(x), n_boot, confidence, rng)
            row.update(mean=m[0], mean_lo=m[1], mean_hi=m[2])
            for q in (50, 95, 99):
                e = quantile_ci(x, q / 100, confidence)
                row.update({f"p{q}": e[0], f"p{q}_lo": e[1], f"p{q}_hi": e[2]})
            rows.append(row)
        if res["interruptions"].sum() > 0:
            m = ratio_ci(res["lost_work_s"], res["interruptions"], n_boot, confidence, rng)
            rows.append({"point": point, "variant": variant,
                         "metric": "lost_work_per_interruption_s",
                         "n": int(res["interruptions"].sum()), "mean": m[0], "mean_lo": m[1],
                         "mean_hi": m[2]})
    cols = ["point", "variant", "metric", "n", "mean", "mean_lo", "mean_hi"]
    cols += [f"p{q}{s}" for q in (50, 95, 99) for s in ("", "_lo", "_hi")]
    return pd.DataFrame(rows, columns=cols)


def format_stats(stats) -> str:
    """The statistics as a text table: ``value [lo, hi]`` per column."""
    def cell(v, lo, hi):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        def f(x):
            return "?" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"
        return f"{v:.4g} [{f(lo)}, {f(hi)}]"

    lines = []
    header = f"{'point':>5} {'variant':<9} {'metric':<30} {'n':>6}  " + "  ".join(
        f"{h:<28}" for h in ("mean [CI]", "p50 [CI]", "p95 [CI]", "p99 [CI]"))
    lines.append(header)
    for _, r in stats.iterrows():
        cells = [cell(r["mean"], r["mean_lo"], r["mean_hi"])]
        cells += [cell(r[f"p{q}"], r[f"p{q}_lo"], r[f"p{q}_hi"]) for q in (50, 95, 99)]
        lines.append(f"{int(r['point']):>5} {r['variant']:<9} {r['metric']:<30} {int(r['n']):>6}  "
                     + "  ".join(f"{c:<28}" for c in cells))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI
class CampaignCommand(ManyRunsCommand):
    """``twin campaign CAMPAIGN.yaml -o DIR``: the subcommand (the CLI registers it)."""

    name = "campaign"
    help = "run a fault campaign (seeds x parameter grid) on Dask; results with CIs"
    input_name = "campaign"
    input_kind = "campaign"
    input_help = "campaign YAML file (see README: fault campaigns)"
    resume_help = "continue a campaign that was stopped: finished runs are kept"

    def load(self, args: argparse.Namespace) -> Campaign:
        return load_campaign(args.campaign)

    def compute(self, job: Campaign, args: argparse.Namespace, client) -> CampaignResult:
        print(f"campaign {job.spec.name}: {len(job.runs)} runs -> {args.output}")
        return run_campaign(job, args.output, client, resume=args.resume,
                            progress=not args.quiet, plots=not args.no_plots)

    def report(self, job: Campaign, res: CampaignResult, args: argparse.Namespace) -> int:
        """Print what ran and the statistics; exit code 1 if some run failed."""
        print(f"ran {res.ran}, kept {res.skipped} finished earlier, {len(res.errors)} failed; "
              f"{len(res.results)} rows in {res.out_dir / 'results.parquet'}")
        for rid, msg in sorted(res.errors.items()):
            print(f"  FAILED {rid}: {msg}")
        print(format_stats(res.stats))
        return 1 if res.errors else 0
