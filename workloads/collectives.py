"""Collective algorithms as fabric phases, and their alpha-beta costs.

Groups are given as a 2-D array ``groups[g, i]``: device of member ``i`` of group ``g``, members
in ring order. All groups of one call run concurrently (their phases are merged), so groups
that share links contend. ``n`` is the per-rank buffer in bytes (the full vector for
all-reduce, the full output for all-gather, the full input for reduce-scatter).

Alpha-beta costs (Thakur, Rabenseifner, Gropp 2005; nccl-tests PERFORMANCE.md):
ring all-reduce ``2(p-1) alpha + 2(p-1)/p * n * beta``; ring reduce-scatter and all-gather
``(p-1) alpha + (p-1)/p * n * beta``.
"""

from __future__ import annotations

import numpy as np

from devices.fabric import Phase


def _ring_pairs(groups: np.ndarray, reverse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    g = np.asarray(groups, dtype=np.int64)
    nxt = np.roll(g, 1 if reverse else -1, axis=1)
    return g.ravel(), nxt.ravel()


def ring_allreduce(groups: np.ndarray, n: float) -> list[Phase]:
    """Ring all-reduce (reduce-scatter then all-gather): one phase of 2(p-1) steps."""
    p = np.shape(groups)[1]
    if p < 2 or n <= 0:
        return []
    src, dst = _ring_pairs(groups)
    return [Phase(src, dst, np.full(len(src), n / p), 2 * (p - 1))]


def ring_reduce_scatter(groups: np.ndarray, n: float) -> list[Phase]:
    """Ring reduce-scatter: p-1 steps of n/p bytes."""
    p = np.shape(groups)[1]
    if p < 2 or n <= 0:
        return []
    src, dst = _ring_pairs(groups)
    return [Phase(src, dst, np.full(len(src), n / p), p - 1)]


def ring_allgather(groups: np.ndarray, n: float) -> list[Phase]:
    """Ring all-gather: p-1 steps of n/p bytes."""
    return ring_reduce_scatter(groups, n)


def point_to_point(src: np.ndarray, dst: np.ndarray, n: float) -> list[Phase]:
    """Each ``src[i]`` sends ``n`` bytes to ``dst[i]`` (pipeline activations/gradients)."""
    src = np.asarray(src, dtype=np.int64)
    if len(src) == 0 or n <= 0:
        return []
    return [Phase(src, np.asarray(dst, dtype=np.int64), np.full(len(src), float(n)), 1)]


ALGORITHMS = {
    "allreduce": ring_allreduce,
    "reduce_scatter": ring_reduce_scatter,
    "allgather": ring_allgather,
}


def alpha_beta_time(kind: str, p: int, n: float, alpha: float, bandwidth: float) -> float:
    """Uncontended time of a ring collective, s (``bandwidth`` in bytes/s per direction)."""
    if p < 2:
        return 0.0
    if kind == "allreduce":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth
    if kind in ("reduce_scatter", "allgather"):
        return (p - 1) * alpha + (p - 1) / p * n / bandwidth
    raise ValueError(f"unknown collective {kind!r}")


def bus_bandwidth(kind: str, p: int, n: float, seconds: float) -> float:
    """nccl-tests bus bandwidth of a measured collective, bytes/s."""
    algbw = n / seconds
    factor = 2 * (p - 1) / p if kind == "allreduce" else (p - 1) / p
    return algbw * factor
