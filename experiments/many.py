"""Many runs: the skeleton every command that runs many twin runs shares.

``twin campaign`` (fault campaigns) and ``twin pareto`` (sweeps) differ in what they run and
what they make of the results; everything else is written once, here:

* the input file: :func:`load_spec_file` reads and validates a campaign or sweep file, and
  :func:`read_base` its ``base:`` scenario (a path relative to the file, or inline);
* the command line: :class:`ManyRunsCommand` declares ``FILE -o DIR [--workers N | --scheduler
  ADDRESS] [--resume] [--no-plots] [--quiet]`` (plus the command's own options), opens the
  Dask client and hands over;
* the Dask client: :func:`client_from_args` / :func:`dask_client` (a ``LocalCluster`` of
  single-threaded processes by default, an existing cluster by address, none for
  ``--workers 0``);
* running: :class:`TaskRunner` submits one task per run, on Dask or in this process, and
  yields ``(task, result)`` as they finish, with one progress bar (a task that raised yields
  its exception, so one bad run does not stop the others); on Dask at most ``window`` tasks
  are in flight at once, so a campaign of 100,000 runs does not flood the scheduler;
* resuming: a journal keeps every finished run as it arrives (:class:`RecordDir`: one JSON file
  per run; :class:`JsonLines`: one line per run); ``--resume`` reads it back, ignoring torn or
  unreadable records;
* writing: :func:`twin.outputs.atomic_write` and helpers: an output file is complete or absent.

Tasks write their own files and return small picklable results, so callers persist each one
immediately and never lose finished work. Heavy imports (Dask, tqdm, pandas) happen inside
the functions that need them: the ``twin`` CLI imports this module at start-up.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.schema import (
    int64_problems,
    merge_problems,
    problems_from_validation,
    read_yaml,
    require_mapping,
)
from twin.outputs import atomic_write


# ----------------------------------------------------------------------------- input files
def load_spec_file(path: str | Path | dict[str, Any], model: type[BaseModel], what: str,
                   keys: str) -> tuple[Any, str, Path]:
    """Read and validate a campaign or sweep file.

    Args:
        path: the YAML file, or an already parsed mapping (relative paths in it are then
            resolved against the working directory).
        model: the file's schema.
        what: what the file is, for messages (``campaign``, ``sweep``).
        keys: its main keys, for the message when the file is not a mapping.

    Returns:
        ``(spec, source, folder)``: the validated model, the name used in messages and the
        folder that relative paths in the file are relative to.

    Raises:
        ScenarioError: every problem found, each with its field path.
    """
    if isinstance(path, dict):
        raw, source, here = path, f"<{what}>", Path.cwd()
    else:
        p = Path(path)
        raw, source, here = read_yaml(p, what), str(p), p.parent
    require_mapping(raw, f"{what} file", keys, source)
    big = int64_problems(raw)
    try:
        spec = model.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(merge_problems(big, problems_from_validation(
            exc, model=model, document=raw)),
            source=source) from None
    if big:
        raise ScenarioError(big, source=source)
    return spec, source, here


def read_base(base: str | dict[str, Any], here: Path,
              problems: list[Problem]) -> dict[str, Any] | None:
    """The ``base:`` scenario of a campaign or sweep file, as a mapping.

    ``base`` is an inline mapping (returned as is) or a YAML file relative to ``here`` (the
    folder of the file naming it; a path that exists only relative to the working directory is
    accepted too). Returns None, with a problem under ``base`` added, when it cannot be read.
    """
    if isinstance(base, dict):
        return base
    try:
        p = Path(base) if Path(base).is_absolute() else here / base
        if not p.is_file() and Path(base).is_file():  # relative to the working directory
            p = Path(base)
        found = p.is_file()
    except (OSError, ValueError):
        found = False
    if not found:
        problems.append(Problem("base", "base scenario file not found", base[:200],
                                f"a scenario path relative to {here} or an inline mapping"))
        return None
    try:
        raw = read_yaml(p, "base scenario")
    except ScenarioError as exc:  # the reader's messages never quote the file's content
        problems.extend(Problem("base", f"{p}: {q.message}", None, q.allowed)
                        for q in exc.problems)
        return None
    if not isinstance(raw, dict):
        problems.append(Problem("base", "the base scenario must be a YAML mapping "
                                "(name, cluster, workload, ...)", str(p)))
        return None
    return raw


# ----------------------------------------------------------------------------- the command
class ManyRunsCommand:
    """A ``twin`` subcommand that runs many twin runs (same interface as ``twin.cli.Command``).

    Subclasses set ``name``, ``help``, ``input_name`` / ``input_help`` (the positional input
    file), ``resume_help``, and implement :meth:`load`, :meth:`compute` (runs while the Dask
    client is open) and :meth:`report` (after it is closed; returns the exit code).
    """

    name = ""
    help = ""
    input_name = "file"
    input_kind: str | None = None  # scenario / campaign / sweep / contention (twin.cli)
    input_help = ""
    resume_help = "reuse the runs an earlier (e.g. killed) invocation finished"
    quiet_help = "no progress bar"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """Declare the arguments: input, ``-o``, cluster, the command's own, resume, output."""
        p.add_argument(self.input_name, help=self.input_help)
        p.add_argument("-o", "--output", required=True, help="output directory")
        add_cluster_arguments(p)
        self.add_options(p)
        p.add_argument("--resume", action="store_true", help=self.resume_help)
        p.add_argument("--no-plots", action="store_true", help="skip the PNG files")
        p.add_argument("--quiet", action="store_true", help=self.quiet_help)

    def add_options(self, p: argparse.ArgumentParser) -> None:
        """Declare the command's own arguments (none by default)."""

    def run(self, args: argparse.Namespace) -> int:
        """Check the worker count, load the input, compute on the client the arguments ask
        for, report."""
        check_workers(args)
        job = self.load(args)
        check_output_dir(args.output)
        with client_from_args(args) as client:
            result = self.compute(job, args, client)
        return self.report(job, result, args)

    def load(self, args: argparse.Namespace) -> Any:
        """Read and validate the input (a ScenarioError for bad input)."""
        raise NotImplementedError

    def compute(self, job: Any, args: argparse.Namespace, client: Any) -> Any:
        """Run everything ``job`` needs (``client``: a Dask client, or None)."""
        raise NotImplementedError

    def report(self, job: Any, result: Any, args: argparse.Namespace) -> int:
        """Write and print the results; return the exit code."""
        raise NotImplementedError


def check_output_dir(path: str) -> Path:
    """An output directory that exists or can be made and takes new files (ScenarioError
    naming ``-o`` otherwise), checked before any run starts."""
    from twin.outputs import check_output

    if not path.strip():  # Path("") is the working directory: a slip, not a choice
        raise ScenarioError([Problem("-o", "not a usable directory name", path,
                                     "a directory path (created if absent)")])
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ScenarioError([Problem("-o", "is a file, not a directory", str(p)[:120],
                                     "a directory (created if absent)")])
    try:  # sane names; a file can be made inside
        check_output(p / "probe.tmp", "-o", "table")
    except ScenarioError as exc:  # name the directory given, not the probe file
        raise ScenarioError([Problem(q.path, q.message, str(p)[:120], q.allowed)
                             for q in exc.problems]) from None
    return p


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """``--workers N | --scheduler ADDRESS``, shared by every command that runs on Dask."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--workers", type=int,
                   help="local Dask worker processes (default: one per core; 0: run in this "
                        "process without Dask)")
    g.add_argument("--scheduler", help="address of an existing Dask scheduler (the output "
                                       "directory must be on a file system the workers share)")


def check_workers(args: argparse.Namespace) -> None:
    """A negative ``--workers``, or more than :func:`max_workers` processes (each loads the
    twin: a count by the thousand would fork the machine to death), is a field-named error."""
    most = max_workers()
    if args.workers is not None and not 0 <= args.workers <= most:
        raise ScenarioError([Problem(
            "--workers", "must be >= 0" if args.workers < 0 else "more worker processes than "
            "this machine can use", args.workers, f"0 (no Dask) .. {most} (four per core)")])


def client_from_args(args: argparse.Namespace):
    """Context manager yielding the Dask client the arguments ask for (None for
    ``--workers 0``); the worker count was checked by :func:`check_workers` first."""
    if args.workers == 0:
        return nullcontext(None)
    return dask_client(args.workers, args.scheduler)


def max_workers() -> int:
    """The most local worker processes ``--workers`` takes: four per core (the runs are
    CPU-bound, so more than one per core only helps a run waiting on its files)."""
    return 4 * (os.cpu_count() or 1)


@contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None,
                threads_per_worker: int = 1):
    """A ``dask.distributed.Client``: connected to ``scheduler`` if given, otherwise to a new
    ``LocalCluster`` of ``workers`` single-threaded processes (default: one per core).

    Raises:
        ValueError: a local cluster of fewer than one worker (its tasks would wait forever;
            ``--workers 0`` means no Dask at all, :func:`client_from_args`).
    """
    if not scheduler and workers is not None and workers < 1:
        raise ValueError(f"a local Dask cluster needs at least one worker, not {workers}")
    from dask.distributed import Client, LocalCluster

    if scheduler:
        try:
            client = Client(scheduler)
        except (OSError, ValueError, TypeError) as exc:  # a bad or unreachable address
            raise ScenarioError([Problem(
                "--scheduler", f"cannot connect to a Dask scheduler there "
                f"({type(exc).__name__}: {str(exc)[:200]})", scheduler[:300],
                "the address of a running scheduler, e.g. tcp://host:8786")]) from None
        try:
            yield client
        finally:
            client.close()
        return
    cluster = LocalCluster(n_workers=workers, threads_per_worker=threads_per_worker,
                           processes=True, dashboard_address=":0")
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


# ----------------------------------------------------------------------------- running
class TaskRunner:
    """Runs ``fn(task)`` for many tasks on a Dask client or, without one, in this process.

    Args:
        fn: the task function (picklable, for Dask).
        client: a ``dask.distributed.Client``, or None.
        progress: show a progress bar (tqdm; hidden when not a terminal).
    """

    def __init__(self, fn: Callable[[Any], Any], client: Any = None, progress: bool = True,
                 window: int = 1024):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.fn = fn
        self.client = client
        self.progress = progress
        self.window = window

    def map(self, tasks: Iterable[Any], desc: str = "runs") -> Iterator[tuple[Any, Any]]:
        """Yield ``(task, result)`` in completion order; a task that raised yields
        ``(task, exception)``."""
        from tqdm import tqdm

        tasks = list(tasks)
        if not tasks:
            return
        bar = tqdm(total=len(tasks), desc=desc, unit="run",
                   disable=None if self.progress else True)
        try:
            for task, result in (self._dask(tasks) if self.client is not None
                                 else self._serial(tasks)):
                bar.update(1)
                yield task, result
        finally:
            bar.close()

    def _serial(self, tasks: list[Any]) -> Iterator[tuple[Any, Any]]:
        for task in tasks:
            try:
                result = self.fn(task)
            except Exception as exc:  # reported to the caller per task
                result = exc
            yield task, result

    def _dask(self, tasks: list[Any]) -> Iterator[tuple[Any, Any]]:
        """Keep at most ``window`` tasks submitted; submit the next as each one finishes
        (millions of futures at once stall the client's connection to the scheduler)."""
        from dask.distributed import as_completed

        todo = iter(tasks)
        futures: dict[Any, Any] = {}  # in flight: future -> task

        def submit(n: int) -> list[Any]:
            """Submit the next ``n`` tasks (fewer when they run out); their futures."""
            new = []
            for task in itertools.islice(todo, n):
                fut = self.client.submit(self.fn, task, pure=False)
                futures[fut] = task
                new.append(fut)
            return new

        running = as_completed(submit(self.window))
        for fut in running:
            try:
                result = fut.result()
            except Exception as exc:  # reported to the caller per task
                result = exc
            running.update(submit(1))
            yield futures.pop(fut), result


#: Most runs one campaign or sweep may make (the driver holds every run's task and record in
#: memory and writes one table of them): a tool limit, named in the error, not a model number.
MAX_RUNS = 100_000


# ----------------------------------------------------------------------------- resuming
class RecordDir:
    """A journal of one JSON file per finished run, ``DIR/<key>.json``, each written
    atomically (by the worker that ran it, or by the driver)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def start(self) -> None:
        """Create the directory and remove temporaries a killed invocation left behind."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".*.tmp-*"):
            stale.unlink(missing_ok=True)

    def path(self, key: str) -> Path:
        """Where the record of run ``key`` goes."""
        return self.directory / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The record of run ``key``; None when it is missing or unreadable."""
        try:
            rec = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return rec if isinstance(rec, dict) else None

    def add(self, key: str, record: dict[str, Any]) -> None:
        """Store the record of run ``key`` unless its worker already did."""
        if not self.path(key).exists():
            atomic_write_json(self.path(key), record)


class JsonLines:
    """A journal of one JSON line per finished run, appended as runs finish; a torn last line
    (the invocation was killed while writing it) is ignored when reading and cut off when
    resuming (:meth:`start`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def start(self, resume: bool) -> list[dict[str, Any]]:
        """The records kept by an earlier invocation with ``resume``; otherwise start an empty
        journal (and return none). A torn last line is cut off the file when resuming, so the
        next record starts a line of its own (appended to the fragment, it was lost too)."""
        if resume and self.path.is_file():
            with self.path.open("r+b") as fh:
                data = fh.read()
                if data and not data.endswith(b"\n"):
                    data = data[: data.rfind(b"\n") + 1]
                    fh.truncate(len(data))
            out = []
            for line in data.decode("utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
            return out
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("", encoding="utf-8")
        return []

    def add(self, record: dict[str, Any]) -> None:
        """Append one finished run."""
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=str) + "\n")


# ----------------------------------------------------------------------------- writing
def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, obj: Any, **dumps: Any) -> Path:
    """Write ``obj`` as JSON (``json.dumps`` keyword arguments in ``dumps``) atomically."""
    return atomic_write_text(path, json.dumps(obj, **dumps))


def atomic_write_table(df: Any, path: str | Path) -> Path:
    """Write a DataFrame atomically, as Parquet (pyarrow) or CSV by the file's suffix."""
    if Path(path).suffix == ".parquet":
        return atomic_write(path, lambda tmp: df.to_parquet(tmp, engine="pyarrow", index=False))
    return atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))
