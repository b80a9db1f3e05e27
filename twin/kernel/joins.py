"""Adding flows to a component, or taking them out, without solving it again when that is exact.

A max-min fair allocation is characterized by bottlenecks: every flow crosses a *saturated*
link on which no other flow has a larger rate (a flow crossing a link ``m`` times counts ``m``
times in its load, as in ``twin.kernel.maxmin``). Such an allocation is the max-min fair one,
and it is unique. So when a transfer joins a component whose allocation is max-min fair, give
its flows the max-min rates of the transfer alone on the capacity the component leaves on
its links (progressive filling, :func:`twin.kernel.maxmin._max_min_local`); if each of its
flows then has such a bottleneck (a link it saturates on which no old or new flow is faster),
the old flows keep theirs (a link the new flows cross is saturated only if they left no
residual, and then they got no rate and fail the test), so old rates and new ones together are
the max-min fair allocation of the larger component: nothing else needs solving
(:func:`extend`). Flows that stop free capacity only on their own links, so every remaining
flow whose bottleneck (recorded by the solve) is not one of those links keeps it, and if all
do, the remaining rates are the max-min allocation (:func:`shrink`). Otherwise the caller
solves the component as usual.

Out of step rings on thousands of devices join components of a hundred transfers and tens of
thousands of (flow, link) entries, and a join almost never changes the rates already there
(GPT-3 175B, 4096 devices, jitter, lock-step rings: 81,962 of 82,050 joins, and 68,554 of
87,766 departures): the check costs a pass over the component's entries instead of a solve.

Kernel: links are array indices with capacities, nothing of GPUs.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from twin.kernel.maxmin import _max_min_local
from twin.kernel.transfer import Component

#: relative slack of "saturated" and "no faster flow" (the progressive filling's own
#: tolerance for links reaching a level together)
_TOL = 1e-12


def extend(rate: np.ndarray, entry_flow: np.ndarray, ulinks: np.ndarray, inv: np.ndarray,
           cert: np.ndarray | None, local: np.ndarray, links: np.ndarray, n_new: int,
           capacity: np.ndarray, table: np.ndarray, jit: ModuleType | None = None
           ) -> tuple | None:
    """The component's allocation with ``n_new`` flows added, or None when the check fails.

    Args:
        rate, entry_flow, ulinks, inv: the component's max-min rates (bytes/s), each entry's
            flow, the links its entries cross and each entry's index into them.
        cert: each flow's bottleneck (index into ``ulinks``), or None if not known.
        local, links: the new flows' entries: flow (``0..n_new-1``) and link id.
        n_new: number of new flows.
        capacity: bytes/s of every link of the network.
        table: int64 scratch over every link of the network holding -1 (left so).
        jit: ``twin.kernel.maxmin_jit`` to sum the old entries' loads in one compiled pass
            (``crossed_loads``: the same additions in the same order), or None for NumPy.

    Returns:
        ``(rate, entry_flow, ulinks, inv, cert)`` of the component with the new flows after
        the old ones (old rates unchanged; new links after the old ones; ``cert`` None if it
        was), or None.
    """
    n_old_links = len(ulinks)
    table[ulinks] = np.arange(n_old_links)
    idx = table[links]
    table[ulinks] = -1
    fresh = idx < 0
    if fresh.any():
        new_links, fresh_inv = np.unique(links[fresh], return_inverse=True)
        idx[fresh] = n_old_links + fresh_inv
    else:
        new_links = links[:0]
    sub, sub_inv = np.unique(idx, return_inverse=True)      # the links the new flows cross
    crossed = np.zeros(n_old_links + len(new_links), dtype=bool)
    crossed[sub] = True
    if jit is not None:
        load, fastest = jit.crossed_loads(inv, entry_flow, rate, crossed)
    else:
        mine = crossed[inv]                                 # old entries on those links
        old_l, old_r = inv[mine], rate[entry_flow[mine]]
        load = np.zeros(len(crossed))
        np.add.at(load, old_l, old_r)
        fastest = np.zeros(len(crossed))
        np.maximum.at(fastest, old_l, old_r)
    cap = capacity[np.concatenate([ulinks, new_links])[sub]]
    y = _max_min_local(local, sub_inv, n_new, np.maximum(cap - load[sub], 0.0))
    if not (np.isfinite(y).all() and (y > 0.0).all()):
        return None
    y_ent = y[local]
    after = load[sub] + np.bincount(sub_inv, weights=y_ent, minlength=len(sub))
    top = fastest[sub]
    np.maximum.at(top, sub_inv, y_ent)
    ok = (after >= cap * (1 - _TOL))[sub_inv] & (y_ent >= top[sub_inv] * (1 - _TOL))
    held = np.full(n_new, -1, dtype=np.int64)
    held[local[ok]] = idx[ok]
    if (held < 0).any():
        return None
    return (np.concatenate([rate, y]), np.concatenate([entry_flow, local + len(rate)]),
            np.concatenate([ulinks, new_links]) if len(new_links) else ulinks,
            np.concatenate([inv, idx]), None if cert is None else np.concatenate([cert, held]))


def shrink(comp: Component, which: list[int], jit: ModuleType | None = None) -> tuple | None:
    """The allocation of ``comp`` after flows of its slices ``which`` stopped (ended, or
    parked at a step barrier), when it keeps every other rate; else None.

    A flow keeps its rate when its bottleneck (``comp.cert``) is a link no stopped flow
    crossed: that link stays saturated with nobody faster. Where no flow stopped (its flows
    stepped on) the flows and so the rates are the same. None also when a flow of ``which``
    started (a barrier released) or the bottlenecks are not known.

    Returns ``(rate, entry_flow, ulinks, inv, cert, tol, slices, keep)`` for the flows still
    active, links no longer crossed dropped (``ulinks`` the same object when none is), and
    ``keep``: which of the component's flows stay. ``jit``: ``twin.kernel.maxmin_jit`` to do
    the array work in one compiled call (``shrink_entries``: the same integers), or None for
    NumPy.
    """
    slices = comp.slices
    keep = np.ones(len(comp.rate), dtype=bool)
    for j in which:
        tr, lo, hi, act = slices[j]
        still = tr.active[act]
        if int(still.sum()) != int(tr.active.sum()):
            return None
        keep[lo:hi] = still
    cert = comp.cert
    if keep.all():
        return (comp.rate, comp.entry_flow, comp.ulinks, comp.inv, cert, comp.tol, slices, keep)
    if cert is None:
        return None
    ulinks = comp.ulinks
    if jit is not None:
        ok, entry_flow, inv, used, kept_cert = jit.shrink_entries(keep, comp.entry_flow,
                                                                  comp.inv, cert, len(ulinks))
        if not ok:
            return None
        if not used.all():
            ulinks = ulinks[used]
        return (comp.rate[keep], entry_flow, ulinks, inv, kept_cert, comp.tol[keep],
                _kept_slices(slices, which, keep), keep)
    ent_keep = keep[comp.entry_flow]
    freed = np.zeros(len(comp.ulinks), dtype=bool)
    freed[comp.inv[~ent_keep]] = True
    kept_cert = cert[keep]
    if (kept_cert < 0).any() or freed[kept_cert].any():
        return None
    entry_flow = (np.cumsum(keep) - 1)[comp.entry_flow[ent_keep]]
    inv = comp.inv[ent_keep]
    used = np.zeros(len(ulinks), dtype=bool)
    used[inv] = True
    if not used.all():
        lmap = np.cumsum(used) - 1
        inv, ulinks, kept_cert = lmap[inv], ulinks[used], lmap[kept_cert]
    return (comp.rate[keep], entry_flow, ulinks, inv, kept_cert, comp.tol[keep],
            _kept_slices(slices, which, keep), keep)


def _kept_slices(slices: list, which: list[int], keep: np.ndarray) -> list:
    """The component's slices with the stopped flows of slices ``which`` taken out."""
    out, n, wset = [], 0, set(which)
    for j, (tr, lo, hi, act) in enumerate(slices):
        if j in wset:
            act = act[keep[lo:hi]]
            if len(act) == 0:
                continue
        out.append((tr, n, n + len(act), act))
        n += len(act)
    return out


__all__ = ["extend", "shrink"]
