"""Perfetto's native protobuf trace of a :class:`~twin.export.timeline.Timeline`, built with the
``perfetto`` package's ``TraceProtoBuilder`` (TrackEvent, as Perfetto's "Writing TrackEvent
protos synthetically" reference describes).

One ``TrackDescriptor`` per process (``process {pid, process_name}``), per thread (``thread
{pid, tid, thread_name}``, parented to its process), per counter (``counter {}``, parented to
its process) and one global track for faults, alerts and restarts; slices as
``TYPE_SLICE_BEGIN`` / ``TYPE_SLICE_END`` pairs with their arguments as debug annotations;
counters as ``TYPE_COUNTER`` values; instants as ``TYPE_INSTANT``; a flow as ``flow_ids`` on the
source slice's begin and ``terminating_flow_ids`` on the destination slice's begin. Timestamps
are integer nanoseconds (the format's resolution: each slice boundary is rounded to the nearest
nanosecond, so a slice's duration is exact to +-1 ns). Packets are written in time order, every
one on the same trusted packet sequence.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from twin.export.timeline import ARG_COLUMNS, Timeline
from twin.outputs import atomic_write

SEQUENCE_ID = 1
_INT_ARGS = ("stage", "mb", "chunk", "layer", "iteration")


def ns(t: np.ndarray | float) -> np.ndarray:
    """Seconds -> integer nanoseconds (rounded)."""
    return np.rint(np.asarray(t, dtype=float) * 1e9).astype(np.int64)


def write_perfetto(tl: Timeline, out: Path) -> Path:
    """Serialize ``tl`` to ``out`` (a ``.pftrace``)."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    b = TraceProtoBuilder()
    uuid = iter(range(1 << 20, 1 << 62))
    proc_uuid: dict[int, int] = {}
    for p in tl.processes.itertuples(index=False):
        pk = b.add_packet()
        u = proc_uuid[int(p.pid)] = next(uuid)
        pk.track_descriptor.uuid = u
        pk.track_descriptor.process.pid = int(p.pid)
        pk.track_descriptor.process.process_name = str(p.name)
    thread_uuid: dict[tuple[int, int], int] = {}
    for t in tl.threads.itertuples(index=False):
        pk = b.add_packet()
        u = thread_uuid[(int(t.pid), int(t.tid))] = next(uuid)
        d = pk.track_descriptor
        d.uuid, d.parent_uuid = u, proc_uuid[int(t.pid)]
        d.thread.pid, d.thread.tid, d.thread.thread_name = int(t.pid), int(t.tid), str(t.name)
    counter_uuid: dict[tuple[int, str], int] = {}
    for (pid, track), _g in tl.counters.groupby(["pid", "track"], sort=True):
        pk = b.add_packet()
        u = counter_uuid[(int(pid), str(track))] = next(uuid)
        d = pk.track_descriptor
        d.uuid, d.parent_uuid, d.name = u, proc_uuid[int(pid)], str(track)
        d.counter.SetInParent()
    global_uuid = next(uuid)
    pk = b.add_packet()
    pk.track_descriptor.uuid = global_uuid
    pk.track_descriptor.name = "faults, alerts, restarts"

    # events: (ts, order within the stream of packets, builder) in time order
    sl = tl.slices
    out_flows: dict[int, list[int]] = {}
    in_flows: dict[int, list[int]] = {}
    for f in tl.flows.itertuples(index=False):
        out_flows.setdefault(int(f.src), []).append(int(f.id))
        in_flows.setdefault(int(f.dst), []).append(int(f.id))
    t0, t1 = ns(sl["t0"].to_numpy()), ns(sl["t1"].to_numpy())
    ts = np.concatenate([t0, t1])
    kind = np.concatenate([np.ones(len(sl), dtype=np.int64), np.zeros(len(sl), dtype=np.int64)])
    idx = np.concatenate([np.arange(len(sl)), np.arange(len(sl))])
    # at one instant: the ends of slices that end there (slices of one thread are disjoint),
    # then each zero-length slice's begin and its end together (none nested in another or in
    # the next slice), then the begins of slices that start there
    zero = np.concatenate([t0 == t1, t0 == t1])
    rank = np.where(zero, 1, 2 * kind)
    order = np.lexsort((1 - kind, idx, rank, ts))
    tracks = [thread_uuid[(int(p), int(t))] for p, t in zip(sl["pid"], sl["tid"], strict=True)]
    names = sl["name"].astype(str).to_numpy()
    cats = sl["cat"].astype(str).to_numpy()
    argv = {c: sl[c].to_numpy(dtype=float) for c in ARG_COLUMNS}
    for k in order:
        i = int(idx[k])
        pk = b.add_packet()
        pk.timestamp = int(ts[k])
        pk.trusted_packet_sequence_id = SEQUENCE_ID
        e = pk.track_event
        e.track_uuid = tracks[i]
        if kind[k] == 1:
            e.type = TrackEvent.TYPE_SLICE_BEGIN
            e.name = names[i]
            e.categories.append(cats[i])
            for c in ARG_COLUMNS:
                v = argv[c][i]
                if not math.isnan(v):
                    a = e.debug_annotations.add()
                    a.name = c
                    if c in _INT_ARGS:
                        a.int_value = int(v)
                    else:
                        a.double_value = float(v)
            e.flow_ids.extend(out_flows.get(i, ()))
            e.terminating_flow_ids.extend(in_flows.get(i, ()))
        else:
            e.type = TrackEvent.TYPE_SLICE_END
    for c in tl.counters.sort_values("t", kind="stable").itertuples(index=False):
        pk = b.add_packet()
        pk.timestamp = int(ns(c.t))
        pk.trusted_packet_sequence_id = SEQUENCE_ID
        e = pk.track_event
        e.type = TrackEvent.TYPE_COUNTER
        e.track_uuid = counter_uuid[(int(c.pid), str(c.track))]
        e.double_counter_value = float(c.value)
    for i in tl.instants.itertuples(index=False):
        pk = b.add_packet()
        pk.timestamp = int(ns(i.t))
        pk.trusted_packet_sequence_id = SEQUENCE_ID
        e = pk.track_event
        e.type = TrackEvent.TYPE_INSTANT
        e.track_uuid = global_uuid if int(i.pid) == 0 else proc_uuid[int(i.pid)]
        e.name = str(i.name)
        e.categories.append(str(i.cat))
    payload = b.serialize()
    return atomic_write(out, lambda tmp: tmp.write_bytes(payload))
