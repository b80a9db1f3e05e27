"""One place where the analysis commands (``twin export``, ``twin report``) open a trace.

Everything they read goes through :class:`TraceData`: a trace file that is missing, not HDF5,
or not a complete meshtwin trace gives a :class:`~twin.kernel.errors.TraceError` naming the
file and what is wrong (exit code 2 at the command line), never a traceback: it opens every
trace through the trace reader's shared check :func:`twin.kernel.trace.open_trace`.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from twin.kernel.errors import ScenarioError, TraceError
from twin.kernel.trace import open_trace
from twin.trace import list_tables, read_table


class TraceData:
    """A finished trace, its tables read on first use (then kept).

    Args:
        path: the ``.h5`` trace.
        need: tables that must be present (a ScenarioError lists the missing ones).
    """

    def __init__(self, path: str | Path, need: tuple[str, ...] = ("ops",)):
        self.path = Path(path)
        if not self.path.is_file():
            raise TraceError(f"{self.path}: trace file not found")
        self.attrs = open_trace(self.path)
        self.tables = set(list_tables(self.path))
        if "summary" not in self.attrs or "scenario" not in self.attrs:
            raise ScenarioError(f"{self.path} has no summary or scenario (not a complete "
                                "meshtwin trace?)")
        missing = [t for t in need if t not in self.tables]
        if missing:
            raise ScenarioError(f"{self.path} lacks table(s) {', '.join(missing)} (the scenario's "
                                f"trace.tables left them out); present: "
                                f"{', '.join(sorted(self.tables)) or 'none'}")
        open_trace(self.path, need=need)  # the needed tables are readable and whole
        self._cache: dict[str, pd.DataFrame] = {}

    @property
    def summary(self) -> dict[str, Any]:
        """The run's summary."""
        return self.attrs["summary"]

    @cached_property
    def scenario(self) -> dict[str, Any]:
        """The resolved scenario as a mapping (a YAML mapping, checked by ``open_trace``;
        read with the front door's bounded loader)."""
        from twin.kernel.reading import load_yaml_text

        return load_yaml_text(self.attrs["scenario"], source=str(self.path))

    def has(self, name: str) -> bool:
        """Whether the trace holds table ``name``."""
        return name in self.tables

    def table(self, name: str) -> pd.DataFrame:
        """Table ``name`` (an empty frame when absent), string columns as plain ``str``."""
        if name not in self._cache:
            if name not in self.tables:
                self._cache[name] = pd.DataFrame()
            else:
                try:
                    df = read_table(self.path, name)
                except (OSError, KeyError, ValueError) as exc:
                    raise ScenarioError(f"{self.path}: table {name} is unreadable "
                                        f"({exc})") from None
                for c in df.columns:
                    if isinstance(df[c].dtype, pd.CategoricalDtype):
                        df[c] = df[c].astype(str)
                self._cache[name] = df
        return self._cache[name]
