"""The FR-FCFS engine's two builds (ahead of time, just in time) and the choice between them.

That both builds make the reference's decisions is checked in ``tests/test_hbm.py`` (every
engine-against-reference case runs each available build); here: which build runs when.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from devices.hbm import StreamSpec, aot, generate_requests, load_hbm_spec, simulate
from twin.kernel.errors import ScenarioError

BUILT = aot._load_aot() is not None
needs_aot = pytest.mark.skipif(not BUILT, reason="the ahead-of-time engine is not built "
                               "(`python -m devices.hbm.aot`; needs a C compiler)")


@pytest.fixture
def fresh_loader():
    aot._load_aot.cache_clear()
    yield
    aot._load_aot.cache_clear()


@needs_aot
def test_a_fresh_process_simulates_without_importing_numba():
    code = ("import sys, numpy as np\n"
            "from devices.hbm import StreamSpec, generate_requests, load_hbm_spec, simulate\n"
            "spec = load_hbm_spec('hbm3')\n"
            "streams = [StreamSpec(n_requests=500)]\n"
            "req = generate_requests(spec, np.random.default_rng(1), streams)\n"
            "simulate(spec, req)\n"
            "print('numba' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, aot.ENV: "auto"})
    assert out.stdout.strip() == "False"


@needs_aot
def test_auto_picks_the_extension_and_both_builds_agree_on_a_threaded_split():
    assert aot.kernels("auto").build == "aot"
    spec = load_hbm_spec("hbm2e")
    req = generate_requests(spec, np.random.default_rng(5),
                            [StreamSpec(n_requests=5000, read_fraction=0.6, row_locality=0.7)])
    one = simulate(spec, req, build="aot")
    two = simulate(spec, req, build="jit", workers=3)
    np.testing.assert_array_equal(one.completion_s, two.completion_s)
    np.testing.assert_array_equal(one.kind, two.kind)


def test_a_stale_extension_is_not_used(monkeypatch, fresh_loader):
    """An edited ``kernels.py`` (its stamp no longer matches) runs the JIT build of the edit."""
    monkeypatch.setattr(aot, "source_stamp", lambda: -1)  # no build carries a negative stamp
    assert aot.kernels("auto").build == "jit"
    assert aot.kernels("jit").build == "jit"
    with pytest.raises(RuntimeError, match="not built or is stale"):
        aot.kernels("aot")


def test_the_environment_variable_chooses_the_build(monkeypatch):
    monkeypatch.setenv(aot.ENV, "jit")
    assert aot.kernels().build == "jit"
    monkeypatch.setenv(aot.ENV, "fast")
    with pytest.raises(ScenarioError, match=aot.ENV):
        aot.kernels()


def test_the_stamp_follows_the_source_bytes(tmp_path, monkeypatch):
    src = tmp_path / "kernels.py"
    src.write_bytes(aot._SOURCE.read_bytes())
    monkeypatch.setattr(aot, "_SOURCE", src)
    before = aot.source_stamp()
    assert 0 <= before < 2**63
    src.write_bytes(src.read_bytes() + b"\n")
    assert aot.source_stamp() != before


def test_the_stamp_fits_the_extensions_int64_and_follows_numpy(tmp_path, monkeypatch):
    src = tmp_path / "kernels.py"
    monkeypatch.setattr(aot, "_SOURCE", src)
    stamps = set()
    for i in range(20):  # a stamp out of int64 range fails 20 draws with probability 4**-20
        src.write_bytes(f"x = {i}\n".encode())
        stamps.add(aot.source_stamp())
    assert len(stamps) == 20
    assert all(0 <= s < 2**63 for s in stamps)
    before = aot.source_stamp()
    monkeypatch.setattr(aot.np, "__version__", "0.0.0")  # a module built against another NumPy
    assert aot.source_stamp() != before


@pytest.mark.parametrize(("current", "force", "builds"), [(True, False, 0), (True, True, 1),
                                                        (False, False, 1)])
def test_the_command_builds_only_when_stale_or_forced(monkeypatch, capsys, tmp_path, current,
                                                      force, builds):
    made = []
    monkeypatch.setattr(aot, "_load_aot", lambda: object() if current else None)
    monkeypatch.setattr(aot, "build", lambda: made.append(1) or tmp_path / "m.so")
    assert aot.main(["--force"] if force else []) == 0
    assert len(made) == builds
    out = capsys.readouterr().out
    assert ("built" in out) == bool(builds) and ("up to date" in out) == (not builds)


def test_a_failed_build_warns_and_leaves_the_jit_build(monkeypatch, capsys):
    def fail():
        raise OSError("no C compiler")

    monkeypatch.setattr(aot, "_load_aot", lambda: None)
    monkeypatch.setattr(aot, "build", fail)
    assert aot.main([]) == 0  # the install goes on: the JIT build works without a compiler
    err = capsys.readouterr().err
    assert "no C compiler" in err and "JIT" in err


@pytest.mark.slow
def test_build_compiles_a_current_module_into_a_directory(tmp_path):
    """The build itself (about 10 s of compilation): the module lands in the directory asked
    for, carries the current stamp and makes the JIT build's decisions."""
    import importlib.util

    path = aot.build(tmp_path)
    assert path.parent == tmp_path and path.name.startswith(aot.MODULE)
    assert not list(tmp_path.glob("tmp*"))  # the build directory is gone
    spec = importlib.util.spec_from_file_location(aot.MODULE, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.stamp() == aot.source_stamp()
    hbm = load_hbm_spec("hbm3")
    req = generate_requests(hbm, np.random.default_rng(2), [StreamSpec(n_requests=3000)])
    jit = aot.kernels("jit")
    args = (req.channel, np.arange(len(req), dtype=np.int64), hbm.channels, req.arrival_s,
            req.bank, req.row, req.is_write)
    for a, b in zip(mod.group_by_channel(*args), jit.group_by_channel(*args), strict=True):
        np.testing.assert_array_equal(a, b)
