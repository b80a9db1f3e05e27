"""Where a device sits, and what its position costs it: position classes, inlet air by position
and each node's own share of the network (link ports, on-chip router, forwarded traffic).

* **Position class** (``position_classes``): on a ``mesh2d`` a device is a ``corner`` (at the
  boundary of both dimensions), an ``edge`` (one) or ``interior`` (none); dimensions of size 1
  do not count. Every device of a topology without boundaries (torus, ring) or that is not a grid
  is in the one class ``all``.
* **Inlet air by position** (``inlet_offsets``): ``power.thermal.inlet_gradient_k`` K of extra
  inlet temperature spread over the grid, ``along`` ``x`` or ``y`` (``coordinate / (size - 1)``:
  air pre-heated by the devices upstream) or ``center`` (``1 - max_d |c_d - m_d| / m_d`` with
  ``m_d = (size_d - 1) / 2``: the middle of a board is cooled worst, the border best).
* **A node's network** (``node_traffic``), from the fabric's per-link byte counters:
  ``forwarded`` bytes = bytes that arrived over the device's links but were not for it (what
  dimension-order routes pass through it); link-port energy = half of each of its links'
  energy (bytes x pJ/bit + idle power x time) for the transmitting end, half for the receiving
  end (SerDes at both ends; assumption: an even split); router energy = ``router_pj_per_bit`` x
  every bit its on-chip router switches between device-to-device links and the device
  (injected + ejected + forwarded, each once). Port shares of switch nodes are reported apart so
  the devices' and switches' shares add up to the network energy exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POSITION_CLASSES = ("corner", "edge", "interior", "all")
INLET_AXES = ("x", "y", "center")


def position_classes(topo) -> np.ndarray:
    """Position class of every device (``corner`` / ``edge`` / ``interior`` on a mesh2d,
    ``all`` elsewhere)."""
    n = topo.n_devices
    if topo.kind != "mesh2d" or topo.dims is None:
        return np.full(n, "all", dtype=object)
    coords = np.asarray(topo.coords)[:, : len(topo.dims)]
    dims = np.asarray(topo.dims)
    real = dims > 1
    at_border = ((coords == 0) | (coords == dims - 1)) & real
    count = at_border.sum(axis=1)
    out = np.full(n, "interior", dtype=object)
    out[count == 1] = "edge"
    out[count >= 2] = "corner"
    return out


def inlet_offsets(topo, gradient_k: float, along: str) -> np.ndarray:
    """Extra inlet air temperature of every device, K (0 everywhere when ``gradient_k`` is 0 or
    the topology has no grid coordinates to spread it over)."""
    n = topo.n_devices
    if gradient_k == 0:
        return np.zeros(n)
    coords = np.asarray(topo.coords, dtype=float)
    size = coords.max(axis=0) + 1  # every topology places each device at coordinates
    if along in ("x", "y"):
        d = 0 if along == "x" else 1
        s = coords[:, d] / (size[d] - 1) if size[d] > 1 else np.zeros(n)
    else:
        mid = (size - 1) / 2
        dims = mid > 0
        if not dims.any():
            return np.zeros(n)
        s = 1.0 - (np.abs(coords[:, dims] - mid[dims]) / mid[dims]).max(axis=1)
    return gradient_k * s


@dataclass(frozen=True)
class NodeTraffic:
    """Per-device network accounting (arrays of length ``n_devices``; bytes, J)."""

    in_bytes: np.ndarray         # bytes that arrived over the device's links
    out_bytes: np.ndarray        # bytes that left over its links
    forwarded_bytes: np.ndarray  # arrived but not for the device (passed through)
    router_bytes: np.ndarray     # switched by its router between device links and the device
    port_j: np.ndarray           # its half of every link it transmits or receives on
    router_j: np.ndarray         # router_pj_per_bit x router bits
    switch_port_j: float         # port shares of switch nodes (not devices)


def node_traffic(topo, link_bytes: np.ndarray, link_energy_j: np.ndarray,
                 bytes_received: np.ndarray, router_pj_per_bit: float | None) -> NodeTraffic:
    """Each device's share of the network.

    Args:
        topo: the topology (directed-link table ``link_src``, ``link_dst``).
        link_bytes: bytes each directed link carried.
        link_energy_j: energy of each directed link (bytes x pJ/bit + idle), J.
        bytes_received: bytes each device received as a destination.
        router_pj_per_bit: the device's on-chip router energy (None: not modelled, 0 J).
    """
    n = topo.n_devices
    nodes = topo.n_nodes
    src = np.asarray(topo.link_src)
    dst = np.asarray(topo.link_dst)
    lb = np.asarray(link_bytes, dtype=float)
    le = np.asarray(link_energy_j, dtype=float)
    in_all = np.bincount(dst, weights=lb, minlength=nodes)
    out_all = np.bincount(src, weights=lb, minlength=nodes)
    forwarded = np.maximum(in_all[:n] - np.asarray(bytes_received, dtype=float)[:n], 0.0)
    port = 0.5 * (np.bincount(src, weights=le, minlength=nodes)
                  + np.bincount(dst, weights=le, minlength=nodes))
    dd = (src < n) & (dst < n)  # device-to-device links: the ones a node's router serves
    in_dd = np.bincount(dst[dd], weights=lb[dd], minlength=n)[:n]
    out_dd = np.bincount(src[dd], weights=lb[dd], minlength=n)[:n]
    fwd_dd = np.minimum(forwarded, np.minimum(in_dd, out_dd))
    router_bytes = in_dd + out_dd - fwd_dd
    pj = router_pj_per_bit or 0.0
    return NodeTraffic(in_all[:n], out_all[:n], forwarded, router_bytes, port[:n],
                       router_bytes * 8.0 * pj * 1e-12, float(port[n:].sum()))


def class_stats(values: dict[str, np.ndarray], classes: np.ndarray) -> dict[str, dict]:
    """Mean, spread (population standard deviation), min, max and count of each quantity per
    position class: ``{class: {"devices": n, quantity: {"mean", "std", "min", "max"}}}``, over
    the devices with a value (not NaN, the temperature of a device with no thermal or leakage
    data); None for each statistic where no device of the class has one."""
    out: dict[str, dict] = {}
    for c in [c for c in POSITION_CLASSES if (classes == c).any()]:
        sel = classes == c
        entry: dict = {"devices": int(sel.sum())}
        for name, v in values.items():
            x = np.asarray(v, dtype=float)[sel]
            x = x[~np.isnan(x)]
            entry[name] = ({"mean": float(x.mean()), "std": float(x.std()),
                            "min": float(x.min()), "max": float(x.max())} if len(x)
                           else dict.fromkeys(("mean", "std", "min", "max")))
        out[c] = entry
    return out
