"""Run many independent tasks on Dask: a LocalCluster by default, an existing cluster by address.

Campaigns and sweeps submit one task per run; each task writes its own files and returns a
small picklable result. Results are yielded as they finish (with a progress bar), so callers
can persist each one immediately and never lose finished work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm


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
