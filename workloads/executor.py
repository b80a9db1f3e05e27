"""SimPy agents that execute per-stage programs on the fabric.

One :class:`ClassAgent` process per rank class interprets its stage's program on the compute
stream; gradient all-reduces run on a per-class communication stream (FIFO, overlapping the
backward pass); pipeline sends run as their own processes and fill the receiver's mailbox.
Collectives rendezvous: a collective starts when every class holding a member of the
participating groups has reached it, then runs the algorithm's phases on the fabric for all
those groups at once.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from devices.accelerator import BlockCost
from devices.fabric import Fabric, Phase
from workloads import collectives
from workloads.parallel import Layout
from workloads.schedules import COMPUTE, DP_START, DP_WAIT, RECV, SEND, TP


@dataclass
class ClassStats:
    """Per-device time and energy of one rank class (every member has the same values)."""

    compute_s: float = 0.0
    tp_s: float = 0.0
    recv_s: float = 0.0
    dp_wait_s: float = 0.0
    comm_stream_s: float = 0.0
    gemm_flops: float = 0.0
    compute_j: float = 0.0
    memory_j: float = 0.0
    static_j: float = 0.0
    idle_j: float = 0.0
    iteration_end: list[float] = field(default_factory=list)
    last_t: float = 0.0
    segments: list[tuple[float, float, float]] = field(default_factory=list)


class Recorder:
    """Trace sink interface; the run wires a trace-writing implementation in."""

    def op(self, cls: int, iteration: int, stream: str, kind: str, name: str, mb: int,
           chunk: int, layer: int, t0: float, t1: float, flops: float) -> None:
        """One executed operation."""

    def power(self, cls: int, t0: float, t1: float, watts: float, state: str) -> None:
        """A segment of constant per-device power of a class."""


class Executor:
    """Wires programs, costs, layout and fabric into running SimPy processes.

    Args:
        env: SimPy environment.
        layout: ranks, devices, groups and classes.
        fabric: executes communication phases.
        programs: instructions of one iteration per pipeline stage.
        costs: ``costs[stage][block name]`` -> :class:`BlockCost`.
        idle_w: per-device power when idle, W.
        iterations: iterations to run.
        jitter_cov: coefficient of variation of compute durations (lognormal, mean 1).
        rng_for: ``rng_for(cls)`` -> ``numpy.random.Generator`` of a class.
        recorder: trace sink.
    """

    def __init__(self, env: simpy.Environment, layout: Layout, fabric: Fabric,
                 programs: dict[int, list[tuple]], costs: dict[int, dict[str, BlockCost]],
                 idle_w: float, iterations: int, jitter_cov: float,
                 rng_for: Callable[[int], np.random.Generator], recorder: Recorder):
        self.env = env
        self.layout = layout
        self.fabric = fabric
        self.programs = programs
        self.costs = costs
        self.idle_w = idle_w
        self.iterations = iterations
        self.recorder = recorder
        self.jitter_sigma = math.sqrt(math.log1p(jitter_cov ** 2)) if jitter_cov > 0 else 0.0
        self.rng_for = rng_for
        n = len(layout.classes)
        self.stats = [ClassStats() for _ in range(n)]
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
        stage = int(self.layout.class_stage[cls])
        prog = self.programs[stage]
        costs = self.costs[stage]
        rec = self.recorder
        rng = self.rng_for(cls) if self.jitter_sigma > 0 else None
        for it in range(self.iterations):
            dp_tail: simpy.Event | None = None
            for ins in prog:
                op = ins[0]
                t0 = env.now
                if op == COMPUTE:
                    name = ins[1]
                    c = costs[name]
                    dur = c.duration_s
                    if rng is not None:
                        s = self.jitter_sigma
                        dur *= float(rng.lognormal(-0.5 * s * s, s))
                    self._idle_until(cls, t0)
                    yield env.timeout(dur)
                    static = c.static_j * dur / c.duration_s if c.duration_s else 0.0
                    st.compute_s += dur
                    st.gemm_flops += c.gemm_flops
                    st.compute_j += c.compute_j
                    st.memory_j += c.memory_j
                    st.static_j += static
                    st.last_t = env.now
                    watts = (c.compute_j + c.memory_j + static) / dur if dur > 0 else 0.0
                    self._segment(cls, t0, env.now, watts, name)
                    rec.op(cls, it, "compute", "compute", name, ins[2], ins[3], ins[4], t0,
                           env.now, c.gemm_flops)
                elif op == TP:
                    yield self._collective("tp", cls, ins[1], ins[2])
                    st.tp_s += env.now - t0
                    rec.op(cls, it, "compute", "tp", ins[1], -1, -1, -1, t0, env.now, 0.0)
                elif op == SEND:
                    env.process(self._send(cls, ins[1], (it, *ins[2]), ins[3]))
                elif op == RECV:
                    key = (cls, (it, *ins[2]))
                    ev = self._mail.get(key)
                    if ev is None:
                        ev = self._mail[key] = env.event()
                    yield ev
                    del self._mail[key]
                    st.recv_s += env.now - t0
                    if env.now > t0:
                        rec.op(cls, it, "compute", "recv", ins[2][0], ins[2][1], ins[2][2], -1,
                               t0, env.now, 0.0)
                elif op == DP_START:
                    dp_tail = env.process(self._dp_job(cls, it, dp_tail, ins[1], ins[2]))
                elif op == DP_WAIT:
                    if dp_tail is not None:
                        yield dp_tail
                    st.dp_wait_s += env.now - t0
                    if env.now > t0:
                        rec.op(cls, it, "compute", "dp_wait", "dp_wait", -1, -1, -1, t0, env.now,
                               0.0)
            st.iteration_end.append(env.now)
        self._idle_until(cls, env.now)

    def _idle_until(self, cls: int, t: float) -> None:
        st = self.stats[cls]
        if t > st.last_t:
            st.idle_j += (t - st.last_t) * self.idle_w
            self._segment(cls, st.last_t, t, self.idle_w, "idle")
            st.last_t = t

    def _segment(self, cls: int, t0: float, t1: float, watts: float, state: str) -> None:
        self.stats[cls].segments.append((t0, t1, watts))
        self.recorder.power(cls, t0, t1, watts, state)

    def peak_power_w(self, sizes: np.ndarray) -> float:
        """Peak of the summed device power over the run, W (exact, from the segments)."""
        times, deltas = [], []
        for st, n in zip(self.stats, sizes, strict=True):
            if not st.segments:
                continue
            seg = np.asarray(st.segments)
            times += [seg[:, 0], seg[:, 1]]
            deltas += [seg[:, 2] * n, -seg[:, 2] * n]
        if not times:
            return 0.0
        t = np.concatenate(times)
        d = np.concatenate(deltas)
        order = np.lexsort((d, t))  # at equal times apply decreases first
        return float(np.cumsum(d[order]).max())

    def finish(self, makespan: float) -> None:
        """Account idle power of every class up to the end of the run."""
        for c in range(len(self.stats)):
            self._idle_until(c, makespan)

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
