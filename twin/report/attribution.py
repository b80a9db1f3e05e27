"""Where each iteration's time went: critical-path attribution from a trace.

**Iterations.** Iteration ``i`` ends at ``E_i``, the latest end over rank classes of the
compute-stream ops of iteration ``i`` (checkpoint writes excluded; after a restart the redone
epoch's); its window is ``[E_(i-1), E_i]`` (``E_(-1) = 0``), so the windows tile the run as the
summary's iteration times do.

**Critical path.** The class that ends iteration ``i`` last is its *critical class*; the window
is attributed along that class's compute stream, which runs one op at a time, so the categories
partition the window:

* a compute block: ``compute: <kernel class>`` (attention, MLP, embedding, logits, optimizer,
  recompute) for its duration at the DVFS policy's clock without contention, from the run's
  own roofline model (the trace's resolved scenario is rebuilt: ``twin.build``); the rest of its
  duration goes to ``power-cap throttling`` (a P-state below the policy's because of
  ``power.cap_w`` or the cluster power manager, or a block stretched to the board's power
  limit: ``power.cap_w``, else the firmware's default, the device's ``tdp_w``), ``thermal
  throttling`` (a P-state below that), ``memory contention`` (HBM contention model or an HBM
  degradation fault) or ``straggler`` (a straggler fault); compute jitter stays in compute;
* ``tp`` waits: ``exposed TP communication``; ``dp_wait``: ``exposed DP communication``;
* ``recv`` waits: ``exposed pipeline communication`` while the awaited send was on the wire
  (the ``messages`` row arriving at the wait's end), ``pipeline bubble`` before (the sender was
  still computing);
* ``dvfs``: ``DVFS stalls``; ``checkpoint``: ``checkpointing``; ``data_wait``: ``data wait``;
  any other op kind ``k``: ``k`` (new kinds slot in without code);
* time before the last job restart in the window (lost work and downtime): ``fault recovery``;
* whatever the critical class's stream did not cover: ``unattributed``.

Energy is attributed by component (the summary's breakdown) and by device position class
(the ``devices`` table).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from twin.reading import TraceData

KERNEL_CLASSES = {"attn": "attention", "mlp": "MLP", "embed": "embedding", "logits": "logits",
                  "optimizer": "optimizer", "recompute": "recompute"}
WAIT_CATEGORY = {"tp": "exposed TP communication", "dp_wait": "exposed DP communication",
                 "dvfs": "DVFS stalls", "checkpoint": "checkpointing", "data_wait": "data wait"}
BUBBLE, PIPE = "pipeline bubble", "exposed pipeline communication"
FAULT, UNATTRIBUTED = "fault recovery", "unattributed"
CAP, THERMAL, MEMORY, STRAGGLER = ("power-cap throttling", "thermal throttling",
                                   "memory contention", "straggler")


def kernel_class(block: str) -> str:
    """``compute: attention`` for ``attn_fwd`` etc."""
    head = block.split("_")[0]
    return f"compute: {KERNEL_CLASSES.get(head, head)}"


class _Costs:
    """Nominal block durations of the run (its roofline model at any P-state)."""

    def __init__(self, td: TraceData):
        from devices.power import PowerSetup
        from twin.build import build, stage_compute_blocks
        from twin.scenario import load_scenario

        scen = load_scenario(td.scenario)
        self.model = model = build(scen)
        self.setup = PowerSetup(scen.power, model.compute, stage_compute_blocks(model),
                                model.microbatches, model.layout.world)
        self.dev = self.setup.dev
        self.cap_w = self.setup.cap_w  # the board's limit: power.cap_w, else the device's tdp_w
        self.manager = scen.power.manager.budget_w is not None
        self.memory = scen.memory.model != "roofline" or any(
            f.kind == "hbm_degradation" for f in scen.faults)
        self.straggler = any(f.kind == "straggler" for f in scen.faults)
        self.stage = np.asarray(model.layout.class_stage)
        self._cache: dict[tuple, float] = {}

    def duration(self, stage: int, name: str, ps: int, mem: float = 1.0) -> float:
        key = (stage, name, ps, mem)
        d = self._cache.get(key)
        if d is None:
            block = self.model.blocks[stage][name]
            d = self._cache[key] = self.model.compute.block_cost(
                block, self.dev.math_scale[ps], mem).duration_s
        return d

    def state(self, mhz: float) -> int:
        return self.dev.floor_state(mhz)


def iteration_ends(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(E, critical class)`` of every iteration (see the module doc)."""
    c = ops[(ops["stream"] == "compute") & (ops["kind"] != "checkpoint")]
    ends = c.groupby(["iteration", "cls"])["t_end"].max().unstack("cls")
    return ends.max(axis=1).to_numpy(), ends.idxmax(axis=1).to_numpy().astype(int)


def _split_compute(rows: pd.DataFrame, costs: _Costs, power: pd.DataFrame,
                   cls: int) -> list[tuple[str, np.ndarray]]:
    """Per compute op of one class: (category, seconds) pieces adding up to its duration."""
    dur = (rows["t_end"] - rows["t_start"]).to_numpy()
    stage = int(costs.stage[cls])
    work = costs.setup.stage_ps[stage]
    cap_ps = max(work, costs.setup.cap_ps.get(stage, 0))
    seg = power[power["cls"] == cls].set_index("t_start")
    seg = seg[~seg.index.duplicated(keep="last")]
    freq = seg["freq_mhz"].reindex(rows["t_start"]).to_numpy()
    watts = seg["watts"].reindex(rows["t_start"]).to_numpy()
    names = rows["name"].to_numpy()
    nominal, capped, clock = (np.empty(len(rows)) for _ in range(3))
    for i, (name, f) in enumerate(zip(names, freq, strict=True)):
        ps = costs.state(f) if np.isfinite(f) else work
        nominal[i] = costs.duration(stage, name, work)
        capped[i] = costs.duration(stage, name, min(max(ps, work), cap_ps))
        clock[i] = costs.duration(stage, name, max(ps, work))
    cap_part = capped - nominal
    thermal_part = clock - capped
    if costs.manager:  # a manager's clock cap is a cluster power cap
        cap_part, thermal_part = clock - nominal, np.zeros(len(rows))
    rest = dur - clock
    stretched = np.isfinite(watts) & (watts >= costs.cap_w * (1 - 1e-9))
    to_cap = np.where(stretched, rest, 0.0)
    other = np.where(stretched, 0.0, np.maximum(rest, 0.0))
    mem = other if costs.memory else np.zeros(len(rows))
    strag = other if (costs.straggler and not costs.memory) else np.zeros(len(rows))
    base = dur - cap_part - thermal_part - to_cap - mem - strag  # nominal (+ jitter)
    pieces = [(kernel_class(n), np.where(names == n, base, 0.0)) for n in sorted(set(names))]
    return [*pieces, (CAP, cap_part + to_cap), (THERMAL, thermal_part), (MEMORY, mem),
            (STRAGGLER, strag)]


def _clip(t0: np.ndarray, t1: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.clip(np.minimum(t1, hi) - np.maximum(t0, lo), 0.0, None)


def attribute(td: TraceData) -> dict[str, Any]:
    """Per-iteration attribution (see the module doc): ``iterations`` (list of
    {iteration, start_s, end_s, time_s, critical_class, categories}), ``mean`` (seconds per
    category over iterations), ``fractions`` (of the mean iteration time) and
    ``board_limit_w`` (the board power limit in force, W)."""
    ops = td.table("ops")
    msgs = td.table("messages")
    power = td.table("power")
    costs = _Costs(td)
    ends, crit = iteration_ends(ops)
    # the mean iteration time is ends[-1] / n; a run's compute ops take time: a damaged trace
    if not len(ends) or not ends[-1] > 0:
        from twin.kernel.errors import ScenarioError

        raise ScenarioError(f"{td.path}: the trace's ops table holds no compute op that takes "
                            "time, so no iteration to attribute (a trace cut or edited after "
                            "the run?)")
    starts = np.concatenate([[0.0], ends[:-1]])
    restarts = np.sort(td.table("faults").query("kind == 'restart'")["time_s"].to_numpy()) \
        if td.has("faults") and len(td.table("faults")) else np.array([])
    p2p = msgs[msgs["name"].str.startswith("p2p")] if len(msgs) else msgs
    dst_cls = (td.table("ranks").set_index("device")["cls"] if td.has("ranks")
               else pd.Series(dtype=int))
    out = []
    for i, (lo, hi, c) in enumerate(zip(starts, ends, crit, strict=True)):
        cat: dict[str, float] = {}

        def add(name: str, secs: float, cat=cat) -> None:
            if secs:
                cat[name] = cat.get(name, 0.0) + float(secs)

        r = restarts[(restarts > lo) & (restarts <= hi)]
        begin = float(r[-1]) if len(r) else lo
        add(FAULT, begin - lo)
        s = ops[(ops["cls"] == c) & (ops["stream"] == "compute") & (ops["t_end"] > begin)
                & (ops["t_start"] < hi)]
        clipped = _clip(s["t_start"].to_numpy(), s["t_end"].to_numpy(), begin, hi)
        full = (s["t_end"] - s["t_start"]).to_numpy()
        scale = np.divide(clipped, full, out=np.zeros_like(full), where=full > 0)
        kind = s["kind"].to_numpy()
        comp = kind == "compute"
        if comp.any():
            for name, secs in _split_compute(s[comp], costs, power, c):
                add(name, float((secs * scale[comp]).sum()))
        for k in sorted(set(kind) - {"compute", "recv"}):
            add(WAIT_CATEGORY.get(k, k), float(clipped[kind == k].sum()))
        for j in np.flatnonzero(kind == "recv"):
            w0, w1 = max(s["t_start"].iloc[j], begin), min(s["t_end"].iloc[j], hi)
            t_end = s["t_end"].iloc[j]
            hit = p2p[(np.abs(p2p["t_end"] - t_end) <= 1e-12 * max(t_end, 1.0))] \
                if len(p2p) else p2p
            if len(hit) and len(dst_cls):
                hit = hit[dst_cls.reindex(hit["dst"]).to_numpy() == c]
            sent = float(hit["t_start"].min()) if len(hit) else w1
            add(PIPE, max(w1 - max(sent, w0), 0.0))
            add(BUBBLE, max(min(sent, w1) - w0, 0.0))
        add(UNATTRIBUTED, (hi - begin) - clipped.sum())
        out.append({"iteration": i, "start_s": float(lo), "end_s": float(hi),
                    "time_s": float(hi - lo), "critical_class": int(c),
                    "categories": dict(sorted(cat.items(), key=lambda kv: -kv[1]))})
    n = len(out)
    names = sorted({k for it in out for k in it["categories"]})
    mean = {k: sum(it["categories"].get(k, 0.0) for it in out) / n for k in names}
    t_mean = sum(it["time_s"] for it in out) / n
    order = sorted(mean, key=lambda k: -mean[k])
    return {"iterations": out, "iteration_time_s": t_mean,
            "mean": {k: mean[k] for k in order},
            "fractions": {k: mean[k] / t_mean for k in order},
            "hbm_bound_s": _hbm_bound(ops, costs, crit, starts, ends),
            "critical_path": "compute stream of the class that ends each iteration",
            "board_limit_w": float(costs.cap_w)}


def _hbm_bound(ops, costs: _Costs, crit, starts, ends) -> float:
    """Mean seconds per iteration the critical class's compute blocks spend beyond their math
    roof (memory time not hidden under math: kernels waiting on HBM), at the policy clock."""
    total = 0.0
    for lo, hi, c in zip(starts, ends, crit, strict=True):
        s = ops[(ops["cls"] == c) & (ops["kind"] == "compute") & (ops["t_end"] > lo)
                & (ops["t_start"] < hi)]
        stage = int(costs.stage[c])
        work = costs.setup.stage_ps[stage]
        for name, k in s["name"].value_counts().items():
            total += k * (costs.duration(stage, name, work)
                          - costs.duration(stage, name, work, 0.0))
    return total / max(len(starts), 1)


def energy_attribution(td: TraceData) -> dict[str, Any]:
    """Energy by component (the summary's breakdown, per iteration and as shares) and by
    device position class (sum and mean per device of the ``devices`` table)."""
    s = td.summary
    iters = max(int(s.get("iterations_completed") or s.get("iterations") or 1), 1)
    br = s.get("energy_breakdown_j", {})
    total = sum(br.values()) or 1.0
    out: dict[str, Any] = {
        "by_component_j_per_iteration": {k: v / iters for k, v in br.items()},
        "by_component_share": {k: v / total for k, v in br.items()}}
    dev = td.table("devices")
    if len(dev):
        g = dev.groupby("position")
        out["by_position"] = {
            str(p): {"devices": len(x), "energy_j_per_iteration": float(x["energy_j"].sum())
                     / iters, "mean_device_j_per_iteration": float(x["energy_j"].mean()) / iters,
                     "network_share": float(x["network_j"].sum() / x["energy_j"].sum())
                     if x["energy_j"].sum() > 0 else 0.0}
            for p, x in g}
    return out
