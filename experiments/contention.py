"""The saturation-vs-collapse map of whole training runs (``twin contention``).

Question (first brief): when compute, NCCL DMA, pipeline sends and input copies share a
device's HBM controller and SMs, does overlapping them *saturate* (each stream gets a fair
share of a busy server, the iteration time grows smoothly with the load) or *collapse* (the
iteration time has no stable mean because the service tail is too heavy)? Each cell of the map
is one whole twin run (``memory.model: queue``) of a configuration, at one concurrency level
and one HBM service distribution:

* configurations: a bandwidth-bound one (``memory.bound: bandwidth``: every block streams, its
  memory time is the completion of its requests) and a latency-bound one (``memory.bound:
  auto``: norms, element-wise kernels, optimizer and small GEMMs see the sojourn time of their
  own requests, drawn afresh per block);
* concurrency: overlap settings (``overlap`` section: everything off, today's defaults, TP
  overlap, several data-parallel streams), i.e. how many streams run beside compute;
* service: deterministic, exponential, lognormal (cov 2, 3), Pareto (alpha 2.5, 1.8, 1.5),
  the mean fixed at one burst.

Per cell: iteration-time mean, p50, p99, cov, whether the mean converged
(``iteration_time_converged``; non-converged cells are marked), the most streams the HBM
controller served, the mean HBM slowdown, the highest offered load ``rho`` of a contention
level, and the *efficiency* ``T_roofline / T`` against the same configuration and concurrency
with ``memory.model: roofline``. Saturation shows as efficiency about ``1 / rho`` once rho > 1,
the same for every distribution; collapse as a non-converged mean that keeps moving.

Input: a map file (``scenarios/contention_map.yaml``) naming the configurations (a base
scenario plus ``--set``-style overrides), the concurrency levels and the services. Output in
``DIR``: ``cells.csv``, ``contention_map.png`` and ``cells.jsonl`` (the journal ``--resume``
reads).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import Field

from experiments.many import JsonLines, ManyRunsCommand, TaskRunner, atomic_write_table
from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.schema import StrictModel

#: Columns of ``cells.csv``.
COLUMNS = ("configuration", "concurrency", "service", "iteration_time_mean_s",
           "iteration_time_p50_s", "iteration_time_p99_s", "iteration_time_cov",
           "converged", "hbm_max_streams", "hbm_slowdown_mean", "rho_max", "efficiency",
           "roofline_iteration_time_s", "error")


class Configuration(StrictModel):
    """One configuration of the map: a base scenario and overrides."""

    base: str = Field(max_length=4096, description="scenario file, relative to the map file")
    set: list[str] = Field(default=[], max_length=256, description="dotted.key=value overrides")


class ContentionMap(StrictModel):
    """The map file (module docstring)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", max_length=200)
    description: str = ""
    seed: int = Field(default=1, ge=0, le=2**63 - 1)
    iterations: int = Field(default=20, ge=2, le=100_000, description="iterations per cell")
    configurations: dict[str, Configuration] = Field(min_length=1, max_length=16)
    concurrency: dict[str, list[str]] = Field(min_length=1, max_length=32)
    services: dict[str, dict[str, Any]] = Field(min_length=1, max_length=32)


def load_map(path: str | Path) -> tuple[ContentionMap, list[dict[str, Any]]]:
    """Read and validate a map file; returns it and the cells' tasks (every scenario checked
    before anything runs: a bad override or service is reported with its cell)."""
    from experiments.many import load_spec_file
    from twin.scenario import load_scenario

    spec, source, here = load_spec_file(path, ContentionMap, "contention map",
                                        "name, configurations, concurrency, services")
    problems: list[Problem] = []
    for section, entries in (("services", spec.services), ("concurrency", spec.concurrency)):
        seen: dict[str, str] = {}
        for name, value in entries.items():
            first = seen.setdefault(json.dumps(value, sort_keys=True, default=str), name)
            if first != name:
                problems.append(Problem(f"{section}.{name}", f"the same as {section}.{first}: "
                                        "its cells would be run twice", value,
                                        f"distinct {section}"))
    by_cell: dict[tuple[str, str, str, str], tuple[list[str], Any]] = {}  # once per problem
    tasks: list[dict[str, Any]] = []
    for cname, conf in spec.configurations.items():
        try:
            base = load_scenario(here / conf.base)
        except ScenarioError as exc:
            where = f"configurations.{cname}.base"
            problems += [Problem(f"{where}: {p.path}" if p.path else where, p.message, p.value,
                                 p.allowed) for p in exc.problems]
            continue
        common = [*conf.set, f"workload.iterations={spec.iterations}", f"seed={spec.seed}",
                  "trace.enabled=false"]
        for qname, qsets in spec.concurrency.items():
            cells = [("roofline", ["memory.model=roofline"])]
            cells += [(sname, ["memory.model=queue", f"memory.service={_flow(svc)}"])
                      for sname, svc in spec.services.items()]
            for sname, ssets in cells:
                sets = common + list(qsets) + ssets
                try:
                    scen = base.replace(sets)
                except ScenarioError as exc:
                    for p in exc.problems:
                        key = (p.path, p.message, repr(p.value), p.allowed or "")
                        by_cell.setdefault(key, ([], p.value))[0].append(
                            f"{cname}/{qname}/{sname}")
                    continue
                tasks.append({"key": f"{cname}|{qname}|{sname}", "configuration": cname,
                              "concurrency": qname, "service": sname,
                              "scenario": scen.to_dict()})
    for (path, message, _shown, allowed), (cells, value) in by_cell.items():
        where = cells[0] if len(cells) == 1 else f"{cells[0]} and {len(cells) - 1} more cells"
        problems.append(Problem(f"{where}: {path}", message, value, allowed or None))
    if problems:
        raise ScenarioError(problems, source=source)
    return spec, tasks


def _flow(d: dict[str, Any]) -> str:
    """A mapping as a YAML flow value for ``--set``."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"


def run_cell(task: dict[str, Any]) -> dict[str, Any]:
    """Run one cell (module-level and picklable, for Dask); returns its record."""
    from twin.runner import run
    from twin.scenario import load_scenario

    s = run(load_scenario(task["scenario"])).summary
    levels = s.get("memory_levels") or []
    lat = (s.get("memory_latency") or {}).get("levels") or []
    return {"key": task["key"], "configuration": task["configuration"],
            "concurrency": task["concurrency"], "service": task["service"],
            "iteration_time_mean_s": s["iteration_time_s"],
            "iteration_time_p50_s": s["iteration_time_p50_s"],
            "iteration_time_p99_s": s["iteration_time_p99_s"],
            "iteration_time_cov": s["iteration_time_cov"],
            "converged": bool(s["iteration_time_converged"]),
            "hbm_max_streams": s["hbm_max_streams"], "hbm_slowdown_mean": s["hbm_slowdown_mean"],
            "rho_max": max((lv["rho"] for lv in levels + lat), default=None), "error": ""}


def cells_frame(records: list[dict[str, Any]]):
    """The cells as a DataFrame with ``efficiency`` against each (configuration,
    concurrency)'s roofline cell."""
    import pandas as pd

    df = pd.DataFrame(records)
    for c in COLUMNS:
        if c not in df:
            df[c] = None
    roof = (df[df.service == "roofline"].set_index(["configuration", "concurrency"])
            ["iteration_time_mean_s"])
    key = list(zip(df.configuration, df.concurrency, strict=True))
    df["roofline_iteration_time_s"] = [roof.get(k) for k in key]
    df["efficiency"] = pd.to_numeric(df.roofline_iteration_time_s, errors="coerce") / \
        pd.to_numeric(df.iteration_time_mean_s, errors="coerce")
    return df[list(COLUMNS)].sort_values(["configuration", "concurrency", "service"],
                                         kind="stable").reset_index(drop=True)


def cell_label(c) -> tuple[str, bool]:
    """A map cell's text (its mean and p99 iteration time in ms, or "error") and whether it
    is hatched (it ran but its mean did not converge, which the text says too)."""
    if c.error:
        return "error", False
    mean, p99 = 1e3 * c.iteration_time_mean_s, 1e3 * c.iteration_time_p99_s
    text = f"{mean:.3g}\np99 {p99:.3g}"
    return (text, False) if c.converged else (text + "\nnot converged", True)


def map_panel(df, conf: str, rows: list[str], cols: list[str]):
    """One configuration's panel: the efficiency grid (``[i, j]``: concurrency ``rows[i]``,
    service ``cols[j]``; NaN for a missing cell or one without an efficiency) and each
    present cell's :func:`cell_label` by ``(i, j)``."""
    import numpy as np

    grid = np.full((len(rows), len(cols)), np.nan)
    labels: dict[tuple[int, int], tuple[str, bool]] = {}
    for i, q in enumerate(rows):
        for j, sv in enumerate(cols):
            cell = df[(df.configuration == conf) & (df.concurrency == q) & (df.service == sv)]
            if not len(cell):
                continue
            c = cell.iloc[0]
            grid[i, j] = c.efficiency if c.efficiency == c.efficiency else np.nan
            labels[(i, j)] = cell_label(c)
    return grid, labels


def plot_map(df, spec: ContentionMap, path: Path) -> None:
    """One panel per configuration: concurrency (rows) x service (columns), colour the
    efficiency, text the mean and p99 (ms); hatched cells did not converge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    confs = list(spec.configurations)
    rows = list(spec.concurrency)
    cols = list(spec.services)
    fig, axes = plt.subplots(1, len(confs), figsize=(2.0 + 1.6 * len(cols) * len(confs),
                                                     1.2 + 0.9 * len(rows)), squeeze=False)
    for ax, conf in zip(axes[0], confs, strict=True):
        grid, labels = map_panel(df, conf, rows, cols)
        for (i, j), (txt, hatched) in labels.items():
            ax.text(j, i, txt, ha="center", va="center", fontsize=7,
                    bbox={"facecolor": "white", "alpha": 0.75, "lw": 0, "pad": 1})
            if hatched:  # the cell's square, centred on (j, i)
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False,
                                           hatch="//", edgecolor="0.35", lw=0))
        im = ax.imshow(grid, vmin=0, vmax=1.05, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.set_title(f"{conf}: efficiency T_roofline / T (text: mean, p99 in ms)", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.04)
    fig.suptitle(f"{spec.name}: saturation vs collapse (hatched: mean not converged)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class ContentionCommand(ManyRunsCommand):
    """``twin contention MAP.yaml -o DIR``."""

    name = "contention"
    help = "saturation-vs-collapse map of whole training runs (concurrency x HBM service)"
    input_name = "map"
    input_kind = "contention"
    input_help = "contention map file (e.g. scenarios/contention_map.yaml)"

    def load(self, args: argparse.Namespace):
        """The map and its cells."""
        return load_map(args.map)

    def compute(self, job, args: argparse.Namespace, client) -> list[dict[str, Any]]:
        """Run the cells not in the journal; failed cells are recorded with their error."""
        _spec, tasks = job
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        journal = JsonLines(out / "cells.jsonl")
        done = {r["key"]: r for r in journal.start(args.resume) if "key" in r}
        todo = [t for t in tasks if t["key"] not in done]
        for task, res in TaskRunner(run_cell, client, not args.quiet).map(todo, "cells"):
            if isinstance(res, BaseException):
                res = {"key": task["key"], "configuration": task["configuration"],
                       "concurrency": task["concurrency"], "service": task["service"],
                       "converged": False, "error": f"{type(res).__name__}: {res}"[:300]}
            journal.add(res)
            done[res["key"]] = res
        return [done[t["key"]] for t in tasks]

    def report(self, job, records: list[dict[str, Any]], args: argparse.Namespace) -> int:
        """Write ``cells.csv`` and the PNG; print the table."""
        spec, _tasks = job
        out = Path(args.output)
        df = cells_frame(records)
        atomic_write_table(df, out / "cells.csv")
        if not args.no_plots:
            plot_map(df, spec, out / "contention_map.png")
        with_cols = ["configuration", "concurrency", "service", "iteration_time_mean_s",
                     "iteration_time_p99_s", "converged", "hbm_max_streams", "rho_max",
                     "efficiency"]
        print(df[with_cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        print(f"wrote {out / 'cells.csv'}" + ("" if args.no_plots else
                                             f" and {out / 'contention_map.png'}"))
        return 0
