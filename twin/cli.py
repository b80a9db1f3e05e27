"""The ``twin`` command line: one small class per subcommand.

Exit codes: 0 success, 2 bad input (with every problem named by field path), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from twin.kernel.errors import Problem, ScenarioError, TraceError

EXIT_BAD_INPUT = 2
#: exit code when the reader of our output went away (``twin report | head``): the shell's
#: code for a death by SIGPIPE, as other command-line tools give
EXIT_BROKEN_PIPE = 128 + 13
#: exit code when the machine refuses (a full disk): not the input's fault
EXIT_OS_ERROR = 1


def to_json(obj: Any) -> str:
    """Strict JSON (RFC 8259): NaN and infinities become null (a summary lists such keys
    under ``undefined_keys``), so any JSON parser reads the output."""
    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    return json.dumps(clean(obj), indent=2, allow_nan=False, default=str)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


#: Keys printed by default besides the DESIGN contract keys (the rest with --all / --json).
HEADLINE_KEYS = ("compute_time_per_device_s", "tp_comm_time_per_device_s",
                 "pipeline_wait_per_device_s", "dp_wait_per_device_s", "memory_per_device_gb",
                 "max_link_utilization", "comm_energy_share", "alerts", "availability",
                 "goodput", "memory_warnings", "symmetry_used")
#: Printed by default when the run has a data path.
DATA_KEYS = ("data_wait_fraction", "data_wait_per_device_s")
#: Printed by default when streams shared a device's HBM or SMs (devices.interference).
CONTENTION_KEYS = ("hbm_max_streams", "hbm_slowdown_mean", "contention_slowdown_mean",
                   "hbm_port_capped_s", "iteration_time_p99_s", "iteration_time_cov")


def print_summary(summary: dict[str, Any], out=None, everything: bool = False) -> None:
    """Human-readable summary, one key per line (SI units in the key names): the DESIGN
    contract keys and a few headline details, or every key with ``everything``."""
    from twin.summary import SUMMARY_KEYS

    out = out or sys.stdout
    if everything:
        keys = list(summary)
    else:
        extra = DATA_KEYS if summary.get("data_path") else ()
        if summary.get("hbm_max_streams") or summary.get("sm_max_used"):
            extra = (*extra, *CONTENTION_KEYS)
        keys = [k for k in (*SUMMARY_KEYS, *HEADLINE_KEYS, *extra) if k in summary]
    width = max(len(k) for k in keys)
    for k in keys:
        print(f"  {k:<{width}}  {_fmt(summary[k])}", file=out)
    hidden = len(summary) - len(keys)
    if hidden:
        print(f"  ({hidden} more keys: --all or --json)", file=out)
    if summary.get("iteration_time_converged") is False:
        print(f"  warning: iteration_time_s is a {summary.get('iteration_time_mean_is')}:",
              file=out)
        for w in summary.get("iteration_time_warnings", []):
            print(f"    - {w}", file=out)


class Command:
    """A subcommand: ``name``, ``help``, ``add_arguments`` and ``run``."""

    name = ""
    help = ""
    input_name = ""  # the positional argument naming the input file, if any
    input_kind: str | None = None  # what that file must be (see :func:`file_kind`)

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """Declare the subcommand's arguments."""

    def run(self, args: argparse.Namespace) -> int:
        """Execute; return the exit code."""
        raise NotImplementedError


def _existing(trace: str) -> Path:
    """The path of a trace file that must exist (a ScenarioError naming ``trace``
    otherwise: not found, or there but not a regular file)."""
    path = Path(trace)
    try:
        exists, regular = path.exists(), path.is_file()
    except (OSError, ValueError):
        exists = regular = False
    if not regular:
        why = ("is a folder" if exists and path.is_dir() else
               "is not a regular file (a device, FIFO or socket)" if exists else
               "trace file not found")
        raise ScenarioError([Problem("trace", why, str(path)[:300], "a .h5 trace written by "
                                     "twin run")])
    return path


def _overrides(args: argparse.Namespace) -> list[str]:
    ov = list(args.set or [])
    if getattr(args, "seed", None) is not None:
        ov.append(f"seed={args.seed}")
    return ov


class RunCommand(Command):
    name = "run"
    help = "simulate a scenario, write its trace and print the summary"
    input_name = input_kind = "scenario"

    def add_arguments(self, p):
        p.add_argument("scenario", help="scenario YAML file")
        p.add_argument("-o", "--output", help="trace path (default: trace.path or runs/NAME.h5)")
        p.add_argument("--seed", type=int, help="override the scenario seed")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override any scenario key, e.g. workload.parallelism.dp=4")
        p.add_argument("--plot", help="also write a timeline PNG here")
        p.add_argument("--json", action="store_true", help="print the summary as JSON")
        p.add_argument("--all", action="store_true", help="print every summary key")
        p.add_argument("--report", metavar="REPORT.html", dest="report_html",
                       help="also write the HTML report (twin report) of the trace here")
        p.add_argument("--force", action="store_true",
                       help="overwrite an existing output that is not a meshtwin trace / PNG")

    def run(self, args):
        from twin.api import load_scenario, run
        from twin.outputs import check_output, check_trace_path

        scen = load_scenario(args.scenario, _overrides(args))
        if scen.trace.enabled:  # every output path is checked before simulating
            if args.output is not None:
                check_output(args.output, "-o", "trace", args.force)
            else:
                check_trace_path(scen.trace_path, args.force)
        if args.plot:
            check_output(args.plot, "--plot", "png", args.force)
        if args.report_html:
            check_output(args.report_html, "--report", "html", args.force)
        _trace_serves(scen, args)
        result = run(scen, trace_path=args.output)
        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
        if args.json:
            print(to_json(result.summary))
        else:
            print(f"scenario {scen.name}: {scen.cluster.topology.kind} "
                  f"{'x'.join(map(str, scen.cluster.topology.shape))} x {scen.cluster.device.name},"
                  f" {scen.workload.model.name}, dp={scen.workload.parallelism.dp} "
                  f"tp={scen.workload.parallelism.tp} pp={scen.workload.parallelism.pp}")
            print_summary(result.summary, everything=args.all)
            if result.trace_path:
                print(f"trace: {result.trace_path}")
        if args.plot and result.trace_path:
            from twin.plots import timeline

            print(f"timeline: {timeline(result.trace_path, args.plot)}")
        if args.report_html:
            from twin.report import build_report, format_report, write_html

            rep = build_report(result.trace_path)
            if not args.json:
                print(format_report(rep))
            print(f"report: {write_html(rep, result.trace_path, args.report_html)}",
                  file=sys.stderr if args.json else sys.stdout)
        return 0


def _trace_serves(scen, args) -> None:
    """Refuse, before simulating, a ``--plot`` or ``--report`` the run's trace cannot serve:
    no trace (``trace.enabled: false``), or its ``trace.tables`` leave out what they read."""
    problems = []
    for option, given in (("--plot", args.plot), ("--report", args.report_html)):
        if not given:
            continue
        if option == "--plot":
            tables: tuple[str, ...] = ("ops",)
        else:
            from twin.report import REPORT_TABLES as tables
        if not scen.trace.enabled:
            problems.append(Problem(option, "needs the run's trace (trace.enabled is false)",
                                    given, "trace.enabled: true"))
            continue
        missing = [t for t in tables if t not in scen.trace.tables]
        if missing:
            problems.append(Problem(option, f"needs the trace's {', '.join(missing)} "
                                    f"table(s), which trace.tables leaves out", given,
                                    f"trace.tables including {', '.join(tables)}"))
    if problems:
        raise ScenarioError(problems)


class SummaryCommand(Command):
    name = "summary"
    help = "print the summary stored in a trace"

    def add_arguments(self, p):
        p.add_argument("trace", help="trace file (.h5)")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.add_argument("--all", action="store_true", help="print every summary key")

    def run(self, args):
        from twin.kernel.trace import open_trace

        path = _existing(args.trace)
        attrs = open_trace(path)
        if args.json:
            print(to_json(attrs["summary"]))
        else:
            print(f"trace {path} (schema {attrs.get('schema_version')}, twin "
                  f"{attrs.get('twin_version')}, seed {attrs.get('seed')})")
            print_summary(attrs["summary"], everything=args.all)
        return 0


def file_kind(raw: Any) -> str:
    """What an input file is: ``scenario``, ``campaign``, ``sweep`` or ``contention`` (by its
    keys: a sweep has a ``space``, a campaign a ``base`` without one, a contention map
    ``configurations``)."""
    if isinstance(raw, dict) and "base" in raw and "cluster" not in raw:
        return "sweep" if "space" in raw or "objectives" in raw else "campaign"
    if isinstance(raw, dict) and "configurations" in raw and "cluster" not in raw:
        return "contention"
    return "scenario"


#: The command that runs each kind of input file.
RUNS_KIND = {"scenario": "twin run", "campaign": "twin campaign", "sweep": "twin pareto",
             "contention": "twin contention"}


def kind_hint(cmd: Any, args: argparse.Namespace, exc: ScenarioError) -> str | None:
    """A line for an input file of another kind than the command runs (a sweep given to
    ``twin run``): its unknown keys are then all the other kind's, and one line saying what
    the file is helps more than that list. None otherwise, or when the file shows no sign
    of being another kind (a campaign or sweep needs ``base``, a contention map
    ``configurations``, a scenario ``cluster`` or ``workload``)."""
    from twin.kernel.schema import read_yaml

    want, arg = getattr(cmd, "input_kind", None), getattr(cmd, "input_name", "")
    path = getattr(args, arg, None) if arg else None
    if want is None or not isinstance(path, str) or not any(
            p.message.startswith("unknown key") for p in exc.problems):
        return None
    try:
        raw = read_yaml(path, "input")
    except ScenarioError:
        return None
    found = file_kind(raw)
    if found == want or not isinstance(raw, dict) or (
            found == "scenario" and not {"cluster", "workload"} & set(raw)):
        return None
    words = {"contention": "contention map"}
    return (f"hint: {path[:300]} is a {words.get(found, found)} file, not a "
            f"{words.get(want, want)} file: `{RUNS_KIND[found]}` runs it")


def check_file(path: str, overrides: list[str]) -> str:
    """Validate one scenario, campaign or sweep file (the kind is detected); returns a
    one-line description, raises ScenarioError with every problem."""
    from twin.kernel.schema import read_yaml

    raw = read_yaml(path, "input")
    kind = file_kind(raw)
    if kind == "scenario":
        from twin.kernel.schema import require_mapping
        from twin.scenario import load_scenario  # not twin.api: checking needs no simulator

        # a text document would otherwise be taken for the path of another file
        raw = require_mapping(raw, "scenario", "name, seed, cluster, workload, ...", path)
        scen = load_scenario(raw, overrides, source=str(Path(path)))  # read once
        if scen.trace.enabled:  # what `twin run` would refuse before simulating
            from twin.outputs import check_trace_path

            # force: an existing foreign file is `twin run --force`'s decision, not the file's
            check_trace_path(scen.trace_path, force=True)
        return f"scenario {scen.name}"
    if overrides:
        raise ScenarioError([Problem("--set", f"overrides apply to scenario files, not to a "
                                     f"{kind} file", overrides[0], "set keys in the file")],
                            source=path)
    if kind == "contention":
        from experiments.contention import load_map

        spec, cells = load_map(path)
        return f"contention map {spec.name}, {len(cells)} cells"
    if kind == "campaign":
        from experiments.campaign import load_campaign

        camp = load_campaign(path)
        return f"campaign {camp.spec.name}, {len(camp.runs)} runs"
    from experiments.sweep import load_sweep

    sweep = load_sweep(path)
    return f"sweep {sweep.spec.name}"


class CheckCommand(Command):
    name = "check"
    help = "validate scenario, campaign and sweep files without running them"

    def add_arguments(self, p):
        p.add_argument("scenarios", nargs="+", help="scenario, campaign or sweep YAML files")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key")

    def run(self, args):
        bad = 0
        for path in args.scenarios:
            try:
                what = check_file(path, args.set or [])
            except ScenarioError as exc:
                bad += 1
                if exc.source is None:
                    exc = ScenarioError(exc.problems, source=path[:300])
                print(f"FAIL {exc}", file=sys.stderr)
            else:
                print(f"ok   {path} ({what})")
        if bad:
            print(f"{bad} of {len(args.scenarios)} file(s) failed", file=sys.stderr)
        return EXIT_BAD_INPUT if bad else 0


class CatalogCommand(Command):
    name = "catalog"
    help = "list catalog entries (devices, links, models, hbm, failures, hosts)"

    def add_arguments(self, p):
        p.add_argument("kind", nargs="?",
                       choices=["devices", "links", "models", "hbm", "failures", "hosts"],
                       help="which catalog (default: all)")

    def run(self, args):
        from twin.catalogs import catalog, catalog_kinds

        for kind in [args.kind] if args.kind else catalog_kinds():
            print(f"{kind}:")
            for e in catalog(kind):
                v = e.values
                desc = v.get("description", "")
                print(f"  {e.name:<16} {desc}")
        return 0


class LimitsCommand(Command):
    name = "limits"
    help = "how far a trace is from its roofline, communication and Landauer bounds"

    def add_arguments(self, p):
        p.add_argument("trace", help="trace file (.h5) with ops and links tables")
        p.add_argument("--json", action="store_true", help="print JSON")

    def run(self, args):
        from twin.limits import format_limits, limits_from_trace

        path = _existing(args.trace)
        lim = limits_from_trace(path)
        if args.json:
            print(to_json(lim))
        else:
            print(f"limits of {path} (per iteration; orders of magnitude = log10(actual/bound))")
            print(format_limits(lim))
        return 0


class ExportCommand(Command):
    name = "export"
    help = "write a trace as a timeline for the Perfetto UI or chrome://tracing"

    def add_arguments(self, p):
        from twin.export import DEFAULT_MAX_MB, FORMATS

        p.add_argument("trace", help="trace file (.h5)")
        p.add_argument("-o", "--output", required=True,
                       help="output: RUN.pftrace (perfetto) or RUN.json[.gz] (chrome)")
        p.add_argument("--format", choices=FORMATS,
                       help="perfetto (protobuf) or chrome (Trace Event Format JSON); default: "
                            "from the file name")
        p.add_argument("--window", metavar="T0:T1", help="only this time window, seconds")
        p.add_argument("--devices", metavar="LIST",
                       help="only the rank classes holding these devices, e.g. 0-3,8")
        p.add_argument("--force", action="store_true",
                       help="overwrite an existing output that is not a timeline")
        p.add_argument("--max-mb", type=float, default=DEFAULT_MAX_MB,
                       help=f"cut the timeline to stay under this size (default "
                            f"{DEFAULT_MAX_MB:g} MB)")

    def run(self, args):
        from twin.export import export_trace
        from twin.outputs import check_output

        trace = _existing(args.trace)
        check_output(args.output, "-o", "timeline", args.force)
        r = export_trace(trace, args.output, args.format, args.window, args.devices,
                         args.max_mb)
        print(f"{r.format}: {r.path} ({r.slices} slices, {r.flows} flows, {r.counters} "
              f"counter values, {r.instants} instants)")
        if r.cut_at_s is not None:
            print(f"cut at t = {r.cut_at_s:.6g} s to stay under {args.max_mb:g} MB; use "
                  "--window / --devices for the rest", file=sys.stderr)
        return 0


class ReportCommand(Command):
    name = "report"
    help = "critical-path attribution, energy by component and position, bottleneck verdict"

    def add_arguments(self, p):
        add_report_arguments(p)
        p.add_argument("trace", help="trace file (.h5)")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        p.add_argument("--force", action="store_true",
                       help="overwrite an existing output that is not an HTML report")

    def run(self, args):
        from twin.outputs import check_output
        from twin.report import build_report, format_report

        trace = _existing(args.trace)
        if args.report_html:
            check_output(args.report_html, "-o", "html", args.force)
        rep = build_report(trace, args.sweep)
        if args.json:
            print(json.dumps(rep, indent=2))
        else:
            print(format_report(rep))
        if args.report_html:
            from twin.report import write_html

            print(f"report: {write_html(rep, trace, args.report_html)}",
                  file=sys.stderr if args.json else sys.stdout)
        return 0


def add_report_arguments(p: argparse.ArgumentParser, flag: str = "-o") -> None:
    """Arguments of the report (``twin report -o``; ``twin run --report``)."""
    p.add_argument(flag, "--output" if flag == "-o" else "--report", dest="report_html",
                   metavar="REPORT.html", help="write the HTML report here")
    p.add_argument("--sweep", metavar="DIR", help="a twin pareto output (points.csv) to name "
                                                  "the next-best strategy from")


class ValidateCommand(Command):
    name = "validate"
    help = "compare the twin with theory and published figures, printing the error of each"

    def add_arguments(self, p):
        p.add_argument("--only", action="append", metavar="CHECK",
                       help="run only these checks (repeatable; the names are listed by an "
                            "unknown one)")
        p.add_argument("--csv", help="also write the table as CSV")
        p.add_argument("--strict", action="store_true",
                       help="exit 1 if any row misses its target")

    def run(self, args):
        from twin.validate import CHECKS, format_report, run_checks

        for name in args.only or ():  # checked here: twin.validate is too heavy for --help
            if name not in CHECKS:
                raise ScenarioError([Problem("--only", "unknown check", name,
                                             ", ".join(sorted(CHECKS)))])
        if args.csv:
            from twin.outputs import check_output

            check_output(args.csv, "--csv", "table")
        df = run_checks(args.only)
        print(format_report(df))
        if args.csv:
            from twin.outputs import atomic_write

            atomic_write(args.csv, lambda tmp: df.to_csv(tmp, index=False))
        return 1 if args.strict and not df["ok"].all() else 0


class LazyCommand(Command):
    """A subcommand whose class lives in a heavy module (``module:Class``), imported only when
    the subcommand is parsed or run: ``twin --help`` and ``twin check`` do not load it."""

    def __init__(self, name: str, help: str, target: str):
        self.name, self.help, self._target = name, help, target
        self._cmd: Command | None = None

    def load(self) -> Command:
        """The real command object."""
        if self._cmd is None:
            import importlib

            module, cls = self._target.split(":")
            self._cmd = getattr(importlib.import_module(module), cls)()
        return self._cmd

    def add_arguments(self, p):
        self.load().add_arguments(p)

    def run(self, args):
        return self.load().run(args)


COMMANDS: list[Command] = [
    RunCommand(), SummaryCommand(), CheckCommand(), CatalogCommand(), LimitsCommand(),
    ExportCommand(), ReportCommand(), ValidateCommand(),
    LazyCommand("pareto", "energy-latency Pareto front of a sweep (exhaustive or NSGA-II, on "
                "Dask)", "experiments.pareto.command:ParetoCommand"),
    LazyCommand("campaign", "run a fault campaign (seeds x parameter grid) on Dask; results "
                "with CIs", "experiments.campaign:CampaignCommand"),
    LazyCommand("contention", "saturation-vs-collapse map of whole training runs (concurrency "
                "x HBM service)", "experiments.contention:ContentionCommand"),
]


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser with every subcommand (given ``argv``, only the subcommand it
    names declares its arguments: the others' modules stay unimported)."""
    p = argparse.ArgumentParser(prog="twin", description="meshtwin: digital twin of DL training "
                                "on 2D mesh / torus clusters")
    sub = p.add_subparsers(dest="command", required=True)
    chosen = None
    if argv is not None:
        names = {cmd.name for cmd in COMMANDS}
        chosen = next((a for a in argv if not a.startswith("-")), None)
        chosen = chosen if chosen in names else None
    for cmd in COMMANDS:
        sp = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if argv is None or cmd.name == chosen:
            cmd.add_arguments(sp)
        sp.set_defaults(_cmd=cmd)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``twin`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser(argv).parse_args(argv)
    try:
        return args._cmd.run(args)
    except (ScenarioError, TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        cmd = args._cmd.load() if isinstance(args._cmd, LazyCommand) else args._cmd
        hint = kind_hint(cmd, args, exc) if isinstance(exc, ScenarioError) else None
        if hint:
            print(hint, file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the rest of the output has nowhere to go
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # the machine, not the input: a full disk, a vanished folder
        # (inputs are read and checked before anything is written, so an OSError here is
        # mostly a write; HDF5 read errors carry no file name, so do not say which)
        where = exc.filename if exc.filename is not None else "a file or the output"
        print(f"error: input/output failed on {where}: {exc.strerror or exc}",
              file=sys.stderr)
        if exc.filename is None:  # most likely standard output
            _drop_stdout()
        return EXIT_OS_ERROR


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's final flush of what is
    still buffered does not fail again (Python's documented recipe for a broken pipe)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
