"""Position classes, inlet air by position and each node's share of the network
(devices/position.py), on grids and link tables built by hand in the test.

References: the classes and offsets written out per device from the grid's coordinates; the
per-node byte and energy shares of a three-device path with a switch summed link by link.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from devices.position import inlet_offsets, node_traffic, position_classes


def _grid(nx: int, ny: int, kind: str = "mesh2d"):
    """A stand-in topology: devices at (x, y), x fastest."""
    coords = [(x, y) for y in range(ny) for x in range(nx)]
    return SimpleNamespace(n_devices=nx * ny, coords=coords, dims=(nx, ny), kind=kind)


def test_position_classes_of_a_3x3_mesh_a_line_and_a_torus():
    cls = position_classes(_grid(3, 3)).tolist()
    assert cls == ["corner", "edge", "corner",
                   "edge", "interior", "edge",
                   "corner", "edge", "corner"]
    # a 4x1 line: the dimension of size 1 does not count, so the ends are edges
    assert position_classes(_grid(4, 1)).tolist() == ["edge", "interior", "interior", "edge"]
    assert set(position_classes(_grid(3, 3, "torus2d")).tolist()) == {"all"}
    # a 4x2 mesh: every device is on a border of the dimension of size 2 (it counts), so
    # the ends of each row are corners and the middles edges; none is interior
    assert position_classes(_grid(4, 2)).tolist() == ["corner", "edge", "edge", "corner",
                                                      "corner", "edge", "edge", "corner"]


@pytest.mark.parametrize("nx", [2, 3, 5])
def test_inlet_gradient_along_x_and_y(nx):
    """``gradient x coordinate / (size - 1)``: 0 at the first column, the full gradient at
    the last, evenly between (sizes 2, 3 and 5 along the axis)."""
    topo = _grid(nx, 2)
    x = np.array([c[0] for c in topo.coords], dtype=float)
    y = np.array([c[1] for c in topo.coords], dtype=float)
    np.testing.assert_allclose(inlet_offsets(topo, 6.0, "x"), 6.0 * x / (nx - 1))
    np.testing.assert_allclose(inlet_offsets(topo, 6.0, "y"), 6.0 * y)  # size 2 along y
    assert not inlet_offsets(_grid(nx, 1), 6.0, "y").any()  # nothing to spread along y
    assert not inlet_offsets(topo, 0.0, "x").any()


def test_inlet_gradient_at_the_center():
    """On a 5x3 grid the middle device gets the full gradient, the border none: per device
    ``1 - max(|x - 2| / 2, |y - 1| / 1)``."""
    topo = _grid(5, 3)
    want = [4.0 * (1.0 - max(abs(x - 2) / 2, abs(y - 1) / 1)) for x, y in topo.coords]
    np.testing.assert_allclose(inlet_offsets(topo, 4.0, "center"), want)
    assert inlet_offsets(topo, 4.0, "center")[7] == 4.0  # (2, 1)


def test_node_traffic_of_a_path_through_a_switch():
    """Devices 0, 1, 2 and a switch (node 3); links 0->1, 1->3, 3->2 carry 100 bytes each
    (device 0's message to device 2 through device 1 and the switch) with 1, 2 and 4 J.

    Per device, by hand: in (0, 100, 100), out (100, 100, 0); device 1 forwards 100 bytes
    that arrived on a device link and left towards the switch, so its router switches them
    once (100 bytes); device 0's router injects 100; device 2's receives nothing over a
    device link (its bytes come from the switch), 0. Ports: half of each link's energy at
    each end, the switch's halves apart."""
    topo = SimpleNamespace(n_devices=3, n_nodes=4, link_src=[0, 1, 3], link_dst=[1, 3, 2])
    nt = node_traffic(topo, np.array([100.0, 100.0, 100.0]), np.array([1.0, 2.0, 4.0]),
                      np.array([0.0, 0.0, 100.0]), router_pj_per_bit=5.0)
    np.testing.assert_array_equal(nt.in_bytes, [0.0, 100.0, 100.0])
    np.testing.assert_array_equal(nt.out_bytes, [100.0, 100.0, 0.0])
    np.testing.assert_array_equal(nt.forwarded_bytes, [0.0, 100.0, 0.0])
    np.testing.assert_array_equal(nt.router_bytes, [100.0, 100.0, 0.0])
    np.testing.assert_allclose(nt.router_j, np.array([100.0, 100.0, 0.0]) * 8 * 5e-12)
    np.testing.assert_allclose(nt.port_j, [0.5, 0.5 + 1.0, 2.0])
    assert nt.switch_port_j == pytest.approx(1.0 + 2.0)
    assert nt.port_j.sum() + nt.switch_port_j == pytest.approx(1.0 + 2.0 + 4.0)
    assert not node_traffic(topo, np.full(3, 100.0), np.ones(3), np.zeros(3), None).router_j.any()


def test_node_traffic_forwarding_on_a_mesh_line():
    """A 3-device line 0 - 1 - 2 (both directions), 100 bytes from 0 to 2: device 1 forwards
    them and its router switches them once (in + out - forwarded = 100); the ends inject and
    eject 100 each."""
    topo = SimpleNamespace(n_devices=3, n_nodes=3, link_src=[0, 1, 1, 2], link_dst=[1, 0, 2, 1])
    nt = node_traffic(topo, np.array([100.0, 0.0, 100.0, 0.0]), np.zeros(4),
                      np.array([0.0, 0.0, 100.0]), router_pj_per_bit=1.0)
    np.testing.assert_array_equal(nt.forwarded_bytes, [0.0, 100.0, 0.0])
    np.testing.assert_array_equal(nt.router_bytes, [100.0, 100.0, 100.0])
