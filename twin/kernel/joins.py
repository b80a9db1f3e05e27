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
(:meth:`Ledger.join`). Flows that stop free capacity only on their own links, so every
remaining flow whose bottleneck (recorded by the solve) is not one of those links keeps it,
and if all do, the remaining rates are the max-min allocation (:func:`shrink`). Otherwise the
caller solves the component as usual.

Out of step rings on thousands of devices join components of a hundred transfers and tens of
thousands of (flow, link) entries, and a join almost never changes the rates already there
(GPT-3 175B, 4096 devices, jitter, lock-step rings: 66,655 of 66,743 joins, and 65,874 of
67,098 departures). So the checks must not cost a pass over the component's entries: a
:class:`Ledger` keeps, per link of the component, the load (sum of the rates of the entries
on it), an upper bound of the fastest rate on it and the number of entries, updated by what
joins and leaves. A join or departure then costs its own flows' entries.

Kernel: links are array indices with capacities, nothing of GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np

from twin.kernel.maxmin import _max_min_local
from twin.kernel.transfer import Component

#: relative slack of "saturated" and "no faster flow" (the progressive filling's own
#: tolerance for links reaching a level together)
_TOL = 1e-12


class Ledger:
    """Per-link totals of a component's active flows, kept through joins and departures.

    A component's links have *slots* ``0..n-1`` (``gl[slot]``: the link id). Per slot:
    ``load``, bytes/s (the sum of the rates of the entries on it, each entry once: a flow
    crossing the link twice counts twice), ``top``, bytes/s (at least the largest rate on it:
    the largest since the solve, as departures do not lower it), ``count`` (entries on it)
    and ``since``, s (the component's busy clock when the link last became crossed; see
    :meth:`flush`). A slot whose count fell to 0 stays until the component is solved again
    (a later join over its link uses it again).

    The network's tables ``lid`` (slot of each link) and ``lown`` (serial of the ledger that
    owns it) map link ids to slots in a few array operations; a link belongs to at most one
    component at a time, so a link whose owner is not this ledger has no slot here.

    The loads are sums kept up to date, not summed afresh: a departure subtracts, so they can
    differ from a fresh sum by rounding (~1e-16 relative per change, far below ``_TOL``). A
    slot that no entry crosses any more is reset to exactly 0.
    """

    __slots__ = ("count", "gl", "jit", "lid", "load", "lown", "n", "serial", "since", "top")

    def __init__(self, serial: int, lid: np.ndarray, lown: np.ndarray, ulinks: np.ndarray,
                 inv: np.ndarray, entry_flow: np.ndarray, rate: np.ndarray,
                 jit: ModuleType | None = None):
        """From a solved component: its ``ulinks``, each entry's index ``inv`` into them and
        flow ``entry_flow``, the flows' ``rate`` (bytes/s). Every link of ``ulinks`` is
        crossed, and its busy clock starts at 0 (the solve flushed the component's busy
        time). ``jit``: ``twin.kernel.maxmin_jit`` to sum the entries, and later to join and
        leave, in compiled passes (``link_totals``, ``ledger_slots``, ``ledger_join``,
        ``ledger_leave``: the same operations in the same order), or None for NumPy."""
        n = len(ulinks)
        self.jit = jit
        size = max(2 * n, 64)
        self.serial, self.lid, self.lown, self.n = serial, lid, lown, n
        self.gl = np.empty(size, dtype=np.int64)
        self.gl[:n] = ulinks
        self.load, self.top = np.zeros(size), np.zeros(size)
        self.count = np.zeros(size, dtype=np.int64)
        if jit is not None:
            self.load[:n], self.top[:n], self.count[:n] = jit.link_totals(inv, entry_flow,
                                                                          rate, n)
        else:
            entry_rate = rate[entry_flow]
            self.load[:n] = np.bincount(inv, weights=entry_rate, minlength=n)
            np.maximum.at(self.top, inv, entry_rate)
            self.count[:n] = np.bincount(inv, minlength=n)
        self.since = np.zeros(size)
        lid[ulinks] = np.arange(n)
        lown[ulinks] = serial

    def _grow(self, need: int) -> None:
        """Room for ``need`` slots (twice that, so that growth is rare)."""
        n, size = self.n, 2 * need
        for name in ("gl", "load", "top", "count", "since"):
            old = getattr(self, name)
            arr = np.zeros(size, dtype=old.dtype)
            arr[:n] = old[:n]
            setattr(self, name, arr)

    def _slots(self, links: np.ndarray) -> np.ndarray:
        """The slots of ``links``, new slots (all zero) for the links not here yet."""
        idx = np.where(self.lown[links] == self.serial, self.lid[links], -1)
        fresh = idx < 0
        if fresh.any():
            new, inv = np.unique(links[fresh], return_inverse=True)
            n, k = self.n, len(new)
            if n + k > len(self.gl):
                self._grow(n + k)
            self.gl[n:n + k] = new
            self.lid[new] = np.arange(n, n + k)
            self.lown[new] = self.serial
            self.n = n + k
            idx[fresh] = n + inv
        return idx

    def join(self, local: np.ndarray, links: np.ndarray, n_new: int, capacity: np.ndarray,
             busy: float) -> tuple[np.ndarray, np.ndarray] | None:
        """Rates for ``n_new`` joining flows that keep every old rate, or None when that
        would not be the max-min allocation (the ledger is then to be dropped: it may hold
        new empty slots).

        Args:
            local, links: the new flows' entries: flow (``0..n_new-1``) and link id.
            capacity: bytes/s of every link of the network.
            busy: the component's busy clock, s (for links crossed from now on).

        Returns:
            ``(rate, bottleneck)``: the new flows' rates, bytes/s, and for each a link id
            it saturates with no faster flow on it. The ledger then counts them.
        """
        jit = self.jit
        if jit is not None:
            return self._join_compiled(jit, local, links, n_new, capacity, busy)
        idx = self._slots(links)
        sub, sub_inv = np.unique(idx, return_inverse=True)  # the slots the new flows cross
        cap = capacity[self.gl[sub]]
        load = self.load[sub]
        if n_new == 1:  # (the progressive filling's one level: the same operations)
            y = (np.maximum(cap - load, 0.0) / np.bincount(sub_inv, minlength=len(sub))).min(
                keepdims=True)
        else:
            y = _max_min_local(local, sub_inv, n_new, np.maximum(cap - load, 0.0))
        if not (np.isfinite(y).all() and (y > 0.0).all()):
            return None
        y_ent = y[local]
        after = load + np.bincount(sub_inv, weights=y_ent, minlength=len(sub))
        top = self.top[sub]
        np.maximum.at(top, sub_inv, y_ent)
        ok = (after >= cap * (1 - _TOL))[sub_inv] & (y_ent >= top[sub_inv] * (1 - _TOL))
        held = np.full(n_new, -1, dtype=np.int64)
        held[local[ok]] = links[ok]
        if (held < 0).any():
            return None
        self.load[sub] = after
        self.top[sub] = top
        count = self.count[sub]
        self.since[sub[count == 0]] = busy
        self.count[sub] = count + np.bincount(sub_inv, minlength=len(sub))
        return y, held

    def _join_compiled(self, jit: ModuleType, local: np.ndarray, links: np.ndarray, n_new: int,
                       capacity: np.ndarray, busy: float
                       ) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`join` in two compiled passes (the same operations in the same order)."""
        sub, sub_inv, n = jit.ledger_slots(links, self.lid, self.lown, self.serial, self.gl,
                                           self.n)
        if n > len(self.gl):  # no room for the new slots: nothing was written
            self._grow(n)
            sub, sub_inv, n = jit.ledger_slots(links, self.lid, self.lown, self.serial,
                                               self.gl, self.n)
        self.n = n
        if n_new == 1:
            y = np.empty(1)
        else:
            rem = np.maximum(capacity[self.gl[sub]] - self.load[sub], 0.0)
            y = _max_min_local(local, sub_inv, n_new, rem)
        held = np.full(n_new, -1, dtype=np.int64)
        if not jit.ledger_join(local, links, sub, sub_inv, y, capacity, self.gl, self.load,
                               self.top, self.count, self.since, busy, _TOL, n_new == 1, held):
            return None
        return y, held

    def leave(self, links: np.ndarray, rates: np.ndarray, link_busy: np.ndarray,
              busy: float) -> None:
        """Take entries on ``links`` (ids, all crossed here) of rates ``rates`` out; a link
        no entry crosses any more gets its busy seconds (``busy`` - its ``since``) added to
        ``link_busy``."""
        if self.jit is not None:
            self.jit.ledger_leave(links, rates, self.lid, self.gl, self.load, self.top,
                                  self.count, self.since, link_busy, busy)
            return
        u, inv = np.unique(self.lid[links], return_inverse=True)
        self.load[u] -= np.bincount(inv, weights=rates, minlength=len(u))
        self.count[u] -= np.bincount(inv, minlength=len(u))
        dead = u[self.count[u] == 0]
        if len(dead):
            link_busy[self.gl[dead]] += busy - self.since[dead]
            self.load[dead] = 0.0
            self.top[dead] = 0.0

    def flush(self, link_busy: np.ndarray, busy: float) -> None:
        """Add to ``link_busy`` the busy seconds of every crossed link up to the busy clock
        ``busy``, s, and restart their clocks there. A link's busy time is the component's
        busy time (``FlowNetwork._advance_comp``) while it was crossed: the same seconds as
        adding the busy time to every crossed link at each change, summed differently."""
        n = self.n
        live = np.flatnonzero(self.count[:n] > 0)
        link_busy[self.gl[live]] += busy - self.since[live]
        self.since[live] = busy


def shrink(comp: Component, which: list[int], ledger: Callable[[Component], Ledger],
           link_busy: np.ndarray) -> tuple | None:
    """The allocation of ``comp`` after flows of its slices ``which`` stopped (ended, or
    parked at a step barrier), when it keeps every other rate; else None.

    A flow keeps its rate when its bottleneck (``comp.cert``, link ids) is a link no stopped
    flow crossed: that link stays saturated with nobody faster. Where no flow stopped (its
    flows stepped on) the flows and so the rates are the same. None also when a flow of
    ``which`` started (a barrier released) or the bottlenecks are not known. When the rates
    are kept, the component's ledger (``ledger(comp)``, asked for when a flow stopped) no
    longer counts the stopped flows, and the links they alone crossed get their busy seconds
    (``link_busy``).

    Returns ``(rate, cert, tol, slices, bounds, nstep, keep)`` for the flows still active
    (see :class:`~twin.kernel.transfer.Component`), with ``keep``: which of the component's
    flows stay.
    """
    slices, bounds = comp.slices, comp.bounds
    keep = np.ones(len(comp.rate), dtype=bool)
    gone = []
    for j in which:
        tr, act = slices[j]
        lo, hi = int(bounds[j]), int(bounds[j + 1])
        still = tr.active[act]
        n_still = int(still.sum())
        if n_still != int(tr.active.sum()):
            return None
        if n_still < len(act):
            keep[lo:hi] = still
            gone.append((tr, lo, act, still))
    if not gone:
        return comp.rate, comp.cert, comp.tol, slices, bounds, comp.nstep, keep
    cert = comp.cert
    if cert is None:
        return None
    kept_cert = cert[keep]
    if (kept_cert < 0).any():
        return None
    led = ledger(comp)
    links, rates = [], []
    for tr, lo, act, still in gone:  # the stopped flows' entries and rates
        at = np.full(len(tr.size), -1, dtype=np.int64)
        off = np.flatnonzero(~still)
        at[act[off]] = lo + off
        e_at = at[tr.entry_owner]
        mine = e_at >= 0
        links.append(tr.entry_link[mine])
        rates.append(comp.rate[e_at[mine]])
    links = links[0] if len(links) == 1 else np.concatenate(links)
    freed = np.zeros(led.n, dtype=bool)
    freed[led.lid[links]] = True
    if freed[led.lid[kept_cert]].any():
        return None
    led.leave(links, rates[0] if len(rates) == 1 else np.concatenate(rates), link_busy,
              comp.busy)
    return (comp.rate[keep], kept_cert, comp.tol[keep],
            *_kept_slices(slices, bounds, comp.nstep, which, keep), keep)


def _kept_slices(slices: list, bounds: np.ndarray, nstep: int, which: list[int],
                 keep: np.ndarray) -> tuple[list, np.ndarray, int]:
    """``(slices, bounds, nstep)`` of the component with the stopped flows of slices
    ``which`` taken out (a slice left without flows goes). The other slices stay as they
    are: the work is the changed slices' and array operations, not a loop over them all."""
    out = list(slices)
    lens = np.diff(bounds)
    empty = []
    for j in which:
        tr, act = slices[j]
        lo = int(bounds[j])
        act = act[keep[lo:lo + len(act)]]
        out[j] = (tr, act)
        lens[j] = len(act)
        if len(act) == 0:
            empty.append(j)
    for j in reversed(empty):
        nstep -= out[j][0].steps > 1
        del out[j]
    if empty:
        lens = np.delete(lens, empty)
    new = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=new[1:])
    return out, new, nstep


__all__ = ["Ledger", "shrink"]
