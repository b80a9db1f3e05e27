"""Trace-writing recorder: the agents' records go straight into buffered trace tables."""

from __future__ import annotations

from devices.fabric import MessageRecord
from twin.kernel.records import Recorder
from twin.kernel.trace import TraceWriter

OPS_COLUMNS = {"cls": "int32", "iteration": "int32", "stream": "category", "kind": "category",
               "name": "category", "mb": "int32", "chunk": "int32", "layer": "int32",
               "t_start": "float64", "t_end": "float64", "flops": "float64"}
OPS_UNITS = {"t_start": "s", "t_end": "s", "flops": "FLOP per device"}
MESSAGES_COLUMNS = {"t_start": "float64", "t_end": "float64", "name": "category",
                    "owner": "int32", "n_pairs": "int32", "steps": "int32", "bytes": "float64",
                    "max_hops": "int32", "src": "int32", "dst": "int32", "plan": "int32"}
MESSAGES_UNITS = {"t_start": "s", "t_end": "s", "bytes": "B (all pairs, all steps)"}
PHASE_LINKS_COLUMNS = {"plan": "int32", "link": "int32", "bytes": "float64"}
PHASE_LINKS_UNITS = {"bytes": "B per execution of the plan"}
POWER_COLUMNS = {"cls": "int32", "t_start": "float64", "t_end": "float64", "watts": "float64",
                 "state": "category", "freq_mhz": "float64", "volts": "float64",
                 "temp_c": "float64"}
POWER_UNITS = {"t_start": "s", "t_end": "s", "watts": "W per device (board)", "freq_mhz": "MHz",
               "volts": "V", "temp_c": "C at t_end (NaN: no thermal or leakage data)"}
TELEMETRY_COLUMNS = {"time_s": "float64", "power_w": "float64", "reading_w": "float64",
                     "cap_mhz": "float64"}
TELEMETRY_UNITS = {"time_s": "s", "power_w": "W (cluster, last period)",
                   "reading_w": "W (delayed reading used)", "cap_mhz": "MHz"}


class TraceRecorder(Recorder):
    """Appends op / message rows to the tables enabled in the scenario (power rows come from
    the accelerator agents at the end of the run, see :func:`write_power_tables`)."""

    def __init__(self, writer: TraceWriter, tables: set[str]):
        self.ops = writer.table("ops", OPS_COLUMNS, OPS_UNITS) if "ops" in tables else None
        self.msgs = (writer.table("messages", MESSAGES_COLUMNS, MESSAGES_UNITS)
                     if "messages" in tables else None)
        if self.ops is not None:
            # the arguments of op() are the ops columns in order: skip one call per row
            self.op = self.ops.append  # type: ignore[method-assign]

    def op(self, cls, iteration, stream, kind, name, mb, chunk, layer, t0, t1, flops) -> None:
        if self.ops is not None:
            self.ops.append(cls, iteration, stream, kind, name, mb, chunk, layer, t0, t1, flops)

    def message(self, m: MessageRecord) -> None:
        """Fabric callback: one finished phase."""
        if self.msgs is not None:
            self.msgs.append(*m)  # a MessageRecord's fields are the columns, in order


def write_power_tables(writer: TraceWriter, accelerators: list, tables: set[str]) -> None:
    """The ``power`` table (one row per constant-power segment of each rank class), the
    ``alerts`` table and, with a cluster power manager, its ``telemetry`` samples (each when
    listed in ``tables``)."""
    from devices.power_report import (
        ALERT_COLUMNS,
        ALERT_UNITS,
        power_columns,
        telemetry_columns,
    )

    if "power" in tables:
        writer.table("power", POWER_COLUMNS, POWER_UNITS).extend(power_columns(accelerators))
    if not accelerators:
        return
    setup = accelerators[0].power
    if "alerts" in tables:
        t = writer.table("alerts", ALERT_COLUMNS, ALERT_UNITS)
        for row in setup.alerts or []:
            t.append(*row)
    tel = telemetry_columns(setup) if "telemetry" in tables else None
    if tel is not None:
        writer.table("telemetry", TELEMETRY_COLUMNS, TELEMETRY_UNITS).extend(tel)


def write_phase_links(writer: TraceWriter, fabric, tables: set[str]) -> None:
    """The ``phase_links`` table: bytes each directed link carries per execution of every
    route plan a ``messages`` row names (its ``plan`` column)."""
    if "phase_links" not in tables:
        return
    import numpy as np

    rows = fabric.plan_links
    t = writer.table("phase_links", PHASE_LINKS_COLUMNS, PHASE_LINKS_UNITS)
    if rows:
        t.extend({"plan": np.concatenate([np.full(len(lk), p) for p, lk, _ in rows]),
                  "link": np.concatenate([lk for _, lk, _ in rows]),
                  "bytes": np.concatenate([b for _, _, b in rows])})
