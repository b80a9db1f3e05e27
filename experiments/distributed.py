"""Run many independent tasks on Dask: a LocalCluster by default, an existing cluster by address.

Campaigns and sweeps submit one task per run; each task writes its own files and returns a
small picklable result. Results are yielded as they finish (with a progress bar), so callers
can persist each one immediately and never lose finished work.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from tqdm import tqdm

from twin.kernel.errors import Problem, ScenarioError


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """``--workers N | --scheduler ADDRESS``, shared by every command that runs on Dask."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--workers", type=int,
                   help="local Dask worker processes (default: one per core; 0: run in this "
                        "process without Dask)")
    g.add_argument("--scheduler", help="address of an existing Dask scheduler (the output "
                                       "directory must be on a file system the workers share)")


def client_from_args(args: argparse.Namespace):
    """Context manager yielding the Dask client the arguments ask for (None for
    ``--workers 0``); a negative worker count is a field-named error."""
    if args.workers is not None and args.workers < 0:
        raise ScenarioError([Problem("--workers", "must be >= 0", args.workers,
                                     "0 (no Dask) or a number of processes")])
    if args.workers == 0:
        return nullcontext(None)
    return dask_client(args.workers, args.scheduler)


@contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None,
                threads_per_worker: int = 1):
    """A ``dask.distributed.Client``: connected to ``scheduler`` if given, otherwise to a new
    ``LocalCluster`` of ``workers`` single-threaded processes (default: one per core)."""
    from dask.distributed import Client, LocalCluster

    if scheduler:
        client = Client(scheduler)
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


def map_tasks(fn: Callable[[Any], Any], items: Iterable[Any], client,
              desc: str = "runs", progress: bool = True) -> Iterator[tuple[Any, Any]]:
    """Submit ``fn(item)`` for every item; yield ``(item, result)`` in completion order.

    A task that raises yields ``(item, exc)`` with the exception as result, so one bad run does
    not stop the others.
    """
    from dask.distributed import as_completed

    items = list(items)
    futures = {client.submit(fn, it, pure=False): it for it in items}
    bar = tqdm(total=len(items), desc=desc, disable=None if progress else True, unit="run")
    try:
        for fut in as_completed(futures):
            item = futures[fut]
            try:
                result = fut.result()
            except Exception as exc:  # reported to the caller per task
                result = exc
            bar.update(1)
            yield item, result
    finally:
        bar.close()
