"""Run one scenario: build, simulate, write the trace, summarize.

``run(scenario)`` is a pure function of the scenario (including its seed): the same scenario
gives the same trace, bit for bit.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from devices.accelerator import Accelerator
from devices.fabric import Fabric
from devices.memory import build_memory_model
from devices.power import PowerSetup
from devices.power_manager import ClusterPowerManager
from devices.replicas import QuotientBroken, quotient_for
from scenarios.faults import FaultInjector, interrupts_traffic
from twin import aggregate
from twin.budget import check_power_samples
from twin.build import Model, build, stage_compute_blocks
from twin.kernel.engine import Engine
from twin.kernel.errors import InfeasibleConfig, Problem, ScenarioError
from twin.kernel.records import Recorder
from twin.kernel.rng import RngStreams
from twin.kernel.trace import TraceWriter
from twin.outputs import check_output
from twin.per_device import (
    DEVICE_COLUMNS,
    DEVICE_UNITS,
    class_inlets,
    device_columns,
    router_energy_j,
)
from twin.recording import TraceRecorder, write_phase_links, write_power_tables
from twin.scenario import Scenario
from twin.summary import summarize
from twin.version import __version__
from workloads.data import DATA_COLUMNS, DATA_UNITS, build_data_path
from workloads.executor import Executor
from workloads.job import JobController


@dataclass(frozen=True)
class RunResult:
    """What a run returns: the summary (SI units), where the trace is (None if disabled) and
    the time of every completed iteration (s; from one completion to the next, so a restart
    lands on the first iteration redone)."""

    summary: dict[str, Any]
    trace_path: Path | None
    iteration_times_s: tuple[float, ...] = ()
    notes: tuple[str, ...] = ()  # e.g. stale partial traces of a killed run that were removed


#: collector thresholds while a simulation runs (see _frozen_heap): the youngest generation's
#: at least, and per agent; the older generations'
_RUN_GC_YOUNG, _RUN_GC_YOUNG_PER_AGENT, _RUN_GC_OLDER = 100_000, 200, (50, 100)


@contextmanager
def _frozen_heap(agents: int):
    """Exempt everything built before the simulation (topology, routes, programs, agents)
    from the cyclic garbage collector while it runs: its full collections otherwise rescan
    that heap again and again, a cost that grows with devices x events (about 10% of a
    1024-device run without symmetry). And collect less often while it runs: the run makes
    millions of short-lived events, generators and arrays, few of them in cycles, and at the
    default thresholds (700, 10, 10) the collector took another 10% of a 1024-device run
    without symmetry (9,700 young and 79 full collections). A young collection walks every
    young object alive, and what is alive grows with the ``agents``: those running ahead of
    the clock keep a log of what they may have to take back (``workloads.optimistic``),
    ~75,000 young objects at each collection of a 4096-device run with compute jitter (512
    agents), ~4x that at 16384 devices. So a young collection comes every 200 net
    allocations per agent (at least 100,000): 4 young collections in that 4096-device run,
    0.2 s, instead of 109 and 2.4 s at the 10,000 of before, and 2 (0.5 s) instead of 23
    (3.0 s) at 16384 devices (``gc.callbacks``; docs/notes/issue-14.md, session 41); the
    peak memory is the same. Both undone afterwards; nothing is freed any later."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(_RUN_GC_YOUNG, _RUN_GC_YOUNG_PER_AGENT * agents), *_RUN_GC_OLDER)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def uses_chaining(scen: Scenario) -> bool:
    """Whether pipeline sends and single-class tensor-parallel collectives run as chained
    fabric transfers instead of processes (same times; only where nothing can abort them or
    cut their links: no faults but ones that only change a device, such as stragglers; and
    not in ``simulation.exact`` mode)."""
    return (not interrupts_traffic(scen.faults) and scen.network.model == "flow"
            and not scen.simulation.exact)


def uses_run_ahead(scen: Scenario, recorder: Recorder) -> bool:
    """Whether agents may run compute blocks and closed-form TP collectives ahead of the clock
    (``Executor``'s ``run_ahead``; bit-identical results, fewer events): chained transfers, and
    nothing that reads or changes a device between its own instructions (no power manager, no
    data path, no communication energy booked onto the devices by other streams; the classes a
    fault changes, ``FaultInjector.device_classes``, stay on the clock) and no
    trace (whose op rows would come out in another order)."""
    return (uses_chaining(scen) and scen.power.manager.budget_w is None
            and not scen.data.enabled and not scen.power.communication_energy
            and type(recorder) is Recorder)


def lockstep_ring_model(scen: Scenario) -> bool:
    """Whether ring collectives run lock-step (``Scenario.rings``: ``network.ring_model``
    ``lockstep``, or ``auto``, in the flow model, HBM ports or not), in every mode, on the
    replica quotient too (a lock-step flow of orbit representatives is the full network's
    rings, each lock-step). Faults that cut links resend a cut ring whole
    (``devices.fabric``)."""
    return scen.rings == "lockstep"


def lockstep_tp_shortcut(scen: Scenario) -> bool:
    """Whether tensor-parallel ring phases go lock-step as a fast-mode shortcut under the
    step ring model (``Scenario.rings``): chained transfers (fast mode, flow model, no
    faults) and rank symmetry off (jitter, positions), where rings run out of step and the per-flow
    model pays an event per ring step on components spanning the cluster; not with HBM
    ports (``transfers_capped``): each member's port is capped by its own device's blocks,
    so the members' rates differ whenever those differ, and lock-step would then change the
    step model's answer (the lock-step ring model is its own model: ``Scenario.rings``).
    (Symmetry off also means no replica quotient.)"""
    return (uses_chaining(scen) and not scen.symmetric and scen.simulation.lockstep_rings
            and not transfers_capped(scen))


def uses_quotient(scen: Scenario) -> bool:
    """Whether a run may send one representative replica's flows on the quotient network of
    a replica shift (``devices.replicas``): rank symmetry on, the flow model, no faults of any
    kind, more than one data-parallel replica."""
    return (scen.symmetric and scen.network.model == "flow" and not scen.faults
            and scen.workload.parallelism.dp > 1)


def simulate_untraced(model: Model) -> tuple[Engine, Fabric, Executor, list]:
    """:func:`simulate` without a trace, on the quotient network of a replica shift where
    :func:`uses_quotient` allows it; a run that meets a phase that is not replica-symmetric
    (``QuotientBroken``) is simulated again with every flow, and ``fabric.quotient_fallback``
    says why."""
    if not uses_quotient(model.scenario):
        return simulate(model, Recorder())
    try:
        return simulate(model, Recorder(), quotient=True)
    except QuotientBroken as exc:
        out = simulate(model, Recorder())
        out[1].quotient_fallback = str(exc)
        return out


def simulate(model: Model, recorder: Recorder, message_sink=None,
             record_data: bool = False,
             quotient: bool = False) -> tuple[Engine, Fabric, Executor, list]:
    """Run the SimPy model to completion; returns engine, fabric, executor (its ``data``: the
    data path or None) and fault rows. ``record_data`` keeps the data path's load rows;
    ``quotient`` sends one representative replica's flows where a replica shift is found
    (``devices.replicas``; the caller handles ``QuotientBroken``)."""
    scen = model.scenario
    lim = scen.simulation.limits
    env = Engine(max_events=lim.max_events, max_time=lim.max_sim_time_s)
    net = scen.network
    fabric = Fabric(env, model.topo, model.router, scen.cluster.link_specs(),
                    model=net.model, packet_bytes=net.packet_kib * 1024,
                    retransmit_timeout_s=net.retransmit_timeout_s, record=message_sink,
                    hbm_ports=transfers_capped(scen),
                    lockstep_rings="all" if lockstep_ring_model(scen)
                    else lockstep_tp_shortcut(scen), ring_substeps=net.ring_substeps)
    if quotient:
        fabric.set_quotient(quotient_for(model.layout, model.router, fabric))
    rngs = RngStreams(scen.seed)
    sigma = Accelerator.sigma_for_cov(scen.simulation.compute_jitter_cov)
    power = PowerSetup(scen.power, model.compute, stage_compute_blocks(model),
                       model.microbatches, model.layout.world)
    power.class_ambient_c = class_inlets(model)  # inlet air by position (power.thermal)
    groups = model.layout.tp_groups  # one agent per TP group: each member's own stream
    accelerators = [Accelerator(env, c, len(ranks), model.compute, recorder, sigma,
                                rngs.get(f"class/{c}"), power,
                                int(model.layout.class_stage[c]),
                                [rngs.get(f"class/{r}") for r in ranks] if groups else None)
                    for c, ranks in enumerate(model.layout.classes)]
    streams, pcie = device_streams(scen, model, env, accelerators, rngs, fabric)
    if scen.power.manager.budget_w is not None:
        power.manager = ClusterPowerManager(env, power, accelerators, float(fabric.idle_w.sum()))
    job = JobController(env, scen.job.policy(), scen.workload.iterations,
                        network_energy=lambda: float(fabric.link_bytes @ fabric.energy_per_byte)
                        + router_energy_j(model, fabric))
    data = None
    if scen.data.enabled:  # the input pipeline (workloads.data)
        w, topo = scen.workload, scen.cluster.topology
        data = build_data_path(env, scen.data, model.layout, topo.kind, topo.shape,
                               w.micro_batch, w.seq, w.model.vocab, model.microbatches,
                               w.iterations, record=record_data,
                               pcie_port=copy_ports(model, pcie, streams),
                               on_copied=_copy_energy(scen, accelerators))
    executor = Executor(env, model.layout, fabric, model.programs, model.blocks, accelerators,
                        scen.workload.iterations, recorder, job=job,
                        chained=uses_chaining(scen), data=data, overlap=scen.overlap,
                        streams=streams, comm_energy=_comm_energy(scen),
                        closed_form=uses_chaining(scen),
                        run_ahead=uses_run_ahead(scen, recorder),
                        optimistic=scen.simulation.optimistic_tp and lockstep_tp_shortcut(scen))
    injector = FaultInjector(env, scen.faults, fabric, executor, job, model.layout, rngs)
    executor.clocked = injector.device_classes()  # a fault changes their devices any time
    if injector.has_tails:
        executor.before_block = injector.before_block
    injector.start()
    # ends when every iteration is done, or when failures cut the job off for good
    try:
        with _frozen_heap(len(accelerators)):
            env.run(until=env.any_of([executor.done, injector.stalled]))
    except (OverflowError, FloatingPointError) as exc:
        th = scen.power.thermal
        raise InfeasibleConfig([Problem(
            "power.thermal", f"the simulation diverged at t = {env.now:.6g} s ({exc}): a "
            f"quantity grew beyond floating-point range, e.g. a thermal runaway (leakage "
            f"rising with die temperature) with inlet air at {th.ambient_c:g} C plus cooling "
            f"failures and throttle {'on' if th.throttle else 'off'}", None,
            "cooler inlet air, smaller cooling_failure rise_k, or power.thermal.throttle: "
            "true")]) from None
    executor.finish(env.now)
    check_power_samples(scen, env.now)
    return env, fabric, executor, injector.table_rows()


def _comm_energy(scen: Scenario):
    """SM shares of communication kernels when they draw device energy
    (``power.communication_energy``), else None."""
    if not scen.power.communication_energy:
        return None
    from devices.interference import device_sm_shares

    return device_sm_shares(scen.cluster.device)


def _copy_energy(scen: Scenario, accelerators: list[Accelerator]):
    """``on_copied`` of the data path when communication draws device energy
    (``power.communication_energy``): a host-to-device copy writes its bytes to the
    device's HBM at the catalog's ``hbm_pj_per_bit`` (copy engines: no SMs); else None."""
    if not scen.power.communication_energy:
        return None

    def on_copied(cls: int, t0: float, t1: float, nbytes: float) -> None:
        accelerators[cls].communication(t0, t1, nbytes, 0, 0.0, copy=True)

    return on_copied


def _h2d_bytes_per_s(scen: Scenario) -> float:
    """Rate of one host-to-device copy stream (0 without a data path), B/s."""
    d = scen.data
    if not d.enabled or d.host is None:
        return 0.0
    if d.pcie_switch is not None:
        from devices.pcie import load_pcie_spec

        return load_pcie_spec(d.pcie_switch).port_gbps * 1e9
    return (d.pcie_gbps or d.host.pcie_h2d_gbps) * 1e9


def transfers_capped(scen: Scenario) -> bool:
    """Whether transfers pay for HBM contention (``Scenario.transfers_capped``)."""
    return scen.transfers_capped


def device_streams(scen: Scenario, model: Model, env, accelerators: list[Accelerator],
                   rngs: RngStreams, fabric=None) -> tuple[list | None, object]:
    """The device agents of every class (``devices.interference``) and the PCIe fabric of the
    data path (``devices.pcie``), or ``(None, None)`` when nothing is shared (roofline memory,
    no SM contention): then nothing changes from the plain roofline. With
    ``memory.transfer_cap`` each agent caps its devices' HBM ports on ``fabric``."""
    cl, mem = scen.cluster, scen.memory
    h2d = _h2d_bytes_per_s(scen)
    bound = "bandwidth" if mem.bound == "auto" else None
    memory = build_memory_model(mem, cl.device, cl.link, cl.links_per_edge, rngs.get("memory"),
                                h2d_bytes_per_s=h2d, bound=bound)
    if memory is None and not scen.sm_shared:
        return None, None
    from devices.interference import DeviceStreams, device_sm_shares

    latency = None
    if memory is not None and mem.bound == "auto":
        latency = build_memory_model(mem, cl.device, cl.link, cl.links_per_edge,
                                     rngs.get("memory/latency"), h2d_bytes_per_s=h2d,
                                     bound="latency")
    pcie = None
    if scen.data.enabled:
        from devices.pcie import PcieFabric, PcieSpec, load_pcie_spec

        d = scen.data
        spec = (load_pcie_spec(d.pcie_switch) if d.pcie_switch is not None
                else PcieSpec(gpus_per_switch=1, port_gbps=h2d / 1e9, uplink_gbps=h2d / 1e9))
        pcie = PcieFabric(env, spec, d.node_gpus(cl.topology.kind, cl.topology.shape))
    lay = model.layout
    nic = pcie is not None and cl.nic_link is not None  # network streams leave by the NIC
    shares = device_sm_shares(cl.device) if cl.device.compute_units and scen.sm_shared else None
    out = []
    for c, acc in enumerate(accelerators):
        devs = [int(lay.device[r]) for r in lay.classes[c]]
        on_net = ((lambda delta, devs=devs: pcie.nic(devs, delta)) if nic else None)
        # one agent for many ranks: one draw per member of the TP group that meets after
        # each block (DeviceStreams.price)
        group = (scen.workload.parallelism.tp if (model.symmetric or model.layout.tp_groups)
                 and acc.n > 1 else 1)
        on_ports = (partial(fabric.set_port_capacity, devs)
                    if fabric is not None and getattr(fabric, "ports", False) else None)
        agent = DeviceStreams(env, acc.n, cl.device.compute_units, shares, memory, latency,
                              mem.latency_below_mb * 1e6, rngs.get(f"memory/class/{c}"),
                              on_net, group=min(group, acc.n), on_ports=on_ports)
        acc.streams = agent
        acc.memory = memory  # its memory_* report (the agent draws)
        out.append(agent)
    return out, pcie


def copy_ports(model: Model, pcie, streams: list | None):
    """``pcie_port(rank)`` for the data path: a copy port on the rank's PCIe switch that
    starts and ends an ``h2d`` stream on its class's device agent, one stream per device
    however many of the class's ranks copy at once (None: the data path's own ports, nothing
    shared)."""
    if pcie is None or streams is None:
        return None
    lay = model.layout
    copying = [0] * len(streams)  # copies running on each class's ports

    def port(rank: int):
        c = int(lay.rank_class[rank])
        agent = streams[c]

        def on_copy(delta: int) -> None:
            # a port copies one at a time: the class's devices have one copy stream while
            # any of its simulated ranks copies (the ranks stand for its devices alike)
            copying[c] += delta
            if delta > 0 and copying[c] == 1:
                agent.start("h2d")
            elif delta < 0 and copying[c] == 0:
                agent.end("h2d")

        cap = agent.h2d_cap if model.scenario.memory.transfer_cap else None
        return pcie.port(int(lay.device[rank]), on_copy, cap)

    return port


def iteration_times(ex: Executor) -> tuple[float, ...]:
    """Time of every completed iteration, s (completion of the slowest class to the next)."""
    done = min(len(s.iteration_end) for s in ex.stats)
    ends = np.array([s.iteration_end[:done] for s in ex.stats]).reshape(len(ex.stats), done)
    return tuple(float(x) for x in np.diff(np.concatenate([[0.0], ends.max(axis=0)])))


def run(scenario: Scenario, trace_path: str | Path | None = None) -> RunResult:
    """Simulate ``scenario`` and write its trace.

    Args:
        scenario: a validated scenario (see :func:`twin.load_scenario`).
        trace_path: overrides ``scenario.trace.path``.
    """
    wall0 = time.perf_counter()
    if not scenario.trace.enabled:
        agg = aggregate.plan(scenario)
        fallback = None
        if agg is not None:
            hit, fallback = _aggregated(scenario, agg, wall0)
            if hit is not None:
                return hit
        model = build(scenario)
        env, fabric, ex, _faults = simulate_untraced(model)
        summary = summarize(model, env, fabric, ex, time.perf_counter() - wall0)
        _not_aggregated(summary, fallback)
        return RunResult(summary, None, iteration_times(ex))
    path = check_output(trace_path or scenario.trace_path,
                        "-o" if trace_path else "trace.path", "trace", force=True)
    model = build(scenario)
    try:
        summary, out, ex, notes = _traced(scenario, model, path, trace_path, wall0,
                                          uses_quotient(scenario), None)
    except QuotientBroken as exc:  # the partial trace is gone (TraceWriter.__exit__)
        summary, out, ex, notes = _traced(scenario, model, path, trace_path, wall0, False,
                                          str(exc))
    return RunResult(summary, out, iteration_times(ex), notes)


def _traced(scenario: Scenario, model: Model, path: Path, trace_path, wall0: float,
            quotient: bool, fallback: str | None
            ) -> tuple[dict[str, Any], Path, Executor, tuple[str, ...]]:
    """Simulate ``model`` writing its trace to ``path``; returns the summary, the trace's
    path, the executor and notes. ``quotient``: on the quotient network of a replica shift
    (``QuotientBroken`` propagates, and the partial trace is deleted); ``fallback``: why an
    earlier attempt on it was given up (recorded in the summary)."""
    tables = set(scenario.trace.tables)
    try:
        writer = TraceWriter(path, scenario.trace.compression)
    except OSError as exc:
        raise ScenarioError([Problem("-o" if trace_path else "trace.path", "the trace cannot "
                                     f"be written ({exc.strerror or exc})", str(path)[:120],
                                     "a writable file path")]) from None
    notes = tuple(f"removed stale partial trace {p} (left by a run that was killed)"
                  for p in writer.stale_removed)
    with writer:
        rec = TraceRecorder(writer, tables)
        env, fabric, ex, faults = simulate(model, rec, rec.message, "data" in tables, quotient)
        fabric.quotient_fallback = fallback
        summary = summarize(model, env, fabric, ex, time.perf_counter() - wall0)
        _not_aggregated(summary, None)
        _static_tables(writer, tables, model, fabric, ex, env.now, faults)
        if "devices" in tables:
            cols = device_columns(model, fabric, ex, env.now)
            writer.table("devices", DEVICE_COLUMNS, DEVICE_UNITS).extend(
                {k: cols[k] for k in DEVICE_COLUMNS})
        write_power_tables(writer, ex.accelerators, tables)
        write_phase_links(writer, fabric, tables)
        summary["wall_time_s"] = time.perf_counter() - wall0
        out = writer.finish({
            "twin_version": __version__, "seed": scenario.seed,
            "scenario": scenario.to_yaml(), "summary": summary, "sources": scenario.sources,
        })
    return summary, out, ex, notes


def _not_aggregated(summary: dict[str, Any], fallback: dict[str, Any] | None) -> None:
    """Aggregation keys of a run that simulated every microbatch (``fallback``: the reduced
    runs it tried first and why they were not used)."""
    summary["microbatches_simulated"] = [summary["microbatches"]]
    summary["aggregation"] = fallback
    if fallback is not None:
        summary["events"] += sum(fallback["events_simulated"])  # what the run cost


def _aggregated(scenario: Scenario, agg: aggregate.Plan,
                wall0: float) -> tuple[RunResult | None, dict[str, Any] | None]:
    """Simulate the reduced microbatch counts of ``agg`` and extrapolate (``twin.aggregate``);
    returns ``(result, None)``, or ``(None, fallback record)`` when the extrapolation is not
    accurate enough and the full run must be simulated."""
    summaries, link_bytes, its, busy = [], [], [], []
    capacity = np.zeros(0)
    for mb in agg.counts:
        model = build(aggregate.reduced(scenario, mb))
        if not summaries and (reason := aggregate.unsteady(model)) is not None:
            return None, {"fallback": reason, "microbatches_tried": [], "events_simulated": []}
        env, fabric, ex, _faults = simulate_untraced(model)
        summaries.append(summarize(model, env, fabric, ex, 0.0))
        link_bytes.append(fabric.link_bytes)
        capacity = fabric.capacity
        its.append(iteration_times(ex))
        busy.append(np.array([a.stats.compute_s for a in ex.accelerators]))
    summary, reason = aggregate.combine(agg, summaries, link_bytes, capacity, busy)
    if summary is None:
        return None, {"fallback": reason, "microbatches_tried": list(agg.counts),
                      "events_simulated": [int(s["events"]) for s in summaries]}
    summary["wall_time_s"] = time.perf_counter() - wall0
    h = agg.step
    times = tuple(float(c + (c - b) * (agg.m - agg.counts[2]) / h)
                  for _a, b, c in zip(*its, strict=True))
    return RunResult(summary, None, times), None


def _static_tables(writer: TraceWriter, tables: set[str], model: Model, fabric: Fabric,
                   ex: Executor, makespan: float, faults: list) -> None:
    topo, lay = model.topo, model.layout
    if "links" in tables:
        nbytes = fabric.link_bytes
        busy = fabric.link_busy_s
        names = [topo.edge_attr(i, "link") for i in range(topo.n_links)]
        dims = [topo.edge_attr(i, "dim") for i in range(topo.n_links)]
        tiers = [topo.graph.edges[int(topo.link_src[i]), int(topo.link_dst[i])].get("tier", "")
                 for i in range(topo.n_links)]
        t = writer.table("links", {
            "link": "int32", "src": "int32", "dst": "int32", "type": "category", "dim": "int32",
            "tier": "category", "capacity": "float64", "bytes": "float64", "busy_s": "float64",
            "utilization": "float64", "energy_j": "float64"},
            {"capacity": "B/s", "bytes": "B", "busy_s": "s", "utilization": "fraction",
             "energy_j": "J"})
        util = nbytes / (fabric.capacity * makespan) if makespan > 0 else np.zeros_like(nbytes)
        energy = nbytes * fabric.energy_per_byte + fabric.idle_w * makespan
        t.extend({"link": np.arange(topo.n_links), "src": topo.link_src, "dst": topo.link_dst,
                  "type": names, "dim": dims, "tier": tiers, "capacity": fabric.capacity,
                  "bytes": nbytes,
                  "busy_s": busy, "utilization": util, "energy_j": energy})
    if "ranks" in tables:
        r = np.arange(lay.world)
        d, p, tpi = lay.coords(r)
        dev = lay.device
        coords = topo.coords[dev]
        deg = topo.degree()[dev]
        z = coords[:, 2] if coords.shape[1] > 2 else np.zeros(len(dev), dtype=np.int64)
        t = writer.table("ranks", {"rank": "int32", "device": "int32", "x": "int32",
                                   "y": "int32", "z": "int32", "dp": "int32", "pp": "int32",
                                   "tp": "int32", "cls": "int32", "degree": "int32"})
        t.extend({"rank": r, "device": dev, "x": coords[:, 0], "y": coords[:, 1], "z": z,
                  "dp": d, "pp": p, "tp": tpi, "cls": lay.rank_class, "degree": deg})
    if "data" in tables and ex.data is not None:
        writer.table("data", DATA_COLUMNS, DATA_UNITS).extend(ex.data.table())
    if "faults" in tables:
        t = writer.table("faults", {"time_s": "float64", "kind": "category",
                                    "target": "category", "action": "category"},
                         {"time_s": "s"})
        for row in faults:
            t.append(*row)
