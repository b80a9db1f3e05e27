"""Reading traces: the documented way to open a trace file (``twin.trace.read_table``).

The reader and writer live in the kernel (:mod:`twin.kernel.trace`); this module keeps the
public import path of the reading functions. Commands that read a trace call
:func:`open_trace` first (it raises :class:`TraceError` saying what is wrong with a
truncated, corrupted, incomplete or foreign file).
"""

from __future__ import annotations

from twin.kernel.errors import TraceError
from twin.kernel.trace import SCHEMA_VERSION, list_tables, open_trace, read_attrs, read_table

__all__ = ["SCHEMA_VERSION", "TraceError", "list_tables", "open_trace", "read_attrs",
           "read_table"]
