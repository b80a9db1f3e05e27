"""The state of the flow engine's transfers (``twin.kernel.flows``): a transfer's flows, their
remaining bytes and step barrier, the route pattern transfers of one key share, and the
component (transfers connected through shared links) an allocation is made for.

Kernel: links are array indices, nothing of GPUs. The engine itself (allocation, timers,
failures) is :class:`twin.kernel.flows.FlowNetwork`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

_REL_EPS = 1e-9  # a flow is done when at most this share of its bytes (or 1e-6 B) is left

__all__ = ["Component", "Template", "Transfer"]


class Template:
    """What transfers with the same route-pattern key share: incidence and link totals."""

    __slots__ = ("all_flows", "entry_link", "entry_owner", "link_bytes", "links", "per_steps",
                 "routed", "routes", "serial", "ulinks", "vlinks")

    def __init__(self, serial: int, routes: list[np.ndarray], size: np.ndarray,
                 variable: np.ndarray | None = None):
        self.serial = serial
        self.routes = routes
        self.all_flows = np.arange(len(routes))
        self.routed = all(len(r) for r in routes)
        lens = np.fromiter((len(r) for r in routes), dtype=np.int64, count=len(routes))
        self.entry_owner = np.repeat(np.arange(len(routes)), lens)
        self.entry_link = np.concatenate(routes) if routes else np.empty(0, dtype=np.int64)
        self.ulinks, inv = np.unique(self.entry_link, return_inverse=True)
        self.link_bytes = np.bincount(inv, weights=size[self.entry_owner],
                                      minlength=len(self.ulinks))
        self.links = frozenset(self.ulinks.tolist())
        self.per_steps: dict[int, tuple] = {}  # steps -> Transfer's step arrays
        # its links whose capacity may change (FlowNetwork.set_capacity): part of the key of
        # a cached allocation
        self.vlinks = (self.ulinks[variable[self.ulinks]] if variable is not None
                       else np.empty(0, dtype=np.int64))


def _step_arrays(size: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(bytes per step, 1 / bytes per step or 0, equal sizes)`` of flows of ``size``
    bytes moved in ``steps`` steps (see :class:`Transfer`)."""
    step_size = size / steps
    pos = size > 0
    per_step = np.zeros(len(size))
    per_step[pos] = steps / size[pos]
    for a in (step_size, per_step):
        a.setflags(write=False)
    return step_size, per_step, steps > 1 and len(size) > 0 and float(np.ptp(size)) == 0.0


class Transfer:
    """A set of flows started together; ``done`` fires when all have drained + latency.

    ``on_done`` holds plain callbacks ``f(transfer)`` run at that moment (cheaper than waiting
    on the SimPy event, which is only created when someone asks for ``done``).
    """

    def __init__(self, tid: int, routes: list[np.ndarray], size: np.ndarray, latency: float,
                 env: simpy.Environment, start: float, tag: object = None,
                 template: Template | None = None, steps: int = 1):
        self.id = tid
        self.steps = max(1, int(steps))
        # bytes of each flow per step, 1 / step bytes (0 for empty flows), equal bytes per
        # flow (collectives: in step whenever rates and remaining bytes agree); read only, so
        # shared by the transfers of a template (equal keys mean equal sizes)
        per = template.per_steps.get(self.steps) if template is not None else None
        if per is None:
            per = _step_arrays(size, self.steps)
            if template is not None:
                template.per_steps[self.steps] = per
        self.step_size, self._per_step, self.uniform = per
        self.parked = np.zeros(len(size), dtype=bool)  # finished the current step, waiting
        self._env = env
        self._done: simpy.Event | None = None
        self.finished = False
        self.on_done: list[Callable[[Transfer], None]] = []
        self.routes = routes
        self.size = size
        self.remaining = size.copy()
        self.base = size.copy()   # remaining bytes when each flow's current route started
        self.latency = latency
        self.start = start
        self.tag = tag
        self.template = template
        self.comp: Component | None = None
        self.whole = False  # every flow still active on its original route
        self._inc: tuple | None = None  # (active mask bytes, incidence()) of the last call
        if template is not None and template.routed:
            self.whole = True
            self.active = np.ones(len(size), dtype=bool)
            self.entry_owner = template.entry_owner
            self.entry_link = template.entry_link
            self.links = template.links
        else:
            self.template = None
            self.remaining[[len(r) == 0 for r in routes]] = 0.0  # local copies cost nothing
            self.active = self.remaining > 0
            self.reindex()

    @property
    def done(self) -> simpy.Event:
        """SimPy event that fires (value: the transfer) when the transfer has completed."""
        if self._done is None:
            self._done = self._env.event()
            if self.finished:
                self._done.succeed(self)
        return self._done

    def incidence(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """``(active flows, entry flow as index into them, entry link, done tolerance)`` of
        the active flows' (flow, link) entries, bytes; None when no flow is active. Cached
        until the active set (or, through :meth:`reindex`, the routes) changes: a component
        asks for it at every change of its rates, mostly with the same flows active."""
        key = self.active.tobytes()
        c = self._inc
        if c is not None and c[0] == key:
            return c[1]
        act = np.flatnonzero(self.active)
        val = None
        if len(act):
            pos = np.empty(len(self.size), dtype=np.int64)
            pos[act] = np.arange(len(act))
            m = self.active[self.entry_owner]
            val = (act, pos[self.entry_owner[m]], self.entry_link[m],
                   np.maximum(self.size[act] * _REL_EPS, 1e-6))
        self._inc = (key, val)
        return val

    def reindex(self) -> None:
        """Rebuild the concatenated (flow, link) incidence after routes change."""
        self._inc = None
        lens = np.fromiter((len(r) for r in self.routes), dtype=np.int64, count=len(self.routes))
        self.entry_owner = np.repeat(np.arange(len(self.routes)), lens)
        self.entry_link = (np.concatenate(self.routes) if len(self.routes)
                           else np.empty(0, dtype=np.int64))
        self.links = self.active_links()

    def active_links(self) -> frozenset[int]:
        """Links crossed by the flows still sending or parked at a step barrier (a parked
        flow sends again on them when the barrier opens: the engine keeps them in the link
        index, and the transfer in its component, meanwhile)."""
        return frozenset(self.entry_link[(self.active | self.parked)[self.entry_owner]]
                         .tolist())

    def steps_left(self) -> np.ndarray:
        """Steps each flow has not finished (a flow at a step end has finished that step)."""
        q = np.ceil(self.remaining * self._per_step - 1e-6)
        return np.maximum(q, 0.0, out=q)

    def park_ahead(self) -> None:
        """Park active flows that finished the current step while others have not; release
        every parked flow when none is behind (the barrier released)."""
        if self.steps == 1:
            return
        pending = self.remaining > 0
        if not pending.any():
            return
        left = self.steps_left()
        top = left[pending].max()
        ahead = pending & (left < top)
        if ahead.any():
            newly = ahead & self.active
            self.active[newly] = False
            self.parked |= newly
            return
        if self.parked.any():  # every unfinished flow is at the same step: go on together
            self.active |= self.parked
            self.parked[:] = False


class Component:
    """Transfers connected through shared links, with their current allocation."""

    __slots__ = ("bounds", "buf", "busy", "cert", "due", "entry_flow", "fill", "gen", "inv",
                 "last", "ledger", "nstep", "offs", "pos", "rate", "slices", "statics", "target",
                 "tol", "transfers", "ulinks")
    # busy: seconds the current allocation has run (added to its links' busy time on change;
    # with a ledger, the clock its links' busy time is read from: joins.Ledger.flush)

    def __init__(self, now: float):
        self.transfers: dict[int, Transfer] = {}
        self.last = now
        self.gen = 0
        # (transfer, its active flows) in the order of the allocation's flows; slice j's
        # flows are bounds[j]:bounds[j + 1] of rate; nstep: slices of stepped transfers
        self.slices: list[tuple[Transfer, np.ndarray]] = []
        self.bounds = np.zeros(1, dtype=np.int64)
        self.nstep = 0
        self.rate = np.empty(0)
        # the last solve's (flow, link) entries and links: out of date once a ledger keeps
        # the component through joins and departures (twin.kernel.joins.Ledger)
        self.entry_flow = np.empty(0, dtype=np.int64)
        self.ulinks = np.empty(0, dtype=np.int64)
        self.inv = np.empty(0, dtype=np.int64)
        self.due = np.empty(0, dtype=bool)
        self.tol = np.empty(0)  # remaining bytes at or below which a flow is done
        self.target = None  # remaining bytes of each flow at its next step end (stepped only)
        # (ids of the stepped transfers, what the compiled step targets take of them that
        # does not change): kept by twin.kernel.steps.step_targets_compiled
        self.statics: tuple | None = None
        self.busy = 0.0
        self.cert: np.ndarray | None = None  # each flow's bottleneck link (twin.kernel.joins)
        self.ledger = None  # its links' loads, kept through joins and departures (same)
        # the remaining bytes of its transfers in one array (see index)
        self.buf: np.ndarray | None = None
        self.fill = -1  # entries of buf in use (-1: buf is one transfer's own array)
        self.offs: dict[int, int] = {}
        self.pos = np.empty(0, dtype=np.int64)

    def set_slices(self, slices: list[tuple[Transfer, np.ndarray]]) -> int:
        """Hold ``slices`` (transfer, active flows) with their bounds; returns the flows."""
        self.slices = slices
        self.bounds = np.zeros(len(slices) + 1, dtype=np.int64)
        np.cumsum(np.fromiter((len(act) for _tr, act in slices), dtype=np.int64,
                              count=len(slices)), out=self.bounds[1:])
        self.nstep = sum(tr.steps > 1 for tr, _act in slices)
        return int(self.bounds[-1])

    def index(self, added: Transfer | None = None, kept: np.ndarray | None = None) -> None:
        """Keep the remaining bytes of the active flows of ``slices`` in one array, so that
        draining them (``FlowNetwork._advance_comp``) and reading them is one array
        operation, not one per transfer: ``buf[pos]`` in slice order.

        A component of one transfer uses that transfer's own ``remaining``. Otherwise each
        transfer's ``remaining`` is a view into ``buf`` at ``offs[id]``: the values are
        copied there once (the same numbers, stored together) and every later write to a
        transfer's ``remaining`` lands in ``buf``. ``buf`` has room to spare, so a transfer
        ``added`` to the slices since the last call (nothing else changed) is placed in it
        without moving the others; a transfer not in ``buf`` otherwise moves all. ``kept``:
        which of the active flows of the last call are still active, when flows only stopped
        since (a departure: their order is kept, so ``pos`` is the kept part of the last)."""
        slices = self.slices
        if len(slices) == 1:
            tr, act = slices[0]
            self.buf, self.pos, self.fill = tr.remaining, act, -1
            return
        if kept is not None and self.fill >= 0:
            self.pos = self.pos[kept]
            return
        buf = self.buf
        if added is not None and self.fill >= 0:
            n = len(added.remaining)
            at = self.fill
            if at + n <= len(buf):
                buf[at:at + n] = added.remaining
                added.remaining = buf[at:at + n]
                self.offs[added.id] = at
                self.fill = at + n
                self.pos = np.concatenate([self.pos, slices[-1][1] + at])
                return
        if self.fill < 0 or not all(sl[0].remaining.base is buf for sl in slices):
            trs = list(self.transfers.values())
            total = sum(len(t.remaining) for t in trs)
            buf = np.empty(max(2 * total, 64))
            offs, o = {}, 0
            for t in trs:
                n = len(t.remaining)
                buf[o:o + n] = t.remaining
                t.remaining = buf[o:o + n]
                offs[t.id] = o
                o += n
            self.buf, self.offs, self.fill = buf, offs, o
        offs = self.offs
        acts = [act for _tr, act in slices]
        self.pos = np.concatenate(acts) + np.repeat(
            np.fromiter((offs[sl[0].id] for sl in slices), dtype=np.int64, count=len(slices)),
            np.fromiter((len(a) for a in acts), dtype=np.int64, count=len(acts)))
