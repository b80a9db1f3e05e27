"""Sweep files: a base scenario, a design space, constraints and boundary conditions.

A sweep file (YAML) names a base scenario and the dimensions to vary. Every design point is the
base scenario plus a set of ``dotted.key: value`` overrides, so *any* scenario key can be a design
dimension or a boundary condition; nothing here knows what the keys mean except two convenience
dimensions (``parallelism`` and ``microbatches``). Example::

    name: small-8dev
    base: quickstart.yaml            # relative to this file, or an inline scenario mapping
    set: {workload.iterations: 1}    # overrides applied to every point
    space:
      parallelism: all               # every (dp, tp, pp) with dp*tp*pp = devices
      workload.micro_batch: [1, 2]   # a scenario key and its values
      schedule:                      # a named dimension whose options set several keys
        - {label: 1f1b, set: {workload.schedule: 1f1b}}
        - {label: interleaved-v2, set: {workload.schedule: interleaved,
                                         workload.virtual_stages: 2}}
    objectives: [iteration_time_s, energy_per_iteration_j]   # both minimized
    constraints: {avg_power_w: {max: 8000}}
    boundary_conditions:             # the same sweep under each set of overrides
      - {name: nominal}
      - {name: slow-links, set: {cluster.link.bandwidth_gbps: 100}}
    robust: {seeds: [1, 2, 3], quantile: 0.95}

:func:`load_sweep` validates the whole file and reports every problem with its field path
(``space.workload.micro_batch[1]: ...``) in one :class:`~twin.kernel.errors.ScenarioError`.
Whether a single design point is valid (``tp`` divides the heads, it fits in HBM, ...) is *not*
checked here: invalid points are recorded with their reason when the sweep runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from experiments.many import MAX_RUNS, load_spec_file, read_base
from twin.kernel.errors import InfeasibleConfig, Problem, ScenarioError
from twin.kernel.schema import (
    StrictModel,
    dotted_key_problem,
    problems_from_validation,
)

#: Metrics computed by the sweep from the summary and the scenario (not in the run summary).
DERIVED_METRICS = ("time_per_sequence_s", "energy_per_sequence_j", "energy_delay_product_js")

#: Summary keys that can be objectives or constraints (numeric keys of the summary contract).
SUMMARY_METRICS = ("iteration_time_s", "makespan_s", "energy_j", "energy_per_iteration_j",
                   "avg_power_w", "peak_power_w", "tflops_per_device", "mfu",
                   "bubble_fraction", "exposed_comm_fraction")

#: Dimension names with a meaning of their own; every other name is a scenario key or a label.
SPECIAL_DIMENSIONS = ("parallelism", "microbatches")

_NAME = r"^[A-Za-z0-9_.\-]+$"


def metric_names() -> tuple[str, ...]:
    """Metrics an objective or a constraint may name."""
    return SUMMARY_METRICS + DERIVED_METRICS


# ----------------------------------------------------------------------------- file schema
class NSGA2Spec(StrictModel):
    """Settings of the NSGA-II search (pymoo), used when the space is too large to enumerate."""

    pop_size: int = Field(default=24, ge=4, le=10_000, description="population size")
    generations: int = Field(default=20, ge=1, le=10_000,
                             description="generations after the initial one")
    seed: int = Field(default=1, ge=0, le=2**63 - 1,
                      description="seed of the search (same seed, same front)")
    max_evaluations: int | None = Field(
        default=None, ge=1, description="stop once this many distinct points were evaluated "
                                        "(per boundary condition)")
    patience: int | None = Field(
        default=None, ge=1, description="stop after this many generations in a row that leave "
                                        "the front of the evaluated points unchanged")


class BoundarySpec(StrictModel):
    """A boundary condition: a named set of scenario overrides applied to every point."""

    name: str = Field(pattern=_NAME)
    description: str = ""
    set: dict[str, Any] = Field(default_factory=dict,
                                description="dotted scenario key -> value")


class RobustSpec(StrictModel):
    """Evaluate each point over several seeds; fronts of the mean and of a quantile."""

    seeds: list[Annotated[int, Field(ge=0, le=2**63 - 1)]] = Field(
        min_length=1, max_length=1000, description="root seeds of the replicated runs")
    quantile: float = Field(default=0.95, gt=0, lt=1, description="e.g. 0.95 for p95")
    optimize: Literal["mean", "quantile"] = Field(
        default="mean", description="which statistic the main front (and NSGA-II) uses")


class BoundSpec(StrictModel):
    """Bounds on one metric (either may be omitted)."""

    min: float | None = None
    max: float | None = None


class ShapeSpec(StrictModel):
    """Thresholds of the shape analysis (see :func:`experiments.front.shape_analysis`)."""

    jump_fraction: float = Field(default=0.25, gt=0, le=1, description=(
        "a gap between neighbours is a jump if it is at least this fraction of the front's "
        "normalized length"))
    jump_median_factor: float = Field(default=3.0, ge=1, description=(
        "... and at least this many times the median gap"))
    concavity_tol: float = Field(default=0.005, ge=0, description=(
        "a point is non-convex if it lies more than this (fraction of the energy span) above "
        "the lower convex hull"))


class SweepSpec(StrictModel):
    """A whole sweep file."""

    name: str = Field(pattern=_NAME)
    description: str = ""
    base: str | dict[str, Any] = Field(description="scenario path (relative to the sweep file) "
                                                   "or an inline scenario mapping")
    set: dict[str, Any] = Field(default_factory=dict,
                                description="overrides applied to the base for every point")
    space: dict[str, Any] = Field(min_length=1, description="dimension name -> options")
    objectives: tuple[str, str] = ("iteration_time_s", "energy_per_iteration_j")
    constraints: dict[str, BoundSpec] = Field(default_factory=dict)
    method: Literal["auto", "exhaustive", "nsga2"] = "auto"
    exhaustive_limit: int = Field(default=512, ge=1, le=1_000_000,
                                  description="auto: enumerate up to this")
    nsga2: NSGA2Spec = NSGA2Spec()
    boundary_conditions: list[BoundarySpec] = Field(default_factory=list)
    robust: RobustSpec | None = None
    shape: ShapeSpec = ShapeSpec()
    reference_point: tuple[float, float] | None = Field(
        default=None, description="hypervolume reference point in objective units "
                                  "(default: nadir of all fronts + 10% of their span)")


class ParallelismSpace(StrictModel):
    """``space.parallelism`` as a mapping: restrict each degree to a list (None = any)."""

    dp: list[int] | None = None
    tp: list[int] | None = None
    pp: list[int] | None = None


class KeyOption(StrictModel):
    """One option of a named dimension: a label and the overrides it applies."""

    label: str | None = None
    set: dict[str, Any] = Field(min_length=1)


# ----------------------------------------------------------------------------- the space
@dataclass(frozen=True)
class Option:
    """One value of a dimension.

    Attributes:
        label: short text used in point labels and CSV columns.
        value: the value shown in ``points.csv`` (the scalar, the (dp, tp, pp) triple, ...).
        overrides: dotted scenario key -> value applied by this option.
    """

    label: str
    value: Any
    overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Dimension:
    """A design dimension: its name, kind and options (integer-encoded by position)."""

    name: str
    kind: Literal["parallelism", "microbatches", "keys"]
    options: tuple[Option, ...]

    @property
    def keys(self) -> set[str]:
        """Scenario keys this dimension sets."""
        if self.kind == "parallelism":
            return {"workload.parallelism.dp", "workload.parallelism.tp",
                    "workload.parallelism.pp"}
        if self.kind == "microbatches":
            return {"workload.global_batch"}
        return {k for o in self.options for k in o.overrides}


@dataclass(frozen=True)
class DesignSpace:
    """The Cartesian product of the dimensions; a point is a tuple of option indices.

    Attributes:
        dims: the dimensions, in file order.
        base_dp: data-parallel degree of the base scenario (for ``microbatches``).
        base_micro_batch: micro-batch size of the base scenario (for ``microbatches``).
    """

    dims: tuple[Dimension, ...]
    base_dp: int
    base_micro_batch: int

    @property
    def shape(self) -> tuple[int, ...]:
        """Number of options per dimension."""
        return tuple(len(d.options) for d in self.dims)

    @property
    def size(self) -> int:
        """Number of points in the space."""
        return math.prod(self.shape)

    def points(self) -> Iterator[tuple[int, ...]]:
        """Every point, in lexicographic order of the option indices."""
        return itertools.product(*(range(n) for n in self.shape))

    def overrides(self, x: tuple[int, ...]) -> dict[str, Any]:
        """The scenario overrides of point ``x`` (microbatches resolved into global_batch)."""
        out: dict[str, Any] = {}
        counts = None
        for d, i in zip(self.dims, x, strict=True):
            opt = d.options[i]
            if d.kind == "microbatches":
                counts = opt.value
            else:
                out.update(opt.overrides)
        if counts is not None:
            dp = int(out.get("workload.parallelism.dp", self.base_dp))
            mb = int(out.get("workload.micro_batch", self.base_micro_batch))
            out["workload.global_batch"] = dp * mb * counts
        return out

    def values(self, x: tuple[int, ...]) -> dict[str, Any]:
        """Dimension name -> the option's value (what ``points.csv`` shows)."""
        return {d.name: d.options[i].value for d, i in zip(self.dims, x, strict=True)}

    def label(self, x: tuple[int, ...]) -> str:
        """Human-readable label of a point, e.g. ``dp4-tp2-pp1 micro_batch=2 1f1b``."""
        parts = []
        for d, i in zip(self.dims, x, strict=True):
            opt = d.options[i]
            if d.kind == "parallelism" or (d.kind == "keys" and not _is_key_dim(d)):
                parts.append(opt.label)
            else:
                parts.append(f"{d.name.rsplit('.', 1)[-1]}={opt.label}")
        return " ".join(parts)

    def strategy(self, x: tuple[int, ...]) -> str:
        """The parallel strategy of a point (``dp4-tp2-pp1``), or its label if not varied."""
        for d, i in zip(self.dims, x, strict=True):
            if d.kind == "parallelism":
                return d.options[i].label
        return self.label(x)

    def decode(self, label_or_values: Mapping[str, Any]) -> tuple[int, ...]:
        """The point whose dimension values are given (inverse of :meth:`values`)."""
        x = []
        for d in self.dims:
            v = label_or_values[d.name]
            for i, o in enumerate(d.options):
                if o.value == v or o.label == str(v):
                    x.append(i)
                    break
            else:
                raise KeyError(f"{d.name}={v!r} is not an option")
        return tuple(x)


def _is_key_dim(d: Dimension) -> bool:
    """A dimension given as ``dotted.key: [values]`` (as opposed to labelled option sets)."""
    return all(set(o.overrides) == {d.name} for o in d.options)


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "x".join(_fmt_value(e) for e in v)
    return str(v)


def parallel_label(dp: int, tp: int, pp: int) -> str:
    """The strategy label of a (dp, tp, pp) triple."""
    return f"dp{dp}-tp{tp}-pp{pp}"


def factorizations(n: int) -> list[tuple[int, int, int]]:
    """Every (dp, tp, pp) of positive integers with dp * tp * pp = n, sorted by (tp, pp)."""
    out = []
    for tp in range(1, n + 1):
        if n % tp:
            continue
        for pp in range(1, n // tp + 1):
            if (n // tp) % pp:
                continue
            out.append((n // (tp * pp), tp, pp))
    return sorted(out, key=lambda t: (t[1], t[2]))


# ----------------------------------------------------------------------------- the sweep
@dataclass(frozen=True)
class Sweep:
    """A validated sweep: the spec, the raw base scenario, the space, the boundary conditions.

    Attributes:
        spec: the parsed sweep file.
        base: the base scenario as a raw mapping (catalog names still unresolved).
        space: the design space.
        boundaries: the boundary conditions (at least one; the first is the baseline of the
            deformation report).
        source: where the sweep came from (for error messages).
    """

    spec: SweepSpec
    base: dict[str, Any]
    space: DesignSpace
    boundaries: tuple[BoundarySpec, ...]
    source: str = "<sweep>"

    @property
    def seeds(self) -> tuple[int | None, ...]:
        """Seeds each point is run with (``(None,)``: the base scenario's seed)."""
        return tuple(self.spec.robust.seeds) if self.spec.robust else (None,)

    def boundary(self, name: str) -> BoundarySpec:
        """The boundary condition called ``name``."""
        for b in self.boundaries:
            if b.name == name:
                return b
        raise KeyError(name)

    def overrides(self, boundary: str, x: tuple[int, ...], seed: int | None) -> dict[str, Any]:
        """Every override of one run: sweep ``set``, boundary condition, point, seed, no trace.

        The order matters when keys nest: a later key refines an earlier one.
        """
        out: dict[str, Any] = dict(self.spec.set)
        out.update(self.boundary(boundary).set)
        out.update(self.space.overrides(x))
        if seed is not None:
            out["seed"] = seed
        out["trace.enabled"] = False
        return out

    def method_for(self, requested: str | None = None) -> Literal["exhaustive", "nsga2"]:
        """The search method: ``requested`` or the file's, ``auto`` resolved by space size."""
        m = requested or self.spec.method
        if m == "auto":
            m = "exhaustive" if self.space.size <= self.spec.exhaustive_limit else "nsga2"
        if m not in ("exhaustive", "nsga2"):
            raise ScenarioError([Problem("method", "unknown search method", m,
                                         "auto, exhaustive, nsga2")], source=self.source)
        n_runs = self.most_runs(m)
        if n_runs > MAX_RUNS:
            raise ScenarioError([Problem(
                "space", f"the {m} search could make {n_runs} runs (points x boundary "
                f"conditions x seeds), more than the limit of {MAX_RUNS}", self.space.shape,
                "fewer options" + (", or method: nsga2 (or auto)" if m == "exhaustive"
                                   else ", or a smaller nsga2.pop_size / generations / "
                                   "max_evaluations"))], source=self.source)
        return m  # type: ignore[return-value]

    def most_runs(self, method: str) -> int:
        """The most twin runs ``method`` can make: every point (exhaustive), or the distinct
        points NSGA-II can evaluate (population x (generations + 1), capped by the space and
        ``max_evaluations``), times the boundary conditions and the seeds."""
        points = self.space.size
        if method == "nsga2":
            ns = self.spec.nsga2
            points = min(points, ns.pop_size * (ns.generations + 1),
                         ns.max_evaluations or points)
        return points * len(self.boundaries) * len(self.seeds)

    def objective_columns(self, statistic: str | None = None) -> tuple[str, str]:
        """Column names of the two objectives for ``statistic`` (``mean`` or ``quantile``)."""
        stat = statistic or (self.spec.robust.optimize if self.spec.robust else "mean")
        if stat == "mean":
            return self.spec.objectives
        suffix = quantile_suffix(self.spec.robust.quantile if self.spec.robust else 0.95)
        return tuple(f"{o}{suffix}" for o in self.spec.objectives)  # type: ignore[return-value]


def quantile_suffix(q: float) -> str:
    """Column suffix of a quantile: 0.95 -> ``_p95``, 0.995 -> ``_p99.5``."""
    return f"_p{q * 100:g}"


# ----------------------------------------------------------------------------- loading
def load_sweep(path: str | Path | dict[str, Any]) -> Sweep:
    """Load and validate a sweep file.

    Args:
        path: a YAML file or an already parsed mapping (its relative ``base`` is then resolved
            against the working directory).

    Raises:
        ScenarioError: listing every problem, each with its field path in the sweep file.
    """
    spec, source, here = load_spec_file(path, SweepSpec, "sweep", "name, base, space, ...")
    problems: list[Problem] = []
    base = read_base(spec.base, here, problems)
    if base is None:
        raise ScenarioError(problems, source=source)
    base_scen = _load_base(base, spec.set, problems)
    if base_scen is None:
        raise ScenarioError(problems, source=source)
    n_dev = base_scen.cluster.topology.num_devices
    dims = [_parse_dimension(name, value, n_dev, problems)
            for name, value in spec.space.items()]
    dims = [d for d in dims if d is not None]
    _check_dimensions(dims, problems)
    for d in dims:
        if d.kind == "keys":
            for i, opt in enumerate(d.options):
                _check_keys(opt.overrides, f"space.{d.name}[{i}]", problems)
    boundaries = tuple(spec.boundary_conditions) or (BoundarySpec(name="nominal"),)
    _check_boundaries(spec, boundaries, dims, problems)
    _check_metrics(spec, dims, problems)
    if problems:
        raise ScenarioError(problems, source=source)
    space = DesignSpace(tuple(dims), base_dp=base_scen.workload.parallelism.dp,
                        base_micro_batch=base_scen.workload.micro_batch)
    sweep = Sweep(spec, base, space, boundaries, source)
    sweep.method_for()  # a search too large for the tools is refused before any run
    return sweep


def _load_base(base: dict[str, Any], overrides: dict[str, Any], problems: list[Problem]):
    """The validated base scenario (with the sweep's ``set``), or None with problems added.

    The base must be a scenario that runs as it is (``twin run`` would accept it): the device
    count and the defaults of every point come from it.
    """
    from twin.scenario import load_scenario

    try:
        return load_scenario(base, overrides)
    except ScenarioError as exc:
        why = ("does not fit (infeasible)" if isinstance(exc, InfeasibleConfig)
               else "is invalid")
        for p in exc.problems:
            where = f"set.{p.path}" if p.path in overrides else f"base.{p.path}".rstrip(".")
            problems.append(Problem(where, f"{p.message} (the base scenario with the sweep's "
                                           f"`set` {why}; it must run as it is)",
                                    p.value, p.allowed))
        return None


def _parse_dimension(name: str, value: Any, n_dev: int,
                     problems: list[Problem]) -> Dimension | None:
    where = f"space.{name}"
    if name == "parallelism":
        return _parse_parallelism(value, n_dev, where, problems)
    if name == "microbatches":
        if (not isinstance(value, list) or not value
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                           for v in value)):
            problems.append(Problem(where, "microbatches per replica must be a list of "
                                    "positive integers", value, "e.g. [4, 8, 16]"))
            return None
        opts = tuple(Option(str(v), v) for v in value)
        return Dimension(name, "microbatches", opts)
    if not isinstance(value, list) or not value:
        problems.append(Problem(where, "a dimension is a non-empty list of values (for a "
                                "scenario key) or of {label, set} options", value,
                                "e.g. [1, 2, 4] or [{label: a, set: {workload.schedule: "
                                "gpipe}}]"))
        return None
    if all(isinstance(v, dict) and "set" in v for v in value):
        opts = []
        for i, v in enumerate(value):
            try:
                ko = KeyOption.model_validate(v)
            except ValidationError as exc:
                problems.extend(problems_from_validation(exc, prefix=f"{where}[{i}]"))
                continue
            label = ko.label or ",".join(f"{k.rsplit('.', 1)[-1]}={_fmt_value(x)}"
                                         for k, x in ko.set.items())
            opts.append(Option(label, label, dict(ko.set)))
        return Dimension(name, "keys", tuple(opts)) if len(opts) == len(value) else None
    if any(isinstance(v, dict) and "set" in v for v in value):
        problems.append(Problem(where, "mixes plain values and {label, set} options", value,
                                "either all plain values or all {label, set} mappings"))
        return None
    bad = dotted_key_problem(name, where)
    if bad:
        problems.append(bad)
        return None
    opts = tuple(Option(_fmt_value(v), v, {name: v}) for v in value)
    return Dimension(name, "keys", opts)


def _parse_parallelism(value: Any, n_dev: int, where: str,
                       problems: list[Problem]) -> Dimension | None:
    allowed = ("'all', {dp: [...], tp: [...], pp: [...]} (each optional) or a list of "
               f"[dp, tp, pp] with product {n_dev}")
    triples: list[tuple[int, int, int]] = []
    if value == "all" or isinstance(value, dict):
        limits = ParallelismSpace()
        if isinstance(value, dict):
            try:
                limits = ParallelismSpace.model_validate(value)
            except ValidationError as exc:
                problems.extend(problems_from_validation(
                    exc, prefix=where, model=ParallelismSpace, document=value))
                return None
        for t in factorizations(n_dev):
            ok = all(lim is None or v in lim
                     for v, lim in zip(t, (limits.dp, limits.tp, limits.pp), strict=True))
            if ok:
                triples.append(t)
        if not triples:
            problems.append(Problem(where, f"no (dp, tp, pp) with product {n_dev} is allowed",
                                    value, allowed))
            return None
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            t = _triple(v)
            if t is None:
                problems.append(Problem(f"{where}[{i}]", "not a parallel strategy", v, allowed))
            elif math.prod(t) != n_dev:
                problems.append(Problem(f"{where}[{i}]", f"dp*tp*pp = {math.prod(t)} but the "
                                        f"base cluster has {n_dev} devices", v, allowed))
            elif t in triples:
                problems.append(Problem(f"{where}[{i}]", "listed twice", v))
            else:
                triples.append(t)
        if len(triples) != len(value):
            return None
    else:
        problems.append(Problem(where, "not a parallelism space", value, allowed))
        return None
    opts = tuple(Option(parallel_label(*t), parallel_label(*t),
                        {"workload.parallelism.dp": t[0], "workload.parallelism.tp": t[1],
                         "workload.parallelism.pp": t[2]}) for t in triples)
    return Dimension("parallelism", "parallelism", opts)


def _triple(v: Any) -> tuple[int, int, int] | None:
    if isinstance(v, dict) and set(v) <= {"dp", "tp", "pp"}:
        v = [v.get("dp", 1), v.get("tp", 1), v.get("pp", 1)]
    if (isinstance(v, (list, tuple)) and len(v) == 3
            and all(isinstance(e, int) and not isinstance(e, bool) and e > 0 for e in v)):
        return (v[0], v[1], v[2])
    return None


def _overlaps(a: str, b: str) -> bool:
    """Two dotted keys touch the same value (equal, or one is inside the other)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _check_dimensions(dims: list[Dimension], problems: list[Problem]) -> None:
    for i, d in enumerate(dims):
        for e in dims[i + 1:]:
            clash = sorted({k for k in d.keys for m in e.keys if _overlaps(k, m)})
            if clash:
                problems.append(Problem(f"space.{e.name}", f"sets {', '.join(clash)}, which "
                                        f"dimension {d.name!r} also sets", None,
                                        "each scenario key in one dimension only"))
    names = {d.name for d in dims}
    for d in dims:
        if d.kind != "keys":
            continue
        labels = [o.label for o in d.options]
        if len(set(labels)) != len(labels):
            problems.append(Problem(f"space.{d.name}", "options must have distinct labels",
                                    labels))
        if "parallelism" in names and any(_overlaps(k, "cluster.topology") for k in d.keys):
            problems.append(Problem(f"space.{d.name}", "the parallelism dimension needs a fixed "
                                    "device count, but this dimension changes the topology",
                                    None, "list explicit parallelism options per topology in "
                                    "{label, set} options instead"))


def _check_keys(overrides: Mapping[str, Any], where: str, problems: list[Problem]) -> None:
    """Check each ``dotted.key: value`` against the scenario schema on its own.

    Unknown keys, wrong types and unknown catalog names are sweep-file errors. Problems that
    depend on the whole point (the parallel layout, batch arithmetic, HBM) are recorded per
    point when the sweep runs, not here.
    """
    for key, value in overrides.items():
        for p in check_override(key, value):
            problems.append(Problem(f"{where}.{p.path}", p.message, p.value, p.allowed))


def check_override(key: str, value: Any) -> list[Problem]:
    """Problems with one scenario override taken alone (empty when it may be valid).

    Walks the :class:`~twin.scenario.Scenario` schema along the dotted key (list indices
    allowed) and validates ``value`` with the field's type and constraints; catalog references
    (``cluster.device: h100-sxm``) are resolved first. A key whose type cannot be followed
    (inside a union of models) is accepted here and checked per point.
    """
    from typing import Annotated

    from pydantic import BaseModel, TypeAdapter

    from twin.catalogs import REFERENCES, resolve
    from twin.scenario import Scenario

    bad = dotted_key_problem(key, key)
    if bad:
        return [bad]
    parts = key.split(".")
    model: type[BaseModel] | None = Scenario
    ann: Any = None
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        if model is None:
            inner = _list_item(ann)
            if inner is not None and part.isdigit():
                ann = inner
                model = _model_of(ann)
                continue
            return []  # cannot follow the type (e.g. a union); checked per point
        fields = model.model_fields
        if part not in fields:
            return [Problem(here, "unknown key", None, ", ".join(fields))]
        fi = fields[part]
        ann = Annotated[fi.annotation, fi] if fi.metadata else fi.annotation
        model = _model_of(fi.annotation)
    if key in REFERENCES:
        try:
            value, _ = resolve(REFERENCES[key], value, key)
        except ScenarioError as exc:
            return list(exc.problems)
    try:
        TypeAdapter(ann).validate_python(value)
    except ValidationError as exc:
        return problems_from_validation(exc, prefix=key)
    except Exception:  # a type pydantic cannot adapt alone: leave it to the point
        return []
    return []


def _model_of(ann: Any) -> Any:
    """The pydantic model class an annotation holds (``X`` or ``X | None``), else None."""
    import types
    import typing

    from pydantic import BaseModel

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if typing.get_origin(ann) in (typing.Union, types.UnionType) and len(args) == 1:
        return _model_of(args[0])
    return None


def _list_item(ann: Any) -> Any:
    """The item type of ``list[X]`` / ``tuple[X, ...]`` (None otherwise)."""
    import typing

    if typing.get_origin(ann) is typing.Annotated:
        ann = typing.get_args(ann)[0]
    if typing.get_origin(ann) in (list, tuple):
        args = typing.get_args(ann)
        return args[0] if args else None
    return None


def _check_boundaries(spec: SweepSpec, boundaries: tuple[BoundarySpec, ...],
                      dims: list[Dimension], problems: list[Problem]) -> None:
    names = [b.name for b in boundaries]
    for i, b in enumerate(boundaries):
        where = f"boundary_conditions[{i}]"
        if names.count(b.name) > 1 and names.index(b.name) != i:
            problems.append(Problem(f"{where}.name", "boundary condition names must be unique",
                                    b.name))
        for k in b.set:
            for d in dims:
                if any(_overlaps(k, m) for m in d.keys):
                    problems.append(Problem(f"{where}.set.{k}", f"is also set by the design "
                                            f"dimension {d.name!r}", None,
                                            "keys that no dimension varies"))
        if b.set:
            _check_keys(b.set, f"{where}.set", problems)


def _check_metrics(spec: SweepSpec, dims: list[Dimension], problems: list[Problem]) -> None:
    known = metric_names()
    a, b = spec.objectives
    for i, o in enumerate(spec.objectives):
        if o not in known:
            problems.append(Problem(f"objectives[{i}]", "unknown metric", o, ", ".join(known)))
    if a == b:
        problems.append(Problem("objectives", "the two objectives must differ", [a, b]))
    for k, bound in spec.constraints.items():
        if k not in known:
            problems.append(Problem(f"constraints.{k}", "unknown metric", k, ", ".join(known)))
        if bound.min is None and bound.max is None:
            problems.append(Problem(f"constraints.{k}", "give min, max or both", None))
        elif bound.min is not None and bound.max is not None and bound.min > bound.max:
            problems.append(Problem(f"constraints.{k}", "min is above max: no point could "
                                    "meet it", {"min": bound.min, "max": bound.max},
                                    "min <= max"))
    varies_batch = any(d.kind == "microbatches" or "workload.global_batch" in d.keys
                       for d in dims)
    per_iteration = {"iteration_time_s", "energy_per_iteration_j", "energy_j", "makespan_s",
                     "energy_delay_product_js"}
    if varies_batch and per_iteration & set(spec.objectives):
        problems.append(Problem("objectives", "the global batch varies across the space, so "
                                "per-iteration objectives compare different amounts of work",
                                list(spec.objectives),
                                "time_per_sequence_s, energy_per_sequence_j"))
    if spec.robust and len(set(spec.robust.seeds)) != len(spec.robust.seeds):
        problems.append(Problem("robust.seeds", "seeds must be distinct", spec.robust.seeds))
    if spec.robust and any(s < 0 for s in spec.robust.seeds):
        problems.append(Problem("robust.seeds", "seeds must be >= 0", spec.robust.seeds))
    if spec.reference_point is not None and not all(math.isfinite(v) and v > 0
                                                    for v in spec.reference_point):
        problems.append(Problem("reference_point", "must be two finite positive numbers",
                                list(spec.reference_point)))
