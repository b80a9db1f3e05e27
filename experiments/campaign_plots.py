"""Plots of a fault campaign (matplotlib ``Figure`` objects, no pyplot state).

* :func:`ccdf_iteration_time`: complementary CDF ``P[T > t]`` of the per-iteration times pooled
  over runs, with faults and without (the baseline variant), one line style per grid point,
  log-log: tails show as curves that reach further right.
* :func:`energy_vs_availability`: one point per run, energy against availability.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

COLORS = {"faults": "tab:red", "baseline": "tab:blue"}


def ccdf(values) -> tuple[np.ndarray, np.ndarray]:
    """``(t, P[T > t])`` steps of the empirical CCDF (P at each sorted value, right-open)."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    return x, 1.0 - np.arange(1, n + 1) / n


def ccdf_iteration_time(iterations, path: str | Path) -> Path:
    """Write the CCDF of iteration time per variant to ``path`` (PNG)."""
    fig = Figure(figsize=(6.4, 4.4), dpi=110)
    ax = fig.add_subplot()
    points = sorted(set(iterations["point"]))
    styles = ["-", "--", ":", "-."]
    for (point, variant), g in iterations.groupby(["point", "variant"], sort=True):
        t, p = ccdf(g["iteration_time_s"])
        keep = p > 0
        where = f"point {point}, " if len(points) > 1 else ""
        ax.step(t[keep], p[keep], where="post", color=COLORS.get(variant),
                linestyle=styles[points.index(point) % len(styles)],
                label=f"{variant} ({where}{len(t)} iterations, {g['run_id'].nunique()} runs)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("iteration time, s")
    ax.set_ylabel("P[iteration time > t]")
    ax.set_title("Iteration time, with and without faults")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return Path(path)


def energy_vs_availability(results, path: str | Path) -> Path:
    """Write energy (J) against availability, one point per run, to ``path`` (PNG)."""
    fig = Figure(figsize=(6.4, 4.4), dpi=110)
    ax = fig.add_subplot()
    for variant, g in results.groupby("variant", sort=True):
        ax.scatter(g["availability"], g["energy_j"], s=18, alpha=0.8,
                   color=COLORS.get(variant), label=f"{variant} ({len(g)} runs)")
    ax.set_xlabel("availability (1 - downtime / makespan)")
    ax.set_ylabel("energy of the run, J")
    ax.set_title("Energy vs availability")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return Path(path)
