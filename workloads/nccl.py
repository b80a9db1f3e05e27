"""NCCL's protocol choice for ring collectives: bandwidth and latency versus message size.

NCCL runs a collective with one of three protocols and picks, per call, the one its cost model
says is fastest (``NVIDIA/nccl src/graph/tuning.cc``; constants with sources in
``workloads/catalog/nccl/ring.yaml``). For a ring over ``p`` ranks with ``s`` steps
(``2(p-1)`` for all-reduce, ``p-1`` for reduce-scatter / all-gather), ``s_net`` of them
between nodes, a buffer of ``n`` bytes and the ring's bus bandwidth ``B``:

``t(proto) = base(proto) + (s - s_net) hw_nvlink(proto) + s_net hw_net(proto)
             + n / (f(proto) B p / s)``

with ``f`` = 1 (Simple), 0.92 (LL128: 120 data bytes per 128-byte line; inside NVLink nodes
only) and 1/4 or 1/3 (LL: 8-byte lines carrying 4 data bytes plus GPU polling limits). Small
messages take LL (latency ~0.5 us a step, a quarter of the bandwidth), large ones Simple
(full bandwidth, ~3.4 us a step on NVLink and ~9.6 us over the network), so the achievable bus
bandwidth rises with the message size to the link's. The fabric runs the chosen protocol: its
per-step latency replaces the sender overhead and hop latencies of the fabric's nearest pair
of devices of the same kind (device links, or the network; ``Fabric.neighbours``) on healthy
routes: the library's constants were measured between neighbours, and a step lasts as long as
its slowest pair, so a ring whose pairs are farther apart (every pair k hops on a strided
placement, the pair that closes a ring along a mesh row, a detour around a failed link) pays
their extra hops' latency at every step. The constants cover at most the hop latency of the
links they were measured over (``measured_over_links``: the catalog's NVLink and InfiniBand
links), so a fabric whose nearest pair is slower (a user's ``latency_us`` above the catalog's)
pays the difference at every step too. Its base latency is paid once per collective, and
its bandwidth fraction as the added time ``(1/f - 1)`` x the phase's uncontended bandwidth
term (the bytes on the wire stay the payload's, so volumes are exact; LL is only chosen for
small messages, where that term is small).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import numpy as np

PROTOCOLS = ("LL", "LL128", "simple")


@cache
def ring_constants() -> dict:
    """The NCCL ring cost-model constants (catalog ``workloads/catalog/nccl/ring.yaml``)."""
    from pathlib import Path

    import workloads
    from twin.kernel.catalog import Catalog

    cat = Catalog("nccl", Path(workloads.__file__).parent / "catalog" / "nccl")
    return dict(cat.get("ring", "nccl").values)


@cache
def covered_hop_latency_s(network: bool) -> float:
    """Hop latency (s) NCCL's per-step constants are taken to include: the catalog latency of
    the link they were measured over (``measured_over_links``: NVLink between GPUs, or the
    InfiniBand network)."""
    from pathlib import Path

    import devices
    from twin.kernel.catalog import Catalog

    name = ring_constants()["measured_over_links"]["net" if network else "nvlink"]
    links = Catalog("links", Path(devices.__file__).parent / "catalog" / "links")
    return float(links.get(name, "link").values["latency_us"]) * 1e-6


def bandwidth_fraction(proto: str, op: str, multinode: bool) -> float:
    """Fraction of the ring's bus bandwidth a protocol achieves."""
    k = ring_constants()
    if proto == "LL":
        frac = k["ll_bandwidth_fraction"]
        return frac["allreduce_or_multinode" if op == "allreduce" or multinode else "other"]
    if proto == "LL128":
        return k["ll128_bandwidth_fraction"]
    return 1.0


def protocol_costs(op: str, steps: int, net_steps: int, multinode: bool, nbytes: float,
                   ranks: int, bus_bytes_per_s: float) -> dict[str, tuple[float, float, float]]:
    """``proto -> (time s, latency s, bandwidth fraction)`` of every enabled protocol for one
    ring collective (see the module docstring)."""
    k = ring_constants()
    out = {}
    for proto in PROTOCOLS:
        if proto == "LL128" and multinode and not k["ll128_network"]:
            continue
        intra = k["step_latency_nvlink_us"][proto]
        if proto == "LL" and multinode:
            intra *= k["ll_intra_latency_factor_multinode"]
        lat = (k["base_latency_us"][proto] + (steps - net_steps) * intra
               + net_steps * k["step_latency_net_us"][proto]) * 1e-6
        f = bandwidth_fraction(proto, op, multinode)
        algbw = f * bus_bytes_per_s * ranks / max(steps, 1)
        out[proto] = (lat + nbytes / algbw, lat, f)
    return out


def choose_protocol(op: str, steps: int, net_steps: int, multinode: bool, nbytes: float,
                    ranks: int, bus_bytes_per_s: float) -> str:
    """The protocol NCCL's cost model picks (the fastest)."""
    costs = protocol_costs(op, steps, net_steps, multinode, nbytes, ranks, bus_bytes_per_s)
    return min(costs, key=lambda p: costs[p][0])


def tune_phases(op: str, phases: list, nbytes: float, ranks: int, fabric) -> list:
    """The phases of one collective, run with the protocol NCCL would choose.

    Every phase is one ring level (all of a flat ring; the intra- and inter-node levels of a
    two-level algorithm); the protocol is chosen for the whole collective from its total
    steps, the steps that cross the network and the slowest ring's bus bandwidth. Returns new
    phases (the given ones are not changed).
    """
    if not phases:
        return phases
    profiles = [fabric.profile(ph) for ph in phases]
    bus = min(p[0] for p in profiles)
    if not np.isfinite(bus) or bus <= 0:
        return phases
    steps = sum(ph.steps for ph in phases)
    net_steps = sum(ph.steps for ph, p in zip(phases, profiles, strict=True) if p[1])
    multinode = net_steps > 0
    costs = protocol_costs(op, steps, net_steps, multinode, nbytes, ranks, bus)
    proto = min(costs, key=lambda p: costs[p][0])
    k = ring_constants()
    f = costs[proto][2]
    out = []
    for i, (ph, (_, net, hop)) in enumerate(zip(phases, profiles, strict=True)):
        if net:
            step = k["step_latency_net_us"][proto]
        else:
            step = k["step_latency_nvlink_us"][proto]
            if proto == "LL" and multinode:
                step *= k["ll_intra_latency_factor_multinode"]
        base = k["base_latency_us"][proto] * 1e-6 if i == 0 else 0.0
        # the protocol's lower bandwidth as added time: the phase's uncontended bandwidth
        # term x (1/f - 1); the bytes on the wire stay the payload's
        slow = float(np.max(ph.nbytes)) * ph.steps / bus * (1.0 / f - 1.0)
        out.append(replace(ph, step_latency_s=step * 1e-6, base_latency_s=base + slow,
                           hop_latency_ref_s=min(hop, covered_hop_latency_s(net))))
    return out
