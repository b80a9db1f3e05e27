"""``twin export``: the Perfetto file is decoded with Perfetto's own protobuf definitions (the
``perfetto`` package's ``perfetto_trace_pb2``, Google's protobuf parser), the Chrome JSON is
checked against the Trace Event Format's rules written out here; both against the busy time
of every stream computed here from the trace's ``ops`` and ``messages`` tables."""

from __future__ import annotations

import gzip
import itertools
import json
import math
from collections import defaultdict

import pytest

from twin.cli import main
from twin.runner import run
from twin.trace import read_table

STREAMS = ("compute", "TP communication", "DP communication", "pipeline communication")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """dp 2 x tp 2 x pp 2 on 8 devices, symmetry off: one process per device, every stream,
    pipeline sends and rendezvous across classes."""
    from tests.conftest import scenario_dict
    from twin.scenario import load_scenario

    raw = scenario_dict()
    raw["trace"] = {"path": str(tmp_path_factory.mktemp("exp") / "t.h5")}
    scen = load_scenario(raw, ["workload.parallelism.dp=2", "workload.parallelism.tp=2",
                               "workload.parallelism.pp=2", "workload.global_batch=8",
                               "simulation.symmetry=false", "workload.iterations=2"])
    return run(scen).trace_path


def _busy(trace) -> dict[tuple[int, str], float]:
    """Seconds of every (class, stream): the stream of an op is its kind's (tp: the TP
    collective the compute stream waits on; the comm stream: DP all-reduces; everything else
    on the compute stream, waits included); pipeline sends from the messages table."""
    ops = read_table(trace, "ops")
    out: dict[tuple[int, str], float] = defaultdict(float)
    for r in ops.itertuples(index=False):
        s = ("TP communication" if r.kind == "tp" else
             "DP communication" if r.stream == "comm" else "compute")
        out[(int(r.cls), s)] += r.t_end - r.t_start
    msgs = read_table(trace, "messages")
    for r in msgs[msgs["name"].astype(str).str.startswith("p2p")].itertuples(index=False):
        out[(int(r.owner), "pipeline communication")] += r.t_end - r.t_start
    return out


def _base(name: str) -> str:
    return name.split(" #")[0]


def _decode(path):
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    return Trace.FromString(path.read_bytes()).packet


def test_perfetto_file_decodes_with_perfetto_protos(trace, tmp_path, capsys):
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

    out = tmp_path / "run.pftrace"
    assert main(["export", str(trace), "-o", str(out)]) == 0
    assert "perfetto" in capsys.readouterr().out
    packets = _decode(out)
    procs, threads, counters, tracks = {}, {}, {}, set()
    for p in packets:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid != 0 and d.uuid not in tracks  # 0 is an event's default track
            tracks.add(d.uuid)
            if d.HasField("process"):
                procs[d.process.pid] = d.process.process_name
            elif d.HasField("thread"):
                assert d.thread.pid in procs and d.parent_uuid in tracks
                threads[d.uuid] = (d.thread.pid, d.thread.thread_name)
            elif d.HasField("counter"):
                counters[d.uuid] = (d.parent_uuid, d.name)
    n_dev = 8
    names = [procs[pid] for pid in range(1, n_dev + 1)]
    assert all(n.startswith(f"device {int(n.split()[1])} (rank") for n in names)
    per_proc = defaultdict(set)
    for pid, name in threads.values():
        per_proc[pid].add(_base(name))
    busy = _busy(trace)
    for c in range(n_dev):  # one track (plus overlap lanes) per stream the device ran
        assert per_proc[c + 1] == {s for (k, s) in busy if k == c}
    assert {per_proc[c + 1] >= {"compute", "TP communication", "DP communication"}
            for c in range(n_dev)} == {True}
    stacks: dict[int, list] = defaultdict(list)
    total: dict[tuple[int, str], float] = defaultdict(float)
    count: dict[tuple[int, str], int] = defaultdict(int)
    flows_out, flows_in = [], []
    last_ts = defaultdict(int)
    for p in packets:
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        assert e.track_uuid in tracks and p.trusted_packet_sequence_id == 1
        if e.type in (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END):
            assert p.timestamp >= last_ts[e.track_uuid]  # time order per track
            last_ts[e.track_uuid] = p.timestamp
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            stacks[e.track_uuid].append(p.timestamp)
            flows_out += list(e.flow_ids)
            flows_in += list(e.terminating_flow_ids)
        elif e.type == TrackEvent.TYPE_SLICE_END:
            start = stacks[e.track_uuid].pop()
            pid, name = threads[e.track_uuid]
            total[(pid - 1, _base(name))] += (p.timestamp - start) * 1e-9
            count[(pid - 1, _base(name))] += 1
        elif e.type == TrackEvent.TYPE_COUNTER:
            assert e.track_uuid in counters
    assert not any(stacks.values())                     # every slice closed
    for key, b in busy.items():  # integer ns timestamps: each slice exact to +-1 ns
        assert abs(total[key] - b) <= count[key] * 1e-9 + 1e-9 * b, key
    assert sorted(flows_out) == sorted(flows_in) and len(set(flows_out)) == len(flows_out)
    assert len(flows_out) > 0
    tracks_of = defaultdict(set)
    for parent, name in counters.values():
        tracks_of[parent].add(name)
    assert any({"board power (W)", "clock (MHz)", "temperature (C)"} <= v
               for v in tracks_of.values())


def _chrome_check(doc: dict) -> dict:
    """The Trace Event Format's rules this exporter relies on; returns the X events by
    (pid, tid) and the thread names."""
    assert set(doc) >= {"traceEvents"} and doc.get("displayTimeUnit") in ("ms", "ns")
    required = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "C": {"name", "ph", "ts", "pid"},
                "i": {"name", "ph", "ts", "pid", "s"}, "s": {"name", "cat", "ph", "ts", "pid",
                                                             "tid", "id"},
                "f": {"name", "cat", "ph", "ts", "pid", "tid", "id"},
                "M": {"name", "ph", "pid", "args"}}
    xs, tnames, pnames, flows = defaultdict(list), {}, {}, defaultdict(list)
    for e in doc["traceEvents"]:
        assert e["ph"] in required, e
        assert required[e["ph"]] <= set(e), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
            xs[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e))
        elif e["ph"] == "M" and e["name"] == "thread_name":
            tnames[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["ph"] == "M" and e["name"] == "process_name":
            pnames[e["pid"]] = e["args"]["name"]
        elif e["ph"] in "sf":
            flows[e["id"]].append(e)
        elif e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")
        elif e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
    for key, ev in xs.items():  # complete events of one thread must not overlap
        assert key in tnames and key[0] in pnames
        ev.sort(key=lambda x: (x[0], x[1]))
        for (_a0, a1, _), (b0, _b1, _) in itertools.pairwise(ev):
            assert b0 >= a1 * (1 - 1e-12)  # rounding of ts + dur in microseconds only
    for fid, pair in flows.items():  # one start, one end, same cat/name, bound to slices
        assert sorted(e["ph"] for e in pair) == ["f", "s"], fid
        assert len({(e["cat"], e["name"]) for e in pair}) == 1
        for e in pair:
            if e["ph"] == "f":
                assert e.get("bp") == "e"
            assert any(a0 <= e["ts"] <= a1 for a0, a1, _ in xs[(e["pid"], e["tid"])])
    return {"xs": xs, "threads": tnames}


def test_chrome_json_follows_the_trace_event_format(trace, tmp_path):
    out = tmp_path / "run.json.gz"
    assert main(["export", str(trace), "-o", str(out)]) == 0
    doc = json.loads(gzip.decompress(out.read_bytes()))
    got = _chrome_check(doc)
    total: dict[tuple[int, str], float] = defaultdict(float)
    for (pid, tid), ev in got["xs"].items():
        name = _base(got["threads"][(pid, tid)])
        total[(pid - 1, name)] += sum(e["dur"] for _a, _b, e in ev) * 1e-6
    busy = _busy(trace)
    assert set(total) == set(busy)
    for key, b in busy.items():
        assert total[key] == pytest.approx(b, rel=1e-9), key
    x = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"]
    assert {"flops", "stage", "iteration"} <= set(x[0]["args"])


def test_window_devices_and_size_cut(trace, tmp_path, capsys):
    out = tmp_path / "w.json"
    assert main(["export", str(trace), "-o", str(out), "--window", "0:0.01",
                 "--devices", "0-1"]) == 0
    doc = json.loads(out.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    ranks = read_table(trace, "ranks")
    pids = {int(c) + 1 for c in ranks.loc[ranks["device"].isin([0, 1]), "cls"]}
    assert {e["pid"] for e in xs} <= pids and xs
    assert all(e["ts"] <= 0.01e6 for e in xs)
    small = tmp_path / "cut.json"
    capsys.readouterr()
    assert main(["export", str(trace), "-o", str(small), "--max-mb", "0.02"]) == 0
    assert "cut at t =" in capsys.readouterr().err
    meta = json.loads(small.read_text())["otherData"]
    assert meta["cut_at_s"] is not None
    assert small.stat().st_size < 0.02e6 * 1.5


@pytest.mark.parametrize("args, field", [
    (["--window", "5:1"], "--window"), (["--devices", "0-99"], "--devices"),
    (["--devices", "x"], "--devices"), ([], "-o"), (["--max-mb", "0"], "--max-mb"),
    (["--max-mb", "inf"], "--max-mb"), (["--max-mb", "nan"], "--max-mb")])
def test_export_errors_name_the_argument(trace, tmp_path, capsys, args, field):
    out = tmp_path / ("run.txt" if not args else "run.json")
    assert main(["export", str(trace), "-o", str(out), *args]) == 2
    assert field in capsys.readouterr().err


def test_export_of_a_missing_or_foreign_file_is_a_clear_error(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope.h5"), "-o", str(tmp_path / "a.json")]) == 2
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not hdf5")
    assert main(["export", str(bad), "-o", str(tmp_path / "a.json")]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and "not a meshtwin trace" in err


# ----------------------------------------------------------------------------- the timeline
@pytest.fixture(scope="module")
def timeline(trace):
    from twin.export.timeline import build_timeline
    from twin.reading import TraceData

    td = TraceData(trace, need=("ops",))
    return td, build_timeline(td)


def test_device_ranges_print_and_parse():
    from twin.export.timeline import _ranges, parse_devices

    assert _ranges([11, 0, 2, 1, 3, 8, 10]) == "0-3,8,10-11"
    assert _ranges([5]) == "5" and _ranges([]) == ""
    assert parse_devices("0-3,8, 10-11", 12) == {0, 1, 2, 3, 8, 10, 11}
    assert parse_devices(None, 12) is None
    for bad in ("3-1", "-1", "x", "0-", "1e3"):  # "0-" read as device 0 before
        with pytest.raises(ValueError):
            parse_devices(bad, 12)


def test_a_trace_without_its_ranks_table_exports_with_class_names(tmp_path):
    """``trace.tables: [ops, messages]`` leaves the ranks table out: the timeline names its
    processes by class (it raised KeyError: 'cls' before) and a device selection, which
    needs the ranks, is refused by name."""
    from tests.conftest import scenario_dict
    from twin.export import export_trace
    from twin.kernel.errors import ScenarioError
    from twin.scenario import load_scenario

    raw = scenario_dict(workload__parallelism={"dp": 2, "tp": 2, "pp": 2})
    raw["trace"] = {"path": str(tmp_path / "t.h5"), "tables": ["ops", "messages"]}
    path = run(load_scenario(raw)).trace_path
    out = tmp_path / "t.json"
    export_trace(path, out)
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names and all(n.startswith("class ") for n in names)
    with pytest.raises(ScenarioError, match="--devices needs the trace's ranks table"):
        export_trace(path, out, devices="0-3")


def test_a_device_range_past_the_run_is_refused_before_it_is_expanded(trace, tmp_path,
                                                                      capsys):
    """``--devices 0-99999999999`` built a set of 1e11 ids (a minute of swapping, then the
    time limit) before it was compared with the run's devices; ranges are checked first.
    A trace that does not say how many devices it had takes no device list."""
    from twin.export.timeline import OutOfRange, parse_devices

    with pytest.raises(OutOfRange):
        parse_devices("0-99999999999", 16)
    with pytest.raises(OutOfRange):
        parse_devices("0", 0)
    assert main(["export", str(trace), "-o", str(tmp_path / "t.json"),
                 "--devices", "0-99999999999"]) == 2
    assert "the run has devices 0-7" in capsys.readouterr().err


def test_thread_names_of_lanes_and_further_streams():
    from twin.export.timeline import COMPUTE, LANE_STRIDE, PP, _thread_name

    assert _thread_name(COMPUTE, []) == "compute"
    assert _thread_name(PP + LANE_STRIDE, []) == "pipeline communication #2"
    assert _thread_name(PP + 1, ["h2d", "load"]) == "h2d"
    assert _thread_name(PP + 2 + 2 * LANE_STRIDE, ["h2d", "load"]) == "load #3"
    assert _thread_name(PP + 3, ["h2d", "load"]) == f"stream {PP + 3}"


def test_link_counters_integrate_to_each_links_bytes(timeline):
    """Each network counter (a directed link's utilization over time, from the messages' route
    plans) times the link's capacity integrates to the bytes the fabric booked on that link;
    the links shown are the busiest ones."""
    from twin.export.timeline import TOP_LINKS

    td, tl = timeline
    links = td.table("links").set_index(["src", "dst"])
    lc = tl.counters[tl.counters["track"].str.endswith(" utilization")]
    shown = []
    for track, g in lc.groupby("track"):
        u, w = (int(x) for x in track.split()[1].split("->"))
        t, v = g["t"].to_numpy(), g["value"].to_numpy()
        assert v[-1] == pytest.approx(0.0, abs=1e-9) and (v >= 0).all()
        carried = float((v[:-1] * (t[1:] - t[:-1])).sum()) * links.loc[(u, w), "capacity"]
        assert carried == pytest.approx(links.loc[(u, w), "bytes"], rel=1e-9)
        shown.append((u, w))
    busy = links[links["bytes"] > 0]
    assert len(shown) == min(TOP_LINKS, len(busy)) and len(busy) > TOP_LINKS
    assert busy.drop(index=shown)["bytes"].max() <= busy.loc[shown, "bytes"].min()


def test_collective_slices_carry_the_bytes_of_their_phases(timeline):
    """A TP or DP slice's bytes are those of its class's phases of that kind that ended
    inside it (brute force over the messages table; absent, NaN, for a class that owns no
    phase of the kind: the group's other members); together they are every phase's."""
    td, tl = timeline
    msgs = td.table("messages")
    sl = tl.slices
    for kind in ("tp", "dp"):
        rows = sl[sl["cat"] == kind]
        m = msgs[msgs["name"].str.startswith(f"{kind}_")]
        owners = set(m["owner"] + 1)
        for r in rows.itertuples(index=False):
            mine = m[(m["owner"] == r.pid - 1) & (m["t_end"] > r.t0) & (m["t_end"] <= r.t1)]
            if r.pid in owners:
                assert r.bytes == pytest.approx(float(mine["bytes"].sum()), rel=1e-12)
            else:
                assert math.isnan(r.bytes)
        assert rows["bytes"].sum() == pytest.approx(float(m["bytes"].sum()), rel=1e-12)
        assert rows["bytes"].notna().sum() < len(rows)


def test_pipeline_send_flows_end_where_the_receiver_waited_or_next_computed(timeline):
    """Every pipeline send has a flow from its slice to the receiving class's compute
    thread: the receive wait that ended at the arrival, else the first compute-thread slice
    starting at or after it (checked by brute force)."""
    from twin.export.timeline import COMPUTE, LANE_STRIDE

    td, tl = timeline
    sl, fl = tl.slices, tl.flows
    msgs = td.table("messages")
    cls_of = td.table("ranks").set_index("device")["cls"]
    sends = fl[fl["name"] == "pipeline send"]
    assert len(sends) == int(msgs["name"].str.startswith("p2p").sum()) > 0
    waited = 0
    for s, d in zip(sends["src"], sends["dst"], strict=True):
        a, b = sl.iloc[s], sl.iloc[d]
        (m,) = msgs[(msgs["owner"] == a.pid - 1) & (msgs["t_start"] == a.t0)
                    & (msgs["t_end"] == a.t1) & (msgs["name"] == a["name"])].itertuples()
        assert a["cat"] == "pipeline" and b.pid == cls_of[m.dst] + 1
        assert tl.slices.loc[d, "tid"] % LANE_STRIDE == COMPUTE
        if b["cat"] == "recv" and b.t1 == a.t1:
            waited += 1
            continue
        mine = sl[(sl["pid"] == b.pid) & (sl["tid"] % LANE_STRIDE == COMPUTE)
                  & (sl["t0"] >= a.t1)]
        assert b.t0 == mine["t0"].min()
    assert waited > 0


@pytest.mark.parametrize("kind,group", [("tp", ["dp", "pp"]), ("dp", ["pp", "tp"])])
def test_rendezvous_flows_join_the_classes_of_one_group(timeline, kind, group):
    """Collective rendezvous flows run between the TP (DP) slices of two classes of one TP
    (DP) group, the k-th instance of one to the k-th of the other, from the class that
    arrived last; each instance of a group of g classes has g - 1 of them."""
    td, tl = timeline
    sl, fl = tl.slices, tl.flows
    ranks = td.table("ranks")
    key = ranks.groupby("cls")[group].first()
    nth = sl[sl["cat"] == kind].groupby("pid").cumcount()
    got = fl[fl["name"] == f"{kind} rendezvous"]
    for s, d in zip(got["src"], got["dst"], strict=True):
        a, b = sl.iloc[s], sl.iloc[d]
        assert a["cat"] == kind and b["cat"] == kind and a.pid != b.pid
        assert (key.loc[a.pid - 1] == key.loc[b.pid - 1]).all()
        assert nth[s] == nth[d] and a.t0 >= b.t0
    expect = 0
    for _, g in ranks.groupby(group):
        pids = sorted(set(g["cls"] + 1))
        counts = [int(((sl["cat"] == kind) & (sl["pid"] == p)).sum()) for p in pids]
        expect += min(counts) * (len(pids) - 1)
    assert len(got) == expect > 0


def test_perfetto_slices_carry_their_names_categories_and_arguments(timeline, tmp_path):
    """Each slice's begin event carries the timeline slice's name, category and arguments
    (whole numbers as integers, FLOPs and bytes as doubles, absent ones left out), and the
    counter events carry the timeline's counter values, in time order."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

    from twin.export.perfetto import ns, write_perfetto
    from twin.export.timeline import ARG_COLUMNS

    _td, tl = timeline
    packets = _decode(write_perfetto(tl, tmp_path / "t.pftrace"))
    begins = [p for p in packets if p.HasField("track_event")
              and p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN]
    assert len(begins) == len(tl.slices)
    want = {}
    for r in tl.slices.itertuples(index=False):
        args = {c: getattr(r, c) for c in ARG_COLUMNS if not math.isnan(getattr(r, c))}
        want.setdefault((int(ns(r.t0)), r.name, r.cat), []).append(args)
    for p in begins:
        e = p.track_event
        got = {}
        for a in e.debug_annotations:
            assert a.HasField("int_value") == (a.name not in ("flops", "bytes")), a
            got[a.name] = a.int_value if a.HasField("int_value") else a.double_value
        key = (p.timestamp, e.name, e.categories[0])
        assert got in want[key], key
    values = [(p.timestamp, p.track_event.double_counter_value) for p in packets
              if p.HasField("track_event") and p.track_event.type == TrackEvent.TYPE_COUNTER]
    c = tl.counters.sort_values("t", kind="stable")
    assert values == list(zip(ns(c["t"].to_numpy()).tolist(), c["value"].astype(float),
                              strict=True))


@pytest.mark.parametrize("zeros, reverse", [(1, False), (2, False), (2, True)])
def test_perfetto_zero_length_slices_begin_before_they_end(tmp_path, zeros, reverse):
    """Zero-length slices between two others on one thread: at their instant the slice
    before ends, then each zero-length one begins and ends (two were once nested: both
    begins, then both ends), then the next begins; also when the slices come in reverse
    order (the events are ordered by time, not by the table)."""
    import pandas as pd
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

    from twin.export.perfetto import write_perfetto
    from twin.export.timeline import ARG_COLUMNS, Timeline

    nan = float("nan")
    n = 2 + zeros
    sl = pd.DataFrame({"pid": [1] * n, "tid": [1] * n, "t0": [0.0] + [1.0] * (n - 1),
                       "t1": [1.0] * (n - 1) + [2.0],
                       "name": ["a"] + [f"zero{k}" for k in range(zeros)] + ["b"],
                       "cat": ["compute"] * n, **{c: [nan] * n for c in ARG_COLUMNS}})
    if reverse:
        sl = sl.iloc[::-1].reset_index(drop=True)
    tl = Timeline(pd.DataFrame({"pid": [1], "name": ["p"], "sort_index": [0]}),
                  pd.DataFrame({"pid": [1], "tid": [1], "name": ["compute"]}), sl,
                  pd.DataFrame(columns=["pid", "track", "t", "value"]),
                  pd.DataFrame(columns=["id", "src", "dst", "name"]),
                  pd.DataFrame(columns=["pid", "tid", "t", "name", "cat"]))
    events = [(p.timestamp, p.track_event.type, p.track_event.name)
              for p in _decode(write_perfetto(tl, tmp_path / "z.pftrace"))
              if p.HasField("track_event")]
    B, E = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END
    middle = [e for k in (range(zeros)[::-1] if reverse else range(zeros))
              for e in ((10**9, B, f"zero{k}"), (10**9, E, ""))]
    assert events == [(0, B, "a"), (10**9, E, ""), *middle, (10**9, B, "b"),
                      (2 * 10**9, E, "")]


def test_chrome_events_of_a_hand_made_timeline():
    """Metadata on thread 0 of each process; a slice's whole-number arguments as integers,
    FLOPs and bytes as floats, absent ones left out; global instants (faults, alerts) with
    scope g on process 1, a process's clock change with scope p on its own process, both on
    thread 0; flows from the middle of the source slice to the middle of the destination."""
    import pandas as pd

    from twin.export.chrome import US, events
    from twin.export.timeline import ARG_COLUMNS, Timeline

    nan = float("nan")
    args = {c: [nan, nan] for c in ARG_COLUMNS}
    args["stage"], args["flops"], args["bytes"] = [1.0, nan], [2.5e12, nan], [nan, 64.0]
    sl = pd.DataFrame({"pid": [2, 3], "tid": [1, 4], "t0": [0.5, 1.0], "t1": [1.0, 3.0],
                       "name": ["mlp_fwd", "p2p"], "cat": ["compute", "pipeline"], **args})
    tl = Timeline(pd.DataFrame({"pid": [2, 3], "name": ["a", "b"], "sort_index": [1, 2]}),
                  pd.DataFrame({"pid": [2, 3], "tid": [1, 4], "name": ["compute", "pp"]}), sl,
                  pd.DataFrame({"pid": [2], "track": ["clock (MHz)"], "t": [0.25],
                                "value": [1980]}),
                  pd.DataFrame({"id": [7], "src": [1], "dst": [0], "name": ["pipeline send"]}),
                  pd.DataFrame({"pid": [0, 3], "tid": [0, 0], "t": [0.1, 0.2],
                                "name": ["fault", "clock 1980 -> 1755 MHz"],
                                "cat": ["fault", "dvfs"]}))
    ev = events(tl)
    meta = [e for e in ev if e["ph"] == "M"]
    assert {(e["name"], e["pid"], e["tid"]) for e in meta} == {
        ("process_name", 2, 0), ("process_sort_index", 2, 0), ("process_name", 3, 0),
        ("process_sort_index", 3, 0), ("thread_name", 2, 1), ("thread_sort_index", 2, 1),
        ("thread_name", 3, 4), ("thread_sort_index", 3, 4)}
    x = {e["name"]: e for e in ev if e["ph"] == "X"}
    assert x["mlp_fwd"]["args"] == {"stage": 1, "flops": 2.5e12}
    assert type(x["mlp_fwd"]["args"]["stage"]) is int
    assert x["p2p"]["args"] == {"bytes": 64.0} and type(x["p2p"]["args"]["bytes"]) is float
    assert (x["p2p"]["ts"], x["p2p"]["dur"]) == (1.0 * US, 2.0 * US)
    inst = {e["name"]: (e["s"], e["pid"], e["tid"], e["ts"]) for e in ev if e["ph"] == "i"}
    assert inst == {"fault": ("g", 1, 0, 0.1 * US),
                    "clock 1980 -> 1755 MHz": ("p", 3, 0, 0.2 * US)}
    (c,) = [e for e in ev if e["ph"] == "C"]
    assert (c["name"], c["pid"], c["ts"], c["args"]) == ("clock (MHz)", 2, 0.25 * US,
                                                        {"value": 1980.0})
    fl = {e["ph"]: e for e in ev if e.get("cat") == "flow"}
    assert (fl["s"]["pid"], fl["s"]["tid"], fl["s"]["ts"]) == (3, 4, 2.0 * US)
    assert (fl["f"]["pid"], fl["f"]["tid"], fl["f"]["ts"], fl["f"]["bp"]) == (2, 1, 0.75 * US,
                                                                            "e")
    assert fl["s"]["id"] == fl["f"]["id"] == 7


def test_overlapping_slices_of_one_thread_take_lanes_in_order():
    """A slice goes to the first lane of its thread free at its start, else a new lane
    ``k`` at tid ``base + k * LANE_STRIDE`` (here three deep, then back to lane 0)."""
    import numpy as np
    import pandas as pd

    from twin.export.timeline import COMPUTE, LANE_STRIDE, _lanes

    df = pd.DataFrame({"pid": [1, 1, 1, 1, 2], "t0": [0.0, 1.0, 1.5, 3.0, 1.0],
                       "t1": [3.0, 2.0, 2.5, 4.0, 2.0]})
    tid = _lanes(df, np.full(5, COMPUTE, dtype=np.int64))
    assert tid.tolist() == [COMPUTE, COMPUTE + LANE_STRIDE, COMPUTE + 2 * LANE_STRIDE, COMPUTE,
                            COMPUTE]


def test_a_stream_of_another_name_gets_its_own_thread_after_the_pipelines(timeline):
    """Ops of a stream other than compute and comm (none of today's runs writes one; a
    trace's stream column may name any) go to threads after the pipeline thread, named by
    their stream, never onto another stream's thread."""
    from twin.export.timeline import LANE_STRIDE, PP, build_timeline

    td, _ = timeline

    class Edited:
        def __init__(self, ops):
            self.ops, self.summary = ops, td.summary

        def table(self, name):
            return self.ops if name == "ops" else td.table(name)

        def has(self, name):
            return td.has(name)

    ops = td.table("ops").copy()
    ops["stream"] = ops["stream"].astype(str)
    moved = ops["kind"].astype(str) == "dp"
    assert moved.any()
    ops.loc[moved, "stream"] = "h2d"
    tl = build_timeline(Edited(ops))
    names = dict(zip(tl.threads["tid"], tl.threads["name"], strict=True))
    assert names[PP + 1] == "h2d" and "DP communication" not in names.values()
    assert (tl.slices.loc[tl.slices["cat"] == "dp", "tid"] % LANE_STRIDE == PP + 1).all()


def test_windowed_link_counters_carry_the_messages_that_overlap_the_window(timeline):
    """With a window, each shown link's counter integrates to the bytes its route plans put
    on the link from the messages overlapping the window (brute force over the messages and
    phase_links tables), not from those wholly before or after it."""
    from twin.export.timeline import build_timeline

    td, _ = timeline
    msgs, pl, links = td.table("messages"), td.table("phase_links"), td.table("links")
    end = float(msgs["t_end"].max())
    lo, hi = 0.3 * end, 0.6 * end
    timed = msgs[(msgs["plan"] >= 0) & (msgs["t_end"] > msgs["t_start"])]
    inside = timed[(timed["t_end"] >= lo) & (timed["t_start"] <= hi)]
    assert (timed["t_end"] < lo).any() and (timed["t_start"] > hi).any()
    booked = inside[["plan"]].merge(pl, on="plan").groupby("link")["bytes"].sum()
    cap = links.set_index("link")["capacity"]
    link_of = links.set_index(["src", "dst"])["link"]
    tl = build_timeline(td, window=(lo, hi))
    lc = tl.counters[tl.counters["track"].str.endswith(" utilization")]
    assert len(lc)
    for track, g in lc.groupby("track"):
        u, w = (int(x) for x in track.split()[1].split("->"))
        lk = int(link_of.loc[(u, w)])
        t, v = g["t"].to_numpy(), g["value"].to_numpy()
        carried = float((v[:-1] * (t[1:] - t[:-1])).sum()) * cap.loc[lk]
        assert carried == pytest.approx(float(booked.loc[lk]), rel=1e-9)


def test_power_counters_step_with_the_power_table(timeline):
    """Each class's board-power and clock counters hold a value until it changes: no two
    consecutive points are equal, and at every power row's start the counter reads the
    row's value (brute force)."""
    import numpy as np

    td, tl = timeline
    pw = td.table("power")
    for track, col in (("board power (W)", "watts"), ("clock (MHz)", "freq_mhz")):
        c = tl.counters[tl.counters["track"] == track]
        assert len(c)
        for pid, g in c.groupby("pid"):
            t, v = g["t"].to_numpy(), g["value"].to_numpy()
            assert (v[1:] != v[:-1]).all()
            rows = pw[pw["cls"] == pid - 1].sort_values("t_start", kind="stable")
            rows = rows.drop_duplicates("t_start", keep="last")
            at = np.searchsorted(t, rows["t_start"].to_numpy(), side="right") - 1
            assert (at >= 0).all()
            assert np.array_equal(v[at], rows[col].to_numpy())


def test_the_largest_device_id_of_a_list_is_checked_wherever_it_stands():
    from twin.export.timeline import OutOfRange, parse_devices

    for text in ("0,99", "99,0", "0-2,40-41,5"):
        with pytest.raises(OutOfRange) as err:
            parse_devices(text, 16)
        assert err.value.args[0] == (99 if "99" in text else 41)


def test_a_device_without_temperature_data_has_no_temperature_counter(tmp_path):
    """A device with neither thermal nor leakage data (the TPU v5p): its temperature enters
    nothing, so the power table's ``temp_c`` is NaN and the exported timeline has no
    temperature counter (board power as before); the Trace Event Format file is strict
    JSON."""
    from tests.conftest import scenario_dict
    from twin.scenario import load_scenario

    raw = scenario_dict()
    raw["trace"] = {"path": str(tmp_path / "tpu.h5")}
    h5 = run(load_scenario(raw, ["cluster.device=tpu-v5p",
                                 "power.thermal.enabled=false"])).trace_path
    assert read_table(h5, "power")["temp_c"].isna().all()
    out = tmp_path / "tpu.json"
    assert main(["export", str(h5), "-o", str(out)]) == 0
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    _chrome_check(doc)
    counters = {e["name"] for e in doc["traceEvents"] if e["ph"] == "C"}
    assert "temperature (C)" not in counters and "board power (W)" in counters
