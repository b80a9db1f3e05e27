"""Pictures of a trace, written as PNG.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot), so importing this
module never changes the user's matplotlib backend and no screen is needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from twin.trace import read_attrs, read_table

KIND_COLORS = {"compute": "#4C72B0", "tp": "#DD8452", "recv": "#C44E52", "dp_wait": "#8172B3",
               "dp": "#55A868"}


def timeline(trace: str | Path, out: str | Path, max_rows: int = 64) -> Path:
    """Gantt chart of ops per rank class (compute stream above, comm stream below)."""
    ops = read_table(trace, "ops")
    attrs = read_attrs(trace)
    classes = sorted(ops["cls"].unique())[:max_rows]
    fig_h = 1.2 + 0.45 * len(classes)
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
    ax.set_yticklabels([f"class {c}" for c in classes])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    summ = attrs.get("summary", {})
    ax.set_title(f"{Path(trace).stem}: iteration {summ.get('iteration_time_s', 0):.4g} s, "
                 f"MFU {summ.get('mfu', 0):.1%}")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in KIND_COLORS.items()],
              loc="upper right", fontsize=8, ncol=len(KIND_COLORS))
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
