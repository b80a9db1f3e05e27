"""Flow-level network engine: transfers share link bandwidth max-min fairly.

A *transfer* is a set of flows started together (one phase of a collective, or one
point-to-point send). Each flow has a route (directed link ids) and a byte count. While flows
are active, every link's capacity is shared max-min fairly among the flows crossing it
(progressive filling, vectorized in NumPy). Rates change only when a flow starts or ends, so
the engine schedules one SimPy timeout per change, not per packet. A transfer completes
``latency`` seconds after its last byte drains.

A transfer of ``steps > 1`` is bulk-synchronous (the rounds of a ring collective): flow ``i``
sends ``size[i] / steps`` per step, and no flow starts step ``k + 1`` before every flow has
finished step ``k`` (a flow that finishes its step early is *parked* and leaves its links to
others). While all flows of such a transfer reach their step ends together (equal step times:
the uncontended and the symmetric cases) no per-step event is scheduled; events are added only
when contention makes the flows' step times differ.

Transfers that share no link with each other cannot influence each other's rates, so the
engine keeps active transfers in *components* (transfers connected through shared links) and
recomputes rates only for the component an event touches. A component whose transfers all follow
route patterns seen before (callers pass a ``key`` naming the pattern) reuses the cached
allocation of that combination of patterns. Both are exact: the allocation of a component
does not depend on traffic outside it, nor on bytes remaining. Large components (``_JIT_FLOWS``
flows, once a run has made ``_JIT_AFTER`` such allocations) are solved by the compiled forms
in ``twin.kernel.maxmin_jit``, which give the same numbers to the last bit.

This module is kernel: it knows links only as array indices with capacities, nothing of GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np
import simpy

from twin.kernel.joins import Ledger, shrink
from twin.kernel.maxmin import _max_min_local, max_min_rates
from twin.kernel.steps import _compiled, step_target
from twin.kernel.steps import step_targets_compiled as _step_targets_compiled
from twin.kernel.transfer import Component, Template, Transfer

__all__ = ["FlowNetwork", "Transfer", "max_min_rates"]


_FIRST = np.zeros(1, dtype=np.int64)  # the bounds of a component without slices
# components of at least this many flows are allocated by the compiled forms of the max-min
# solve and the step targets (``twin.kernel.maxmin_jit``: the same numbers to the last bit;
# below it their call and input packing cost more than they save), once a run has made more
# than _JIT_AFTER such allocations (numba's import and cache load, ~0.6 s, pays only for a
# run that makes many: the 1024-device jitter run passes it; the 256-device one makes 8,125;
# the Llama 3 405B layout on 16384 GPUs 13,431, and is 0.6 s slower compiled from the first)
_JIT_FLOWS = 24
_JIT_AFTER = 20_000
# components of at least this many (flow, link) entries keep their rates through joins and
# departures where that is exact (twin.kernel.joins); on smaller ones (GPT-3 175B jittered on
# 1024 devices: ~50 entries) the check's dozen array calls cost about what a solve does
_KEEP_ENTRIES = 1024


class FlowNetwork:
    """Max-min fair sharing of link capacities among the flows of active transfers.

    Args:
        env: the SimPy environment (the clock).
        capacity: bytes/s of each directed link (``inf``: never a bottleneck).
        on_finish: optional callback ``f(transfer)`` when a transfer completes.
        variable: mask of the links whose capacity :meth:`set_capacity` may change while
            flows cross them (None: none may; capacities are then fixed).
    """

    #: joins and departures keep the other rates where that is exact (``twin.kernel.joins``);
    #: False: every change solves its component (the tests' reference)
    keep_rates = True

    def __init__(self, env: simpy.Environment, capacity: np.ndarray,
                 on_finish: Callable[[Transfer], None] | None = None,
                 variable: np.ndarray | None = None):
        self.env = env
        self.capacity = np.asarray(capacity, dtype=float).copy()
        self.variable = (None if variable is None or not np.any(variable)
                         else np.asarray(variable, dtype=bool).copy())
        self._variable_ids = (frozenset() if self.variable is None
                              else frozenset(np.flatnonzero(self.variable).tolist()))
        self.on_finish = on_finish
        self.transfers: dict[int, Transfer] = {}
        self._next_id = 0
        self._on_link: dict[int, set[Transfer]] = {}
        self._comps: set[Component] = set()
        self._templates: dict[Hashable, Template] = {}
        self._allocs: dict[tuple[int, ...], tuple] = {}
        # a fresh whole transfer alone in its component (most collective phases): everything
        # _allocate derives from its pattern's allocation and its size, per allocation key
        self._solo: dict[tuple, tuple] = {}
        self.alloc_cache_size = 200_000
        # and at most this many bytes of cached arrays: without rank symmetry (jitter) the
        # components are large and their combinations of active flows rarely repeat, so an
        # unbounded cache held ~10 GB at 4096 devices (a cache miss recomputes the same rates)
        self.alloc_cache_bytes = 256 * 2**20
        self._alloc_bytes = 0
        # per-link accounting
        self.link_bytes = np.zeros(len(self.capacity))
        self.link_busy = np.zeros(len(self.capacity))
        self.recomputes = 0      # max-min solves
        self.cache_hits = 0      # allocations reused from the route-pattern cache
        self.solo_starts = 0     # of which fresh transfers alone in their component
        self._scratch = np.full(len(self.capacity), -1, dtype=np.int64)  # link -> local index
        # link -> its slot in the ledger that owns it, and that ledger's serial (Ledger)
        self._lid = np.zeros(len(self.capacity), dtype=np.int64)
        self._lown = np.full(len(self.capacity), -1, dtype=np.int64)
        self._ledgers = 0
        self._large = 0  # allocations of _JIT_FLOWS or more flows so far
        self.extensions = 0  # joins that kept the component's rates (keep_rates)
        self.shrinks = 0  # flows stopping with the other rates kept
        # called with every transfer about to join the network (new, or cut flows put back on
        # new routes; parked flows never left it), before any rate changes: a caller that
        # costs work on some links ahead of the clock, outside the engine
        # (``workloads.optimistic``: it reserves only links no transfer is on), brings what is
        # in flight in
        self.before_join: Callable[[Transfer], None] | None = None

    # ----------------------------------------------------------------- public
    def transfer(self, routes: Sequence[Sequence[int]], nbytes: Sequence[float] | np.ndarray,
                 latency: float = 0.0, tag: object = None,
                 key: Hashable | None = None, steps: int = 1, done_fraction: float = 0.0,
                 busy_s: float = 0.0) -> Transfer:
        """Start a transfer of ``nbytes[i]`` over ``routes[i]``; returns its handle.

        ``steps > 1``: the bytes move in that many bulk-synchronous steps of
        ``nbytes[i] / steps`` (see the module docstring).

        ``done_fraction`` (``steps == 1``): the transfer has already run for ``busy_s``
        seconds outside the engine (alone on its links, costed in closed form by a caller
        running ahead of the clock) and delivered that fraction of every flow's bytes; the
        rest is sent from now, and its links are counted busy for the time before.

        ``key``, if given, names the pattern (equal keys must mean equal routes and sizes);
        transfers with a known key reuse its incidence arrays and, when alone in the network,
        its cached max-min allocation.
        """
        size = np.asarray(nbytes, dtype=float)
        template = self._templates.get(key) if key is not None else None
        if template is None:
            rts = [np.asarray(r, dtype=np.int64) for r in routes]
            if key is not None:
                template = self._templates[key] = Template(len(self._templates), rts, size,
                                                            self.variable)
        else:
            rts = template.routes
        tr = Transfer(self._next_id, rts, size, float(latency), self.env, self.env.now, tag,
                      template, steps)
        self._next_id += 1
        self.transfers[tr.id] = tr
        if done_fraction > 0.0:
            tr.remaining *= 1.0 - done_fraction  # (its base stays: the links get every byte)
            tr.whole = False
            self.link_busy[list(tr.links)] += busy_s
        if not tr.active.any():
            self._complete(tr)
        else:
            self._join(tr)
        return tr

    def set_capacity(self, links: Sequence[int] | np.ndarray, capacity: float) -> None:
        """Give ``links`` (all marked ``variable``) the capacity ``capacity`` bytes/s from now
        on: the bytes of the components crossing them drain at the old rates up to now and
        their max-min rates are recomputed at the new capacities (no change: nothing done).
        """
        idx = np.asarray(links, dtype=np.int64)
        ids = idx.tolist()
        if not self._variable_ids.issuperset(ids):
            raise ValueError("set_capacity: only links marked variable can change capacity")
        cap = float(capacity)
        if not cap > 0.0:
            raise ValueError(f"set_capacity: capacity must be > 0 bytes/s (given {cap!r})")
        on = self._on_link
        comps = {t.comp for lk in ids if lk in on for t in on[lk] if t.comp is not None}
        if not comps:  # nothing crosses them: only the capacity to keep
            self.capacity[idx] = cap
            return
        if (self.capacity[idx] == cap).all():
            return
        for c in comps:
            self._advance_comp(c)
        self.capacity[idx] = cap
        for c in sorted(comps, key=lambda c: min(c.transfers)):
            if c in self._comps:
                self._allocate(c)

    def fail_links(self, links: Sequence[int]) -> list[tuple[Transfer, np.ndarray]]:
        """Cut every active flow crossing ``links``; returns ``(transfer, flow indices)``.

        Cut flows keep their remaining bytes and stop; the caller re-sends them with
        :meth:`resume` on new routes (after its timeout). Their transfer stays pending.
        """
        bad = {int(x) for x in links}
        hit = {t for lk in bad for t in self._on_link.get(lk, ())}
        hit |= {t for t in self.transfers.values() if t.parked.any()}
        cut: list[tuple[Transfer, np.ndarray]] = []
        comps = {t.comp for t in hit if t.comp is not None}
        for c in comps:
            self._advance_comp(c)
        for tr in sorted(hit, key=lambda t: t.id):
            idx = [i for i in np.flatnonzero(tr.active | tr.parked)
                   if bad.intersection(tr.routes[i].tolist())]
            if idx:
                ix = np.asarray(idx, dtype=np.int64)
                self._account(tr, ix)
                tr.active[ix] = False
                tr.parked[ix] = False
                tr.template = None  # its routes will change
                tr.whole = False
                self._relink(tr)
                cut.append((tr, ix))
        for c in comps:
            self._rebuild(c)
        return cut

    def resume(self, tr: Transfer, flows: np.ndarray, routes: Sequence[Sequence[int]]) -> None:
        """Put cut flows of ``tr`` back on new ``routes`` with their remaining bytes.

        A transfer that was cancelled meanwhile (see :meth:`cancel`) is left alone.
        """
        if self.transfers.get(tr.id) is not tr:
            return
        tr.routes = list(tr.routes)  # the template's list is shared: copy before editing
        for i, r in zip(flows, routes, strict=True):
            tr.routes[int(i)] = np.asarray(r, dtype=np.int64)
            tr.base[int(i)] = tr.remaining[int(i)]
            if len(r) == 0:
                tr.remaining[int(i)] = 0.0
            tr.active[int(i)] = tr.remaining[int(i)] > 0
        tr.park_ahead()
        tr.template = None  # routes no longer match the pattern the caller named
        tr.whole = False
        old = tr.comp
        if old is not None:
            self._advance_comp(old)
            self._detach(tr)
            self._rebuild(old)
        tr.reindex()
        if tr.active.any():
            self._join(tr)
        elif not tr.finished and (tr.remaining <= 0).all():
            self._complete(tr)

    def cancel(self, tr: Transfer) -> float:
        """Withdraw ``tr`` from the network: its flows stop and ``done`` never fires.

        Returns the bytes it had not yet delivered (0 if it already finished or was
        cancelled). Used when the job that owns the transfer is aborted.
        """
        if self.transfers.get(tr.id) is not tr:
            return 0.0
        comp = tr.comp
        if comp is not None:
            self._advance_comp(comp)
        del self.transfers[tr.id]
        self._account(tr, np.flatnonzero(tr.active))
        tr.whole = False
        tr.active[:] = False
        if comp is not None:
            self._detach(tr)
            self._rebuild(comp)
        return float(tr.remaining.sum())

    def sync(self) -> None:
        """Bring remaining bytes and link counters up to now (bytes of flows still in
        flight are counted on their links as they stand)."""
        for c in list(self._comps):
            self._advance_comp(c)
            self._flush_busy(c, end=False)
            for tr, act in c.slices:
                tr.whole = False
                self._account(tr, act)

    def _account(self, tr: Transfer, flows: np.ndarray) -> None:
        """Add the bytes ``flows`` delivered on their current routes to the link counters."""
        if len(flows) == 0:
            return
        delivered = np.zeros(len(tr.size))
        delivered[flows] = tr.base[flows] - tr.remaining[flows]
        tr.base[flows] = tr.remaining[flows]
        per_entry = delivered[tr.entry_owner]
        np.add.at(self.link_bytes, tr.entry_link, per_entry)

    @property
    def n_active_flows(self) -> int:
        """Flows currently sending."""
        return sum(len(c.rate) for c in self._comps)

    @property
    def n_components(self) -> int:
        """Groups of transfers connected through shared links."""
        return len(self._comps)

    def rates(self) -> dict[int, np.ndarray]:
        """Current rate of each flow, per transfer id (bytes/s; 0 for inactive flows)."""
        out = {tid: np.zeros(len(tr.size)) for tid, tr in self.transfers.items()}
        for c in self._comps:
            for (tr, act), lo in zip(c.slices, c.bounds.tolist(), strict=False):
                out[tr.id][act] = c.rate[lo:lo + len(act)]
        return out

    # ----------------------------------------------------------------- components
    def _register(self, tr: Transfer) -> None:
        for lk in tr.links:
            s = self._on_link.get(lk)
            if s is None:
                self._on_link[lk] = {tr}
            else:
                s.add(tr)

    def _unregister(self, tr: Transfer, links) -> None:
        for lk in links:
            s = self._on_link.get(lk)
            if s is not None:
                s.discard(tr)
                if not s:
                    del self._on_link[lk]

    def _relink(self, tr: Transfer) -> None:
        """Update the link index after some of ``tr``'s flows stopped."""
        new = tr.active_links()
        self._unregister(tr, tr.links - new)
        tr.links = new

    def _join(self, tr: Transfer) -> None:
        """Add ``tr`` to the network, merging the components it touches."""
        if self.before_join is not None:
            self.before_join(tr)
        touched: set[Component] = set()
        on_link = self._on_link
        for lk in tr.links:
            for other in on_link.get(lk, ()):
                touched.add(other.comp)
        now = self.env.now
        if not touched:
            comp = Component(now)
            self._comps.add(comp)
        else:
            for c in touched:
                self._advance_comp(c)
            if len(touched) == 1 and self._extend(next(iter(touched)), tr):
                return
            comp = max(touched, key=lambda c: len(c.transfers))
            for c in touched:
                if c is not comp:
                    self._flush_busy(c)
                    for t in c.transfers.values():
                        t.comp = comp
                        comp.transfers[t.id] = t
                    c.gen += 1  # its timer is void
                    self._comps.discard(c)
        comp.transfers[tr.id] = tr
        tr.comp = comp
        self._register(tr)
        self._allocate(comp)

    def _detach(self, tr: Transfer) -> None:
        comp = tr.comp
        if comp is not None:
            comp.transfers.pop(tr.id, None)
        self._unregister(tr, tr.links)
        tr.links = frozenset()
        tr.comp = None

    def _rebuild(self, comp: Component) -> None:
        """Split ``comp`` into the components its remaining transfers form; allocate each."""
        self._flush_busy(comp)
        comp.gen += 1
        self._comps.discard(comp)
        comp.rate = np.empty(0)  # a stale reference to this component must drain nothing
        comp.slices, comp.bounds, comp.nstep = [], _FIRST, 0
        live = []
        for t in comp.transfers.values():
            if t.active.any():
                live.append(t)
            else:  # all its flows were cut (or wait for cut ones): it waits outside any
                self._unregister(t, t.links)  # component, until resume() joins it again
                t.links = frozenset()
                t.comp = None
        if not live:
            return
        now = self.env.now
        if len(live) == 1:
            groups = [live]
        else:
            parent = {t.id: t.id for t in live}

            def find(x: int) -> int:
                while parent[x] != x:
                    parent[x] = parent[parent[x]]
                    x = parent[x]
                return x

            first: dict[int, int] = {}
            for t in live:
                for lk in t.links:
                    f = first.setdefault(lk, t.id)
                    if f != t.id:
                        ra, rb = find(f), find(t.id)
                        if ra != rb:
                            parent[rb] = ra
            by_root: dict[int, list[Transfer]] = {}
            for t in live:
                by_root.setdefault(find(t.id), []).append(t)
            groups = list(by_root.values())
        for g in groups:
            c = Component(now)
            for t in g:
                c.transfers[t.id] = t
                t.comp = c
            self._comps.add(c)
            self._allocate(c)

    # ----------------------------------------------------------------- allocation
    def _allocate(self, comp: Component) -> None:
        """Max-min rates of a component's active flows; schedule its next completion.

        A component whose transfers all run their full route patterns (templates) has an
        allocation that depends only on which patterns are present, so it is cached under
        the multiset of template serials.
        """
        self._flush_busy(comp)
        comp.gen += 1
        comp.last = self.env.now
        trs = list(comp.transfers.values())
        key = None
        if all(t.template is not None for t in trs):
            trs.sort(key=lambda t: (t.template.serial, t.id))
            key = tuple((t.template.serial, None if t.whole else t.active.tobytes())
                        for t in trs)
            if self.variable is not None:  # the capacities that may change are part of it
                key += tuple(self.capacity[t.template.vlinks].tobytes() for t in trs)
        # a whole transfer that started now has drained nothing: its remaining bytes are its size
        solo_ok = (key is not None and len(trs) == 1 and trs[0].whole
                   and trs[0].start == comp.last)
        if solo_ok:
            solo = self._solo.get(key)
            if solo is not None:
                self._start_solo(comp, trs[0], solo)
                return
        cached = self._allocs.get(key) if key is not None else None
        if cached is not None:
            self.cache_hits += 1
            rate, entry_flow, ulinks, inv, cert = cached
            slices, tols = [], []
            for tr in trs:
                inc = tr.incidence()
                if inc is None:
                    act, tol = np.empty(0, dtype=np.int64), np.empty(0)
                else:
                    act, tol = inc[0], inc[3]
                if tr.whole:
                    act = tr.template.all_flows
                slices.append((tr, act))
                tols.append(tol)
            n = comp.set_slices(slices)
            use_jit = self._compiled_pays(n)
        else:
            slices, ent_f, ent_l, tols, offs, lens = [], [], [], [], [], []
            n = 0
            for tr in trs:
                inc = tr.incidence()
                if inc is None:
                    continue
                act, local, links, tol = inc
                ent_f.append(local)
                ent_l.append(links)
                tols.append(tol)
                offs.append(n)
                lens.append(len(local))
                slices.append((tr, act))
                n += len(act)
            comp.set_slices(slices)
            if len(ent_f) > 1:  # each transfer's entries point to its flows: shift them
                entry_flow = np.concatenate(ent_f)
                entry_flow += np.repeat(offs, lens)
            else:
                entry_flow = ent_f[0] if ent_f else np.empty(0, dtype=np.int64)
            entry_link = np.concatenate(ent_l) if ent_l else np.empty(0, dtype=np.int64)
            use_jit = self._compiled_pays(n)
            cert = np.empty(n, dtype=np.int64) if len(entry_flow) >= _KEEP_ENTRIES else None
            if use_jit:
                rate, ulinks, inv = _compiled().compact_max_min(
                    entry_flow, entry_link, n, self.capacity, self._scratch,
                    np.empty(n, dtype=np.int64) if cert is None else cert)
            else:
                ulinks, inv = self._compact_links(entry_link)
                rate = _max_min_local(entry_flow, inv, n, self.capacity[ulinks], cert)
            self.recomputes += 1
            if cert is not None:  # (as link ids: the ledger's slots are not ulinks' order)
                cert = np.where(cert >= 0, ulinks[cert], -1)
            if key is not None and len(self._allocs) < self.alloc_cache_size:
                size = (rate.nbytes + entry_flow.nbytes + ulinks.nbytes + inv.nbytes
                        + (0 if cert is None else cert.nbytes))
                if self._alloc_bytes + size <= self.alloc_cache_bytes:
                    self._allocs[key] = (rate, entry_flow, ulinks, inv, cert)
                    self._alloc_bytes += size
        comp.rate, comp.entry_flow, comp.ulinks, comp.inv = rate, entry_flow, ulinks, inv
        comp.cert = cert
        if len(rate) == 0:
            return
        dt = self._schedule(comp, tols[0] if len(tols) == 1 else np.concatenate(tols), use_jit)
        # (only when cached, so that the counters stay the same)
        if solo_ok and comp.target is None and key in self._allocs:
            self._solo[key] = (rate, entry_flow, ulinks, inv, cert, comp.tol, comp.due, dt)

    def _extend(self, comp: Component, tr: Transfer) -> bool:
        """Add ``tr`` to ``comp`` keeping the rates there (``twin.kernel.joins.Ledger.join``);
        False when that would not be the max-min allocation (the caller solves ``comp``)."""
        inc = tr.incidence() if self.keep_rates and comp.cert is not None else None
        if inc is None:
            return False
        act, local, links, tol = inc
        got = self._ledger(comp).join(local, links, len(act), self.capacity, comp.busy)
        if got is None:
            return False
        comp.transfers[tr.id] = tr
        tr.comp = comp
        self._register(tr)
        n = len(comp.rate)
        self.extensions += 1
        self._keep(comp, (np.concatenate([comp.rate, got[0]]),
                          np.concatenate([comp.cert, got[1]]), np.concatenate([comp.tol, tol]),
                          [*comp.slices, (tr, act)], np.append(comp.bounds, n + len(act)),
                          comp.nstep + (tr.steps > 1)), tr)
        return True

    def _ledger(self, comp: Component) -> Ledger:
        """The component's :class:`~twin.kernel.joins.Ledger`, made from its solve's arrays
        the first time a join or departure asks after the solve."""
        if comp.ledger is None:
            self._ledgers += 1
            comp.ledger = Ledger(self._ledgers, self._lid, self._lown, comp.ulinks, comp.inv,
                                 comp.entry_flow, comp.rate,
                                 _compiled() if self._large > _JIT_AFTER else None)
        return comp.ledger

    def _keep(self, comp: Component, got: tuple, added: Transfer | None = None,
              kept: np.ndarray | None = None) -> None:
        """Install ``(rate, cert, tol, slices, bounds, nstep)`` kept from the component's
        allocation (``twin.kernel.joins``) and schedule it. ``added``: a transfer appended to
        the slices (a join); ``kept``: which flows stayed (a departure). The busy time of the
        links is the ledger's (``Ledger.flush``)."""
        comp.gen += 1
        comp.last = self.env.now
        comp.rate, comp.cert, tol, comp.slices, comp.bounds, comp.nstep = got
        self._schedule(comp, tol, self._compiled_pays(len(comp.rate)), added, kept)

    def _schedule(self, comp: Component, tol: np.ndarray, use_jit: bool,
                  added: Transfer | None = None, kept: np.ndarray | None = None) -> float:
        """With the component's rates set: its flows' remaining bytes, done tolerances
        ``tol`` and step targets, the flows due first; arms its timer. Returns the time to
        it, s. ``added``, ``kept``: see :meth:`Component.index`."""
        rate = comp.rate
        comp.index(added, kept)
        comp.tol = tol
        if use_jit:
            to_go, comp.target = _step_targets_compiled(comp, rate, comp.buf[comp.pos])
        else:
            rems, targets = [], []
            for (tr, act), lo in zip(comp.slices, comp.bounds.tolist(), strict=False):
                rem = tr.remaining[act]
                target = None
                if tr.steps > 1:
                    hi = lo + len(act)
                    target = step_target(tr, act, rate[lo:hi])
                if target is None:
                    rems.append(rem)
                else:
                    rems.append(rem - target)
                    targets.append((lo, hi, target))
            to_go = rems[0] if len(rems) == 1 else np.concatenate(rems)
            comp.target = None
            if targets:  # (0 for the flows of slices without one)
                comp.target = np.zeros(len(rate))
                for lo, hi, target in targets:
                    comp.target[lo:hi] = target
        ttf = to_go / rate
        dt = float(ttf.min())
        # flows due at the timer finish then, whatever rounding of the clock does to dt
        comp.due = ttf <= dt * (1 + 1e-9) + 1e-15
        self._arm(comp, dt)
        return dt

    def _compiled_pays(self, n: int) -> bool:
        """Whether an allocation of ``n`` flows takes the compiled forms (``_JIT_FLOWS``,
        ``_JIT_AFTER``); counts the large allocations."""
        if n < _JIT_FLOWS:
            return False
        self._large += 1
        return self._large > _JIT_AFTER

    def _arm(self, comp: Component, dt: float) -> None:
        """Set the component's timer ``dt`` seconds from now (void once it changes again)."""
        gen = comp.gen
        self.env.timeout(max(dt, 0.0)).callbacks.append(
            lambda _e, c=comp, g=gen: self._on_timer(c, g))

    def _start_solo(self, comp: Component, tr: Transfer, solo: tuple) -> None:
        """:meth:`_allocate` of a component holding only the fresh whole transfer ``tr``
        from what the first such allocation of its key derived (the same arrays: its rates,
        tolerances, due flows and time to the next completion depend only on the pattern, its
        sizes and the capacities in the key)."""
        rate, entry_flow, ulinks, inv, cert, tol, due, dt = solo
        self.cache_hits += 1
        self.solo_starts += 1
        comp.set_slices([(tr, tr.template.all_flows)])
        comp.cert = cert
        comp.index()
        comp.rate, comp.entry_flow, comp.ulinks, comp.inv = rate, entry_flow, ulinks, inv
        comp.tol, comp.due, comp.target = tol, due, None
        self._arm(comp, dt)

    def _compact_links(self, entry_link: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``np.unique(entry_link, return_inverse=True)``; for a component that touches a
        good part of the network by a dense table over all links instead of a sort (the
        same sorted links and indices)."""
        n_links = len(self.capacity)
        if 8 * len(entry_link) < n_links:
            return np.unique(entry_link, return_inverse=True)
        ulinks = np.flatnonzero(np.bincount(entry_link, minlength=n_links))
        table = np.empty(n_links, dtype=np.int64)
        table[ulinks] = np.arange(len(ulinks))
        return ulinks, table[entry_link]

    def _flush_busy(self, comp: Component, end: bool = True) -> None:
        """Add the component's busy time to its links' (``end``: its allocation ends here,
        the ledger with it)."""
        led = comp.ledger
        if led is not None:
            led.flush(self.link_busy, comp.busy)
            if not end:
                return
            comp.ledger = None
        elif comp.busy > 0:
            self.link_busy[comp.ulinks] += comp.busy
        comp.busy = 0.0

    def _advance_comp(self, comp: Component) -> None:
        """Drain a component's bytes at its current rates up to now; account link usage."""
        now = self.env.now
        dt = now - comp.last
        comp.last = now
        if dt <= 0 or len(comp.rate) == 0:
            return
        left = comp.buf[comp.pos]
        left -= comp.rate * dt
        np.maximum(left, 0.0, out=left)
        comp.buf[comp.pos] = left
        comp.busy += dt

    def _on_timer(self, comp: Component, gen: int) -> None:
        if gen != comp.gen:
            return  # the component changed since this timer was set
        self._advance_comp(comp)
        if (comp.target is None and len(comp.slices) == 1 and len(comp.transfers) == 1
                and comp.slices[0][0].whole and comp.due.all()):
            self._finish_solo(comp)
            return
        finished: list[Transfer] = []
        changed = False
        n_flows = len(comp.rate)
        left = 0  # flows that ended (not the parked ones)
        slices = comp.slices
        hit_all = (comp.buf[comp.pos] <= comp.tol) | comp.due
        flows_hit = np.flatnonzero(hit_all)
        # only the slices with a flow done: the others keep their flows and links
        # (flows_hit is sorted, so the slices are too: their distinct ones in order)
        bounds = comp.bounds
        which = list(dict.fromkeys(
            (np.searchsorted(bounds, flows_hit, side="right") - 1).tolist()))
        for j in which:
            tr, act = slices[j]
            lo, hi = int(bounds[j]), int(bounds[j + 1])
            tol = comp.tol[lo:hi]
            hit = hit_all[lo:hi]
            done = act[hit]
            if len(done) == 0:
                continue
            changed = True
            if comp.target is None:
                tr.remaining[done] = 0.0
            else:  # a step end (0 at the last step)
                tr.remaining[done] = np.where(tr.remaining[done] <= tol[hit], 0.0,
                                              comp.target[lo:hi][hit])
            if tr.steps > 1:
                tr.park_ahead()  # (flows released from the barrier send again in place)
            ended = done[tr.remaining[done] <= 0.0]  # (the others parked or step on)
            left += len(ended)
            tr.active[ended] = False
            if not tr.active.any() and not (tr.remaining > 0).any():
                finished.append(tr)
                if tr.whole:  # every flow ended together on its original route
                    self.link_bytes[tr.template.ulinks] += tr.template.link_bytes
                    tr.base[:] = 0.0
                else:
                    self._account(tr, done)
            else:
                self._account(tr, done)
                tr.whole = False  # link totals are now accounted flow by flow
                if len(ended):
                    self._relink(tr)
        for tr in finished:
            self._detach(tr)
            self._complete(tr)
        # A parked flow keeps its links (``Transfer.active_links``): the transfer stays in
        # this component and its released flows send again in it, with no join. Splitting a
        # component costs a union-find over its links; do it when a large part of its flows
        # ended (that is when it may fall apart), otherwise keep it whole: the allocation of
        # a union of disconnected parts is still exact.
        if changed and (4 * left >= n_flows or len(comp.transfers) <= 2):
            self._rebuild(comp)
        elif comp.transfers:
            got = shrink(comp, which, self._ledger, self.link_busy) if self.keep_rates else None
            if got is None:
                self._allocate(comp)
            else:
                self.shrinks += 1
                self._keep(comp, got[:6], kept=got[6])
        else:
            self._rebuild(comp)

    def _finish_solo(self, comp: Component) -> None:
        """The timer of a component of one whole transfer whose flows are all due: what
        :meth:`_on_timer` does then (every flow done, its pattern's link totals, the transfer
        complete, the component dissolved), without its general bookkeeping."""
        tr = comp.slices[0][0]
        tr.remaining[:] = 0.0
        tr.active[:] = False
        self.link_bytes[tr.template.ulinks] += tr.template.link_bytes
        tr.base[:] = 0.0
        self._detach(tr)
        self._complete(tr)
        self._rebuild(comp)

    def _complete(self, tr: Transfer) -> None:
        self.transfers.pop(tr.id, None)

        def fire(_e: object = None) -> None:
            tr.finished = True
            for cb in tr.on_done:
                cb(tr)
            if tr._done is not None:
                tr._done.succeed(tr)
            if self.on_finish is not None:
                self.on_finish(tr)

        if tr.latency > 0:
            self.env.timeout(tr.latency).callbacks.append(fire)
        else:
            fire()
