"""Link agents for the packet-level network: one FIFO server per directed link.

A packet holds its link for ``size / bandwidth`` seconds, then propagates for the link latency
without holding it, so packets pipeline along a route and messages that share a directed link
queue behind each other (two messages of n bytes take 2n/B, not n/B).
"""

from __future__ import annotations

import simpy


class LinkDown(Exception):
    """Cause of the interrupt a packet receives when its link fails under it."""

    def __init__(self, link: int):
        super().__init__(f"link {link} failed")
        self.link = link


class Link:
    """A directed link: a capacity-1 FIFO resource with failure support.

    Args:
        env: SimPy environment.
        lid: directed link id.
        bytes_per_s: achievable bandwidth.
        latency_s: propagation latency.
    """

    def __init__(self, env: simpy.Environment, lid: int, bytes_per_s: float, latency_s: float):
        self.env = env
        self.id = lid
        self.bytes_per_s = bytes_per_s
        self.latency_s = latency_s
        self.resource = simpy.Resource(env, capacity=1)
        self.up = True
        self.users: set[simpy.Process] = set()
        self.bytes = 0.0
        self.busy_s = 0.0

    def send(self, nbytes: float):
        """Process body: wait for the link, serialize ``nbytes``, propagate.

        Raises ``simpy.Interrupt`` (cause :class:`LinkDown`) if the link fails meanwhile.
        """
        proc = self.env.active_process
        self.users.add(proc)
        try:
            with self.resource.request() as req:
                yield req
                t0 = self.env.now
                try:
                    yield self.env.timeout(nbytes / self.bytes_per_s)
                finally:
                    self.busy_s += self.env.now - t0
                self.bytes += nbytes
        finally:
            self.users.discard(proc)
        if self.latency_s:
            yield self.env.timeout(self.latency_s)

    def fail(self) -> None:
        """Take the link down and interrupt every packet waiting for or crossing it."""
        self.up = False
        for proc in list(self.users):
            if proc.is_alive:
                proc.interrupt(LinkDown(self.id))
        self.users.clear()

    def restore(self) -> None:
        """Bring the link back up."""
        self.up = True
