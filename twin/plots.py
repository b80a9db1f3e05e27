"""Pictures of a trace, written as PNG.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot), so importing this
module never changes the user's matplotlib backend and no screen is needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from twin.kernel.trace import read_attrs, read_table

KIND_COLORS = {"compute": "#4C72B0", "tp": "#DD8452", "recv": "#C44E52", "dp_wait": "#8172B3",
               "dp": "#55A868", "dvfs": "#937860", "checkpoint": "#8C8C8C",
               "data_wait": "#DA8BC3"}
KIND_LABELS = {"compute": "compute", "tp": "tensor-parallel collective",
               "recv": "pipeline wait", "dp_wait": "gradient all-reduce wait",
               "dp": "gradient all-reduce (comm stream)", "dvfs": "DVFS stall",
               "checkpoint": "checkpoint", "data_wait": "input wait (data path)"}


def _class_labels(trace: str | Path, classes: list[int]) -> list[str]:
    """``class c: stage p, n ranks`` from the ``ranks`` table when the trace has it."""
    try:
        ranks = read_table(trace, "ranks")
    except KeyError:
        return [f"class {c}" for c in classes]
    out = []
    for c in classes:
        r = ranks[ranks["cls"] == c]
        stages = sorted(r["pp"].unique())
        stage = f"stage {stages[0]}" if len(stages) == 1 else "stages " + ",".join(
            map(str, stages))
        out.append(f"class {c}: {stage}, {len(r)} rank{'s' if len(r) > 1 else ''}")
    return out


def timeline(trace: str | Path, out: str | Path, max_rows: int = 64) -> Path:
    """Gantt chart of ops per rank class (compute stream above, comm stream below)."""
    ops = read_table(trace, "ops")
    attrs = read_attrs(trace)
    classes = sorted(ops["cls"].unique())[:max_rows]
    fig_h = 2.0 + 0.45 * len(classes)
    fig = Figure(figsize=(12, fig_h))
    ax = fig.add_subplot()
    for row, c in enumerate(classes):
        sel = ops[ops["cls"] == c]
        for kind, color in KIND_COLORS.items():
            k = sel[sel["kind"] == kind]
            if k.empty:
                continue
            y = row + (0.25 if k["stream"].iloc[0] == "comm" else -0.1)
            h = 0.3 if k["stream"].iloc[0] == "comm" else 0.5
            ax.broken_barh(list(zip(k["t_start"], k["t_end"] - k["t_start"], strict=True)),
                           (y - h / 2, h), facecolors=color, linewidth=0)
    ax.set_yticks(np.arange(len(classes)))
    ax.set_yticklabels(_class_labels(trace, classes), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    summ = attrs.get("summary", {})
    ax.set_title(f"{Path(trace).stem}: iteration {summ.get('iteration_time_s', 0):.4g} s, "
                 f"MFU {summ.get('mfu', 0):.1%}")
    present = [k for k in KIND_COLORS if (ops["kind"] == k).any()]
    fig.legend(handles=[Patch(color=KIND_COLORS[k], label=KIND_LABELS[k]) for k in present],
               loc="lower center", fontsize=8, ncol=min(len(present), 4), frameon=False)
    fig.tight_layout(rect=(0, 0.45 / fig_h, 1, 1))
    from twin.outputs import atomic_write

    return atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
