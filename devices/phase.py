"""What the fabric executes: a :class:`Phase` of bulk-synchronous rounds of pairwise
messages, the :class:`MessageRecord` it reports per executed phase, and the test whether a
ring phase may go to the flow engine as one lock-step flow (:func:`lockstep_ok`).

Plain data, no SimPy: ``workloads.collectives`` builds phases, ``devices.fabric`` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


def lockstep_ok(steps: int, routes: list, total: np.ndarray) -> bool:
    """Whether a phase's flows may go to the flow engine as one lock-step flow
    (``Fabric.lockstep_rings``): a bulk-synchronous phase (``steps > 1``: the rounds of a
    ring collective) of two or more flows of equal size, each with a route.

    The lock-step flow crosses every link of every member's route, a link as many times as
    members cross it, so max-min sharing gives all members one rate, the slowest member's (a
    weighted flow: ``twin.kernel.maxmin`` counts a repeated link entry as one more user).
    While the members' rates are equal (a ring alone, or rings in step) that is the per-step
    model exactly; under contention that varies along the ring the per-step model lets the
    faster members finish their chunk early and leave their links to others until the
    slowest reaches the barrier (an event per step and ring). Cutting the steps finer moves
    the per-step model to the lock-step one (GPT-3 175B, jitter 0.05, 4 microbatches, 1024
    devices: iteration 1.7403 s with a barrier per chunk, 1.7790 / 1.7833 s with 16 / 64 per
    chunk, lock-step 1.7853 s; ``tests/test_lockstep.py``). Used for every ring phase under
    the lock-step ring model (``Scenario.rings``, the default), and under ``step`` for
    tensor-parallel rings as a fast-mode shortcut (``allow_lockstep``: a TP ring is small and
    mostly alone on its links; 1024 devices: the same iteration time to 1e-14, 256: +0.13%)."""
    if steps <= 1 or len(routes) < 2 or not all(len(r) for r in routes):
        return False
    return bool(total[0] > 0 and np.all(total == total[0]))


def per_device(devices: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct devices, bytes summed per device): safe for ``counter[d] += b``."""
    uniq, inv = np.unique(devices, return_inverse=True)
    return uniq, np.bincount(inv, weights=nbytes, minlength=len(uniq))


@dataclass(frozen=True, eq=False)
class Phase:
    """``steps`` rounds; in each, ``src[i]`` sends ``nbytes[i]`` bytes to ``dst[i]``."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    steps: int = 1
    #: per-step latency set by a communication library's protocol model (``workloads.nccl``)
    #: in place of the links' sender overhead + hop latencies (None: the links'), s
    step_latency_s: float | None = None
    #: latency paid once per execution of the phase (the library's launch/base latency), s
    base_latency_s: float = 0.0
    #: hop latencies of the longest route the library's step latency already covers (routes
    #: that grow longer, e.g. around a failed link, add the difference per step), s
    hop_latency_ref_s: float = 0.0

    @property
    def total_bytes(self) -> float:
        """Bytes delivered by the phase."""
        return float(np.sum(self.nbytes)) * self.steps


class MessageRecord(NamedTuple):
    """What the fabric reports about one executed phase (one row of the ``messages`` table,
    fields in column order)."""

    t_start: float
    t_end: float
    name: str
    owner: int
    n_pairs: int
    steps: int
    bytes: float
    max_hops: int
    src: int
    dst: int
    plan: int = -1  # route plan (``Fabric.plan_links``); -1: routed around failures, no plan


__all__ = ["MessageRecord", "Phase", "lockstep_ok", "per_device"]
