"""The fabric: moves bytes between devices over the topology's links.

Communication is expressed as :class:`Phase` s: ``steps`` bulk-synchronous rounds in each of
which every pair ``src[i] -> dst[i]`` sends ``nbytes[i]`` (a ring all-reduce is one phase of
``p`` pairs and ``2(p-1)`` steps of ``n/p`` bytes). Two interchangeable models execute them:

* ``flow`` - the phase is one transfer of ``steps * nbytes[i]`` per pair in the flow engine
  (max-min fair link sharing) plus ``steps`` times the per-step latency (sender overhead + the
  route's hop latencies). Uncontended, this is exactly the alpha-beta cost.
* ``packet`` - each step sends real messages cut into packets that queue FIFO at every
  directed :class:`~devices.link.Link` (store-and-forward per packet, pipelined).

Both keep per-link byte and busy-time counters and per-device sent/received byte counters
(conservation is tested), reroute around failed links and resend what a failure cut after
the retransmission timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from devices.link import Link, LinkDown
from devices.spec import LinkSpec
from twin.flows import FlowNetwork, Transfer


@dataclass(frozen=True)
class Phase:
    """``steps`` rounds; in each, ``src[i]`` sends ``nbytes[i]`` bytes to ``dst[i]``."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    steps: int = 1

    @property
    def total_bytes(self) -> float:
        """Bytes delivered by the phase."""
        return float(np.sum(self.nbytes)) * self.steps


@dataclass
class MessageRecord:
    """What the fabric reports about one executed phase (one row of the ``messages`` table)."""

    t_start: float
    t_end: float
    name: str
    owner: int
    n_pairs: int
    steps: int
    bytes: float
    max_hops: int
    src: int
    dst: int


class Fabric:
    """Executes phases on the links of a topology.

    Args:
        env: SimPy environment.
        topo: the topology (``topologies.graph.Topology``).
        router: route provider with ``route(src, dst)`` and ``fail_edge/restore_edge``.
        link_specs: link spec per catalog name used on the topology's edges.
        model: ``flow`` or ``packet``.
        packet_bytes: packet size of the packet model.
        retransmit_timeout_s: wait before resending bytes cut by a failure.
        record: callback receiving a :class:`MessageRecord` per finished phase.
    """

    def __init__(self, env: simpy.Environment, topo, router, link_specs: dict[str, LinkSpec],
                 model: str = "flow", packet_bytes: float = 1 << 20,
                 retransmit_timeout_s: float = 1.0,
                 record: Callable[[MessageRecord], None] | None = None):
        self.env = env
        self.topo = topo
        self.router = router
        self.model = model
        self.packet_bytes = float(packet_bytes)
        self.timeout_s = retransmit_timeout_s
        self.record = record
        n = topo.n_links
        self.capacity = np.empty(n)
        self.latency = np.empty(n)
        self.overhead = np.empty(n)
        self.energy_per_byte = np.empty(n)
        self.idle_w = np.empty(n)
        for lid in range(n):
            spec = link_specs[topo.edge_attr(lid, "link")]
            count = topo.edge_attr(lid, "count")
            self.capacity[lid] = spec.bytes_per_s * count
            self.latency[lid] = spec.latency_us * 1e-6
            self.overhead[lid] = spec.overhead_us * 1e-6
            self.energy_per_byte[lid] = spec.energy_pj_per_bit * 8e-12
            self.idle_w[lid] = spec.idle_w * count / 2.0  # idle power split per direction
        self.bytes_sent = np.zeros(topo.n_devices)
        self.bytes_received = np.zeros(topo.n_devices)
        self.reroutes = 0
        self.retransmitted_bytes = 0.0
        if model == "flow":
            self.flows = FlowNetwork(env, self.capacity)
        else:
            self.links = [Link(env, i, self.capacity[i], self.latency[i]) for i in range(n)]

    # ----------------------------------------------------------------- accounting
    @property
    def link_bytes(self) -> np.ndarray:
        """Bytes carried by each directed link so far."""
        if self.model == "flow":
            self.flows._advance()
            return self.flows.link_bytes.copy()
        return np.array([lk.bytes for lk in self.links])

    @property
    def link_busy_s(self) -> np.ndarray:
        """Seconds each directed link spent carrying traffic."""
        if self.model == "flow":
            self.flows._advance()
            return self.flows.link_busy.copy()
        return np.array([lk.busy_s for lk in self.links])

    def step_latency(self, route: tuple[int, ...]) -> float:
        """Alpha of one message over ``route``: sender overhead + hop latencies, s."""
        if not route:
            return 0.0
        idx = list(route)
        return float(self.overhead[idx[0]] + self.latency[idx].sum())

    # ----------------------------------------------------------------- execution
    def run_phase(self, phase: Phase, name: str = "", owner: int = -1):
        """Process body executing ``phase``; returns when every byte has arrived."""
        t0 = self.env.now
        src = np.asarray(phase.src, dtype=np.int64)
        dst = np.asarray(phase.dst, dtype=np.int64)
        routes = [self.router.route(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
        per_pair = np.asarray(phase.nbytes, dtype=float) * np.ones(len(src))
        total = per_pair * phase.steps
        np.add.at(self.bytes_sent, src, total)
        if self.model == "flow":
            alpha = max((self.step_latency(r) for r in routes), default=0.0)
            tr = self.flows.transfer(routes, total, latency=alpha * phase.steps, tag=name)
            yield tr.done
        else:
            for _ in range(phase.steps):
                procs = [self.env.process(self._message(int(a), int(b), float(nb)))
                         for a, b, nb in zip(src, dst, per_pair, strict=True) if nb > 0]
                yield self.env.all_of(procs)
        np.add.at(self.bytes_received, dst, total)
        if self.record is not None:
            hops = max((len(r) for r in routes), default=0)
            self.record(MessageRecord(t0, self.env.now, name, owner, len(src), phase.steps,
                                      float(total.sum()), hops, int(src[0]) if len(src) else -1,
                                      int(dst[0]) if len(dst) else -1))

    def _message(self, src: int, dst: int, nbytes: float):
        """Packet model: one message, cut into packets sent along the route."""
        route = self.router.route(src, dst)
        if not route:
            return
        yield self.env.timeout(float(self.overhead[route[0]]))
        n_pk = max(1, int(np.ceil(nbytes / self.packet_bytes)))
        sizes = np.full(n_pk, nbytes / n_pk)
        yield self.env.all_of([self.env.process(self._packet(src, dst, float(sz)))
                               for sz in sizes])

    def _packet(self, src: int, dst: int, size: float):
        node = src
        while node != dst:
            route = self.router.route(node, dst)
            lid = route[0]
            link = self.links[lid]
            try:
                if not link.up:
                    raise simpy.Interrupt(LinkDown(lid))
                yield from link.send(size)
                node = int(self.topo.link_dst[lid])
            except simpy.Interrupt as intr:
                if not isinstance(intr.cause, LinkDown):
                    raise
                self.reroutes += 1
                self.retransmitted_bytes += size
                yield self.env.timeout(self.timeout_s)

    # ----------------------------------------------------------------- failures
    def fail_edge(self, u: int, v: int) -> None:
        """Take both directions of edge {u, v} down; cut traffic is resent after the timeout."""
        self.router.fail_edge(u, v)
        ids = [self.topo.link_id(u, v), self.topo.link_id(v, u)]
        if self.model == "flow":
            for tr, flows in self.flows.fail_links(ids):
                self.reroutes += len(flows)
                self.retransmitted_bytes += float(tr.remaining[flows].sum())
                self.env.process(self._resend(tr, flows))
        else:
            for lid in ids:
                self.links[lid].fail()

    def restore_edge(self, u: int, v: int) -> None:
        """Bring edge {u, v} back; new routes may use it again."""
        self.router.restore_edge(u, v)
        if self.model == "packet":
            for lid in (self.topo.link_id(u, v), self.topo.link_id(v, u)):
                self.links[lid].restore()

    def _resend(self, tr: Transfer, flows: np.ndarray):
        yield self.env.timeout(self.timeout_s)
        src = self.topo.link_src[[tr.routes[int(i)][0] for i in flows]]
        dst = self.topo.link_dst[[tr.routes[int(i)][-1] for i in flows]]
        routes = [self.router.route(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
        self.flows.resume(tr, flows, routes)
