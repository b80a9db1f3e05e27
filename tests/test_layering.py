"""The layering of the house, enforced on the source (``ast``, nothing is imported).

Every ``import`` counts wherever it stands: at the top of a module, inside a function (lazy) or
under ``if TYPE_CHECKING:``. A lazy import only postpones the arrow; it does not make an upward
arrow acceptable, and a type used in a signature is a dependency like any other.

The rules are the two tables below: which layer a module is in, and what each layer may import.
The last tests run the checker on small synthetic trees, so it is known to catch a forbidden
import and a cycle, not only to stay quiet.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("twin", "topologies", "devices", "workloads", "scenarios", "experiments")
MAX_LINES = 800

#: The layer of a module: the first prefix it matches.
LAYERS = (
    ("twin.kernel", "kernel"),
    ("twin.cli", "cli"),
    ("twin", "front door"),
    ("topologies", "topologies"),
    ("devices", "devices"),
    ("workloads", "workloads"),
    ("scenarios", "scenarios"),
    ("experiments", "experiments"),
)

_BELOW_FRONT = {"scenarios", "workloads", "devices", "topologies", "kernel"}
#: What each layer may import besides the standard library and third-party packages. The
#: kernel knows nothing of GPUs, scenarios or the CLI; ``experiments`` is imported by nothing
#: but the CLI.
MAY_IMPORT: dict[str, set[str]] = {
    "kernel": {"kernel"},
    "topologies": {"topologies", "kernel"},
    "devices": {"devices", "topologies", "kernel"},
    "workloads": {"workloads", "devices", "topologies", "kernel"},
    "scenarios": {"scenarios", "workloads", "devices", "topologies", "kernel"},
    "front door": {"front door", *_BELOW_FRONT},
    "experiments": {"experiments", "front door", *_BELOW_FRONT},
    "cli": {"cli", "experiments", "front door", *_BELOW_FRONT},
}


# ----------------------------------------------------------------------------- the checker
def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` under ``root``."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = f
    return out


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(root: Path, packages=PACKAGES):
    """``(edges, unknown)``: ``edges[module][imported module] = first line number`` over the
    first-party modules; ``unknown`` lists first-party imports naming no existing module."""
    files = module_files(root, packages)
    edges: dict[str, dict[str, int]] = {m: {} for m in files}
    unknown: list[str] = []
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(mod, path, node)
                targets = [(base, [a.name for a in node.names])]
            else:
                continue
            for name, members in targets:
                if name.split(".")[0] not in packages:
                    continue  # standard library or third party
                if name not in files:
                    unknown.append(f"{mod}:{node.lineno} imports {name}, no such module")
                    continue
                hits = [f"{name}.{m}" for m in members or () if f"{name}.{m}" in files]
                for t in hits or [name]:  # `from pkg import mod` depends on mod only
                    if t != mod:
                        edges[mod].setdefault(t, node.lineno)
    return edges, unknown


def layer_of(module: str) -> str | None:
    """The layer of ``module`` (None: in no layer)."""
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def layering_violations(edges: dict[str, dict[str, int]]) -> list[str]:
    """Every import that :data:`MAY_IMPORT` forbids, as ``module:line imports target``."""
    out = []
    for mod, targets in sorted(edges.items()):
        src = layer_of(mod)
        for t, line in sorted(targets.items()):
            dst = layer_of(t)
            if src is None or dst not in MAY_IMPORT[src]:
                out.append(f"{mod}:{line} imports {t} ({src} may not import {dst})")
    return out


def import_cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or round a loop (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(cycles)


# ----------------------------------------------------------------------------- the house
def test_every_module_is_in_a_layer():
    assert [m for m in module_files(ROOT) if layer_of(m) is None] == []


def test_imports_follow_the_layering():
    edges, _ = import_graph(ROOT)
    assert layering_violations(edges) == []


def test_no_import_cycles():
    edges, _ = import_graph(ROOT)
    assert import_cycles(edges) == []


def test_every_first_party_import_names_a_module():
    """A lazy import of a module that moved fails only when its function runs: catch it here."""
    _, unknown = import_graph(ROOT)
    assert unknown == []


def test_no_module_over_800_lines():
    long = {m: n for m, f in module_files(ROOT).items()
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


# ----------------------------------------------------------------------------- the checker's tests
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir(exist_ok=True)
        (tmp_path / pkg / "__init__.py").touch()
    return tmp_path


def test_checker_catches_forbidden_imports_top_level_lazy_and_type_checking(tmp_path):
    root = _tree(tmp_path, {
        "twin/kernel/__init__.py": "",
        "twin/kernel/engine.py": """
            def step():
                from devices import accelerator  # lazy: still an arrow
                return accelerator
            """,
        "devices/accelerator.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from workloads.spec import ModelSpec
            """,
        "workloads/spec.py": "import experiments.pareto\n",
        "experiments/pareto.py": "import numpy\nfrom twin.kernel import engine\n",
        "twin/cli.py": "from experiments.pareto import x\n",
    })
    edges, unknown = import_graph(root)
    assert unknown == []
    assert layering_violations(edges) == [
        "devices.accelerator:4 imports workloads.spec (devices may not import workloads)",
        "twin.kernel.engine:3 imports devices.accelerator (kernel may not import devices)",
        "workloads.spec:1 imports experiments.pareto (workloads may not import experiments)",
    ]


def test_checker_catches_cycles_and_relative_imports(tmp_path):
    root = _tree(tmp_path, {
        "topologies/graph.py": """
            class Topology:
                def hops(self):
                    from .routing import Router
                    return Router
            """,
        "topologies/routing.py": "from topologies.graph import Topology\n",
        "topologies/spec.py": "from . import graph\n",
        "topologies/placement.py": "import topologies.spec\n",
    })
    edges, _ = import_graph(root)
    assert layering_violations(edges) == []
    assert edges["topologies.spec"] == {"topologies.graph": 1}
    assert import_cycles(edges) == [["topologies.graph", "topologies.routing"]]


def test_checker_reports_imports_of_missing_modules(tmp_path):
    root = _tree(tmp_path, {"devices/memory.py": "def f():\n    from twin.queueing import x\n"})
    _, unknown = import_graph(root)
    assert unknown == ["devices.memory:2 imports twin.queueing, no such module"]


def test_checker_flags_a_forbidden_arrow_added_to_the_real_graph():
    edges, _ = import_graph(ROOT)
    edges["devices.power"]["workloads.spec"] = 1
    edges["twin.kernel.trace"]["twin.summary"] = 1
    edges["twin.summary"]["experiments.front"] = 1
    assert layering_violations(edges) == [
        "devices.power:1 imports workloads.spec (devices may not import workloads)",
        "twin.kernel.trace:1 imports twin.summary (kernel may not import front door)",
        "twin.summary:1 imports experiments.front (front door may not import experiments)",
    ]
    assert any({"twin.kernel.trace", "twin.summary"} <= set(c) for c in import_cycles(edges))
