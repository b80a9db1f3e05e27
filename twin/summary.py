"""Summary metrics of a run (SI units), computed from the agents' counters.

Keys of the DESIGN contract: ``iteration_time_s``, ``iterations``, ``makespan_s``, ``energy_j``,
``energy_per_iteration_j``, ``energy_breakdown_j`` {compute, memory, network, static, idle,
regulator}, ``avg_power_w``, ``peak_power_w``, ``tflops_per_device``, ``mfu``, ``devices``,
``bubble_fraction``, ``exposed_comm_fraction``, ``events``, ``wall_time_s``; plus details
(per-class times, memory per device, bytes sent/received, symmetry used, ...).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from devices.peak import peak_power
from devices.power_report import collect_alerts, power_summary
from topologies.routing import NoRoute, Router
from twin.build import Model, class_sizes, model_flops_per_iteration
from twin.iteration_stats import iteration_report
from twin.per_device import device_columns, edge_effect, traffic
from workloads.job import job_metrics

SUMMARY_KEYS = ("iteration_time_s", "iterations", "makespan_s", "energy_j",
                "energy_per_iteration_j", "energy_breakdown_j", "avg_power_w", "peak_power_w",
                "tflops_per_device", "mfu", "devices", "bubble_fraction",
                "exposed_comm_fraction", "events", "wall_time_s")


def summarize(model: Model, env, fabric, ex, wall_s: float) -> dict[str, Any]:
    """The summary dictionary of a finished simulation."""
    scen = model.scenario
    sizes = class_sizes(model)
    n_dev = int(sizes.sum())
    makespan = float(env.now)
    iters = scen.workload.iterations
    done = min(len(s.iteration_end) for s in ex.stats)  # < iters: the run stalled
    ends = np.array([s.iteration_end[:done] for s in ex.stats]).reshape(len(ex.stats), done)
    it_end = ends.max(axis=0)
    it_times = np.diff(np.concatenate([[0.0], it_end]))
    it_time = float(it_times.mean()) if done else float("nan")
    flops = model_flops_per_iteration(model)
    peak = scen.cluster.device.peak_flops(scen.workload.precision)

    def per_device(attr: str) -> float:
        return float(sum(getattr(s, attr) * n for s, n in zip(ex.stats, sizes, strict=True)))

    def per_accel(attr: str) -> float:
        return float(sum(getattr(a.stats, attr) * a.n for a in ex.accelerators))

    link_bytes = fabric.link_bytes
    node = traffic(model, fabric, makespan)  # per-device ports, routers, forwarding
    network_j = float((link_bytes * fabric.energy_per_byte).sum() + fabric.idle_w.sum() * makespan
                      + node.router_j.sum())
    breakdown = {"compute": 0.0, "memory": 0.0, "network": network_j, "static": 0.0,
                 "idle": 0.0, "regulator": 0.0}
    for a in ex.accelerators:
        for k, v in a.energy_breakdown().items():
            breakdown[k] += v
    energy = float(sum(breakdown.values()))
    busy = per_accel("compute_s")
    tp = per_device("tp_s")
    recv = per_device("recv_s")
    dpw = per_device("dp_wait_s")
    shw = per_device("shard_wait_s")  # 0 without sharding
    dataw = per_device("data_wait_s")
    denom = n_dev * makespan if makespan > 0 else 1.0
    try:
        hops = model.layout.hops_per_group(model.router)
    except NoRoute:  # failures left devices cut off at the end: report the healthy routes
        hops = model.layout.hops_per_group(Router(model.topo))
    exec_flops = per_accel("gemm_flops")
    return finite_summary({
        "iteration_time_s": it_time,
        "iterations": iters,
        "makespan_s": makespan,
        "energy_j": energy,
        "energy_per_iteration_j": energy / iters,
        "energy_breakdown_j": breakdown,
        "avg_power_w": energy / makespan if makespan > 0 else 0.0,
        "peak_power_w": peak_power(ex.accelerators) + fabric.idle_w.sum(),
        "tflops_per_device": flops / it_time / n_dev / 1e12 if it_time > 0 else 0.0,
        "mfu": flops / (it_time * n_dev * peak) if it_time > 0 else 0.0,
        "devices": n_dev,
        "bubble_fraction": recv / denom,
        "exposed_comm_fraction": (tp + dpw + shw if shw else tp + dpw) / denom,
        "events": int(env.events_processed),
        "wall_time_s": wall_s,
        # details
        "model_flops_per_iteration": flops,
        "executed_flops_per_iteration": exec_flops / iters,
        "compute_time_per_device_s": busy / n_dev,
        "tp_comm_time_per_device_s": tp / n_dev,
        "pipeline_wait_per_device_s": recv / n_dev,
        "dp_wait_per_device_s": dpw / n_dev,
        "data_wait_per_device_s": dataw / n_dev,
        "data_wait_fraction": dataw / denom,
        "idle_time_per_device_s": max(makespan - (busy + tp + recv + dpw + dataw + shw if shw
                                                  else busy + tp + recv + dpw + dataw) / n_dev,
                                      0.0),
        "memory_per_device_gb": {f"stage{m.stage}": m.total / 1e9 for m in model.stage_memory},
        "microbatches": model.microbatches,
        "bytes_sent": float(fabric.bytes_sent.sum()),
        "bytes_received": float(fabric.bytes_received.sum()),
        "link_bytes": float(link_bytes.sum()),
        "max_link_utilization": float((link_bytes / (fabric.capacity * makespan)).max())
        if makespan > 0 and len(link_bytes) else 0.0,
        "hops_per_ring_edge": hops,
        "reroutes": int(fabric.reroutes),
        # fault tolerance (workloads.job): restarts, lost work, availability, goodput
        "completed": done == iters,
        "iterations_completed": int(done),
        **job_metrics(getattr(ex, "job", None), ex.accelerators, fabric, makespan, int(done),
                      scen.workload.global_batch * scen.workload.seq),
        "bytes_dropped": float(getattr(fabric, "bytes_dropped", np.zeros(1)).sum()),
        "retransmitted_bytes": float(fabric.retransmitted_bytes),
        "route_stalls": len(getattr(fabric, "stalls", ())),
        "network_model": scen.network.model,
        "ring_model": scen.rings,
        "symmetry_used": bool(model.symmetric),
        "exact_mode": bool(scen.simulation.exact),
        "shortcuts_used": [k for k, used in (
            ("symmetry", model.symmetric), ("chained_transfers", ex.chained),
            ("tp_closed_form", getattr(ex, "closed_form_collectives", 0) > 0),
            ("tp_optimistic", _optimistic(ex)[0] > 0),
            ("tp_fluid", _fluid(fabric)[0] > 0),
            ("replica_quotient", getattr(fabric, "quotient", None) is not None),
            ("lockstep_rings", getattr(fabric, "lockstep_transfers", 0) > 0
             and scen.rings == "step"),  # (with lockstep it is the model)
            ("tp_group_agents", model.layout.tp_groups),
            ("run_ahead", getattr(ex, "run_ahead_ops", 0) > 0)) if used],
        # flows of one replica per orbit on the quotient network (devices.replicas): the
        # shift's order (flows of the full network per simulated flow), 1 when not used
        "replica_orbit": (fabric.quotient.order
                          if getattr(fabric, "quotient", None) is not None else 1),
        "replica_quotient_fallback": getattr(fabric, "quotient_fallback", None),
        # ring phases sent as one lock-step flow each (devices.phase.lockstep_ok)
        "lockstep_ring_transfers": int(getattr(fabric, "lockstep_transfers", 0)),
        # tensor-parallel collectives costed in closed form (workloads.executor)
        "tp_closed_form_collectives": int(getattr(ex, "closed_form_collectives", 0)),
        # of the other TP collectives: run ahead where other traffic may reach their links,
        # and the times such traffic took an agent's run back (workloads.optimistic)
        "tp_optimistic_collectives": _optimistic(ex)[0],
        "tp_optimistic_rewinds": _optimistic(ex)[1],
        # of the others beside HBM ports: run as fluid jobs at their ports' caps, and the
        # phases of them handed to the flow network when other traffic reached a port
        # (devices.fluid)
        "tp_fluid_collectives": _fluid(fabric)[0],
        "tp_fluid_handoffs": _fluid(fabric)[1],
        # compute blocks and TP collectives an agent ran ahead of the clock (one event for a
        # run of them; workloads.executor ``run_ahead``)
        "run_ahead_ops": int(getattr(ex, "run_ahead_ops", 0)),
        "rank_classes": len(sizes),
        **_power_keys(model, ex, fabric, breakdown, energy, it_end, makespan, exec_flops, it_time),
        **(mem := _memory_keys(ex)),
        **iteration_report(it_times, bool(random_sources(scen)),
                           infinite_variance_sources(scen, mem)),
        "data_path": (ex.data.report(makespan)
                      if getattr(ex, "data", None) is not None else None),
        "router_energy_j": float(node.router_j.sum()),
        "forwarded_bytes": float(node.forwarded_bytes.sum()),
        "edge_effect": edge_effect(device_columns(model, fabric, ex, makespan, node),
                                   model.symmetric, max(int(done), 1)),
        **_sharding_keys(model, per_device, n_dev),
    })


def finite_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with every NaN or infinite number (at any depth) replaced by None, and the
    dotted keys replaced listed under ``undefined_keys`` (empty when all are finite), so the
    summary is strict JSON (e.g. the iteration time of a run that completed no iteration)."""
    undefined: list[str] = []

    def clean(v: Any, path: str) -> Any:
        if isinstance(v, dict):
            return {k: clean(x, f"{path}.{k}" if path else str(k)) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x, f"{path}.{i}") for i, x in enumerate(v)]
        if isinstance(v, (float, np.floating)) and not np.isfinite(v):
            undefined.append(path)
            return None
        return v

    out = clean(summary, "")
    out["undefined_keys"] = undefined
    return out


def random_sources(scen) -> list[str]:
    """What makes a run random (its iteration times samples): compute jitter, sampled HBM
    contention, faults with random timing or a per-block random tail."""
    out = []
    if scen.simulation.compute_jitter_cov > 0:
        out.append("simulation.compute_jitter_cov")
    if scen.memory.model != "roofline":
        out.append(f"memory.model {scen.memory.model}")
    for i, f in enumerate(scen.faults):
        for key in ("ttf", "ttr", "tail"):
            if getattr(f, key, None) is not None:
                out.append(f"faults[{i}].{key}")
    return out


def infinite_variance_sources(scen, memory_keys: dict[str, Any]) -> list[str]:
    """Inputs of the run with infinite variance (a Pareto tail with alpha <= 2)."""
    out = []
    if memory_keys.get("memory_variance_infinite"):
        out.append("HBM service time (memory.service) has infinite variance")
    heavy = [i for i, f in enumerate(scen.faults)
             if (d := f.tail_distribution() if hasattr(f, "tail_distribution") else None)
             is not None and not d.variance_finite]
    if len(heavy) == 1:
        out.append(f"faults[{heavy[0]}].tail has infinite variance")
    elif heavy:  # one line, not one per fault (a campaign of 30 degradations printed 30)
        out.append(f"faults[{index_ranges(heavy)}].tail have infinite variance")
    return out


def index_ranges(indices: list[int]) -> str:
    """Sorted indices as runs: ``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _sharding_keys(model: Model, per_device, n_dev: int) -> dict[str, Any]:
    """``sharding`` (only for sharded data parallelism, ``workloads.sharding``): strategy,
    shard-group size, exposed all-gather wait and sharding-stream busy time per device, and
    the memory breakdown of every stage."""
    sh = model.scenario.workload.sharding
    if sh.strategy == "none":
        return {}
    from workloads.sharding import shard_degree

    return {"sharding": {
        "strategy": sh.strategy,
        "shard_group": shard_degree(sh, model.scenario.workload.parallelism.dp),
        "prefetch": sh.prefetch,
        "allgather_wait_per_device_s": per_device("shard_wait_s") / n_dev,
        "stream_time_per_device_s": per_device("shard_stream_s") / n_dev,
        "memory_gb": {f"stage{m.stage}": m.breakdown_gb() for m in model.stage_memory},
    }}


def _memory_keys(ex) -> dict[str, Any]:
    """HBM contention keys (``devices.memory``): mean/max slowdown of the blocks' memory
    time, and the heavy-tail / stability flags with twin.kernel.queueing's warnings."""
    from devices.interference import no_streams_report, streams_report
    from devices.memory import roofline_report

    mem = getattr(ex.accelerators[0], "memory", None) if ex.accelerators else None
    out = roofline_report() if mem is None else mem.report()
    streams = getattr(ex, "streams", None)
    if streams:
        out |= streams_report(streams)
        lat = streams[0].latency
        if lat is not None:  # memory.bound auto: the latency-bound kernels' draws
            rep = lat.report()
            out["memory_latency"] = {k.removeprefix("memory_"): v for k, v in rep.items()
                                     if k not in ("memory_model", "memory_bound")}
            out["memory_variance_infinite"] |= rep["memory_variance_infinite"]
            out["memory_converged"] &= rep["memory_converged"]
            out["memory_unstable"] |= rep["memory_unstable"]
            out["memory_warnings"] = out["memory_warnings"] + [
                f"latency-bound kernels: {w}" for w in rep["memory_warnings"]]
    else:
        out |= no_streams_report()
    return out


def _optimistic(ex) -> tuple[int, int]:
    """(TP collectives run ahead where other traffic may reach their links, runs taken back
    by such traffic) of an executor (``workloads.optimistic``; zeros when not used)."""
    opt = getattr(ex, "optimistic", None)
    return (0, 0) if opt is None else (int(opt.collectives), int(opt.rewinds))


def _fluid(fabric) -> tuple[int, int]:
    """(TP collectives run as fluid jobs at their HBM ports' caps, phases of them handed to
    the flow network) of a fabric (``devices.fluid``; zeros when not used)."""
    fl = getattr(fabric, "fluid", None)
    return (0, 0) if fl is None else (int(fl.jobs), int(fl.handoffs))


def _power_keys(model: Model, ex, fabric, breakdown: dict[str, float], energy: float,
                it_end: np.ndarray, makespan: float, exec_flops: float,
                it_time: float) -> dict[str, Any]:
    """Power, alert and limits keys (devices.power_report, twin.limits)."""
    from twin.limits import compute_limits, shannon_limit
    from twin.per_device import link_energy_j

    scen = model.scenario
    acc = ex.accelerators
    n_dev = int(class_sizes(model).sum())
    peak = scen.cluster.device.peak_flops(scen.workload.precision)
    setup = acc[0].power
    alerts = collect_alerts(setup, acc, it_end, model_flops_per_iteration(model), n_dev, peak,
                            makespan, float(fabric.idle_w.sum()), breakdown["network"])
    iters = scen.workload.iterations  # per-iteration figures as in the rest of the summary
    out = power_summary(setup, acc, breakdown, energy, exec_flops, alerts)
    topo = model.topo
    inject = float(fabric.capacity[np.asarray(topo.link_src) < topo.n_devices].sum())
    types = [str(topo.edge_attr(i, "link")) for i in range(topo.n_links)]
    specs = {k: v.model_dump() for k, v in scen.cluster.link_specs().items()}
    shannon = shannon_limit(types, fabric.link_bytes / iters,
                            link_energy_j(fabric, makespan) / iters, specs,
                            scen.power.thermal.ambient_c + 273.15)
    lim = compute_limits(
        it_time, energy / iters, np.array([a.stats.gemm_flops / iters for a in acc]), peak,
        fabric.link_bytes / iters, fabric.capacity, inject,
        float(fabric.bytes_sent.sum()) / iters, exec_flops / iters, scen.workload.precision,
        scen.power.thermal.ambient_c, shannon)
    out["limits_orders_of_magnitude"] = {k: v["orders_of_magnitude"] for k, v in lim.items()}
    return out
