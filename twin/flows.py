"""Flow-level network engine: transfers share link bandwidth max-min fairly.

A *transfer* is a set of flows started together (one phase of a collective, or one
point-to-point send). Each flow has a route (directed link ids) and a byte count. While flows
are active, every link's capacity is shared max-min fairly among the flows crossing it
(progressive filling, vectorized in NumPy). Rates change only when a flow starts or ends, so
the engine schedules one SimPy timeout per change, not per packet. A transfer completes
``latency`` seconds after its last byte drains.

This module is kernel: it knows links only as array indices with capacities, nothing of GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import simpy

_REL_EPS = 1e-9


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
    rate = np.full(n_flows, np.inf)
    if len(entry_flow) == 0:
        return rate
    links, local = np.unique(entry_link, return_inverse=True)
    rem = capacity[links].astype(float)
    frozen = np.zeros(n_flows, dtype=bool)
    has_entry = np.zeros(n_flows, dtype=bool)
    has_entry[entry_flow] = True
    live = np.ones(len(entry_flow), dtype=bool)
    while live.any():
        cnt = np.bincount(local[live], minlength=len(links))
        used = cnt > 0
        share = np.full(len(links), np.inf)
        share[used] = rem[used] / cnt[used]
        level = share.min()
        bottleneck = used & (share <= level * (1 + 1e-12))
        hit = live & bottleneck[local]
        newly = np.unique(entry_flow[hit])
        rate[newly] = level
        frozen[newly] = True
        leaving = live & frozen[entry_flow]
        rem -= level * np.bincount(local[leaving], minlength=len(links))
        np.maximum(rem, 0.0, out=rem)
        live &= ~leaving
    rate[~has_entry] = np.inf
    return rate


@dataclass(eq=False)
class Transfer:
    """A set of flows started together; ``done`` fires when all have drained + latency."""

    id: int
    routes: list[np.ndarray]
    size: np.ndarray            # bytes per flow
    remaining: np.ndarray       # bytes per flow still to send
    latency: float
    done: simpy.Event
    start: float
    tag: object = None
    active: np.ndarray = field(default=None)  # bool per flow: currently in the network

    def __post_init__(self) -> None:
        if self.active is None:
            self.active = self.remaining > 0
        self.reindex()

    def reindex(self) -> None:
        """Rebuild the concatenated (flow, link) incidence after routes change."""
        lens = np.fromiter((len(r) for r in self.routes), dtype=np.int64, count=len(self.routes))
        self.entry_owner = np.repeat(np.arange(len(self.routes)), lens)
        self.entry_link = (np.concatenate(self.routes) if len(self.routes)
                           else np.empty(0, dtype=np.int64))


class FlowNetwork:
    """Max-min fair sharing of link capacities among the flows of active transfers.

    Args:
        env: the SimPy environment (the clock).
        capacity: bytes/s of each directed link.
        on_finish: optional callback ``f(transfer)`` when a transfer completes.
    """

    def __init__(self, env: simpy.Environment, capacity: np.ndarray,
                 on_finish: Callable[[Transfer], None] | None = None):
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float)
        self.on_finish = on_finish
        self.transfers: dict[int, Transfer] = {}
        self._next_id = 0
        self._gen = 0
        self._last = env.now
        # per-link accounting
        self.link_bytes = np.zeros(len(self.capacity))
        self.link_busy = np.zeros(len(self.capacity))
        # current allocation: (transfer, first flow, end flow, active flow indices)
        self._slices: list[tuple[Transfer, int, int, np.ndarray]] = []
        self._rate: np.ndarray = np.empty(0)
        self._busy_links: np.ndarray = np.empty(0, dtype=np.int64)
        self._entry_flow: np.ndarray = np.empty(0, dtype=np.int64)
        self._entry_link: np.ndarray = np.empty(0, dtype=np.int64)
        self.recomputes = 0

    # ----------------------------------------------------------------- public
    def transfer(self, routes: Sequence[Sequence[int]], nbytes: Sequence[float] | np.ndarray,
                 latency: float = 0.0, tag: object = None) -> Transfer:
        """Start a transfer of ``nbytes[i]`` over ``routes[i]``; returns its handle."""
        self._advance()
        size = np.asarray(nbytes, dtype=float)
        rts = [np.asarray(r, dtype=np.int64) for r in routes]
        remaining = size.copy()
        remaining[[len(r) == 0 for r in rts]] = 0.0  # local copies cost nothing on links
        tr = Transfer(self._next_id, rts, size, remaining, float(latency), self.env.event(),
                      self.env.now, tag)
        self._next_id += 1
        self.transfers[tr.id] = tr
        if not tr.active.any():
            self._complete(tr)
        else:
            self._reallocate()
        return tr

    def fail_links(self, links: Sequence[int]) -> list[tuple[Transfer, np.ndarray]]:
        """Cut every active flow crossing ``links``; returns ``(transfer, flow indices)``.

        Cut flows keep their remaining bytes and stop; the caller re-sends them with
        :meth:`resume` on new routes (after its timeout). Their transfer stays pending.
        """
        self._advance()
        bad = set(int(x) for x in links)
        cut: list[tuple[Transfer, np.ndarray]] = []
        for tr in self.transfers.values():
            idx = [i for i in np.flatnonzero(tr.active) if bad.intersection(tr.routes[i].tolist())]
            if idx:
                ix = np.asarray(idx, dtype=np.int64)
                tr.active[ix] = False
                cut.append((tr, ix))
        if cut:
            self._reallocate()
        return cut

    def resume(self, tr: Transfer, flows: np.ndarray, routes: Sequence[Sequence[int]]) -> None:
        """Put cut flows of ``tr`` back on new ``routes`` with their remaining bytes."""
        self._advance()
        for i, r in zip(flows, routes, strict=True):
            tr.routes[int(i)] = np.asarray(r, dtype=np.int64)
            if len(r) == 0:
                tr.remaining[int(i)] = 0.0
            tr.active[int(i)] = tr.remaining[int(i)] > 0
        tr.reindex()
        if tr.active.any():
            self._reallocate()
        elif not tr.done.triggered and (tr.remaining <= 0).all():
            self._complete(tr)

    @property
    def n_active_flows(self) -> int:
        """Flows currently sending."""
        return len(self._rate)

    def rates(self) -> dict[int, np.ndarray]:
        """Current rate of each flow, per transfer id (bytes/s; 0 for inactive flows)."""
        out = {tid: np.zeros(len(tr.size)) for tid, tr in self.transfers.items()}
        for tr, lo, hi, act in self._slices:
            out[tr.id][act] = self._rate[lo:hi]
        return out

    # ----------------------------------------------------------------- internals
    def _advance(self) -> None:
        """Drain bytes at current rates up to now and account link usage."""
        now = self.env.now
        dt = now - self._last
        self._last = now
        if dt <= 0 or len(self._rate) == 0:
            return
        sent = self._rate * dt
        for tr, lo, hi, act in self._slices:
            rem = tr.remaining[act] - sent[lo:hi]
            tr.remaining[act] = np.maximum(rem, 0.0)
        per_entry = self._rate[self._entry_flow] * dt
        self.link_bytes += np.bincount(self._entry_link, weights=per_entry,
                                       minlength=len(self.capacity))
        self.link_busy[self._busy_links] += dt

    def _reallocate(self) -> None:
        """Recompute max-min rates of all active flows and schedule the next completion."""
        self.recomputes += 1
        slices, ent_f, ent_l, rems = [], [], [], []
        n = 0
        for tr in self.transfers.values():
            act = np.flatnonzero(tr.active)
            if len(act) == 0:
                continue
            pos = np.empty(len(tr.size), dtype=np.int64)
            pos[act] = np.arange(n, n + len(act))
            m = tr.active[tr.entry_owner]
            ent_f.append(pos[tr.entry_owner[m]])
            ent_l.append(tr.entry_link[m])
            rems.append(tr.remaining[act])
            slices.append((tr, n, n + len(act), act))
            n += len(act)
        self._slices = slices
        self._entry_flow = np.concatenate(ent_f) if ent_f else np.empty(0, dtype=np.int64)
        self._entry_link = np.concatenate(ent_l) if ent_l else np.empty(0, dtype=np.int64)
        self._busy_links = np.unique(self._entry_link)
        self._rate = max_min_rates(self._entry_flow, self._entry_link, n, self.capacity)
        self._gen += 1
        if n == 0:
            return
        dt = float(np.min(np.concatenate(rems) / self._rate))
        gen = self._gen
        self.env.timeout(max(dt, 0.0)).callbacks.append(lambda _e, g=gen: self._on_timer(g))

    def _on_timer(self, gen: int) -> None:
        if gen != self._gen:
            return  # the allocation changed since this timer was set
        self._advance()
        finished: list[Transfer] = []
        for tr, _lo, _hi, act in self._slices:
            tol = np.maximum(tr.size[act] * _REL_EPS, 1e-6)
            done = act[tr.remaining[act] <= tol]
            tr.remaining[done] = 0.0
            tr.active[done] = False
            if not tr.active.any() and (tr.remaining <= 0).all():
                finished.append(tr)
        for tr in finished:
            self._complete(tr)
        self._reallocate()

    def _complete(self, tr: Transfer) -> None:
        del self.transfers[tr.id]

        def fire(_e: object = None) -> None:
            tr.done.succeed(tr)
            if self.on_finish is not None:
                self.on_finish(tr)

        if tr.latency > 0:
            self.env.timeout(tr.latency).callbacks.append(fire)
        else:
            fire()
