"""Pre-drawn compute-jitter factors of an accelerator agent (``devices.accelerator``).

A block's duration is multiplied by a lognormal factor of mean 1 (``simulation.
compute_jitter_cov``). The factors are drawn :data:`JITTER_BLOCK` blocks at a time: a
Generator's array draw is the same sequence as that many scalar draws, so the factors are
the same, at a fraction of the cost per draw. A TP group run as one agent draws one factor
per member from each member's own generator.
"""

from __future__ import annotations

import numpy as np

JITTER_BLOCK = 1024  # compute-jitter factors drawn at once


class Factors:
    """One draw of :data:`JITTER_BLOCK` blocks' duration factors and the draw after it.

    ``f``: the factors; on a TP-group agent the members' factors of every block in one flat
    list (block ``i``: ``f[i * members:(i + 1) * members]``) and the blocks' largest and mean
    factors (``fmax``, ``fmean``): three lists, no container per block (a list and a tuple per
    block kept ~2,000 young objects per draw alive for the garbage collector to walk).
    ``next`` keeps the draw that followed, so an agent taken back to a checkpoint before it
    (``Accelerator.restore``) runs its blocks again with the same factors, not with a new
    draw from its generators, which have moved on."""

    __slots__ = ("f", "fmax", "fmean", "next")

    def __init__(self, f: list[float], fmax: list[float] | None = None,
                 fmean: list[float] | None = None):
        self.f, self.fmax, self.fmean = f, fmax, fmean
        self.next: Factors | None = None


def draw_after(buf: Factors, sigma: float, rng: np.random.Generator,
               members: list[np.random.Generator] | None) -> Factors:
    """The draw after ``buf``: ``buf.next`` if it was drawn already, else a new draw (from
    ``rng``, or one column per generator of ``members``) kept as ``buf.next``."""
    if buf.next is None:
        mu = -0.5 * sigma * sigma  # mean 1
        if members is None:
            buf.next = Factors(rng.lognormal(mu, sigma, JITTER_BLOCK).tolist())
        else:
            f = np.stack([g.lognormal(mu, sigma, JITTER_BLOCK) for g in members], axis=1)
            buf.next = Factors(f.ravel().tolist(), f.max(axis=1).tolist(),
                               f.mean(axis=1).tolist())
    return buf.next
