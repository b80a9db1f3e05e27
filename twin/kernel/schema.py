"""Shared building blocks for the typed, validated input models (pydantic v2).

Every input model derives from :class:`StrictModel`: unknown keys are errors, values are
immutable after validation, and the field path of any error is reported to the user.
"""

from __future__ import annotations

import types
import typing
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from twin.kernel.errors import Problem, ScenarioError

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(gt=0, le=1)]
#: Lowest temperature there is, C.
ABSOLUTE_ZERO_C = -273.15
#: Hottest die temperature a scenario may give, C (silicon junctions are rated to ~150-175 C;
#: the margin lets a cooling failure overshoot without reaching nonsense).
MAX_DIE_C = 250.0
#: Hottest inlet air a scenario may give, C (industrial electronics are rated to 85 C).
MAX_AMBIENT_C = 100.0
#: A die temperature, C: at or above absolute zero, at most :data:`MAX_DIE_C`.
DieCelsius = Annotated[float, Field(ge=ABSOLUTE_ZERO_C, le=MAX_DIE_C, allow_inf_nan=False)]
#: An inlet-air temperature, C: at or above absolute zero, at most :data:`MAX_AMBIENT_C`.
AmbientCelsius = Annotated[float, Field(ge=ABSOLUTE_ZERO_C, le=MAX_AMBIENT_C,
                                        allow_inf_nan=False)]


INT64_MAX = 2**63 - 1


def int64_problems(raw: Any, prefix: str = "") -> list[Problem]:
    """A problem for every integer outside 64 bits in a parsed input (no field means one,
    and NumPy cannot hold one), by dotted path."""
    out: list[Problem] = []
    stack: list[tuple[str, Any]] = [(prefix, raw)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, int) and not isinstance(v, bool):
            if not -INT64_MAX - 1 <= v <= INT64_MAX:
                digits = len(str(abs(v)))
                shown = v if digits <= 25 else f"an integer of {digits} digits"
                out.append(Problem(path, "integer does not fit in 64 bits", shown,
                                   "-2^63 .. 2^63-1"))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{path}.{i}" if path else str(i), x) for i, x in enumerate(v))
        elif isinstance(v, dict):
            stack.extend((f"{path}.{k}" if path else str(k), x) for k, x in v.items())
    return sorted(out, key=lambda p: p.path)


def merge_problems(first: list[Problem], more: list[Problem]) -> list[Problem]:
    """``first`` plus the problems of ``more`` at paths that ``first`` does not cover (a
    path under or equal to one of ``first``'s)."""
    def covered(path: str) -> bool:
        return any(path == p.path or path.startswith(p.path + ".") for p in first if p.path)

    return [*first, *(p for p in more if not covered(p.path))]


_SCALAR_KINDS = {bool: "bool", int: "number", float: "number", str: "str"}


@cache
def _scalar_kinds(annotation: Any) -> tuple[frozenset[str], frozenset[str]]:
    """What a field's type accepts as a plain scalar and as the items of a list: two sets of
    ``"bool"``, ``"number"``, ``"str"`` and ``"other"`` (models, mappings, paths, ``Any``),
    from its annotation (unions, ``Optional``, ``Literal`` and ``Annotated`` unwrapped;
    ``None`` and the list itself add nothing)."""
    top: set[str] = set()
    items: set[str] = set()
    todo = [annotation]
    while todo:
        a = todo.pop()
        origin = typing.get_origin(a)
        if origin is Annotated:
            todo.append(typing.get_args(a)[0])
        elif origin is typing.Union or origin is types.UnionType:
            todo.extend(typing.get_args(a))
        elif origin is Literal:
            top.update(_kind(v) for v in typing.get_args(a))
        elif origin in (list, tuple, set, frozenset):
            for arg in typing.get_args(a):
                if arg is not Ellipsis:
                    items |= _scalar_kinds(arg)[0]
        elif a in _SCALAR_KINDS:
            top.add(_SCALAR_KINDS[a])
        elif a is not type(None):
            top.add("other")
    return frozenset(top), frozenset(items)


def _kind(value: Any) -> str:
    """The scalar kind of a value (see :func:`_scalar_kinds`)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "str" if isinstance(value, str) else "other"


def _converted(value: Any, kinds: frozenset[str]) -> bool:
    """Whether pydantic's lax mode would convert the scalar ``value`` between a boolean and
    a number to fit a field accepting ``kinds``: true/false to 1/0, or a number or a text
    such as ``"no"`` to a boolean. (A text of digits still reads as a number: PyYAML reads
    ``1e6`` without a dot as a text.)"""
    kind = _kind(value)
    if kind == "other" or "other" in kinds or kind in kinds:
        return False
    return (kind == "bool" and "number" in kinds) or (
        "bool" in kinds and not kinds & {"number", "str"})


class WrongKind:
    """Stands for a value of the wrong kind (see :meth:`StrictModel._no_lax_scalars`): no
    field accepts it, so pydantic reports a wrong type at the field, given the value."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:  # as the YAML gave it
        return str(self.value).lower() if isinstance(self.value, bool) else repr(self.value)


class StrictModel(BaseModel):
    """Base of every input model: forbids unknown keys, frozen, validates defaults, and
    refuses NaN and infinity in every float field (``allow_inf_nan=False``).

    Booleans and numbers are not converted into each other: pydantic's lax mode would read
    ``true`` as 1 in a number field (``iterations: true`` would run one iteration) and a
    number or the text ``"no"`` as a boolean; here each is a wrong type at its field (items
    of a list of numbers too).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_lax_scalars(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = None
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if key not in data:
                continue
            value = data[key]
            top, items = _scalar_kinds(field.annotation)
            if _converted(value, top):
                value = WrongKind(value)
            elif isinstance(value, (list, tuple)) and items and any(
                    _converted(v, items) for v in value):
                value = [WrongKind(v) if _converted(v, items) else v for v in value]
            else:
                continue
            if out is None:
                out = dict(data)
            out[key] = value
        return data if out is None else out



#: What each pydantic error type asks for, in the scenario's words (no Python type names).
_WANTS: dict[str, str] = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "a whole number",
    "int_parsing_size": "an integer of at most 19 digits",
    "float_type": "a number", "float_parsing": "a number",
    "finite_number": "a finite number (not NaN or infinity)",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a text", "string_unicode": "a text",
    "list_type": "a list", "tuple_type": "a list", "set_type": "a list",
    "dict_type": "a mapping (key: value)", "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)", "none_required": "null",
    "string_pattern_mismatch": "letters, digits, '_', '.' and '-' only",
}
#: Problem words for each group of error types.
_RANGE_TYPES = ("greater_than", "greater_than_equal", "less_than", "less_than_equal",
                "finite_number", "too_short", "too_long", "string_too_short", "string_too_long")


def _wants(err: dict[str, Any]) -> str:
    """What the field accepts, in words, from one pydantic error."""
    etype = err["type"]
    ctx = err.get("ctx") or {}
    for key, word in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if key in ctx:
            return f"a number {word} {ctx[key]}"
    if etype == "literal_error":
        return "one of " + str(ctx.get("expected", "")).replace("'", "")
    if etype in ("union_tag_invalid", "union_tag_not_found"):
        tags = str(ctx.get("expected_tags", "")).replace("'", "")
        return f"{ctx.get('discriminator', 'kind')}: one of {tags}".replace("'", "")
    if etype in ("too_short", "too_long", "string_too_short", "string_too_long"):
        lo, hi = ctx.get("min_length"), ctx.get("max_length")
        unit = "characters" if etype.startswith("string") else "items"
        if etype.endswith("short"):
            return f"at least {lo} {unit[:-1] if lo == 1 else unit}"
        return f"at most {hi} {unit[:-1] if hi == 1 else unit}"
    if etype in _WANTS:
        return _WANTS[etype]
    return ""


def _is_tag(segment: Any) -> bool:
    """Whether a location segment is pydantic's name of a union member, not a key."""
    if not isinstance(segment, str):
        return False
    if any(c in segment for c in "[]()") or segment in ("int", "float", "str", "bool", "none"):
        return True
    if segment.startswith("constrained-"):  # a bounded member, e.g. Annotated[int, Field(ge=1)]
        return True
    return segment in _model_names()


def _model_names() -> set[str]:
    names: set[str] = set()
    todo: list[type] = [BaseModel]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__name__ not in names:
                names.add(sub.__name__)
                todo.append(sub)
    return names


def _message(etype: str, msg: str) -> str:
    if etype in ("value_error", "assertion_error"):
        for head in ("Value error, ", "Assertion failed, "):
            if msg.startswith(head):
                return msg[len(head):]
        return msg
    if etype == "finite_number":
        return "not a finite number"
    if etype in ("too_long", "string_too_long"):
        return "too long"
    if etype in ("too_short", "string_too_short"):
        return "too short"
    if etype in _RANGE_TYPES:
        return "out of range"
    if etype in ("literal_error", "union_tag_invalid", "enum"):
        return "not an allowed value"
    if etype == "union_tag_not_found":
        return "says nothing about its kind"
    if etype == "string_pattern_mismatch":
        return "contains characters that are not allowed"
    return "wrong type"


def problems_from_validation(exc: ValidationError, prefix: str = "",
                             model: type[BaseModel] | None = None,
                             document: Any = None) -> list[Problem]:
    """Turn a pydantic ``ValidationError`` into user-facing :class:`Problem` s.

    Messages are in the scenario's words: the dotted field path, the value given and what
    is allowed (``a number > 0``, ``one of ring, torus2d``), never a Python type name; the
    alternatives of a union (``list of numbers | 'auto'``) are merged into one problem.

    Args:
        exc: the pydantic error.
        prefix: dotted path to prepend (e.g. ``cluster.device``).
        model, document: the model validated and the document given to it: an unknown key
            is answered with the keys of the model found at its parent (:func:`model_at`).
    """
    entries: dict[str, list[Any]] = {}  # path -> [message, value, wants]; first error first
    for err in exc.errors():
        etype = err["type"]
        raw_loc = list(err["loc"])
        is_key = bool(raw_loc) and raw_loc[-1] == "[key]"
        tag_at = next((i for i, p in enumerate(raw_loc) if _is_tag(p)), None)
        if etype == "extra_forbidden" and tag_at == len(raw_loc) - 1:
            tag_at = None  # the user's unknown key only looks like a tag
        last = len(raw_loc) - 1
        loc = [str(p) for i, p in enumerate(raw_loc)  # union tags dropped, user keys kept
               if p != "[key]" and (not _is_tag(p) or (tag_at is None and i == last))]
        path = ".".join([prefix, *loc] if prefix else loc)
        value = err.get("input")
        wants = _wants(err)
        if etype == "union_tag_not_found" and model is not None:  # pydantic names no tags
            disc = str((err.get("ctx") or {}).get("discriminator", "kind")).strip("'")
            tags = tags_at(model, [p for p in raw_loc if p != "[key]" and not _is_tag(p)],
                           disc, document)
            wants = f"{disc}: one of {', '.join(tags)}" if tags else f"a {disc}"
        own_path = path
        if tag_at is not None and etype not in ("extra_forbidden", "missing"):
            # an alternative of a union: reported once, at the union's own path
            base = [str(p) for p in raw_loc[:tag_at] if p != "[key]"]
            union_path = ".".join([prefix, *base] if prefix else base)
            if path != union_path and wants:
                wants = f"{wants} at {path[len(union_path) + 1:]}"
            path = union_path
        if etype == "extra_forbidden":
            at = None if model is None else model_at(
                model, [p for p in raw_loc[:-1] if not _is_tag(p)], document)
            entries[path] = ["unknown key", None,
                             [", ".join(field_names(at)) if at is not None else ""]]
        elif etype == "missing" and raw_loc and isinstance(raw_loc[-1], int):
            # a fixed-length list (a tuple) given too few items: pydantic reports each absent
            # position, up to the last; one problem at the list's own path
            parent = path.rsplit(".", 1)[0] if "." in path else path
            entries[parent] = ["too few items", value, [f"{raw_loc[-1] + 1} items"]]
        elif etype == "missing":
            entries.setdefault(path, ["required key is missing", None, []])
        elif path in entries:  # another alternative of a union
            if entries[path][1] is None and own_path == path:
                entries[path][1] = value
            if wants and wants not in entries[path][2]:
                entries[path][2].append(wants)
                entries[path][0] = "wrong value"
        else:
            msg = f"key {value!r} not allowed" if is_key else _message(etype, err["msg"])
            if own_path != path:
                value = None  # an item's value; the union's own comes with its next error
            entries[path] = [msg, value, [wants] if wants else []]
    out = []
    for path, (msg, value, wants) in entries.items():
        allowed = " or ".join(w for w in wants if w)
        if msg in ("wrong type", "wrong value") and allowed:
            msg = f"{msg}: must be {allowed}"
        out.append(Problem(path, msg, value, allowed))
    return out


def field_names(model: type[BaseModel]) -> list[str]:
    """The keys a model accepts (for 'allowed' hints)."""
    return list(model.model_fields)


def _members(annotation: Any) -> list[Any]:
    """The alternatives of a field's type: ``Annotated`` and unions (``Optional``) unwrapped."""
    out, todo = [], [annotation]
    while todo:
        a = todo.pop(0)
        origin = typing.get_origin(a)
        if origin is Annotated:
            todo.insert(0, typing.get_args(a)[0])
        elif origin is typing.Union or origin is types.UnionType:
            todo[:0] = typing.get_args(a)
        else:
            out.append(a)
    return out


def _is_model(a: Any) -> bool:
    return isinstance(a, type) and issubclass(a, BaseModel)


def _chosen(members: list[Any], node: Any) -> list[Any]:
    """The model members of a union that the document's mapping ``node`` selects: those
    whose literal-only fields (a discriminator such as ``kind`` or ``dist``) all match its
    values."""
    models = [m for m in members if _is_model(m)]
    if len(models) < 2 or not isinstance(node, dict):
        return models

    def matches(m: type[BaseModel]) -> bool:
        for name, f in m.model_fields.items():
            alts = _members(f.annotation)
            if name in node and all(typing.get_origin(a) is Literal for a in alts) and not any(
                    node[name] in typing.get_args(a) for a in alts):
                return False
        return True
    return [m for m in models if matches(m)] or models


def model_at(model: type[BaseModel], loc: list[Any] | tuple[Any, ...],
             document: Any = None) -> type[BaseModel] | None:
    """The model that validates the mapping at ``loc`` (keys and list indices, as in a
    pydantic error location without union tags) of a document of ``model``: the field types
    walked through models, lists, tuples, mappings and unions. A union of models is resolved
    by the ``document``'s mapping there (its discriminator, e.g. a fault's ``kind``) when
    given. None where no single model does (a scalar, an unresolved union)."""
    found = annotation_at(model, loc, document)
    if found is None:
        return None
    ann, node = found
    chosen = _chosen(_members(ann), node)
    return chosen[0] if len(chosen) == 1 else None


def annotation_at(model: type[BaseModel], loc: list[Any] | tuple[Any, ...],
                  document: Any = None) -> tuple[Any, Any] | None:
    """The type annotation that validates the value at ``loc`` and the ``document``'s value
    there (None where the document has none), walked as :func:`model_at` describes; None
    where the walk leaves the schema."""
    ann: Any = model
    node = document
    for seg in loc:
        nxt = None
        members = _members(ann)
        chosen = _chosen(members, node)
        for m in members:
            origin = typing.get_origin(m)
            if isinstance(seg, int) and origin in (list, tuple):
                args = [a for a in typing.get_args(m) if a is not Ellipsis]
                nxt = args[min(seg, len(args) - 1)] if origin is tuple and args else (
                    args[0] if args else None)
            elif isinstance(seg, str) and origin is dict:
                nxt = typing.get_args(m)[1]
            elif isinstance(seg, str) and m in chosen and seg in m.model_fields:
                nxt = m.model_fields[seg].annotation
            if nxt is not None:
                break
        if nxt is None:
            return None
        ann = nxt
        inside = (isinstance(node, dict) and seg in node) or (
            isinstance(node, list) and isinstance(seg, int) and seg < len(node))
        node = node[seg] if inside else None
    return ann, node


def tags_at(model: type[BaseModel], loc: list[Any] | tuple[Any, ...], discriminator: str,
            document: Any = None) -> list[str]:
    """The values the ``discriminator`` field may take in the tagged union at ``loc`` (a
    fault's kinds, a distribution's names), for an error that names no tag; empty where
    ``loc`` holds no such union."""
    found = annotation_at(model, loc, document)
    tags: list[str] = []
    for m in _members(found[0]) if found else []:
        field = m.model_fields.get(discriminator) if _is_model(m) else None
        for a in _members(field.annotation) if field else []:
            if typing.get_origin(a) is Literal:
                tags.extend(str(v) for v in typing.get_args(a))
    return tags


def dotted_key_problem(key: str, path: str) -> Problem | None:
    """The problem, reported at ``path``, with a scenario key that has an empty part
    (``a..b``, ``workload.``, ``''``): from ``--set``, a campaign's grid or overrides, a
    sweep's ``set``, space or boundary conditions. None for a well-formed key."""
    if all(key.split(".")):
        return None
    return Problem(path or "<empty key>", "not a dotted scenario key: a part is empty", key,
                   "e.g. workload.micro_batch")


def read_yaml(path: str | Path, what: str = "scenario") -> Any:
    """Parse a YAML input file with the bounds of :mod:`twin.kernel.reading` (size, UTF-8,
    nesting, alias expansion, unique keys); any problem, with line and column, is a
    :class:`~twin.kernel.errors.ScenarioError`."""
    from twin.kernel.reading import read_yaml_file

    return read_yaml_file(path, what)


def kind_of(value: Any) -> str:
    """What a YAML value is, in words (for messages; never a Python type name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a text"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "a value of another kind"


def require_mapping(raw: Any, what: str, allowed: str, source: str) -> dict[str, Any]:
    """``raw`` if it is a mapping; otherwise a :class:`~twin.kernel.errors.ScenarioError` saying
    that a ``what`` must be one (``allowed``: its top-level keys, for the message)."""
    if not isinstance(raw, dict):
        raise ScenarioError([Problem("", f"a {what} must be a YAML mapping, not "
                                     f"{kind_of(raw)}", None, allowed)], source=source)
    return raw
