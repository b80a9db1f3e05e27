"""The simulation kernel: a SimPy environment that also counts the events it processes.

Like SimPy's own ``Environment`` it is only a clock and an event queue; agents own behaviour.
Ties at equal times resolve in SimPy's deterministic order (time, priority, insertion id).

A run may be given a budget (``max_events``, ``max_time``): the engine stops with
:class:`~twin.kernel.errors.BudgetExceeded` when it would process more events or advance the
clock past ``max_time``, so a run whose events grow without bound (failures faster than the
job restarts, tiny packets on a large fabric) ends with a clear message instead of running
forever. Both limits are deterministic (counted in events and simulated seconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappush

import simpy
from simpy.core import NORMAL, EmptySchedule

from twin.kernel.errors import BudgetExceeded, Problem


class Engine(simpy.Environment):
    """``simpy.Environment`` with an ``events_processed`` counter and an optional budget.

    Args:
        initial_time: start of the clock, s.
        max_events: most events to process (None: no limit).
        max_time: latest simulated time, s (None: no limit).
    """

    def __init__(self, initial_time: float = 0.0, max_events: int | None = None,
                 max_time: float | None = None):
        super().__init__(initial_time)
        self.events_processed = 0
        self.max_events = max_events if max_events is not None else math.inf
        self.max_time = max_time if max_time is not None else math.inf
        self._instant_end: list = []  # see at_instant_end

    def step(self) -> None:
        """Process the next event (and count it); stop when the budget is spent. Before an
        event of a later time (or none), the callbacks registered with
        :meth:`at_instant_end` run."""
        q = self._queue
        while self._instant_end and (not q or q[0][0] > self._now):
            due, self._instant_end = self._instant_end, []
            for fn in due:
                fn()
        if not q:
            raise EmptySchedule()
        self.events_processed += 1
        if self.events_processed > self.max_events:
            raise BudgetExceeded([Problem(
                "simulation.limits.max_events", f"the run processed {self.max_events} events "
                f"by simulated time {self.now:.6g} s without finishing", self.max_events,
                "a smaller workload, larger network.packet_kib, slower failure processes, "
                "or a larger simulation.limits.max_events")])
        if q[0][0] > self.max_time:  # (the next event's time: what peek() reads)
            raise BudgetExceeded([Problem(
                "simulation.limits.max_sim_time_s", f"the run reached the limit of "
                f"{self.max_time:g} simulated seconds without finishing", self.max_time,
                "fewer iterations, slower failure processes, or a larger "
                "simulation.limits.max_sim_time_s")])
        super().step()

    def at_instant_end(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once every event of the current instant is processed, before the
        clock moves on, in order of registration; ``fn`` may queue events at this instant
        (processed next) and register callbacks (run after those events). For a change an
        agent makes and may take back within the same instant (a block that ends as the next
        starts): applied once, at the state the instant ends with, without an event in the
        queue."""
        self._instant_end.append(fn)

    def timeout_at(self, t: float) -> simpy.Event:
        """An event that fires at the absolute time ``t`` (s, not before now), exactly: a
        timeout of ``t - now`` lands on ``now + (t - now)``, which may differ from ``t`` in
        the last bit. For agents that run ahead of the clock on a local one
        (``workloads.executor``): they rejoin it at the very instant the step-by-step run
        reaches. Queued as SimPy 4 queues its timeouts (time, priority, id, event)."""
        if t < self._now:
            raise ValueError(f"timeout_at({t!r}) is before now ({self._now!r})")
        ev = simpy.Event(self)
        ev._ok = True
        ev._value = None
        heappush(self._queue, (t, NORMAL, next(self._eid), ev))
        return ev

    def fire(self, ev: simpy.Event) -> None:
        """Process the untriggered event ``ev`` now, within the event being processed: its
        callbacks run at once, before anything else queued at this instant, as if they were
        that event's own. What a callback that would ``succeed`` ``ev`` gets without one
        more event in the queue (``devices.fluid``: a collective's end fires its waiters as
        a closed-form collective's own timeout does)."""
        ev._ok = True
        ev._value = None
        callbacks, ev.callbacks = ev.callbacks, None
        for cb in callbacks:
            cb(ev)
