"""``twin pareto SWEEP.yaml -o DIR``: the subcommand, on the shared many-runs skeleton
(:mod:`experiments.many`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.many import ManyRunsCommand
from experiments.pareto.report import format_report, write_outputs
from experiments.pareto.result import ParetoResult
from experiments.pareto.run import run_sweep
from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.schema import INT64_MAX

if TYPE_CHECKING:
    import pandas as pd

    from experiments.sweep import Sweep


class ParetoCommand(ManyRunsCommand):
    """``twin pareto SWEEP.yaml -o DIR``: the subcommand (the CLI registers it)."""

    name = "pareto"
    help = "energy-latency Pareto front of a sweep (exhaustive or NSGA-II, on Dask)"
    input_name = "sweep"
    input_kind = "sweep"
    input_help = "sweep YAML file (see README: Pareto sweeps)"
    resume_help = "reuse the runs recorded in DIR/runs.jsonl by an earlier (e.g. killed) invocation"
    quiet_help = "no progress bars"

    def add_options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--method", choices=["auto", "exhaustive", "nsga2"],
                       help="search method (default: the sweep file's, else auto)")
        p.add_argument("--seed", type=int, help="NSGA-II seed (default: nsga2.seed)")
        p.add_argument("--reference", help="pareto.csv of an earlier (e.g. exhaustive) run: "
                       "report NSGA-II's hypervolume as a fraction of it")

    def load(self, args: argparse.Namespace) -> tuple[Sweep, pd.DataFrame | None]:
        """The sweep and the reference front (``--reference``), if any."""
        from experiments.sweep import load_sweep

        sweep = load_sweep(args.sweep)
        if args.seed is not None and not 0 <= args.seed <= INT64_MAX:
            raise ScenarioError([Problem("--seed", "out of range", args.seed,
                                         "0 .. 2^63-1 (as nsga2.seed)")])
        if not args.reference:
            return sweep, None
        from twin.kernel.reading import read_csv_table

        ref_path = Path(args.reference)
        if ref_path.is_dir():
            ref_path = ref_path / "pareto.csv"
        columns = dict.fromkeys(sweep.objective_columns(), True)
        return sweep, read_csv_table(ref_path, "reference front", "--reference", columns,
                                     "a twin pareto output folder or its pareto.csv")

    def compute(self, job, args: argparse.Namespace, client) -> ParetoResult:
        sweep, reference = job
        return run_sweep(sweep, client=client, method=args.method, seed=args.seed,
                         progress=not args.quiet, reference=reference,
                         journal=Path(args.output) / "runs.jsonl", resume=args.resume)

    def report(self, job, result: ParetoResult, args: argparse.Namespace) -> int:
        paths = write_outputs(result, args.output, plots=not args.no_plots)
        print(format_report(result))
        print(f"wrote {len(paths)} files to {args.output}: "
              + ", ".join(p.name for p in paths))
        return 0
