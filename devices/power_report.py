"""After a run: windowed power telemetry, alerts, power-table columns and summary keys.

Alerts (thresholds from the second brief, all settable in ``power.alerts``), one row per onset:

* ``power``: the cluster power averaged over a telemetry window (``window_s``) exceeds
  ``power_fraction`` (85%) of the design power; recorded at the end of the first window over
  it, re-armed by a window back under it. Cluster power = accelerator boards (integrated
  exactly from their power segments) + links (their total energy spread evenly over the run).
* ``mfu``: MFU stays below ``mfu_threshold`` (30%) for ``mfu_iterations`` consecutive
  iterations; recorded at the end of the iteration completing the streak.
* ``temperature``: a device's die temperature crosses its limit (``temp_limit_c``); recorded
  at the exact crossing time (closed form of the RC model), re-armed below limit - hysteresis.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ALERT_COLUMNS = {"time_s": "float64", "kind": "category", "target": "category",
                 "value": "float64", "threshold": "float64"}
ALERT_UNITS = {"time_s": "s", "value": "W, fraction (mfu) or C", "threshold": "same as value"}


def energy_curve(seg: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Energy (J per device) from 0 to each time in ``x`` of contiguous, time-ordered
    constant-power segments ``seg`` (columns t_start, t_end, watts)."""
    x = np.asarray(x, dtype=float)
    if not len(seg):
        return np.zeros_like(x)
    t0, t1, w = seg[:, 0], seg[:, 1], seg[:, 2]
    cum = np.concatenate([[0.0], np.cumsum(w * (t1 - t0))])
    i = np.minimum(np.searchsorted(t1, x, side="left"), len(t1) - 1)
    inside = np.clip(x - t0[i], 0.0, t1[i] - t0[i])
    return cum[i] + w[i] * inside


def windowed_power(agents: list, makespan: float, window_s: float,
                   extra_w: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Cluster power averaged over consecutive windows: (window end times, W)."""
    if makespan <= 0:
        return np.empty(0), np.empty(0)
    edges = np.arange(0.0, makespan, window_s)
    edges = np.append(edges, makespan)
    if len(edges) > 1 and edges[-1] - edges[-2] <= 1e-12 * makespan:
        edges = np.delete(edges, -2)
    e = np.zeros_like(edges)
    for a in agents:
        e += a.n * energy_curve(a.power_segments(), edges)
    return edges[1:], np.diff(e) / np.diff(edges) + extra_w


def power_alerts(times: np.ndarray, watts: np.ndarray, threshold_w: float) -> list[tuple]:
    """Rising edges of ``watts > threshold_w``."""
    rows, above = [], False
    for t, w in zip(times, watts, strict=True):
        over = w > threshold_w
        if over and not above:
            rows.append((float(t), "power", "cluster", float(w), threshold_w))
        above = over
    return rows


def mfu_alerts(iteration_end: np.ndarray, flops_per_iteration: float, devices: int,
               peak_flops: float, threshold: float, streak: int) -> list[tuple]:
    """Alerts for ``streak`` consecutive iterations with MFU below ``threshold``."""
    ends = np.asarray(iteration_end, dtype=float)
    dt = np.diff(np.concatenate([[0.0], ends]))
    rows, run = [], 0
    for i, (t, d) in enumerate(zip(ends, dt, strict=True)):
        mfu = flops_per_iteration / (d * devices * peak_flops) if d > 0 else math.inf
        run = run + 1 if mfu < threshold else 0
        if run == streak:
            rows.append((float(t), "mfu", f"iteration{i}", float(mfu), threshold))
    return rows


def collect_alerts(setup, agents: list, iteration_end: np.ndarray, flops_per_iteration: float,
                   devices: int, peak_flops: float, makespan: float, link_idle_w: float,
                   network_j: float) -> list[tuple]:
    """Every alert of a run, time-ordered (memoized on ``setup``)."""
    cached = setup.alerts
    if cached is not None:
        return cached
    a = setup.spec.alerts
    extra = network_j / makespan if makespan > 0 else 0.0
    times, watts = windowed_power(agents, makespan, a.window_s, extra)
    limit = a.power_fraction * setup.design_power_w(link_idle_w)
    rows = power_alerts(times, watts, limit)
    rows += mfu_alerts(iteration_end, flops_per_iteration, devices, peak_flops,
                       a.mfu_threshold, a.mfu_iterations)
    rows += setup.alert_rows
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    setup.alerts = rows
    return rows


def power_columns(agents: list) -> dict[str, Any]:
    """Columns of the ``power`` trace table, all agents (rows grouped by class)."""
    cols: dict[str, list] = {k: [] for k in ("cls", "t_start", "t_end", "watts", "freq_mhz",
                                             "volts", "temp_c")}
    states: list[np.ndarray] = []
    for a in agents:
        seg = a.power_segments()
        if not len(seg):
            continue
        ps = seg[:, 4].astype(np.int64)
        cols["cls"].append(np.full(len(seg), a.cls, dtype=np.int32))
        cols["t_start"].append(seg[:, 0])
        cols["t_end"].append(seg[:, 1])
        cols["watts"].append(seg[:, 2])
        cols["freq_mhz"].append(np.asarray(a.dev.mhz)[ps])
        cols["volts"].append(np.asarray(a.dev.volts)[ps])
        cols["temp_c"].append(seg[:, 5] if a.has_temperature else np.full(len(seg), np.nan))
        names = np.asarray(a.state_names(), dtype=object)
        states.append(names[seg[:, 3].astype(np.int64)])
    out: dict[str, Any] = {k: (np.concatenate(v) if v else np.empty(0)) for k, v in cols.items()}
    out["state"] = list(np.concatenate(states)) if states else []
    return out


def telemetry_columns(setup) -> dict[str, np.ndarray] | None:
    """Columns of the ``telemetry`` table (power manager samples), or None without a manager."""
    m = setup.manager
    if m is None:
        return None
    s = np.asarray(m.samples, dtype=float).reshape(-1, 4)
    return {"time_s": s[:, 0], "power_w": s[:, 1], "reading_w": s[:, 2], "cap_mhz": s[:, 3]}


def _finite(x: float) -> float | None:
    """``None`` for an unknown (NaN) value: devices whose clock is not published."""
    return None if math.isnan(x) else x


def power_summary(setup, agents: list, breakdown: dict[str, float], energy: float,
                  executed_flops: float, alerts: list[tuple]) -> dict[str, Any]:
    """Power-related summary keys (see README, "What a run writes")."""
    n_dev = sum(a.n for a in agents)
    busy = sum(a.stats.compute_s * a.n for a in agents)
    mhz_s = sum(a.stats.busy_mhz_s * a.n for a in agents)
    active = breakdown["compute"] + breakdown["memory"] + breakdown["network"]
    temps = [a.stats.max_temp_c for a in agents if a.thermal is not None]
    by_kind = {"power": 0, "mfu": 0, "temperature": 0}
    for r in alerts:
        by_kind[r[1]] += 1
    out: dict[str, Any] = {
        "energy_share": {k: (v / energy if energy > 0 else 0.0) for k, v in breakdown.items()},
        "comm_energy_share": breakdown["network"] / active if active > 0 else 0.0,
        "energy_per_flop_j": energy / executed_flops if executed_flops > 0 else 0.0,
        "avg_compute_frequency_mhz": _finite(mhz_s / busy if busy > 0 else 0.0),
        "stage_frequency_mhz": [_finite(setup.dev.mhz[setup.stage_ps[s]])
                                for s in sorted(setup.stage_ps)],
        "max_temperature_c": max(temps) if temps else None,
        "throttle_steps": int(sum(a.stats.throttle_steps * a.n for a in agents)),
        "dvfs_transitions": int(sum(a.stats.transitions * a.n for a in agents)),
        "dvfs_stall_per_device_s": sum(a.stats.stall_s * a.n for a in agents) / n_dev,
        "dvfs_transition_energy_j": sum(a.stats.transition_j * a.n for a in agents),
        "power_cap_w": setup.spec.cap_w,
        "cap_stretch_per_device_s": sum(a.stats.cap_stretch_s * a.n for a in agents) / n_dev,
        "alerts": len(alerts),
        "alerts_by_kind": by_kind,
    }
    if setup.plan is not None:
        out["dvfs_plan"] = setup.plan.as_dict()
    if setup.manager is not None:
        m = setup.manager
        s = np.asarray(m.samples, dtype=float).reshape(-1, 4)
        out["power_manager"] = {
            "budget_w": m.budget_w, "telemetry_delay_s": m.delay_s,
            "peak_sampled_power_w": float(s[:, 1].max()) if len(s) else 0.0,
            "min_cap_mhz": float(s[:, 3].min()) if len(s) else m.cap_mhz,
            "final_cap_mhz": m.cap_mhz}
    return out
