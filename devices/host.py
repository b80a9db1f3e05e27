"""Host side of a node: its spec (CPU cores, storage read bandwidth, PCIe host-to-device
bandwidth) and the SimPy agents the data path runs on.

A *host* is the CPU server a node's GPUs hang off (a DGX H100: 8 GPUs, 112 cores). Three of its
resources feed training input to the GPUs (``workloads.data`` orchestrates them):

* :class:`BandwidthServer` for the node's storage reads (local NVMe or the parallel file
  system through the storage fabric): one FIFO server at ``storage_read_gbps``, shared by every
  GPU of the node;
* :class:`WorkerPool` for CPU preprocessing: ``servers`` worker processes, each runs one job at
  a time for a given number of seconds;
* one :class:`BandwidthServer` per GPU for its PCIe host-to-device copies at
  ``pcie_h2d_gbps`` (a DGX gives every GPU its own PCIe Gen5 x16 port).

Every agent offers a generator method the caller ``yield from`` s (``transfer(nbytes)``,
``work(seconds)``) and counts its busy time. A later shared PCIe-switch agent (GPU, NIC and
host copies on one switch) can take the place of the per-GPU servers by offering the same
``transfer`` method.
"""

from __future__ import annotations

import simpy
from pydantic import Field

from twin.kernel.schema import PositiveFloat, StrictModel


class HostSpec(StrictModel):
    """The CPU host of a node (catalog ``devices/catalog/hosts``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str = ""
    gpus: int = Field(ge=1, description="GPUs per host (the node a data path is shared by)")
    cpu_cores: int = Field(ge=1, description="CPU cores of the host (all sockets)")
    pcie_h2d_gbps: PositiveFloat = Field(
        ge=1e-6,
        description="achievable host-to-device copy bandwidth of one GPU's PCIe port, 1e9 B/s")
    storage_read_gbps: PositiveFloat = Field(
        ge=1e-6, description="read bandwidth of the node's training-data storage, 1e9 B/s")


class BandwidthServer:
    """Moves bytes at a fixed bandwidth, one transfer at a time, first come first served.

    Args:
        env: SimPy environment.
        bytes_per_s: bandwidth (B/s).
    """

    def __init__(self, env: simpy.Environment, bytes_per_s: float):
        self.env = env
        self.bytes_per_s = float(bytes_per_s)
        self._res = simpy.Resource(env, capacity=1)
        self.busy_s = 0.0
        self.bytes = 0.0

    def transfer(self, nbytes: float):
        """Process body: wait for the server, then move ``nbytes`` (B)."""
        with self._res.request() as req:
            yield req
            dt = nbytes / self.bytes_per_s
            yield self.env.timeout(dt)
            self.busy_s += dt
            self.bytes += nbytes


class WorkerPool:
    """``servers`` identical workers; a job holds one of them for its duration (FCFS).

    Args:
        env: SimPy environment.
        servers: number of workers (>= 1).
    """

    def __init__(self, env: simpy.Environment, servers: int):
        self.env = env
        self.servers = int(servers)
        self._res = simpy.Resource(env, capacity=self.servers)
        self.busy_s = 0.0  # worker-seconds

    def work(self, seconds: float):
        """Process body: wait for a free worker, then hold it for ``seconds`` (s)."""
        with self._res.request() as req:
            yield req
            yield self.env.timeout(seconds)
            self.busy_s += seconds
