"""HDF5 traces: typed columns, buffered in memory and written in large blocks.

Layout of a trace file::

    /                     attrs: schema_version, twin_version, seed, scenario (YAML), summary
                                 (JSON), sources (JSON), complete=True
    /<table>/<column>     one 1-D dataset per column, chunked, compressed, resizable
    /<table>              attrs: units (JSON {column: unit}), categories of string columns

String columns are stored as int32 codes with their category list in the attribute
``categories/<column>`` (JSON); :func:`read_table` turns them back into ``pandas.Categorical``.

A trace is written to a temporary name next to the final path and renamed only when complete,
so a run that dies leaves no file that looks complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

SCHEMA_VERSION = 1
DEFAULT_BLOCK_ROWS = 1 << 16


class Table:
    """Rows of one table, buffered as tuples and flushed to HDF5 in blocks.

    Args:
        group: the HDF5 group of the table.
        columns: ``{name: dtype}``; dtype ``"category"`` for strings.
        units: ``{name: unit}`` recorded as an attribute (SI units).
        compression: ``gzip``, ``lzf`` or ``None``.
        block_rows: rows buffered before a write.
    """

    def __init__(self, group: h5py.Group, columns: dict[str, str], units: dict[str, str],
                 compression: str | None, block_rows: int = DEFAULT_BLOCK_ROWS):
        self.group = group
        self.names = list(columns)
        self.dtypes = {c: ("int32" if d == "category" else d) for c, d in columns.items()}
        self.categorical = [c for c, d in columns.items() if d == "category"]
        self.codes: dict[str, dict[Any, int]] = {c: {} for c in self.categorical}
        self.block_rows = block_rows
        self.rows: list[tuple] = []
        self.n = 0
        chunk = min(block_rows, 1 << 15)
        opts: dict[str, Any] = {}
        if compression:
            opts["compression"] = compression
            if compression == "gzip":
                opts["compression_opts"] = 1
            opts["shuffle"] = True
        for c in self.names:
            group.create_dataset(c, shape=(0,), maxshape=(None,), dtype=self.dtypes[c],
                                 chunks=(chunk,), **opts)
        group.attrs["units"] = json.dumps({c: units.get(c, "") for c in self.names})

    def append(self, *row: Any) -> None:
        """Add one row (values in column order)."""
        self.rows.append(row)
        if len(self.rows) >= self.block_rows:
            self.flush()

    def extend(self, columns: dict[str, Sequence | np.ndarray]) -> None:
        """Add many rows given as whole columns (all of equal length)."""
        self.flush()
        self._write({c: columns[c] for c in self.names})

    def flush(self) -> None:
        """Write buffered rows."""
        if not self.rows:
            return
        cols = list(zip(*self.rows, strict=True))
        self.rows = []
        self._write(dict(zip(self.names, cols, strict=True)))

    def _write(self, cols: dict[str, Iterable]) -> None:
        arrays = {}
        for c in self.names:
            values = cols[c]
            if c in self.codes:
                table = self.codes[c]
                local, uniques = pd.factorize(np.asarray(values, dtype=object))
                remap = np.array([table.setdefault(v, len(table)) for v in uniques],
                                 dtype=np.int32)
                arrays[c] = remap[local] if len(remap) else local.astype(np.int32)
            else:
                arrays[c] = np.asarray(values, dtype=self.dtypes[c])
        k = len(next(iter(arrays.values()))) if arrays else 0
        if k == 0:
            return
        for c, a in arrays.items():
            ds = self.group[c]
            ds.resize((self.n + k,))
            ds[self.n:] = a
        self.n += k

    def close(self) -> None:
        """Flush and record the category lists."""
        self.flush()
        for c, table in self.codes.items():
            cats = [None] * len(table)
            for v, i in table.items():
                cats[i] = v
            self.group.attrs[f"categories/{c}"] = json.dumps(cats)


class TraceWriter:
    """Writes one trace file atomically (temporary name, rename on :meth:`finish`).

    Use as a context manager: an exception inside the block removes the temporary file.
    """

    def __init__(self, path: str | Path, compression: str | None = "gzip",
                 block_rows: int = DEFAULT_BLOCK_ROWS):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.partial-{os.getpid()}")
        self.compression = None if compression in (None, "none") else compression
        self.block_rows = block_rows
        self.file = h5py.File(self.tmp, "w")
        self.file.attrs["complete"] = False
        self.tables: dict[str, Table] = {}

    def table(self, name: str, columns: dict[str, str],
              units: dict[str, str] | None = None) -> Table:
        """Create a table with the given columns."""
        t = Table(self.file.create_group(name), columns, units or {}, self.compression,
                  self.block_rows)
        self.tables[name] = t
        return t

    def finish(self, attrs: dict[str, Any]) -> Path:
        """Flush every table, store root attributes, close and move into place."""
        for t in self.tables.values():
            t.close()
        for k, v in attrs.items():
            self.file.attrs[k] = v if isinstance(v, (int, float, str, np.number)) else json.dumps(v)
        self.file.attrs["schema_version"] = SCHEMA_VERSION
        self.file.attrs["complete"] = True
        self.file.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Close and delete the temporary file."""
        try:
            self.file.close()
        finally:
            self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self.file.id.valid:
            self.abort()  # left without finish(): nothing complete to keep


def read_table(path: str | Path, name: str) -> pd.DataFrame:
    """One table of a trace as a DataFrame (string columns as ``Categorical``)."""
    with h5py.File(path, "r") as f:
        if name not in f:
            tables = [k for k in f if isinstance(f[k], h5py.Group)]
            raise KeyError(f"trace {path} has no table {name!r}; tables: {', '.join(tables)}")
        g = f[name]
        units = json.loads(g.attrs.get("units", "{}"))
        data = {}
        for c in units or list(g):
            arr = g[c][()]
            cats = g.attrs.get(f"categories/{c}")
            if cats is not None:
                arr = pd.Categorical.from_codes(arr, categories=json.loads(cats))
            data[c] = arr
        df = pd.DataFrame(data)
        df.attrs["units"] = units
        return df


def list_tables(path: str | Path) -> list[str]:
    """Names of the tables in a trace."""
    with h5py.File(path, "r") as f:
        return [k for k in f if isinstance(f[k], h5py.Group)]


def read_attrs(path: str | Path) -> dict[str, Any]:
    """Root attributes of a trace; JSON-encoded ones (summary, sources) decoded."""
    with h5py.File(path, "r") as f:
        out: dict[str, Any] = {}
        for k, v in f.attrs.items():
            if isinstance(v, bytes):
                v = v.decode()
            if k in ("summary", "sources", "metrics") and isinstance(v, str):
                v = json.loads(v)
            elif isinstance(v, np.generic):
                v = v.item()
            out[k] = v
        return out
