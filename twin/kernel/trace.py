"""HDF5 traces: typed columns, buffered in memory and written in large blocks.

Layout of a trace file::

    /                     attrs: schema_version, twin_version, seed, scenario (YAML), summary
                                 (JSON), sources (JSON), complete=True
    /<table>/<column>     one 1-D dataset per column, chunked, compressed, resizable
    /<table>              attrs: units (JSON {column: unit}), categories of string columns

String columns are stored as int32 codes with their category list in the attribute
``categories/<column>`` (JSON); :func:`read_table` turns them back into ``pandas.Categorical``.

A trace is written to ``NAME.h5.partial-PID`` next to the final path (a visible name, so a
killed run's leftover is easy to see) and renamed to ``NAME.h5`` only when complete, so a run
that dies leaves nothing at the final path. The next :class:`TraceWriter` of the same path
removes partial files whose process is gone and lists them in :attr:`TraceWriter.stale_removed`.

At :meth:`TraceWriter.finish` the root attribute ``checksum`` (SHA-256 over every column's
bytes and the ``scenario`` and ``summary`` attributes) is stored; :func:`open_trace` with
``verify=True`` recomputes it, so a trace whose data was damaged after it was written is
recognised even when its ``complete`` flag is set.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from twin.kernel.errors import TraceError

if TYPE_CHECKING:
    import pandas as pd

#: Above this many values a block's categories are factorized by pandas (hash table in C);
#: below, by a dict (no pandas import for small runs). Both give codes in order of first
#: appearance, so the file is the same either way.
_PANDAS_FACTORIZE_ROWS = 100_000


def _encode(values: Iterable, table: dict[Any, int]) -> np.ndarray:
    """int32 codes of ``values`` in the growing category ``table`` (new values get the next
    code, in order of first appearance); missing values (None, NaN) get -1."""
    arr = np.asarray(values, dtype=object)
    if len(arr) > _PANDAS_FACTORIZE_ROWS:
        import pandas as pd

        local, uniques = pd.factorize(arr)
        remap = np.array([table.setdefault(v, len(table)) for v in uniques], dtype=np.int32)
        return np.where(local >= 0, remap[local], -1).astype(np.int32) if len(remap) else \
            local.astype(np.int32)
    return np.array([-1 if v is None or v != v else table.setdefault(v, len(table))
                     for v in arr.tolist()], dtype=np.int32)

SCHEMA_VERSION = 1
DEFAULT_BLOCK_ROWS = 1 << 16
PARTIAL_INFIX = ".partial-"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


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
        self.digests = {c: hashlib.sha256() for c in self.names}
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
                arrays[c] = _encode(values, self.codes[c])
            else:
                arrays[c] = np.asarray(values, dtype=self.dtypes[c])
        k = len(next(iter(arrays.values()))) if arrays else 0
        if k == 0:
            return
        for c, a in arrays.items():
            ds = self.group[c]
            ds.resize((self.n + k,))
            ds[self.n:] = a
            self.digests[c].update(np.ascontiguousarray(a, dtype=ds.dtype).tobytes())
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
        self.stale_removed = remove_stale_partials(self.path)
        self.tmp = partial_path(self.path)
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
            self.file.attrs[k] = v if isinstance(v, (int, float, str, np.number)) else json.dumps(
                v, allow_nan=False)
        self.file.attrs["schema_version"] = SCHEMA_VERSION
        self.file.attrs["checksum"] = _digest(
            {f"{name}/{c}": d.hexdigest() for name, t in self.tables.items()
             for c, d in t.digests.items()}, self.file.attrs)
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
        if self.file.id.valid:  # left by an exception or without finish(): nothing to keep
            self.abort()


def partial_path(path: Path) -> Path:
    """The temporary name of a trace being written by this process."""
    return path.with_name(f"{path.name}{PARTIAL_INFIX}{os.getpid()}")


def remove_stale_partials(path: Path) -> list[Path]:
    """Remove partial files of ``path`` left by processes that no longer run (killed runs);
    returns the files removed."""
    removed = []
    for p in path.parent.glob(f"{glob_escape(path.name)}{PARTIAL_INFIX}*"):
        pid = p.name.rsplit(PARTIAL_INFIX, 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            continue
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped (for :meth:`pathlib.Path.glob`)."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (True when that cannot be told)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _digest(columns: dict[str, str], attrs: Any) -> str:
    """The trace checksum from per-column SHA-256 digests and the scenario / summary text."""
    h = hashlib.sha256()
    for key in sorted(columns):
        h.update(f"{key}={columns[key]};".encode())
    for key in ("scenario", "summary"):
        v = attrs.get(key, "")
        h.update(f"{key}=".encode() + (v if isinstance(v, bytes) else str(v).encode()))
    return "sha256:" + h.hexdigest()


def open_trace(path: str | Path, need: Sequence[str] = (), verify: bool = False) -> dict[str, Any]:
    """Check that ``path`` is a complete, readable meshtwin trace and return its root
    attributes (as :func:`read_attrs`).

    Every command that reads traces (``twin summary``, ``twin limits``, ``twin export``,
    ``twin report``, ``--resume``) calls this first, so a truncated, corrupted, incomplete
    or foreign file gives one clear :class:`TraceError` (the CLI turns it into exit code 2)
    instead of an h5py or JSON traceback. Checks, in order: a regular file with the HDF5
    signature; h5py can open it and read its root attributes; ``schema_version`` present
    (else "not a meshtwin trace") and not newer than this reader; ``complete`` set (else
    "trace incomplete: the run was interrupted"); ``summary`` / ``sources`` valid JSON and
    ``scenario`` a YAML mapping; every
    table in ``need`` present with every column it declares (every member if its units
    attribute names none, as :func:`read_table` reads it), all of one length and readable
    ("dataset ops/t_start is corrupted"); with ``verify``, the stored ``checksum`` matches the
    data (reads every column: use it where a wrong trace would be reused, e.g. resume).

    Args:
        path: the file.
        need: tables that must be present and readable.
        verify: also recompute the checksum over all the data.

    Raises:
        TraceError: what is wrong, starting with the path.
    """
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise TraceError(f"{p}: cannot be read ({exc.strerror})") from None
    if head != HDF5_SIGNATURE:
        raise TraceError(f"{p}: not a meshtwin trace (not an HDF5 file)")
    _in_child(p, need, verify)  # a corrupted file can make HDF5 itself loop: bounded
    try:
        with h5py.File(p, "r") as f:
            return _decoded_attrs(f, p)
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise TraceError(f"{p}: trace is corrupted or truncated ({_short(exc)})") from None


#: Time allowed for checking a trace, s (plus 1 s per 20 MB of file).
CHECK_TIMEOUT_S = 5.0


def _in_child(p: Path, need: Sequence[str], verify: bool) -> None:
    """Run :func:`_validate` in a forked child with a time limit: the HDF5 library can loop
    forever on some corrupted files, which no Python-level timeout can interrupt. Raises the
    child's TraceError, or one saying the check did not finish. Without ``os.fork``, runs
    :func:`_validate` in this process."""
    if not hasattr(os, "fork"):
        _validate(p, need, verify)
        return
    limit = CHECK_TIMEOUT_S + p.stat().st_size / 20e6
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        os.close(r)
        code, msg = 0, b""
        try:
            _validate(p, need, verify)
        except TraceError as exc:
            code, msg = 1, str(exc).encode()
        except BaseException as exc:  # anything else: report, never a traceback
            code, msg = 1, f"{p}: trace is corrupted ({_short(exc)})".encode()
        os.write(w, msg[:4000])
        os._exit(code)
    os.close(w)
    status = wait_child(pid, limit)
    if status is None:
        os.close(r)
        raise TraceError(f"{p}: trace is corrupted: reading it did not finish within "
                         f"{limit:.0f} s")
    with os.fdopen(r, "rb") as fh:
        msg = fh.read().decode("utf-8", errors="replace")
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        raise TraceError(msg or f"{p}: trace is corrupted (its check crashed)")


def wait_child(pid: int, timeout_s: float) -> int | None:
    """Wait for child ``pid`` at most ``timeout_s`` seconds; its wait status, or None after
    killing it (SIGKILL) at the limit."""
    import signal
    import time

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _validate(p: Path, need: Sequence[str], verify: bool) -> dict[str, Any]:
    """The checks of :func:`open_trace` (in this process)."""
    try:
        with h5py.File(p, "r") as f:
            attrs = _decoded_attrs(f, p)
            if "schema_version" not in attrs and "twin_version" not in attrs:
                raise TraceError(f"{p}: not a meshtwin trace (an HDF5 file without the "
                                 "trace attributes)")
            if not attrs.get("complete"):
                raise TraceError(f"{p}: trace incomplete: the run was interrupted")
            version = attrs.get("schema_version")
            if not isinstance(version, int) or version > SCHEMA_VERSION:
                raise TraceError(f"{p}: trace schema {version!r} is not one this version of "
                                 f"meshtwin reads (<= {SCHEMA_VERSION})")
            if not isinstance(attrs.get("summary"), dict):
                raise TraceError(f"{p}: trace attribute summary is missing or corrupted")
            if "scenario" in attrs and not _is_mapping_yaml(attrs["scenario"]):
                raise TraceError(f"{p}: trace attribute scenario is corrupted (not a YAML "
                                 "mapping)")
            digests = {}
            names = [k for k in f if isinstance(f[k], h5py.Group)]
            for name in need:
                if name not in f:
                    raise TraceError(f"{p}: trace has no table {name!r} (tables: "
                                     f"{', '.join(names) or 'none'})")
            for name in (names if verify else need):
                digests.update(_check_table(f, name, p, verify))
            if verify:
                stored = attrs.get("checksum")
                if stored is None:
                    raise TraceError(f"{p}: trace has no checksum (written by an older "
                                     "version)")
                if _digest(digests, f.attrs) != stored:
                    raise TraceError(f"{p}: trace data is corrupted (checksum mismatch)")
    except TraceError:
        raise
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise TraceError(f"{p}: trace is corrupted or truncated ({_short(exc)})") from None
    return attrs


def _is_mapping_yaml(text: Any) -> bool:
    """Whether ``text`` is YAML text of a mapping (the resolved scenario a trace keeps), read
    with the front door's bounded loader (a trace is an input too)."""
    from twin.kernel.errors import ScenarioError
    from twin.kernel.reading import load_yaml_text

    if not isinstance(text, str):
        return False
    try:
        return isinstance(load_yaml_text(text), dict)
    except ScenarioError:
        return False


def _short(exc: BaseException) -> str:
    text = str(exc).split("\n")[0]
    return text[:160]


def _decoded_attrs(f: h5py.File, p: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in list(f.attrs):
        try:
            v = f.attrs[k]
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise TraceError(f"{p}: trace attribute {k} is corrupted ({_short(exc)})") from None
        if isinstance(v, bytes):
            v = v.decode("utf-8", errors="replace")
        if k in ("summary", "sources", "metrics") and isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                raise TraceError(f"{p}: trace attribute {k} is corrupted (not JSON)") from None
        elif isinstance(v, np.generic):
            v = v.item()
        out[k] = v
    return out


def _check_table(f: h5py.File, name: str, p: Path, read_all: bool) -> dict[str, str]:
    g = f[name]
    try:
        units = json.loads(g.attrs.get("units", "{}"))
    except ValueError:
        raise TraceError(f"{p}: table {name} is corrupted (its units attribute is not "
                         "JSON)") from None
    if not isinstance(units, dict):
        raise TraceError(f"{p}: table {name} is corrupted (bad units attribute)")
    lengths = set()
    digests = {}
    for c in _columns(g, units):
        if c not in g or not isinstance(g[c], h5py.Dataset):
            raise TraceError(f"{p}: dataset {name}/{c} is missing")
        ds = g[c]
        if ds.ndim != 1:
            raise TraceError(f"{p}: dataset {name}/{c} is corrupted (not one column)")
        lengths.add(ds.shape[0])
        if (why := _implausible(ds)) is not None:
            raise TraceError(f"{p}: dataset {name}/{c} is corrupted ({why})")
        try:
            arr = ds[()]
        except (OSError, RuntimeError, ValueError) as exc:
            raise TraceError(f"{p}: dataset {name}/{c} is corrupted ({_short(exc)})") from None
        if read_all:
            digests[f"{name}/{c}"] = hashlib.sha256(np.ascontiguousarray(arr).tobytes()
                                                    ).hexdigest()
        cats = g.attrs.get(f"categories/{c}")
        if cats is not None:
            try:
                cat_list = json.loads(cats)
            except ValueError:
                raise TraceError(f"{p}: dataset {name}/{c} is corrupted (bad categories)"
                                 ) from None
            if len(arr) and (not isinstance(cat_list, list) or arr.min() < -1
                             or arr.max() >= len(cat_list)):
                raise TraceError(f"{p}: dataset {name}/{c} is corrupted (codes outside its "
                                 "categories)")
    if len(lengths) > 1:
        raise TraceError(f"{p}: table {name} is corrupted (columns of different lengths)")
    return digests


#: Most a column's rows can outweigh its stored bytes: DEFLATE (gzip) compresses at most
#: ~1032:1 (a 258-byte match per 2-bit code), LZF less; shuffle does not change the bound.
MAX_COMPRESSION = 1100


def _implausible(ds: h5py.Dataset) -> str | None:
    """Why a column's claimed length cannot be what the writer stored (a damaged header
    claiming billions of rows would otherwise be allocated in memory), or None."""
    logical = ds.shape[0] * ds.dtype.itemsize if ds.ndim == 1 else 0
    try:
        stored = ds.id.get_storage_size()
    except (OSError, RuntimeError, ValueError) as exc:
        return f"its storage cannot be read: {_short(exc)}"
    if logical > MAX_COMPRESSION * stored + (1 << 20):
        return (f"it claims {ds.shape[0]} rows ({logical} bytes) in {stored} stored bytes, "
                f"more than any compression gives")
    return None


def _columns(g: h5py.Group, units: dict[str, str]) -> list[str]:
    """The columns :func:`read_table` reads, so :func:`open_trace` checks exactly those: the
    ones the ``units`` attribute names, or every member when it names none (a trace whose
    attribute was lost or emptied)."""
    return list(units) or list(g)


def read_table(path: str | Path, name: str) -> pd.DataFrame:
    """One table of a trace as a DataFrame (string columns as ``Categorical``)."""
    import pandas as pd  # lazy: writing a trace does not need pandas

    with h5py.File(path, "r") as f:
        if name not in f:
            tables = [k for k in f if isinstance(f[k], h5py.Group)]
            raise KeyError(f"trace {path} has no table {name!r}; tables: {', '.join(tables)}")
        g = f[name]
        units = json.loads(g.attrs.get("units", "{}"))
        data = {}
        for c in _columns(g, units):
            if (why := _implausible(g[c])) is not None:
                raise ValueError(f"dataset {name}/{c} is corrupted ({why})")
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
