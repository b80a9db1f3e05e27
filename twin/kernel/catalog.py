"""Catalogs of named entries (devices, links, HBM parts, models) read from YAML files.

Every number in a catalog carries its source. A sourced value is written as a mapping with the
keys ``value`` and ``source`` (and optionally ``note``)::

    peak_tflops:
      value: {bf16: 989, fp8: 1979}
      source: NVIDIA H100 datasheet (dense)

Loading unwraps these into plain values and records the source by field path. A number that is
not inside such a wrapper is a :class:`~twin.kernel.errors.CatalogError`. One entry per file;
the file stem is the entry's name. The kernel knows nothing of what the entries mean: the
packages that own a catalog (``devices``, ``workloads``) validate the values into their typed
specs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from twin.kernel.errors import CatalogError, Problem, ScenarioError

_WRAPPER_KEYS = {"value", "source"}


def _is_wrapper(node: Any) -> bool:
    return (
        isinstance(node, Mapping)
        and _WRAPPER_KEYS <= set(node)
        and set(node) <= _WRAPPER_KEYS | {"note"}
    )


def _has_number(node: Any) -> bool:
    if isinstance(node, bool):
        return False
    if isinstance(node, (int, float)):
        return True
    if isinstance(node, Mapping):
        return any(_has_number(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_number(v) for v in node)
    return False


def unwrap_sources(node: Any, path: str = "") -> tuple[Any, dict[str, str], list[Problem]]:
    """Strip ``{value, source}`` wrappers.

    Returns:
        (plain value, {field path: source}, problems) where problems lists numbers found
        outside any sourced wrapper and empty sources.
    """
    if _is_wrapper(node):
        src = str(node["source"]).strip()
        problems = [] if src else [Problem(path, "empty source")]
        return node["value"], {path: src}, problems
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        sources: dict[str, str] = {}
        problems: list[Problem] = []
        for k, v in node.items():
            sub = f"{path}.{k}" if path else str(k)
            val, s, p = unwrap_sources(v, sub)
            out[k] = val
            sources.update(s)
            problems.extend(p)
        return out, sources, problems
    if _has_number(node):
        return node, {}, [
            Problem(path, "number without a source", node,
                    "write it as {value: ..., source: '<where the number comes from>'}")
        ]
    return node, {}, []


@dataclass(frozen=True)
class CatalogEntry:
    """One catalog entry: plain values plus the source of each sourced field."""

    name: str
    values: dict[str, Any]
    sources: dict[str, str]
    path: Path | None = None


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_entry(path: Path) -> CatalogEntry:
    """Read one catalog file; raise :class:`CatalogError` naming every unsourced number."""
    where = f"catalog file {path}"
    try:
        # the package's own files: libyaml's loader when present (same resolver, ~10x faster)
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise CatalogError([Problem(where, f"malformed YAML: {exc}")]) from None
    if not isinstance(raw, Mapping):
        raise CatalogError([Problem(where, "a catalog file must hold a mapping")])
    values, sources, problems = unwrap_sources(raw)
    if problems:
        raise CatalogError([Problem(f"{where}: {p.path}", p.message, p.value, p.allowed)
                            for p in problems])
    values.setdefault("name", path.stem)
    return CatalogEntry(name=path.stem, values=values, sources=sources, path=path)


@dataclass
class Catalog:
    """All entries of one kind (e.g. ``devices``) from a directory of YAML files.

    Files are listed at construction and read on first use (an entry is named by its file):
    a scenario that names two entries does not parse the whole catalog.
    """

    kind: str
    directory: Path
    _files: dict[str, Path] = field(default_factory=dict, repr=False)
    _entries: dict[str, CatalogEntry] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for p in sorted(Path(self.directory).glob("*.yaml")):
            self._files[p.stem] = p

    def _entry(self, name: str) -> CatalogEntry:
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = load_entry(self._files[name])
        return entry

    def names(self) -> list[str]:
        """Entry names, sorted."""
        return sorted(self._files)

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def __iter__(self) -> Iterator[CatalogEntry]:
        return iter([self._entry(n) for n in self.names()])

    def get(self, name: str, path: str = "") -> CatalogEntry:
        """The entry ``name``; a :class:`ScenarioError` listing the known names otherwise."""
        if name not in self._files:
            raise ScenarioError(
                [Problem(path or self.kind, f"unknown {self.kind} name", name,
                         ", ".join(self.names()))]
            )
        return self._entry(name)
