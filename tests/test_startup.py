"""Commands import only what they use (structural, not timed: `make bench` times them).

Each case runs a command in a fresh interpreter and inspects ``sys.modules`` afterwards.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from twin.kernel.trace import _PANDAS_FACTORIZE_ROWS, _encode

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("dask", "distributed", "pymoo", "scipy", "matplotlib", "pandas")

PROBE = """
import json, sys
from twin.cli import main
try:
    code = main({argv!r})
except SystemExit as exc:
    code = exc.code
print(json.dumps({{"code": code, "modules": sorted({{m.split(".")[0] for m in sys.modules}})}}))
"""


def _modules_after(argv: list[str], cwd: Path) -> tuple[int, set[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], cwd=cwd,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res["code"], set(res["modules"])


def test_help_imports_no_numerics():
    code, mods = _modules_after(["--help"], ROOT)
    assert code == 0
    assert not mods & {*HEAVY, "numpy", "pydantic", "h5py", "networkx", "simpy", "yaml"}


def test_check_imports_no_simulator_or_many_runs_libraries():
    code, mods = _modules_after(["check", str(ROOT / "scenarios/quickstart.yaml")], ROOT)
    assert code == 0
    unused = {*HEAVY, "h5py", "networkx", "numpy"}  # reading a scenario builds no array
    assert not mods & unused, mods & unused


def test_check_of_a_memory_model_still_checks_its_distribution(tmp_path):
    """The service distribution's parameters are checked by building it (NumPy is imported
    then): a lognormal cov beyond its bound is refused by ``twin check``."""
    text = (ROOT / "scenarios/quickstart.yaml").read_text()
    bad = tmp_path / "s.yaml"
    bad.write_text(text + "memory: {model: queue, service: {dist: lognormal, cov: 5000}}\n")
    out = subprocess.run([sys.executable, "-m", "twin.cli", "check", str(bad)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 2, out.stderr
    assert "memory.service" in out.stdout + out.stderr


def test_check_of_an_hbm_controller_scenario_imports_no_engine_or_tables():
    """The HBM part is looked up in the catalog without the FR-FCFS engine (Numba) or the
    results' tables (pandas)."""
    code, mods = _modules_after(["check", str(ROOT / "scenarios/hbm_frfcfs.yaml")], ROOT)
    assert code == 0
    unused = {*HEAVY, "numba", "h5py", "networkx"}
    assert not mods & unused, mods & unused


@pytest.mark.parametrize("package", ["twin.kernel.queueing", "devices.hbm"])
def test_lazy_package_resolves_every_public_name_on_first_use(package):
    """The queue engine's and the HBM controller's packages import their submodules lazily
    (``twin.kernel.lazy``, PEP 562): importing the package imports no submodule, and each name
    of ``__all__`` resolves to the object defined in the submodule it is mapped to."""
    code = (
        "import importlib, sys, json\n"
        f"p = importlib.import_module({package!r})\n"
        f"before = sorted(m for m in sys.modules if m.startswith({package!r} + '.'))\n"
        "homes = {n: getattr(p, n).__module__ for n in p.__all__ if n.upper() != n}\n"
        "print(json.dumps({'before': before, 'homes': homes, 'mapped': p._HOME,\n"
        "                  'all': sorted(p.__all__), 'dir': set(p.__all__) <= set(dir(p))}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True)
    res = json.loads(out.stdout)
    assert res["before"] == [] and res["dir"] is True
    assert sorted(res["mapped"]) == res["all"]  # every mapped name is public, and back
    for name, module in res["homes"].items():  # classes and functions know their module
        assert module == f"{package}.{res['mapped'][name]}", name
    pkg = importlib.import_module(package)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        pkg.nonsense  # noqa: B018


def test_run_with_trace_imports_what_the_scenario_uses(tmp_path):
    argv = ["run", str(ROOT / "scenarios/quickstart.yaml"), "-o", str(tmp_path / "q.h5"),
            "--json"]
    code, mods = _modules_after(argv, tmp_path)
    assert code == 0
    assert {"h5py", "networkx", "simpy"} <= mods  # the trace, the topology, the engine
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_lazy_commands_match_their_classes():
    from twin.cli import COMMANDS, LazyCommand

    for cmd in COMMANDS:
        if isinstance(cmd, LazyCommand):
            real = cmd.load()
            assert (cmd.name, cmd.help) == (real.name, real.help)


@pytest.mark.parametrize("n", [50, _PANDAS_FACTORIZE_ROWS + 7])
def test_category_codes_in_order_of_first_appearance(n):
    """Both paths of the trace's category encoder against pandas' factorize, continuing a
    table that already holds codes (as a second block of a table does)."""
    rng = np.random.default_rng(5)
    values = rng.choice(np.array(["tp", "dp", "recv", "compute", None], dtype=object), n)
    table = {"dp": 0, "other": 1}
    codes = _encode(list(values), table)
    local, uniques = pd.factorize(values)
    expected_table = {"dp": 0, "other": 1}
    for u in uniques:
        expected_table.setdefault(u, len(expected_table))
    remap = np.array([expected_table[u] for u in uniques])
    np.testing.assert_array_equal(codes, np.where(local >= 0, remap[local], -1))
    assert table == expected_table
    assert codes.dtype == np.int32
