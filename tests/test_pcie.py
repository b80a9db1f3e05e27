"""The PCIe switch shared by GPUs, NICs and host copies (devices.pcie), by hand.

References are worked out here from the module's stated rule (a copy starting beside ``c``
other copies of its switch and ``f`` NIC flows on its GPU's port moves at
``min(port / (1 + f), uplink / (1 + c))``, fixed at its start; copies of one port queue
FIFO) and the DGX topology (device ``d`` is GPU ``d mod g`` of node ``d // g``, in slot
``i mod s`` of switch ``i // s``), with round numbers instead of catalog ones.
"""

from __future__ import annotations

import pytest
import simpy

from devices.pcie import PcieFabric, PcieSpec, PcieSwitch, load_pcie_spec
from twin.kernel.errors import ScenarioError

SPEC = PcieSpec(gpus_per_switch=2, port_gbps=50.0, uplink_gbps=80.0)  # 1e9 B/s


def test_copy_rate_is_the_smaller_of_the_port_and_uplink_shares():
    sw = PcieSwitch(SPEC)
    assert sw.copy_rate(0) == 50e9                      # alone: the port
    sw.nic[0] = 1
    assert sw.copy_rate(0) == 25e9 and sw.copy_rate(1) == 50e9
    sw.copies = 3                                       # 80 / 4 = 20 < 25
    assert sw.copy_rate(0) == 20e9 and sw.copy_rate(1) == 20e9


def _copy(env, port, nbytes, tag, ends, delay=0.0):
    if delay:
        yield env.timeout(delay)
    yield from port.transfer(nbytes)
    ends[tag] = env.now


def test_copies_timeline_by_hand():
    """Slot 0 copies 100 MB, then 50 MB (FIFO on its port); slot 1 copies 100 MB from
    t = 1 ms. 0-1 ms: slot 0 alone at 50 GB/s (50 MB done). Its rate is fixed at its start,
    so it ends at 2 ms; slot 1 starts at 1 ms beside one copy: min(50, 80/2) = 40 GB/s,
    ends at 3.5 ms. Slot 0's second copy starts at 2 ms beside slot 1's: 40 GB/s, ends at
    3.25 ms. The agent callbacks see +1 / -1 per copy; an HBM cap of 30 GB/s on slot 1
    lowers only its own copy (then it ends at 1 + 100/30 ms)."""
    for cap in (None, 30e9):
        env = simpy.Environment()
        fab = PcieFabric(env, SPEC, gpus_per_node=8)
        calls: list[int] = []
        p0 = fab.port(0, on_copy=calls.append)
        p1 = fab.port(1, hbm_cap=(lambda c=cap: c) if cap is not None else None)
        ends: dict[str, float] = {}

        env.process(_copy(env, p0, 100e6, "a", ends))
        env.process(_copy(env, p0, 50e6, "b", ends))
        env.process(_copy(env, p1, 100e6, "c", ends, delay=1e-3))
        env.run()
        rate_c = 40e9 if cap is None else cap
        assert ends["a"] == pytest.approx(2e-3, rel=1e-12)
        assert ends["c"] == pytest.approx(1e-3 + 100e6 / rate_c, rel=1e-12)
        assert ends["b"] == pytest.approx(2e-3 + 50e6 / 40e9, rel=1e-12)
        assert calls == [1, -1, 1, -1]
        assert (p0.bytes, p1.bytes) == (150e6, 100e6)
        assert p0.busy_s == pytest.approx(2e-3 + 50e6 / 40e9, rel=1e-12)
        assert p1.busy_s == pytest.approx(100e6 / rate_c, rel=1e-12)
        assert (p0.hbm_capped, p1.hbm_capped) == (0, 0 if cap is None else 1)
        assert fab.min_copy_rate_bps() == pytest.approx(rate_c, rel=1e-12)
        assert fab.place(1)[0].copies == 0


def test_devices_sit_in_their_node_and_switch_slot():
    fab = PcieFabric(simpy.Environment(), SPEC, gpus_per_node=8)
    assert fab.min_copy_rate_bps() == 50e9                   # nothing shared yet
    sw0, s0 = fab.place(0)
    sw1, s1 = fab.place(1)
    sw2, s2 = fab.place(2)
    sw9, s9 = fab.place(9)                                   # node 1, GPU 1
    assert sw0 is sw1 and (s0, s1) == (0, 1)
    assert sw2 is not sw0 and s2 == 0
    assert sw9 is not sw1 and s9 == 1
    fab.nic([1, 9, 9], 1)
    assert sw1.nic == [0, 1] and sw9.nic == [0, 2]
    fab.nic([9], -1)
    assert sw9.nic == [0, 1]


def test_catalog_switches_load_and_unknown_names_the_field():
    for name in ("dgx-a100", "dgx-h100"):
        spec = load_pcie_spec(name)
        assert spec.gpus_per_switch == 2 and spec.port_gbps > 0
    with pytest.raises(ScenarioError) as exc:
        load_pcie_spec("dgx-z9", path="data.pcie_switch")
    assert [p.path for p in exc.value.problems] == ["data.pcie_switch"]


@pytest.mark.parametrize("field, ok, bad", [("gpus_per_switch", 64, 65),
                                            ("port_gbps", 1e6, 1.5e6),
                                            ("uplink_gbps", 1e6, 1.5e6)])
def test_switch_spec_bounds(field, ok, bad):
    from pydantic import ValidationError

    base = {"gpus_per_switch": 2, "port_gbps": 50.0, "uplink_gbps": 80.0}
    assert getattr(PcieSpec(**(base | {field: ok})), field) == ok
    with pytest.raises(ValidationError):
        PcieSpec(**(base | {field: bad}))


def test_one_gpu_per_node_puts_every_device_on_its_own_switch():
    fab = PcieFabric(simpy.Environment(), SPEC, gpus_per_node=1)
    (a, sa), (b, sb) = fab.place(0), fab.place(1)
    assert a is not b and sa == sb == 0
