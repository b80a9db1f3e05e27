"""Trace-writing recorder: the agents' records go straight into buffered trace tables."""

from __future__ import annotations

from devices.fabric import MessageRecord
from twin.records import Recorder
from twin.trace import TraceWriter

OPS_COLUMNS = {"cls": "int32", "iteration": "int32", "stream": "category", "kind": "category",
               "name": "category", "mb": "int32", "chunk": "int32", "layer": "int32",
               "t_start": "float64", "t_end": "float64", "flops": "float64"}
OPS_UNITS = {"t_start": "s", "t_end": "s", "flops": "FLOP per device"}
MESSAGES_COLUMNS = {"t_start": "float64", "t_end": "float64", "name": "category",
                    "owner": "int32", "n_pairs": "int32", "steps": "int32", "bytes": "float64",
                    "max_hops": "int32", "src": "int32", "dst": "int32"}
MESSAGES_UNITS = {"t_start": "s", "t_end": "s", "bytes": "B (all pairs, all steps)"}
POWER_COLUMNS = {"cls": "int32", "t_start": "float64", "t_end": "float64", "watts": "float64",
                 "state": "category"}
POWER_UNITS = {"t_start": "s", "t_end": "s", "watts": "W per device"}


class TraceRecorder(Recorder):
    """Appends op / power / message rows to the tables enabled in the scenario."""

    def __init__(self, writer: TraceWriter, tables: set[str]):
        self.ops = writer.table("ops", OPS_COLUMNS, OPS_UNITS) if "ops" in tables else None
        self.msgs = (writer.table("messages", MESSAGES_COLUMNS, MESSAGES_UNITS)
                     if "messages" in tables else None)
        self.pwr = writer.table("power", POWER_COLUMNS, POWER_UNITS) if "power" in tables else None

    def op(self, cls, iteration, stream, kind, name, mb, chunk, layer, t0, t1, flops) -> None:
        if self.ops is not None:
            self.ops.append(cls, iteration, stream, kind, name, mb, chunk, layer, t0, t1, flops)

    def power(self, cls, t0, t1, watts, state) -> None:
        if self.pwr is not None:
            self.pwr.append(cls, t0, t1, watts, state)

    def message(self, m: MessageRecord) -> None:
        """Fabric callback: one finished phase."""
        if self.msgs is not None:
            self.msgs.append(m.t_start, m.t_end, m.name, m.owner, m.n_pairs, m.steps, m.bytes,
                             m.max_hops, m.src, m.dst)
