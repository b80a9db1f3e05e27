"""Scenario files: YAML -> validated, immutable :class:`Scenario`.

Loading goes: read YAML -> resolve catalog names (``cluster.device: h100-sxm``) into inline
specs -> apply ``--set dotted.key=value`` overrides -> validate every section (pydantic,
unknown keys rejected) -> cross-section checks (devices vs parallelism, precision vs device,
fault targets vs topology). Every problem found is reported at once in one
:class:`~twin.kernel.errors.ScenarioError`, each with its field path.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from devices.memory_spec import MemorySpec
from devices.power import PowerSpec
from devices.spec import DeviceSpec, LinkSpec
from scenarios.faults import FaultSpec
from topologies.spec import TopologySpec
from twin.budget import LimitsSpec
from twin.catalogs import REFERENCES, resolve
from twin.kernel.errors import InfeasibleConfig, Problem, ScenarioError
from twin.kernel.schema import (
    NonNegativeFloat,
    PositiveFloat,
    StrictModel,
    dotted_key_problem,
    int64_problems,
    merge_problems,
    problems_from_validation,
    read_yaml,
    require_mapping,
)
from workloads.data import DataSpec
from workloads.job import JobSpec
from workloads.overlap import OverlapSpec
from workloads.spec import WorkloadSpec

TRACE_TABLES = ("ops", "messages", "links", "power", "alerts", "telemetry", "ranks", "faults",
                "data", "devices", "phase_links")
CollectiveAlgorithm = Literal["auto", "ring", "bidir_ring", "torus2d", "hierarchical",
                              "rail_rings"]


class ClusterSpec(StrictModel):
    """Hardware: topology, accelerator and link types (wiring in ``topologies.graph``)."""

    topology: TopologySpec
    device: DeviceSpec
    link: LinkSpec = Field(description="device link: grid / ring edges, dragonfly links inside "
                                       "a group, GPU-NVSwitch links of a switched node")
    links_per_edge: int = Field(default=1, ge=1, le=1024,
                                description="physical links per graph edge")
    nic_link: LinkSpec | None = Field(
        default=None, description="switched (required): InfiniBand link of the fat-tree "
                                  "(NIC-leaf and leaf-spine, one port per edge)")
    global_link: LinkSpec | None = Field(
        default=None, description="dragonfly2d: link between groups (default: link)")
    global_links_per_edge: int | None = Field(
        default=None, ge=1, le=1024, description="dragonfly2d: links per global edge "
                                        "(default: links_per_edge)")

    def link_fields(self) -> dict[str, LinkSpec]:
        """The link specs given, by field name (``link``, ``nic_link``, ``global_link``)."""
        out = {"link": self.link}
        for key in ("nic_link", "global_link"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def link_specs(self) -> dict[str, LinkSpec]:
        """Link spec per catalog name used on the topology's edges (the Fabric's mapping)."""
        return {spec.name: spec for spec in self.link_fields().values()}

    def topology_options(self) -> dict[str, Any]:
        """Keyword arguments of ``topologies.graph.build_topology`` beyond kind, shape, link
        and links_per_edge."""
        t = self.topology
        return {"nic_link": self.nic_link.name if self.nic_link else None,
                "global_link": self.global_link.name if self.global_link else None,
                "global_links_per_edge": self.global_links_per_edge,
                "nics_per_node": t.nics_per_node, "nodes_per_leaf": t.nodes_per_leaf,
                "oversubscription": t.oversubscription}


class NetworkSpec(StrictModel):
    """How transfers are simulated."""

    model: Literal["flow", "packet"] = Field(
        default="flow",
        description="flow: max-min fair sharing of link bandwidth (fast); packet: messages cut "
                    "into packets that queue FIFO on each link (detailed)")
    packet_kib: PositiveFloat = Field(default=1024.0, description="packet size, KiB (packet)")
    retransmit_timeout_s: PositiveFloat = Field(
        default=1.07, description="wait before resending a transfer cut by a link failure, s "
                                  "(NCCL_IB_TIMEOUT=18: 4.096 us * 2^18)")
    tp_algorithm: CollectiveAlgorithm = Field(
        default="auto", description="collective algorithm of tensor-parallel groups "
                                    "(workloads.collectives)")
    dp_algorithm: CollectiveAlgorithm = Field(
        default="auto", description="collective algorithm of data-parallel groups")
    protocols: Literal["nccl", "links"] = Field(
        default="nccl", description="nccl: every collective runs with the protocol (LL, "
                                    "LL128, Simple) NCCL's cost model picks for its size, "
                                    "with that protocol's latency and bandwidth "
                                    "(workloads.nccl); links: the links' own overhead and "
                                    "latency per step, full bandwidth")
    ring_model: Literal["auto", "step", "lockstep"] = Field(
        default="auto", description="step: the flows of a ring collective each send one "
        "chunk per step and wait at a barrier for the slowest (per-step barrier); lockstep: "
        "the members advance together at the slowest one's rate, the limit the step model "
        "reaches as its steps are cut finer (a ring pipelined in small slices, as NCCL sends "
        "it), with HBM ports too (the ring at its slowest member's port); flow model only; "
        "auto: lockstep in the flow model, step in the packet model; the summary's "
        "ring_model says which ran")
    ring_substeps: int = Field(
        default=1, ge=1, le=64, description="barriers per ring chunk in the step model "
        "(flow model): each step's chunk is sent in this many barrier-synchronised parts, "
        "the step model's discretization; as it grows the step model approaches lockstep "
        "(a convergence check, at the cost of an event per part and ring out of step); "
        "needs ring_model: step")

    @model_validator(mode="after")
    def _lockstep_needs_flows(self) -> NetworkSpec:
        if self.model != "flow" and (self.ring_model == "lockstep" or self.ring_substeps != 1):
            raise ValueError("ring_model: lockstep and ring_substeps > 1 need model: flow (the "
                             "packet model sends every ring step as messages), got model: "
                             f"{self.model}, ring_model: {self.ring_model}, ring_substeps: "
                             f"{self.ring_substeps}")
        if self.ring_substeps != 1 and self.ring_model != "step":
            raise ValueError(f"ring_substeps: {self.ring_substeps} is the step model's "
                             "barriers per chunk and needs ring_model: step, got ring_model: "
                             f"{self.ring_model}")
        return self

    @property
    def algorithms(self) -> dict[str, str]:
        """Algorithm per group kind, as ``workloads.parallel.Layout`` takes them."""
        return {"tp": self.tp_algorithm, "dp": self.dp_algorithm}


class SimulationSpec(StrictModel):
    """Engine options."""

    symmetry: bool = Field(
        default=True, description="true: simulate one representative of ranks that nothing "
                                  "random or faulty distinguishes (only where that is exact); "
                                  "false: simulate every rank")
    exact: bool = Field(
        default=False, description="true: turn every shortcut off for validation (no rank "
                                   "symmetry, every transfer and collective as its own "
                                   "process); the summary's shortcuts_used lists the ones a "
                                   "run took")
    lockstep_rings: bool = Field(
        default=True, description="fast mode without rank symmetry, under network."
        "ring_model step: tensor-parallel rings as one lock-step flow each (devices.phase."
        "lockstep_ok); false: flow by flow, step by step, as in exact mode (with ring_model "
        "lockstep every ring is lock-step in every mode)")
    optimistic_tp: bool = Field(
        default=True, description="fast mode without rank symmetry: an agent running ahead "
        "of the clock costs the tensor-parallel collectives of its group in closed form even "
        "where pipeline sends or data-parallel rings may reach their links, and is taken "
        "back to the moment one does (workloads.optimistic); false: such collectives go to "
        "the flow engine one by one")
    tp_group_agents: bool = Field(
        default=True, description="fast mode when compute jitter (or per-device HBM "
        "draws, memory.per_device_draws) is all that tells ranks apart: one agent per "
        "tensor-parallel group, each member's durations drawn apart (jitter from the "
        "member's own stream, the draws of exact mode), the group meeting at its slowest "
        "member at every TP collective (devices.accelerator, devices.interference); false: "
        "one agent per rank, as in exact mode")
    compute_jitter_cov: NonNegativeFloat = Field(
        default=0.0, le=10.0, description="coefficient of variation of compute-op durations "
        "(lognormal, mean one); > 0 makes runs depend on the seed; at most 10 (sigma 2.15: "
        "one op in a thousand then lasts over 40x its mean)")
    limits: LimitsSpec = Field(default=LimitsSpec(), description="resource budget of a run "
                                                                 "(twin.budget)")


class TraceSpec(StrictModel):
    """What the run writes."""

    enabled: bool = True
    path: str | None = Field(default=None, description="default runs/<name>.h5")
    tables: list[Literal["ops", "messages", "links", "power", "alerts", "telemetry", "ranks",
                         "faults", "data", "devices", "phase_links"]] = list(TRACE_TABLES)
    compression: Literal["gzip", "lzf", "none"] = "gzip"


class Scenario(StrictModel):
    """A whole scenario: the input of one run."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", max_length=200)
    description: str = ""
    seed: int = Field(default=0, ge=0, le=2**63 - 1,
                      description="root of every random stream (numpy SeedSequence)")
    cluster: ClusterSpec
    workload: WorkloadSpec
    network: NetworkSpec = NetworkSpec()
    simulation: SimulationSpec = SimulationSpec()
    power: PowerSpec = PowerSpec()
    memory: MemorySpec = MemorySpec()
    overlap: OverlapSpec = OverlapSpec()
    data: DataSpec = DataSpec()
    faults: list[FaultSpec] = []
    job: JobSpec = JobSpec()
    trace: TraceSpec = TraceSpec()

    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def sources(self) -> dict[str, str]:
        """Where each catalog number came from, by dotted scenario path."""
        return dict(self._sources)

    @property
    def symmetric(self) -> bool:
        """Symmetry is used unless disabled, or something random or faulty tells ranks apart
        (faults that stop or checkpoint the whole job alike do not; a memory contention model
        draws every block's slowdown at random, per device unless
        ``memory.per_device_draws`` is false; an inlet gradient gives positions their own
        air)."""
        from scenarios.faults import breaks_symmetry

        sim = self.simulation
        return (sim.symmetry and not sim.exact and sim.compute_jitter_cov == 0
                and not breaks_symmetry(self.faults)
                and (self.memory.model == "roofline" or not self.memory.per_device_draws)
                and self.power.thermal.inlet_gradient_k == 0)

    @property
    def tp_groups(self) -> bool:
        """Whether a run without rank symmetry simulates one agent per tensor-parallel group
        (``simulation.tp_group_agents``): fast mode, TP of 2 or more, no fault that aborts
        the job or cuts links, no inlet gradient, no sharded data parallelism, and one of
        - compute jitter or faults that change a device (stragglers, HBM degradation,
          cooling; the pipeline stages of their targets split into one agent per rank:
          ``Layout.solo_devices``) the only things that tell ranks apart (roofline memory,
          no streams beside compute, no data path);
        - a memory contention model drawing per device (``memory.per_device_draws``) the
          only thing (no jitter, no fault); streams beside compute and the data path as
          asked: the group's device agent draws each member's HBM factors
          (``DeviceStreams.price``). Not for the queue model's fresh single-op latency
          draws (``bound: auto``): with their heavy tails a group sending at its slowest
          member ran 0.55% +- 0.22% slower than exact mode (Pareto 2.5, six seeds of twelve
          iterations, Llama 3.2 1B on TP 4 x PP 2 x DP 2), beyond the fast mode's 0.5%.
        The members of a TP group meet at every TP collective, so the group's clock is its
        slowest member's (``devices.accelerator`` and ``devices.interference`` track how far
        each member is behind between collectives). A group issues its other communication
        at its slowest member, where each member would issue its own: with sharding's
        gathers and reduce-scatters that moved the iteration time by up to 1.0% from exact
        mode (jittered, ``tests/test_exact.py``), so sharded runs keep one agent per rank."""
        from scenarios.faults import interrupts_traffic

        sim, ov = self.simulation, self.overlap
        if not (not self.symmetric and sim.tp_group_agents and not sim.exact and sim.symmetry
                and self.workload.parallelism.tp > 1 and not interrupts_traffic(self.faults)
                and self.power.thermal.inlet_gradient_k == 0
                and self.workload.sharding.strategy == "none"):
            return False
        mem = self.memory
        if mem.model != "roofline":  # per-device HBM draws alone tell ranks apart
            return (sim.compute_jitter_cov == 0 and not self.faults
                    and not (mem.model == "queue" and mem.bound == "auto"))
        return ((sim.compute_jitter_cov > 0 or bool(self.faults))
                and not self.data.enabled and not (self.sm_shared or ov.tp_comm))

    @property
    def sm_shared(self) -> bool:
        """Whether collective kernels take SMs from compute: ``overlap.sm_contention`` when
        given, else on exactly when a memory model other than roofline runs device agents."""
        given = self.overlap.sm_contention
        return given if given is not None else self.memory.model != "roofline"

    @property
    def transfers_capped(self) -> bool:
        """Whether transfers pay for HBM contention: ``memory.transfer_cap`` with a controller
        model; the fabric's HBM ports exist in the flow model only."""
        mem = self.memory
        return mem.model != "roofline" and mem.transfer_cap and self.network.model == "flow"

    @property
    def rings(self) -> Literal["step", "lockstep"]:
        """The ring model the run uses (``network.ring_model`` with ``auto`` resolved):
        ``lockstep`` in the flow model, HBM ports (:attr:`transfers_capped`) or not: a ring
        then moves at its slowest member's port; ``step`` in the packet model or where
        asked for."""
        net = self.network
        if net.ring_model in ("auto", "lockstep") and net.model == "flow":
            return "lockstep"
        return "step"

    @property
    def trace_path(self) -> Path:
        """Where the trace is written."""
        return Path(self.trace.path or f"runs/{self.name}.h5")

    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario as plain data (catalog names expanded)."""
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        """The resolved scenario as YAML (stored in every trace)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def replace(self, overrides: list[str] | dict[str, Any]) -> Scenario:
        """A copy with overrides applied and validated again."""
        raw = self.to_dict()
        scen = _build(raw, overrides, source="<scenario>")
        scen._sources.update({k: v for k, v in self._sources.items()})
        return scen


# ----------------------------------------------------------------------------- loading
def parse_override(text: str) -> tuple[str, Any]:
    """Split ``dotted.key=value``; the value is parsed as YAML (``4``, ``[4, 4]``, ``fp8``)."""
    if "=" not in text:
        raise ScenarioError([Problem("--set", "override must look like dotted.key=value", text)])
    key, _, raw = text.partition("=")
    key = key.strip()
    bad = dotted_key_problem(key, "--set")
    if bad:
        raise ScenarioError([Problem(bad.path, bad.message, text, bad.allowed)])
    from twin.kernel.reading import load_yaml_text

    value = load_yaml_text(raw, path=f"--set {key[:100]}") if raw.strip() else ""
    return key, value


def _set_path(raw: dict[str, Any], key: str, value: Any, sources: dict[str, str]) -> None:
    bad = dotted_key_problem(key, key)
    if bad:
        raise ScenarioError([bad])
    parts = key.split(".")
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        here = ".".join(parts[: i + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ScenarioError([Problem(here, "no such list index", part,
                                             f"0..{len(node) - 1}")])
            nxt = node[int(part)]
        elif isinstance(node, dict):
            nxt = node.get(part)
            if nxt is None and parts[i + 1].isdigit():  # an index into a list not given
                raise ScenarioError([Problem(f"{here}.{parts[i + 1]}", f"no such list index: "
                                             f"{here} is not set", parts[i + 1],
                                             f"the whole list, e.g. --set '{here}=[...]'")])
            if nxt is None:
                nxt = node[part] = {}
            elif isinstance(nxt, str) and here in REFERENCES:
                nxt, src = resolve(REFERENCES[here], nxt, here)
                sources.update(src)
                node[part] = nxt
        else:
            raise ScenarioError([Problem(here, "cannot set a key inside a scalar", node)])
        if isinstance(node, dict):
            node[part] = nxt
        node = nxt
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ScenarioError([Problem(key, "no such list index", last,
                                         f"0..{len(node) - 1}" if node else "none: empty")])
        node[int(last)] = value
    elif isinstance(node, dict):
        if value is None:  # key=null: back to the key's default (an error if it has none)
            node.pop(last, None)
        else:
            node[last] = value
        for dotted in list(sources):
            if dotted == key or dotted.startswith(key + "."):
                del sources[dotted]  # the user replaced a catalog value
    else:
        raise ScenarioError([Problem(key, "cannot set a key inside a scalar", node)])


def _get_path(raw: Any, key: str) -> Any:
    node = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _resolve_refs(raw: dict[str, Any], sources: dict[str, str]) -> list[Problem]:
    problems: list[Problem] = []
    for path, kind in REFERENCES.items():
        value = _get_path(raw, path)
        if value is None:
            continue
        try:
            resolved, src = resolve(kind, value, path)
        except ScenarioError as exc:
            problems.extend(exc.problems)
            continue
        parent = _get_path(raw, path.rsplit(".", 1)[0])
        if isinstance(resolved, dict):
            resolved = dict(resolved)
        parent[path.rsplit(".", 1)[1]] = resolved
        sources.update(src)
    return problems


def _build(raw: Any, overrides: list[str] | dict[str, Any] | None, source: str) -> Scenario:
    """Validate in stages, each reporting every problem it finds: the file's own values
    (catalog names, overrides, 64-bit integers and the schema, across all sections at
    once), then the resource budget (before anything is allocated), then cross-section
    rules, then memory feasibility."""
    raw = copy.deepcopy(require_mapping(raw, "scenario", "name, seed, cluster, workload, ...",
                                        source))
    sources: dict[str, str] = {}
    problems = _resolve_refs(raw, sources)
    items = overrides.items() if isinstance(overrides, dict) else [
        parse_override(o) for o in (overrides or [])]
    for key, value in items:
        try:
            _set_path(raw, key, value, sources)
        except ScenarioError as exc:
            problems.extend(exc.problems)
    problems.extend(_resolve_refs(raw, sources))
    problems = merge_problems(problems, int64_problems(raw))
    try:
        scen = Scenario.model_validate(raw)
    except ValidationError as exc:
        problems = merge_problems(problems, problems_from_validation(
            exc, model=Scenario, document=raw))
    if problems:
        raise ScenarioError(_unique(problems), source=source)
    from twin.budget import check_budget

    problems = check_budget(scen)
    if problems:
        raise ScenarioError(problems, source=source)
    problems = check_consistency(scen)
    if problems:
        raise ScenarioError(problems, source=source)
    from devices.power import cap_problems
    from workloads.feasibility import check_memory

    problems = (check_memory(scen.workload, scen.cluster.device)
                + cap_problems(scen.power, scen.cluster.device))
    if problems:
        raise InfeasibleConfig(problems, source=source)
    scen._sources.update(sources)
    return scen


def _unique(problems: list[Problem]) -> list[Problem]:
    """Problems in order, each once."""
    seen: set[str] = set()
    out = []
    for p in problems:
        if str(p) not in seen:
            seen.add(str(p))
            out.append(p)
    return out


def load_scenario(path: str | Path | dict[str, Any],
                  overrides: list[str] | dict[str, Any] | None = None,
                  source: str | None = None) -> Scenario:
    """Load, resolve and validate a scenario.

    Args:
        path: a YAML file, or an already parsed document (anything but a mapping is reported
            as a ScenarioError, as in a file).
        overrides: ``["workload.parallelism.dp=4", ...]`` or ``{"seed": 3}``; values are parsed
            as YAML and validated with the schema's types.
        source: where an already parsed mapping came from (named in errors; default
            ``<dict>``).

    Raises:
        ScenarioError: listing every problem (missing file, malformed YAML, unknown key, wrong
            type, unknown catalog name, inconsistent sections), each with its field path.
    """
    if not isinstance(path, (str, os.PathLike)):  # an already parsed document
        return _build(path, overrides, source=source or "<dict>")
    p = Path(path)
    raw = read_yaml(p, "scenario")
    return _build(raw, overrides, source=str(p))


# ----------------------------------------------------------------------------- consistency
def check_consistency(scen: Scenario) -> list[Problem]:
    """Cross-section checks that single fields cannot express."""
    from workloads.feasibility import check_workload  # workloads own model/strategy rules

    problems: list[Problem] = []
    topo = scen.cluster.topology
    par = scen.workload.parallelism
    if par.world != topo.num_devices:
        problems.append(Problem(
            "workload.parallelism",
            f"dp*tp*pp = {par.dp}*{par.tp}*{par.pp} = {par.world} but the {topo.kind} "
            f"{'x'.join(map(str, topo.shape))} has {topo.num_devices} devices",
            {"dp": par.dp, "tp": par.tp, "pp": par.pp},
            f"degrees whose product is {topo.num_devices}"))
    dev = scen.cluster.device
    prec = scen.workload.precision
    if not dev.supports(prec):
        problems.append(Problem("workload.precision", f"{dev.name} has no {prec} peak", prec,
                                ", ".join(dev.peak_tflops)))
    if scen.workload.attention not in dev.attention_names():
        problems.append(Problem("workload.attention",
                                f"{dev.name} has no fused attention kernel named "
                                f"{scen.workload.attention!r} (its catalog's attention_kernels)",
                                scen.workload.attention, ", ".join(dev.attention_names())))
    problems.extend(check_workload(scen.workload))
    problems.extend(scen.overlap.sharding_problems(scen.workload.sharding.strategy))
    from devices.power import check_power

    problems.extend(check_power(scen.power, dev, par.pp))
    problems.extend(_check_inlet(scen))
    problems.extend(scen.memory.problems(dev))
    problems.extend(scen.data.problems())
    topo_problems = _check_topology(scen)
    problems.extend(topo_problems)
    if not topo_problems:
        problems.extend(_check_faults(scen))
        if par.world == topo.num_devices:
            problems.extend(_check_algorithms(scen))
    return problems


def _check_inlet(scen: Scenario) -> list[Problem]:
    """Inlet air during a cooling failure (ambient + rise) stays a physical inlet temperature."""
    from twin.kernel.schema import MAX_AMBIENT_C

    ambient = scen.power.thermal.ambient_c
    return [Problem(f"faults.{i}.rise_k", f"inlet air would reach {ambient + f.rise_k:g} C "
                    f"(power.thermal.ambient_c {ambient:g} + rise_k), above {MAX_AMBIENT_C:g} C",
                    f.rise_k, f"at most {MAX_AMBIENT_C - ambient:g}")
            for i, f in enumerate(scen.faults)
            if getattr(f, "kind", "") == "cooling_failure" and ambient + f.rise_k > MAX_AMBIENT_C]


def _build_graph(scen: Scenario):
    """The scenario's topology (built for checks; ``twin.build`` builds the run's own)."""
    from topologies.graph import build_topology

    cl = scen.cluster
    return build_topology(cl.topology.kind, cl.topology.shape, cl.link.name,
                          cl.links_per_edge, **cl.topology_options())


def _check_topology(scen: Scenario) -> list[Problem]:
    """Kind-specific topology options and the link types each kind needs."""
    cl = scen.cluster
    kind = cl.topology.kind
    problems = cl.topology.problems("cluster.topology")
    if kind == "switched":
        if cl.nic_link is None and cl.topology.shape[1] > 1:
            problems.append(Problem("cluster.nic_link", "required by a switched cluster of "
                                    f"{cl.topology.shape[1]} nodes (the InfiniBand link type)",
                                    None, "a link catalog name such as ib-ndr400-port, base + "
                                    "overrides, or an inline spec"))
    elif cl.nic_link is not None:
        problems.append(Problem("cluster.nic_link", f"only used by kind switched, not {kind}",
                                cl.nic_link.name, "leave it out"))
    if kind != "dragonfly2d":
        for key in ("global_link", "global_links_per_edge"):
            value = getattr(cl, key)
            if value is not None:
                problems.append(Problem(f"cluster.{key}", f"only used by kind dragonfly2d, not "
                                        f"{kind}", getattr(value, "name", value),
                                        "leave it out"))
    seen: dict[str, str] = {}
    for key, spec in cl.link_fields().items():
        other = seen.get(spec.name)
        if other is not None and getattr(cl, other) != spec:
            problems.append(Problem(f"cluster.{key}.name", f"names a link type that differs "
                                    f"from cluster.{other} of the same name", spec.name,
                                    f"a name other than {spec.name!r} (edges carry link types "
                                    f"by name)"))
        seen.setdefault(spec.name, key)
    return problems


def _check_algorithms(scen: Scenario) -> list[Problem]:
    """An explicit torus2d / hierarchical / rail_rings algorithm must fit every group of its
    kind (a ring fits any group)."""
    net, w = scen.network, scen.workload
    wanted = {k: a for k, a in net.algorithms.items() if a not in ("auto", "ring", "bidir_ring")}
    if not wanted:
        return []
    from workloads import collectives  # only here: the fabric and NetworkX come with them
    from workloads.parallel import Layout

    par = w.parallelism
    topo = _build_graph(scen)
    g = w.sharding.group
    hybrid = w.sharding.strategy == "hybrid_shard" and g is not None and par.dp % g == 0
    layout = Layout(topo, par.dp, par.pp, par.tp, w.placement, symmetric=True,
                    shard=w.sharding.group if hybrid else None)
    problems = []
    for kind, algo in wanted.items():
        # hybrid sharding runs the data-parallel algorithm on shard and replica groups
        for groups in [kind] + (["shard", "replica"] if kind == "dp" and hybrid else []):
            why = collectives.check(algo, layout.all_group_devices(groups), topo)
            if why is None:
                continue
            problems.append(Problem(
                f"network.{kind}_algorithm", f"{algo} does not fit the {groups} groups of "
                f"{scen.cluster.topology.kind} with placement {w.placement}: {why}", algo,
                "auto, ring, bidir_ring; torus2d for groups that are 2D sub-grids of torus2d, "
                "mesh2d or torus3d; hierarchical or rail_rings on switched with equal members "
                "per node"))
            break
    return problems


def _check_faults(scen: Scenario) -> list[Problem]:
    """Fault targets against the topology (``scenarios.faults``)."""
    from scenarios.faults import check_faults

    if not scen.faults:
        return []
    thermal = getattr(getattr(scen.power, "thermal", None), "enabled", True)
    return check_faults(scen.faults, _build_graph(scen), thermal)
