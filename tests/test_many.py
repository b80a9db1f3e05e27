"""What the multi-run commands share (``experiments/many.py``): reading a ``base:`` scenario,
the task runner, the run journal and atomic writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.many import RecordDir, TaskRunner, atomic_write_text, read_base
from tests.conftest import scenario_dict


def _base(base, here: Path):
    problems: list = []
    return read_base(base, here, problems), [str(p) for p in problems]


def test_a_base_path_is_read_next_to_the_file_or_else_in_the_working_directory(
        tmp_path, monkeypatch):
    """``base: b.yaml`` is looked for in the folder of the file that names it, then (a path
    that exists only there) in the working directory; neither: one problem under ``base``."""
    here, cwd = tmp_path / "sweeps", tmp_path / "work"
    here.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    (cwd / "b.yaml").write_text(yaml.safe_dump(scenario_dict(name="in_cwd")))
    assert _base("b.yaml", here)[0]["name"] == "in_cwd"
    (here / "b.yaml").write_text(yaml.safe_dump(scenario_dict(name="next_to_it")))
    assert _base("b.yaml", here)[0]["name"] == "next_to_it"  # the file's folder first
    assert _base("nope.yaml", here) == (None, [
        f"base: base scenario file not found (given: 'nope.yaml'); allowed: a scenario path "
        f"relative to {here} or an inline mapping"])


def test_a_base_name_that_is_no_path_is_not_found_and_shown_shortened(tmp_path):
    for name in ("a\x00b.yaml", "x" * 5000):  # a NUL byte; a name too long for the system
        problems: list = []
        assert read_base(name, tmp_path, problems) is None
        (p,) = problems
        assert (p.path, p.message, p.value) == ("base", "base scenario file not found",
                                                name[:200])


def test_the_journal_keeps_what_a_worker_wrote(tmp_path):
    """``RecordDir.add`` stores a record that is not there yet, and leaves one that is (the
    worker that ran it wrote it first)."""
    journal = RecordDir(tmp_path / "out" / "runs")  # folders made as needed, kept if there
    journal.start()
    RecordDir(tmp_path / "out" / "runs").start()
    journal.add("r1", {"by": "driver"})
    assert journal.get("r1") == {"by": "driver"}
    atomic_write_text(journal.path("r2"), '{"by": "worker"}')
    journal.add("r2", {"by": "driver"})
    assert journal.get("r2") == {"by": "worker"}


def test_an_atomic_write_removes_dead_writers_leftovers_only(tmp_path):
    """Temporary files ``.NAME.tmp-PID`` left next to the target by a killed process are
    removed; those of a live process (still writing) and foreign names are kept."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "table.csv"
    left = tmp_path / f".table.csv.tmp-{dead.pid}"
    live = tmp_path / f".table.csv.tmp-{os.getppid()}"
    odd = tmp_path / ".table.csv.tmp-notapid"
    for p in (left, live, odd):
        p.write_text("partial")
    atomic_write_text(target, "a,b\n")
    assert target.read_text() == "a,b\n"
    assert not left.exists() and live.exists() and odd.exists()


def test_the_task_runner_shows_progress_unless_told_not_to(monkeypatch):
    """By default the bar is left to tqdm (shown on a terminal); ``progress=False`` hides it.
    A window of one task is allowed. The bar counts one per task that came back."""
    import tqdm

    seen, bars = [], []
    real = tqdm.tqdm

    def spy(*args, **kwargs):
        seen.append(kwargs["disable"])
        bar = real(*args, **kwargs)
        bars.append([0, kwargs["total"]])  # (a hidden bar counts nothing itself)
        update = bar.update
        bar.update = lambda n=1, rec=bars[-1]: (rec.__setitem__(0, rec[0] + n), update(n))
        return bar

    monkeypatch.setattr(tqdm, "tqdm", spy)
    assert list(TaskRunner(abs, window=1).map([-1])) == [(-1, 1)]
    assert list(TaskRunner(abs, progress=False).map([-2, 5, -7])) == [(-2, 2), (5, 5), (-7, 7)]
    assert seen == [None, True]
    assert bars == [[1, 1], [3, 3]]


def test_equal_tasks_on_dask_each_come_back():
    """Three equal tasks come back three times, each with its result."""
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        out = list(TaskRunner(abs, client, progress=False, window=2).map([-3, -3, -3]))
    assert out == [(-3, 3)] * 3


@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")
def test_a_local_dask_cluster_runs_single_threaded_workers():
    """``dask_client(workers)``: that many worker processes, one thread each (the twin's runs
    are single-threaded Python; two threads in a worker would share one GIL)."""
    from experiments.many import dask_client

    with dask_client(2) as client:
        assert sorted(client.nthreads().values()) == [1, 1]
        pids = set(client.run(os.getpid).values())  # processes, not threads of this one
        assert len(pids) == 2 and os.getpid() not in pids


def test_a_local_cluster_of_no_workers_is_refused_and_workers_0_means_no_dask():
    """A LocalCluster of 0 workers takes tasks and never runs them (a mutant that read
    ``--workers 0`` as such a cluster hung its test for 20 minutes): ``dask_client`` refuses
    it at once, and ``--workers 0`` gives no client."""
    import argparse

    from experiments.many import client_from_args, dask_client

    for n in (0, -1):
        with pytest.raises(ValueError, match="at least one worker"):
            with dask_client(n):
                pass
    with client_from_args(argparse.Namespace(workers=0, scheduler=None)) as client:
        assert client is None


@pytest.mark.parametrize("given,message", [
    ("", "not a usable directory name"),   # Path("") would be the working directory
    ("FILE", "is a file, not a directory"),
    ("FILE/sub", "cannot"),                # below a file: the error names the -o given
])
def test_an_output_directory_that_cannot_be_one_is_refused_by_its_given_name(
        tmp_path, given, message):
    from experiments.many import check_output_dir
    from twin.kernel.errors import ScenarioError

    (tmp_path / "FILE").write_text("x")
    path = given.replace("FILE", str(tmp_path / "FILE"))
    with pytest.raises(ScenarioError, match=message) as err:
        check_output_dir(path)
    (problem,) = err.value.problems
    assert (problem.path, problem.value) == ("-o", path)
    assert check_output_dir(str(tmp_path / "new" / "dir")) == tmp_path / "new" / "dir"


def test_a_run_journal_starts_empty_unless_resumed(tmp_path):
    """``JsonLines``: a new invocation (no ``--resume``) starts an empty journal even where
    an earlier one left records (they would otherwise count as done); a resumed one gets
    the records back, a torn last line (a kill while writing) and non-records skipped."""
    from experiments.many import JsonLines

    path = tmp_path / "a" / "b" / "runs.jsonl"  # folders made as needed, kept if there
    journal = JsonLines(path)
    assert journal.start(resume=True) == [] and path.read_text() == ""  # nothing to resume
    journal.add({"id": 1})
    journal.add({"id": 2})
    with path.open("a") as fh:
        fh.write('[3]\n{"id": 4')  # a list is no record; a torn line
    resumed = JsonLines(path)
    assert resumed.start(resume=True) == [{"id": 1}, {"id": 2}]
    # the first run finished after resuming is kept by the next resume (it was appended to
    # the torn fragment, one broken line, and lost)
    resumed.add({"id": 5})
    assert JsonLines(path).start(resume=True) == [{"id": 1}, {"id": 2}, {"id": 5}]
    assert JsonLines(path).start(resume=False) == [] and path.read_text() == ""


def test_the_task_runner_submits_at_most_the_documented_1024_runs():
    """README (fault campaigns): "on Dask at most 1,024 runs are submitted at a time"."""
    assert TaskRunner(abs).window == 1024
    with pytest.raises(ValueError, match="window"):
        TaskRunner(abs, window=0)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_table_is_written_with_its_columns_only(tmp_path, suffix):
    """``atomic_write_table``: the frame's columns and rows, no index column, in the format
    its suffix names."""
    import pandas as pd

    from experiments.many import atomic_write_table

    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}, index=[10, 20])
    path = atomic_write_table(df, tmp_path / f"t{suffix}")
    back = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    assert list(back.columns) == ["a", "b"] and back["a"].tolist() == [1, 2]
    assert path.read_bytes().startswith(b"PAR1") == (suffix == ".parquet")
