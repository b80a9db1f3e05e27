"""Packages that import their submodules on first use of a name (PEP 562).

A package whose submodules import heavy libraries (NumPy, pandas, Numba) but whose cheap
parts are needed by the scenario schema (bounds, catalogs) re-exports its public names
lazily, so that ``twin check`` reads a file without importing them::

    __getattr__, __dir__ = lazy_exports(__name__, {"simulate": "engine", ...}, globals())

``from package import name`` and ``package.name`` work as with eager imports; the
submodule is imported the first time one of its names is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str], namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's ``__name__``.
        homes: each public name -> the submodule (relative name) that defines it.
        namespace: the package's ``globals()``; a name, once imported, is stored there.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
