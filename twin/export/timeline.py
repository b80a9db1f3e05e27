"""The timeline of a trace in a format-neutral form: processes, threads, slices, counters,
flows and instants (times in seconds), which the Chrome and Perfetto writers serialize.

* **Processes**: one per rank class (pid = class + 1): with symmetry off one device each
  (``device 5 (rank 5, stage 0, x=1 y=1)``); with symmetry on a class stands for every rank of
  a pipeline stage, and its name lists the ranks and devices it stands for.
* **Threads** (streams): ``compute`` (compute blocks, DVFS stalls, checkpoints and the waits
  of the compute stream: pipeline ``recv``, ``dp_wait``, any later wait kind such as
  ``data_wait``), ``TP communication`` (kind ``tp``: the stream blocks on the collective),
  ``DP communication`` (the gradient all-reduces of the communication stream), ``pipeline
  communication`` (sends this class started, from the ``messages`` table), and one thread per
  further stream name of the ``ops`` table (e.g. host copies). Slices of a stream that overlap
  in time go to numbered extra lanes (``pipeline communication #2``), so every thread's slices
  are disjoint, as both formats require.
* **Slices** carry FLOPs, bytes, stage, microbatch, chunk, layer and iteration as arguments.
* **Counters** per process: board power (W), clock (MHz), die temperature (C) from the
  ``power`` table; per network: the utilization of the busiest directed links of the selected
  devices over time (phase averages: each ``messages`` row spreads its route plan's bytes,
  ``phase_links``, evenly over its duration) and the mean over all of them.
* **Flows**: pipeline sends (the send slice to the receiving class's wait, or its next compute
  slice when it did not wait) and collective rendezvous (for a collective whose group spans
  several classes: from the last class to arrive, which started it, to every other one).
* **Instants**: faults, restarts and alerts (global), clock changes (per process).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from twin.reading import TraceData

COMPUTE, TP, DP, PP = 1, 2, 3, 4
THREAD_NAMES = {COMPUTE: "compute", TP: "TP communication", DP: "DP communication",
                PP: "pipeline communication"}
LANE_STRIDE = 100  # tid of lane k of thread t: t + k * LANE_STRIDE
TOP_LINKS = 8      # link utilization counters: the busiest links of the selection
ARG_COLUMNS = ("flops", "bytes", "stage", "mb", "chunk", "layer", "iteration")


@dataclass
class Timeline:
    """What a writer needs (all times in seconds; see the module doc)."""

    processes: pd.DataFrame      # pid, name, sort_index
    threads: pd.DataFrame        # pid, tid, name
    slices: pd.DataFrame         # pid, tid, t0, t1, name, cat, *ARG_COLUMNS (NaN: absent)
    counters: pd.DataFrame       # pid, track, t, value
    flows: pd.DataFrame          # id, src (slice row), dst (slice row), name
    instants: pd.DataFrame       # pid (0: global), tid (0: process), t, name, cat
    meta: dict = field(default_factory=dict)


def _ranges(values) -> str:
    """``0-3,8,10-11`` for sorted integers."""
    v = sorted(int(x) for x in values)
    out, i = [], 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[j + 1] == v[j] + 1:
            j += 1
        out.append(str(v[i]) if i == j else f"{v[i]}-{v[j]}")
        i = j + 1
    return ",".join(out)


def parse_devices(text: str | None, n_devices: int) -> set[int] | None:
    """``"0-3,8"`` -> {0, 1, 2, 3, 8} (None: all). ValueError for what is not a list of ids
    and closed ranges (``0-`` included); :class:`OutOfRange` naming the largest id when one
    is ``n_devices`` or more, found before any range is expanded (``0-99999999999`` would
    build 1e11 ids)."""
    if text is None:
        return None
    ranges = device_ranges(text)
    top = max(hi for _, hi in ranges)
    if top >= n_devices:
        raise OutOfRange(top)
    return {d for lo, hi in ranges for d in range(lo, hi + 1)}


def device_ranges(text: str) -> list[tuple[int, int]]:
    """``"0-3,8"`` -> [(0, 3), (8, 8)], not expanded; ValueError as :func:`parse_devices`."""
    ranges = []
    for part in text.split(","):
        a, dash, b = part.strip().partition("-")
        lo, hi = int(a), int(b if dash else a)
        if hi < lo or lo < 0:
            raise ValueError(part)
        ranges.append((lo, hi))
    return ranges


class OutOfRange(ValueError):
    """A device id beyond the run's (:func:`parse_devices`); ``args[0]`` is the largest."""


def _process_names(ranks: pd.DataFrame, classes: list[int]) -> dict[int, str]:
    names: dict[int, str] = {}
    if ranks.empty:  # a trace written without its ranks table (trace.tables)
        return {c: f"class {c}" for c in classes}
    for c in classes:
        r = ranks[ranks["cls"] == c]
        if r.empty:
            names[c] = f"class {c}"
            continue
        stages = _ranges(r["pp"].unique())
        if len(r) == 1:
            row = r.iloc[0]
            names[c] = (f"device {int(row.device)} (rank {int(row['rank'])}, stage {stages}, "
                        f"x={int(row.x)} y={int(row.y)})")
        else:
            names[c] = (f"class {c}: stage {stages}, {len(r)} ranks {_ranges(r['rank'])} on "
                        f"devices {_ranges(r['device'])}")
    return names


def _lanes(df: pd.DataFrame, base_tid: np.ndarray) -> np.ndarray:
    """tid of every slice: overlapping slices of one (pid, thread) go to extra lanes."""
    tid = base_tid.copy()
    order = np.lexsort((df["t0"].to_numpy(), base_tid, df["pid"].to_numpy()))
    pid, t0, t1 = df["pid"].to_numpy(), df["t0"].to_numpy(), df["t1"].to_numpy()
    lane_end: dict[tuple[int, int], list[float]] = {}
    for i in order:
        ends = lane_end.setdefault((int(pid[i]), int(base_tid[i])), [])
        for k, e in enumerate(ends):
            if e <= t0[i]:
                ends[k] = t1[i]
                tid[i] = base_tid[i] + k * LANE_STRIDE
                break
        else:
            tid[i] = base_tid[i] + len(ends) * LANE_STRIDE
            ends.append(t1[i])
    return tid


def _op_bytes(ops: pd.DataFrame, msgs: pd.DataFrame) -> np.ndarray:
    """Bytes of the phases a class started inside each of its tp / dp ops."""
    out = np.full(len(ops), np.nan)
    if msgs.empty:
        return out
    for kind in ("tp", "dp"):
        m = msgs[msgs["name"].str.startswith(f"{kind}_")]
        sel = np.flatnonzero(ops["kind"].to_numpy() == kind)
        for owner, g in m.groupby("owner"):
            ends = g["t_end"].to_numpy()
            order = np.argsort(ends, kind="stable")
            cum = np.concatenate([[0.0], np.cumsum(g["bytes"].to_numpy()[order])])
            ends = ends[order]
            rows = sel[ops["cls"].to_numpy()[sel] == owner]
            lo = np.searchsorted(ends, ops["t_start"].to_numpy()[rows], side="right")
            hi = np.searchsorted(ends, ops["t_end"].to_numpy()[rows], side="right")
            out[rows] = cum[hi] - cum[lo]
    return out


def _link_counters(td: TraceData, msgs: pd.DataFrame, devices: np.ndarray | None,
                   pid: int) -> pd.DataFrame:
    """Utilization over time of the busiest directed links leaving the selected devices."""
    if not td.has("phase_links") or msgs.empty or "plan" not in msgs:
        return pd.DataFrame(columns=["pid", "track", "t", "value"])
    links = td.table("links")
    cand = links if devices is None else links[links["src"].isin(devices)]
    top = cand[cand["bytes"] > 0].nlargest(TOP_LINKS, "bytes")["link"].astype(int)
    pl = td.table("phase_links")
    pl = pl[pl["link"].isin(set(top))]
    m = msgs[(msgs["plan"] >= 0) & (msgs["t_end"] > msgs["t_start"])]
    j = m[["t_start", "t_end", "plan"]].merge(pl, on="plan")
    if j.empty:
        return pd.DataFrame(columns=["pid", "track", "t", "value"])
    cap = links.set_index("link")["capacity"]
    j["rate"] = j["bytes"] / (j["t_end"] - j["t_start"]) / cap.loc[j["link"]].to_numpy()
    busiest = j.groupby("link")["bytes"].sum().nlargest(TOP_LINKS).index
    rows = []
    ends = links.set_index("link")[["src", "dst"]]
    for lk in busiest:
        g = j[j["link"] == lk]
        t = np.concatenate([g["t_start"].to_numpy(), g["t_end"].to_numpy()])
        d = np.concatenate([g["rate"].to_numpy(), -g["rate"].to_numpy()])
        order = np.lexsort((d, t))
        t, v = t[order], np.maximum(np.cumsum(d[order]), 0.0)
        last = np.r_[t[1:] != t[:-1], True]  # one value per time: the level after all steps
        u, w = ends.loc[lk]
        rows.append(pd.DataFrame({"pid": pid, "track": f"link {int(u)}->{int(w)} utilization",
                                  "t": t[last], "value": v[last]}))
    return pd.concat(rows, ignore_index=True)


def build_timeline(td: TraceData, window: tuple[float, float] | None = None,
                   devices: set[int] | None = None) -> Timeline:
    """The timeline of ``td`` restricted to a time ``window`` (slices overlapping it) and to
    the classes holding any of ``devices``."""
    ops = td.table("ops")
    ranks = td.table("ranks")
    msgs = td.table("messages")
    classes = sorted(int(c) for c in ops["cls"].unique()) if not ops.empty else []
    if devices is not None:
        if ranks.empty:
            raise ValueError("--devices needs the trace's ranks table")
        picked = set(ranks.loc[ranks["device"].isin(devices), "cls"].astype(int))
        classes = [c for c in classes if c in picked]
    stage = (ranks.groupby("cls")["pp"].first() if not ranks.empty
             else pd.Series(dtype=float))
    # --- slices: ops of the class streams, pipeline sends from messages
    o = ops[ops["cls"].isin(classes)]
    kind = o["kind"].to_numpy()
    stream = o["stream"].to_numpy()
    extra = sorted(set(stream) - {"compute", "comm"})
    base = np.where(kind == "tp", TP, np.where(stream == "comm", DP, COMPUTE))
    for k, s in enumerate(extra):
        base[stream == s] = PP + 1 + k
    sl = pd.DataFrame({
        "pid": o["cls"].to_numpy() + 1, "t0": o["t_start"].to_numpy(),
        "t1": o["t_end"].to_numpy(),
        "name": np.where(kind == "compute", o["name"].to_numpy(dtype=str),
                         (o["kind"] + ": " + o["name"]).to_numpy(dtype=str)),
        "cat": kind, "flops": o["flops"].to_numpy(), "bytes": _op_bytes(o, msgs),
        "stage": stage.reindex(o["cls"]).to_numpy(dtype=float),
        "mb": o["mb"].to_numpy(dtype=float), "chunk": o["chunk"].to_numpy(dtype=float),
        "layer": o["layer"].to_numpy(dtype=float),
        "iteration": o["iteration"].to_numpy(dtype=float), "_base": base,
        "_recv": (kind == "recv")})
    for c in ("mb", "chunk", "layer"):
        sl.loc[sl[c] < 0, c] = np.nan
    p2p = msgs[msgs["name"].str.startswith("p2p") & msgs["owner"].isin(classes)] \
        if not msgs.empty else msgs
    if len(p2p):
        dst_cls = (ranks.set_index("device")["cls"].reindex(p2p["dst"]).to_numpy()
                   if not ranks.empty else np.full(len(p2p), -1))
        sp = pd.DataFrame({"pid": p2p["owner"].to_numpy() + 1, "t0": p2p["t_start"].to_numpy(),
                           "t1": p2p["t_end"].to_numpy(), "name": p2p["name"].to_numpy(),
                           "cat": "pipeline", "flops": np.nan,
                           "bytes": p2p["bytes"].to_numpy(),
                           "stage": stage.reindex(p2p["owner"]).to_numpy(dtype=float),
                           "mb": np.nan, "chunk": np.nan, "layer": np.nan, "iteration": np.nan,
                           "_base": PP, "_recv": False, "_dst": dst_cls})
        sl = pd.concat([sl, sp], ignore_index=True)
    if window is not None:
        sl = sl[(sl["t1"] >= window[0]) & (sl["t0"] <= window[1])]
    sl = sl.sort_values(["pid", "t0", "t1"], kind="stable").reset_index(drop=True)
    sl["tid"] = _lanes(sl, sl["_base"].to_numpy(dtype=np.int64))
    flows = _flows(sl, ranks)
    threads = sl.groupby(["pid", "tid"]).size().reset_index()[["pid", "tid"]]
    threads["name"] = [_thread_name(int(t), extra) for t in threads["tid"]]
    names = _process_names(ranks, classes)
    procs = pd.DataFrame({"pid": [c + 1 for c in classes],
                          "name": [names[c] for c in classes], "sort_index": classes})
    counters = _power_counters(td, classes, window)
    net_pid = (max(classes) + 2) if classes else 1
    dev_arr = None if devices is None else np.array(sorted(devices))
    links = _link_counters(td, msgs if window is None else
                           msgs[(msgs["t_end"] >= window[0]) & (msgs["t_start"] <= window[1])],
                           dev_arr, net_pid)
    if len(links):
        counters = pd.concat([counters, links], ignore_index=True)
        procs = pd.concat([procs, pd.DataFrame({"pid": [net_pid], "name": ["network"],
                                                "sort_index": [net_pid]})], ignore_index=True)
    instants = _instants(td, classes, window)
    return Timeline(procs, threads, sl.drop(columns=[c for c in sl if c.startswith("_")]),
                    counters, flows, instants,
                    {"symmetry_used": bool(td.summary.get("symmetry_used")),
                     "classes": len(classes)})


def _thread_name(tid: int, extra: list[str]) -> str:
    base, lane = tid % LANE_STRIDE, tid // LANE_STRIDE
    name = THREAD_NAMES.get(base) or (extra[base - PP - 1] if 0 <= base - PP - 1 < len(extra)
                                      else f"stream {base}")
    return name if lane == 0 else f"{name} #{lane + 1}"


def _flows(sl: pd.DataFrame, ranks: pd.DataFrame) -> pd.DataFrame:
    """Pipeline-send and rendezvous flows as (source slice row, destination slice row)."""
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    names: list[np.ndarray] = []
    pid = sl["pid"].to_numpy()
    base = sl["_base"].to_numpy()
    t0, t1 = sl["t0"].to_numpy(), sl["t1"].to_numpy()
    if "_dst" in sl:
        sends = np.flatnonzero(base == PP)
        to = sl["_dst"].to_numpy()[sends]
        for c in np.unique(to[np.isfinite(to)]):
            rows = np.flatnonzero((base == COMPUTE) & (pid == int(c) + 1))  # sorted by t0
            if not len(rows):
                continue
            mine = sends[to == c]
            arrive = t1[mine]
            recv = rows[sl["_recv"].to_numpy()[rows]]
            by_end = recv[np.argsort(t1[recv], kind="stable")]
            hit = np.zeros(len(mine), dtype=bool)  # the wait that ended at the arrival
            waited = np.zeros(len(mine), dtype=np.int64)
            if len(by_end):
                k = np.minimum(np.searchsorted(t1[by_end], arrive * (1 - 1e-12)),
                               len(by_end) - 1)
                waited = by_end[k]
                hit = np.abs(t1[waited] - arrive) <= 1e-12 * np.maximum(arrive, 1.0)
            nxt = np.searchsorted(t0[rows], arrive)  # else the next block after the arrival
            ok = hit | (nxt < len(rows))
            target = np.where(hit, waited, rows[np.minimum(nxt, len(rows) - 1)])
            src.append(mine[ok])
            dst.append(target[ok])
            names.append(np.full(int(ok.sum()), "pipeline send"))
    if not ranks.empty:
        has_bytes = np.isfinite(sl["bytes"].to_numpy())
        for kind, b, key in (("tp", TP, ["dp", "pp"]), ("dp", DP, ["pp", "tp"])):
            rows_of = {int(p): np.flatnonzero((base == b) & (pid == p))
                       for p in np.unique(pid[base == b])}
            for _, grp in ranks.groupby(key):
                cls = sorted(set(grp["cls"].astype(int)))
                if len(cls) < 2 or any(c + 1 not in rows_of for c in cls):
                    continue
                n = min(len(rows_of[c + 1]) for c in cls)
                idx = np.stack([rows_of[c + 1][:n] for c in cls])  # (classes, instances)
                # the class that arrived last started it (ties: the owner of the phases)
                score = t0[idx] + 0.0
                last = np.lexsort((has_bytes[idx], score), axis=0)[-1]
                first = idx[last, np.arange(n)]
                for j in range(len(cls)):
                    sel = last != j
                    src.append(first[sel])
                    dst.append(idx[j][sel])
                    names.append(np.full(int(sel.sum()), f"{kind} rendezvous"))
    s = np.concatenate(src) if src else np.zeros(0, dtype=np.int64)
    d = np.concatenate(dst) if dst else np.zeros(0, dtype=np.int64)
    nm = np.concatenate(names) if names else np.zeros(0, dtype=object)
    return pd.DataFrame({"id": np.arange(1, len(s) + 1), "src": s.astype(np.int64),
                         "dst": d.astype(np.int64), "name": nm})


def _power_counters(td: TraceData, classes: list[int],
                    window: tuple[float, float] | None) -> pd.DataFrame:
    pw = td.table("power")
    cols = ["pid", "track", "t", "value"]
    if pw.empty:
        return pd.DataFrame(columns=cols)
    pw = pw[pw["cls"].isin(classes)]
    if window is not None:
        pw = pw[(pw["t_end"] >= window[0]) & (pw["t_start"] <= window[1])]
    out = []
    for c, g in pw.groupby("cls"):
        g = g.sort_values("t_start")
        pid = int(c) + 1
        for track, t, v in (("board power (W)", g["t_start"], g["watts"]),
                            ("clock (MHz)", g["t_start"], g["freq_mhz"]),
                            ("temperature (C)", g["t_end"], g["temp_c"])):
            v = v.to_numpy()
            if np.isnan(v).all():  # a device with no thermal or leakage data has no temperature
                continue
            keep = np.r_[True, v[1:] != v[:-1]]  # a counter holds its value until it changes
            out.append(pd.DataFrame({"pid": pid, "track": track, "t": t.to_numpy()[keep],
                                     "value": v[keep]}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def _instants(td: TraceData, classes: list[int],
              window: tuple[float, float] | None) -> pd.DataFrame:
    rows: list[tuple[int, float, str, str]] = []
    f = td.table("faults")
    for r in f.itertuples(index=False):
        rows.append((0, float(r.time_s), f"{r.kind} {r.action} {r.target}",
                     "restart" if r.kind == "restart" else "fault"))
    a = td.table("alerts")
    for r in a.itertuples(index=False):
        rows.append((0, float(r.time_s), f"alert {r.kind} {r.target}: {r.value:.4g} > "
                     f"{r.threshold:.4g}", "alert"))
    pw = td.table("power")
    if not pw.empty:
        for c, g in pw[pw["cls"].isin(classes)].groupby("cls"):
            g = g.sort_values("t_start")
            fr = g["freq_mhz"].to_numpy()
            for i in np.flatnonzero(fr[1:] != fr[:-1]) + 1:
                rows.append((int(c) + 1, float(g["t_start"].iloc[i]),
                             f"clock {fr[i - 1]:g} -> {fr[i]:g} MHz", "dvfs"))
    df = pd.DataFrame(rows, columns=["pid", "t", "name", "cat"])
    if window is not None:
        df = df[(df["t"] >= window[0]) & (df["t"] <= window[1])]
    return df.sort_values("t", kind="stable").reset_index(drop=True)
