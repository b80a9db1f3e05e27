"""The PCIe switch a DGX-like node's GPUs, compute NICs and host copies share.

On a DGX H100 (and A100) two GPUs and their two compute NICs hang off one PCIe switch with one
x16 uplink to the CPU (catalog ``devices/catalog/pcie``). Three kinds of traffic cross it:

* host-to-device copies of the next batch (``workloads.data``): uplink -> switch -> GPU port;
* GPUDirect RDMA of the NIC (network collectives and pipeline sends leaving the node):
  GPU port <-> switch <-> NIC port, not the uplink;
* (storage reads land in host memory through the CPU, not through this switch: not here).

Sharing is fluid max-min per resource, fixed for one copy at its start (as a compute block's
contention is): a copy that starts while ``c`` other copies of the switch are in flight and
``f`` NIC flows use its GPU's port moves at
``min(port / (1 + f), uplink / (1 + c))`` bytes/s (a GPU port is full duplex, so the NIC's
sends and the copy's writes share the direction into the GPU only when the NIC receives; every
flow is counted against the port: the conservative side). NIC flows are counted from the
streams the device agents run (``devices.interference``); their own bandwidth is the fabric's
business (``devices.fabric``), the copies do not slow them here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import simpy
from pydantic import Field, ValidationError

from devices.host import BandwidthServer
from twin.kernel.catalog import Catalog
from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.schema import PositiveFloat, StrictModel

CATALOG_DIR = Path(__file__).parent / "catalog" / "pcie"


class PcieSpec(StrictModel):
    """One PCIe switch of a node (catalog ``devices/catalog/pcie``)."""

    name: str = ""
    description: str = ""
    gpus_per_switch: int = Field(ge=1, le=64, description="GPUs behind one switch")
    port_gbps: PositiveFloat = Field(le=1e6, description="achievable bandwidth of one GPU's "
                                     "port, one direction, 1e9 B/s")
    uplink_gbps: PositiveFloat = Field(le=1e6, description="achievable bandwidth of the "
                                       "switch's uplink to the CPU, one direction, 1e9 B/s")


@cache
def pcie_catalog() -> Catalog:
    """The catalog of PCIe switches."""
    return Catalog("pcie", CATALOG_DIR)


def load_pcie_spec(name: str, path: str = "data.pcie_switch") -> PcieSpec:
    """The switch ``name`` of the catalog (a :class:`ScenarioError` naming ``path`` if
    unknown or invalid)."""
    cat = pcie_catalog()
    if name not in cat:
        raise ScenarioError(Problem(path, "unknown PCIe switch", name, ", ".join(cat.names())))
    entry = cat.get(name)
    try:
        return PcieSpec.model_validate(entry.values)
    except ValidationError as exc:
        raise ScenarioError([Problem(f"pcie.{name}." + ".".join(str(p) for p in e["loc"]),
                                     e["msg"], e.get("input")) for e in exc.errors()]) from None


class PcieSwitch:
    """Traffic on one switch: copies in flight and NIC flows per GPU slot.

    Args:
        spec: the switch.
    """

    def __init__(self, spec: PcieSpec):
        self.spec = spec
        self.port_bps = spec.port_gbps * 1e9
        self.uplink_bps = spec.uplink_gbps * 1e9
        self.copies = 0
        self.nic = [0] * spec.gpus_per_switch
        self.min_rate_bps = self.port_bps  # slowest copy rate granted so far

    def copy_rate(self, slot: int) -> float:
        """Bytes/s of a copy to the GPU in ``slot`` starting now (module docstring)."""
        return min(self.port_bps / (1 + self.nic[slot]), self.uplink_bps / (1 + self.copies))


class CopyPort(BandwidthServer):
    """One GPU's host-to-device port through its switch: copies one at a time, FIFO, each at
    the switch's rate when it starts. Offers ``transfer(nbytes)`` as
    its base ``devices.host.BandwidthServer`` does, so the data path can use it in its place.

    Args:
        env: SimPy environment.
        switch: the GPU's switch.
        slot: the GPU's slot on it (``0 .. gpus_per_switch - 1``).
        on_copy: called with +1 when a copy starts and -1 when it ends (the device agent
            counts the copy as a stream at its HBM), or None.
        hbm_cap: called after ``on_copy(1)``: the HBM write bandwidth the device's memory
            controller gives this copy now, bytes/s (``memory.transfer_cap``;
            ``DeviceStreams.h2d_cap``); the copy's rate is the smaller of it and the switch's
            share, fixed at the copy's start. None: the switch's share only.
    """

    def __init__(self, env: simpy.Environment, switch: PcieSwitch, slot: int,
                 on_copy: Callable[[int], None] | None = None,
                 hbm_cap: Callable[[], float] | None = None):
        super().__init__(env, switch.port_bps)  # nominal (uncontended) rate
        self.switch = switch
        self.slot = slot
        self.on_copy = on_copy
        self.hbm_cap = hbm_cap
        self.hbm_capped = 0  # copies whose rate the HBM share set

    def transfer(self, nbytes: float):
        """Process body: wait for the port, then move ``nbytes`` (B) at the shared rate."""
        with self._res.request() as req:
            yield req
            sw = self.switch
            rate = sw.copy_rate(self.slot)
            sw.copies += 1
            if self.on_copy is not None:
                self.on_copy(1)
            if self.hbm_cap is not None:
                cap = self.hbm_cap()
                if cap < rate:
                    rate = cap
                    self.hbm_capped += 1
            sw.min_rate_bps = min(sw.min_rate_bps, rate)
            t0 = self.env.now
            try:
                yield self.env.timeout(nbytes / rate)
            finally:
                sw.copies -= 1
                if self.on_copy is not None:
                    self.on_copy(-1)
            self.busy_s += self.env.now - t0
            self.bytes += nbytes


class PcieFabric:
    """The switches of every node, created on first use: device ``d`` is GPU ``d mod g`` of
    node ``d // g`` (``g`` GPUs per node) and sits in slot ``i mod s`` of switch ``i // s``
    (``s = gpus_per_switch``).

    Args:
        env: SimPy environment.
        spec: the switch type.
        gpus_per_node: GPUs of one node.
    """

    def __init__(self, env: simpy.Environment, spec: PcieSpec, gpus_per_node: int):
        self.env = env
        self.spec = spec
        self.gpus_per_node = max(int(gpus_per_node), 1)
        self._switches: dict[tuple[int, int], PcieSwitch] = {}

    def place(self, device: int) -> tuple[PcieSwitch, int]:
        """The switch and slot of ``device``."""
        node, i = divmod(int(device), self.gpus_per_node)
        s = self.spec.gpus_per_switch
        key = (node, i // s)
        sw = self._switches.get(key)
        if sw is None:
            sw = self._switches[key] = PcieSwitch(self.spec)
        return sw, i % s

    def port(self, device: int, on_copy: Callable[[int], None] | None = None,
             hbm_cap: Callable[[], float] | None = None) -> CopyPort:
        """A copy port for ``device`` (``hbm_cap``: see :class:`CopyPort`)."""
        sw, slot = self.place(device)
        return CopyPort(self.env, sw, slot, on_copy, hbm_cap)

    def nic(self, devices, delta: int) -> None:
        """``delta`` NIC flows start (+) or end (-) on each of ``devices``."""
        for d in devices:
            sw, slot = self.place(d)
            sw.nic[slot] += delta

    def min_copy_rate_bps(self) -> float:
        """Slowest copy rate granted on any switch, B/s (the port rate if none was shared)."""
        return min((s.min_rate_bps for s in self._switches.values()),
                   default=self.spec.port_gbps * 1e9)
