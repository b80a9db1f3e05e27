"""Checking output paths before a run starts (front door).

Every command that writes a file checks its path first, so a wrong path is exit code 2 with a
message in seconds, not a traceback after the whole simulation:

* the name is sane: not empty, no NUL byte, no component longer than the file system allows
  (255 bytes), the whole path shorter than 4096 bytes; a plot's ends in ``.png``;
* what is there is a regular file or nothing (never a directory, device node, FIFO or socket:
  ``-o /dev/null`` would otherwise be replaced by a trace);
* an existing file is overwritten only when it is what the command itself writes (a meshtwin
  trace for ``.h5``, a PNG for a plot, a CSV / Parquet / JSON / text table of a multi-run
  command), or with ``--force``;
* its folder exists or can be made, and a file can be created in it (probed by creating and
  removing an empty file: this catches read-only folders and file systems such as ``/proc``,
  which ``os.access`` does not);
* a path that comes from a scenario file (``trace.path``) stays inside the working directory:
  a scenario cannot make the twin write elsewhere unless the user says so with ``-o``.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twin.kernel.errors import Problem, ScenarioError

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PARQUET_SIGNATURE = b"PAR1"


def _problem(key: str, path: object, message: str, allowed: str) -> ScenarioError:
    shown = str(path)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return ScenarioError([Problem(key, message, shown, allowed)])


def check_output(path: str | Path, key: str = "-o", kind: str = "trace",
                 force: bool = False) -> Path:
    """Check that ``path`` may be written (see the module docstring) and return it.

    Args:
        path: the output file.
        key: the option or scenario key that named it, for messages.
        kind: ``trace`` (HDF5), ``png``, ``table`` (CSV / Parquet / JSON / text).
        force: overwrite an existing regular file that is not of ``kind``.

    Raises:
        ScenarioError: the path cannot or may not be written.
    """
    text = os.fspath(path)
    if not text or "\x00" in text:
        raise _problem(key, text, "not a usable file name", "a file path")
    raw = os.fsencode(text)
    if len(raw) >= MAX_PATH_BYTES:
        raise _problem(key, text, f"path longer than {MAX_PATH_BYTES} bytes",
                       "a shorter path")
    p = Path(text)
    for part in p.parts:
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise _problem(key, text, f"a file or folder name longer than {MAX_NAME_BYTES} "
                           "bytes", "shorter names")
    if text.endswith(os.sep) or p.name in ("", ".", ".."):
        raise _problem(key, text, "names a folder, not a file", "a file path")
    if kind == "png" and p.suffix.lower() != ".png":  # the plotting library picks the format
        raise _problem(key, text, "a plot is written as a PNG image", "a path ending in .png")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _problem(key, text, f"cannot be used ({exc.strerror})", "a writable file path"
                       ) from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise _problem(key, text, "is a folder", "a file path (e.g. FOLDER/NAME.h5)")
        if not stat.S_ISREG(st.st_mode):
            raise _problem(key, text, "is not a regular file (a device, FIFO or socket); "
                           "refusing to replace it", "a regular file path")
        if not force and not _is_own_kind(p, kind):
            raise _problem(key, text, f"exists and is not {_KIND_WORDS[kind]}; refusing "
                           "to overwrite it", "another path, or --force to overwrite")
    _check_folder(p.parent, key, text)
    return p


_KIND_WORDS = {"trace": "a meshtwin trace", "png": "a PNG image",
               "table": "a table this command writes (CSV, Parquet, JSON or text)",
               "timeline": "a timeline this command writes (.pftrace, JSON or gzip JSON)",
               "html": "an HTML report"}


def _is_own_kind(p: Path, kind: str) -> bool:
    """Whether an existing file is of the kind the command writes (cheap, by content)."""
    try:
        with open(p, "rb") as fh:
            head = fh.read(16)  # enough for the longest mark below, "<!doctype"
    except OSError:
        return False
    if kind == "trace":
        from twin.kernel.trace import HDF5_SIGNATURE, TraceError, open_trace

        if not head.startswith(HDF5_SIGNATURE):
            return p.stat().st_size == 0
        try:
            open_trace(p)
        except TraceError as exc:
            return "not a meshtwin trace" not in str(exc)  # a damaged trace may be replaced
        return True
    if kind == "png":
        return head.startswith(PNG_SIGNATURE) or p.stat().st_size == 0
    if kind == "timeline":  # gzip, JSON, or a Perfetto protobuf by its name
        return (head.startswith((b"\x1f\x8b", b"{")) or p.suffix == ".pftrace"
                or p.stat().st_size == 0)
    if kind == "html":
        return head.lower().startswith((b"<!doctype", b"<html")) or p.stat().st_size == 0
    return head.startswith(PARQUET_SIGNATURE) or b"\x00" not in head


def _check_folder(folder: Path, key: str, text: str) -> None:
    """The folder exists (or its first existing ancestor is a folder) and takes a new file."""
    probe_dir = folder if str(folder) else Path(".")
    missing = []
    while not probe_dir.exists():
        missing.append(probe_dir)
        if probe_dir.parent == probe_dir:
            break
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise _problem(key, text, f"{probe_dir} is not a folder", "a path inside a folder")
    try:
        fd, name = tempfile.mkstemp(prefix=".meshtwin-probe-", dir=probe_dir)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise _problem(key, text, f"cannot create files in {probe_dir} ({exc.strerror})",
                       "a writable folder") from None


def check_trace_path(path: str | Path, force: bool = False) -> Path:
    """A scenario's ``trace.path``: inside the working directory (:func:`confine`) and
    writable (:func:`check_output`); what ``twin run`` and ``twin check`` refuse alike."""
    confine(path, "trace.path")
    return check_output(path, "trace.path", "trace", force)


def confine(path: str | Path, key: str, root: Path | None = None) -> Path:
    """``path`` (from a scenario or input file) if it stays inside ``root`` (default: the
    working directory) once resolved; a ScenarioError naming ``key`` otherwise."""
    base = (root or Path.cwd()).resolve()
    p = Path(path)
    try:
        full = (base / p).resolve() if not p.is_absolute() else p.resolve()
    except (OSError, RuntimeError, ValueError):
        raise _problem(key, path, "cannot be resolved", "a path inside the working "
                       "directory") from None
    if full != base and base not in full.parents:
        raise _problem(key, path, f"is outside the working directory {base}; a scenario "
                       "file may only write below it", "a relative path without '..', or "
                       "give the path on the command line with -o")
    return p


def atomic_write(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(temporary path)`` next to ``path`` (its folders made first), then rename it
    to ``path``: readers see the old file or the complete new one, never a partial one, even
    when the command is killed while writing. ``write`` must not infer the format from the
    temporary name's suffix (give it explicitly, e.g. ``savefig(tmp, format="png")``)."""
    from twin.kernel.trace import glob_escape, pid_alive

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    for stale in path.parent.glob(f".{glob_escape(path.name)}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[1]
        if pid.isdigit() and not pid_alive(int(pid)):
            stale.unlink(missing_ok=True)  # left by a killed invocation
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
