"""Chrome Trace Event Format (JSON object format) of a :class:`~twin.export.timeline.Timeline`.

Written as the format's specification defines it ("Trace Event Format", Google, the document
catapult's ``docs/trace-event-format.md`` points to): an object with ``traceEvents``,
``displayTimeUnit`` and ``otherData``; ``ts`` and ``dur`` in microseconds (as doubles, so a
simulated time keeps its full precision); complete events ``ph: "X"`` per slice on its
``pid`` / ``tid``; counters ``ph: "C"`` (one series ``value`` per counter name); instant events
``ph: "i"`` with scope ``s`` ``g`` (global: faults, alerts, restarts) or ``p`` (process: clock
changes); flows as ``ph: "s"`` (inside the source slice, which it binds to as the enclosing
slice) and ``ph: "f"`` with ``bp: "e"`` (inside the destination slice: binding to the enclosing
slice), the two sharing ``cat``, ``name`` and ``id``; metadata ``ph: "M"`` events
``process_name``, ``process_sort_index``, ``thread_name`` and ``thread_sort_index``.
A name ending in ``.gz`` is gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from twin.export.timeline import ARG_COLUMNS, Timeline
from twin.outputs import atomic_write

US = 1e6


def _args(row) -> dict:
    out = {}
    for c in ARG_COLUMNS:
        v = getattr(row, c)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            out[c] = int(v) if c in ("stage", "mb", "chunk", "layer", "iteration") else float(v)
    return out


def events(tl: Timeline) -> list[dict]:
    """The ``traceEvents`` list."""
    ev: list[dict] = []
    for p in tl.processes.itertuples(index=False):
        pid = int(p.pid)
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"name": p.name}})
        ev.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                   "args": {"sort_index": int(p.sort_index)}})
    for t in tl.threads.itertuples(index=False):
        ev.append({"name": "thread_name", "ph": "M", "pid": int(t.pid), "tid": int(t.tid),
                   "args": {"name": t.name}})
        ev.append({"name": "thread_sort_index", "ph": "M", "pid": int(t.pid), "tid": int(t.tid),
                   "args": {"sort_index": int(t.tid)}})
    for s in tl.slices.itertuples(index=False):
        ev.append({"name": str(s.name), "cat": str(s.cat), "ph": "X", "ts": s.t0 * US,
                   "dur": (s.t1 - s.t0) * US, "pid": int(s.pid), "tid": int(s.tid),
                   "args": _args(s)})
    for c in tl.counters.itertuples(index=False):
        ev.append({"name": c.track, "ph": "C", "ts": c.t * US, "pid": int(c.pid),
                   "args": {"value": float(c.value)}})
    for i in tl.instants.itertuples(index=False):
        scope = "g" if int(i.pid) == 0 else "p"
        ev.append({"name": i.name, "cat": i.cat, "ph": "i", "ts": i.t * US,
                   "pid": int(i.pid) if scope == "p" else 1, "tid": 0, "s": scope})
    sl = tl.slices
    for f in tl.flows.itertuples(index=False):
        a, b = sl.loc[f.src], sl.loc[f.dst]
        common = {"name": f.name, "cat": "flow", "id": int(f.id)}
        ev.append({**common, "ph": "s", "ts": 0.5 * (a.t0 + a.t1) * US, "pid": int(a.pid),
                   "tid": int(a.tid)})
        ev.append({**common, "ph": "f", "bp": "e", "ts": 0.5 * (b.t0 + b.t1) * US,
                   "pid": int(b.pid), "tid": int(b.tid)})
    return ev


def write_chrome(tl: Timeline, out: Path, other: dict) -> Path:
    """Write the JSON (gzip when ``out`` ends in ``.gz``)."""
    doc = {"traceEvents": events(tl), "displayTimeUnit": "ns", "otherData": other}
    data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    payload = gzip.compress(data, 6) if out.suffix == ".gz" else data
    return atomic_write(out, lambda tmp: tmp.write_bytes(payload))
