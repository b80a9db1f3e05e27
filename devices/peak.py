"""The peak of the summed device power over a run, from the agents' power segments."""

from __future__ import annotations

import numpy as np


def peak_power(agents: list) -> float:
    """Peak of the summed device power over the run, W (exact, from the power segments of
    ``devices.accelerator.Accelerator`` agents, each standing for ``n`` devices)."""
    times, deltas = [], []
    for a in agents:
        seg = a.power_segments()
        if not len(seg):
            continue
        times += [seg[:, 0], seg[:, 1]]
        deltas += [seg[:, 2] * a.n, -seg[:, 2] * a.n]
    if not times:
        return 0.0
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    return float(np.cumsum(d[step_order(t, d)]).max())  # at equal times decreases first


def step_order(t: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``np.lexsort((d, t))``: the indices by time ``t``, then by change ``d``, then by
    index; so the running sum in this order applies decreases before increases at equal
    times. Faster where ``t`` is made of long sorted runs (each agent's segment starts, or
    ends): a stable sort of ``t`` merges the runs, and of the ties it leaves, those of two
    entries (one segment ending as the next starts) swap when out of order; only ties of
    three or more are sorted by ``d`` again. The same permutation, so the same sums to the
    bit (``tests/test_power_reference.py`` checks it against ``np.lexsort``)."""
    o = np.argsort(t, kind="stable")
    ts = t[o]
    n = len(o)
    if n < 2:
        return o
    first = np.empty(n, dtype=bool)  # an entry whose time differs from the previous one
    first[0] = True
    np.not_equal(ts[1:], ts[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    sizes = np.diff(starts, append=n)
    ds = d[o]
    pairs = starts[sizes == 2]
    swap = pairs[ds[pairs] > ds[pairs + 1]]  # (equal changes keep the index order)
    o[swap], o[swap + 1] = o[swap + 1], o[swap].copy()
    big = sizes > 2
    if big.any():
        gs, gz = starts[big], sizes[big]
        group = np.repeat(np.arange(len(gs)), gz)
        at = np.repeat(gs, gz) + np.arange(len(group)) - np.repeat(np.cumsum(gz) - gz, gz)
        sub = o[at]  # in index order within each tie (a stable sort)
        o[at] = sub[np.lexsort((d[sub], group))]
    return o
