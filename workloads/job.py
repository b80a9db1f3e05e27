"""Job control: synchronous checkpoints, job failure, restart from the last checkpoint.

The job's timeline is cut into *segments*. A segment starts at the job start, at a checkpoint
commit or when a restart completes, and ends at the next commit or failure.

* **Checkpoint** (Megatron-style, synchronous): after iteration ``i`` with
  ``(i + 1) % interval_iterations == 0`` every rank class waits at a barrier; when all have
  arrived the job writes for ``write_s`` seconds (devices idle), then the checkpoint commits:
  iterations ``0..i`` are safe. Checkpoints cost time in every run, failures or not.
* **Failure** (:meth:`JobController.fail`, e.g. an accelerator dies): the job is aborted at
  once. The work since the segment start is lost (``now - segment_start`` seconds, including a
  checkpoint being written, which never commits). The job is down for ``restart_s`` (the
  failed part is swapped for a spare, the job relaunched and the checkpoint loaded), and
  also until every aborted agent has left the compute block it was in (blocks are never cut
  in two). Then it resumes at the iteration after the last committed checkpoint.
* A failure while the job is down restarts the restart clock; it loses no work.

So the makespan is exactly ``useful + checkpoint_s + lost_work_s + downtime_s`` where
``useful`` is the time of the iterations that were kept. With failures of rate ``lambda``
(Poisson) striking a job whose segments all last ``tau`` (``interval`` iterations plus the
write), the lost work per failure is ``X mod tau`` for ``X ~ Exp(lambda)``, with mean
``1/lambda - tau / (exp(lambda tau) - 1)`` (renewal theory; the tests check the twin
against it).

This module knows nothing of fault kinds: the fault injectors call :meth:`fail`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy
from pydantic import Field

from twin.kernel.schema import NonNegativeFloat, StrictModel


@dataclass(frozen=True)
class CheckpointPolicy:
    """How the job protects its work.

    Attributes:
        interval_iterations: checkpoint after every this many iterations (``None``: never;
            a failure then restarts the job from iteration 0).
        write_s: time to write one checkpoint, s (the job is stalled meanwhile).
        restart_s: time from a failure until the job runs again (detection, replacement,
            relaunch, checkpoint load), s.
    """

    interval_iterations: int | None
    write_s: float
    restart_s: float


class JobSpec(StrictModel):
    """The scenario's ``job`` section: how the job protects its work against failures."""

    checkpoint_interval_iterations: int | None = Field(
        default=None, ge=1, description="checkpoint after every N iterations (none: never; a "
                                        "failure then restarts from iteration 0)")
    checkpoint_write_s: NonNegativeFloat = Field(
        default=0.0, description="time to write one checkpoint, s (the job stalls)")
    restart_s: NonNegativeFloat = Field(
        default=0.0, description="from a failure to the job running again (detection, "
                                 "replacement, relaunch, checkpoint load), s")

    def policy(self) -> CheckpointPolicy:
        """As a :class:`CheckpointPolicy`."""
        return CheckpointPolicy(self.checkpoint_interval_iterations, self.checkpoint_write_s,
                                self.restart_s)


@dataclass(frozen=True)
class Failure:
    """One failure that reached the job.

    Attributes:
        time_s: when it happened, s.
        target: what failed (e.g. ``device 3``).
        while_down: the job was restarting already (no work lost; the work a failure
            throws away is its window in :attr:`JobLog.lost_windows`).
    """

    time_s: float
    target: str
    while_down: bool


@dataclass
class JobLog:
    """What happened to the job (times in s)."""

    checkpoints: list[tuple[float, float, int, bool]] = field(default_factory=list)
    """(write start, write end, iteration, committed) of every checkpoint write."""
    failures: list[Failure] = field(default_factory=list)
    downtimes: list[tuple[float, float]] = field(default_factory=list)
    """(abort, resume) of every restart."""
    lost_windows: list[tuple[float, float]] = field(default_factory=list)
    """(segment start, failure) of every failure of the running job."""
    lost_network_j: float = 0.0
    """Dynamic link energy spent inside the lost windows, J."""


class JobController:
    """Checkpoint barrier, failure and restart of one job.

    Args:
        env: SimPy environment.
        policy: checkpoint / restart parameters.
        iterations: iterations the job must complete.
        network_energy: optional probe returning the cumulative dynamic link energy (J) so
            far; used to charge the network energy of lost work.
    """

    def __init__(self, env: simpy.Environment, policy: CheckpointPolicy, iterations: int,
                 network_energy: Callable[[], float] | None = None):
        self.env = env
        self.policy = policy
        self.iterations = iterations
        self.network_energy = network_energy
        self.log = JobLog()
        self.committed = 0          # iterations safe in the last committed checkpoint
        self.segment_start = 0.0
        self.up = True
        self.executor = None
        self._net0 = 0.0
        self._barriers: dict[int, list] = {}
        self._writer: simpy.Process | None = None
        self._token = 0
        self._down_since = 0.0
        self._draining: list[simpy.Process] = []

    def attach(self, executor) -> None:
        """Bind the executor whose agents this controller stops and restarts."""
        self.executor = executor

    # ----------------------------------------------------------------- checkpoints
    def due(self, iteration: int) -> bool:
        """Whether a checkpoint follows ``iteration`` (0-based)."""
        k = self.policy.interval_iterations
        return k is not None and (iteration + 1) % k == 0

    def checkpoint(self, iteration: int) -> simpy.Event:
        """Event of the checkpoint after ``iteration``; fires when it has committed.

        Every rank class calls this once; the write starts when the last one arrives.
        """
        entry = self._barriers.get(iteration)
        if entry is None:
            entry = self._barriers[iteration] = [0, self.env.event()]
        entry[0] += 1
        if entry[0] == len(self.executor.accelerators):
            del self._barriers[iteration]
            self._writer = self.env.process(self._write(iteration, entry[1]))
        return entry[1]

    def _write(self, iteration: int, done: simpy.Event):
        t0 = self.env.now
        try:
            yield self.env.timeout(self.policy.write_s)
        except simpy.Interrupt:
            self.log.checkpoints.append((t0, self.env.now, iteration, False))
            return
        self._writer = None
        self.log.checkpoints.append((t0, self.env.now, iteration, True))
        self.committed = iteration + 1
        self._new_segment()
        done.succeed(t0)

    def _new_segment(self) -> None:
        self.segment_start = self.env.now
        if self.network_energy is not None:
            self._net0 = self.network_energy()

    # ----------------------------------------------------------------- failures
    @property
    def finished(self) -> bool:
        """The job has completed every iteration."""
        return self.executor is not None and self.executor.done.triggered

    def fail(self, target: str) -> bool:
        """A failure that stops the job now (see the module docstring).

        Returns False when the job had already finished (nothing happens).
        """
        if self.finished:
            return False
        now = self.env.now
        if not self.up:
            self.log.failures.append(Failure(now, target, True))
            self._arm_restart()
            return True
        self.log.failures.append(Failure(now, target, False))
        self.log.lost_windows.append((self.segment_start, now))
        if self.network_energy is not None:
            self.log.lost_network_j += self.network_energy() - self._net0
        if self._writer is not None and self._writer.is_alive:
            self._writer.interrupt("job failure")
        self._writer = None
        self._barriers.clear()
        self.up = False
        self._down_since = now
        self._draining = self.executor.abort()
        self._arm_restart()
        return True

    def _arm_restart(self) -> None:
        self._token += 1
        self.env.process(self._restart(self._token))

    def _restart(self, token: int):
        yield self.env.timeout(self.policy.restart_s)
        if token != self._token:
            return  # another failure restarted the clock
        alive = [p for p in self._draining if p.is_alive]
        if alive:
            yield self.env.all_of(alive)
            if token != self._token:
                return
        self._draining = []
        self.up = True
        self.log.downtimes.append((self._down_since, self.env.now))
        self._new_segment()
        self.executor.restart(self.committed)

    # ----------------------------------------------------------------- results
    @property
    def restarts(self) -> int:
        """Restarts completed."""
        return len(self.log.downtimes)


def window_overlap(segments, windows: list[tuple[float, float]]) -> float:
    """Integral of piecewise-constant power over the union of disjoint ``windows``, J.

    Args:
        segments: ``(t0, t1, watts)`` rows (array or list).
        windows: ``(a, b)`` intervals, s.
    """
    import numpy as np  # here: the scenario schema imports this module without NumPy

    seg = np.asarray(segments, dtype=float).reshape(-1, 3)
    if not len(seg) or not windows:
        return 0.0
    total = 0.0
    for a, b in windows:
        span = np.minimum(seg[:, 1], b) - np.maximum(seg[:, 0], a)
        total += float(np.sum(np.clip(span, 0.0, None) * seg[:, 2]))
    return total


def job_metrics(job: JobController | None, accelerators, fabric, makespan: float,
                iterations: int, tokens_per_iteration: float) -> dict:
    """Summary keys of fault tolerance (s, J, fractions).

    ``availability`` = 1 - downtime / makespan; ``goodput`` = fraction of the makespan spent
    on iterations that were kept (makespan - checkpoint writes - lost work - downtime);
    ``lost_work_j`` / ``downtime_j`` integrate device power (from the agents' power segments)
    plus link idle power over those windows, and the dynamic link energy of the lost work.
    """
    if job is None:
        out = {"restarts": 0, "failures": 0, "interruptions": 0, "checkpoints": 0,
               "checkpoint_time_s": 0.0,
               "lost_work_s": 0.0, "lost_work_j": 0.0, "downtime_s": 0.0, "downtime_j": 0.0,
               "availability": 1.0, "goodput": 1.0}
    else:
        log = job.log
        ck = sum(t1 - t0 for t0, t1, _i, ok in log.checkpoints if ok)
        lost = sum(b - a for a, b in log.lost_windows)
        down = sum(b - a for a, b in log.downtimes)
        link_idle_w = float(fabric.idle_w.sum())

        def energy(windows):
            if not windows:
                return 0.0
            dev = sum(a.n * window_overlap(a.stats.segments, windows) for a in accelerators)
            return dev + link_idle_w * sum(b - a for a, b in windows)

        out = {
            "restarts": job.restarts,
            "failures": len(log.failures),
            "interruptions": sum(1 for f in log.failures if not f.while_down),
            "checkpoints": sum(1 for c in log.checkpoints if c[3]),
            "checkpoint_time_s": ck,
            "lost_work_s": lost,
            "lost_work_j": energy(log.lost_windows) + log.lost_network_j,
            "downtime_s": down,
            "downtime_j": energy(log.downtimes),
            "availability": 1.0 - down / makespan if makespan > 0 else 1.0,
            "goodput": (makespan - ck - lost - down) / makespan if makespan > 0 else 1.0,
        }
    out["goodput_tokens_per_s"] = (iterations * tokens_per_iteration / makespan
                                   if makespan > 0 else 0.0)
    return out
