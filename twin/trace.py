"""Reading traces: the documented way to open a trace file (``twin.trace.read_table``).

The reader and writer live in the kernel (:mod:`twin.kernel.trace`); this module keeps the
public import path of the reading functions.
"""

from __future__ import annotations

from twin.kernel.trace import SCHEMA_VERSION, list_tables, read_attrs, read_table

__all__ = ["SCHEMA_VERSION", "list_tables", "read_attrs", "read_table"]
