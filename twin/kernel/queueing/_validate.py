"""Checking user input (problems naming the field) and building objects by name from
specs: the helpers every module of the queueing package shares.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from twin.kernel.errors import Problem, ScenarioError

#: What a user may give (the ``allowed`` of the problems), shared by several modules.
_TIMES_ALLOWED = "finite times in seconds, sorted nondecreasing"
_RATE_ALLOWED = "a finite arrival rate > 0 (1/s)"




def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _real(
    problems: list[Problem],
    path: str,
    value: Any,
    *,
    allowed: str,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    allow_inf: bool = False,
) -> float:
    """Check one scalar; append a Problem (and return nan) when it is not acceptable."""
    if not _is_real(value):
        problems.append(Problem(path, "must be a real number", value, allowed))
        return math.nan
    x = float(value)
    if math.isnan(x) or (math.isinf(x) and not (allow_inf and x > 0)):
        problems.append(Problem(path, "must be finite", value, allowed))
        return math.nan
    if gt is not None and not x > gt:
        problems.append(Problem(path, f"must be > {gt:g}", value, allowed))
        return math.nan
    if ge is not None and not x >= ge:
        problems.append(Problem(path, f"must be >= {ge:g}", value, allowed))
        return math.nan
    if le is not None and not x <= le:
        problems.append(Problem(path, f"must be <= {le:g}", value, allowed))
        return math.nan
    return x


def _integer(problems: list[Problem], path: str, value: Any, *, minimum: int, allowed: str) -> int:
    ok = (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer()
    )
    if not ok:
        problems.append(Problem(path, "must be an integer", value, allowed))
        return minimum
    k = int(value)
    if k < minimum:
        problems.append(Problem(path, f"must be >= {minimum}", value, allowed))
        return minimum
    return k


def _raise_if(problems: list[Problem]) -> None:
    if problems:
        raise ScenarioError(problems)


def _array(value: ArrayLike, path: str, *, allowed: str) -> np.ndarray:
    """A 1-D float64 array (no copy when already one) or a ScenarioError naming ``path``."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ScenarioError(
            Problem(path, "must be a 1-D array of numbers", _short(value), allowed)
        ) from None
    if arr.ndim != 1:
        raise ScenarioError(
            Problem(path, f"must be 1-D, got an array of shape {arr.shape}", None, allowed)
        )
    return arr


def _short(value: Any) -> Any:
    return value if isinstance(value, (str, numbers.Number)) else type(value).__name__


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            "rng must be a numpy.random.Generator, e.g. numpy.random.default_rng(seed) or "
            f"twin.kernel.rng.RngStreams(seed).get(name); got {type(rng).__name__}. The global "
            "NumPy RNG is never used."
        )
    return rng


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


@dataclass(frozen=True)
class _Kind:
    cls: Any
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    signature: str = ""


def _build(
    kinds: Mapping[str, _Kind],
    what: str,
    names: str,
    name: Any,
    params: Mapping[str, Any],
    path: str | None,
) -> Any:
    name_path = f"{path}.name" if path else "name"
    if not isinstance(name, str) or name.strip().lower() not in kinds:
        raise ScenarioError(Problem(name_path, f"unknown {what}", name, f"one of: {names}"))
    key = name.strip().lower()
    kind = kinds[key]
    prefix = path if path else key
    problems = [
        Problem(f"{prefix}.{p}", f"is not a parameter of {key}", params[p], f"{kind.signature}")
        for p in params
        if p not in kind.required and p not in kind.optional
    ]
    problems += [
        Problem(f"{prefix}.{p}", "is missing", None, kind.signature)
        for p in kind.required
        if p not in params
    ]
    _raise_if(problems)
    try:
        return kind.cls(**params)
    except ScenarioError as err:
        if not path:
            raise
        renamed = [
            Problem(
                prefix + q.path[len(key) :] if q.path.startswith(key) else q.path,
                q.message,
                q.value,
                q.allowed,
            )
            for q in err.problems
        ]
        raise ScenarioError(renamed) from None


def _build_from_spec(kinds, what: str, names: str, spec: Any, path: str):
    """Shared body of the ``*_from_spec`` factories: ``spec`` must be a mapping with a
    ``name`` key; the other keys are the parameters."""
    if not isinstance(spec, Mapping):
        raise ScenarioError(Problem(path, "must be a mapping with a 'name' key", _short(spec),
                                    f"one of: {names}"))
    if "name" not in spec:
        raise ScenarioError(Problem(f"{path}.name", "is missing", None, f"one of: {names}"))
    params = {k: v for k, v in spec.items() if k != "name"}
    return _build(kinds, what, names, spec["name"], params, path)
