"""The FR-FCFS engine compiled ahead of time, and the choice between it and the JIT build.

:mod:`devices.hbm.kernels` is one source compiled two ways:

- just in time by Numba (``@numba.njit(cache=True)``): always available, but a fresh process pays
  ~0.8 s for it before the first request is scheduled (``import numba`` and the load of Numba's
  typing and lowering registries, which the on-disk cache does not skip), several times the
  whole roofline run of a 64-device iteration;
- ahead of time by Numba's ``pycc`` into the extension module ``devices/hbm/_kernels_aot``
  (``python -m devices.hbm.aot``, run by ``make``'s install step), which loads in about a
  millisecond without importing Numba.

The extension carries a stamp: a hash of ``kernels.py``'s bytes and of the NumPy version it was
built against. :func:`kernels` uses it only when the stamp matches the source on disk, so an edited
``kernels.py`` (a developer's change, a mutation test) silently runs the JIT build of the new
source until the module is rebuilt. ``MESHTWIN_HBM_ENGINE`` (``auto``, the default; ``jit``;
``aot``) forces one build, for the bench's side-by-side cost and the tests that compare them.
Both builds make the same decisions on the same inputs (``tests/test_hbm.py`` runs every
engine-against-reference case on each).

``numba.pycc`` is pending deprecation (since Numba 0.57, still shipped in 0.68) with a
replacement announced but not released; if a Numba release drops it, the build warns and every
run uses the JIT build, which stays correct and only pays Numba's start again.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from twin.kernel.errors import Problem, ScenarioError

MODULE = "_kernels_aot"
"""Name of the extension module (in this package's directory)."""
ENV = "MESHTWIN_HBM_ENGINE"
"""Environment variable choosing the build: ``auto`` (default), ``jit`` or ``aot``."""
_SOURCE = Path(__file__).with_name("kernels.py")

#: Numba type signatures of the exported functions (arrays C-contiguous, as
#: :func:`devices.hbm.engine.simulate` passes them)
SIGNATURES = {
    "group_by_channel":
        "Tuple((i8[::1], i8[::1], f8[::1], i4[::1], i8[::1], b1[::1]))"
        "(i4[::1], i8[::1], i8, f8[::1], i4[::1], i8[::1], b1[::1])",
    "fr_fcfs_engine":
        "i8(f8[::1], i4[::1], i8[::1], b1[::1], i8[::1], i8[::1], i8, i8, i8, f8[::1], b1,"
        " f8[::1], i1[::1], i8, i8)",
}


class Kernels(NamedTuple):
    """The engine's two compiled entry points and which build they come from."""

    group_by_channel: Callable
    fr_fcfs_engine: Callable
    build: str
    """``"aot"`` or ``"jit"``."""


def source_stamp() -> int:
    """63-bit hash of ``kernels.py`` and the NumPy version: the stamp of an up-to-date build."""
    digest = hashlib.sha256(_SOURCE.read_bytes() + np.__version__.encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@functools.cache
def _load_aot() -> object | None:
    """The extension module if it is importable and built from the current source, else None."""
    try:
        mod = importlib.import_module(f"devices.hbm.{MODULE}")
    except ImportError:
        return None
    return mod if mod.stamp() == source_stamp() else None


def kernels(build: str | None = None) -> Kernels:
    """The engine's compiled functions.

    Args:
        build: ``"aot"``, ``"jit"`` or ``"auto"`` (the extension module when it is up to date,
            else JIT); None reads ``MESHTWIN_HBM_ENGINE`` (default ``auto``).

    Raises:
        ScenarioError: for an unknown build name.
        RuntimeError: if ``"aot"`` is asked for and no up-to-date extension module exists.
    """
    build = build or os.environ.get(ENV, "auto")
    if build not in ("auto", "aot", "jit"):
        raise ScenarioError(Problem(ENV, "unknown FR-FCFS engine build", build, "auto, aot, jit"))
    if build != "jit":
        mod = _load_aot()
        if mod is not None:
            return Kernels(mod.group_by_channel, mod.fr_fcfs_engine, "aot")
        if build == "aot":
            raise RuntimeError("the ahead-of-time FR-FCFS engine is not built or is stale; "
                               "run `python -m devices.hbm.aot`")
    from devices.hbm import kernels as jit  # imports Numba

    return Kernels(jit.group_by_channel, jit.fr_fcfs_engine, "jit")


def build(directory: Path | None = None) -> Path:
    """Compile :mod:`devices.hbm.kernels` into the extension module; return its path.

    The module is compiled in a temporary directory and moved into ``directory`` (default:
    this package's) in one rename, so an interrupted build never leaves a partial module.
    """
    with warnings.catch_warnings():  # pending deprecation since Numba 0.57; see the module doc
        warnings.filterwarnings("ignore", message=".*pycc.*")
        from numba.pycc import CC

    from devices.hbm import kernels as jit

    directory = directory or _SOURCE.parent
    stamp = source_stamp()
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        cc = CC(MODULE)
        cc.output_dir = tmp
        cc.verbose = False
        for name, signature in SIGNATURES.items():
            cc.export(name, signature)(getattr(jit, name).py_func)
        cc.export("stamp", "i8()")(lambda: stamp)
        cc.compile()
        (built,) = Path(tmp).glob(f"{MODULE}*")
        target = directory / built.name
        os.replace(built, target)  # same file system: atomic
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m devices.hbm.aot``: build the extension module unless it is up to date."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = p.parse_args(argv)
    if not args.force and _load_aot() is not None:
        print("FR-FCFS engine (ahead of time): up to date")
        return 0
    try:
        path = build()
    except Exception as exc:
        print(f"warning: the ahead-of-time FR-FCFS engine was not built ({exc}); the JIT build "
              "is used (a fresh process pays ~0.8 s before its first HBM simulation)",
              file=sys.stderr)
        return 0
    print(f"FR-FCFS engine (ahead of time): built {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
