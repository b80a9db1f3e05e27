"""``twin export``: a trace as a timeline for the Perfetto UI / chrome://tracing.

``export_trace(trace, out, fmt)`` reads the trace (``twin.reading``), builds the format-neutral
timeline (:mod:`twin.export.timeline`) and writes it as Perfetto protobuf
(:mod:`twin.export.perfetto`, via the ``perfetto`` package's trace builder) or as Chrome Trace
Event Format JSON (:mod:`twin.export.chrome`, gzip for ``.gz``). The format follows the file
name (``.pftrace`` / ``.perfetto-trace`` / ``.pb``: perfetto; ``.json`` / ``.json.gz``:
chrome) unless given.

Large runs: ``window`` keeps the slices overlapping a time window, ``devices`` the rank
classes holding any of the given devices; and the file is kept under ``max_mb`` (estimated
from the event count and the format's bytes per event): when the run has more, the timeline is
cut at the time where the budget runs out, which the result (and the file's metadata) says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from twin.kernel.errors import Problem, ScenarioError

if TYPE_CHECKING:  # pandas comes with the timeline: imported by export_trace, not by the CLI
    from twin.export.timeline import Timeline

FORMATS = ("perfetto", "chrome")
#: Estimated bytes per event, to keep files under a size a browser opens.
BYTES_PER_EVENT = {"chrome": 190.0, "perfetto": 70.0}
DEFAULT_MAX_MB = 256.0


@dataclass(frozen=True)
class ExportResult:
    """What was written."""

    path: Path
    format: str
    slices: int
    flows: int
    counters: int
    instants: int
    cut_at_s: float | None  # None: complete


def format_for(path: Path, fmt: str | None) -> str:
    """The format to write: ``fmt`` or the one the file name implies."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ScenarioError([Problem("--format", "unknown format", fmt, ", ".join(FORMATS))])
        return fmt
    name = path.name.lower()
    if name.endswith((".json", ".json.gz")):
        return "chrome"
    if name.endswith((".pftrace", ".perfetto-trace", ".pb")):
        return "perfetto"
    raise ScenarioError([Problem("-o", "cannot tell the format from the file name", str(path),
                                 ".pftrace / .perfetto-trace / .pb (perfetto) or .json / "
                                 ".json.gz (chrome), or give --format")])


def parse_window(text: str | None) -> tuple[float, float] | None:
    """``"T0:T1"`` in seconds (either side may be empty) -> (t0, t1)."""
    if text is None:
        return None
    a, sep, b = text.partition(":")
    try:
        lo = float(a) if a.strip() else 0.0
        hi = float(b) if b.strip() else float("inf")
    except ValueError:
        lo, hi = float("nan"), float("nan")
    if not sep or not (hi > lo >= 0):
        raise ScenarioError([Problem("--window", "not a time window in seconds", text,
                                     "T0:T1 with 0 <= T0 < T1, e.g. 0.1:0.25 or :0.5")])
    return lo, hi


def _truncate(tl: Timeline, max_events: int) -> tuple[Timeline, float | None]:
    """Keep the events that start before the time at which ``max_events`` are reached."""
    times = np.concatenate([tl.slices["t0"].to_numpy(dtype=float),
                            tl.counters["t"].to_numpy(dtype=float),
                            tl.instants["t"].to_numpy(dtype=float)])
    if len(times) + 2 * len(tl.flows) <= max_events:
        return tl, None
    cut = float(np.sort(times)[max(max_events - 2 * len(tl.flows), 1) - 1])
    keep = tl.slices["t0"] < cut
    kept = set(np.flatnonzero(keep.to_numpy()))
    flows = tl.flows[tl.flows["src"].isin(kept) & tl.flows["dst"].isin(kept)]
    return replace(tl, slices=tl.slices[keep], counters=tl.counters[tl.counters["t"] < cut],
                   instants=tl.instants[tl.instants["t"] < cut], flows=flows), cut


def export_trace(trace: str | Path, out: str | Path, fmt: str | None = None,
                 window: str | None = None, devices: str | None = None,
                 max_mb: float = DEFAULT_MAX_MB) -> ExportResult:
    """Write the timeline of ``trace`` to ``out`` (see the module doc)."""
    from twin.export.timeline import OutOfRange, build_timeline, device_ranges, parse_devices
    from twin.reading import TraceData

    out = Path(out)
    fmt = format_for(out, fmt)
    win = parse_window(window)
    try:
        if devices is not None:
            device_ranges(devices)  # the syntax, before the trace is opened
    except ValueError:
        raise ScenarioError([Problem("--devices", "not a device list", devices,
                                     "ids and closed ranges, e.g. 0-3,8")]) from None
    if not 0 < max_mb < math.inf:  # (NaN fails too)
        raise ScenarioError([Problem("--max-mb", "must be a positive finite number", max_mb,
                                     "a number of MB > 0, e.g. 256")])
    td = TraceData(trace, need=("ops",))
    n_dev = int(td.summary.get("devices", 0))
    try:
        devs = parse_devices(devices, n_dev)
    except OutOfRange:
        raise ScenarioError([Problem(
            "--devices", f"the run has devices 0-{n_dev - 1}" if n_dev else
            "the trace does not say how many devices the run had", devices,
            f"ids below {n_dev}" if n_dev else "a trace written by twin run")]) from None
    try:
        tl = build_timeline(td, win, devs)
    except ValueError as exc:
        raise ScenarioError(f"{td.path}: {exc}") from None
    tl, cut = _truncate(tl, int(max_mb * 1e6 / BYTES_PER_EVENT[fmt]))
    other = {"source": str(td.path), "twin_version": td.attrs.get("twin_version"),
             "seed": td.attrs.get("seed"), "symmetry_used": tl.meta["symmetry_used"],
             "window_s": [w if np.isfinite(w) else None for w in win] if win else None,
             "devices": devices,
             "cut_at_s": cut, "time_unit_of_ts": "us"}
    if fmt == "chrome":
        from twin.export.chrome import write_chrome

        write_chrome(tl, out, other)
    else:
        from twin.export.perfetto import write_perfetto

        write_perfetto(tl, out)
    return ExportResult(out, fmt, len(tl.slices), len(tl.flows), len(tl.counters),
                        len(tl.instants), cut)
