"""Trace benchmark: rows written per second, and how much tracing slows a run.

* Writer throughput: 3e6 rows of an 11-column table (the shape of ``ops``: int32 and float64
  columns, categories stored as codes) written in blocks, gzip; target >= 3 M rows/s.
* Recording throughput: the path agents use (one ``append`` per row, strings turned into
  category codes at each block flush), for information.
* Overhead: the e2e benchmark scenario run with every table on and with tracing off;
  target <= 10%.
CPU seconds are used throughout (wall time is at the mercy of other processes).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pandas as pd

from twin.kernel.trace import TraceWriter
from twin.recording import OPS_COLUMNS

ROWS = 3_000_000


def block_throughput(rows: int = ROWS) -> dict:
    """Rows per CPU second of writing ``rows`` rows given as whole columns."""
    import numpy as np

    cols = {c: (np.arange(rows) % 7).astype(np.int32) if d in ("int32", "category")
            else np.arange(rows) * 1e-6 for c, d in OPS_COLUMNS.items()}
    spec = {c: ("float64" if d == "float64" else "int32") for c, d in OPS_COLUMNS.items()}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.process_time()
        with TraceWriter(Path(d) / "b.h5") as w:
            w.table("ops", spec).extend(cols)
            w.finish({})
        dt = time.process_time() - t0
    return {"rows": rows, "seconds": dt, "rows_per_s": rows / dt, "target": ">= 3e6 rows/s",
            "met": rows / dt >= 3e6}


def write_throughput(rows: int = 1_000_000) -> dict:
    """Rows per CPU second of appending ``rows`` op-like rows one by one and finishing."""
    names = ["compute", "tp", "recv", "dp_wait"]
    blocks = ["attn_fwd", "mlp_fwd", "attn_bwd", "mlp_bwd"]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.h5"
        t0 = time.process_time()
        with TraceWriter(path) as w:
            t = w.table("ops", OPS_COLUMNS)
            app = t.append
            for i in range(rows):
                app(i & 7, 0, "compute", names[i & 3], blocks[i & 3], i & 63, 0, i & 15,
                    i * 1e-6, i * 1e-6 + 5e-7, 1e9)
            w.finish({})
        dt = time.process_time() - t0
        size = path.stat().st_size
    return {"rows": rows, "seconds": dt, "rows_per_s": rows / dt, "file_mb": size / 1e6,
            "target": "", "met": None}


def overhead(devices: int = 64) -> dict:
    """Wall time of the e2e benchmark scenario with all tables vs tracing off."""
    from experiments.bench_e2e import scenario_dict
    from twin.runner import run
    from twin.scenario import load_scenario

    times = {}
    with tempfile.TemporaryDirectory() as d:
        for traced in (False, True):
            raw = scenario_dict(devices, trace=traced)
            raw["trace"]["path"] = str(Path(d) / "o.h5")
            scen = load_scenario(raw)
            best = float("inf")
            for _ in range(2):
                t0 = time.process_time()
                run(scen)
                best = min(best, time.process_time() - t0)
            times[traced] = best
    ratio = times[True] / times[False] - 1
    return {"untraced_cpu_s": times[False], "traced_cpu_s": times[True], "overhead": ratio,
            "target": "<= 10%", "met": ratio <= 0.10}


def run() -> pd.DataFrame:
    """The three measurements as a table."""
    k = block_throughput()
    a = write_throughput()
    b = overhead()
    return pd.DataFrame([{"measure": "writer rows/s (blocks)", "value": k["rows_per_s"],
                          "detail": f"{k['rows']} rows, 11 columns, gzip, "
                                    f"{k['seconds']:.2f} s CPU", "target": k["target"],
                          "met": k["met"]},
                         {"measure": "recording rows/s (append per row)",
                          "value": a["rows_per_s"],
                          "detail": f"{a['rows']} rows in {a['seconds']:.2f} s CPU, "
                                    f"{a['file_mb']:.1f} MB", "target": a["target"],
                          "met": a["met"]},
                         {"measure": "tracing overhead", "value": b["overhead"],
                          "detail": f"{b['traced_cpu_s']:.2f} s vs {b['untraced_cpu_s']:.2f} s "
                                    "CPU (GPT-3 175B, 64 devices)",
                          "target": b["target"], "met": b["met"]}])


def main() -> None:
    """Print the table."""
    with pd.option_context("display.width", 160, "display.max_colwidth", 80):
        print(run().to_string(index=False))


if __name__ == "__main__":
    main()
