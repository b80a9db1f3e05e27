"""Steady-state microbatch aggregation (issue 14): a long pipeline iteration from short ones.

In a deterministic, symmetric run every steady-state microbatch of a 1F1B / interleaved /
GPipe iteration repeats the same work on every stage, so the iteration time and every additive
quantity (energy components, busy and wait times, bytes, flops) are affine in the number of
microbatches ``m`` once ``m`` is past the warm-up (``m >= m0``: every stage then has a steady
phase; the fill, the drain, the gradient all-reduce and the optimizer are the same for every
``m``). Instead of simulating the ``m`` microbatches of the scenario, the run simulates three
reduced counts ``m1 < m2 < m3`` (equally spaced by ``h``, all ``>= m0``), extrapolates every
summary quantity from the last two to ``m`` and uses the third point to estimate the error of
that extrapolation: with ``v(k) = a + b k + c k^2`` the residual of the first point against
the line through the other two is ``2 c h^2`` and the error at ``m`` is ``c (m - m2)(m - m3)``.
When that projected error exceeds :data:`REL_TOL` of the value for the iteration time, the
makespan or the energy, the summary is not aggregated: the full run is simulated instead
(``aggregation.fallback`` says why); so it is when the reduced runs are not yet steady
(:func:`short_of_busiest`: the run grows by less per microbatch than its busiest device
computes) and, under GPipe, when the stages' traffic may meet (:func:`unsteady`). What can
make a quantity not affine, and is excluded or caught: randomness (jitter, sampled HBM
service, faults) and feedback controllers (power manager, DVFS plans, caps, data path) are
excluded up front (:func:`blockers`), and so is the
thermal RC model (leakage follows the die temperature, tau ~ 1 min: energy came out 0.8-1.1%
off the exact run on a small configuration); the third point catches what else bends (the
pipeline not yet in its steady phase, as in the 1T layout at 64 microbatches).

Quantities that are not affine in ``m`` are not extrapolated as if they were: ratios (MFU,
fractions, shares, average power, link utilization) are recomputed from the extrapolated
totals; maxima over time (peak power, peak temperature) are kept only when the three reduced
runs agree, otherwise set to None and listed under ``undefined_keys``; a key whose three values
are neither equal nor affine within the tolerance is set to None and listed the same way.
Spreads over devices (the ``std`` of a position class's energies) are square roots of
quadratics in ``m``: they are extrapolated like totals and kept only within the projected
error (8e-5 of the value on the interleaved case of ``tests/test_exact.py``).
``events`` counts the events actually simulated (the cost of this run), ``wall_time_s`` the
whole wall time. Only runs without a trace aggregate (a trace holds every simulated op; the
reduced runs' ops are not the scenario's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from twin.scenario import Scenario

SHORTCUT = "microbatch_aggregation"
#: Largest projected relative error of an extrapolated quantity (estimated from the third
#: reduced run); 0.1% keeps a 5x margin under the 0.5% agreement target of DESIGN.md.
REL_TOL = 1e-3
#: Keys whose projected error decides between the aggregated summary and the full run.
CORE_KEYS = ("iteration_time_s", "makespan_s", "energy_j")
#: Maxima over time: kept only when the reduced runs agree (never extrapolated).
PEAK_KEYS = ("peak_power_w", "max_temperature_c", "sm_max_used", "hbm_max_streams",
             "memory_max_transfers", "memory_slowdown_max")
#: Relative shortfall of the run's growth per microbatch under its busiest device's compute
#: taken for rounding, not for a pipeline still filling its idle slots (:func:`short_of_busiest`).
STEADY_TOL = 1e-9
#: Spread of the iteration times of a deterministic run: rounding noise, taken from m3.
NOISE_KEYS = ("iteration_time_cov", "iteration_time_se_s")


@dataclass(frozen=True)
class Plan:
    """The reduced microbatch counts of an aggregated run."""

    m: int             # microbatches per replica of the scenario
    counts: tuple[int, int, int]  # m1 < m2 < m3, equally spaced, all past the warm-up

    @property
    def step(self) -> int:
        """Spacing h of the reduced counts."""
        return self.counts[1] - self.counts[0]


def blockers(scen: Scenario) -> list[str]:
    """Why ``scen`` may not aggregate microbatches (empty: it may). Conservative: anything
    random, faulty, controlled by feedback or fed by the data path turns it off."""
    from devices.power import DvfsSpec

    out = []
    if scen.simulation.exact:
        out.append("simulation.exact")
    if not scen.symmetric:
        out.append("no rank symmetry")
    if scen.faults:
        out.append("faults")
    if scen.simulation.compute_jitter_cov > 0:
        out.append("simulation.compute_jitter_cov")
    if scen.memory.model != "roofline":
        out.append(f"memory.model {scen.memory.model}")
    if scen.data.enabled:
        out.append("data path")
    if scen.power.manager.budget_w is not None:
        out.append("power.manager")
    if scen.power.cap_w is not None:
        out.append("power.cap_w")
    if scen.power.dvfs != DvfsSpec():
        out.append("power.dvfs")
    if scen.power.thermal.enabled:  # leakage follows the die temperature (tau ~ 1 min)
        out.append("power.thermal")
    if scen.trace.enabled:
        out.append("trace enabled")
    return out


def warmup_microbatches(schedule: str, pp: int, v: int) -> int:
    """Smallest microbatch count with a steady phase on every stage: ``pp`` for GPipe and
    1F1B (stage 0 runs ``pp - 1`` warm-up forwards); for interleaved 1F1B with ``v > 1``
    chunks the smallest multiple of ``pp`` whose ``m v`` units exceed stage 0's
    ``2 (pp - 1) + (v - 1) pp = (v + 1) pp - 2`` warm-up units
    (``workloads.schedules.unit_order``). For ``pp >= 2`` that is always ``2 pp``: ``m = pp``
    gives ``v pp <= (v + 1) pp - 2`` (no steady phase) and ``m = 2 pp`` gives ``2 v pp >
    (v + 1) pp - 2`` for every ``v >= 1``; one stage (``pp = 1``) has no warm-up: 1."""
    if schedule != "interleaved" or v == 1 or pp == 1:
        return pp
    return 2 * pp


def plan(scen: Scenario) -> Plan | None:
    """The reduced counts for ``scen``, or None when it does not aggregate (see
    :func:`blockers`) or when the three reduced runs together would simulate more than half
    the full run's microbatches."""
    if blockers(scen):
        return None
    from workloads.feasibility import microbatches

    w = scen.workload
    m = microbatches(w)
    pp, v = w.parallelism.pp, w.virtual_stages
    if pp < 2:
        return None
    m0 = warmup_microbatches(w.schedule, pp, v)
    # consecutive counts (h = 1) show a schedule that repeats only every second microbatch;
    # interleaved counts must stay multiples of pp
    h = pp if w.schedule == "interleaved" and v > 1 else 1
    counts = (m0, m0 + h, m0 + 2 * h)
    if 2 * sum(counts) > m:  # at most half the full run's microbatches: a fallback (the
        return None          # full run after the reduced ones) then costs at most 1.5x
    return Plan(m, counts)


def reduced(scen: Scenario, mb: int) -> Scenario:
    """``scen`` with ``mb`` microbatches per replica (the global batch scaled to match)."""
    w = scen.workload
    gb = mb * w.micro_batch * w.parallelism.dp
    return scen.model_copy(update={"workload": w.model_copy(update={"global_batch": gb})})


class _Combiner:
    """Extrapolates summary values of the three reduced runs to ``m``."""

    def __init__(self, p: Plan):
        self.p = p
        self.undefined: list[str] = []
        self.errors: dict[str, float] = {}

    def value(self, a: Any, b: Any, c: Any, path: str) -> Any:
        if isinstance(a, dict):
            return {k: self.value(a[k], b.get(k), c.get(k), f"{path}.{k}" if path else k)
                    for k in a}
        if isinstance(a, (list, tuple)):
            if a == b == c:
                return c
            if len(a) == len(b) == len(c):
                return [self.value(x, y, z, f"{path}.{i}")
                        for i, (x, y, z) in enumerate(zip(a, b, c, strict=True))]
            return self._undefined(path)
        if a is None or b is None or c is None:
            return None if a is None and b is None and c is None else self._undefined(path)
        if isinstance(a, (bool, np.bool_, str)):
            return c if a == b == c else self._undefined(path)
        if not isinstance(a, (int, float, np.integer, np.floating)):
            return c if a == b == c else self._undefined(path)
        leaf = path.rsplit(".", 1)[-1]
        if a == b == c:
            return c
        if leaf in NOISE_KEYS:
            return c
        if leaf in PEAK_KEYS or leaf.startswith("max_temp"):
            if max(a, b, c) - min(a, b, c) <= 1e-9 * max(abs(a), abs(b), abs(c)):
                return c  # the same peak in every reduced run, up to rounding
            return self._undefined(path)
        x, err = self.extrapolate(float(a), float(b), float(c))
        self.errors[path] = err
        if err > REL_TOL:
            return self._undefined(path)
        if isinstance(a, (int, np.integer)):
            return round(x)
        return x

    def extrapolate(self, a: float, b: float, c: float) -> tuple[float, float]:
        """Value at ``m`` from the line through the last two points, and the projected
        relative error (quadratic model fitted through all three)."""
        m, (_m1, m2, m3), h = self.p.m, self.p.counts, self.p.step
        x = c + (c - b) * (m - m3) / h
        curv = (a - 2 * b + c) / (2 * h * h)  # c of a + b k + c k^2
        scale = max(abs(x), abs(a), abs(b), abs(c))
        err = abs(curv) * (m - m2) * (m - m3) / scale if scale > 0 else 0.0
        return x, err

    def _undefined(self, path: str) -> None:
        self.undefined.append(path)
        return None


def unsteady(model) -> str | None:
    """Why the microbatches of ``model`` (a built reduced run, ``twin.build.Model``) may not
    repeat, or None. Under GPipe the stages are not locked together: in the forward phase a
    stage faster than the next runs ahead of it, so the distance between their clocks grows
    with every microbatch (and likewise backward). Where the stages' traffic can share a
    link (e.g. pipeline sends over a NIC that a TP group spanning two nodes also uses), each
    microbatch then meets the other stage's transfers at another offset, and the iteration is
    not affine in ``m`` even where three reduced counts look so (measured: 0.13% off at
    ``m = 18`` from counts 2-4 that agreed with a line to 5e-14, GPipe on 4 nodes of 2 GPUs,
    TP 4). 1F1B and interleaved steady phases are locked by their backward dependencies."""
    from workloads.tp_isolation import links_shared_by_stages

    if model.scenario.workload.schedule != "gpipe":
        return None
    shared = links_shared_by_stages(model.layout, model.router.route,
                                    ends_exchange=model.scenario.workload.model.tied_embeddings)
    if len(shared):
        return (f"gpipe stages run free and their traffic may share {len(shared)} link(s) in "
                "one phase: it meets at an offset that changes with every microbatch")
    return None


def short_of_busiest(p: Plan, makespans: list[float], busy: list[np.ndarray]) -> str | None:
    """Why the reduced runs are not yet in the steady phase, or None. Each device computes
    one block at a time, so in a steady phase the run cannot grow by less per microbatch
    than the device that computes the most does (``busy``: each class's compute seconds in
    each reduced run). Where it grows by less, that device still hides part of its work in
    the pipeline's idle slots, which fill up after more microbatches than the warm-up: the
    growth then steps up, past the reduced counts (measured: interleaved 1F1B over three
    stages of uneven chunks, 6982 us per microbatch up to ``m = 15``, 7150 us, the busiest
    device's compute, from ``m = 21``; the extrapolation from 6, 9 and 12 was 1.4% short at
    ``m = 54``)."""
    h = p.step
    grows = (makespans[2] - makespans[1]) / h
    computes = float(np.max(busy[2] - busy[1])) / h if len(busy[2]) else 0.0
    if grows < computes * (1.0 - STEADY_TOL):
        return (f"not yet steady at {p.counts[1]}-{p.counts[2]} microbatches: the run grows by "
                f"{grows:.6g} s per microbatch, less than its busiest device computes "
                f"({computes:.6g} s)")
    return None


def combine(p: Plan, summaries: list[dict[str, Any]],
            link_bytes: list[np.ndarray], capacity: np.ndarray,
            busy: list[np.ndarray] | None = None) -> tuple[dict[str, Any] | None, str]:
    """The summary of the full run from the reduced runs', or ``(None, reason)`` when the
    reduced runs are not yet steady (:func:`short_of_busiest`, given each class's compute
    seconds ``busy``) or a core quantity is not affine enough (the caller then simulates the
    full run)."""
    s1, s2, s3 = summaries
    if busy is not None:
        reason = short_of_busiest(p, [float(s["makespan_s"]) for s in summaries], busy)
        if reason is not None:
            return None, reason
    cmb = _Combiner(p)
    out = cmb.value(s1, s2, s3, "")
    for k in CORE_KEYS:
        if out.get(k) is None:
            _, err = cmb.extrapolate(float(s1[k]), float(s2[k]), float(s3[k]))
            return None, (f"{k} is not affine in the microbatches: projected error "
                          f"{100 * err:.3g}% > {100 * REL_TOL:g}%")
    redone = _recompute_ratios(out, s3, p, link_bytes, capacity)
    cmb.undefined = [k for k in cmb.undefined if k not in redone]
    out["events"] = int(sum(s["events"] for s in summaries))
    out["shortcuts_used"] = [*s3["shortcuts_used"], SHORTCUT]
    out["microbatches"] = p.m
    out["microbatches_simulated"] = list(p.counts)
    out["aggregation"] = {
        "method": "affine in microbatches",
        "microbatches_simulated": list(p.counts),
        "events_simulated": [int(s["events"]) for s in summaries],
        "max_projected_error": max(cmb.errors.get(k, 0.0) for k in CORE_KEYS),
    }
    undefined = sorted(set(cmb.undefined) | set(s3.get("undefined_keys", [])))
    out["undefined_keys"] = undefined
    return out, ""


def _recompute_ratios(out: dict[str, Any], s3: dict[str, Any], p: Plan,
                      link_bytes: list[np.ndarray], capacity: np.ndarray) -> set[str]:
    """Ratios of extrapolated totals: computed again, not extrapolated. Returns the dotted
    keys set."""
    span = out["makespan_s"]
    it = out["iteration_time_s"]
    energy = out["energy_j"]

    def ratio(num: float | None, den: float | None) -> float | None:
        if num is None or den is None:
            return None
        return num / den if den > 0 else 0.0

    out["avg_power_w"] = ratio(energy, span)
    scale = s3["iteration_time_s"] / it * (out["model_flops_per_iteration"]
                                           / s3["model_flops_per_iteration"])
    out["tflops_per_device"] = s3["tflops_per_device"] * scale
    out["mfu"] = s3["mfu"] * scale
    shard = (out.get("sharding") or {}).get("allgather_wait_per_device_s") or 0.0
    out["bubble_fraction"] = ratio(out["pipeline_wait_per_device_s"], span)
    comm = [out["tp_comm_time_per_device_s"], out["dp_wait_per_device_s"]]
    out["exposed_comm_fraction"] = (None if None in comm else ratio(sum(comm) + shard, span))
    out["data_wait_fraction"] = ratio(out["data_wait_per_device_s"], span)
    br = out["energy_breakdown_j"]
    if "energy_share" in out:
        out["energy_share"] = {k: ratio(v, energy) for k, v in br.items()}
    active = br["compute"] + br["memory"] + br["network"]
    if "comm_energy_share" in out:
        out["comm_energy_share"] = ratio(br["network"], active)
    if "energy_per_flop_j" in out:
        execd = out["executed_flops_per_iteration"] * out["iterations"]
        out["energy_per_flop_j"] = ratio(energy, execd)
    # every summary has the job's goodput (workloads.job.job_metrics), 0 without a makespan
    w_tokens = s3["goodput_tokens_per_s"] * s3["makespan_s"] * p.m / p.counts[2]
    out["goodput_tokens_per_s"] = ratio(w_tokens, span)
    lb = [np.asarray(x, dtype=float) for x in link_bytes]
    if len(lb[0]) and span:
        h = p.step
        full = lb[2] + (lb[2] - lb[1]) * (p.m - p.counts[2]) / h
        out["max_link_utilization"] = float((full / (capacity * span)).max())
    keys = {"avg_power_w", "tflops_per_device", "mfu", "bubble_fraction",
            "exposed_comm_fraction", "data_wait_fraction", "comm_energy_share",
            "energy_per_flop_j", "goodput_tokens_per_s", "max_link_utilization"}
    return keys | {f"energy_share.{k}" for k in br}
