"""Per-device truth of a run: each device's own energy, time, traffic and temperature (the
``devices`` trace table) and the edge effect by position class (summary key ``edge_effect``).

Which numbers are whose. The network is simulated device by device in every mode, so
``bytes_sent``, ``bytes_received``, ``forwarded_bytes``, ``router_bytes``, ``port_j``,
``router_j`` and ``network_j`` are *per device* always. Compute is simulated per rank class: with
symmetry on (``symmetry_used``) a class stands for all ranks of a pipeline stage, and
``board_j``, ``hbm_j``, ``busy_s``, the waits, ``idle_s`` and the temperatures of its devices are
the class's (identical for its devices); with symmetry off every device is its own class. The
table's ``per_class`` attribute lists the columns of the second kind.

``max_temp_c`` and ``mean_temp_c`` are the die temperatures the model used: the thermal
model's, or, with ``power.thermal.enabled: false``, the temperature the die is held at for its
leakage (``initial_c``, else the leakage reference). They are NaN for a device with neither
thermal nor leakage data (the TPUs of ``scenarios/torus3d.yaml``), whose temperature enters
nothing; ``edge_effect`` gives None for their statistics. The summary's
``max_temperature_c`` is the thermal model's result: None without one.

``energy_j = board_j + network_j`` (board: chip + HBM + regulator, as in the ``power`` table;
network: the device's link-port share and its router). Summed over devices, ``board_j`` is the
accelerators' energy and ``network_j`` plus the switches' port share is the ``network`` energy
component of the summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from devices.position import class_stats, inlet_offsets, node_traffic, position_classes

if TYPE_CHECKING:
    import pandas as pd

PER_CLASS = ("board_j", "hbm_j", "busy_s", "tp_wait_s", "pipeline_wait_s", "dp_wait_s",
             "wait_s", "idle_s", "max_temp_c", "mean_temp_c")
PER_DEVICE = ("bytes_sent", "bytes_received", "forwarded_bytes", "router_bytes", "port_j",
              "router_j", "network_j")
DEVICE_COLUMNS = {
    "device": "int32", "rank": "int32", "cls": "int32", "stage": "int32", "x": "int32",
    "y": "int32", "z": "int32", "degree": "int32", "position": "category", "inlet_c": "float64",
    "board_j": "float64", "hbm_j": "float64", "port_j": "float64", "router_j": "float64",
    "network_j": "float64", "energy_j": "float64", "busy_s": "float64", "tp_wait_s": "float64",
    "pipeline_wait_s": "float64", "dp_wait_s": "float64", "wait_s": "float64",
    "idle_s": "float64", "bytes_sent": "float64", "bytes_received": "float64",
    "forwarded_bytes": "float64", "router_bytes": "float64", "max_temp_c": "float64",
    "mean_temp_c": "float64"}
DEVICE_UNITS = {"inlet_c": "C", "board_j": "J", "hbm_j": "J (part of board_j)", "port_j": "J",
                "router_j": "J", "network_j": "J", "energy_j": "J", "busy_s": "s",
                "tp_wait_s": "s", "pipeline_wait_s": "s", "dp_wait_s": "s", "wait_s": "s",
                "idle_s": "s", "bytes_sent": "B", "bytes_received": "B",
                "forwarded_bytes": "B", "router_bytes": "B", "max_temp_c": "C",
                "mean_temp_c": "C (time-weighted)"}
#: Quantities ``edge_effect`` summarizes per position class.
EDGE_QUANTITIES = ("energy_j", "board_j", "network_j", "port_j", "router_j", "forwarded_bytes",
                   "busy_s", "wait_s", "max_temp_c")


def class_inlets(model) -> dict[int, float]:
    """Inlet air temperature of every rank class, C, when ``power.thermal.inlet_gradient_k``
    is set (each class is then one device: the gradient turns symmetry off); else empty."""
    th = model.scenario.power.thermal
    if th.inlet_gradient_k == 0:
        return {}
    off = inlet_offsets(model.topo, th.inlet_gradient_k, th.inlet_gradient_along)
    lay = model.layout
    return {c: th.ambient_c + float(off[lay.device[ranks[0]]])
            for c, ranks in enumerate(lay.classes)}


def link_energy_j(fabric, makespan: float) -> np.ndarray:
    """Energy of every directed link over the run: bytes x pJ/bit + idle power x time, J."""
    return fabric.link_bytes * fabric.energy_per_byte + fabric.idle_w * makespan


def traffic(model, fabric, makespan: float):
    """:class:`devices.position.NodeTraffic` of the run's devices."""
    return node_traffic(model.topo, fabric.link_bytes, link_energy_j(fabric, makespan),
                        fabric.bytes_received, model.scenario.cluster.device.router_pj_per_bit)


def router_energy_j(model, fabric) -> float:
    """Energy of every device's on-chip router so far, J (part of the ``network`` component)."""
    if model.scenario.cluster.device.router_pj_per_bit is None:
        return 0.0
    return float(traffic(model, fabric, 0.0).router_j.sum())


def _mean_temp(acc) -> float:
    seg = acc.power_segments()
    if not len(seg):
        return float(acc.temp_c)
    d = seg[:, 1] - seg[:, 0]
    return float((seg[:, 5] * d).sum() / d.sum()) if d.sum() > 0 else float(seg[-1, 5])


def device_frame(model, fabric, ex, makespan: float, node=None) -> pd.DataFrame:
    """One row per device (columns :data:`DEVICE_COLUMNS`, SI units; see the module doc)."""
    import pandas as pd  # lazy: a run's summary and trace use :func:`device_columns`

    return pd.DataFrame(device_columns(model, fabric, ex, makespan, node))


def device_columns(model, fabric, ex, makespan: float, node=None) -> dict[str, np.ndarray]:
    """The columns of :func:`device_frame` as NumPy arrays (one value per device)."""
    topo, lay = model.topo, model.layout
    node = node or traffic(model, fabric, makespan)
    n = topo.n_devices
    rank_of = np.empty(n, dtype=np.int64)
    rank_of[lay.device] = np.arange(lay.world)
    cls = lay.rank_class[rank_of]
    coords = np.asarray(topo.coords)
    z = coords[:, 2] if coords.shape[1] > 2 else np.zeros(n, dtype=np.int64)
    acc = ex.accelerators
    st = ex.stats

    def per_cls(values) -> np.ndarray:
        return np.asarray(values, dtype=float)[cls]

    busy = per_cls([a.stats.compute_s for a in acc])
    tp = per_cls([s.tp_s for s in st])
    recv = per_cls([s.recv_s for s in st])
    dpw = per_cls([s.dp_wait_s for s in st])
    wait = tp + recv + dpw
    network = node.port_j + node.router_j
    board = per_cls([a.energy_j for a in acc])
    return {
        "device": np.arange(n), "rank": rank_of, "cls": cls, "stage": lay.class_stage[cls],
        "x": coords[:, 0], "y": coords[:, 1], "z": z, "degree": topo.degree(),
        "position": position_classes(topo).astype(str),
        "inlet_c": per_cls([a.power.ambient_for(a.cls) for a in acc]),
        "board_j": board, "hbm_j": per_cls([a.stats.memory_j for a in acc]),
        "port_j": node.port_j, "router_j": node.router_j, "network_j": network,
        "energy_j": board + network, "busy_s": busy, "tp_wait_s": tp, "pipeline_wait_s": recv,
        "dp_wait_s": dpw, "wait_s": wait, "idle_s": np.maximum(makespan - busy - wait, 0.0),
        "bytes_sent": np.asarray(fabric.bytes_sent, dtype=float)[:n],
        "bytes_received": np.asarray(fabric.bytes_received, dtype=float)[:n],
        "forwarded_bytes": node.forwarded_bytes, "router_bytes": node.router_bytes,
        "max_temp_c": per_cls([a.stats.max_temp_c if a.has_temperature else np.nan
                               for a in acc]),
        "mean_temp_c": per_cls([_mean_temp(a) if a.has_temperature else np.nan
                                for a in acc]),
    }


def edge_effect(df: Mapping[str, Any], symmetric: bool, iterations: int) -> dict[str, Any]:
    """Summary key ``edge_effect``: per position class, the mean / spread (std) / min / max of
    :data:`EDGE_QUANTITIES` over its devices (energies and times per iteration)."""
    pos = np.asarray(df["position"], dtype=object)
    per_it = {"energy_j", "board_j", "network_j", "port_j", "router_j", "forwarded_bytes",
              "busy_s", "wait_s"}
    values = {q: np.asarray(df[q]) / (iterations if q in per_it else 1) for q in EDGE_QUANTITIES}
    return {"classes": class_stats(values, pos), "per_iteration": sorted(per_it),
            "per_class_columns": [q for q in EDGE_QUANTITIES if q in PER_CLASS],
            "per_device_columns": [q for q in EDGE_QUANTITIES if q not in PER_CLASS],
            "symmetry_used": bool(symmetric)}
