"""Placing ranks on devices, and ordering rings over groups of devices.

A parallel job has ``dp * pp * tp`` ranks; rank ``r`` has coordinates
``(d, p, t) = (r // (pp*tp), (r // tp) % pp, r % tp)`` (tensor-parallel index fastest).
A placement policy maps ranks to device ids:

* ``snake`` (default): ranks follow a Hamiltonian snake through the grid, so consecutive
  ranks (a tensor-parallel group, then neighbouring pipeline stages) sit on neighbouring
  devices;
* ``row-major``: rank r on device r (x fastest); groups wrap across rows.

``ring_order`` orders a group of devices into a ring with as few hops per ring edge as the
grid allows.
"""

from __future__ import annotations

import numpy as np

from topologies.graph import Topology

PLACEMENTS = ("snake", "row-major")


def snake_cycle(nx_: int, ny: int) -> list[tuple[int, int]]:
    """Visit every cell of an ``nx_ x ny`` grid once, each step to a neighbour.

    When a Hamiltonian cycle exists on the mesh (both sides >= 2 and one of them even) the
    last cell is also a neighbour of the first. Otherwise the order is a boustrophedon path
    and closing the ring costs extra hops.
    """
    if nx_ >= 2 and ny >= 2 and (ny % 2 == 0 or nx_ % 2 == 0):
        transpose = ny % 2 != 0  # need an even number of rows
        a, b = (ny, nx_) if transpose else (nx_, ny)
        cells = [(0, 0)]
        for y in range(b):
            xs = range(1, a) if y % 2 == 0 else range(a - 1, 0, -1)
            cells.extend((x, y) for x in xs)
        cells.extend((0, y) for y in range(b - 1, 0, -1))
        return [(y, x) for x, y in cells] if transpose else cells
    cells = []
    for y in range(ny):
        xs = range(nx_) if y % 2 == 0 else range(nx_ - 1, -1, -1)
        cells.extend((x, y) for x in xs)
    return cells


def device_order(topo: Topology) -> np.ndarray:
    """Devices of a 2D grid in snake-cycle order."""
    nx_, ny = topo.shape
    return np.array([x + nx_ * y for x, y in snake_cycle(nx_, ny)], dtype=np.int64)


def place(topo: Topology, dp: int, pp: int, tp: int, policy: str = "snake") -> np.ndarray:
    """Device id of every rank (array of length dp*pp*tp)."""
    n = dp * pp * tp
    if n != topo.n_devices:
        raise ValueError(f"dp*pp*tp = {n} but the topology has {topo.n_devices} devices")
    if policy == "snake":
        return device_order(topo)
    if policy == "row-major":
        return np.arange(n, dtype=np.int64)
    raise ValueError(f"unknown placement policy {policy!r}; allowed: {', '.join(PLACEMENTS)}")


def ring_order(topo: Topology, devices: np.ndarray) -> np.ndarray:
    """Order ``devices`` into a ring with few hops between consecutive members.

    Members are visited in the snake-cycle order of the whole grid, which for the full grid
    (or a run of consecutive snake positions) gives one hop per ring edge wherever the grid
    has a Hamiltonian cycle.
    """
    order = device_order(topo)
    pos = np.empty(topo.n_devices, dtype=np.int64)
    pos[order] = np.arange(len(order))
    devices = np.asarray(devices, dtype=np.int64)
    return devices[np.argsort(pos[devices], kind="stable")]
