"""Run one scenario: build, simulate, write the trace, summarize.

``run(scenario)`` is a pure function of the scenario (including its seed): the same scenario
gives the same trace, bit for bit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import twin
from devices.accelerator import Accelerator
from devices.fabric import Fabric
from scenarios.faults import inject
from twin.build import Model, build
from twin.engine import Engine
from twin.recording import TraceRecorder
from twin.records import Recorder
from twin.rng import RngStreams
from twin.scenario import Scenario
from twin.summary import summarize
from twin.trace import TraceWriter
from workloads.executor import Executor


@dataclass(frozen=True)
class RunResult:
    """What a run returns: the summary (SI units) and where the trace is (None if disabled)."""

    summary: dict[str, Any]
    trace_path: Path | None


def simulate(model: Model, recorder: Recorder, message_sink=None) -> tuple[Engine, Fabric,
                                                                          Executor, list]:
    """Run the SimPy model to completion; returns engine, fabric, executor and fault rows."""
    scen = model.scenario
    env = Engine()
    net = scen.network
    fabric = Fabric(env, model.topo, model.router, {scen.cluster.link.name: scen.cluster.link},
                    model=net.model, packet_bytes=net.packet_kib * 1024,
                    retransmit_timeout_s=net.retransmit_timeout_s, record=message_sink)
    rngs = RngStreams(scen.seed)
    sigma = Accelerator.sigma_for_cov(scen.simulation.compute_jitter_cov)
    accelerators = [Accelerator(env, c, len(ranks), model.compute, recorder, sigma,
                                rngs.get(f"class/{c}"))
                    for c, ranks in enumerate(model.layout.classes)]
    executor = Executor(env, model.layout, fabric, model.programs, model.blocks, accelerators,
                        scen.workload.iterations, recorder)
    fault_rows: list = []
    for f in scen.faults:
        env.process(inject(env, fabric, f, fault_rows))
    env.run(until=env.all_of(executor.procs))
    executor.finish(env.now)
    return env, fabric, executor, fault_rows


def run(scenario: Scenario, trace_path: str | Path | None = None) -> RunResult:
    """Simulate ``scenario`` and write its trace.

    Args:
        scenario: a validated scenario (see :func:`twin.load_scenario`).
        trace_path: overrides ``scenario.trace.path``.
    """
    wall0 = time.perf_counter()
    model = build(scenario)
    if not scenario.trace.enabled:
        env, fabric, ex, faults = simulate(model, Recorder())
        summary = summarize(model, env, fabric, ex, time.perf_counter() - wall0)
        return RunResult(summary, None)
    path = Path(trace_path) if trace_path else scenario.trace_path
    tables = set(scenario.trace.tables)
    with TraceWriter(path, scenario.trace.compression) as writer:
        rec = TraceRecorder(writer, tables)
        env, fabric, ex, faults = simulate(model, rec, rec.message)
        summary = summarize(model, env, fabric, ex, time.perf_counter() - wall0)
        _static_tables(writer, tables, model, fabric, env.now, faults)
        summary["wall_time_s"] = time.perf_counter() - wall0
        out = writer.finish({
            "twin_version": twin.__version__, "seed": scenario.seed,
            "scenario": scenario.to_yaml(), "summary": summary, "sources": scenario.sources,
        })
    return RunResult(summary, out)


def _static_tables(writer: TraceWriter, tables: set[str], model: Model, fabric: Fabric,
                   makespan: float, faults: list) -> None:
    topo, lay = model.topo, model.layout
    if "links" in tables:
        nbytes = fabric.link_bytes
        busy = fabric.link_busy_s
        names = [topo.edge_attr(i, "link") for i in range(topo.n_links)]
        dims = [topo.edge_attr(i, "dim") for i in range(topo.n_links)]
        t = writer.table("links", {
            "link": "int32", "src": "int32", "dst": "int32", "type": "category", "dim": "int32",
            "capacity": "float64", "bytes": "float64", "busy_s": "float64",
            "utilization": "float64", "energy_j": "float64"},
            {"capacity": "B/s", "bytes": "B", "busy_s": "s", "utilization": "fraction",
             "energy_j": "J"})
        util = nbytes / (fabric.capacity * makespan) if makespan > 0 else np.zeros_like(nbytes)
        energy = nbytes * fabric.energy_per_byte + fabric.idle_w * makespan
        t.extend({"link": np.arange(topo.n_links), "src": topo.link_src, "dst": topo.link_dst,
                  "type": names, "dim": dims, "capacity": fabric.capacity, "bytes": nbytes,
                  "busy_s": busy, "utilization": util, "energy_j": energy})
    if "ranks" in tables:
        r = np.arange(lay.world)
        d, p, tpi = lay.coords(r)
        dev = lay.device
        coords = topo.coords[dev]
        deg = topo.degree()[dev]
        t = writer.table("ranks", {"rank": "int32", "device": "int32", "x": "int32",
                                   "y": "int32", "dp": "int32", "pp": "int32", "tp": "int32",
                                   "cls": "int32", "degree": "int32"})
        t.extend({"rank": r, "device": dev, "x": coords[:, 0], "y": coords[:, 1], "dp": d,
                  "pp": p, "tp": tpi, "cls": lay.rank_class, "degree": deg})
    if "faults" in tables:
        t = writer.table("faults", {"time_s": "float64", "kind": "category",
                                    "target": "category", "action": "category"},
                         {"time_s": "s"})
        for row in faults:
            t.append(*row)
