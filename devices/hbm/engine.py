""":func:`simulate`: groups requests by channel and runs the compiled FR-FCFS loop per channel (the
policy and the loop's organisation: :mod:`devices.hbm`; the loops: :mod:`devices.hbm.kernels`,
built ahead of time or just in time: :mod:`devices.hbm.aot`).
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from devices.hbm.requests import HbmRequests
from devices.hbm.result import HbmResult
from devices.hbm.spec import HbmSpec
from twin.kernel.errors import Problem, ScenarioError


def _channel_chunks(start: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Split channels into ``parts`` contiguous ranges of about equal request counts."""
    n_channels = start.shape[0] - 1
    if parts <= 1:
        return [(0, n_channels)]
    targets = np.linspace(0, start[-1], parts + 1)[1:-1]
    cuts = [0, *sorted({int(x) for x in np.searchsorted(start, targets)}), n_channels]
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _age_order(arrival: np.ndarray) -> np.ndarray:
    """Request indices by (arrival, index)."""
    n = arrival.shape[0]
    if n < 2 or bool(np.all(arrival[1:] >= arrival[:-1])):
        return np.arange(n, dtype=np.int64)
    return np.argsort(arrival, kind="stable").astype(np.int64)


def simulate(
    spec: HbmSpec, requests: HbmRequests, *, refresh: bool = True, workers: int = 1,
    build: str | None = None,
) -> HbmResult:
    """Simulate FR-FCFS scheduling of ``requests`` on one stack (compiled engine).

    Args:
        spec: the stack.
        requests: the requests (channel/bank indices within this stack).
        refresh: simulate all-bank refresh (True) or not (False, for what-if comparisons).
        workers: threads to spread the (independent) channels over; the result does not
            depend on it. The default 1 suits runs that are themselves parallel (Dask). More
            than one runs the JIT build (the threads need it to release the GIL).
        build: which build of the compiled loop (:func:`devices.hbm.aot.kernels`: ``"auto"``,
            ``"aot"``, ``"jit"``; None reads ``MESHTWIN_HBM_ENGINE``); the result does not
            depend on it.

    Returns:
        :class:`HbmResult` with per-request completion times (s) and kinds.

    Raises:
        ScenarioError: if requests are inconsistent with ``spec`` or ``workers < 1``.
    """
    if workers < 1:
        raise ScenarioError(Problem("workers", "must be >= 1", workers))
    requests.validate(spec)
    n = len(requests)
    if n >= 2**31 - 1:  # the engine links queued requests with int32 indices
        raise ScenarioError(Problem("requests", "too many requests for one call", n,
                                    "fewer than 2**31 - 1; split the stream"))
    completion = np.zeros(n, dtype=np.float64)
    kind = np.zeros(n, dtype=np.int8)
    if n:
        from devices.hbm.aot import kernels

        chunks_asked = min(workers, spec.channels)
        # threads need the JIT build: it releases the GIL (``nogil``), the extension does not
        k = kernels("jit" if chunks_asked > 1 else build)
        c = np.ascontiguousarray
        order, start, arr_c, bank_c, row_c, wr_c = k.group_by_channel(
            c(requests.channel, np.int32), _age_order(requests.arrival_s), spec.channels,
            c(requests.arrival_s, np.float64), c(requests.bank, np.int32),
            c(requests.row, np.int64), c(requests.is_write, np.bool_))
        args = (arr_c, bank_c, row_c, wr_c, order, start,
                spec.banks_per_channel, spec.bank_group_count, spec.queue_depth,
                spec.timing_s(), bool(refresh), completion, kind)
        chunks = _channel_chunks(start, chunks_asked)
        if len(chunks) == 1:
            status = [k.fr_fcfs_engine(*args, *chunks[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
                status = list(pool.map(lambda ch: k.fr_fcfs_engine(*args, *ch), chunks))
        if any(st != 0 for st in status):  # an invariant of the policy, not a user error
            raise RuntimeError("HBM engine stalled: no command could ever become ready")
    return HbmResult(spec=spec, requests=requests, completion_s=completion, kind=kind,
                     refresh=bool(refresh))
