"""A small AST mutation tester for the model's core modules (``make mutate``; not in ``make test``).

For every module named in ``tools/mutation_targets.toml`` it generates *mutants* (one small
change each), runs the module's test files against every mutant and reports how many the tests
*kill* (some test fails or the suite errors), how many *survive* (all pass), how many run past
the time limit (*timeout*, counted as detected) and how many are listed as *equivalent* in
``tools/mutation_equivalent.toml`` (the change cannot alter any output; each entry says why).

Mutation operators (``kind`` in the report):

* ``cmp``    a comparison negated (``<`` -> ``>=``, ``<=`` -> ``>``, ``==`` -> ``!=``, ...);
* ``arith``  an arithmetic operator swapped (``+`` <-> ``-``, ``*`` <-> ``/``, ``//`` -> ``*``,
  ``%`` -> ``//``, ``**`` -> ``*``), also in augmented assignments;
* ``drop``   the right term of a sum or difference dropped (``a + b`` -> ``a``);
* ``const``  a numeric constant perturbed (integers ``n -> n + 1``, floats ``x -> 2 x``,
  ``0.0 -> 1.0``);
* ``minmax`` ``min`` <-> ``max`` (builtins, ``np.minimum/maximum``, ``.min()/.max()``,
  ``argmin/argmax``, ``floor/ceil``);
* ``bool``   ``and`` <-> ``or``, ``not x`` -> ``x``, ``True`` <-> ``False``, ``-x`` -> ``x``.

Docstrings, annotations, decorators, f-strings and ``raise`` statements (error messages) are not
mutated, nor the values of keyword arguments that only lay out a picture or a file
(``figsize``, ``fontsize``, ``dpi``, colours, line widths, legend placement, JSON ``indent``:
:data:`PRESENTATION`), which no test can judge. A mutant's id names the enclosing function,
the operator, the source of the mutated node and an occurrence number, so ids survive edits
in other functions of the module; an edit inside the function can renumber its occurrences
(they follow ``ast.walk``'s breadth-first order), so re-check that function's equivalent
entries (a test checks that each still names a mutant, not that it is the same node).

Each worker owns a private copy of the repository in a temporary directory (parallel-safe);
the mutant is written there and the tests run with that copy first on ``sys.path``. Score =
(killed + timeout) / (killed + timeout + survived), equivalent mutants excluded.

A run that exits 0 without pytest's end-of-session report (``--junitxml``) is *killed*: the
mutant ended the test process early, e.g. ``os._exit(0)`` reached in the parent of a fork
(``twin/kernel/trace.py``'s ``pid == 0`` negated), which no test can fail.

A *timeout* is a run that used more than ``--timeout-factor`` (default 10) times the CPU time of
the unmutated run (``RLIMIT_CPU`` on the test process): a mutant that makes the simulation loop
forever hangs the suite, which is a detection. The limit is on CPU time, not wall time, so other
jobs loading the machine cannot create false timeouts; a wall-clock backstop (10 x the CPU
limit) stops a run that blocks without computing and is reported apart (``wall``), counted as
not detected. The report also gives the score without timeouts (``no-TO``). A test process may
allocate at most ``MEMORY_LIMIT`` (8 GiB, ``RLIMIT_DATA``): a mutant that allocates without
bound ends in ``MemoryError``, a failed test, so it counts as killed instead of swapping out
the machine (one did: a mutant of ``twin/runner.py`` grew to 20 GB).

Usage::

    python tools/mutate.py                       # every module, 2 workers
    python tools/mutate.py --module thermal      # modules whose path contains "thermal"
    python tools/mutate.py --max 40 --seed 1     # a seeded sample of 40 mutants per module
    python tools/mutate.py --list --module regulator   # print the mutants, run nothing

Writes a CSV (``--csv``, default ``runs/mutation.csv``) with one row per mutant.
"""

from __future__ import annotations

import argparse
import ast
import csv
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "tools" / "mutation_targets.toml"
#: bytes of data a test process may allocate (``RLIMIT_DATA``; see the module doc)
MEMORY_LIMIT = 8 * 2**30
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.toml"

_CMP_NEG = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt,
            ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
            ast.In: ast.NotIn, ast.NotIn: ast.In}
_ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
          ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
          ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.LShift: ast.RShift,
          ast.RShift: ast.LShift}
_SYM = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
        ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+",
        ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
        ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>"}
_MINMAX = {"min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum",
           "argmin": "argmax", "argmax": "argmin", "amin": "amax", "amax": "amin",
           "fmin": "fmax", "fmax": "fmin", "floor": "ceil", "ceil": "floor",
           "nanmin": "nanmax", "nanmax": "nanmin"}


@dataclass(frozen=True)
class Mutant:
    """One change to one module."""

    module: str      # path relative to the repository root
    index: int       # position of the node in ast.walk order (to re-apply the change)
    kind: str
    op: str          # what changes, e.g. "< -> >="
    func: str        # enclosing qualified name
    line: int
    snippet: str     # source of the mutated node
    occurrence: int  # among mutants with the same (func, kind, op, snippet)

    @property
    def id(self) -> str:
        """Stable identifier (used by the equivalent list)."""
        return f"{self.func}|{self.kind}|{self.op}|{self.snippet}|{self.occurrence}"


def _skip_ids(tree: ast.AST) -> set[int]:
    """ids of nodes not to mutate: docstrings, annotations, decorators, f-strings, raises."""
    skip: set[int] = set()

    def cover(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            cover(body[0])
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            cover(node.returns)
            for d in node.decorator_list:
                cover(d)
            for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                cover(a.annotation)
        elif isinstance(node, ast.AnnAssign):
            cover(node.annotation)
        elif isinstance(node, ast.ClassDef):
            for d in node.decorator_list:
                cover(d)
        elif isinstance(node, ast.JoinedStr | ast.Raise | ast.Import | ast.ImportFrom):
            cover(node)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in ("__slots__", "__all__") for t in node.targets):
            cover(node)
    return skip


#: Keyword arguments that only lay out a picture or a file (sizes, fonts, line widths, legend
#: placement, resolution, JSON indentation): no test can judge a value of these, so their
#: subtrees are not mutated. Counted before skipping, so other mutants keep their ids.
PRESENTATION = frozenset({"figsize", "fontsize", "dpi", "lw", "linewidth", "alpha", "pad",
                          "bbox", "shrink", "fraction", "bbox_to_anchor", "ncol", "rotation",
                          "markersize", "labelsize", "indent", "color", "frameon", "fill",
                          "hatch", "edgecolor", "facecolor"})


def _presentation_ids(tree: ast.AST) -> set[int]:
    """ids of the nodes inside a :data:`PRESENTATION` keyword argument's value."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.keyword)
            and node.arg in PRESENTATION for n in ast.walk(node.value)}


def _qualnames(tree: ast.AST) -> dict[int, str]:
    """Enclosing qualified name of every node."""
    out: dict[int, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            sub = name
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                sub = f"{name}.{child.name}" if name else child.name
            out[id(child)] = sub
            visit(child, sub)

    visit(tree, "")
    return out


def _candidates(node: ast.AST) -> list[tuple[str, str, object]]:
    """(kind, description, payload) of each mutation applicable to ``node``."""
    out: list[tuple[str, str, object]] = []
    if isinstance(node, ast.Compare):
        for k, op in enumerate(node.ops):
            new = _CMP_NEG.get(type(op))
            if new is not None:
                out.append(("cmp", f"{_SYM[type(op)]} -> {_SYM[new]}", ("cmp", k, new)))
    elif isinstance(node, ast.BinOp | ast.AugAssign):
        new = _ARITH.get(type(node.op))
        if new is not None:
            out.append(("arith", f"{_SYM[type(node.op)]} -> {_SYM[new]}", ("arith", new)))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
            out.append(("drop", f"drop right term of {_SYM[type(node.op)]}", ("drop",)))
    elif isinstance(node, ast.Constant) and not isinstance(node.value, bool):
        v = node.value
        if isinstance(v, int):
            out.append(("const", f"{v} -> {v + 1}", ("const", v + 1)))
        elif isinstance(v, float):
            new = 1.0 if v == 0.0 else 2.0 * v
            out.append(("const", f"{v!r} -> {new!r}", ("const", new)))
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        out.append(("bool", f"{node.value} -> {not node.value}", ("const", not node.value)))
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        out.append(("bool", f"{'and' if new is ast.Or else 'or'} -> "
                            f"{'or' if new is ast.Or else 'and'}", ("boolop", new)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
        out.append(("bool", "drop not" if isinstance(node.op, ast.Not) else "drop unary -",
                    ("unary",)))
    elif isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name in _MINMAX and not (isinstance(f, ast.Name) and name in ("floor", "ceil")):
            out.append(("minmax", f"{name} -> {_MINMAX[name]}", ("minmax", _MINMAX[name])))
    return out


def _apply(node: ast.AST, payload: tuple) -> ast.AST | None:
    """Mutate ``node`` in place; returns a replacement node when the node itself changes."""
    what = payload[0]
    if what == "cmp":
        node.ops[payload[1]] = payload[2]()
    elif what == "arith":
        node.op = payload[1]()
    elif what == "drop":
        return node.left
    elif what == "const":
        node.value = payload[1]
    elif what == "boolop":
        node.op = payload[1]()
    elif what == "unary":
        return node.operand
    elif what == "minmax":
        if isinstance(node.func, ast.Name):
            node.func.id = payload[1]
        else:
            node.func.attr = payload[1]
    return None


_SOURCES: dict[str, str] = {}  # module -> its text when the mutants were made (a snapshot)


def mutants(module: str) -> list[Mutant]:
    """Every mutant of ``module`` (path relative to the repository root)."""
    if module not in _SOURCES:
        _SOURCES[module] = (ROOT / module).read_text()
    src = _SOURCES[module]
    tree = ast.parse(src)
    skip = _skip_ids(tree)
    shown = _presentation_ids(tree)
    names = _qualnames(tree)
    seen: Counter = Counter()
    out = []
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        for kind, op, _payload in _candidates(node):
            snippet = " ".join(ast.unparse(node).split())[:80]
            func = names.get(id(node), "") or "<module>"
            key = (func, kind, op, snippet)
            if id(node) not in shown:
                out.append(Mutant(module, index, kind, op, func, getattr(node, "lineno", 0),
                                  snippet, seen[key]))
            seen[key] += 1
    return out


def mutated_source(m: Mutant) -> str:
    """Source text of the module with mutant ``m`` applied."""
    tree = ast.parse(_SOURCES.get(m.module) or (ROOT / m.module).read_text())
    nodes = list(ast.walk(tree))
    target = nodes[m.index]
    payloads = [p for kind, op, p in _candidates(target) if kind == m.kind and op == m.op]
    if not payloads:
        raise RuntimeError(f"mutant {m.id} no longer applies")
    replacement = _apply(target, payloads[0])
    if replacement is not None:
        for parent in nodes:
            for field, value in ast.iter_fields(parent):
                if value is target:
                    setattr(parent, field, replacement)
                elif isinstance(value, list):
                    for i, item in enumerate(value):
                        if item is target:
                            value[i] = replacement
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def load_targets() -> dict[str, list[str]]:
    """module -> test files, from ``tools/mutation_targets.toml``."""
    data = tomllib.loads(TARGETS.read_text())
    return {m: list(v["tests"]) for m, v in data["modules"].items()}


def load_equivalent() -> dict[tuple[str, str], str]:
    """(module, mutant id) -> reason, from ``tools/mutation_equivalent.toml``."""
    if not EQUIVALENT.exists():
        return {}
    data = tomllib.loads(EQUIVALENT.read_text())
    out = {}
    for e in data.get("equivalent", []):
        if not e.get("reason", "").strip():
            raise SystemExit(f"{EQUIVALENT}: entry {e.get('id')!r} has no reason")
        out[(e["module"], e["id"])] = e["reason"]
    return out


def _run_limited(cmd: list[str], cwd: Path, env: dict, cpu_limit: float,
                 wall_limit: float) -> tuple[str, float]:
    """Run ``cmd`` under a CPU-time limit; returns (status, CPU seconds of the child).

    status: ``survived`` (exit 0), ``killed`` (tests failed), ``no-tests`` (pytest exit 5),
    ``timeout`` (the CPU limit was hit: SIGXCPU / SIGKILL from ``RLIMIT_CPU``) or
    ``wall-timeout`` (the wall-clock backstop stopped it).
    """
    soft = max(1, int(cpu_limit))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 5))
        # a mutant that allocates without bound fails with MemoryError (a detection) before
        # it takes the machine's memory from the other worker and the user
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))

    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=limit)
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(wall_limit, stop)
    timer.start()
    try:
        _pid, wstatus, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(wstatus)
    cpu = usage.ru_utime + usage.ru_stime
    rc = proc.returncode
    if rc in (-signal.SIGXCPU, -signal.SIGKILL) and not stopped.is_set():
        return "timeout", cpu
    if stopped.is_set():
        return "wall-timeout", cpu
    if rc == 0:
        return "survived", cpu
    return ("no-tests" if rc == 5 else "killed"), cpu


class Sandbox:
    """A private copy of the repository (no .venv/.git) where one mutant at a time is run."""

    _IGNORE = staticmethod(shutil.ignore_patterns(
        ".venv", ".git", "runs", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache",
        "*.egg-info", "*.h5", "docs"))

    def __init__(self, base: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="mutate-", dir=base))
        shutil.copytree(ROOT, self.dir / "repo", ignore=self._IGNORE)
        self.repo = self.dir / "repo"

    def run(self, tests: list[str], cpu_limit: float, wall_limit: float,
            module: str | None = None, source: str | None = None) -> tuple[str, float]:
        """Run ``tests`` with ``module`` replaced by ``source``; returns (status, CPU seconds).

        ``cpu_limit`` bounds the CPU time of the test process (``RLIMIT_CPU``): a mutant that
        loops forever uses CPU and hits it, while a run slowed by other jobs on the machine
        does not (it waits, it does not compute more). ``wall_limit`` is only a backstop for a
        mutant that blocks without computing; a wall-clock stop is reported as ``wall-timeout``
        and not counted as detected.
        """
        path = self.repo / module if module else None
        original = path.read_text() if path else None
        if path is not None and source is not None:
            path.write_text(source)
            cache = path.parent / "__pycache__"
            for pyc in cache.glob(f"{path.stem}.*.pyc"):
                pyc.unlink()
        env = dict(os.environ, PYTHONPATH=str(self.repo), PYTHONHASHSEED="0")
        report = self.dir / "junit.xml"  # written by pytest when the session ends
        report.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "-m", "not slow", "--no-header", "-o", "addopts=", f"--junitxml={report}",
               *tests]
        cpu = [0.0]
        try:
            status, cpu[0] = _run_limited(cmd, self.repo, env, cpu_limit, wall_limit)
            if status == "survived" and not report.exists():
                status = "killed"  # exit 0 without a report: the mutant ended the process
        finally:
            if path is not None and original is not None:
                path.write_text(original)
                for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                    pyc.unlink()
        return status, cpu[0]

    def check_isolated(self) -> None:
        """The copy, not the installed checkout, must be what the tests import."""
        env = dict(os.environ, PYTHONPATH=str(self.repo))
        out = subprocess.run([sys.executable, "-c", "import twin, devices, workloads;"
                              "print(twin.__file__, devices.__file__, workloads.__file__)"],
                             cwd=self.repo, env=env, capture_output=True, text=True, check=True)
        if any(not p.startswith(str(self.repo)) for p in out.stdout.split()):
            raise SystemExit(f"sandbox imports the checkout, not its copy: {out.stdout}")

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", action="append", default=[],
                    help="only modules whose path contains this text (repeatable)")
    ap.add_argument("--max", type=int, default=0,
                    help="run a seeded random sample of at most this many mutants per module")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --max sample")
    ap.add_argument("--jobs", type=int, default=2, help="parallel workers (default 2)")
    ap.add_argument("--timeout-factor", type=float, default=10.0,
                    help="per-mutant CPU-time limit = factor x the unmutated run's CPU time "
                         "(at least 30 s); the wall-clock backstop is 10 x that")
    ap.add_argument("--resume", metavar="CSV",
                    help="keep the killed / timeout rows of an earlier run's CSV (same mutant "
                         "ids) and re-run only the other mutants")
    ap.add_argument("--sample-from", metavar="CSV",
                    help="run only the mutants listed in an earlier run's CSV (its sample; "
                         "mutants listed as equivalent since are left out as equivalent)")
    ap.add_argument("--csv", default=str(ROOT / "runs" / "mutation.csv"))
    ap.add_argument("--list", action="store_true", help="list mutants and exit")
    ap.add_argument("--show-survivors", action="store_true", default=True)
    args = ap.parse_args(argv)

    targets = load_targets()
    equivalent = load_equivalent()
    chosen = [m for m in targets if not args.module or any(s in m for s in args.module)]
    if not chosen:
        print(f"no module matches {args.module}; known: {', '.join(targets)}", file=sys.stderr)
        return 2
    plan: dict[str, list[Mutant]] = {}
    for module in chosen:
        ms = mutants(module)
        ids = {m.id for m in ms}
        for (mod, mid) in equivalent:
            if mod == module and mid not in ids:
                print(f"warning: equivalent entry no longer matches a mutant: {mid}",
                      file=sys.stderr)
        plan[module] = ms
    if args.list:
        for module, ms in plan.items():
            for m in ms:
                eq = " [equivalent]" if (module, m.id) in equivalent else ""
                print(f"{module}:{m.line}: {m.kind:6s} {m.op:28s} {m.snippet}{eq}\n    id: {m.id}")
        return 0

    rows: list[dict] = []
    summary: dict[str, Counter] = {}
    base = Path(tempfile.gettempdir())
    pool_boxes: list[Sandbox] = []
    local = threading.local()
    lock = threading.Lock()

    def box() -> Sandbox:
        if not hasattr(local, "box"):
            local.box = Sandbox(base)
            local.box.check_isolated()
            with lock:
                pool_boxes.append(local.box)
        return local.box

    earlier: dict[tuple[str, str], dict] = {}
    if args.resume:
        with open(args.resume, newline="") as fh:
            for row in csv.DictReader(fh):
                if row["status"] in ("killed", "timeout"):
                    earlier[(row["module"], row["id"])] = row
    try:
        for module, ms in plan.items():
            tests = targets[module]
            todo = [m for m in ms if (module, m.id) not in equivalent]
            n_eq = len(ms) - len(todo)
            if args.sample_from:
                with open(args.sample_from, newline="") as fh:
                    listed = {(r["module"], r["id"]) for r in csv.DictReader(fh)
                              if r["status"] != "equivalent"}
                n_eq = sum(1 for m in ms if (module, m.id) in listed
                           and (module, m.id) in equivalent)
                todo = [m for m in todo if (module, m.id) in listed]
            elif args.max and len(todo) > args.max:
                todo = sorted(random.Random(args.seed).sample(todo, args.max),
                              key=lambda m: m.index)
            counts: Counter = Counter(equivalent=n_eq)
            kept = [m for m in todo if (module, m.id) in earlier]
            for m in kept:
                row = dict(earlier[(module, m.id)])
                counts[row["status"]] += 1
                rows.append(row)
            todo = [m for m in todo if (module, m.id) not in earlier]
            status, cpu_clean = box().run(tests, cpu_limit=3600, wall_limit=7200)
            if status != "survived":
                print(f"{module}: the unmutated module fails its tests ({status}); skipped",
                      file=sys.stderr)
                continue
            # CPU time, not wall time: other jobs on the machine do not make a run use more CPU.
            limit = max(30.0, args.timeout_factor * cpu_clean)
            print(f"{module}: {len(todo)} mutants to run ({len(kept)} kept from "
                  f"{args.resume}, {n_eq} equivalent), tests {tests}, clean run "
                  f"{cpu_clean:.1f} s CPU, limit {limit:.0f} s CPU", flush=True)

            def one(m: Mutant, tests=tests, limit=limit) -> tuple[Mutant, str, float]:
                try:
                    st, secs = box().run(tests, limit, 10 * limit, m.module,
                                         mutated_source(m))
                except Exception as exc:  # a mutant that cannot be built is reported, not fatal
                    print(f"  error {m.id}: {exc}", file=sys.stderr, flush=True)
                    return m, "error", 0.0
                return m, st, secs

            with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
                for k, (m, st, secs) in enumerate(ex.map(one, todo), 1):
                    if k % 20 == 0:
                        print(f"  ... {k}/{len(todo)} {dict(counts)}", flush=True)
                    counts[st] += 1
                    rows.append(dict(module=module, id=m.id, kind=m.kind, line=m.line,
                                     op=m.op, snippet=m.snippet, status=st,
                                     seconds=round(secs, 2)))
                    if st in ("survived", "wall-timeout", "error") and args.show_survivors:
                        print(f"  {st} {module}:{m.line} [{m.func}] {m.kind} {m.op}: "
                              f"{m.snippet}", flush=True)
            for m in ms:
                if (module, m.id) in equivalent:
                    rows.append(dict(module=module, id=m.id, kind=m.kind, line=m.line, op=m.op,
                                     snippet=m.snippet, status="equivalent", seconds=0.0))
            summary[module] = counts
    finally:
        for b in pool_boxes:
            b.close()

    out = Path(args.csv)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["module", "id", "kind", "line", "op", "snippet",
                                           "status", "seconds"])
        w.writeheader()
        w.writerows(rows)
    print()
    print(f"{'module':40s} {'killed':>7s} {'timeout':>7s} {'survived':>8s} {'wall':>5s} "
          f"{'equiv':>6s} {'score':>6s} {'no-TO':>6s} {'SE':>5s}")
    worst = 1.0
    for module, c in summary.items():
        det = c["killed"] + c["timeout"]
        undecided = c["survived"] + c["no-tests"] + c["wall-timeout"] + c["error"]
        denom = det + undecided
        score = det / denom if denom else 1.0
        # without timeouts: a mutant that only ran out of CPU time is left out of both sides
        strict = (c["killed"] / (denom - c["timeout"])) if denom - c["timeout"] else 1.0
        se = (score * (1 - score) / denom) ** 0.5 if denom else 0.0
        worst = min(worst, score)
        print(f"{module:40s} {c['killed']:7d} {c['timeout']:7d} {c['survived']:8d} "
              f"{c['wall-timeout']:5d} {c['equivalent']:6d} {100 * score:5.1f}% "
              f"{100 * strict:5.1f}% {100 * se:4.1f}%")
    print("score = (killed + timeout) / all decided non-equivalent; no-TO = killed / (all - "
          "timeout); SE = binomial standard error of the score when the mutants are a sample "
          "(--max); wall = stopped by the wall-clock backstop (counted as not detected)")
    print(f"\nCSV: {out}")
    return 0 if worst >= 0.85 else 1


if __name__ == "__main__":
    raise SystemExit(main())
