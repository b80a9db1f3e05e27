"""SimPy agents that execute per-stage programs on the fabric.

One process per rank class interprets its stage's program on the compute stream, running
compute blocks on the class's :class:`~devices.accelerator.Accelerator` agent; gradient
all-reduces run on a per-class communication stream (FIFO, overlapping the backward pass);
pipeline sends run as their own processes and fill the receiver's mailbox. Sharded data
parallelism (``workloads.sharding``) adds a second communication stream per class for the
shard group's all-gathers and reduce-scatters (FIFO, in issue order) and a third for hybrid
sharding's all-reduce of gradient shards across shard groups; the compute stream waits for an
all-gather only where the program says so (``SH_WAIT``), and for every stream at ``DP_WAIT``.
Collectives rendezvous: a collective starts when every class holding a member of the
participating groups has reached it, then runs the algorithm's phases on the fabric for all
those groups at once.

Overlaps (``workloads.overlap``, the ``overlap`` section) choose which of these streams run
beside compute: chunked tensor-parallel communication (``tp_comm``: a fused instruction
pipelines a block's chunks with its TP collective's chunks on a TP stream), data-parallel
buckets (``dp_buckets``, ``dp_streams``) and pipeline sends (``pipeline``). Every
communication stream is started and ended on the device agents of the classes it touches
(``devices.interference.DeviceStreams``): their HBM controller and SMs see what runs beside
each compute block.

Job control (``workloads.job``): after an iteration that a checkpoint follows, every class
joins the checkpoint barrier. :meth:`Executor.abort` stops the job at once (every process of the
current *epoch* is interrupted and its traffic withdrawn; an agent in the middle of a compute
block finishes that block and then leaves); :meth:`Executor.restart` starts a new epoch from a
given iteration with fresh mailboxes and rendezvous. ``done`` fires when the last epoch has
finished every iteration.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import simpy

from devices.accelerator import Accelerator
from devices.fabric import Fabric
from devices.fluid import FluidRings
from twin.kernel.records import Recorder
from workloads import collectives, nccl
from workloads.comm_accounting import CommEnergy, CommStats
from workloads.optimistic import OptimisticTP, rejoin
from workloads.overlap import TPO, Fifo, OverlapSpec, chunk_block, fuse_tp
from workloads.parallel import Layout
from workloads.quiet import QuietRunAhead
from workloads.schedules import (
    COMPUTE,
    DATA,
    DP_START,
    DP_WAIT,
    P2P_NAMES,
    RECV,
    SEND,
    SH_GATHER,
    SH_REDUCE,
    SH_WAIT,
    TP,
)
from workloads.tp_isolation import exclusive_tp_groups, isolated_tp_groups
from workloads.transformer import Block


class Executor:
    """Wires programs, layout, accelerator agents and fabric into running SimPy processes.

    Args:
        env: SimPy environment.
        layout: ranks, devices, groups and classes.
        fabric: executes communication phases.
        programs: instructions of one iteration per pipeline stage.
        blocks: ``blocks[stage][name]`` -> ``workloads.transformer.Block``.
        accelerators: one agent per rank class (``devices.accelerator.Accelerator``).
        iterations: iterations to run.
        recorder: trace sink.
        job: checkpoint barrier / failure / restart controller (``workloads.job``), or None.
        chained: run tensor-parallel collectives as chained fabric transfers instead of
            processes (faster; only for runs that nothing can abort or cut off).
        data: the data path (``workloads.data.DataPath``) of ``DATA`` instructions, or None.
        overlap: which streams overlap compute (``workloads.overlap.OverlapSpec``).
        streams: one device agent per rank class (``devices.interference.DeviceStreams``)
            that communication streams are started and ended on, or None.
        comm_energy: SMs per stream kind and their activity (``devices.interference``)
            when communication kernels draw device energy, else None (``CommEnergy``).
        closed_form: cost tensor-parallel collectives whose links no other traffic can use
            in closed form (``Fabric.start_closed``; beside HBM ports as fluid jobs,
            ``devices.fluid``) instead of flow transfers; only for runs that nothing can
            abort or cut off (see :meth:`tp_closed_form_groups`).
        run_ahead: let an agent run its compute blocks and closed-form TP collectives ahead of
            the clock, one timeout for a run of them (``Accelerator.run_at``,
            ``Fabric.run_closed``), where the result is bit-identical: nothing outside the
            agent reads or changes its device or those links in between (no power manager,
            trace, fault hook or bubble down-clocking of TP waits; the classes in ``clocked``,
            whose devices a fault changes, stay on the clock); beside device agents
            (``streams``) what a stream reaches is taken back (``workloads.quiet``).
        optimistic: with ``run_ahead`` and no ``streams``, also run ahead the TP collectives
            of groups whose links other traffic may reach, taken back when it does
            (``workloads.optimistic``; the flow engine's result to rounding).
    """

    def __init__(self, env: simpy.Environment, layout: Layout, fabric: Fabric,
                 programs: dict[int, list[tuple]], blocks: dict[int, dict[str, Block]],
                 accelerators: list[Accelerator], iterations: int, recorder: Recorder, *,
                 chained: bool, closed_form: bool, run_ahead: bool, optimistic: bool, job=None,
                 data=None, overlap: OverlapSpec | None = None, streams: list | None = None,
                 comm_energy=None):
        self.env, self.layout, self.fabric = env, layout, fabric
        self.programs, self.blocks, self.accelerators = programs, blocks, accelerators
        self.iterations, self.recorder = iterations, recorder
        n = len(layout.classes)
        self.stats = [CommStats() for _ in range(n)]
        self._mail: dict[tuple, simpy.Event] = {}
        self._senders: dict[tuple[int, int], int] = {}  # (class, direction) -> classes to it
        self._got: dict[tuple, int] = {}  # of those, how many have sent a message so far
        self._seq: dict[tuple[int, str], int] = defaultdict(int)
        self._rendezvous: dict[tuple, list] = {}
        self._phase_cache: dict[tuple, object] = {}
        self._groups_cache: dict[tuple[str, int], tuple[np.ndarray, tuple[int, ...]]] = {}
        self.job, self.chained, self.data = job, chained, data
        # called with the class id before every compute block (set by the fault injector:
        # faults that change the class's accelerator, e.g. heavy-tailed HBM service)
        self.before_block: Callable[[int], None] | None = None
        self.overlap = ov = overlap if overlap is not None else OverlapSpec()
        self.streams = streams
        self.comm_energy = (CommEnergy(comm_energy, accelerators, [
            layout.device[r] for r in layout.classes]) if comm_energy else None)
        self.closed_form = closed_form and fabric.model == "flow"
        self._closed_groups: set | None = None  # TP groups in closed form: see _closed
        self._fluid: set | None = None  # TP groups as fluid jobs: see _allow_fluid
        self.closed_form_collectives = 0  # TP collectives costed in closed form
        self.run_ahead = run_ahead and chained and QuietRunAhead.allows(streams)
        self.ahead_ops = [0] * n  # compute blocks and TP collectives run ahead, per class
        self._optimistic = optimistic and self.run_ahead and self.closed_form and not streams
        self.optimistic: OptimisticTP | None = None  # built at the first TP collective
        self.quiet = QuietRunAhead(self) if self.run_ahead and streams else None
        self._tp_plans: dict[tuple, tuple] = {}  # see _tp_plan
        self._chunks: dict[tuple[int, str], Block] = {}
        self._fifos: dict[tuple[int, int], Fifo] = {}
        if ov.tp_comm and layout.tp > 1:
            self.programs = {s: fuse_tp(p) for s, p in programs.items()}
        self.done = env.event()
        self.epoch = 0
        self._live: set[simpy.Process] = set()
        self._busy = [False] * n            # agent is inside a compute block
        self._waiting: list[str | None] = [None] * n  # wait kind the compute stream is in
        self._finished = 0
        self._agents: dict[simpy.Process, int] = {}
        self.agent_proc: dict[int, simpy.Process] = {}
        self.clocked: set[int] = set()  # classes that never run ahead (faults change them)
        if job is not None:
            job.attach(self)
        self.procs = self._start_agents(0)

    @property
    def run_ahead_ops(self) -> int:
        """Compute blocks and TP collectives the agents ran ahead of the clock."""
        return sum(self.ahead_ops)

    # ----------------------------------------------------------------- agent
    def _agent(self, cls: int, epoch: int = 0, start: int = 0):
        env = self.env
        st = self.stats[cls]
        acc = self.accelerators[cls]
        stage = int(self.layout.class_stage[cls])
        prog = self.programs[stage]
        blocks = self.blocks[stage]
        rec = self.recorder
        busy, hook, job = self._busy, self.before_block, self.job
        ov = self.overlap
        dp_tails: list[simpy.Event | None] = [None] * ov.dp_streams
        # run ahead of the clock (see ``run_ahead``): ``ahead`` is the local time, None in step
        ahead_ok = (self.run_ahead and hook is None and not acc.downclocks("tp")
                    and cls not in self.clocked and (self.quiet is None or self.quiet.ok(cls)))
        ahead: float | None = None
        for it in range(start, self.iterations):
            dp_tails[:] = [None] * ov.dp_streams
            serial: list[tuple[int, float]] = []  # buckets of dp_buckets: false
            sh_tail: simpy.Event | None = None   # sharding stream (all-gather, reduce-scatter)
            rep_tail: simpy.Event | None = None  # hybrid sharding: all-reduce across groups
            gathers: dict = {}
            i = 0
            while True:  # the program (an index: a run ahead taken back goes back into it)
                if i == len(prog):
                    if ahead is None:
                        break
                    i, ahead = (yield from rejoin(self, cls, it, ahead)), None
                    if i is None:
                        break
                    continue
                ins = prog[i]
                i += 1
                op = ins[0]
                if op != COMPUTE:
                    acc.sync()  # a TP-group agent's members meet (or act) at its clock
                if ahead_ok and (ahead is not None or self.quiet is None
                                 or QuietRunAhead.idle(*dp_tails, sh_tail, rep_tail)):
                    t1 = self._run_ahead(cls, it, i - 1, ins, blocks,
                                         env.now if ahead is None else ahead)
                    if t1 is not None:
                        ahead = t1
                        continue
                    if ahead is not None:
                        if op == TP and len(self._groups("tp", cls)[1]) > 1:
                            # a rendezvous: arrive at the local time without rejoining the
                            # clock; the collective starts at the last arrival
                            t0, ahead = ahead, None
                            yield from self._blocked(cls, "tp", self._collective(
                                "tp", cls, ins[1], ins[2], at=t0))
                            self.tp_waited(cls, it, ins[1], t0, env.now)
                            continue
                        # rejoin the clock where the run ended (or where it was taken back)
                        r, ahead = (yield from rejoin(self, cls, it, ahead)), None
                        if r is not None:
                            i = r
                            continue
                if op == COMPUTE:
                    if hook is not None:
                        hook(cls)
                    busy[cls] = True
                    yield from acc.compute(blocks[ins[1]], it, ins[2], ins[3], ins[4])
                    busy[cls] = False
                    if self.epoch != epoch:
                        return  # the job was aborted during the block
                    continue
                t0 = env.now
                if op == TPO:
                    yield from self._tp_overlapped(cls, it, ins, blocks, epoch)
                    if self.epoch != epoch:
                        return
                elif op == TP:
                    yield from self._blocked(cls, "tp", self._collective("tp", cls, ins[1],
                                                                          ins[2]))
                    self.tp_waited(cls, it, ins[1], t0, env.now)
                elif op == SEND:
                    if not ov.pipeline:  # the sender waits for delivery
                        yield from self._blocked(cls, "recv", self._spawn(
                            self._send(cls, ins[1], (it, *ins[2]), ins[3])))
                        st.recv_s += env.now - t0
                        rec.op(cls, it, "compute", "send_wait", ins[2][0], ins[2][1],
                               ins[2][2], -1, t0, env.now, 0.0)
                    elif self.chained:
                        self._send_chained(cls, ins[1], (it, *ins[2]), ins[3])
                    else:
                        self._spawn(self._send(cls, ins[1], (it, *ins[2]), ins[3]))
                elif op == RECV:
                    key = (cls, (it, *ins[2]))
                    ev = self._mail.get(key)
                    if ev is None:
                        ev = self._mail[key] = env.event()
                    if not ev.triggered:
                        yield from self._blocked(cls, "recv", ev)
                    del self._mail[key]
                    if env.now > t0:
                        st.recv_s += env.now - t0
                        rec.op(cls, it, "compute", "recv", ins[2][0], ins[2][1], ins[2][2], -1,
                               t0, env.now, 0.0)
                elif op == DP_START:
                    if not ov.dp_buckets:
                        serial.append((ins[1], ins[2]))
                        continue
                    j = ins[1] % ov.dp_streams
                    dp_tails[j] = self._spawn(self._stream_job(cls, it, dp_tails[j], "dp",
                                                               "allreduce", ins[2], ins[1]))
                elif op == SH_GATHER:
                    sh_tail = gathers[ins[1]] = self._spawn(self._stream_job(
                        cls, it, sh_tail, "shard", "allgather", ins[2], ins[1]))
                elif op == SH_REDUCE:
                    sh_tail = rs = self._spawn(self._stream_job(
                        cls, it, sh_tail, "shard", "reduce_scatter", ins[1], -1))
                    if ins[2] > 0:
                        rep_tail = self._spawn(self._stream_job(
                            cls, it, rep_tail, "replica", "allreduce", ins[2], -1, rs))
                elif op == SH_WAIT:
                    ev = gathers.pop(ins[1])
                    if not ev.triggered:
                        yield from self._blocked(cls, "dp_wait", ev)
                    if env.now > t0:
                        st.shard_wait_s += env.now - t0
                        rec.op(cls, it, "compute", "shard_wait", "allgather", ins[1], -1, -1,
                               t0, env.now, 0.0)
                elif op == DP_WAIT:
                    for bucket, nbytes in serial:  # no overlap: one after the other, waiting
                        t1 = env.now
                        yield from self._blocked(cls, "dp_wait", self._collective(
                            "dp", cls, "allreduce", nbytes))
                        rec.op(cls, it, "comm", "dp", "allreduce", bucket, -1, -1, t1,
                               env.now, 0.0)
                    serial.clear()
                    tails = [e for e in (*dp_tails, sh_tail, rep_tail)
                             if e is not None and not e.triggered]
                    if tails:
                        yield from self._blocked(cls, "dp_wait", tails[0] if len(tails) == 1
                                                 else env.all_of(tails))
                    if env.now > t0:
                        st.dp_wait_s += env.now - t0
                        rec.op(cls, it, "compute", "dp_wait", "dp_wait", -1, -1, -1, t0, env.now,
                               0.0)
                elif op == DATA:  # the microbatch's input from the data path
                    ev = self.data.ready(cls, it, ins[1])
                    if not ev.triggered:
                        yield from self._blocked(cls, "data_wait", ev)
                    self.data.consumed(cls, it, ins[1])
                    if env.now > t0:
                        st.data_wait_s += env.now - t0
                        rec.op(cls, it, "compute", "data_wait", "data_wait", ins[1], -1, -1, t0,
                               env.now, 0.0)
            st.iteration_end.append(env.now)
            if job is not None and job.due(it):
                t0 = env.now
                yield from self._blocked(cls, "checkpoint", job.checkpoint(it))
                rec.op(cls, it, "compute", "checkpoint", "checkpoint", -1, -1, -1, t0, env.now,
                       0.0)
        self._finished += 1
        if self._finished == len(self.stats):
            self.done.succeed()

    def _run_ahead(self, cls: int, it: int, index: int, ins: tuple, blocks: dict[str, Block],
                   t: float) -> float | None:
        """Run instruction ``ins`` of ``cls`` from the local time ``t`` without the clock,
        if it is a compute block or a closed-form TP collective that may (see ``run_ahead``);
        returns its end, s, or None: the instruction needs the clock."""
        op = ins[0]
        mark = (q := self.quiet) and q.mark(cls, op == COMPUTE)
        if op == COMPUTE:
            t1 = self.accelerators[cls].run_at(blocks[ins[1]], t, it, ins[2], ins[3], ins[4])
        elif op == TP:
            t1 = self._tp_at(cls, index, ins[1], ins[2], t)
            if t1 is not None:
                self.tp_waited(cls, it, ins[1], t, t1)
        else:
            return None
        if t1 is not None:
            self.ahead_ops[cls] += 1
            if q is not None:
                q.add(cls, mark, index, ins, t, t1, it)
        return t1

    def _tp_at(self, cls: int, index: int, algo: str, nbytes: float, t: float) -> float | None:
        """A single-class TP collective (program ``index``) from the local time ``t`` in
        closed form (``Fabric.run_closed``), as :meth:`_collective` would run it with the
        clock; its end, s, or None when it does not qualify for the closed form (nor for
        ``optimistic``)."""
        parts, phases, closed, name = self._tp_plan(cls, algo, nbytes)
        if not closed:
            if not self._optimistic or phases is None:
                return None
            if self.optimistic is None:
                self.optimistic = OptimisticTP(self, exclusive_tp_groups(
                    self.layout, self.fabric, lambda c: self._groups("tp", c)))
            return self.optimistic.run(cls, index, parts, phases, t, name)
        self.closed_form_collectives += 1
        t1 = self.fabric.run_closed(phases, t, name, cls)
        if self.comm_energy is not None:
            self._comm_energy(parts, phases, t, self._tp_energy_kind, t1)
        return t1

    def _tp_plan(self, cls: int, algo: str, nbytes: float) -> tuple[tuple[int, ...], list | None,
                                                                      bool, str]:
        """(participating classes, phases, closed form?, fabric name) of a TP collective of
        ``cls``; phases only for a single-class one (the others rendezvous). Cached: these
        runs have no failures, so neither the phases nor the closed-form check change."""
        key = (cls, algo, nbytes)
        hit = self._tp_plans.get(key)
        if hit is None:
            gids, parts = self._groups("tp", cls)
            phases, closed = None, False
            if len(parts) == 1:
                phases = self._phases("tp", parts, gids, algo, nbytes)
                closed = self._closed("tp", parts, phases)
            hit = self._tp_plans[key] = (parts, phases, closed, f"tp_{algo}")
        return hit

    @property
    def _tp_energy_kind(self) -> str:
        """SM-share kind of a TP collective's communication energy (see :meth:`_comm_energy`)."""
        return "tp" if self.overlap.tp_comm else "tp_blocking"

    def _blocked(self, cls: int, kind: str, ev: simpy.Event):
        """Process body: the compute stream of ``cls`` waits for ``ev`` (a wait of ``kind``,
        seen by the accelerator's bubble down-clocking and by :meth:`abort`)."""
        acc = self.accelerators[cls]
        acc.wait_start(kind)
        self._waiting[cls] = kind
        yield ev
        self._waiting[cls] = None
        acc.wait_end(kind)

    # ----------------------------------------------------------------- job control
    def _start_agents(self, start: int) -> list[simpy.Process]:
        self._agents = {}
        for c in range(len(self.stats)):
            proc = self.agent_proc[c] = self._spawn(self._agent(c, self.epoch, start))
            self._agents[proc] = c
        return list(self._agents)

    def _spawn(self, gen) -> simpy.Process:
        """Start a process of the current epoch (interruptible by :meth:`abort`)."""
        proc = self.env.process(self._guarded(gen))
        self._live.add(proc)
        proc.callbacks.append(lambda _e, p=proc: self._live.discard(p))
        return proc

    @staticmethod
    def _guarded(gen):
        try:
            return (yield from gen)
        except simpy.Interrupt:
            return None  # aborted with the job

    def abort(self) -> list[simpy.Process]:
        """Stop the job now (a failure): interrupt every process of the current epoch.

        Communication in flight is withdrawn from the fabric. An agent inside a compute block
        is not interrupted: it finishes the block and leaves. Returns those agent processes
        (a restart must wait for them).
        """
        self.epoch += 1
        draining = []
        for proc in list(self._live):
            if not proc.is_alive:
                continue
            cls = self._agents.get(proc)
            if cls is not None and self._busy[cls]:
                draining.append(proc)
            else:
                proc.interrupt("job aborted")
        for cls, kind in enumerate(self._waiting):
            if kind is not None:
                self.accelerators[cls].wait_end(kind)
                self._waiting[cls] = None
        self._live.clear()
        if self.data is not None:
            self.data.abort()
        return draining

    def restart(self, start_iteration: int) -> None:
        """Run a new epoch from ``start_iteration`` (the first not in the last checkpoint)."""
        self._mail, self._got = {}, {}
        self._seq = defaultdict(int)
        self._rendezvous = {}
        self._finished = 0
        self._busy[:] = [False] * len(self._busy)
        for st in self.stats:
            del st.iteration_end[start_iteration:]
        if self.data is not None:
            self.data.restart(start_iteration)
        self._start_agents(start_iteration)

    def finish(self, makespan: float) -> None:
        """Account idle power of every agent up to the end of the run."""
        for acc in self.accelerators:
            acc.idle_until(makespan)

    # ----------------------------------------------------------------- communication
    def _stream_job(self, cls: int, it: int, prev: simpy.Event | None, kind: str, algo: str,
                    nbytes: float, tag: int, after: simpy.Event | None = None):
        """A collective on a communication stream: starts when the stream's previous job
        (``prev``) and ``after`` have finished. ``tag`` goes into the ops table's ``mb``
        column (the bucket, or the all-gather's key)."""
        if prev is not None:
            yield prev
        if after is not None:
            yield after
        t0 = self.env.now
        yield self._collective(kind, cls, algo, nbytes)
        if kind != "dp":
            self.stats[cls].shard_stream_s += self.env.now - t0
        self.recorder.op(cls, it, "comm", kind, algo, tag, -1, -1, t0, self.env.now, 0.0)

    def _p2p_plan(self, cls: int, direction: int, nbytes: float) -> tuple[list, list[int]]:
        """Phases of a pipeline send and the receiving classes (cached: the same phase objects
        every time, so the fabric caches their routes)."""
        key = ("p2p", cls, direction, nbytes)
        plan = self._phase_cache.get(key)
        if plan is None:
            lay = self.layout
            ranks, peers = lay.peer_ranks(cls, direction)
            dst = [int(c) for c in np.unique(lay.rank_class[peers])]
            for c in dst:  # classes sending to it (several: a TP group after a split stage)
                self._senders[(c, direction)] = len(np.unique(
                    lay.rank_class[lay.peer_ranks(c, -direction)[1]]))
            plan = self._phase_cache[key] = (collectives.point_to_point(
                lay.device[ranks], lay.device[peers], nbytes), dst)
        return plan

    def _deliver(self, dst_classes: list[int], tag: tuple, direction: int) -> None:
        """The message ``tag`` has arrived at ``dst_classes``; a class whose ranks receive
        from several classes gets it when the last of them has sent."""
        for dst_cls in dst_classes:
            key = (dst_cls, tag)
            n = self._senders[(dst_cls, direction)]
            if n > 1:
                got = self._got[key] = self._got.get(key, 0) + 1
                if got < n:
                    continue
                del self._got[key]
            ev = self._mail.get(key)
            if ev is None:
                ev = self._mail[key] = self.env.event()
            ev.succeed()

    def _send(self, cls: int, direction: int, tag: tuple, nbytes: float):
        phases, dst_classes = self._p2p_plan(cls, direction, nbytes)
        name = P2P_NAMES[tag[1]]
        ends = (cls, *dst_classes)  # DMA at both ends contends with compute (devices.memory)
        self._in_flight(ends, 1, "p2p")
        t0 = self.env.now
        try:
            for phase in phases:
                yield from self.fabric.run_phase(phase, name, cls)
        finally:
            self._in_flight(ends, -1, "p2p")
        self._comm_energy(ends, phases, t0, "p2p")
        self._deliver(dst_classes, tag, direction)

    def _send_chained(self, cls: int, direction: int, tag: tuple, nbytes: float) -> None:
        """:meth:`_send` without a process (runs that nothing can abort)."""
        phases, dst_classes = self._p2p_plan(cls, direction, nbytes)
        ends = (cls, *dst_classes)
        self._in_flight(ends, 1, "p2p")
        t0 = self.env.now

        def arrived(_e: object) -> None:
            self._in_flight(ends, -1, "p2p")
            self._comm_energy(ends, phases, t0, "p2p")
            self._deliver(dst_classes, tag, direction)

        self.fabric.start(phases, P2P_NAMES[tag[1]], cls).callbacks.append(arrived)

    def _groups(self, kind: str, cls: int) -> tuple[np.ndarray, tuple[int, ...]]:
        key = (kind, cls)
        hit = self._groups_cache.get(key)
        if hit is None:
            gids = self.layout.class_groups(kind, cls)
            parts = tuple(int(c) for c in self.layout.group_classes(kind, gids))
            hit = self._groups_cache[key] = (gids, parts)
        return hit

    def _collective(self, kind: str, cls: int, algo: str, nbytes: float,
                    at: float | None = None) -> simpy.Event:
        """Event that fires when the collective ``algo`` over ``kind`` groups has finished.

        ``at``: the arrival time of ``cls`` at a rendezvous (s, not before now; default now),
        for an agent running ahead of the clock: the collective starts at the latest arrival
        of its classes, with the class arriving then as its owner, as if each had rejoined
        the clock first, with one event for the group instead of one per class."""
        gids, parts = self._groups(kind, cls)
        if len(parts) == 1:
            if self.chained and kind == "tp":  # nothing can abort it: no process needed
                _parts, phases, closed, _name = self._tp_plan(cls, algo, nbytes)
                return self._start_tp(parts, phases, closed, algo, cls)
            return self._spawn(self._run_collective(kind, parts, gids, algo, nbytes, cls))
        seq_key = (cls, kind)
        seq = self._seq[seq_key]
        self._seq[seq_key] = seq + 1
        key = (kind, parts, seq)
        entry = self._rendezvous.get(key)
        if entry is None:  # arrivals, done, latest arrival time, its class
            entry = self._rendezvous[key] = [0, self.env.event(), -math.inf, cls]
        entry[0] += 1
        t = self.env.now if at is None else at
        if t >= entry[2]:
            entry[2], entry[3] = t, cls
        if entry[0] == len(parts):
            del self._rendezvous[key]
            done = entry[1]
            if self.chained and kind == "tp":  # nothing can abort it: no process needed
                self._chain_collective(parts, gids, algo, nbytes, entry[3], entry[2], done)
            else:
                proc = self._spawn(self._run_collective(kind, parts, gids, algo, nbytes,
                                                        entry[3], entry[2]))
                proc.callbacks.append(lambda _e: done.succeed())
        return entry[1]

    def _chain_collective(self, parts: tuple[int, ...], gids: np.ndarray, algo: str,
                          nbytes: float, owner: int, start: float, done: simpy.Event) -> None:
        """:meth:`_run_collective` of a TP collective of several classes without a process
        (chained runs: no failure can abort it): :meth:`_start_tp` from ``start`` (s; a
        timeout first when the last arrival ran ahead of the clock), ``done`` succeeding at
        its end. The same transfers at the same times as the process, two to three events
        fewer per collective."""
        if start > self.env.now:
            self.env.timeout_at(start).callbacks.append(lambda _e: self._chain_collective(
                parts, gids, algo, nbytes, owner, start, done))
            return
        phases = self._phases("tp", parts, gids, algo, nbytes)
        self._start_tp(parts, phases, self._closed("tp", parts, phases), algo, owner, done)

    def _start_tp(self, parts: tuple[int, ...], phases: list, closed: bool, algo: str,
                  owner: int, done: simpy.Event | None = None) -> simpy.Event:
        """Start a TP collective's ``phases`` now, without a process: in closed form
        (``closed``) or as chained fabric transfers, its energy booked before anything
        waiting on it resumes. Returns the event that fires at its end (``done`` if given)."""
        name = f"tp_{algo}"
        if self.comm_energy is None and not closed:
            return self.fabric.start(phases, name, owner, done=done)
        split = None if closed else self.comm_energy.split_of(phases)
        if split is None:
            ev = self._tp_piece(parts, phases, name, owner, closed)
        else:  # each TP group's kernel ends with its own group's transfers
            ev = self.env.all_of([self._tp_piece(parts, p, name, owner, False)
                                  for p in split])
        if done is None:
            return ev
        ev.callbacks.append(lambda _e: done.succeed())
        return done

    def _tp_piece(self, parts: tuple[int, ...], phases: list, name: str, owner: int,
                  closed: bool) -> simpy.Event:
        """Start ``phases`` (in closed form if ``closed``): a whole TP collective, or one TP
        group's share of a class's (``CommEnergy.per_group``), booked when it ends."""
        t0 = self.env.now
        if closed:
            self.closed_form_collectives += 1
            ev = self.fabric.start_closed(phases, name, owner)
        else:
            ev = self.fabric.start(phases, name, owner)
        if self.comm_energy is not None:
            ev.callbacks.append(lambda _e: self._comm_energy(parts, phases, t0,
                                                             self._tp_energy_kind))
        return ev

    def _phases(self, kind: str, parts: tuple[int, ...], gids: np.ndarray, algo: str,
                nbytes: float) -> list:
        """The fabric phases of a collective (cached: the same objects every time)."""
        algorithm = self.layout.algorithm(kind)  # ring, bidir_ring, torus2d, ... or auto
        key = (kind, parts, algo, algorithm, nbytes)
        phases = self._phase_cache.get(key)
        if phases is None:
            if len(parts) > 1:  # every participating class touches the same groups
                gids = np.unique(np.concatenate([self.layout.class_groups(kind, c)
                                                 for c in parts]))
            groups = np.stack([self.layout.group_devices(kind, int(g)) for g in gids])
            phases = collectives.collective_phases(algo, algorithm, groups, nbytes,
                                                   self.layout.topo)
            if self.layout.protocols == "nccl":
                phases = nccl.tune_phases(algo, phases, nbytes, groups.shape[1], self.fabric)
            if kind == "tp":  # (devices.phase.lockstep_ok: why not the other kinds)
                split = (self.comm_energy.per_group(phases, groups)
                         if self.comm_energy and self.fabric.quotient is None else None)
                for p in (phases, *(split or ())):
                    self.fabric.allow_lockstep(p)
                    self._allow_fluid(parts, p)
            self._phase_cache[key] = phases
        return phases

    def _run_collective(self, kind: str, parts: tuple[int, ...], gids: np.ndarray, algo: str,
                        nbytes: float, owner: int, start: float | None = None):
        if start is not None and start > self.env.now:  # the last arrival ran ahead
            yield self.env.timeout_at(start)
        phases = self._phases(kind, parts, gids, algo, nbytes)
        ends = () if kind == "tp" else parts  # TP collectives block the compute stream
        self._in_flight(ends, 1, kind)
        name, ekind = f"{kind}_{algo}", self._tp_energy_kind if kind == "tp" else kind
        closed = self._closed(kind, parts, phases)
        split = self.comm_energy.split_of(phases) if self.comm_energy and not closed else None
        try:
            if closed:
                self.closed_form_collectives += 1
                t0 = self.env.now
                yield self.fabric.start_closed(phases, name, owner)
                self._comm_energy(parts, phases, t0, ekind)
            elif split is not None:  # each group's kernel ends with its own transfers
                yield self.env.all_of([self._spawn(self._run_piece(
                    parts, p, name, owner, ekind)) for p in split])
            else:
                yield from self._run_piece(parts, phases, name, owner, ekind)
        finally:
            self._in_flight(ends, -1, kind)

    def _run_piece(self, parts: tuple[int, ...], phases: list, name: str, owner: int,
                   ekind: str):
        """Process body: ``phases`` one after the other (a whole collective, or one TP
        group's share of a class's), booked when they end."""
        t0 = self.env.now
        for phase in phases:
            yield from self.fabric.run_phase(phase, name, owner)
        self._comm_energy(parts, phases, t0, ekind)

    def _closed(self, kind: str, parts: tuple[int, ...], phases: list) -> bool:
        """Whether this collective is costed in closed form: a TP collective of a group
        whose links nothing else uses (:meth:`tp_closed_form_groups`), every phase of which
        has a closed form (``Fabric.closed_form``)."""
        if not self.closed_form or kind != "tp" or not phases:
            return False
        if self._closed_groups is None:
            self._closed_groups = self.tp_closed_form_groups()
        return parts in self._closed_groups and all(
            self.fabric.closed_form(ph) is not None for ph in phases)

    def _allow_fluid(self, parts: tuple[int, ...], phases: list) -> None:
        """Let a TP collective whose links nothing else uses, its HBM ports aside, run as a
        fluid job at its ports' caps (``devices.fluid``; chained runs, real network)."""
        fab = self.fabric
        if self._fluid is None:
            ok = self.closed_form and fab.ports and not self._optimistic
            self._fluid = self.tp_closed_form_groups(ports=False) if ok else set()
            fab.fluid = FluidRings(fab) if self._fluid else None
        if parts in self._fluid:
            fab.fluid.allow(phases)

    def tp_closed_form_groups(self, ports: bool = True) -> set[tuple[int, ...]]:
        """The TP collectives (by participating classes) whose links no other traffic can use
        (``tp_isolation.isolated_tp_groups``; ``ports=False``: HBM ports aside); none unless
        ``chained`` (nothing aborts the run or cuts links). Not asked in exact mode."""
        if not self.chained:
            return set()
        return isolated_tp_groups(self.layout, self.fabric, lambda c: self._groups("tp", c),
                                  blocking=not (ports and self.overlap.tp_comm))

    def _comm_energy(self, classes, phases: list, t0: float, kind: str,
                     t1: float | None = None) -> None:
        """``CommEnergy.charge`` of a collective or send that ran from ``t0`` to ``t1``
        (default now), s, if communication draws device energy."""
        if self.comm_energy is not None:
            self.comm_energy.charge(classes, phases, t0, self.env.now if t1 is None else t1,
                                    kind)

    def _in_flight(self, classes, delta: int, kind: str = "dp") -> None:
        """Start (``delta`` > 0) or end a communication stream of ``kind`` on the device
        agent of each class (``devices.interference``: its DMA contends with the class's
        compute kernels at HBM); nothing without device agents."""
        streams = self.streams
        if streams is None:
            return
        for c in classes:
            if delta > 0:
                streams[c].start(kind)
            else:
                streams[c].end(kind)

    # ----------------------------------------------------------------- TP overlap
    def _tp_overlapped(self, cls: int, it: int, ins: tuple, blocks: dict[str, Block],
                       epoch: int):
        """Process body of a fused TP instruction (``workloads.overlap``): the block in
        ``tp_chunks`` chunks pipelined with its collectives' chunks on the TP stream."""
        _op, name, mb, chunk, layer, before, after = ins
        acc = self.accelerators[cls]
        n = self.overlap.tp_chunks
        stage = int(self.layout.class_stage[cls])
        part = self._chunks.get((stage, name))
        if part is None:
            part = self._chunks[(stage, name)] = chunk_block(blocks[name], n)
        fifo = self._tp_fifo(cls)
        gathers = ([fifo.submit(self._tp_chunk, cls, it, before[0], before[1] / n, i)
                    for i in range(n)] if before else [])
        reduces: list[simpy.Event] = []
        for i in range(n):
            if gathers:
                yield from self._tp_wait(cls, it, gathers[i], before[0])
                if self.epoch != epoch:
                    return
            if self.before_block is not None:
                self.before_block(cls)
            self._busy[cls] = True
            yield from acc.compute(part, it, mb, chunk, layer)
            self._busy[cls] = False
            if self.epoch != epoch:
                return
            if after:
                reduces.append(fifo.submit(self._tp_chunk, cls, it, after[0], after[1] / n, i))
        if reduces:
            yield from self._tp_wait(cls, it, reduces[-1], after[0])

    def _tp_wait(self, cls: int, it: int, ev: simpy.Event, algo: str):
        """The compute stream waits for a TP chunk (exposed TP communication)."""
        if ev.triggered:
            return
        t0 = self.env.now
        yield from self._blocked(cls, "tp", ev)
        self.tp_waited(cls, it, algo, t0, self.env.now)

    def tp_waited(self, cls: int, it: int, algo: str, t0: float, t1: float) -> None:
        """Book a TP wait of ``cls``'s compute stream (``algo``) from ``t0`` to ``t1``, s."""
        self.stats[cls].tp_s += t1 - t0
        self.recorder.op(cls, it, "compute", "tp", algo, -1, -1, -1, t0, t1, 0.0)

    def _tp_fifo(self, cls: int) -> Fifo:
        key = (self.epoch, cls)
        f = self._fifos.get(key)
        if f is None:
            epoch = self.epoch
            f = self._fifos[key] = Fifo(self.env, lambda: self.epoch == epoch)
        return f

    def _tp_chunk(self, cls: int, it: int, algo: str, nbytes: float, i: int) -> simpy.Event:
        """Start one TP collective chunk now (a stream on the class's devices)."""
        t0 = self.env.now
        self._in_flight((cls,), 1, "tp")
        ev = self._collective("tp", cls, algo, nbytes)

        def finished(_e: object) -> None:
            self._in_flight((cls,), -1, "tp")
            self.recorder.op(cls, it, "comm", "tp", algo, i, -1, -1, t0, self.env.now, 0.0)

        ev.callbacks.append(finished)
        return ev
