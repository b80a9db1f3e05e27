"""Shared building blocks for the typed, validated input models (pydantic v2).

Every input model derives from :class:`StrictModel`: unknown keys are errors, values are
immutable after validation, and the field path of any error is reported to the user.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from twin.kernel.errors import Problem, ScenarioError

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1)]


class StrictModel(BaseModel):
    """Base of every input model: forbids unknown keys, frozen, validates defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def _allowed_from_ctx(err: dict[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        return str(ctx["expected"])
    for key, word in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if key in ctx:
            return f"a number {word} {ctx[key]}"
    return ""


def problems_from_validation(exc: ValidationError, prefix: str = "",
                             known_fields: dict[str, list[str]] | None = None) -> list[Problem]:
    """Turn a pydantic ``ValidationError`` into user-facing :class:`Problem` s.

    Args:
        exc: the pydantic error.
        prefix: dotted path to prepend (e.g. ``cluster.device``).
        known_fields: optional map from a dotted parent path to its allowed keys, used to
            tell the user which keys exist when they gave an unknown one.
    """
    problems: list[Problem] = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        path = ".".join([prefix, *loc] if prefix else loc)
        etype = err["type"]
        value = err.get("input")
        if etype == "extra_forbidden":
            parent = path.rsplit(".", 1)[0] if "." in path else ""
            allowed = ", ".join((known_fields or {}).get(parent, []))
            problems.append(Problem(path, "unknown key", None, allowed))
        elif etype == "missing":
            problems.append(Problem(path, "required key is missing"))
        else:
            msg = err["msg"]
            problems.append(Problem(path, msg, value, _allowed_from_ctx(err)))
    return problems


def field_names(model: type[BaseModel]) -> list[str]:
    """The keys a model accepts (for 'allowed' hints)."""
    return list(model.model_fields)


def read_yaml(path: str | Path, what: str = "scenario") -> Any:
    """Parse a YAML input file; a missing file or malformed YAML (with line and column) is a
    :class:`~twin.kernel.errors.ScenarioError`."""
    p = Path(path)
    if not p.is_file():
        raise ScenarioError([Problem("", f"{what} file not found", str(p),
                                     "a path to a YAML file")], source=str(p))
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([Problem("", f"malformed YAML{where}: {reason}")],
                            source=str(p)) from None


def require_mapping(raw: Any, what: str, allowed: str, source: str) -> dict[str, Any]:
    """``raw`` if it is a mapping; otherwise a :class:`~twin.kernel.errors.ScenarioError` saying
    that a ``what`` must be one (``allowed``: its top-level keys, for the message)."""
    if not isinstance(raw, dict):
        raise ScenarioError([Problem("", f"a {what} must be a YAML mapping",
                                     type(raw).__name__, allowed)], source=source)
    return raw
