"""The product's catalogs (devices, links, HBM parts, models) and resolving names in scenarios.

Front-door module: it knows where each package keeps its catalog. Lower layers receive typed
specs and never look names up themselves.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import devices
import scenarios
import workloads
from twin.kernel.catalog import Catalog

_DIRS: dict[str, Path] = {
    "devices": Path(devices.__file__).parent / "catalog" / "devices",
    "links": Path(devices.__file__).parent / "catalog" / "links",
    "hbm": Path(devices.__file__).parent / "catalog" / "hbm",
    "models": Path(workloads.__file__).parent / "catalog" / "models",
    "failures": Path(scenarios.__file__).parent / "catalog" / "failures",
    "hosts": Path(devices.__file__).parent / "catalog" / "hosts",
}

#: Scenario fields that may hold a catalog name instead of an inline spec.
REFERENCES: dict[str, str] = {
    "cluster.device": "devices",
    "cluster.link": "links",
    "cluster.nic_link": "links",
    "cluster.global_link": "links",
    "workload.model": "models",
    "data.host": "hosts",
}


@cache
def catalog(kind: str) -> Catalog:
    """The catalog of ``kind`` (``devices``, ``links``, ``hbm``, ``models``), loaded once."""
    return Catalog(kind, _DIRS[kind])


def catalog_kinds() -> list[str]:
    """Names of the catalogs."""
    return list(_DIRS)


def resolve(kind: str, value: Any, path: str) -> tuple[Any, dict[str, str]]:
    """Turn a catalog reference into an inline mapping.

    ``value`` may be a catalog name (``"h100-sxm"``), a mapping with ``base: <name>`` plus keys
    that override the entry, or an inline mapping (returned unchanged). Returns the mapping and
    the sources of the catalog values it contains (by dotted scenario path).
    Raises :class:`~twin.kernel.errors.ScenarioError` for an unknown name.
    """
    if isinstance(value, str):
        entry = catalog(kind).get(value, path)
        return dict(entry.values), {f"{path}.{k}": s for k, s in entry.sources.items()}
    if isinstance(value, dict) and "base" in value:
        base = value["base"]
        if not isinstance(base, str):
            from twin.kernel.errors import Problem, ScenarioError

            raise ScenarioError([Problem(f"{path}.base", "must be a catalog name", base,
                                         ", ".join(catalog(kind).names()))])
        entry = catalog(kind).get(base, f"{path}.base")
        merged = {**entry.values, **{k: v for k, v in value.items() if k != "base"}}
        sources = {f"{path}.{k}": s for k, s in entry.sources.items()
                   if k.split(".")[0] not in value}
        return merged, sources
    return value, {}
