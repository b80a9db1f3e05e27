"""The fabric: moves bytes between devices over the topology's links.

Communication is expressed as :class:`Phase` s: ``steps`` bulk-synchronous rounds in each of
which every pair ``src[i] -> dst[i]`` sends ``nbytes[i]`` (a ring all-reduce is one phase of
``p`` pairs and ``2(p-1)`` steps of ``n/p`` bytes). Two interchangeable models execute them:

* ``flow`` - the phase is one bulk-synchronous transfer of ``steps`` steps of ``nbytes[i]`` per
  pair in the flow engine (max-min fair link sharing; no pair starts a step before all pairs
  finished the previous one, as in the packet model) plus ``steps`` times the per-step latency
  (sender overhead + the route's hop latencies, or a collective library's step latency plus
  the hops beyond the nearest pair's: ``workloads.nccl``). Uncontended, the alpha-beta cost.
  A ring phase may instead go as one lock-step flow whose members share the slowest one's rate
  (``lockstep_rings``, ``devices.phase.lockstep_ok``): the default ``network.ring_model``.
* ``packet`` - each step sends real messages cut into packets that queue FIFO at every
  directed :class:`~devices.link.Link` (store-and-forward per packet, pipelined).

Both keep per-link byte and busy-time counters and per-device sent/received byte counters
(conservation is tested), reroute around failed links and resend what a failure cut after
the retransmission timeout.

Faults: a pair that failures have disconnected (``NoRoute``) waits until an edge is restored
and then takes the new route (the wait is logged in ``stalls``); the job never crashes on it. A
phase whose process is interrupted (the job was aborted by an accelerator failure) withdraws
its traffic, counted as ``bytes_dropped``: ``bytes_sent == bytes_received + bytes_dropped``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import simpy

from devices.fluid import FluidRings
from devices.link import Link, LinkDown
from devices.phase import MessageRecord, Phase, lockstep_ok, per_device
from devices.replicas import ReplicaQuotient
from devices.spec import LinkSpec
from topologies.routing import NoRoute, Router, nearest_pair
from twin.kernel.flows import FlowNetwork, Transfer, max_min_rates


class _Abort:
    """Interrupt cause the fabric sends its own message/packet processes on a job abort."""


ABORT = _Abort()


class Fabric:
    """Executes phases on the links of a topology.

    Args:
        env: SimPy environment.
        topo: the topology (``topologies.base.Topology``).
        router: route provider with ``route(src, dst)`` and ``fail_edge/restore_edge``.
        link_specs: link spec per catalog name used on the topology's edges.
        model: ``flow`` or ``packet``.
        packet_bytes: packet size of the packet model.
        retransmit_timeout_s: wait before resending bytes cut by a failure.
        record: callback receiving a :class:`MessageRecord` per finished phase.
        hbm_ports: flow model only: give every device a virtual *HBM port* link that every
            flow sent or received by the device also crosses (a flow's byte is read from its
            sender's HBM and written to its receiver's), so the flows of a device share its
            HBM's DMA bandwidth max-min fairly with the links. Ports start uncapped
            (``inf``); :meth:`set_port_capacity` caps them (``devices.interference``: what
            the memory controller gives DMA beside the running compute). Local copies
            (``src == dst``, empty routes) stay free.
    """

    def __init__(self, env: simpy.Environment, topo, router, link_specs: dict[str, LinkSpec],
                 model: str = "flow", packet_bytes: float = 1 << 20,
                 retransmit_timeout_s: float = 1.0,
                 record: Callable[[MessageRecord], None] | None = None,
                 hbm_ports: bool = False, lockstep_rings: bool | str = False,
                 ring_substeps: int = 1):
        self.env = env
        self.topo = topo
        self.router = router
        self._healthy: Router | None = None  # router without failures (profile)
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
        self.network = np.zeros(n, dtype=bool)  # link leaves the node (NIC / switch fabric)
        for lid in range(n):
            spec = link_specs[topo.edge_attr(lid, "link")]
            count = topo.edge_attr(lid, "count")
            self.capacity[lid] = spec.bytes_per_s * count
            self.latency[lid] = spec.latency_us * 1e-6
            self.overhead[lid] = spec.overhead_us * 1e-6
            self.energy_per_byte[lid] = spec.energy_pj_per_bit * 8e-12
            # constant power: the link's idle power + its switch / NIC / transceiver share,
            # split per direction
            self.idle_w[lid] = (spec.idle_w + spec.device_w) * count / 2.0
            self.network[lid] = spec.medium in ("infiniband", "ethernet")
        self._plans: dict[Phase, tuple] = {}  # see _plan
        self.keep_plan_links = record is not None  # traced runs keep plan_links
        self.plan_links: list[tuple[int, np.ndarray, np.ndarray]] = []  # (plan, links, bytes)
        self._plan_serial = 0
        self._sent = np.zeros(topo.n_devices)  # bytes_sent, bytes_received (see _fold)
        self._received = np.zeros(topo.n_devices)
        self.bytes_dropped = np.zeros(topo.n_devices)  # of aborted phases, by destination
        self.reroutes = 0
        self.retransmitted_bytes = 0.0
        self.stalls: list[tuple[float, float, int, int]] = []  # (t0, t1, src, dst) no route
        self._restored = env.event()  # fires (and is replaced) whenever an edge comes back
        self._steps: dict[int, int] = {}  # steps of each in-flight flow-model transfer
        # in-flight lock-step transfers of run_phase: (member sources, destinations, [longest
        # route's links]), to resend a cut ring (_resend)
        self._members: dict[int, tuple[np.ndarray, np.ndarray, list[int]]] = {}
        self.on_stall: Callable[[int, int], None] | None = None  # called on every NoRoute
        self._closed: dict[Phase, tuple] = {}  # see closed_form
        self.ports = hbm_ports and model == "flow"
        if self.ports:  # link ids n .. n + devices - 1: the devices' HBM ports
            cap = np.concatenate([self.capacity, np.full(topo.n_devices, np.inf)])
            variable = np.zeros(len(cap), dtype=bool)
            variable[n:] = True
            self.flows = FlowNetwork(env, cap, variable=variable)
        elif model == "flow":
            self.flows = FlowNetwork(env, self.capacity)
        else:
            self.links = [Link(env, i, self.capacity[i], self.latency[i]) for i in range(n)]
        self.port_capacity = np.full(topo.n_devices, np.inf)  # as set (set_port_capacity)
        # representative replica (devices.replicas, set_quotient): flows of one replica per
        # orbit on the quotient network; link counters are kept in quotient link ids and
        # expanded on reading, closed-form phases count on the real links beside them
        self.quotient: ReplicaQuotient | None = None
        self._port_plans: dict[tuple, tuple] = {}  # see _port_plan
        self.quotient_fallback: str | None = None  # why a quotient run was redone in full
        self._closed_done: dict[Phase, int] = {}  # executions of each closed-form phase
        # run_closed's executions not yet added to the counters, per phase list: [parts, k]
        self._unfolded: dict[int, list] = {}
        self._bundles: dict[int, tuple] = {}  # see _closed_bundle
        self._profiles: dict[tuple, tuple[float, bool, float]] = {}  # see profile
        self._neighbours: dict[bool, float] = {}  # see neighbours
        # a ring's flows as one lock-step flow (devices.phase.lockstep_ok): every ring phase
        # ("all": the lock-step ring model, Scenario.rings), or the phases the caller allows
        # (allow_lockstep: the step model's fast-mode TP rings without symmetry)
        self.lockstep_rings = bool(lockstep_rings) and model == "flow"
        self._lockstep_all = self.lockstep_rings and lockstep_rings == "all"
        self._lockstep_ok: set[Phase] = set()
        self.substeps = int(ring_substeps)  # barriers per ring chunk (network.ring_substeps)
        self.lockstep_transfers = 0  # transfers sent as one lock-step flow so far
        self.fluid: FluidRings | None = None  # fluid lock-step phases beside the HBM ports

    # ----------------------------------------------------------------- accounting
    def _flow_counter(self, counter: np.ndarray, ids: np.ndarray, weighted: bool) -> np.ndarray:
        """A flow-engine per-link counter at link ids ``ids``, in real links: read through
        the quotient when there is one (``weighted``: bytes, times ``n / |C(l)|``)."""
        self.flows.sync()
        q = self.quotient
        if q is None:
            return counter[ids].copy()
        canon = q.canon[ids]
        out = np.where(canon >= 0, counter[np.maximum(canon, 0)], 0.0)
        return out * q.weight(ids) if weighted else out

    @property
    def bytes_sent(self) -> np.ndarray:
        """Bytes each device has sent so far."""
        self._fold()
        return self._sent

    @property
    def bytes_received(self) -> np.ndarray:
        """Bytes each device has received so far."""
        self._fold()
        return self._received

    def _fold(self) -> None:
        """Add the :meth:`run_closed` executions counted since the last call to the device
        and phase counters (k times each phase's bytes: byte counts are integers, so the
        same sums as adding them one by one)."""
        if self.fluid is not None:
            self.fluid.fold()
        for entry in self._unfolded.values():
            k = entry[1]
            if k:
                entry[1] = 0
                for ph, _d, sent, received, _row in entry[0]:
                    self._sent[sent[0]] += k * sent[1]
                    self._received[received[0]] += k * received[1]
                    self._closed_done[ph] = self._closed_done.get(ph, 0) + k

    def _closed_counters(self) -> tuple[np.ndarray, np.ndarray]:
        """Bytes and busy seconds of every real link from the closed-form phases finished so
        far (:meth:`start_closed`): each phase's per-link bytes and drain time times the
        number of times it ran."""
        self._fold()
        nbytes, busy = np.zeros(self.topo.n_links), np.zeros(self.topo.n_links)
        for ph, k in self._closed_done.items():
            drain, _lat, links, per_link = self._closed[ph][1]
            nbytes[links] += k * per_link
            busy[links] += k * drain
        return nbytes, busy

    @property
    def link_bytes(self) -> np.ndarray:
        """Bytes carried by each directed link so far."""
        if self.model == "flow":
            ids = np.arange(self.topo.n_links)
            return (self._flow_counter(self.flows.link_bytes, ids, True)
                    + self._closed_counters()[0] + self._fluid_counter("link_bytes"))
        return np.array([lk.bytes for lk in self.links])

    @property
    def link_busy_s(self) -> np.ndarray:
        """Seconds each directed link spent carrying traffic."""
        if self.model == "flow":
            ids = np.arange(self.topo.n_links)
            return (self._flow_counter(self.flows.link_busy, ids, False)
                    + self._closed_counters()[1] + self._fluid_counter("link_busy"))
        return np.array([lk.busy_s for lk in self.links])

    @property
    def port_bytes(self) -> np.ndarray:
        """Bytes each device's HBM port carried so far (sent + received; zeros without
        ports)."""
        if not self.ports:
            return np.zeros(self.topo.n_devices)
        n = self.topo.n_links
        ids = np.arange(n, n + self.topo.n_devices)
        return self._flow_counter(self.flows.link_bytes, ids, True) + self._fluid_counter(
            "port_bytes")

    def _fluid_counter(self, name: str) -> np.ndarray | float:
        """A counter of the fluid phases (:attr:`fluid`), 0 without them."""
        return 0.0 if self.fluid is None else getattr(self.fluid, name)

    def real_capacity(self, ids: np.ndarray) -> np.ndarray:
        """Bytes/s of flow-engine links ``ids`` (links, then HBM ports) as built and set,
        whatever the quotient network gives them."""
        ids = np.asarray(ids, dtype=np.int64)
        n = self.topo.n_links
        port = ids >= n
        return np.where(port, self.port_capacity[np.where(port, ids - n, 0)],
                        self.capacity[np.minimum(ids, n - 1)])

    def set_quotient(self, quotient: ReplicaQuotient | None) -> None:
        """Send one representative flow per replica orbit from now on (``devices.replicas``;
        before any transfer, flow model only)."""
        if quotient is not None and (self.model != "flow" or self.flows.transfers
                                     or self._plans):
            raise ValueError("set_quotient: flow model only, before any phase is planned")
        self.quotient = quotient
        self._port_plans.clear()

    def allow_lockstep(self, phases: list[Phase]) -> None:
        """Let ``phases`` go to the flow engine as lock-step flows where
        :func:`~devices.phase.lockstep_ok` allows (only when the fabric was built with
        ``lockstep_rings``); before their first use (plans are cached)."""
        if self.lockstep_rings:
            self._lockstep_ok.update(phases)

    def set_port_capacity(self, devices, capacity: float) -> None:
        """Cap the HBM ports of ``devices`` at ``capacity`` bytes/s of HBM traffic (``inf``:
        uncapped) from now on; flows crossing them are re-shared at once."""
        if not self.ports:
            return
        key = tuple(devices)
        hit = self._port_plans.get(key)
        if hit is None:
            hit = self._port_plan(key)
        dev, groups, engine_ids = hit
        self.port_capacity[dev] = capacity
        for ids, scale in groups:
            self.flows.set_capacity(ids, capacity * scale)
        if self.fluid is not None:
            self.fluid.recap(engine_ids)

    def _port_plan(self, devices: tuple) -> tuple:
        """(device array, [(engine link ids, capacity scale)], engine ids as ints) of the
        ports of ``devices``: the ports themselves, or in symmetric runs each learnt cycle's
        link of the quotient once, grouped by its capacity scale (a whole class, all its
        replicas, is capped alike). Kept once every port's cycle is learnt (it never changes
        after)."""
        dev = np.asarray(devices, dtype=np.int64)
        ids = dev + self.topo.n_links
        q = self.quotient
        if q is None:
            out = (dev, [(ids, 1.0)], ids.tolist())
            self._port_plans[devices] = out
            return out
        learnt = bool((q.canon[ids] >= 0).all())
        ids = np.unique(q.canon[ids])
        ids = ids[ids >= 0]
        scales = q.capacity_scale(ids)
        out = (dev, [(ids[scales == s], s) for s in np.unique(scales).tolist()], ids.tolist())
        if learnt:
            self._port_plans[devices] = out
        return out

    def with_ports(self, routes: list, src, dst) -> list:
        """``routes`` with their ends' HBM ports appended (flow engine routes)."""
        if not self.ports:
            return routes
        n = self.topo.n_links
        return [(*tuple(r), n + int(a), n + int(b)) if len(r) else r
                for r, a, b in zip(routes, src, dst, strict=True)]

    def _real(self, route) -> int:
        """Links of a flow-engine route without its ports."""
        return len(route) - 2 if self.ports and len(route) else len(route)

    def hop_latency(self, route: tuple[int, ...]) -> float:
        """Sum of the hop latencies along ``route`` (no sender overhead), s."""
        return float(self.latency[list(route)].sum()) if route else 0.0

    def step_latency(self, route: tuple[int, ...]) -> float:
        """Alpha of one message over ``route``: sender overhead + hop latencies, s."""
        if not route:
            return 0.0
        idx = list(route)
        return float(self.overhead[idx[0]] + self.latency[idx].sum())

    # ----------------------------------------------------------------- execution
    def run_phase(self, phase: Phase, name: str = "", owner: int = -1):
        """Process body executing ``phase``; returns when every byte has arrived.

        Interrupting the process that runs it aborts the phase: its traffic leaves the network
        and its bytes are counted as dropped (then the interrupt propagates).
        """
        t0 = self.env.now
        src, dst = phase.src, phase.dst
        plan = self._plan(phase)
        if plan is not None:
            (routes, alpha, hops, per_pair, total, key, sent, received, _row, flow_routes,
             flow_total, lockstep) = plan
        else:  # failures disconnect some pair: wait for repairs, no caching
            routes = []
            for a, b in zip(src, dst, strict=True):
                routes.append((yield from self._route_wait(int(a), int(b))))
            per_pair = np.asarray(phase.nbytes, dtype=float) * np.ones(len(src))
            total = per_pair * phase.steps
            alpha = max((self.step_latency(r) for r in routes), default=0.0)
            hops = max((len(r) for r in routes), default=0)
            key = None
            lockstep = False
            sent = per_device(src, total)
            received = per_device(dst, total)
            flow_routes, flow_total = self.with_ports(routes, src, dst), total
        self._sent[sent[0]] += sent[1]
        if self.model == "flow":
            tr = self.flows.transfer(flow_routes, flow_total, latency=alpha * phase.steps,
                                     tag=name, key=key,
                                     steps=1 if lockstep else phase.steps * self.substeps)
            self.lockstep_transfers += lockstep
            self._steps[tr.id] = phase.steps
            if lockstep:  # a cut resends the ring whole, each member on its own route
                self._members[tr.id] = (phase.src, phase.dst, [hops])
            try:
                yield tr.done
            except simpy.Interrupt:
                self.flows.cancel(tr)
                np.add.at(self.bytes_dropped, dst, total)
                raise
            finally:
                self._steps.pop(tr.id, None)
                members = self._members.pop(tr.id, None)
            if members is not None:
                hops = members[2][0]
            else:
                hops = max(hops, max((self._real(r) for r in tr.routes), default=0))
        else:
            box = [hops]
            for _ in range(phase.steps):
                procs = [self.env.process(self._message(int(a), int(b), float(nb), box))
                         for a, b, nb in zip(src, dst, per_pair, strict=True) if nb > 0]
                try:
                    yield self.env.all_of(procs)
                except simpy.Interrupt:
                    for p in procs:
                        if p.is_alive:
                            p.interrupt(ABORT)
                    np.add.at(self.bytes_dropped, dst, total)
                    raise
            hops = box[0]
        self._received[received[0]] += received[1]
        if self.record is not None:
            self.record(MessageRecord(t0, self.env.now, name, owner, len(src), phase.steps,
                                      float(total.sum()), hops, int(src[0]) if len(src) else -1,
                                      int(dst[0]) if len(dst) else -1,
                                      key[0] if key is not None else -1))

    def start(self, phases: list[Phase], name: str = "", owner: int = -1,
              done: simpy.Event | None = None) -> simpy.Event:
        """Run ``phases`` one after the other without a SimPy process (flow model, fault-free
        runs): each transfer's completion starts the next; the event (``done`` if given, else
        a new one) fires after the last.

        Falls back to a process running :meth:`run_phase` in the packet model or when a
        phase has no route (failures). Not interruptible: runs that can abort use
        :meth:`run_phase` inside their own processes.
        """
        if self.fluid is not None and self.fluid.takes(phases):
            return self.fluid.start(phases, name, owner, done)
        if self.model != "flow" or any(self._plan(ph) is None for ph in phases):
            def body():
                for ph in phases:
                    yield from self.run_phase(ph, name, owner)
            proc = self.env.process(body())
            if done is not None:
                proc.callbacks.append(lambda _e: done.succeed())
            return proc
        if done is None:
            done = self.env.event()
        if phases:
            self._chain(phases, 0, name, owner, done)
        else:
            done.succeed()
        return done

    def closed_form(self, phase: Phase) -> tuple[float, float, np.ndarray, np.ndarray] | None:
        """What the flow engine would give ``phase`` alone on the network, in closed form:
        ``(drain s, latency s, links, bytes per link)`` with drain = the time its flows take
        at their max-min rates among themselves (steps x step bytes / rate) and latency =
        steps x the per-step alpha of :meth:`_plan` (the protocol's step latency, base latency
        and bandwidth-fraction term of ``workloads.nccl``, or the links' overhead + hops).

        Only when every flow has a route and all flows drain in the same time (then no flow
        parks at a step barrier and the bulk-synchronous transfer is exactly ``drain``);
        otherwise None (the caller uses the flow network). Cached per phase and failures.
        """
        failed = self.router.failed_edges
        hit = self._closed.get(phase)
        if hit is not None and hit[0] == failed:
            return hit[1]
        plan = self._plan(phase)
        out = None
        if plan is not None and self.model == "flow":
            routes, alpha, _hops, _pp, total = plan[:5]
            pos = total > 0
            if len(routes) and all(len(r) for r in routes) and pos.any():
                lens = [len(r) for r in routes]
                owner = np.repeat(np.arange(len(routes)), lens)
                links = np.concatenate([np.asarray(r, dtype=np.int64) for r in routes])
                rate = max_min_rates(owner, links, len(routes), self.capacity)
                drain = total[pos] / rate[pos]
                t = float(drain.max())
                if float(drain.min()) >= t * (1.0 - 1e-12):
                    uniq, inv = np.unique(links, return_inverse=True)
                    per_link = np.bincount(inv, weights=total[owner], minlength=len(uniq))
                    out = (t, alpha * phase.steps, uniq, per_link)
        self._closed[phase] = (failed, out)
        return out

    def start_closed(self, phases: list[Phase], name: str = "", owner: int = -1) -> simpy.Event:
        """Run ``phases`` one after the other in closed form (:meth:`closed_form` of each
        must not be None): one timeout of the summed drain + latency times instead of flow
        transfers. Bytes, link byte and busy counters and message rows are those the flow
        engine gives the same phases alone on their links, so this is exact only when no
        other traffic can share those links while they run: the caller guarantees that
        (``workloads.executor.Executor`` checks it statically for tensor-parallel groups)."""
        costs, total = self._closed_begin(phases)
        t0 = self.env.now
        ev = self.env.timeout(total)
        ev.callbacks.append(lambda _e: self._closed_end(phases, costs, t0, name, owner))
        return ev

    def run_closed(self, phases: list[Phase], t0: float, name: str = "",
                   owner: int = -1) -> float:
        """:meth:`start_closed` from ``t0`` (s) without the clock: all its accounting at once;
        returns the end time, s (for an agent running ahead of the clock, see
        ``Accelerator.run_at``; nothing may read these counters before then). Without a
        message sink the counters are only counted here and added when read (``_fold``)."""
        if self.record is not None:
            costs, total = self._closed_begin(phases)
            self._closed_end(phases, costs, t0, name, owner)
            return t0 + total
        entry, total = self.closed_counter(phases)
        entry[1] += 1
        return t0 + total

    def closed_counter(self, phases: list[Phase]) -> tuple[list, float]:
        """``([parts, runs not yet added to the counters], summed time s)`` of a phase list
        :meth:`run_closed` counts (a caller that runs the same list many times may keep it
        and count a run itself, or take one back: ``entry[1] +=/-= 1``; byte counts are
        integers, so this is exact). Valid while the failed edges stay as they are; not with
        a message sink (its rows)."""
        parts, total = self._closed_bundle(phases)
        entry = self._unfolded.get(id(phases))
        if entry is None or entry[0] is not parts:
            self._fold()
            entry = self._unfolded[id(phases)] = [parts, 0]
        return entry, total

    def _closed_bundle(self, phases: list[Phase]) -> tuple[list, float]:
        """Per phase of ``phases`` (closed form, bytes sent, bytes received, message row) and
        their summed time, s; cached per list object (the executor reuses its phase lists)
        and set of failed edges."""
        failed = self.router.failed_edges
        hit = self._bundles.get(id(phases))
        if hit is not None and hit[0] is phases and hit[1] == failed:
            return hit[2], hit[3]
        parts = []
        total = 0.0
        for ph in phases:
            drain, lat, _links, _per_link = self.closed_form(ph)
            plan = self._plan(ph)
            parts.append((ph, drain + lat, plan[6], plan[7], plan[8]))
            total += drain + lat
        self._bundles[id(phases)] = (phases, failed, parts, total)
        return parts, total

    def _closed_begin(self, phases: list[Phase]) -> tuple[list, float]:
        """Closed forms of ``phases`` (see :meth:`_closed_bundle`) and their summed time, s;
        counts the bytes sent."""
        parts, total = self._closed_bundle(phases)
        sent_b = self._sent
        for _ph, _d, sent, _r, _row in parts:
            sent_b[sent[0]] += sent[1]
        return parts, total

    def _closed_end(self, phases: list[Phase], parts: list, t0: float, name: str,
                    owner: int) -> None:
        """The end of closed-form ``phases`` started at ``t0``: bytes received, link counters
        (see :meth:`_closed_counters`), message rows."""
        t = t0
        done = self._closed_done
        recv_b = self._received
        for ph, d, _s, received, row in parts:
            recv_b[received[0]] += received[1]
            done[ph] = done.get(ph, 0) + 1
            if self.record is not None:
                self.record(MessageRecord(t, t + d, name, owner, *row))
            t += d

    def start_partial(self, phase: Phase, elapsed: float, name: str = "",
                      owner: int = -1) -> simpy.Event:
        """:meth:`start` of a lock-step ``phase`` (:meth:`closed_form` not None) that has
        run alone on its links for the last ``elapsed`` seconds, less than its drain time:
        that share of its bytes is delivered and its links were busy meanwhile; the rest
        goes to the flow engine now. Event fires at its end."""
        drain = self.closed_form(phase)[0]
        done = self.env.event()
        self._chain([phase], 0, name, owner, done, elapsed / drain, elapsed)
        return done

    def _chain(self, phases: list[Phase], i: int, name: str, owner: int,
               done: simpy.Event, done_fraction: float = 0.0, busy_s: float = 0.0) -> None:
        phase = phases[i]
        t0 = self.env.now - busy_s
        (_r, alpha, _hops, _pp, _t, key, sent, received, row, routes, total,
         lockstep) = self._plan(phase)
        self._sent[sent[0]] += sent[1]
        tr = self.flows.transfer(routes, total, latency=alpha * phase.steps, tag=name, key=key,
                                 steps=1 if lockstep else phase.steps * self.substeps,
                                 done_fraction=done_fraction, busy_s=busy_s)
        self.lockstep_transfers += lockstep

        def finished(_tr: object) -> None:
            self._received[received[0]] += received[1]
            if self.record is not None:
                self.record(MessageRecord(t0, self.env.now, name, owner, *row))
            if i + 1 < len(phases):
                self._chain(phases, i + 1, name, owner, done)
            else:
                done.succeed()

        if tr.finished:  # nothing to move and no latency: done within transfer(), already
            finished(tr)
        else:
            tr.on_done.append(finished)

    def _plan(self, phase: Phase) -> tuple | None:
        """Routes, per-step alpha, max hops, byte vectors and the flow-engine pattern key of a
        phase, cached per phase object and set of failed edges (None when failures leave
        some pair without a route)."""
        failed = self.router.failed_edges
        hit = self._plans.get(phase)
        if hit is not None and hit[0] == failed:
            return hit[1]
        try:
            routes = [self.router.route(a, b)
                      for a, b in zip(phase.src.tolist(), phase.dst.tolist(), strict=True)]
        except NoRoute:
            return None
        per_pair = np.asarray(phase.nbytes, dtype=float) * np.ones(len(phase.src))
        total = per_pair * phase.steps
        self._plan_serial += 1
        hops = max((len(r) for r in routes), default=0)
        n = len(phase.src)
        row = (n, phase.steps, float(total.sum()), hops,  # the static part of its message row
               int(phase.src[0]) if n else -1, int(phase.dst[0]) if n else -1,
               self._plan_serial)
        if self.keep_plan_links and routes:  # bytes each link carries per execution
            lengths = [len(r) for r in routes]
            links = np.concatenate([np.asarray(r, dtype=np.int64) for r in routes])
            uniq, inv = np.unique(links, return_inverse=True)
            self.plan_links.append((self._plan_serial, uniq, np.bincount(
                inv, weights=np.repeat(total, lengths), minlength=len(uniq))))
        if phase.step_latency_s is not None:
            hop = max((self.hop_latency(r) for r in routes), default=0.0)
            alpha = (phase.step_latency_s + max(hop - phase.hop_latency_ref_s, 0.0)
                     + phase.base_latency_s / max(phase.steps, 1))
        else:
            alpha = max((self.step_latency(r) for r in routes), default=0.0)
        flow_routes, flow_total = self.with_ports(routes, phase.src.tolist(),
                                               phase.dst.tolist()), total
        if self.quotient is not None:
            flow_routes, flow_total = self._reduce(phase, flow_routes, total)
        lockstep = ((self._lockstep_all or (phase in self._lockstep_ok and self.quotient is None))
                    # (on the quotient too: tests/test_replica_quotient.py)
                    and lockstep_ok(phase.steps, flow_routes, flow_total))
        if lockstep:
            flow_routes = [tuple(lk for r in flow_routes for lk in r)]
            flow_total = flow_total[:1]
        plan = (routes, alpha, hops,
                per_pair, total, (self._plan_serial, failed), per_device(phase.src, total),
                per_device(phase.dst, total), row, flow_routes, flow_total, lockstep)
        self._plans[phase] = (failed, plan)
        return plan

    def _reduce(self, phase: Phase, routes: list, total: np.ndarray) -> tuple[list, np.ndarray]:
        """The representative flows of a phase on the quotient network (raises
        ``devices.replicas.QuotientBroken`` when the phase is not replica-symmetric)."""
        q = self.quotient
        reps, nbytes, new = q.reduce(phase.src, phase.dst, routes, total)
        if len(new):  # first use of these cycles: their quotient capacities
            self.flows.capacity[new] = self.real_capacity(new) * q.capacity_scale(new)
        return reps, nbytes

    def profile(self, phase: Phase) -> tuple[float, bool, float]:
        """``(bottleneck bytes/s, crosses the network, reference hop latency s)`` of ``phase``
        alone on its routes: the slowest link on any pair's route, whether a route uses an
        InfiniBand / Ethernet link, and the hop latency a library's measured step covers (the
        nearest pair's, see ``_profile``; pairs farther apart add their extra hops). ``(inf,
        False, 0)`` without a route. Cached by the phase's pairs and the failed edges."""
        key = (phase.src.tobytes(), phase.dst.tobytes(), self.router.failed_edges)
        hit = self._profiles.get(key)
        if hit is None:
            hit = self._profiles[key] = self._profile(phase)
        return hit

    def _profile(self, phase: Phase) -> tuple[float, bool, float]:
        plan = self._plan(phase)
        if plan is None or not plan[0]:
            return math.inf, False, 0.0
        links = np.concatenate([np.asarray(r, dtype=np.int64) for r in plan[0] if r] or
                               [np.zeros(0, dtype=np.int64)])
        if not len(links):
            return math.inf, False, 0.0
        # the library's step latency was measured between neighbours: the phase's own nearest
        # pair or the fabric's of the same kind (a ring of pairs k hops apart pays k - 1 more)
        healthy, network = self._healthy_router(), bool(self.network[links].any())
        own = min(self.hop_latency(healthy.route(int(a), int(b)))
                  for a, b in zip(phase.src.tolist(), phase.dst.tolist(), strict=True) if a != b)
        return float(self.capacity[links].min()), network, min(own, self.neighbours(network))

    def _healthy_router(self) -> Router:
        """The run's router while nothing has failed, else one without failures."""
        if self.router.failed_edges and self._healthy is None:
            self._healthy = Router(self.topo)
        return self._healthy if self.router.failed_edges else self.router

    def neighbours(self, network: bool) -> float:
        """Hop latency of the fabric's nearest pair of devices whose healthy route crosses a
        network link (``network``) or not, s (``topologies.routing.nearest_pair``; or inf)."""
        hit = self._neighbours.get(network)
        if hit is None:
            best = nearest_pair(self.topo, self._healthy_router(),
                                lambda r: bool(self.network[list(r)].any()) == network,
                                self.hop_latency)
            hit = self._neighbours[network] = math.inf if best is None else best
        return hit

    def _route_wait(self, src: int, dst: int):
        """Process body: the route ``src -> dst``, waiting for edges to come back while
        failures disconnect the pair (each wait is logged in ``stalls``)."""
        t0 = None
        while True:
            try:
                route = self.router.route(src, dst)
            except NoRoute:
                if t0 is None:
                    t0 = self.env.now
                if self.on_stall is not None:
                    self.on_stall(src, dst)
                yield self._restored
                continue
            if t0 is not None:
                self.stalls.append((t0, self.env.now, src, dst))
            return route

    def _message(self, src: int, dst: int, nbytes: float, box: list | None = None):
        """Packet model: one message, cut into packets sent along the route."""
        pks: list = []
        try:
            route = yield from self._route_wait(src, dst)
            if not route:
                return
            yield self.env.timeout(float(self.overhead[route[0]]))
            n_pk = max(1, int(np.ceil(nbytes / self.packet_bytes)))
            sizes = np.full(n_pk, nbytes / n_pk)
            pks = [self.env.process(self._packet(src, dst, float(sz), box)) for sz in sizes]
            yield self.env.all_of(pks)
        except simpy.Interrupt as intr:
            if intr.cause is not ABORT:
                raise
            for p in pks:
                if p.is_alive:
                    p.interrupt(ABORT)

    def _packet(self, src: int, dst: int, size: float, box: list | None = None):
        node = src
        hops = 0
        try:
            while node != dst:
                route = yield from self._route_wait(node, dst)
                lid = route[0]
                link = self.links[lid]
                try:
                    if not link.up:
                        raise simpy.Interrupt(LinkDown(lid))
                    yield from link.send(size)
                    node = int(self.topo.link_dst[lid])
                    hops += 1
                except simpy.Interrupt as intr:
                    if not isinstance(intr.cause, LinkDown):
                        raise
                    self.reroutes += 1
                    self.retransmitted_bytes += size
                    yield self.env.timeout(self.timeout_s)
        except simpy.Interrupt as intr:
            if intr.cause is not ABORT:
                raise
            return
        if box is not None and hops > box[0]:
            box[0] = hops

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
        """Bring edge {u, v} back; new routes may use it again (pairs waiting for a route
        retry now)."""
        self.router.restore_edge(u, v)
        if self.model == "packet":
            for lid in (self.topo.link_id(u, v), self.topo.link_id(v, u)):
                self.links[lid].restore()
        ev, self._restored = self._restored, self.env.event()
        ev.succeed()

    def _resend_ring(self, tr: Transfer, members: tuple):
        """:meth:`_resend` of a lock-step ring (its one flow crosses every member's route):
        every member's route now (the cut ones detour), joined into one flow again; the
        per-step latency becomes that of the longest route."""
        src, dst, longest = members
        routes = []
        for a, b in zip(src.tolist(), dst.tolist(), strict=True):
            routes.append((yield from self._route_wait(int(a), int(b))))
        longest[0] = max(longest[0], max(len(r) for r in routes))
        steps = self._steps.get(tr.id, 1)
        alpha = max(self.step_latency(tuple(int(x) for x in r)) for r in routes)
        tr.latency = max(tr.latency, alpha * steps)
        joined = tuple(lk for r in self.with_ports(routes, src, dst) for lk in r)
        self.flows.resume(tr, np.zeros(1, dtype=np.int64), [joined])

    def _resend(self, tr: Transfer, flows: np.ndarray):
        """Resend cut flows after the timeout on new routes; the transfer's per-step latency
        becomes that of its longest route now (a detour adds hops)."""
        yield self.env.timeout(self.timeout_s)
        members = self._members.get(tr.id)
        if members is not None:
            yield from self._resend_ring(tr, members)
            return
        n = self.topo.n_links
        src = self.topo.link_src[[tr.routes[int(i)][0] for i in flows]]
        dst = self.topo.link_dst[[tr.routes[int(i)][self._real(tr.routes[int(i)]) - 1]
                                  for i in flows]]
        routes = []
        for a, b in zip(src, dst, strict=True):
            routes.append((yield from self._route_wait(int(a), int(b))))
        steps = self._steps.get(tr.id)
        if steps is not None:
            new = [tuple(int(x) for x in r) for r in routes]
            old = [tuple(int(x) for x in r if x < n) for k, r in enumerate(tr.routes)
                   if k not in set(int(i) for i in flows)]
            alpha = max((self.step_latency(r) for r in new + old), default=0.0)
            tr.latency = max(tr.latency, alpha * steps)
        self.flows.resume(tr, flows, self.with_ports(routes, src, dst))
