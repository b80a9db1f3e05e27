"""Faults: the scenario's ``faults`` list, failure processes, and their injection into a run.

Every entry has a ``kind`` (a pydantic discriminated union):

* ``link_failure`` - a link (both directions of a graph edge) goes down and, after a repair
  time, comes back. Routes are recomputed on the degraded graph (shortest paths), rings keep
  their members and order but their edges follow the detour, and what was in flight on the
  link is resent after ``network.retransmit_timeout_s``.
* ``link_down`` / ``link_up`` - the same at fixed times, one event per entry.
* ``nic_failure`` - a GPU's NIC fails: the edge(s) joining it to the InfiniBand fabric go
  down (``switched`` topology); traffic goes round through the node's NVSwitch and another
  NIC, or waits.
* ``accelerator_failure`` - a device dies: the job stops and restarts from its last
  checkpoint (``workloads.job``; the checkpoint policy is the scenario's ``job`` section).
* ``straggler`` - a device's compute blocks take ``factor`` times longer for a window.
* ``hbm_degradation`` - a device's memory time is multiplied by ``factor`` for a window, and
  optionally by a heavy-tailed random multiplier drawn for every block (``tail``, any
  ``twin.kernel.queueing`` service distribution, e.g. Pareto).
* ``cooling_failure`` - the inlet air of a device rises by ``rise_k`` kelvin for a window
  (``Accelerator.set_ambient``); the thermal model (``power.thermal``) heats the die, which
  raises leakage power and may throttle the clock.
Timing (every kind but ``link_down``/``link_up``): a fixed onset ``time_s``,
or a failure process ``ttf`` (time to failure, a distribution) that fires again and again; a
window / repair time ``duration_s`` or ``ttr`` (a distribution); without either, the fault
is permanent. Targets: one ``device`` / ``link``, a list, or ``all``; every target has its
own process and its own random stream (``faults/<index>/<target>``), so per-component
failure rates are exact. Rates can come from the failure-rate catalog
(``scenarios/catalog/failures``, every number with its source), with an ``acceleration``
factor for accelerated-life campaigns (real rates give one failure in months).

A pair of devices that failures disconnect waits until an edge is repaired; if no repair is
ever coming the run ends as ``completed: false`` (it does not hang).
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    field_validator,
    model_validator,
)

from twin.kernel.catalog import Catalog
from twin.kernel.errors import Problem, ScenarioError
from twin.kernel.queueing.bounds import MAX_COV
from twin.kernel.schema import MAX_DIE_C, NonNegativeFloat, PositiveFloat, StrictModel

if TYPE_CHECKING:
    import numpy as np
    import simpy

    from devices.fabric import Fabric
    from topologies.base import Topology
    from twin.kernel.queueing import ServiceDistribution
    from twin.kernel.rng import RngStreams
    from workloads.executor import Executor
    from workloads.job import JobController
    from workloads.parallel import Layout

CATALOG_DIR = Path(__file__).parent / "catalog" / "failures"
HOUR_S = 3600.0
DAY_H = 24.0


# ----------------------------------------------------------------------------- catalog
@cache
def failure_catalog() -> Catalog:
    """The failure-rate catalog (one YAML file per entry, every number with a source)."""
    return Catalog("failures", CATALOG_DIR)


def catalog_rate(name: str) -> tuple[float, str]:
    """Failure rate of one component of a catalog entry, per hour, and its sources.

    An entry gives ``events`` in ``observed_days`` over ``units`` components, or ``mttf_h``
    of a population of ``units`` components, or ``rate_per_unit_h`` directly.

    Raises:
        ValueError: unknown entry (listing the known ones) or an entry of another form.
    """
    cat = failure_catalog()
    if name not in cat:
        raise ValueError(f"unknown failure-rate catalog entry {name!r}; allowed: "
                         f"{', '.join(cat.names())}")
    e = cat.get(name)
    v, s = e.values, e.sources
    if "rate_per_unit_h" in v:
        keys = ["rate_per_unit_h"]
        rate = float(v["rate_per_unit_h"])
    elif "mttf_h" in v:
        keys = ["mttf_h", "units"]
        rate = 1.0 / (float(v["mttf_h"]) * float(v.get("units", 1)))
    elif {"events", "observed_days", "units"} <= set(v):
        keys = ["events", "observed_days", "units"]
        rate = float(v["events"]) / (float(v["observed_days"]) * DAY_H * float(v["units"]))
    else:
        raise ValueError(f"failure-rate entry {name!r} needs rate_per_unit_h, mttf_h + units, "
                         f"or events + observed_days + units")
    return rate, f"{name}: " + "; ".join(f"{k}={v[k]} ({s[k]})" for k in keys if k in s)


def _number(value: Any) -> float | None:
    """``value`` as the schema would read a number (``1e9``, which YAML 1.1 reads as text,
    included); None for anything else (true/false, NaN and other text, lists)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            return None
        return x if math.isfinite(x) else None
    return None


def _resolve_catalog(data: Any, field: str, from_mean) -> Any:
    """Before-validator: ``catalog`` + ``acceleration`` -> ``field`` (and ``source``). An
    ``acceleration`` other than 1 without ``catalog`` is refused: it multiplies a catalog
    entry's rate, and a time given directly (``field``) would silently ignore it."""
    if not isinstance(data, dict):
        return data
    if data.get("catalog") is None:
        acc = data.get("acceleration", 1.0)
        if _number(acc) not in (None, 1.0):
            raise ValueError(f"acceleration multiplies the failure rate of a catalog entry; "
                             f"without catalog it would be ignored: give the accelerated "
                             f"{field} instead, or catalog (got acceleration {acc!r})")
        return data
    data = dict(data)
    rate, source = catalog_rate(str(data["catalog"]))
    acc = _number(data.get("acceleration", 1.0))
    if acc is None or not acc > 0:
        raise ValueError(f"acceleration must be a number > 0, got {data['acceleration']!r}")
    mean_s = HOUR_S / (rate * acc)
    if not math.isfinite(mean_s):  # e.g. acceleration 1e-300: the mean overflows a float
        least = HOUR_S / (rate * sys.float_info.max)
        raise ValueError(f"acceleration must be >= {least:.3g} for "
                         f"catalog entry {data['catalog']!r} (rate {rate:.6g} per h): below it "
                         f"the mean time {HOUR_S:g} s / (rate x acceleration) overflows, got "
                         f"{acc!r}")
    value = from_mean(data, mean_s)
    given = data.get(field)
    if given is not None and not math.isclose(float(given), value, rel_tol=1e-9):
        raise ValueError(f"give {field} or catalog, not both ({field}={given} but catalog "
                         f"{data['catalog']!r} x acceleration {acc} gives {value:.6g})")
    data[field] = value
    data["source"] = source + (f"; accelerated x{acc:g}" if acc != 1 else "")
    return data


# ----------------------------------------------------------------------------- distributions
class Exponential(StrictModel):
    """Exponential time (memoryless): ``mean_s``, or the rate of a catalog entry."""

    dist: Literal["exponential"]
    mean_s: PositiveFloat | None = Field(default=None, description="mean, s")
    catalog: str | None = Field(default=None, description="failure-rate catalog entry")
    acceleration: PositiveFloat = Field(default=1.0, description="rate multiplier")
    source: str = Field(default="", description="filled from the catalog")

    @model_validator(mode="before")
    @classmethod
    def _catalog(cls, data: Any) -> Any:
        return _resolve_catalog(data, "mean_s", lambda _d, mean: mean)

    @model_validator(mode="after")
    def _given(self) -> Exponential:
        if self.mean_s is None:
            raise ValueError("give mean_s (s) or catalog (a failure-rate entry: "
                             f"{', '.join(failure_catalog().names())})")
        return self

    @property
    def mean(self) -> float:
        """Mean, s."""
        return float(self.mean_s)

    def sample(self, rng: np.random.Generator) -> float:
        """One draw, s."""
        return float(rng.exponential(self.mean_s))


#: Smallest Weibull shape ``k`` whose mean factor ``Gamma(1 + 1/k)`` is a finite float
#: (``Gamma(171) ~ 7e306``; below ``k = 1/170`` it overflows): shapes that small put all but a
#: vanishing share of the failures at time ~0 and the rest beyond any run.
WEIBULL_MIN_SHAPE = 1.0 / 170.0


def _weibull_mean_factor(k: float) -> float:
    """``Gamma(1 + 1/k)``, the Weibull mean over its scale, or a ValueError naming ``shape``."""
    if not k >= WEIBULL_MIN_SHAPE:
        raise ValueError(f"shape must be >= {WEIBULL_MIN_SHAPE:.6g} (1/170: the mean "
                         f"scale x Gamma(1 + 1/shape) overflows below it), got {k!r}")
    return math.gamma(1.0 + 1.0 / k)


class Weibull(StrictModel):
    """Weibull time ``scale * W`` with shape ``k`` (< 1: infant mortality, > 1: wear-out);
    ``scale_s``, or the mean of a catalog entry (``scale = mean / Gamma(1 + 1/k)``)."""

    dist: Literal["weibull"]
    shape: PositiveFloat = Field(ge=WEIBULL_MIN_SHAPE, description="shape k (>= 1/170)")
    scale_s: PositiveFloat | None = Field(default=None, description="scale, s")
    catalog: str | None = None
    acceleration: PositiveFloat = 1.0
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _catalog(cls, data: Any) -> Any:
        def scale(d: dict, mean: float) -> float:
            k = _number(d.get("shape"))
            if k is None or not k > 0:
                raise ValueError(f"shape must be a number > 0, got {d.get('shape')!r}")
            return mean / _weibull_mean_factor(k)
        return _resolve_catalog(data, "scale_s", scale)

    @model_validator(mode="after")
    def _given(self) -> Weibull:
        if self.scale_s is None:
            raise ValueError("give scale_s (s) or catalog (a failure-rate entry)")
        return self

    @property
    def mean(self) -> float:
        """Mean, s."""
        return float(self.scale_s) * _weibull_mean_factor(self.shape)

    def sample(self, rng: np.random.Generator) -> float:
        """One draw, s."""
        return float(self.scale_s * rng.weibull(self.shape))


#: Largest lognormal coefficient of variation: the service times' bound (beyond ~1e154
#: ``sigma^2 = log(1 + cov^2)`` overflows and every draw is NaN, a NaN onset that silently
#: corrupts the event queue; long before that a finite run cannot resolve the distribution).
LOGNORMAL_MAX_COV = MAX_COV


class Lognormal(StrictModel):
    """Lognormal time with ``mean_s`` and coefficient of variation ``cov`` (repair times)."""

    dist: Literal["lognormal"]
    mean_s: PositiveFloat
    cov: PositiveFloat = Field(le=LOGNORMAL_MAX_COV, description="coefficient of variation "
                                                                 "(<= 1e3)")

    @property
    def mean(self) -> float:
        """Mean, s."""
        return float(self.mean_s)

    def sample(self, rng: np.random.Generator) -> float:
        """One draw, s."""
        s2 = math.log1p(self.cov * self.cov)
        return float(rng.lognormal(math.log(self.mean_s) - 0.5 * s2, math.sqrt(s2)))


class Fixed(StrictModel):
    """A fixed time."""

    dist: Literal["fixed"]
    value_s: NonNegativeFloat

    @property
    def mean(self) -> float:
        """The value, s."""
        return float(self.value_s)

    def sample(self, rng: np.random.Generator) -> float:
        """The value, s (no draw)."""
        return float(self.value_s)


DIST_TAGS = ("exponential", "weibull", "lognormal", "fixed")
Dist = Annotated[Union[Exponential, Weibull, Lognormal, Fixed],  # noqa: UP007
                 Field(discriminator="dist")]


# ----------------------------------------------------------------------------- fault specs
class _Timed(StrictModel):
    """Onset at ``time_s`` or by a failure process ``ttf``; window ``duration_s`` or ``ttr``."""

    time_s: NonNegativeFloat | None = Field(default=None, description="fixed onset, s")
    ttf: Dist | None = Field(default=None, description="time to failure (a process)")
    duration_s: NonNegativeFloat | None = Field(default=None, description="window / repair, s")
    ttr: Dist | None = Field(default=None, description="window / repair distribution")

    @model_validator(mode="after")
    def _timing(self) -> _Timed:
        if (self.time_s is None) == (self.ttf is None):
            raise ValueError("give exactly one of time_s (a fixed onset, s) and ttf (a "
                             "time-to-failure distribution: exponential, weibull, lognormal, "
                             "fixed)")
        if self.duration_s is not None and self.ttr is not None:
            raise ValueError("give at most one of duration_s and ttr")
        return self

    def window(self, rng: np.random.Generator) -> float | None:
        """Length of one window / repair, s (None: permanent)."""
        if self.duration_s is not None:
            return float(self.duration_s)
        if self.ttr is not None:
            return self.ttr.sample(rng)
        return None


class _OnDevices(_Timed):
    device: int | None = Field(default=None, ge=0, description="one device id")
    devices: Literal["all"] | list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="device ids, or all")

    @model_validator(mode="after")
    def _target(self) -> _OnDevices:
        if (self.device is None) == (self.devices is None):
            raise ValueError("give exactly one of device (an id) and devices (a list of ids "
                             "or 'all')")
        return self

    def targets(self, n_devices: int) -> list[int]:
        """Device ids this entry applies to."""
        if self.device is not None:
            return [self.device]
        if self.devices == "all":
            return list(range(n_devices))
        return list(self.devices)


class LinkFault(StrictModel):
    """A link (both directions of a graph edge) goes down or comes back at a fixed time."""

    kind: Literal["link_down", "link_up"]
    time_s: NonNegativeFloat
    link: tuple[int, int] = Field(description="the edge's two node ids")


class LinkFailure(_Timed):
    """Links fail and are repaired (fixed times or a failure process per link)."""

    kind: Literal["link_failure"]
    link: tuple[int, int] | None = Field(default=None, description="one edge [u, v]")
    links: Literal["all"] | list[tuple[int, int]] | None = Field(
        default=None, description="edges, or all")

    @model_validator(mode="after")
    def _target(self) -> LinkFailure:
        if (self.link is None) == (self.links is None):
            raise ValueError("give exactly one of link ([u, v]) and links (a list of [u, v] "
                             "or 'all')")
        return self

    def targets(self, topo: Topology) -> list[tuple[int, int]]:
        """Edges (sorted pairs) this entry applies to."""
        if self.link is not None:
            return [_edge(*self.link)]
        if self.links == "all":
            return sorted(_edge(u, v) for u, v in topo.graph.edges())
        return [_edge(u, v) for u, v in self.links]


class NicFailure(_OnDevices):
    """A GPU's NIC fails (switched topology): its fabric edge(s) go down for a window."""

    kind: Literal["nic_failure"]


class AcceleratorFailure(_OnDevices):
    """A device dies: the job restarts from its last checkpoint."""

    kind: Literal["accelerator_failure"]

    @model_validator(mode="after")
    def _no_window(self) -> AcceleratorFailure:
        if self.duration_s is not None or self.ttr is not None:
            raise ValueError("an accelerator failure has no duration: the job is down for "
                             "job.restart_s (a spare replaces the device)")
        return self


#: Largest slowdown a straggler or an HBM degradation may apply: its ``factor`` (and, for an
#: HBM degradation with a ``tail``, the mean multiplier ``factor x tail mean``). A device a
#: thousand times slower is as good as failed (``accelerator_failure``); beyond that the
#: simulated time, and the idle power / thermal segments that grow with it, run away (a
#: straggler factor of 1e9 ran for minutes and gigabytes; found by the fuzzer, seed 19).
MAX_SLOWDOWN = 1e3


class Straggler(_OnDevices):
    """A device's compute blocks take ``factor`` times longer during the window."""

    kind: Literal["straggler"]
    factor: PositiveFloat = Field(le=MAX_SLOWDOWN,
                                  description="multiplies block durations (> 1 slows; <= 1e3)")


class HbmDegradation(_OnDevices):
    """A device's memory time is multiplied by ``factor`` (and a per-block random ``tail``
    multiplier) during the window."""

    kind: Literal["hbm_degradation"]
    factor: PositiveFloat = Field(default=1.0, le=MAX_SLOWDOWN,
                                  description="memory-time multiplier (<= 1e3)")
    tail: dict[str, Any] | None = Field(
        default=None, description="twin.kernel.queueing service spec of a per-block multiplier, "
                                  "e.g. {name: pareto, alpha: 1.5, mean: 3}")

    @field_validator("tail")
    @classmethod
    def _tail(cls, v: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if v is None:
            return v
        from twin.kernel.queueing import service_from_spec

        try:
            dist = service_from_spec(v, "tail")
        except ScenarioError as exc:
            raise ValueError("; ".join(str(p) for p in exc.problems)) from None
        factor = info.data.get("factor", 1.0)  # absent when the factor itself is wrong
        if factor * dist.mean > MAX_SLOWDOWN:
            raise ValueError(f"the mean memory-time multiplier factor x tail mean = {factor:g} "
                             f"x {dist.mean:.6g} must be <= {MAX_SLOWDOWN:g} (a device that "
                             "much slower is as good as failed: use accelerator_failure)")
        return v

    def tail_distribution(self) -> ServiceDistribution | None:
        """The ``twin.kernel.queueing`` distribution of the per-block multiplier (None: none)."""
        if self.tail is None:
            return None
        from twin.kernel.queueing import service_from_spec

        return service_from_spec(self.tail, "tail")


class CoolingFailure(_OnDevices):
    """A device's cooling degrades: its inlet air is ``rise_k`` warmer during the window."""

    kind: Literal["cooling_failure"]
    rise_k: Annotated[float, Field(gt=0, le=MAX_DIE_C)] = Field(
        description="inlet air temperature rise, K")


FAULT_TYPES = (LinkFault, LinkFailure, NicFailure, AcceleratorFailure, Straggler,
               HbmDegradation, CoolingFailure)
FAULT_KINDS = ("link_down", "link_up", "link_failure", "nic_failure", "accelerator_failure",
               "straggler", "hbm_degradation", "cooling_failure")
#: Kinds that affect the whole job alike (rank symmetry may stay on).
JOB_WIDE_KINDS = ("accelerator_failure",)
#: Kinds that only change a device (its clock factor, memory time, inlet air): they neither
#: abort the job nor cut links, so transfers in flight always finish.
DEVICE_KINDS = ("straggler", "hbm_degradation", "cooling_failure")


def _strip_tags(value: Any, handler):
    """Drop the union tags pydantic puts in error locations (``faults.0.straggler.factor``
    -> ``faults.0.factor``) so every problem names a path the user can write."""
    try:
        return handler(value)
    except ValidationError as exc:
        errors = []
        kind = value.get("kind") if isinstance(value, dict) else None
        for err in exc.errors():
            loc = list(err["loc"])
            if loc and loc[0] == kind:
                loc = loc[1:]
            out = []
            for j, part in enumerate(loc):
                if j > 0 and loc[j - 1] in ("ttf", "ttr") and part in DIST_TAGS:
                    continue
                out.append(part)
            e = {"type": err["type"], "loc": tuple(out), "input": err["input"]}
            if "ctx" in err:
                e["ctx"] = err["ctx"]
            errors.append(e)
        raise ValidationError.from_exception_data(exc.title, errors) from None


FaultSpec = Annotated[
    Union[LinkFault, LinkFailure, NicFailure, AcceleratorFailure, Straggler,  # noqa: UP007
          HbmDegradation, CoolingFailure],
    Field(discriminator="kind"), WrapValidator(_strip_tags)]


def _edge(u: int, v: int) -> tuple[int, int]:
    return (min(int(u), int(v)), max(int(u), int(v)))


# ----------------------------------------------------------------------------- queries
def interrupts_traffic(faults: list) -> bool:
    """Whether some fault can abort the job or cut links (then every transfer and collective
    runs in a process that can be interrupted)."""
    return any(f.kind not in DEVICE_KINDS for f in faults)


def breaks_symmetry(faults: list) -> bool:
    """Whether some fault tells ranks apart (then every rank is simulated)."""
    return any(f.kind not in JOB_WIDE_KINDS for f in faults)


def nic_edges(topo: Topology, device: int) -> list[tuple[int, int]]:
    """Edges joining ``device``'s NIC to the fabric (empty without NICs).

    ``switched`` with one NIC per GPU: the GPU - rail-leaf edge; with NICs shared through the
    NVSwitch: the node's NVSwitch - leaf edge of the GPU's rail.
    """
    ft = getattr(topo, "fat_tree", None)
    if ft is None or not ft.has_fabric or not 0 <= device < topo.n_devices:
        return []
    node = ft.node_of(device)
    leaf = ft.leaf(ft.rail_of(device), ft.leaf_group(node))
    end = device if ft.per_gpu_nics else ft.nvswitch(node)
    return [_edge(end, leaf)] if topo.graph.has_edge(end, leaf) else []


def check_faults(faults: list, topo: Topology, thermal: bool) -> list[Problem]:
    """Problems of the fault list against the topology (and whether the thermal model that
    a cooling failure acts on is on), each with its field path."""
    problems: list[Problem] = []
    n = topo.n_devices
    graph = topo.graph
    for i, f in enumerate(faults):
        if f.kind == "cooling_failure" and not thermal:
            problems.append(Problem(f"faults.{i}.kind", "a cooling failure needs the thermal "
                                    "model", f.kind, "power.thermal.enabled: true"))
        if f.kind in ("link_down", "link_up"):
            edges = [("link", f.link)]
        elif f.kind == "link_failure":
            edges = ([("link", f.link)] if f.link is not None else
                     [(f"links.{j}", e) for j, e in enumerate(f.links)]
                     if f.links != "all" else [])
        else:
            edges = []
        for where, (u, v) in edges:
            if not graph.has_edge(u, v):
                problems.append(Problem(f"faults.{i}.{where}", "no such edge in the topology",
                                        [u, v], "two neighbouring node ids"))
        if isinstance(f, _OnDevices):
            ids = ([("device", f.device)] if f.device is not None else
                   [(f"devices.{j}", d) for j, d in enumerate(f.devices)]
                   if f.devices != "all" else [])
            for where, d in ids:
                if d >= n:
                    problems.append(Problem(f"faults.{i}.{where}", "no such device", d,
                                            f"0..{n - 1}"))
                elif f.kind == "nic_failure" and not nic_edges(topo, d):
                    problems.append(Problem(
                        f"faults.{i}.{where}", f"device has no NIC in a {topo.kind} topology",
                        d, "a GPU of a switched topology with more than one node"))
            if f.kind == "nic_failure" and f.devices == "all" and not nic_edges(topo, 0):
                problems.append(Problem(f"faults.{i}.devices", f"a {topo.kind} topology has "
                                        "no NICs", "all", "a switched topology with nodes > 1"))
    return problems


# ----------------------------------------------------------------------------- injection
_PENDING = object()  # an onset still to come
class FaultInjector:
    """Runs the fault processes of a scenario against the agents of one run.

    Args:
        env: SimPy environment.
        faults: the scenario's fault list.
        fabric: the run's ``devices.fabric.Fabric``.
        executor: the ``workloads.executor.Executor`` (accelerators, classes).
        job: the ``workloads.job.JobController``.
        layout: the ``workloads.parallel.Layout`` (device -> rank class).
        rngs: the run's ``twin.kernel.rng.RngStreams``.

    ``rows`` collects ``(time_s, kind, target, action)`` for the ``faults`` table; ``stalled``
    fires when failures disconnect a pair of devices and no repair is pending.
    """

    def __init__(self, env: simpy.Environment, faults: list, fabric: Fabric,
                 executor: Executor, job: JobController, layout: Layout, rngs: RngStreams):
        self.env = env
        self.faults = list(faults)
        self.fabric = fabric
        self.executor = executor
        self.job = job
        self.rngs = rngs
        self.rows: list[tuple[float, str, str, str]] = []
        self.stalled = env.event()
        self.onsets = 0
        self._down: dict[tuple[int, int], int] = defaultdict(int)
        self._restores_pending = 0
        self._slow: dict[int, list[float]] = defaultdict(list)
        self._mem: dict[int, list[tuple]] = defaultdict(list)
        self._heat: dict[int, list[float]] = defaultdict(list)
        self._ambient0 = [getattr(a, "ambient_c", None) for a in executor.accelerators]
        import numpy as np

        n_dev = fabric.topo.n_devices
        cls_of = np.full(n_dev, -1, dtype=np.int64)
        cls_of[layout.device] = layout.rank_class
        self._cls_of = cls_of
        self.has_tails = any(f.kind == "hbm_degradation" and f.tail is not None
                             for f in self.faults)
        fabric.on_stall = self._on_stall

    def device_classes(self) -> set[int]:
        """Rank classes whose devices a fault may change (every target of a straggler, HBM
        degradation or cooling failure)."""
        n = self.fabric.topo.n_devices
        return {int(self._cls_of[d]) for f in self.faults if f.kind in DEVICE_KINDS
                for d in f.targets(n) if self._cls_of[d] >= 0}

    # -------------------------------------------------------------- setup
    def start(self) -> None:
        """Start one process per (entry, target).

        Call before the simulation runs: an onset at ``time_s: 0`` (other than an
        accelerator failure) is applied here, so it holds from the very first block and
        message.
        """
        topo = self.fabric.topo
        for i, f in enumerate(self.faults):
            if f.kind in ("link_down", "link_up"):
                if f.time_s == 0 and f.kind == "link_down":
                    edge = _edge(*f.link)
                    self._edges_down([edge], f.kind, f"link:{edge[0]}-{edge[1]}")
                else:
                    self.env.process(self._fixed_link(f))
                continue
            if f.kind == "link_failure":
                targets = [(f"link:{u}-{v}", (u, v)) for u, v in f.targets(topo)]
            else:
                targets = [(f"{'nic' if f.kind == 'nic_failure' else 'device'}:{d}", d)
                           for d in f.targets(topo.n_devices)]
            now = f.time_s == 0 and f.kind != "accelerator_failure"
            for name, target in targets:
                rng = self.rngs.get(f"faults/{i}/{name}")
                state = _PENDING
                if now:
                    self.onsets += 1
                    state = self._onset(f, name, target, rng)
                self.env.process(self._life(f, name, target, rng, state))

    # -------------------------------------------------------------- processes
    def _fixed_link(self, f: LinkFault):
        edge = _edge(*f.link)
        up = f.kind == "link_up"
        if up:
            self._restores_pending += 1
        yield self.env.timeout(f.time_s)
        if up:
            self._restores_pending -= 1
            self._edges_up([edge], f.kind, f"link:{edge[0]}-{edge[1]}")
        else:
            self._edges_down([edge], f.kind, f"link:{edge[0]}-{edge[1]}")

    def _life(self, f, name: str, target, rng: np.random.Generator, state=_PENDING):
        """Onset, window, end; again and again for a failure process (``state`` is the
        onset's state if :meth:`start` applied it already)."""
        links = f.kind in ("link_failure", "nic_failure")
        while True:
            if state is _PENDING:
                yield self.env.timeout(f.time_s if f.time_s is not None else f.ttf.sample(rng))
                self.onsets += 1
                state = self._onset(f, name, target, rng)
            if f.kind == "accelerator_failure":
                if f.time_s is not None:
                    return
                state = _PENDING
                continue  # a spare took the device's place: its clock starts now
            dur = f.window(rng)
            if dur is None:
                return  # permanent
            if links:
                self._restores_pending += 1
            yield self.env.timeout(dur)
            if links:
                self._restores_pending -= 1
            self._end(f, name, target, state)
            if f.time_s is not None:
                return
            state = _PENDING

    def _onset(self, f, name: str, target, rng):
        kind = f.kind
        if kind == "link_failure":
            self._edges_down([target], kind, name)
        elif kind == "nic_failure":
            self._edges_down(nic_edges(self.fabric.topo, target), kind, name)
        elif kind == "accelerator_failure":
            ok = self.job.fail(name)
            self._row(kind, name, "fail" if ok else "ignored (job finished)")
        elif kind == "straggler":
            cls = int(self._cls_of[target])
            self._slow[cls].append(f.factor)
            self._apply(cls)
            self._row(kind, name, "start")
        elif kind == "hbm_degradation":
            cls = int(self._cls_of[target])
            effect = (f.factor, f.tail_distribution(), rng)
            self._mem[cls].append(effect)
            self._apply(cls)
            self._row(kind, name, "start")
            return effect
        elif kind == "cooling_failure":
            cls = int(self._cls_of[target])
            self._heat[cls].append(f.rise_k)
            self._ambient(cls)
            self._row(kind, name, "start")
        return None

    def _end(self, f, name: str, target, state) -> None:
        kind = f.kind
        if kind == "link_failure":
            self._edges_up([target], kind, name)
        elif kind == "nic_failure":
            self._edges_up(nic_edges(self.fabric.topo, target), kind, name)
        elif kind == "straggler":
            cls = int(self._cls_of[target])
            self._slow[cls].remove(f.factor)
            self._apply(cls)
            self._row(kind, name, "end")
        elif kind == "hbm_degradation":
            cls = int(self._cls_of[target])
            self._mem[cls].remove(state)
            self._apply(cls)
            self._row(kind, name, "end")
        elif kind == "cooling_failure":
            cls = int(self._cls_of[target])
            self._heat[cls].remove(f.rise_k)
            self._ambient(cls)
            self._row(kind, name, "end")

    # -------------------------------------------------------------- effects
    def _row(self, kind: str, target: str, action: str) -> None:
        self.rows.append((float(self.env.now), kind, target, action))

    def _edges_down(self, edges, kind: str, name: str) -> None:
        for e in edges:
            self._down[e] += 1
            if self._down[e] == 1:
                self.fabric.fail_edge(*e)
        self._row(kind, name, "down")

    def _edges_up(self, edges, kind: str, name: str) -> None:
        for e in edges:
            if self._down[e] == 0:
                continue
            self._down[e] -= 1
            if self._down[e] == 0:
                self.fabric.restore_edge(*e)
        self._row(kind, name, "up")

    def _apply(self, cls: int) -> None:
        acc = self.executor.accelerators[cls]
        acc.slowdown = math.prod(self._slow[cls]) if self._slow[cls] else 1.0
        acc.mem_scale = math.prod(e[0] for e in self._mem[cls]) if self._mem[cls] else 1.0

    def _ambient(self, cls: int) -> None:
        acc = self.executor.accelerators[cls]
        acc.set_ambient(self._ambient0[cls] + sum(self._heat[cls]))

    def before_block(self, cls: int) -> None:
        """Executor hook: draw the heavy-tailed memory multiplier of a block."""
        effects = self._mem.get(cls)
        if not effects:
            return
        scale = 1.0
        for factor, dist, rng in effects:
            scale *= factor if dist is None else factor * float(dist.sample(rng, 1)[0])
        self.executor.accelerators[cls].mem_scale = scale

    def _on_stall(self, src: int, dst: int) -> None:
        """Fabric callback: no route from src to dst; end the run if no repair is coming."""
        if self._restores_pending == 0 and not self.stalled.triggered:
            self._row("route", f"{src}->{dst}", "stalled (no repair pending)")
            self.stalled.succeed()

    # -------------------------------------------------------------- results
    def table_rows(self) -> list[tuple[float, str, str, str]]:
        """Rows of the ``faults`` table: injected faults, route stalls and job restarts,
        in time order."""
        rows = list(self.rows)
        for t0, t1, s, d in self.fabric.stalls:
            rows.append((t0, "route", f"{s}->{d}", "stall"))
            rows.append((t1, "route", f"{s}->{d}", "resume"))
        if self.job is not None:
            for _t0, t1 in self.job.log.downtimes:
                rows.append((t1, "restart", "job", "resume"))
        return sorted(rows, key=lambda r: r[0])
