"""Hostile inputs for the front door, and a sandbox that runs the CLI on them.

Used by ``tests/test_fuzz.py`` (a bounded run inside ``make test``) and by ``make fuzz``
(``python -m tests.fuzzing --cases 5000``: the long run, not part of the suite).

A :class:`Case` is a set of files written into a fresh working directory plus a ``twin``
command line. Cases are made by mutating the scenario library (``scenarios/*.yaml``): dropped
and unknown keys, wrong types, zero / negative / huge / NaN / inf numbers, integers with
thousands of digits, deep nesting, YAML alias bombs, duplicate keys, binary garbage, non-UTF-8
bytes, over-long names, extreme but valid layouts, ``--set key=null``, output paths that are
directories, device nodes, read-only folders or outside the working directory, and corrupted
or foreign HDF5 files for ``twin summary`` / ``twin limits``.

:func:`run_case` runs ``twin.cli.main`` in a forked child (so the parent's imports are reused
and a case costs milliseconds, not an interpreter start-up) with an address-space limit and a
wall-clock limit. The verdict is ``ok`` (exit 0 or 2 and no traceback), ``traceback``,
``exit <n>``, ``hang`` (killed at the time limit) or ``killed`` (died of a signal, e.g. the
memory limit).
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import resource
import stat
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from twin.kernel.trace import wait_child

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = sorted(p for p in (ROOT / "scenarios").glob("*.yaml"))
#: Library files that are single scenarios (not campaign / sweep files), and that run fast.
FAST = ("quickstart", "ring", "switched", "torus3d", "dragonfly2d", "fault_link", "hbm_frfcfs",
        "power_stage_plan", "fault_straggler", "fault_accelerator", "fault_mesh_edge")

MEMORY_LIMIT_BYTES = 8 << 30


@dataclass
class Case:
    """Files to write (relative path -> bytes) and the ``twin`` arguments to run."""

    kind: str
    files: dict[str, bytes]
    argv: list[str]
    setup: list[str] = field(default_factory=list)  # "readonly:DIR", "mkdir:DIR"

    def describe(self) -> str:
        """One line: kind and command."""
        return f"{self.kind}: twin {' '.join(self.argv)}"


# ----------------------------------------------------------------------------- mutations
BAD_NUMBERS: list[Any] = [0, -1, -1e-9, 1e300, 1e-300, float("nan"), float("inf"), -float("inf"),
                          2**64, 2**63, 10**30, 1e9, 1e-12, 0.5, True, "1e9"]
WRONG_TYPES: list[Any] = ["x", [], {}, [1, 2], {"a": 1}, None, True, "", "\u2603" * 50]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys / indices) in a parsed YAML document."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _set(node: Any, path: tuple, value: Any) -> None:
    _get(node, path[:-1])[path[-1]] = value


def _delete(node: Any, path: tuple) -> None:
    parent = _get(node, path[:-1])
    del parent[path[-1]]


def _dump(doc: Any) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode()


def _mutate_doc(doc: Any, rng: random.Random) -> Any:
    """One to three random structural or value mutations of a parsed scenario."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        paths = _paths(doc)
        if not paths:
            break
        path = rng.choice(paths)
        op = rng.choice(["drop", "unknown", "type", "number", "number", "number", "list",
                         "scale", "scale", "scale"])
        try:
            if op == "drop":
                _delete(doc, path)
            elif op == "unknown":
                target = _get(doc, path[:-1]) if len(path) > 1 else doc
                if isinstance(target, dict):
                    target[rng.choice(["colour", "shapes", "seedd", "x" * 40])] = 1
            elif op == "type":
                _set(doc, path, rng.choice(WRONG_TYPES))
            elif op == "number":
                leaf = _get(doc, path)
                if isinstance(leaf, (int, float)) or rng.random() < 0.3:
                    _set(doc, path, rng.choice(BAD_NUMBERS))
            elif op == "scale":  # extreme but often valid: x 10^k
                leaf = _get(doc, path)
                if isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
                    factor = 10.0 ** rng.randint(-6, 6)
                    _set(doc, path, type(leaf)(leaf * factor) if isinstance(leaf, float)
                         else max(int(leaf * factor), rng.choice([0, 1])))
            elif op == "list":
                _set(doc, path, [rng.choice(BAD_NUMBERS) for _ in range(rng.randint(0, 3))])
        except (KeyError, IndexError, TypeError):
            continue
    return doc


#: Targeted values known to stress allocation, numerics or event counts (dotted key, value).
TARGETED: list[tuple[str, Any]] = [
    ("cluster.topology.shape", [100000, 100000]), ("cluster.topology.shape", [2**31, 1]),
    ("cluster.topology.shape", [1, 1]), ("cluster.topology.shape", [2**62, 2**62]),
    ("workload.global_batch", 10**9), ("workload.global_batch", 2**70),
    ("power.alerts.window_s", 1e-12), ("memory.dma.rate_gbps", 1e12),
    ("cluster.device.kernel_overhead_us", 1e9), ("cluster.device.p_states", []),
    ("cluster.device.gemm_tile", [0, 0]), ("seed", 2**64), ("seed", -1),
    ("network.packet_kib", 1e-3), ("network.model", "packet"),
    ("network.ring_model", "lockstep"), ("network.ring_substeps", 65),
    ("workload.seq_len", 10**9), ("workload.iterations", 10**9), ("workload.micro_batch", 10**9),
    ("power.thermal.ambient_c", float("nan")), ("power.thermal.ambient_c", -300.0),
    ("power.thermal.ambient_c", 1e6), ("power.thermal.initial_c", float("inf")),
    ("workload.model.layers", 10**7), ("workload.model.hidden", 2**40),
    ("cluster.links_per_edge", 10**9), ("cluster.link.bandwidth_gbps", 1e-300),
    ("cluster.link.latency_us", 1e300), ("simulation.compute_jitter_cov", 1e6),
    ("network.retransmit_timeout_s", 1e-300), ("workload.grad_bucket_mb", 1e-300),
    ("name", "n" * 400), ("trace.path", "../../outside.h5"), ("trace.path", "/proc/x.h5"),
    ("trace.path", "devnode"), ("trace.path", "a/" * 3000 + "x.h5"),
    ("trace.path", "."), ("workload.virtual_stages", 10**6),
    ("job.restart_s", 1e-300), ("job.checkpoint_interval_iterations", 0),
]

FAULTS: list[dict[str, Any]] = [
    {"kind": "cooling_failure", "devices": [0], "time_s": 0.0, "rise_k": 1e6},
    {"kind": "cooling_failure", "devices": [0], "time_s": 0.0, "rise_k": float("inf")},
    {"kind": "link_failure", "links": "all", "time_s": 0.0},
    {"kind": "link_failure", "links": "all", "ttf": {"dist": "exponential", "mean_s": 1e-6}},
    {"kind": "accelerator_failure", "devices": "all",
     "ttf": {"dist": "exponential", "mean_s": 1e-6}},
    {"kind": "straggler", "devices": "all", "factor": 1e300,
     "ttf": {"dist": "exponential", "mean_s": 1e-9}, "ttr": {"dist": "exponential",
                                                             "mean_s": 1e-9}},
    # a huge slowdown in a short fixed window: few events, but a runaway simulated time
    {"kind": "straggler", "device": 0, "factor": 1e9, "time_s": 0.01, "duration_s": 0.1},
    {"kind": "hbm_degradation", "device": 0, "time_s": 0.0, "duration_s": 0.1,
     "tail": {"name": "pareto", "alpha": 1.5, "mean": 1e9}},
    # distribution parameters whose derived quantities overflow a float
    {"kind": "straggler", "device": 0, "factor": 2.0, "time_s": 0.0,
     "ttr": {"dist": "lognormal", "mean_s": 0.1, "cov": 1e300}},
    {"kind": "straggler", "device": 0, "factor": 2.0,
     "ttf": {"dist": "weibull", "shape": 1e-300, "scale_s": 0.1}},
    {"kind": "accelerator_failure", "device": 0,
     "ttf": {"dist": "exponential", "catalog": "llama3-gpu", "acceleration": 1e-300}},
]


def _alias_bomb(levels: int = 9) -> bytes:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"name: *a{levels - 1}")
    return ("\n".join(lines) + "\n").encode()


def _raw_variants(text: str, rng: random.Random) -> bytes:
    """Byte-level damage: garbage, non-UTF-8, truncation, deep nesting, duplicate keys,
    thousand-digit integers, alias bombs, tabs."""
    choice = rng.randrange(10)
    if choice == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))
    if choice == 1:
        return text.encode("utf-8") + "\n# caf\xe9\n".encode("latin-1") + b"\xff\xfe"
    if choice == 2:
        return text.encode()[: rng.randint(0, len(text))]
    if choice == 3:
        depth = rng.choice([200, 1000, 5000, 50000])
        return ("name: x\ncluster: " + "[" * depth + "]" * depth + "\n").encode()
    if choice == 4:
        depth = rng.choice([500, 5000])
        return ("name: x\n" + "".join(" " * i + f"k{i}:\n" for i in range(depth))).encode()
    if choice == 5:
        return (text + "\nseed: 3\nseed: 4\n").encode()
    if choice == 6:
        return text.replace("seed: ", "seed: " + "9" * 5000 + "#", 1).encode()
    if choice == 7:
        return _alias_bomb(rng.choice([6, 9, 12]))
    if choice == 8:
        return text.replace("  ", "\t", 3).encode()
    return ("x" * rng.choice([10, 10**6, 20 * 10**6])).encode()


def _scenario_texts() -> dict[str, tuple[str, Any]]:
    out = {}
    for p in LIBRARY:
        text = p.read_text(encoding="utf-8")
        out[p.stem] = (text, yaml.safe_load(text))
    return out


_TEXTS: dict[str, tuple[str, Any]] | None = None


def library() -> dict[str, tuple[str, Any]]:
    """Library scenarios by stem: (text, parsed)."""
    global _TEXTS
    if _TEXTS is None:
        _TEXTS = _scenario_texts()
    return _TEXTS


def _is_scenario(doc: Any) -> bool:
    return isinstance(doc, dict) and "cluster" in doc


def _with_library(files: dict[str, bytes]) -> dict[str, bytes]:
    """Campaign and sweep files name their base by relative path: ship the library too."""
    for stem, (text, _) in library().items():
        files.setdefault(f"{stem}.yaml", text.encode())
    return files


def make_case(rng: random.Random) -> Case:
    """One random hostile case."""
    lib = library()
    stem = rng.choice(sorted(lib))
    text, doc = lib[stem]
    # only the fast scenarios are run: a mutation that leaves a 405B-on-8192-GPU scenario valid
    # (or a comment-only change) is a legitimate minutes-long simulation, not a hang
    runnable = _is_scenario(doc) and stem in FAST
    r = rng.random()
    if r < 0.12 and runnable:  # value mutations of a fast scenario, run for real
        return Case("mutate-run", {"in.yaml": _dump(_mutate_doc(doc, rng))},
                    ["run", "in.yaml", "--json"])
    if r < 0.25:
        data = _dump(_mutate_doc(doc, rng))
        return Case("mutate", _with_library({"in.yaml": data}),
                    [rng.choice(["check", "check", "run"]) if runnable else "check", "in.yaml"])
    if r < 0.40:
        return Case("raw", _with_library({"in.yaml": _raw_variants(text, rng)}),
                    [rng.choice(["check", "run"]) if runnable else "check", "in.yaml"])
    if r < 0.65 and runnable:
        key, value = rng.choice(TARGETED)
        doc = copy.deepcopy(doc)
        node = doc
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {} if not isinstance(node.get(part), str) else {"base": node[part]}
            node = node[part]
        node[parts[-1]] = value
        if key == "cluster.topology.shape" and rng.random() < 0.5:
            doc["workload"]["parallelism"] = {"dp": 1, "tp": 1, "pp": 1}
        return Case(f"targeted {stem} {key}={str(value)[:40]}", {"in.yaml": _dump(doc)},
                    [rng.choice(["check", "run", "run"]), "in.yaml"])
    if r < 0.72 and runnable:
        doc = copy.deepcopy(doc)
        doc["faults"] = [copy.deepcopy(rng.choice(FAULTS))]
        doc["power"] = {**(doc.get("power") or {}),
                        "thermal": {"enabled": True}} if rng.random() < 0.3 else doc.get(
            "power", {})
        return Case("faults", {"in.yaml": _dump(doc)}, ["run", "in.yaml"])
    if r < 0.80 and runnable:
        return _one_device(rng, doc)
    if r < 0.88 and runnable:
        return _output_case(rng, doc)
    if r < 0.94 and runnable:
        paths = [".".join(map(str, p)) for p in _paths(doc) if all(isinstance(x, str) for x in p)]
        key = rng.choice(paths)
        return Case("set-null", {"in.yaml": text.encode()},
                    [rng.choice(["check", "run"]), "in.yaml", "--set", f"{key}=null"])
    return _trace_case(rng) if rng.random() < 0.9 else _table_case(rng)


def _one_device(rng: random.Random, doc: Any) -> Case:
    doc = copy.deepcopy(doc)
    kind, shape = rng.choice([("torus2d", [1, 1]), ("mesh2d", [1, 1]), ("ring", [1]),
                              ("torus3d", [1, 1, 1]), ("dragonfly2d", [1, 1]),
                              ("switched", [1, 1]), ("mesh2d", [1, 2]), ("ring", [2])])
    cluster = doc["cluster"]
    cluster["topology"] = {"kind": kind, "shape": shape}
    for key in ("nic_link", "global_link", "global_links_per_edge"):
        cluster.pop(key, None)
    n = 1
    for s in shape:
        n *= s
    doc["workload"]["parallelism"] = {"dp": n, "tp": 1, "pp": 1}
    doc["workload"]["global_batch"] = max(n, 2)
    doc["workload"]["micro_batch"] = 1
    doc.pop("faults", None)
    doc["network"] = {}
    return Case("one-device", {"in.yaml": _dump(doc)}, ["run", "in.yaml", "--json"])


def _output_case(rng: random.Random, doc: Any) -> Case:
    target = rng.choice(["outdir", "/proc/meshtwin.h5", "devnode", "ro/x.h5",
                         "n" * 300 + ".h5", "../escape.h5", "notes.txt", "", "ro"])
    setup = ["mkdir:outdir", "readonly:ro", "devnode:devnode"]
    files = {"in.yaml": _dump(doc), "notes.txt": b"my precious notes\n"}
    argv = ["run", "in.yaml", "-o", target]
    if rng.random() < 0.3:
        argv += ["--plot", rng.choice(["outdir", "/proc/p.png", "ro/p.png"])]
    return Case("output", files, argv, setup)


def _trace_case(rng: random.Random) -> Case:
    """summary / limits on a damaged copy of a real trace (made once, see :func:`_good_trace`)."""
    data = bytearray(_good_trace())
    how = rng.randrange(7)
    if how == 0:
        data = data[: rng.randint(0, len(data))]
    elif how == 1:
        for _ in range(rng.randint(1, 50)):
            i = rng.randrange(len(data))
            data[i] = rng.randrange(256)
    elif how == 2:
        start = rng.randrange(len(data))
        data[start:start + rng.randint(1, 4096)] = bytes(rng.randint(1, 4096))
    elif how == 3:
        data = bytearray(_foreign_h5(rng))
    elif how == 4:
        data = bytearray(b"not an hdf5 file\n" * rng.randint(0, 100))
    elif how == 5:
        data = bytearray(_edited_trace(rng))
    cmd = rng.choice(["summary", "limits", "export", "report"])
    argv = [cmd, "t.h5"]
    if cmd == "export":
        argv += ["-o", rng.choice(["t.json", "t.perfetto-trace"])]
        if rng.random() < 0.4:  # hostile selections (a huge range once took a minute of swap)
            argv += [rng.choice(["--devices", "--window", "--max-mb"]), rng.choice(EXPORT_ARGS)]
    elif rng.random() < 0.5:
        argv.append("--json")
    return Case("trace", {"t.h5": bytes(data)}, argv)


#: Values for export's --devices / --window / --max-mb, valid and hostile.
EXPORT_ARGS = ["0-99999999999", "0-", "-1", "3-1", "0,,1", "1e3", "0-3,8", "999", "0",
               "99999999999999999999999", ":", "0:1e-9", "nan:1", "1e400:1e401", "0:inf",
               "-inf", "1e-300", "0.001", "abc", ""]


POINTS_CSV = (b"label,strategy,status,iteration_time_s,energy_per_iteration_j\n"
              b"a,4-2-1,ok,0.5,900\nb,2-4-1,invalid,,\nc,8-1-1,ok,0.25,1200\n")


def _table_case(rng: random.Random) -> Case:
    """``twin report --sweep`` on a damaged ``points.csv`` beside a good trace."""
    data = bytearray(POINTS_CSV)
    how = rng.randrange(6)
    if how == 0:
        data = data[: rng.randint(0, len(data))]
    elif how == 1:
        for _ in range(rng.randint(1, 10)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif how == 2:
        data = data.replace(b"0.25", rng.choice([b"fast", b"nan", b"-inf", b"1e999", b'"']))
    elif how == 3:
        data = data.replace(rng.choice([b"status", b"iteration_time_s", b"label"]), b"x")
    elif how == 4:
        data += b"d,1-1-8,ok\n" * rng.randint(1, 3) + b"1,2,3,4,5,6,7\n"
    sweep = rng.choice(["p.csv", ".", "missing.csv"])
    return Case("table", {"t.h5": _good_trace(), "p.csv": bytes(data)},
                ["report", "t.h5", "--sweep", sweep] + (["--json"] if rng.random() < 0.5
                                                        else []))


_GOOD: bytes | None = None


def _good_trace() -> bytes:
    """The bytes of a small real trace (written once per process)."""
    global _GOOD
    if _GOOD is None:
        from twin.api import load_scenario, run

        with tempfile.TemporaryDirectory() as tmp:
            scen = load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                 ["cluster.topology.shape=[2,2]",
                                  "workload.parallelism={dp: 4, tp: 1, pp: 1}",
                                  "workload.seq_len=256", "workload.global_batch=8",
                                  "workload.iterations=1"])
            out = run(scen, trace_path=Path(tmp) / "good.h5").trace_path
            _GOOD = Path(out).read_bytes()
    return _GOOD


def _foreign_h5(rng: random.Random) -> bytes:
    import h5py
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "f.h5"
        with h5py.File(p, "w") as f:
            f.create_dataset("data", data=np.arange(rng.randint(0, 100)))
            if rng.random() < 0.5:
                f.attrs["summary"] = rng.choice(["{", "[]", "null", '{"a": NaN}', "1"])
            if rng.random() < 0.5:
                f.attrs["complete"] = rng.choice([True, False])
            if rng.random() < 0.3:
                f.create_group("ops")
        return p.read_bytes()


def _edited_trace(rng: random.Random) -> bytes:
    """A structurally valid HDF5 copy of the good trace with a table, column or attribute
    removed or replaced, or a table cut to no rows."""
    import h5py

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "e.h5"
        p.write_bytes(_good_trace())
        with h5py.File(p, "a") as f:
            what = rng.randrange(7)
            if what == 0:
                del f[rng.choice(list(f))]
            elif what == 1:
                g = f[rng.choice([k for k in f if isinstance(f[k], h5py.Group)])]
                del g[rng.choice(list(g))]
            elif what == 2:
                f.attrs["complete"] = False
            elif what == 3:
                key = rng.choice(list(f.attrs))
                f.attrs[key] = rng.choice(["{", "x", "[1, 2]", '{"iteration_time_s": NaN}'])
            elif what == 4:
                g = f[rng.choice([k for k in f if isinstance(f[k], h5py.Group)])]
                g.attrs["units"] = rng.choice(["{", '{"zzz": "s"}', "[]"])
            elif what == 5:
                g = f[rng.choice([k for k in f if isinstance(f[k], h5py.Group)])]
                c = rng.choice(list(g))
                n = g[c].shape[0]
                g[c].resize((max(n - 1, 0),))
            else:  # a whole table cut to no rows (its columns still agree)
                for data in f[rng.choice([k for k in f if isinstance(f[k], h5py.Group)])].values():
                    data.resize((0, *data.shape[1:]))
        return p.read_bytes()


# ----------------------------------------------------------------------------- sandbox
@dataclass
class Outcome:
    """What one case did."""

    verdict: str
    code: int | None
    seconds: float
    stderr: str


def _child(case: Case, workdir: Path, out_fd: int) -> None:
    os.chdir(workdir)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    code = 70
    try:
        from twin.cli import main

        code = main(case.argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # the verdict: any uncaught exception is a bug
        import traceback

        traceback.print_exc()
        code = 70
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_case(case: Case, timeout_s: float = 20.0) -> Outcome:
    """Run ``case`` in a forked child inside a fresh temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work" / "here"
        work.mkdir(parents=True)
        for rel, data in case.files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_bytes(data)
        for step in case.setup:
            what, _, name = step.partition(":")
            if what == "devnode":  # a private character device (never the real /dev/null)
                try:
                    os.mknod(work / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                except OSError:
                    (work / name).mkdir()
                continue
            (work / name).mkdir(exist_ok=True)
            if what == "readonly":
                (work / name).chmod(0o555)
        log = Path(tmp) / "log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (child)
            _child(case, work, fd)
        os.close(fd)
        status = wait_child(pid, timeout_s)  # None: killed at the time limit
        seconds = time.perf_counter() - t0
        text = log.read_text(encoding="utf-8", errors="replace")
        (work.parent.parent / "work" / "here").chmod(0o755)
        for step in case.setup:
            if not step.startswith("devnode"):
                (work / step.partition(":")[2]).chmod(0o755)
    if status is None:
        return Outcome("hang", None, seconds, text)
    if os.WIFSIGNALED(status):
        return Outcome(f"killed by signal {os.WTERMSIG(status)}", None, seconds, text)
    code = os.WEXITSTATUS(status)
    if "Traceback (most recent call last)" in text:
        return Outcome("traceback", code, seconds, text)
    if code not in (0, 2):
        return Outcome(f"exit {code}", code, seconds, text)
    return Outcome("ok", code, seconds, text)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _preload() -> None:
    """Import what the CLI imports lazily, so each forked case starts warm."""
    import twin.api
    import twin.cli
    import twin.limits
    import twin.runner  # noqa: F401

    _good_trace()


def main(argv: list[str] | None = None) -> int:
    """``make fuzz``: run many cases, print a tally and every failing case."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=5000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=25.0, help="per case, s")
    p.add_argument("--keep", help="folder to save failing cases in")
    args = p.parse_args(argv)
    _preload()
    rng = random.Random(args.seed)
    tally: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    t0 = time.perf_counter()
    slowest = (0.0, "")
    for i in range(args.cases):
        case = make_case(rng)
        out = run_case(case, args.timeout)
        tally[out.verdict] += 1
        if out.seconds > slowest[0]:
            slowest = (out.seconds, case.describe())
        if out.seconds > args.timeout / 2 and out.verdict == "ok":
            print(f"[{i}] slow ({out.seconds:.1f} s) {case.describe()}", flush=True)
        if out.verdict != "ok":
            causes[f"{out.verdict}: {_last_line(out.stderr)}"] += 1
            print(f"[{i}] {out.verdict} ({out.seconds:.1f} s) {case.describe()}\n    "
                  f"{_last_line(out.stderr)}", flush=True)
            if args.keep:
                keep = Path(args.keep) / f"case{i:05d}"
                keep.mkdir(parents=True, exist_ok=True)
                for rel, data in case.files.items():
                    if rel == "in.yaml" or rel == "t.h5":
                        (keep / rel).write_bytes(data)
                (keep / "argv").write_text(" ".join(case.argv) + "\n" + out.stderr)
        if (i + 1) % 500 == 0:
            print(f"... {i + 1} cases, {dict(tally)}, {time.perf_counter() - t0:.0f} s",
                  flush=True)
    print(f"\n{args.cases} cases in {time.perf_counter() - t0:.0f} s: {dict(tally)}")
    print(f"slowest case: {slowest[0]:.1f} s ({slowest[1]})")
    for cause, n in causes.most_common():
        print(f"  {n:5d}  {cause}")
    return 0 if tally["ok"] == args.cases else 1


if __name__ == "__main__":
    sys.exit(main())
