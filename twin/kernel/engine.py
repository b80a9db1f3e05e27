"""The simulation kernel: a SimPy environment that also counts the events it processes.

Like SimPy's own ``Environment`` it is only a clock and an event queue; agents own behaviour.
Ties at equal times resolve in SimPy's deterministic order (time, priority, insertion id).
"""

from __future__ import annotations

import simpy


class Engine(simpy.Environment):
    """``simpy.Environment`` with an ``events_processed`` counter."""

    def __init__(self, initial_time: float = 0.0):
        super().__init__(initial_time)
        self.events_processed = 0

    def step(self) -> None:
        """Process the next event (and count it)."""
        self.events_processed += 1
        super().step()
