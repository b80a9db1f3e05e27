"""Compute blocks run ahead of the clock beside device agents, taken back when a stream
starts (issue 12: what the contention model costs).

With device agents (``devices.interference.DeviceStreams``: an HBM controller model, SMs
that collectives take) a block's cost depends on the streams running beside it, so agents
ran every block on the clock (``Executor``'s ``run_ahead`` was off): a GPT-3 175B
iteration on 64 devices took 15x the events of the roofline run, although nearly all of its
blocks run with nothing beside them, where the price is the roofline's and draws nothing.

Here an agent runs ahead (as without device agents) the compute blocks that start while its
device agent is :attr:`~devices.interference.DeviceStreams.quiet` (priced alone:
``Accelerator.run_at``) and its closed-form TP collectives (blocking TP collectives start
no stream). The device agent tells :meth:`QuietRunAhead.changed` before any stream starts
or ends on it; if the class's agent has run ahead past now (``s``), its run is taken back
to ``s``:

* what ended by ``s`` stands; what starts at ``s`` is taken back and starts with the clock
  after the change (the order of two events of one instant, which a step-by-step run may
  take the other way round: its block then starts alone and is re-priced at once, at the
  same times, with a piece of fraction 0 in the device agent's records);
* a TP collective in flight at ``s`` stands (its links are its own and no block runs beside
  it); the agent goes on with the clock at the next instruction when it ends;
* a compute block in flight at ``s`` is taken back and goes on with the clock from where it
  started, at the price it started with (``Accelerator.resume``): at ``s`` it is the
  running block of the device agent, so the stream changing at ``s`` re-prices its
  remaining work and caps the HBM ports exactly as on the clock;
* the rest is taken back: the agent's state (``Accelerator.checkpoint``, the device
  agent's accounting), its TP time and run-ahead count, the fabric's closed-form counters.

The agent is told with a SimPy interrupt carrying a ``workloads.optimistic.Rewind``. Blocks
priced alone book their weight at the controller's level (0, 0) when their run stands
(:meth:`settle`), in one sum instead of one per block: the run's results are the clock's
to rounding (``tests/test_run_ahead.py``).
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

from workloads.optimistic import Rewind

__all__ = ["QuietRunAhead"]


class _Op(NamedTuple):
    index: int          # program index
    t0: float           # start, s
    t1: float           # end, s
    tp_s: float         # the class's TP time before it, s
    ops: int            # the class's run-ahead operations before it
    state: tuple | None  # compute: (Accelerator.checkpoint(), DeviceStreams.checkpoint())
    ins: tuple          # the instruction
    it: int             # the iteration


class QuietRunAhead:
    """The runs ahead of each class whose device agent may take them back (module
    docstring).

    Args:
        executor: the ``workloads.executor.Executor`` whose agents run ahead; its device
            agents' ``on_change`` hooks are set here.
    """

    def __init__(self, executor):
        self.ex = executor
        n = len(executor.stats)
        self.log: list[list[_Op]] = [[] for _ in range(n)]
        self.until = [-math.inf] * n  # the end of each class's run ahead so far, s
        self.rewinds = 0
        for cls, agent in enumerate(executor.streams):
            agent.on_change = partial(self.changed, cls)

    @staticmethod
    def allows(streams: list | None) -> bool:
        """Whether agents may run ahead beside these device agents (None: none): not where a
        block draws a fresh latency batch even alone (``memory.bound: auto`` under the
        ``queue`` model: :attr:`~devices.interference.DeviceStreams.quiet` is never true)."""
        return streams is None or all(s.latency is None for s in streams)

    @staticmethod
    def idle(*tails) -> bool:
        """Whether an agent whose own stream jobs end with ``tails`` (events, or None) may
        start a run ahead now: none of them pending (the next job of a FIFO stream starts
        when the previous ends and would take the run back at once; measured on FSDP: two
        rewinds per layer and more events than on the clock)."""
        return all(e is None or e.triggered for e in tails)

    def ok(self, cls: int) -> bool:
        """Whether the agent of ``cls`` runs ahead: its TP collectives are its own (a TP
        group of several classes meets at a rendezvous, which an agent reaches on the clock
        here: too little runs between them to gain anything)."""
        return len(self.ex._groups("tp", cls)[1]) == 1

    def mark(self, cls: int, compute: bool) -> tuple:
        """What to keep before an instruction of ``cls`` (a compute block or not) is run
        ahead (see :meth:`add`)."""
        ex = self.ex
        state = ((ex.accelerators[cls].checkpoint(), ex.streams[cls].checkpoint())
                 if compute else None)
        return ex.stats[cls].tp_s, ex.ahead_ops[cls], state

    def add(self, cls: int, mark: tuple, index: int, ins: tuple, t0: float, t1: float,
            it: int) -> None:
        """Instruction ``ins`` (program ``index``, iteration ``it``) of ``cls`` ran ahead
        from ``t0`` to ``t1`` (s); ``mark`` is :meth:`mark` before it."""
        self.log[cls].append(_Op(index, t0, t1, *mark, ins, it))
        self.until[cls] = t1

    def settle(self, cls: int) -> None:
        """The agent of ``cls`` rejoined the clock at the end of its run: all of it stands."""
        self.log[cls].clear()
        self.until[cls] = -math.inf
        self.ex.streams[cls].book_alone()

    def changed(self, cls: int) -> None:
        """The streams of ``cls``'s device agent are about to change now: take back what its
        agent ran ahead past now."""
        now = self.ex.env.now
        if self.until[cls] > now:
            self.rewind(cls, now)

    def rewind(self, cls: int, s: float) -> None:
        """Take the agent of ``cls`` back to time ``s`` (now) and interrupt it with the
        :class:`~workloads.optimistic.Rewind` that tells it how to go on."""
        ex = self.ex
        log = self.log[cls]
        k = next(j for j, e in enumerate(log) if e.t1 > s)
        e = log[k]
        # the first instruction taken back: from the one in flight at s if a block or
        # starting at s (it starts after the change, as a block the change finds starting)
        back = k if e.state is not None or e.t0 >= s else k + 1
        for later in log[back:]:  # (a count taken back from the fabric's closed counters:
            if later.state is None:  # folded or not, the sums come out the same integers)
                phases = ex._tp_plan(cls, later.ins[1], later.ins[2])[1]
                ex.fabric.closed_counter(phases)[0][1] -= 1
        first = next((x for x in log[back:] if x.state is not None), None)
        if first is not None:  # TP collectives change neither agent: the next block's state
            ex.accelerators[cls].restore(first.state[0])
            ex.streams[cls].restore(first.state[1])
        if back < len(log):
            ex.stats[cls].tp_s = log[back].tp_s
            ex.ahead_ops[cls] = log[back].ops
        self.settle(cls)
        self.rewinds += 1
        if e.t0 >= s:  # not started: the agent starts it with the clock now
            rw = Rewind(e.index, at=s)
        elif e.state is not None:  # in flight: the running block of the device agent from now
            ex.streams[cls].resumed(ex.agent_proc[cls])
            block = ex.blocks[int(ex.layout.class_stage[cls])][e.ins[1]]
            rw = Rewind(e.index + 1, body=ex.accelerators[cls].resume(
                block, e.t0, (e.it, *e.ins[2:5])))
        else:
            rw = Rewind(e.index + 1, at=e.t1)
        ex.agent_proc[cls].interrupt(rw)
