"""Resource budget of a run, estimated from the scenario before anything is built.

:func:`estimate` derives, with plain arithmetic on the validated scenario (no topology, no
layout, no array is built), the quantities a run allocates or processes: devices, directed
links, microbatches, simulated ranks (classes), events, packets, power-window samples, a lower
bound of the simulated time and the memory all that takes. :func:`check_budget` compares them
with ``simulation.limits`` (:class:`LimitsSpec`) and returns a problem for each one exceeded,
saying what the scenario would need and which key to change, so an absurd scenario
(``shape: [100000, 100000]``, ``global_batch: 1e9``, 1-byte packets, failures every
microsecond) is refused in milliseconds with exit code 2 instead of running out of memory.

The estimates are orders of magnitude, not predictions; each constant says where it comes
from. They are deliberately generous towards real layouts: the benchmark layouts
(``experiments/bench_e2e``: GPT-3 175B on up to 16384 devices) and every library scenario are
far below the defaults (``tests/test_robust.py`` checks both).

At run time the engine enforces ``max_events`` and ``max_sim_time_s`` again
(:class:`twin.kernel.engine.Engine`), and :func:`check_power_samples` refuses a telemetry
window that the real makespan would cut into too many samples.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from pydantic import Field

from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.schema import StrictModel

#: A validated ``twin.scenario.Scenario`` (not imported: the scenario module imports this one).
Scenario = Any

#: estimate: events per (microbatch x layer x iteration) of one simulated rank class;
#: measured 6-8 for the library scenarios without tensor parallelism (e.g. quickstart: 516
#: events / (1 class x 2 microbatches x 16 layers x 2 iterations)) and ~30 with TP 8 x PP 8
#: (bench_e2e, 1024 devices: 93375 events / (8 classes x 32 microbatches x 12 layers)).
EVENTS_PER_MICROBATCH_LAYER = 30
#: estimate: events per packet (hops, queueing, delivery); measured ~7 (quickstart with
#: network.model packet: 988314 events for ~1.4e5 packets of 1 MiB over 1-2 hops).
EVENTS_PER_PACKET = 10
#: estimate: kernels one rank launches per microbatch and layer (forward, backward and
#: recompute GEMMs and element-wise kernels of attention and MLP).
KERNELS_PER_MICROBATCH_LAYER = 30
#: estimate: resident memory of the process before the scenario's own data, bytes.
BASE_BYTES = 0.4e9
#: estimate: bytes per device (topology graph node, layout and per-device arrays, routes);
#: bench_e2e: 0.25 GiB at 1024 devices, 1.5 GiB at 4096 -> ~0.4 MB per device, doubled.
BYTES_PER_DEVICE = 0.8e6
#: estimate: bytes per directed link (NetworkX edge, fabric arrays, route cache share).
BYTES_PER_LINK = 4e3
#: estimate: bytes per simulated event kept in memory (program ops, pending SimPy events).
BYTES_PER_EVENT = 200.0
#: estimate: bytes per power-window sample (window edges, energy curve, intermediate arrays).
BYTES_PER_SAMPLE = 64.0
#: estimate: bytes per simulated HBM request held at once (arrival, service, order, result).
BYTES_PER_REQUEST = 40.0
#: Slowest HBM traffic of one transfer the contention models simulate, bytes/s. Each HBM batch
#: gives every DMA stream at least 16 Poisson requests, and the FR-FCFS engine simulates (with
#: refresh) until the last completes: at 1 MB/s that is ~1 ms of HBM time (2 s of CPU for a
#: whole run), at 1 B/s ~1000 s (hours). Contention from such a trickle is nil (< 1e-6 of HBM).
MIN_DMA_BYTES_PER_S = 1e6
#: Poisson arrivals: more than this many expected job-stopping failures per attempt of an
#: iteration means exp(that) attempts, i.e. a job that never finishes.
MAX_FAILURES_PER_ATTEMPT = 30.0


class LimitsSpec(StrictModel):
    """``simulation.limits``: what one run may use. A scenario whose estimate exceeds a limit
    is refused before it is built; a run that exceeds ``max_events`` or ``max_sim_time_s``
    anyway is stopped (both with exit code 2 and a message naming the key)."""

    max_devices: int = Field(default=1 << 20, ge=1, le=1 << 40,
                             description="devices of the topology")
    max_events: int = Field(default=10_000_000, ge=1, le=1 << 50,
                            description="simulated events (estimated up front, enforced at "
                                        "run time)")
    max_memory_gb: float = Field(default=64.0, gt=0, le=1e6, allow_inf_nan=False,
                                 description="estimated memory of the run, GB")
    max_sim_time_s: float = Field(default=1e8, gt=0, le=1e15, allow_inf_nan=False,
                                  description="simulated time, s (~3 years by default)")
    max_power_samples: int = Field(default=50_000_000, ge=1, le=1 << 50,
                                   description="power-window samples (makespan / "
                                               "power.alerts.window_s)")


@dataclass(frozen=True)
class Estimate:
    """What a scenario implies (orders of magnitude)."""

    devices: int
    links: int
    microbatches: int
    classes: int
    events: float
    packets: float
    fault_events: float
    power_samples: float
    sim_time_s: float
    memory_bytes: float
    hbm_requests: float
    iteration_s: float
    thermal_steps: float


def _links(kind: str, shape: tuple[int, ...], n: int) -> int:
    """Directed links of a topology kind and shape (graph edges x 2; ``topologies.graph``)."""
    if kind in ("torus2d", "mesh2d"):
        return 4 * n
    if kind == "torus3d":
        return 6 * n
    if kind == "ring":
        return 2 * n
    if kind == "dragonfly2d":
        a, g = shape
        return g * a * (a - 1) + g * (g - 1)
    return 8 * n  # switched: GPU-NVSwitch, NIC-leaf and leaf-spine ports, generously


def estimate(scen: Scenario) -> Estimate:
    """The resource estimate of a validated scenario (arithmetic only; see module doc)."""
    from workloads.feasibility import microbatches
    from workloads.transformer import TransformerCosts

    topo, w = scen.cluster.topology, scen.workload
    par, model = w.parallelism, w.model
    n = topo.num_devices
    links = _links(topo.kind, tuple(topo.shape), n)
    m = max(microbatches(w), 1)
    classes = (min(par.world, par.pp) if scen.symmetric
               else par.world // par.tp if scen.tp_groups else par.world)
    layers_per_stage = max(model.layers // par.pp, 1)
    iters = w.iterations
    work = float(m) * layers_per_stage
    events = float(EVENTS_PER_MICROBATCH_LAYER) * classes * work * iters
    if scen.overlap.tp_comm and par.tp > 1:  # chunked TP overlap: each block is tp_chunks
        events *= scen.overlap.tp_chunks + 1  # of compute + collectives (measured 4.9x at 4:
        # experiments/bench_contention, GPT-3 on 64 devices, 447774 vs 91422 events)

    if ring_parts(scen) > 1:
        # rings out of step (faults, jitter) pay an event per member and barrier part
        # (measured: the library's fault_accelerator.yaml 12,886 events at 1 part, 141,217
        # at 16, 551,878 at 64; symmetric runs mostly stay in step: not counted there)
        events *= ring_parts(scen)
    tc = TransformerCosts(model, w.precision, w.micro_batch, w.seq, par.tp,
                          w.sequence_parallel, w.recompute, w.attention)
    dev = scen.cluster.device
    # lower bound of one iteration on one rank: its FLOPs at peak, or its kernels' overheads
    flops = tc.model_flops_per_microbatch() * m / max(par.tp * par.pp, 1)
    t_flops = flops / dev.peak_flops(w.precision) if dev.supports(w.precision) else 0.0
    t_kernels = KERNELS_PER_MICROBATCH_LAYER * work * dev.kernel_overhead_us * 1e-6
    t_iter = max(t_flops, t_kernels)

    per_rank = _bytes_per_rank(scen, tc, m, layers_per_stage)
    link = scen.cluster.link
    t_comm = per_rank / (link.bytes_per_s * scen.cluster.links_per_edge)
    t_iter = max(t_iter, t_comm)  # the bytes must cross the rank's link at least once
    packets = 0.0
    if scen.network.model == "packet":
        # every rank's transfers cross the fabric, symmetric or not
        packets = per_rank * par.world * iters / (scen.network.packet_kib * 1024.0)
        events += EVENTS_PER_PACKET * packets

    fault_events, sim_time = _faults(scen, n, links, t_iter, iters)
    events += fault_events
    thermal_steps = 0.0
    if scen.power.thermal.enabled:  # idle time is cut into segments of at most max_step_s
        thermal_steps = (classes * sim_time * _slowdown(scen, sim_time, t_iter)
                         / scen.power.thermal.max_step_s)
        events += thermal_steps
    power_samples = sim_time / scen.power.alerts.window_s
    hbm = hbm_requests(scen)
    memory = (BASE_BYTES + n * BYTES_PER_DEVICE + links * BYTES_PER_LINK
              + BYTES_PER_EVENT * min(events, float(EVENTS_PER_MICROBATCH_LAYER) * classes
                                      * work) + BYTES_PER_SAMPLE * power_samples
              + BYTES_PER_REQUEST * hbm)
    return Estimate(n, links, m, classes, events, packets, fault_events, power_samples,
                    sim_time, memory, hbm, t_iter, thermal_steps)


def _bytes_per_rank(scen: Scenario, tc: Any, m: int, layers_per_stage: int) -> float:
    """Bytes one rank sends per iteration: tensor-parallel all-reduces (4 per layer and
    microbatch), pipeline activations and gradients (2 per microbatch), a tied embedding's
    gradient between the first and last stage (2 of pp ranks send it), data-parallel ring
    all-reduce of its gradients (2 (dp-1)/dp of them), bytes."""
    w = scen.workload
    par = w.parallelism
    act = float(w.micro_batch) * w.seq * w.model.hidden * tc.e
    out = 0.0
    if par.tp > 1:
        out += 4 * act * 2 * (par.tp - 1) / par.tp * m * layers_per_stage
    if par.pp > 1:
        out += 2 * act * m
        if w.model.tied_embeddings:
            out += 2 / par.pp * w.model.vocab * w.model.hidden / par.tp * 2
    if par.dp > 1:
        params = tc.layer_params() * layers_per_stage / par.tp
        out += 2 * params * 2 * (par.dp - 1) / par.dp
    return out


def hbm_requests(scen: Scenario) -> float:
    """Requests of the largest HBM batch the contention model simulates (0 for roofline):
    ``n`` op requests plus ``max_streams`` DMA streams lasting as long as the op's arrivals,
    each ``n x dma_load / op_load`` requests (``devices.memory``)."""
    from devices.memory_spec import dma_rate_bytes_per_s

    mem, dev = scen.memory, scen.cluster.device
    if mem.model == "roofline":
        return 0.0
    peak = dev.hbm_bandwidth_gbps * 1e9
    dma_load = dma_rate_bytes_per_s(mem, scen.cluster.link, scen.cluster.links_per_edge) / peak
    op_load = mem.op.load if mem.op.load is not None else dev.memory_efficiency
    n = float(mem.requests_per_batch)
    return n * (1.0 + mem.max_streams * dma_load / op_load)


def _faults(scen: Scenario, n: int, links: int, t_iter: float,
            iters: int) -> tuple[float, float]:
    """Events of failure processes and the simulated-time lower bound with failures
    (infinite when job-stopping failures come too fast for any iteration to finish)."""
    rates: list[float] = []
    for f in scen.faults:
        ttf = getattr(f, "ttf", None)
        if ttf is None:
            continue
        ttr = getattr(f, "ttr", None)
        cycle = float(ttf.mean) + (float(ttr.mean) if ttr is not None else 0.0)
        targets = links // 2 if f.kind == "link_failure" else n
        rates.append(targets / cycle if cycle > 0 else math.inf)
    expected = (_stop_rate(scen, n) * (t_iter + scen.job.restart_s)
                + _cut_rate(scen) * _transfer_s(scen))
    attempts = math.inf if expected > MAX_FAILURES_PER_ATTEMPT else math.exp(expected)
    sim_time = iters * t_iter * attempts
    fault_events = sum(2 * r * sim_time for r in rates) if rates else 0.0
    return fault_events, sim_time


def _fault_factor(f: Any) -> float:
    """The slowdown a device fault applies while active: a straggler's factor, an HBM
    degradation's (x its tail's mean), at least 1; 1 for other kinds."""
    if f.kind == "straggler":
        return max(float(f.factor), 1.0)
    if f.kind == "hbm_degradation":
        tail = f.tail_distribution()
        return max(float(f.factor) * (tail.mean if tail is not None else 1.0), 1.0)
    return 1.0


def _slowdown(scen: Scenario, base_s: float, block_s: float) -> float:
    """Most the device faults may stretch a run of ``base_s`` seconds without them, as a
    factor. The devices that wait for a slowed one are idle that much longer, in thermal
    segments of at most ``power.thermal.max_step_s``: one device slowed 1000x for the whole
    run (a valid straggler) idled the 7 others ~1e7 segments, minutes and gigabytes, with an
    estimate that did not see it (found by the fuzzer, seed 19).

    A fault that may last the whole run (a failure process, a random or open window) counts
    its factor for all of it: those factors multiply (``G``). A fault with a fixed onset and
    ``duration_s`` stretches only the blocks that start inside its window, each by the
    factor then in force, at most ``F_i``: the product of the factors of every fixed window
    overlapping window ``i`` (overlaps on one device compound; taken over all devices,
    generously). The blocks a device starts in the window run one after another, so all but
    the last end inside it and the last takes at most ``F_i b``, with ``b`` the longest a
    block may take (``block_s``, times ``G``): window ``i`` of length ``d_i`` delays the run
    by at most ``d_i + F_i b``. The fixed windows' bound is ``1 + sum_i (d_i + F_i b) /
    base_s``, or the product of their factors when smaller (each lasting the whole run):
    sixty 1.5x stragglers of 20 ms each were counted as a 3.7e10x longer run and refused."""
    whole, fixed = 1.0, []
    for f in scen.faults:
        factor = _fault_factor(f)
        if factor <= 1.0:
            continue
        if f.time_s is not None and f.duration_s is not None:  # (stragglers, degradations)
            fixed.append((float(f.time_s), float(f.duration_s), factor))
        else:
            whole *= factor
    if not fixed:
        return whole
    product = math.prod(w[2] for w in fixed)
    if base_s <= 0:
        return whole * product
    # log F_i = sum of log factors of the windows with start <= end_i and end >= start_i:
    # (those starting by end_i) - (those ending before start_i, which all start before it)
    starts = sorted((t, math.log(f)) for t, _d, f in fixed)
    ends = sorted((t + d, math.log(f)) for t, d, f in fixed)
    s_key, e_key = [t for t, _ in starts], [t for t, _ in ends]
    s_sum = list(accumulate((v for _, v in starts), initial=0.0))
    e_sum = list(accumulate((v for _, v in ends), initial=0.0))
    block = block_s * whole
    delay = 0.0
    for t, d, _f in fixed:
        log_f = s_sum[bisect_right(s_key, t + d)] - e_sum[bisect_left(e_key, t)]
        delay += d + math.exp(min(log_f, 700.0)) * block
    return whole * min(product, 1.0 + delay / base_s)


def _cut_rate(scen: Scenario) -> float:
    """Failures per second of one link (or NIC) under the fastest link / NIC failure
    process: a transfer on it is cut and resent each time (``devices.fabric``)."""
    rate = 0.0
    for f in scen.faults:
        ttf = getattr(f, "ttf", None)
        if f.kind in ("link_failure", "nic_failure") and ttf is not None:
            mean = float(ttf.mean)
            rate = max(rate, 1.0 / mean if mean > 0 else math.inf)
    return rate


def _transfer_s(scen: Scenario) -> float:
    """Shortest time one gradient bucket takes over one link, s (a transfer can finish only
    if its link stays up that long)."""
    link = scen.cluster.link
    bucket = scen.workload.grad_bucket_mb * 1e6
    return ((link.latency_us + link.overhead_us) * 1e-6
            + bucket / (link.bytes_per_s * scen.cluster.links_per_edge))


def _stop_rate(scen: Scenario, n: int) -> float:
    """Job-stopping failures per second (accelerator failures restart the whole job)."""
    rate = 0.0
    for f in scen.faults:
        ttf = getattr(f, "ttf", None)
        if f.kind == "accelerator_failure" and ttf is not None:
            mean = float(ttf.mean)
            rate += n / mean if mean > 0 else math.inf
    return rate


def _fmt(x: float) -> str:
    if math.isinf(x):
        return "unbounded"
    return f"{x:.3g}"


def check_budget(scen: Scenario) -> list[Problem]:
    """A problem for every estimate above ``simulation.limits`` (empty when all fit)."""
    lim = scen.simulation.limits
    e = estimate(scen)
    out: list[Problem] = []
    if math.isinf(e.sim_time_s):
        return [_never_finishes(scen, e)]
    if e.devices > lim.max_devices:
        out.append(Problem("cluster.topology.shape", f"{e.devices} devices exceed "
                           f"simulation.limits.max_devices = {lim.max_devices}",
                           list(scen.cluster.topology.shape),
                           "a smaller shape, or raise simulation.limits.max_devices"))
    if e.memory_bytes > lim.max_memory_gb * 1e9:
        out.append(Problem("simulation.limits.max_memory_gb", f"the run would need about "
                           f"{_fmt(e.memory_bytes / 1e9)} GB ({e.devices} devices, {e.links} "
                           f"links, {_fmt(e.power_samples)} power-window samples, "
                           f"{_fmt(e.hbm_requests)} HBM requests per batch), more "
                           f"than the limit of {lim.max_memory_gb:g} GB", None,
                           "fewer devices, a coarser power.alerts.window_s, a smaller "
                           "memory.dma.rate_gbps or memory.requests_per_batch, or raise "
                           "simulation.limits.max_memory_gb"))
    dma = _dma_problem(scen)
    if dma is not None:
        out.append(dma)
    if e.events > lim.max_events:
        why = _why_events(scen, e)
        out.append(Problem("simulation.limits.max_events", f"the run would process about "
                           f"{_fmt(e.events)} events ({why}), more than the limit of "
                           f"{lim.max_events}", None,
                           "a smaller workload (global_batch, iterations, layers), larger "
                           "network.packet_kib or power.thermal.max_step_s, slower failure "
                           "processes, or raise "
                           "simulation.limits.max_events"))
    if e.sim_time_s > lim.max_sim_time_s:
        out.append(Problem("simulation.limits.max_sim_time_s", f"the run would simulate at "
                           f"least {_fmt(e.sim_time_s)} s, more than the limit of "
                           f"{lim.max_sim_time_s:g} s", None,
                           "faster links, fewer iterations, smaller kernel overheads, slower "
                           "failure processes (ttf) or a shorter job.restart_s, or raise "
                           "simulation.limits.max_sim_time_s"))
    elif e.power_samples > lim.max_power_samples:
        out.append(Problem("power.alerts.window_s", f"a simulated time of at least "
                           f"{_fmt(e.sim_time_s)} s in windows of "
                           f"{scen.power.alerts.window_s:g} s is {_fmt(e.power_samples)} "
                           f"samples, more than simulation.limits.max_power_samples = "
                           f"{lim.max_power_samples}", scen.power.alerts.window_s,
                           "a longer window, or raise simulation.limits.max_power_samples"))
    return out


def _never_finishes(scen: Scenario, e: Estimate) -> Problem:
    """The problem of a scenario whose failures come too fast for any progress, naming the
    failure process that contributes most expected failures per attempt."""
    best, worst = None, -1.0
    for i, f in enumerate(scen.faults):
        ttf = getattr(f, "ttf", None)
        if ttf is None:
            continue
        mean = float(ttf.mean)
        rate = 1.0 / mean if mean > 0 else math.inf
        if f.kind == "accelerator_failure":
            x = e.devices * rate * (e.iteration_s + scen.job.restart_s)
            why = (f"accelerator failures arrive every {mean / e.devices:.3g} s on average "
                   f"over the {e.devices} devices, far more often than the job can restart "
                   f"(job.restart_s = {scen.job.restart_s:g} s) and finish an iteration "
                   f"(at least {e.iteration_s:.3g} s)")
        elif f.kind in ("link_failure", "nic_failure"):
            x = rate * _transfer_s(scen)
            why = (f"each link fails every {mean:.3g} s on average, far more often than one "
                   f"gradient bucket crosses it ({_transfer_s(scen):.3g} s): transfers would "
                   "be cut and resent forever")
        else:
            continue
        if x > worst:
            best, worst = Problem(f"faults.{i}.ttf", f"{why}; the run would never finish",
                                  None, "a longer mean time to failure (mean_s, or a "
                                  "smaller acceleration)"), x
    return best or Problem("faults", "failures come too fast for the job to finish")


def _dma_problem(scen: Scenario) -> Problem | None:
    """A DMA stream too slow for the HBM batches to simulate (``MIN_DMA_BYTES_PER_S``)."""
    from devices.memory_spec import dma_rate_bytes_per_s

    mem, cl = scen.memory, scen.cluster
    if mem.model == "roofline":
        return None
    rate = dma_rate_bytes_per_s(mem, cl.link, cl.links_per_edge)
    if rate >= MIN_DMA_BYTES_PER_S:
        return None
    key = "memory.dma.rate_gbps" if mem.dma.rate_gbps is not None else \
        "memory.dma.hbm_bytes_per_link_byte"
    return Problem(key, f"one transfer's HBM traffic of {rate:.3g} B/s is below the "
                   f"{MIN_DMA_BYTES_PER_S:g} B/s the {mem.model} memory model simulates (its "
                   "HBM batches would run for the trickle's whole arrival span)", None,
                   "at least 1e-3 GB/s, or memory.model roofline")


def ring_parts(scen: Scenario) -> int:
    """Barrier parts per ring step the estimate counts: ``network.ring_substeps`` where rings
    can run out of step (faults, or rank symmetry off), else 1."""
    return scen.network.ring_substeps if scen.faults or not scen.symmetric else 1


def _why_events(scen: Scenario, e: Estimate) -> str:
    parts = [f"{e.classes} simulated ranks x {e.microbatches} microbatches x "
             f"{scen.workload.iterations} iterations"]
    if ring_parts(scen) > 1:
        parts.append(f"x {ring_parts(scen)} barrier parts per ring step "
                     "(network.ring_substeps)")
    if e.packets:
        parts.append(f"{_fmt(e.packets)} packets of {scen.network.packet_kib:g} KiB")
    if e.fault_events:
        parts.append(f"{_fmt(e.fault_events)} failure events")
    if e.thermal_steps > 0.01 * e.events:
        slow = _slowdown(scen, e.sim_time_s, e.iteration_s)
        parts.append(f"{_fmt(e.thermal_steps)} idle segments of at most power.thermal."
                     f"max_step_s = {scen.power.thermal.max_step_s:g} s"
                     + (f" over a run up to {slow:.3g}x longer by the stragglers / HBM "
                        "degradations of faults" if slow > 1 else ""))
    return "; ".join(parts)


def check_power_samples(scen: Scenario, makespan_s: float) -> None:
    """Refuse (ScenarioError) a telemetry window that cuts the actual makespan into more
    samples than ``simulation.limits.max_power_samples`` (before they are allocated)."""
    window = scen.power.alerts.window_s
    samples = makespan_s / window
    limit = scen.simulation.limits.max_power_samples
    if samples > limit:
        raise ScenarioError([Problem(
            "power.alerts.window_s", f"the run's makespan of {makespan_s:.6g} s in windows of "
            f"{window:g} s is {samples:.3g} samples, more than simulation.limits."
            f"max_power_samples = {limit}", window,
            f"a window of at least {makespan_s / limit:.3g} s, or raise "
            "simulation.limits.max_power_samples")])
