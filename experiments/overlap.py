"""Compute-communication overlap efficiency vs concurrent streams: saturation and collapse.

``python -m experiments.overlap -o DIR [--fast]`` writes ``DIR/overlap.csv`` and
``DIR/overlap.png``.

Question (first brief): when k communication transfers run while a compute op streams
through HBM, their DMA queues at the same controller. Does the overlap degrade gently
("saturate") as k grows, or collapse, as M/G/1 waits with a Pareto service tail alpha <= 2
suggest? The experiment uses the twin's own memory models (``devices.memory``), built exactly
as a run builds them from ``memory:`` settings, for an H100 with 4 NVLink4 links per grid
edge: one transfer is a DMA stream of 163 GB/s (``dma_load`` = 0.049 of the 3.35 TB/s peak).

Definition. The *overlap efficiency* of an op next to k transfers is

    eta(k) = T_ideal / T_sim = 1 / E[s(k)],

where ``T_ideal`` is the op's memory time when the communication is perfectly overlapped
(it runs as if alone: no interference at HBM) and ``T_sim = T_ideal x E[s(k)]`` its expected
simulated memory time, ``s`` the slowdown of ``devices.memory`` (drawn per op in a run, here
averaged over ``batches`` simulated batches). ``eta = 1``: the transfers are free; ``eta =
1/2``: overlapping them doubles the op's memory time. The communication itself is taken as
link-bound (not slowed by HBM) and shorter than the op. Also written: ``1 / p99(s)``, the
efficiency of the slowest 1% of ops.

Panels (columns of the CSV: ``panel``):

* ``bandwidth``: a streaming op (``memory.bound: bandwidth``, op load = the device's
  ``memory_efficiency`` = 0.9 of peak): its memory time is the completion of its last request.
  Queue model for exponential, lognormal (cov 2), Pareto alpha 2.5 and 1.8 service, and the
  FR-FCFS HBM3 controller. The *saturation point* is ``k_sat = (1 - op_load) / dma_load``
  (offered load = peak; 2.05 streams here). Below it eta stays near 1; above it the server is
  always busy and the op's memory phase stretches to the total work: ``eta = 1 / rho`` for
  every service distribution (work conservation). That is saturation, not collapse.
* ``latency``: a latency-bound op (``memory.bound: latency``: fixed requests in flight, so
  by Little's law its rate is ``L / E[sojourn]``), at half the peak bandwidth. eta falls like
  ``(1 - rho_k) / (1 - rho_0)`` for exponential service (M/M/1) and further for heavier tails.
  For Pareto alpha <= 2 the stationary mean sojourn is infinite at every load, so eta has no
  limit: the finite batches give a number that keeps falling with batch length.
* ``window``: why the latency numbers for alpha 1.8 are not limits. The mean wait of the
  latency-bound op's requests at ``k = 1``, in units of the mean service time, over
  stationary runs of growing length (mean of ``replications`` runs), next to the
  Pollaczek-Khinchine limit (plotted: the median over the runs of each run's sample mean, a
  robust summary; the CSV also has their mean, which single huge services dominate): the
  finite-variance services settle on their limit, Pareto alpha 1.8 keeps growing (its limit
  is infinite). Note that eta, a *ratio* of two such
  means, stays finite and noisy: relative to running alone, a heavy tail can at most raise
  the contended/alone ratio of the queueing terms to ``rho_k / (1 - rho_k) x (1 - rho_0) /
  rho_0``.

Every point carries twin.kernel.queueing's verdict on its stationary queue (``status``,
``converged``, ``variance_infinite``, ``unstable`` for rho >= 1). In the plot, converged
points are filled, non-converged hollow, and unstable points (rho >= 1) are marked with x.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from devices.memory import MemoryContention, MemorySpec, QueueContention, build_memory_model
from devices.spec import DeviceSpec, LinkSpec
from twin.catalogs import resolve
from twin.kernel.queueing import mg1_mean_wait

#: (label, ``memory.service`` settings) of the queue-model curves.
SERVICES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("exponential", {"dist": "exponential"}),
    ("lognormal cov 2", {"dist": "lognormal", "cov": 2.0}),
    ("pareto alpha 2.5", {"dist": "pareto", "alpha": 2.5}),
    ("pareto alpha 1.8", {"dist": "pareto", "alpha": 1.8}),
)
FRFCFS_LABEL = "FR-FCFS controller"

COLUMNS = ("panel", "model", "service", "bound", "op_load", "dma_load", "k", "rho",
           "saturation_streams", "n_requests", "batches", "slowdown_mean", "slowdown_se",
           "slowdown_p99", "efficiency", "efficiency_p99", "status", "converged",
           "variance_infinite", "unstable", "mean_wait_s", "tail_index", "replications",
           "wait_over_service", "wait_over_service_median", "theory_wait_over_service")


@dataclass(frozen=True)
class Settings:
    """What to simulate (defaults: the full experiment).

    Attributes:
        device, link, links_per_edge: catalog names and count, as in ``cluster``.
        max_streams: largest k.
        requests: op requests per batch (``memory.requests_per_batch``).
        batches: batches per point (``memory.batches``).
        latency_op_load: load of the latency-bound op (fraction of peak).
        diagnostic_requests: requests of each level's stationary diagnostic run.
        window_sizes: run lengths of the ``window`` panel (requests).
        window_k: k of the ``window`` panel.
        replications: runs per point of the ``window`` panel.
        frfcfs: include the FR-FCFS curve (slowest part).
        seed: root seed.
    """

    device: str = "h100-sxm"
    link: str = "nvlink4"
    links_per_edge: int = 4
    max_streams: int = 16
    requests: int = 4096
    batches: int = 32
    latency_op_load: float = 0.5
    diagnostic_requests: int = 1 << 18
    window_sizes: tuple[int, ...] = (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20)
    window_k: int = 1
    replications: int = 8
    frfcfs: bool = True
    seed: int = 1


#: A small variant for tests (a few seconds).
FAST = Settings(max_streams=6, requests=4096, batches=16, diagnostic_requests=1 << 14,
                window_sizes=(1 << 10, 1 << 12, 1 << 14), replications=4, frfcfs=False)


def _specs(s: Settings) -> tuple[DeviceSpec, LinkSpec]:
    dev, _ = resolve("devices", s.device, "cluster.device")
    link, _ = resolve("links", s.link, "cluster.link")
    return DeviceSpec.model_validate({"name": s.device, **dev}), LinkSpec.model_validate(
        {"name": s.link, **link})


def model_for(s: Settings, model: str, bound: str, service: dict[str, Any] | None,
              op_load: float | None, requests: int | None = None) -> MemoryContention:
    """The twin's memory model for these settings (as ``build_memory_model`` builds it)."""
    dev, link = _specs(s)
    spec = MemorySpec.model_validate({
        "model": model, "bound": bound, "service": service or {}, "op": {"load": op_load},
        "requests_per_batch": requests or s.requests, "batches": s.batches,
        "max_streams": s.max_streams})
    mm = build_memory_model(spec, dev, link, s.links_per_edge, np.random.default_rng(s.seed))
    if hasattr(mm, "diagnostic_requests"):
        mm.diagnostic_requests = s.diagnostic_requests
    return mm


def _row(panel: str, label: str, mm: MemoryContention, n: int, k: int) -> dict[str, Any]:
    tab = mm.table(n, k)
    lv = mm.level(k)
    mean, p99 = tab.mean, tab.quantile(0.99)
    return {"panel": panel, "model": mm.name, "service": label, "bound": mm.bound,
            "op_load": mm.op_load, "dma_load": mm.dma_load, "k": k, "rho": mm.rho(k),
            "saturation_streams": mm.saturation_streams, "n_requests": n,
            "batches": tab.samples.size, "slowdown_mean": mean,
            "slowdown_se": tab.standard_error, "slowdown_p99": p99,
            "efficiency": 1.0 / mean, "efficiency_p99": 1.0 / p99, "status": lv.status,
            "converged": lv.converged, "variance_infinite": lv.variance_infinite,
            "unstable": lv.unstable, "mean_wait_s": lv.mean_wait_s,
            "tail_index": lv.tail_index if lv.tail_index is not None else math.nan}


def _window_row(label: str, mm: QueueContention, n: int, k: int,
                replications: int) -> dict[str, Any]:
    waits = [mm.mean_op_wait(k, n, r) for r in range(replications)]
    sbar = mm.service_mean_s
    lam = mm.op_rate + k * mm.dma_rate
    theory = mg1_mean_wait(lam, sbar, mm.service.second_moment)
    lv = mm.level(k)
    return {"panel": "window", "model": mm.name, "service": label, "bound": mm.bound,
            "op_load": mm.op_load, "dma_load": mm.dma_load, "k": k, "rho": mm.rho(k),
            "saturation_streams": mm.saturation_streams, "n_requests": n,
            "status": lv.status, "converged": lv.converged,
            "variance_infinite": lv.variance_infinite, "unstable": lv.unstable,
            "mean_wait_s": float(np.mean(waits)),
            "tail_index": lv.tail_index if lv.tail_index is not None else math.nan,
            "replications": replications, "wait_over_service": float(np.mean(waits)) / sbar,
            "wait_over_service_median": float(np.median(waits)) / sbar,
            "theory_wait_over_service": theory / sbar}


def overlap_table(s: Settings = Settings()) -> pd.DataFrame:
    """All panels as one table (columns :data:`COLUMNS`)."""
    rows: list[dict[str, Any]] = []
    ks = range(s.max_streams + 1)
    for label, svc in SERVICES:
        bw = model_for(s, "queue", "bandwidth", svc, None)
        rows += [_row("bandwidth", label, bw, s.requests, k) for k in ks]
        lat = model_for(s, "queue", "latency", svc, s.latency_op_load)
        rows += [_row("latency", label, lat, s.requests, k) for k in ks]
        rows += [_window_row(label, lat, n, s.window_k, s.replications)
                 for n in s.window_sizes]
    if s.frfcfs:
        fr = model_for(s, "frfcfs", "bandwidth", None, None)
        rows += [_row("bandwidth", FRFCFS_LABEL, fr, s.requests, k) for k in ks]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def plot(df: pd.DataFrame, path: Path) -> Path:
    """Three panels; hollow markers = not converged, x = unstable (rho >= 1)."""
    fig = Figure(figsize=(16, 5))
    axes = fig.subplots(1, 3)
    colors = dict(zip([lbl for lbl, _ in SERVICES] + [FRFCFS_LABEL],
                      ["C0", "C1", "C2", "C3", "k"], strict=True))
    for ax, panel in zip(axes, ("bandwidth", "latency", "window"), strict=True):
        part = df[df.panel == panel]
        if not len(part):
            continue
        x, y = (("n_requests", "wait_over_service_median") if panel == "window"
                else ("k", "efficiency"))
        for label, g in part.groupby("service", sort=False):
            c = colors[label]
            ax.plot(g[x], g[y], "-", color=c, label=label, lw=1.5)
            ok = g[g.converged & ~g.unstable]
            bad = g[~g.converged & ~g.unstable]
            uns = g[g.unstable]
            ax.plot(ok[x], ok[y], "o", color=c, ms=5)
            ax.plot(bad[x], bad[y], "o", mfc="none", mec=c, ms=6)
            ax.plot(uns[x], uns[y], "x", color=c, ms=6)
            if panel == "window":
                th = float(g.theory_wait_over_service.iloc[0])
                if math.isfinite(th):
                    ax.axhline(th, color=c, ls=":", lw=1)
        r = part.iloc[0]
        if panel == "window":
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("requests simulated (one stationary run)")
            ax.set_ylabel("mean wait of the op's requests / mean service time\n(median of "
                          f"{int(r.replications)} runs)")
            ax.set_title(f"latency-bound op, k = {int(r.k)} (rho = {r.rho:.2f}): mean wait,\n"
                         "P-K limit dotted", fontsize=10)
            continue
        ksat = float(r.saturation_streams)
        ax.axvline(ksat, ls="--", color="grey", lw=1)
        ax.text(ksat, 1.02, f" k_sat = {ksat:.2f} (rho = 1)", color="grey", fontsize=8)
        ax.set_xlabel("concurrent communication streams k")
        ax.set_ylabel("overlap efficiency  1 / E[slowdown]")
        ax.set_ylim(0, 1.08)
        kind = "streaming op, bandwidth-bound" if panel == "bandwidth" else \
            "latency-bound op (Little's law)"
        ax.set_title(f"{kind}: op load {r.op_load:.2f}, {r.dma_load:.3f} per stream",
                     fontsize=10)
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower left")
    fig.text(0.5, 0.005, "filled: converged; hollow: not converged (infinite variance, tail "
             "uncertain or mean not settled); x: unstable (rho >= 1)", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    p = argparse.ArgumentParser(prog="python -m experiments.overlap",
                                description=__doc__.split("\n")[0])
    p.add_argument("-o", "--output", required=True, help="directory for the CSV and the PNG")
    p.add_argument("--fast", action="store_true", help="small variant (seconds)")
    p.add_argument("--max-streams", type=int, help="largest k")
    p.add_argument("--seed", type=int, help="root seed")
    args = p.parse_args(argv)
    s = FAST if args.fast else Settings()
    if args.max_streams is not None:
        s = replace(s, max_streams=args.max_streams)
    if args.seed is not None:
        s = replace(s, seed=args.seed)
    df = overlap_table(s)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    csv = out / "overlap.csv"
    df.to_csv(csv, index=False)
    png = plot(df, out / "overlap.png")
    for panel in ("bandwidth", "latency"):
        part = df[df.panel == panel]
        print(f"{panel}: op load {part.op_load.iloc[0]:.2f}, {part.dma_load.iloc[0]:.4f} "
              f"per stream, saturation at k = {part.saturation_streams.iloc[0]:.2f}")
        for label, g in part.groupby("service", sort=False):
            cells = " ".join(f"{e:5.3f}{'' if c else '*'}" for e, c in
                             zip(g.efficiency, g.converged & ~g.unstable, strict=True))
            print(f"  {label:20s} {cells}")
    print("(* = not converged or rho >= 1)")
    part = df[df.panel == "window"]
    if len(part):
        print(f"mean wait / mean service, median (mean) of runs, vs requests simulated "
              f"(k = {int(part.k.iloc[0])}, "
              f"rho = {part.rho.iloc[0]:.3f}): " + " ".join(str(n) for n in
                                                         part.n_requests.unique()))
        for label, g in part.groupby("service", sort=False):
            cells = " ".join(f"{v:6.3f} ({m:.3g})" for v, m in
                             zip(g.wait_over_service_median, g.wait_over_service, strict=True))
            print(f"  {label:20s} {cells}   limit {g.theory_wait_over_service.iloc[0]:.3f}")
    print(f"csv: {csv}\npng: {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
