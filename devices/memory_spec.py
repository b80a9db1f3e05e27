"""The ``memory`` scenario section (schema of :mod:`devices.memory`): the contention model,
its service-time distribution, the compute op's and the DMA streams' request mix."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from twin.kernel.catalog import Catalog
from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.schema import PositiveFloat, StrictModel

if TYPE_CHECKING:  # the queue engine (NumPy) is imported when a distribution is built
    from twin.kernel.queueing import ServiceDistribution

Bound = Literal["bandwidth", "latency", "auto"]
#: A contention level: ``(network DMA streams, host-to-device copy streams)`` beside the op.
Mix = tuple[int, int]
ServiceName = Literal["deterministic", "exponential", "erlang", "hyperexponential", "lognormal",
                      "pareto"]

#: Shape parameters each service distribution takes (its mean is fixed by the HBM part).
SERVICE_SHAPES: dict[str, tuple[str, ...]] = {
    "deterministic": (), "exponential": (), "erlang": ("k",), "hyperexponential": ("cov",),
    "lognormal": ("cov",), "pareto": ("alpha",),
}
_SHAPE_ALLOWED = ("deterministic; exponential; erlang with k; hyperexponential with cov >= 1; "
                  "lognormal with cov; pareto with alpha > 1 (the mean is one burst at the "
                  "peak per-channel bandwidth, not a key)")
_MIN_REQUESTS = 16
#: The request mix of a training step's streams (sources in the YAML file).
STREAMS_DIR = Path(__file__).parent / "catalog" / "hbm" / "streams"


@cache
def stream_mix(name: str = "training") -> dict[str, float]:
    """The request-mix figures of catalog entry ``name`` (``devices/catalog/hbm/streams``)."""
    v = Catalog("hbm-streams", STREAMS_DIR).get(name).values
    return {k: float(x) for k, x in v.items() if k not in ("name", "description")}


_MIX = stream_mix()


def as_mix(k: int | Mix) -> Mix:
    """A contention level as ``(network DMA streams, host-to-device copies)``."""
    if isinstance(k, tuple):
        return int(k[0]), int(k[1])
    return int(k), 0


def _flat(key: tuple) -> tuple[int, ...]:
    out: list[int] = []
    for x in key:
        if isinstance(x, tuple):
            out.extend(int(y) for y in x)
        else:
            out.append(int(x))
    return tuple(out)


def latency_bound(kernel, threshold_bytes: float) -> bool:
    """``memory.bound: auto``: whether a kernel's memory time is latency-bound (every
    non-GEMM kernel: norms, element-wise, optimizer; GEMMs below ``threshold_bytes``)."""
    return not kernel.gemm or kernel.bytes < threshold_bytes


# ============================================================================ scenario schema
class ServiceSpec(StrictModel):
    """Service-time distribution of the ``queue`` model (its shape; the mean is fixed)."""

    dist: ServiceName = Field(default="exponential",
                              description="name of a twin.kernel.queueing service distribution")
    alpha: float | None = Field(default=None, gt=1, allow_inf_nan=False,
                                description="pareto: tail index (<= 2: infinite variance)")
    cov: PositiveFloat | None = Field(default=None, description="lognormal, hyperexponential "
                                                                "(>= 1): coefficient of variation")
    k: int | None = Field(default=None, ge=1, description="erlang: number of phases")

    def params(self) -> dict[str, Any]:
        """The shape parameters given, by name."""
        return {p: getattr(self, p) for p in SERVICE_SHAPES[self.dist]
                if getattr(self, p) is not None}

    def problems(self, prefix: str = "memory.service") -> list[Problem]:
        """Missing or superfluous shape parameters and bad values, by field path."""
        out: list[Problem] = []
        need = SERVICE_SHAPES[self.dist]
        for p in ("alpha", "cov", "k"):
            v = getattr(self, p)
            if p in need and v is None:
                out.append(Problem(f"{prefix}.{p}", f"is required by dist {self.dist}", None,
                                   _SHAPE_ALLOWED))
            elif p not in need and v is not None:
                out.append(Problem(f"{prefix}.{p}", f"is not a parameter of dist {self.dist}",
                                   v, _SHAPE_ALLOWED))
        if not out:
            try:
                self.distribution(1.0, prefix)
            except ScenarioError as exc:
                out.extend(exc.problems)
        return out

    def distribution(self, mean_s: float, path: str = "memory.service") -> ServiceDistribution:
        """The distribution with mean ``mean_s`` (s)."""
        from twin.kernel.queueing import service_from_spec

        return service_from_spec({"name": self.dist, "mean": mean_s, **self.params()}, path)


class OpSpec(StrictModel):
    """The compute op's request stream during its memory phase."""

    load: float | None = Field(
        default=None, gt=0, le=1, description="utilization of the peak HBM bandwidth by the "
        "op's memory phase; default: the device's memory_efficiency")
    read_fraction: float = Field(
        default=_MIX["op_read_fraction"], ge=0, le=1, description="frfcfs: share of reads "
        "(two operands read per result written; catalog hbm/streams/training)")
    row_locality: float = Field(
        default=_MIX["op_row_locality"], ge=0, lt=1, description="frfcfs: probability that a "
        "request stays in the previous request's row (catalog hbm/streams/training)")


class DmaSpec(StrictModel):
    """How one communication transfer in flight becomes an HBM request stream."""

    rate_gbps: PositiveFloat | None = Field(
        default=None, description="HBM traffic of one transfer, GB/s; default: cluster.link "
        "bandwidth x efficiency x links_per_edge x hbm_bytes_per_link_byte")
    hbm_bytes_per_link_byte: PositiveFloat = Field(
        default=_MIX["dma_hbm_bytes_per_link_byte"], description="HBM bytes per byte on the "
        "link per direction (2: the outgoing bytes are read, the incoming written)")
    read_fraction: float = Field(default=_MIX["dma_read_fraction"], ge=0, le=1,
                                 description="frfcfs: share of reads (catalog "
                                 "hbm/streams/training)")
    row_locality: float = Field(
        default=_MIX["dma_row_locality"], ge=0, lt=1, description="frfcfs: probability that a "
        "request stays in the previous request's row (bulk copies walk whole rows; catalog "
        "hbm/streams/training)")


class MemorySpec(StrictModel):
    """The ``memory`` section: HBM contention between compute and communication."""

    model: Literal["roofline", "frfcfs", "queue"] = Field(
        default="roofline", description="roofline: no contention; frfcfs: devices.hbm "
        "controller; queue: single-server FIFO with memory.service")
    bound: Bound = Field(default="bandwidth", description="bandwidth: memory time = "
                         "completion of the op's last request; latency: mean request sojourn "
                         "(Little's law at fixed requests in flight); auto: per kernel, GEMMs "
                         "of at least memory.latency_below_mb bandwidth, the rest latency")
    latency_below_mb: PositiveFloat = Field(
        default=1.0, le=1e6, description="bound auto: GEMMs moving less than this (1e6 B) and "
        "every non-GEMM kernel (norms, element-wise, optimizer) are latency-bound")
    service: ServiceSpec = ServiceSpec()
    op: OpSpec = OpSpec()
    dma: DmaSpec = DmaSpec()
    requests_per_batch: int = Field(default=4096, ge=_MIN_REQUESTS, le=1 << 20,
                                    description="largest op batch simulated, requests")
    batches: int = Field(default=32, ge=4, le=4096,
                         description="simulated batches per (op class, k): the empirical "
                         "distribution ops draw from")
    max_streams: int = Field(default=16, ge=1, le=256,
                             description="largest k simulated; more transfers are clipped")
    per_device_draws: bool = Field(
        default=True, description="every device draws its own slowdowns (rank symmetry off; "
        "in fast mode one agent per TP group draws for each member, simulation."
        "tp_group_agents); false: one agent per class of equal ranks draws for all of them "
        "(symmetry kept): one draw per TP-group member, the block lasting until its last "
        "member ends, replicas share the draws")
    transfer_cap: bool = Field(
        default=True, description="frfcfs / queue: transfers are slowed by HBM contention too: "
        "while a compute block runs, a device's network flows share the HBM bandwidth the "
        "controller gives DMA at the current mix (a virtual HBM port per device in the flow "
        "model) and a host-to-device copy's rate is capped at its copy stream's share; "
        "false: only compute blocks pay (transfers at the fabric's / PCIe's rates)")

    def problems(self, device, prefix: str = "memory") -> list[Problem]:
        """Cross-checks with the device (HBM part in the catalog, service parameters)."""
        out: list[Problem] = []
        if self.model == "queue":
            out.extend(self.service.problems(f"{prefix}.service"))
        if self.model != "roofline":
            from devices.hbm.spec import hbm_catalog

            cat = hbm_catalog()
            if device.hbm_type not in cat:
                out.append(Problem("cluster.device.hbm_type",
                                   f"memory.model {self.model} needs the device's HBM part in "
                                   "devices/catalog/hbm", device.hbm_type,
                                   ", ".join(cat.names())))
        return out


def dma_rate_bytes_per_s(spec: MemorySpec, link, links_per_edge: int) -> float:
    """HBM traffic of one transfer in flight, bytes/s (see the module docstring)."""
    if spec.dma.rate_gbps is not None:
        return spec.dma.rate_gbps * 1e9
    return link.bytes_per_s * links_per_edge * spec.dma.hbm_bytes_per_link_byte


