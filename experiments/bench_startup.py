"""Start-up: wall time of `twin --help`, `twin check` and `twin run` of the quickstart.

Each command runs as a fresh ``twin`` process, first once to compile the bytecode (into a
temporary ``PYTHONPYCACHEPREFIX``, so a ``PYTHONDONTWRITEBYTECODE`` environment does not make
every start compile the sources), then ``repeats`` times; the table gives the median and
the minimum wall time, and the CPU time of the median run (other processes disturb it less).
Which libraries each command imports is checked by ``tests/test_startup.py``.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def _twin() -> list[str]:
    exe = Path(sys.executable).with_name("twin")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "twin.cli"]


def _time(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(repeats: int = 5) -> pd.DataFrame:
    """One row per command with its target."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pyc")
        quick = str(ROOT / "scenarios/quickstart.yaml")
        cases = [
            ("twin --help", [*_twin(), "--help"], None),
            ("twin check quickstart", [*_twin(), "check", quick], 0.5),
            ("twin run quickstart (trace)", [*_twin(), "run", quick, "-o",
                                             str(Path(tmp) / "q.h5"), "--force"], 1.5),
        ]
        for name, cmd, target in cases:
            _time(cmd, env, Path(tmp))  # compile the bytecode once
            runs = sorted(_time(cmd, env, Path(tmp)) for _ in range(repeats))
            med = runs[len(runs) // 2]
            rows.append({"command": name, "wall_median_s": statistics.median(r[0] for r in runs),
                         "wall_min_s": runs[0][0], "cpu_s": med[1],
                         "target": f"wall <= {target} s" if target else "",
                         "met": (runs[0][0] <= target) if target else None})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    print(run().to_string(index=False, float_format=lambda v: f"{v:.3g}"))
