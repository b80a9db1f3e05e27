"""SimPy agents that execute per-stage programs on the fabric.

One process per rank class interprets its stage's program on the compute stream, running
compute blocks on the class's :class:`~devices.accelerator.Accelerator` agent; gradient
all-reduces run on a per-class communication stream (FIFO, overlapping the backward pass);
pipeline sends run as their own processes and fill the receiver's mailbox.
Collectives rendezvous: a collective starts when every class holding a member of the
participating groups has reached it, then runs the algorithm's phases on the fabric for all
those groups at once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import simpy

from devices.accelerator import Accelerator
from devices.fabric import Fabric, Phase
from twin.records import Recorder
from workloads import collectives
from workloads.parallel import Layout
from workloads.schedules import COMPUTE, DP_START, DP_WAIT, RECV, SEND, TP
from workloads.transformer import Block


@dataclass
class CommStats:
    """Per-device seconds a rank class's compute stream spent blocked, by cause."""

    tp_s: float = 0.0
    recv_s: float = 0.0
    dp_wait_s: float = 0.0
    comm_stream_s: float = 0.0
    iteration_end: list[float] = field(default_factory=list)


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
    """

    def __init__(self, env: simpy.Environment, layout: Layout, fabric: Fabric,
                 programs: dict[int, list[tuple]], blocks: dict[int, dict[str, Block]],
                 accelerators: list[Accelerator], iterations: int, recorder: Recorder):
        self.env = env
        self.layout = layout
        self.fabric = fabric
        self.programs = programs
        self.blocks = blocks
        self.accelerators = accelerators
        self.iterations = iterations
        self.recorder = recorder
        n = len(layout.classes)
        self.stats = [CommStats() for _ in range(n)]
        self._mail: dict[tuple, simpy.Event] = {}
        self._seq: dict[tuple[int, str], int] = defaultdict(int)
        self._rendezvous: dict[tuple, list] = {}
        self._phase_cache: dict[tuple, list[Phase]] = {}
        self._groups_cache: dict[tuple[str, int], tuple[np.ndarray, tuple[int, ...]]] = {}
        self.procs = [env.process(self._agent(c)) for c in range(n)]

    # ----------------------------------------------------------------- agent
    def _agent(self, cls: int):
        env = self.env
        st = self.stats[cls]
        acc = self.accelerators[cls]
        stage = int(self.layout.class_stage[cls])
        prog = self.programs[stage]
        blocks = self.blocks[stage]
        rec = self.recorder
        for it in range(self.iterations):
            dp_tail: simpy.Event | None = None
            for ins in prog:
                op = ins[0]
                if op == COMPUTE:
                    yield from acc.compute(blocks[ins[1]], it, ins[2], ins[3], ins[4])
                    continue
                t0 = env.now
                if op == TP:
                    acc.wait_start("tp")
                    yield self._collective("tp", cls, ins[1], ins[2])
                    acc.wait_end("tp")
                    st.tp_s += env.now - t0
                    rec.op(cls, it, "compute", "tp", ins[1], -1, -1, -1, t0, env.now, 0.0)
                elif op == SEND:
                    env.process(self._send(cls, ins[1], (it, *ins[2]), ins[3]))
                elif op == RECV:
                    key = (cls, (it, *ins[2]))
                    ev = self._mail.get(key)
                    if ev is None:
                        ev = self._mail[key] = env.event()
                    if not ev.triggered:
                        acc.wait_start("recv")
                        yield ev
                        acc.wait_end("recv")
                    del self._mail[key]
                    if env.now > t0:
                        st.recv_s += env.now - t0
                        rec.op(cls, it, "compute", "recv", ins[2][0], ins[2][1], ins[2][2], -1,
                               t0, env.now, 0.0)
                elif op == DP_START:
                    dp_tail = env.process(self._dp_job(cls, it, dp_tail, ins[1], ins[2]))
                elif op == DP_WAIT:
                    if dp_tail is not None and not dp_tail.triggered:
                        acc.wait_start("dp_wait")
                        yield dp_tail
                        acc.wait_end("dp_wait")
                    if env.now > t0:
                        st.dp_wait_s += env.now - t0
                        rec.op(cls, it, "compute", "dp_wait", "dp_wait", -1, -1, -1, t0, env.now,
                               0.0)
            st.iteration_end.append(env.now)

    def finish(self, makespan: float) -> None:
        """Account idle power of every agent up to the end of the run."""
        for acc in self.accelerators:
            acc.idle_until(makespan)

    # ----------------------------------------------------------------- communication
    def _dp_job(self, cls: int, it: int, prev: simpy.Event | None, bucket: int, nbytes: float):
        if prev is not None:
            yield prev
        t0 = self.env.now
        yield self._collective("dp", cls, "allreduce", nbytes)
        self.stats[cls].comm_stream_s += self.env.now - t0
        self.recorder.op(cls, it, "comm", "dp", "allreduce", bucket, -1, -1, t0, self.env.now,
                         0.0)

    def _send(self, cls: int, direction: int, tag: tuple, nbytes: float):
        ranks, peers = self.layout.peer_ranks(cls, direction)
        dev = self.layout.device
        name = "p2p_fwd" if tag[1] == "F" else "p2p_bwd"
        for phase in collectives.point_to_point(dev[ranks], dev[peers], nbytes):
            yield from self.fabric.run_phase(phase, name, cls)
        for dst_cls in np.unique(self.layout.rank_class[peers]):
            key = (int(dst_cls), tag)
            ev = self._mail.get(key)
            if ev is None:
                ev = self._mail[key] = self.env.event()
            ev.succeed()

    def _groups(self, kind: str, cls: int) -> tuple[np.ndarray, tuple[int, ...]]:
        key = (kind, cls)
        hit = self._groups_cache.get(key)
        if hit is None:
            gids = self.layout.class_groups(kind, cls)
            parts = tuple(int(c) for c in self.layout.group_classes(kind, gids))
            hit = self._groups_cache[key] = (gids, parts)
        return hit

    def _collective(self, kind: str, cls: int, algo: str, nbytes: float) -> simpy.Event:
        """Event that fires when the collective ``algo`` over ``kind`` groups has finished."""
        gids, parts = self._groups(kind, cls)
        if len(parts) == 1:
            return self.env.process(self._run_collective(kind, parts, gids, algo, nbytes, cls))
        seq_key = (cls, kind)
        seq = self._seq[seq_key]
        self._seq[seq_key] = seq + 1
        key = (kind, parts, seq)
        entry = self._rendezvous.get(key)
        if entry is None:
            entry = self._rendezvous[key] = [0, self.env.event()]
        entry[0] += 1
        if entry[0] == len(parts):
            del self._rendezvous[key]
            done = entry[1]
            proc = self.env.process(self._run_collective(kind, parts, gids, algo, nbytes, cls))
            proc.callbacks.append(lambda _e: done.succeed())
        return entry[1]

    def _run_collective(self, kind: str, parts: tuple[int, ...], gids: np.ndarray, algo: str,
                        nbytes: float, owner: int):
        key = (kind, parts, algo, nbytes)
        phases = self._phase_cache.get(key)
        if phases is None:
            if len(parts) > 1:  # every participating class touches the same groups
                gids = np.unique(np.concatenate([self.layout.class_groups(kind, c)
                                                 for c in parts]))
            groups = np.stack([self.layout.group_devices(kind, int(g)) for g in gids])
            phases = collectives.ALGORITHMS[algo](groups, nbytes)
            self._phase_cache[key] = phases
        for phase in phases:
            yield from self.fabric.run_phase(phase, f"{kind}_{algo}", owner)
