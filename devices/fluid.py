"""Lock-step ring phases alone on their links, costed as fluid jobs whose rate follows the HBM
port caps (issue 12: the contention model's cost with overlapped TP and ``memory.transfer_cap``).

With HBM ports (``memory.transfer_cap``) a device's port is capped while one of its compute
blocks runs beside a network stream (``devices.interference.DeviceStreams.port_capacity``), so
an overlapped tensor-parallel chunk's rate changes at every block boundary of its members and
cannot be costed in closed form in advance (``Fabric.start_closed``). It went to the flow
engine, which re-solved its one lock-step flow at every port change: ~4 events and a max-min
solve per chunk, most of the contention model's cost on the 64-device GPT-3 bench.

Here such a phase runs outside the engine while nothing else is on its links or ports: it
drains its bytes at the max-min rate the engine would give its flow alone at the ports'
current capacities (the same solve, cached per capacities), re-rated when a member's port
capacity changes (:meth:`FluidRings.recap`, called by ``Fabric.set_port_capacity``), and ends
``latency`` after its last byte, as an engine transfer does. Only groups whose links no other
traffic can use are eligible (``workloads.tp_isolation``, the ports aside); the ports are
shared with every transfer of their device, so when a transfer is about to join the engine
on one of a job's ports (the engine's ``before_join`` hook), the job hands the
phase's rest to the engine with the share of its bytes already delivered and its busy time
(``Fabric._chain``): from then on the engine shares the ports as it would have all along.
A phase that starts while a transfer is on one of its ports starts in the engine.

Link, port and device byte counters, link busy seconds and message rows are the engine's
(kept here and added when the fabric's counters are read). ``simulation.exact`` turns it off
(the executor's closed forms); ``tests/test_fluid_rings.py`` checks runs against the engine.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import simpy

from devices.phase import MessageRecord, Phase
from twin.kernel.flows import max_min_rates

__all__ = ["FluidRings"]


class _Static(NamedTuple):
    """What a lock-step phase needs here, fixed in a fault-free run."""

    route: np.ndarray       # its one flow's engine links (ports included, repeated)
    nbytes: float           # the flow's bytes
    latency: float          # s after its last byte
    ports: np.ndarray       # the engine ids of the ports it crosses ...
    port_ids: tuple[int, ...]  # ... as ints
    real: np.ndarray        # its real links (no ports) ...
    per_link: np.ndarray    # ... and the bytes each carries
    sent: tuple             # (devices, bytes) sent, received (``Fabric._plan``)
    received: tuple
    row: tuple              # the static part of its message row


class _Job:
    """A phase list in flight: phase ``i`` started at ``t0``, its last byte at ``t_drain``
    (draining ``drain`` seconds per whole phase at the current capacities), its end
    ``latency`` after that; ``gen`` tells stale timeouts apart."""

    __slots__ = ("done", "drain", "gen", "i", "name", "owner", "phases",
                 "ports", "serial", "st", "t0", "t_drain")

    def __init__(self, serial: int, phases: list[Phase], name: str, owner: int,
                 done: simpy.Event):
        self.serial = serial
        self.phases, self.name, self.owner, self.done = phases, name, owner, done
        self.i, self.gen = 0, 0
        self.t0 = self.t_drain = self.drain = 0.0
        self.ports: tuple[int, ...] = ()
        self.st: _Static | None = None


def _serial(job: _Job) -> int:
    return job.serial


class FluidRings:
    """Fluid jobs of the allowed lock-step phases (see the module docstring).

    Args:
        fabric: the ``devices.fabric.Fabric`` (flow model, HBM ports);
            it calls :meth:`start` from ``Fabric.start`` for allowed phase lists,
            :meth:`recap` from ``Fabric.set_port_capacity`` and :meth:`fold` before it
            reads its device byte counters.
    """

    def __init__(self, fabric):
        self.fab = fabric
        self.env = fabric.env
        self.flows = flows = fabric.flows
        self._allowed: dict[int, bool] = {}  # id() of allowed phase lists -> takes()
        self._lists: list[list[Phase]] = []  # keeps them alive (ids stay theirs)
        self._phase: dict[Phase, _Static | None] = {}  # see _static
        self._rates: dict[tuple, float] = {}  # (phase, its ports' capacities) -> drain s
        # engine port id -> the job draining or waiting through it (its real links are the
        # caller's guarantee: no other transfer uses them, see allow)
        self._on: dict[int, _Job] = {}
        # per phase: [phases ended here not yet folded into the device counters, ended in
        # all, their summed busy seconds]
        self._tally: dict[Phase, list] = {}
        self.jobs = 0  # phase lists started here
        self.handoffs = 0  # phases that went to the engine (the rest of one, or from its start)
        self._hook = flows.before_join
        flows.before_join = self.before_join

    def allow(self, phases: list[Phase]) -> None:
        """Let ``phases`` (a list the caller reuses) run as fluid jobs from now on: the caller
        guarantees that no other transfer can share their real links (ports may be shared)
        and that nothing aborts or cuts them."""
        if id(phases) not in self._allowed:
            self._allowed[id(phases)] = bool(phases) and all(
                self._static(ph) is not None for ph in phases)
            self._lists.append(phases)

    def takes(self, phases: list[Phase]) -> bool:
        """Whether ``phases`` is allowed and each of its phases is one lock-step flow."""
        return self._allowed.get(id(phases), False)

    def _static(self, ph: Phase) -> _Static | None:
        """The phase's :class:`_Static` when it is one lock-step flow with bytes to move, else
        None (cached: fault-free runs)."""
        if ph in self._phase:
            return self._phase[ph]
        fab = self.fab
        plan = fab._plan(ph)
        closed = fab.closed_form(ph)
        out = None
        if plan is not None and plan[-1] and closed is not None and plan[10][0] > 0:
            route = np.asarray(plan[9][0], dtype=np.int64)
            ports = tuple(lk for lk in dict.fromkeys(route.tolist()) if lk >= fab.topo.n_links)
            out = _Static(route, float(plan[10][0]), closed[1], np.asarray(ports), ports,
                          closed[2], closed[3], plan[6], plan[7], plan[8])
        self._phase[ph] = out
        return out

    def _drain(self, ph: Phase, st: _Static) -> float:
        """Seconds the phase's lock-step flow takes alone on its links at the current
        capacities (the engine's max-min rate of it)."""
        cap = self.flows.capacity
        key = (ph, cap.take(st.ports).tobytes())
        t = self._rates.get(key)
        if t is None:
            rate = max_min_rates(np.zeros(len(st.route), dtype=np.int64), st.route, 1, cap)
            t = self._rates[key] = st.nbytes / float(rate[0])
        return t

    # ----------------------------------------------------------------- counters
    def fold(self) -> None:
        """Add the bytes of the phases ended here since the last call to the fabric's device
        counters (k times each phase's bytes: integers, so the same sums)."""
        fab = self.fab
        for ph, t in self._tally.items():
            k = t[0]
            if k:
                t[0] = 0
                st = self._phase[ph]
                fab._sent[st.sent[0]] += k * st.sent[1]
                fab._received[st.received[0]] += k * st.received[1]

    def _sum(self, size: int, what) -> np.ndarray:
        out = np.zeros(size)
        for ph, t in self._tally.items():
            idx, val = what(self._phase[ph], t)
            np.add.at(out, idx, val)
        return out

    @property
    def link_bytes(self) -> np.ndarray:
        """Bytes each real link carried in the phases ended here."""
        return self._sum(self.fab.topo.n_links, lambda st, t: (st.real, t[1] * st.per_link))

    @property
    def link_busy(self) -> np.ndarray:
        """Seconds each real link was busy in the phases ended here."""
        return self._sum(self.fab.topo.n_links, lambda st, t: (st.real, t[2]))

    @property
    def port_bytes(self) -> np.ndarray:
        """Bytes each device's HBM port carried (sent + received) in the phases ended here."""
        d = self.fab.topo.n_devices
        return (self._sum(d, lambda st, t: (st.sent[0], t[1] * st.sent[1]))
                + self._sum(d, lambda st, t: (st.received[0], t[1] * st.received[1])))

    # ----------------------------------------------------------------- running
    def start(self, phases: list[Phase], name: str, owner: int,
              done: simpy.Event | None = None) -> simpy.Event:
        """Run ``phases`` (:meth:`takes`) one after the other; the event (``done`` if given)
        fires after the last."""
        if done is None:
            done = self.env.event()
        self.jobs += 1
        self._begin(_Job(self.jobs, phases, name, owner, done))
        return done

    def _begin(self, job: _Job) -> None:
        """Start phase ``job.i`` now: here, or in the engine when a transfer (or another job)
        is on its ports (then with the phases after it)."""
        ph = job.phases[job.i]
        st = self._phase[ph]
        ports = st.port_ids
        on = self._on
        if not (self.flows._on_link.keys().isdisjoint(ports) and on.keys().isdisjoint(ports)):
            self._hand_over(job, 0.0, 0.0)
            return
        now = self.env.now
        job.t0, job.st, job.ports = now, st, ports
        job.drain = self._drain(ph, st)
        job.t_drain = now + job.drain
        on.update(dict.fromkeys(ports, job))
        self._schedule(job)

    def _schedule(self, job: _Job) -> None:
        job.gen += 1
        gen = job.gen
        self.env.timeout_at(job.t_drain + job.st.latency).callbacks.append(
            lambda _e: self._end(job) if job.gen == gen else None)

    def _leave(self, job: _Job) -> None:
        on = self._on
        for lk in job.ports:
            del on[lk]
        job.ports = ()

    def _hand_over(self, job: _Job, done_fraction: float, busy_s: float) -> None:
        """Phase ``job.i`` (of which ``done_fraction`` of the bytes moved here in the last
        ``busy_s`` seconds) and the rest of the job go to the engine now."""
        self.handoffs += 1
        self.fab._chain(job.phases, job.i, job.name, job.owner, job.done, done_fraction,
                        busy_s)

    def _end(self, job: _Job) -> None:
        """Phase ``job.i`` ends now: its counters and message row; then the next phase, or
        the job's event."""
        self._leave(job)
        fab = self.fab
        ph = job.phases[job.i]
        t = self._tally.get(ph)
        if t is None:
            t = self._tally[ph] = [0, 0, 0.0]
        t[0] += 1
        t[1] += 1
        t[2] += job.t_drain - job.t0
        if fab.record is not None:
            fab.record(MessageRecord(job.t0, self.env.now, job.name, job.owner, *job.st.row))
        job.i += 1
        if job.i == len(job.phases):
            self.env.fire(job.done)
        else:
            self._begin(job)

    def recap(self, ports: list[int]) -> None:
        """The HBM ports ``ports`` (engine link ids) changed capacity now: re-rate the jobs
        draining through them (the bytes left drain at the new rate)."""
        on = self._on
        if not on:
            return
        jobs = {on[lk] for lk in ports if lk in on}
        now = self.env.now
        for job in sorted(jobs, key=_serial):
            if job.t_drain <= now:  # drained: only its latency is left
                continue
            left = (job.t_drain - now) / job.drain  # share of the phase's bytes still to move
            job.drain = self._drain(job.phases[job.i], job.st)
            job.t_drain = now + left * job.drain
            self._schedule(job)

    def before_join(self, tr) -> None:
        """Engine hook: ``tr`` is about to join; a job draining through one of its ports
        hands its phase's rest over first. (A job waiting out its latency has no flow left;
        if ``tr`` is still on the ports when its next phase starts, that one goes to the
        engine, :meth:`_begin`.)"""
        on = self._on
        if on:
            jobs = {on[lk] for lk in tr.links if lk in on}
            now = self.env.now
            for job in sorted(jobs, key=_serial):
                if job.t_drain <= now or not job.ports:  # in its latency, or handed over
                    continue
                self._leave(job)
                job.gen += 1  # its timeout is stale
                left = (job.t_drain - now) / job.drain
                self._hand_over(job, 1.0 - left, now - job.t0)
        if self._hook is not None:
            self._hook(tr)
