"""Tensor-parallel collectives run ahead of the clock where other traffic *may* reach their
links (issue 14, ``simulation.optimistic_tp``).

An agent that runs ahead of the clock (``Executor``'s ``run_ahead``) costs a TP collective in
closed form only when no other transfer can ever share its links
(``workloads.tp_isolation``). On a 2D torus that is rare: pipeline sends and data-parallel
rings cross the TP groups' blocks, so every TP collective went to the flow engine, an event
or three each, although nearly all of them run alone (GPT-3 175B on 256 devices with compute
jitter: 98% of them never share a link with anything).

Here a TP collective of a group whose links no other TP group uses (``exclusive_tp_groups``)
is costed in closed form ahead of the clock whenever nothing is on its links when the agent
reaches it, and its links are *reserved* until its last byte drains. The flow engine calls
:meth:`OptimisticTP.before_join` with every transfer about to join it; one that crosses a
reserved link at time ``s`` takes the agent back to ``s``:

* the agent's state returns to what it was when it reached the first of its collectives
  whose drain ends after ``s`` (``Accelerator.checkpoint``; the fabric's counters of that
  collective and of every later one are taken back, ``Fabric.closed_counter``); the compute
  blocks and collectives before it stand (the network cannot have changed them);
* if that collective had started by ``s``, the rest of it goes to the flow engine now, with
  the bytes it delivered alone so far (``Fabric.start_partial``), before the arriving
  transfer joins; the agent continues after it when it ends;
* otherwise the agent continues at that collective, at its start time, with the clock.

The agent is told with a SimPy interrupt carrying a :class:`Rewind`. What follows is what the
flow engine would have done had the collectives been its transfers all along: alone on their
links they drain in their closed-form time, and the first transfer to reach a link finds the
collective there with the same bytes left (to rounding). ``simulation.exact`` and
``simulation.optimistic_tp: false`` turn it off; ``tests/test_exact.py`` checks that runs
agree.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import simpy

__all__ = ["OptimisticTP", "Rewind", "rejoin"]


class Rewind:
    """Interrupt cause: an agent's run ahead of the clock was taken back. The agent goes on
    at instruction ``index`` of its program: at time ``at`` (s), or when ``event`` (the rest
    of a collective that started at ``t0`` and was in flight) fires, or after the process
    body ``body`` (the rest of a compute block in flight, ``workloads.quiet``) returns."""

    __slots__ = ("at", "body", "event", "index", "name", "t0")

    def __init__(self, index: int, at: float = math.nan, event=None, t0: float = math.nan,
                 name: str = "", body=None):
        self.index, self.at, self.event, self.t0, self.name = index, at, event, t0, name
        self.body = body


def rejoin(ex, cls: int, it: int, t: float):
    """Process body: the agent of ``cls`` of executor ``ex``, run ahead to ``t`` (s), waits
    for the clock to get there; returns None, or the program index to go on from when other
    traffic took the run back (at the time the :class:`Rewind` says, or after the rest of
    the collective that was in flight then)."""
    env = ex.env
    try:
        yield env.timeout_at(t)
    except simpy.Interrupt as exc:
        rw = exc.cause
        if not isinstance(rw, Rewind):
            raise
        if rw.body is not None:
            yield from rw.body
        elif rw.event is None:
            yield env.timeout_at(rw.at)
        else:
            yield rw.event
            ex.tp_waited(cls, it, rw.name.removeprefix("tp_"), rw.t0, env.now)
        return rw.index
    if ex.optimistic is not None:
        ex.optimistic.settle(cls)
    if ex.quiet is not None:
        ex.quiet.settle(cls)
    return None


class _Entry(NamedTuple):
    index: int          # program index of the collective
    t0: float           # its start, s
    drain_end: float    # its last byte, s (its links are free after)
    phases: list        # its one lock-step phase
    counter: list       # its Fabric.closed_counter entry
    name: str           # its fabric name (tp_<algorithm>)
    state: tuple        # the agent's Accelerator.checkpoint() when it reached the collective
    tp_s: float         # the class's TP time so far, s
    ops: int            # the class's run-ahead operations so far


class OptimisticTP:
    """Reservations of the links of TP collectives run ahead of the clock, and taking them
    back when other traffic arrives (see the module docstring).

    A class reserves all links its TP collectives may use (a superset of those of the one
    running: traffic crossing the others takes a run back it need not have, which changes
    nothing but the cost) until the last drain of its run.

    Args:
        executor: the ``workloads.executor.Executor`` whose agents run ahead.
        groups: the links of each TP collective no other TP collective shares a link with,
            by its participating classes (``exclusive_tp_groups``); those of one class are
            eligible (a group split into one class per rank meets at a rendezvous).
    """

    def __init__(self, executor, groups: dict[tuple[int, ...], np.ndarray]):
        self.ex = executor
        self.fabric = fab = executor.fabric
        self.owner = [-1] * fab.topo.n_links  # the class whose collectives use each link
        groups = {parts: links for parts, links in groups.items() if len(parts) == 1}
        for (cls,), links in groups.items():
            for lk in links.tolist():
                self.owner[lk] = cls
        self.groups = set(groups)
        self.until = [-math.inf] * len(executor.stats)  # each class's reservation ends, s
        # phase -> (drain s, its links, Fabric.closed_counter), links None: not lock-step
        self._phase: dict = {}
        self.log: list[list[_Entry]] = [[] for _ in executor.stats]  # by class
        self.collectives = 0  # run ahead this way and not taken back
        self.rewinds = 0
        self._on_link = fab.flows._on_link
        fab.flows.before_join = self.before_join

    def run(self, cls: int, index: int, parts: tuple[int, ...], phases: list, t: float,
            name: str) -> float | None:
        """Cost the TP collective at program ``index`` of ``cls`` (``phases``) from its local
        time ``t`` in closed form and reserve its links; its end, s, or None when it does not
        qualify (not an eligible group, not one lock-step phase, or traffic on its links)."""
        if parts not in self.groups or len(phases) != 1:
            return None
        fab = self.fabric
        ph = phases[0]
        hit = self._phase.get(ph)
        if hit is None:
            closed = fab.closed_form(ph)
            ok = closed is not None and fab._plan(ph)[-1]  # one lock-step flow
            hit = self._phase[ph] = ((closed[0], closed[2].tolist(), *fab.closed_counter(phases))
                                     if ok else (0.0, None, None, 0.0))
        drain, links, counter, total = hit
        if links is None or fab.record is not None:  # (message rows cannot be taken back)
            return None
        if not self._on_link.keys().isdisjoint(links):
            return None
        ex = self.ex
        log = self.log[cls]
        end = t + drain
        log.append(_Entry(index, t, end, phases, counter, name,
                          ex.accelerators[cls].checkpoint(),
                          ex.stats[cls].tp_s, ex.ahead_ops[cls]))
        self.until[cls] = end
        self.collectives += 1
        counter[1] += 1  # what Fabric.run_closed counts without a message sink
        return t + total

    def settle(self, cls: int) -> None:
        """The agent of ``cls`` rejoined the clock at the end of its run: all of it stands."""
        log = self.log[cls]
        if log:
            log.clear()

    def before_join(self, tr) -> None:
        """Flow-engine hook: ``tr`` is about to join the network now; take back every agent
        whose reserved links it crosses (see the module docstring)."""
        now = self.ex.env.now
        until, owner = self.until, self.owner
        hit = None
        for lk in tr.links:
            c = owner[lk]
            if c >= 0 and until[c] > now:
                if hit is None:
                    hit = set()
                hit.add(c)
        if hit:
            for cls in sorted(hit):
                self.rewind(cls, now)

    def rewind(self, cls: int, s: float) -> None:
        """Take the agent of ``cls`` back to time ``s`` (now) and interrupt it with the
        :class:`Rewind` that tells it how to go on."""
        log = self.log[cls]
        k = next(j for j, e in enumerate(log) if e.drain_end > s)
        e = log[k]
        ex, fab = self.ex, self.fabric
        ex.accelerators[cls].restore(e.state)
        for later in log[k:]:  # the fabric's counters of what is taken back
            later.counter[1] -= 1
        self.collectives -= len(log) - k
        ex.stats[cls].tp_s = e.tp_s
        ex.ahead_ops[cls] = e.ops
        log.clear()
        self.until[cls] = -math.inf
        self.rewinds += 1
        if e.t0 <= s:  # in flight: the rest of it goes to the flow engine, before ``tr``
            ev = fab.start_partial(e.phases[0], s - e.t0, e.name, cls)
            rw = Rewind(e.index + 1, event=ev, t0=e.t0, name=e.name)
        else:
            rw = Rewind(e.index, at=e.t0)
        ex.agent_proc[cls].interrupt(rw)
