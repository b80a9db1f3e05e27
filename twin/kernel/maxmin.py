"""Max-min fair rates by progressive filling (vectorized in NumPy): the allocation
``twin.kernel.flows`` gives the flows of a component at every change.

This module is kernel: flows and links are array indices, capacities bytes/s.
"""

from __future__ import annotations

import numpy as np


def max_min_rates(entry_flow: np.ndarray, entry_link: np.ndarray, n_flows: int,
                  capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates by progressive filling.

    Args:
        entry_flow: flow index of each (flow, link) incidence entry.
        entry_link: link index of each entry (into ``capacity``).
        n_flows: number of flows; flows without entries get ``inf``.
        capacity: capacity of every link, bytes/s.

    Returns:
        rate of every flow, bytes/s.
    """
    if len(entry_flow) == 0:
        return np.full(n_flows, np.inf)
    links, local = np.unique(entry_link, return_inverse=True)
    return _max_min_local(entry_flow, local, n_flows, capacity[links])


def _max_min_local(entry_flow: np.ndarray, local: np.ndarray, n_flows: int,
                   cap: np.ndarray, cert: np.ndarray | None = None) -> np.ndarray:
    """Progressive filling with link indices already compacted to ``0..len(cap)-1``.

    ``cert`` (int64, one per flow), if given, receives for every flow with links a link that
    froze it: a link it saturated, on which no flow is faster (its bottleneck: of several,
    the one of its first entry; -1 for flows without links)."""
    rate = np.full(n_flows, np.inf)
    if cert is not None:
        cert[:] = -1
    rem = cap.astype(float)
    n_links = len(cap)
    # the entries of flows not yet frozen, compacted after every level (a frozen flow's
    # entries all leave at once), so that a level costs what is still live, not every entry
    ef, lk = entry_flow, local
    while len(lk):
        cnt = np.bincount(lk, minlength=n_links)
        used = cnt > 0
        share = np.full(n_links, np.inf)
        share[used] = rem[used] / cnt[used]
        level = share.min()
        bottleneck = used & (share <= level * (1 + 1e-12))
        newly = np.zeros(n_flows, dtype=bool)  # a mask, not np.unique: no sort per level
        on_b = bottleneck[lk]
        newly[ef[on_b]] = True
        if cert is not None:  # (reversed: the flow's first such entry is written last)
            cert[ef[on_b][::-1]] = lk[on_b][::-1]
        rate[newly] = level
        leaving = newly[ef]
        rem -= level * np.bincount(lk[leaving], minlength=n_links)
        np.maximum(rem, 0.0, out=rem)
        stay = ~leaving
        ef, lk = ef[stay], lk[stay]
    return rate
