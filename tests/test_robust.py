"""The front door on hostile input (issue 16): minimal reproducers of every cause found.

Each test feeds the CLI (``twin.cli.main``, in process) one bad input and checks exit code 2,
a message naming the field, and no exception. The references are the rules themselves
(YAML 1.2: keys are unique; 64-bit integers; absolute zero; RFC 8259 JSON has no NaN) and,
for the budget, the event count the simulator actually reports.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import h5py
import pytest
import yaml

from twin.cli import main

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "scenarios" / "quickstart.yaml"


def _doc(**updates):
    d = yaml.safe_load(QUICK.read_text())
    d["trace"] = {"path": "q.h5"}
    for key, value in updates.items():
        node = d
        parts = key.split("__")
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {"base": node[p]} if isinstance(node.get(p), str) else {}
            node = node[p]
        node[parts[-1]] = value
    return d


def _write(tmp_path: Path, doc=None, text: str | bytes | None = None, name="s.yaml") -> str:
    p = tmp_path / name
    if text is None:
        text = yaml.safe_dump(doc, sort_keys=False)
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# ----------------------------------------------------------------------------- reading
@pytest.mark.parametrize("text, words", [
    ("name: x\ncluster: " + "[" * 5000 + "]" * 5000 + "\n", "nesting deeper"),
    ("name: x\n" + "".join(" " * i + f"k{i}:\n" for i in range(200)), "nesting deeper"),
    ("seed: " + "9" * 5000 + "\n", "digits"),
    ("name: a\nname: b\n", "duplicate key 'name'"),
    ('a0: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"a{i}: &a{i} [{','.join(['*a' if i == 1 else f'*a{i - 1}'] * 9)}]\n"
        for i in range(1, 9)), "alias bomb"),
    ("name: [unclosed\n", "malformed YAML at line"),
])
def test_malformed_yaml_is_refused_with_a_position(tmp_path, capsys, text, words):
    code, _, err = _cli(capsys, "check", _write(tmp_path, text=text))
    assert code == 2 and words in err


def test_a_document_of_too_many_values_is_refused_while_read_and_not_called_a_bomb(
        monkeypatch):
    """With the bound at 10 values: 9 scalars in a list (10 nodes) are read; 10 are refused
    as a document of more than 10 values, at the 11th, while it is read (a 4 MiB scenario
    of 300,000 values took 18 s and 500 MB to be called "an alias bomb?"). A document of 8
    values as written that expands to 13 is refused with aliases expanded."""
    from twin.kernel import reading
    from twin.kernel.errors import ScenarioError

    monkeypatch.setattr(reading, "MAX_NODES", 10)
    assert reading.load_yaml_text("[" + ",".join(["0"] * 9) + "]") == [0] * 9
    with pytest.raises(ScenarioError, match=r"column 20: the document has more than 10 "
                                            r"values$") as exc:
        reading.load_yaml_text("[" + ",".join(["0"] * 10) + "]")
    assert "alias" not in str(exc.value)
    with pytest.raises(ScenarioError, match=r"expands to more than 10 values \(aliases"):
        reading.load_yaml_text("[&a [0, 0, 0, 0, 0], *a]")


def test_reading_bounds_are_exactly_the_documented_ones(tmp_path):
    """README: at most 4 MiB, nested at most 64 levels, at most 200,000 values with aliases
    expanded, integers of at most 40 digits; each bound is admitted, one more is refused."""
    from twin.kernel.errors import ScenarioError
    from twin.kernel.reading import load_yaml_text, read_input

    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * (4 << 20))
    assert len(read_input(path)) == 4 * 1024 * 1024
    path.write_bytes(b"#" * ((4 << 20) + 1))
    with pytest.raises(ScenarioError, match="too large: 4194305 bytes") as exc:
        read_input(path)
    assert exc.value.problems[0].allowed == "at most 4194304 bytes"

    def refused(text: str, words: str) -> None:
        with pytest.raises(ScenarioError, match=words):
            load_yaml_text(text)

    load_yaml_text("[" * 64 + "]" * 64)  # 64 nested lists
    refused("[" * 65 + "]" * 65, "nesting deeper than 64")
    # a list of 1000 zeros (1001 nodes) under an anchor, 198 aliases of it and r scalars:
    # 1 + 199 x 1001 + r values
    base = "[&a [" + ",".join(["0"] * 1000) + "]," + ",".join(["*a"] * 198)
    assert len(load_yaml_text(base + "," + ",".join(["0"] * 800) + "]")) == 199 + 800
    refused(base + "," + ",".join(["0"] * 801) + "]", "more than 200000 values")
    assert load_yaml_text("9" * 40) == int("9" * 40)
    refused("9" * 41, "at most 40")
    # depth through aliases: a_i = [0, *a_(i-1)] is i + 2 levels deep expanded (a list over a
    # scalar, one list more per key), two as written; under the root mapping, keys a0 .. a61
    # make 64 levels, one key more 65
    chain = "a0: &a0 [0]\n" + "".join(f"a{i}: &a{i} [0, *a{i - 1}]\n" for i in range(1, 63))
    load_yaml_text("\n".join(chain.splitlines()[:62]))
    refused(chain, "nesting deeper than 64 levels \\(aliases expanded\\)")
    refused("name: x\nseed: \x07\n", "at line 2: character #x0007")
    # the depth is counted along the path while the file is read (refused where it goes too
    # deep, before the document is built), not over the nodes read before: 300 sibling
    # values first do not give a 65-level list more room
    siblings = "[" + ",".join(["0"] * 300) + ","
    load_yaml_text(siblings + "[" * 63 + "]" * 63 + "]")
    refused(siblings + "[" * 64 + "]" * 64 + "]", "column 665: nesting deeper than 64 levels$")


def test_a_file_that_grows_after_its_size_was_read_is_still_refused(tmp_path, monkeypatch):
    """The size check reads one byte past the bound: a file whose ``stat`` said small (a
    file growing while it is read, a ``/proc`` file that reports size 0) but that holds
    more than 4 MiB is refused, not cut at 4 MiB and parsed."""
    import os

    from twin.kernel import reading
    from twin.kernel.errors import ScenarioError

    path = tmp_path / "growing.yaml"
    path.write_bytes(b"#" * ((4 << 20) + 1))
    class _Small:
        def __init__(self, st):
            self.st_mode, self.st_size = st.st_mode, 0

    class _Os:  # the reading module's view of ``os``: stat says size 0, the rest is os
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def stat(p, **kw):
            return _Small(os.stat(p, **kw))

    monkeypatch.setattr(reading, "os", _Os())
    with pytest.raises(ScenarioError, match="too large"):
        reading.read_input(path)


def test_a_long_input_path_is_shown_cut_to_300_characters(tmp_path):
    """A missing input named by a very long path: the error shows its first 300 characters
    (a message, not a dump of what was typed)."""
    from twin.kernel.errors import ScenarioError
    from twin.kernel.reading import read_input

    long = str(tmp_path / ("d" * 200) / ("n" * 200 + ".yaml"))
    with pytest.raises(ScenarioError) as exc:
        read_input(long)
    assert exc.value.problems[0].value == long[:300]
    assert exc.value.source == long[:300]
    assert exc.value.problems[0].message == "scenario file not found"
    # a name longer than the file system takes (255 bytes) is said to be that, not missing
    with pytest.raises(ScenarioError) as exc:
        read_input(str(tmp_path / ("n" * 300 + ".yaml")))
    assert exc.value.problems[0].message == "scenario file name too long"


@pytest.mark.parametrize(("content", "words"), [
    (b"", "is not a CSV table"),
    (b"\xff\xfe\x00garbage", "is not UTF-8 text: byte 0xff at line 1"),
    (b'status,iteration_time_s\n"ok,1\n', "is not a CSV table"),
    (b"a,b\n1,2\n", "has no column status, iteration_time_s"),
    (b"status,iteration_time_s\nok,1\nok,fast\n", "column iteration_time_s that is not a "
     "number (data row 2)"),
])
def test_a_csv_table_an_option_names_is_refused_under_the_option(tmp_path, content, words):
    """``twin report --sweep`` / ``twin pareto --reference`` read a CSV a user points them
    at: empty, binary, unterminated, without the columns the command reads, or with text in
    a number column, it is refused under the option's name, saying what would be accepted
    and quoting no content (these were pandas tracebacks)."""
    from twin.kernel.errors import ScenarioError
    from twin.kernel.reading import read_csv_table

    path = tmp_path / "points.csv"
    path.write_bytes(content)
    with pytest.raises(ScenarioError) as exc:
        read_csv_table(path, "points", "--sweep", {"status": False, "iteration_time_s": True},
                       "a points.csv")
    (problem,) = exc.value.problems
    assert problem.path == "--sweep" and words in problem.message
    assert "fast" not in str(problem) and "garbage" not in str(problem)


def test_a_csv_table_keeps_empty_number_cells_and_converts_the_rest(tmp_path):
    from twin.kernel.reading import read_csv_table

    path = tmp_path / "points.csv"
    path.write_text("status,iteration_time_s,label\nok,1.5,a\ninvalid,,b\nok,2e-3,c\n")
    t = read_csv_table(path, "points", "--sweep", {"status": False, "iteration_time_s": True},
                       "a points.csv")
    assert t["iteration_time_s"].iloc[[0, 2]].tolist() == [1.5, 2e-3]
    assert t["iteration_time_s"].isna().tolist() == [False, True, False]
    assert list(t.columns) == ["status", "iteration_time_s", "label"]


@pytest.mark.parametrize(("faults", "path", "message", "value", "allowed"), [
    # an unknown key of a fault, named like another fault kind: the keys of its kind's model
    ([{"kind": "link_failure", "link": [0, 1], "time_s": 0.1, "duration_s": 0.2,
       "straggler": 1}], "faults.0.straggler", "unknown key", None,
     "time_s, ttf, duration_s, ttr, kind, link, links"),
    ([5], "faults.0", "wrong type: must be a mapping (key: value)", 5,
     "a mapping (key: value)"),
    ([{"kind": "straggler", "device": 0, "factor": "x", "time_s": 0}], "faults.0.factor",
     "wrong type: must be a number", "x", "a number"),
    ([{"kind": "link_failure", "links": "all", "ttf": {"dist": "exponential", "mean_s": "x"}}],
     "faults.0.ttf.mean_s", "wrong type: must be a number", "x", "a number"),
])
def test_errors_inside_unions_name_the_users_path(faults, path, message, value, allowed):
    """Faults and failure distributions are unions selected by ``kind`` / ``dist``: an error
    inside one is reported once, at the user's path (the union's tags left out), with the
    value given and what is allowed."""
    from twin.kernel.errors import ScenarioError
    from twin.scenario import load_scenario

    with pytest.raises(ScenarioError) as exc:
        load_scenario(_doc(faults=faults))
    (p,) = [p for p in exc.value.problems if p.path.startswith("faults")]
    assert (p.path, p.message, p.value) == (path, message, value)
    assert (p.allowed or None) == allowed


@pytest.mark.parametrize(("value", "allowed"), [
    (5, "a list or one of auto"),
    ([1, "x"], "a number at 1 or one of auto"),  # where in the list, for the list form
])
def test_a_union_of_a_list_and_a_word_reports_both_forms(value, allowed):
    """``power.dvfs.stage_frequency_mhz`` is a list of clocks or ``auto``: a value neither
    can take is reported once, with the value as given and what each form allows."""
    from twin.kernel.errors import ScenarioError
    from twin.scenario import load_scenario

    with pytest.raises(ScenarioError) as exc:
        load_scenario(_doc(power={"dvfs": {"stage_frequency_mhz": value}}))
    (p,) = exc.value.problems
    assert p.path == "power.dvfs.stage_frequency_mhz" and p.value == value
    assert p.allowed == allowed


@pytest.mark.parametrize(("seeds", "allowed"), [
    (0, "a number >= 1 or a list"),
    (10**9, "a number <= 100000 or a list"),
])
def test_a_union_of_a_bounded_number_and_a_list_is_one_problem(seeds, allowed):
    """A campaign's ``seeds`` is a count (1..100000) or a list: pydantic names the bounded
    member ``constrained-int``; a count out of range is one problem at ``seeds``, not a
    ``seeds.constrained-int`` range error beside a ``seeds`` type error."""
    from experiments.campaign import load_campaign
    from twin.kernel.errors import ScenarioError

    with pytest.raises(ScenarioError) as exc:
        load_campaign({"name": "c", "base": _doc(), "seeds": seeds})
    (p,) = exc.value.problems
    assert (p.path, p.value, p.allowed) == ("seeds", seeds, allowed)


@pytest.mark.parametrize("objectives", [["energy_j"], []])
def test_a_fixed_length_list_given_too_few_items_is_one_problem(objectives):
    """A sweep's ``objectives`` are exactly two metrics: one or none given is one problem at
    ``objectives`` with the list as given (not ``objectives.1: required key is missing``)."""
    from experiments.sweep import load_sweep
    from twin.kernel.errors import ScenarioError

    with pytest.raises(ScenarioError) as exc:
        load_sweep({"name": "s", "base": _doc(), "space": {"workload.micro_batch": [1, 2]},
                    "objectives": objectives})
    (p,) = exc.value.problems
    assert (p.path, p.message, p.value, p.allowed) == ("objectives", "too few items",
                                                       objectives, "2 items")


def test_a_key_named_like_a_type_is_still_the_users_key():
    """Pydantic names union members ``int``, ``float``, ... in its error locations, and those
    are left out of paths; an unknown key the user called ``float`` is kept (with the keys
    that are allowed there)."""
    from twin.kernel.errors import ScenarioError
    from twin.scenario import load_scenario

    with pytest.raises(ScenarioError) as exc:
        load_scenario(_doc(simulation={"float": 1}))
    (p,) = exc.value.problems
    assert (p.path, p.message) == ("simulation.float", "unknown key")
    assert "compute_jitter_cov" in p.allowed


def test_strict_models_refuse_non_finite_numbers_in_plain_float_fields():
    """``StrictModel`` refuses NaN and infinity in every float field, also one declared as a
    plain ``float`` without its own bound."""
    from pydantic import ValidationError

    from twin.kernel.schema import StrictModel

    class Plain(StrictModel):
        x: float = 0.0

    Plain(x=1.5)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValidationError, match="finite"):
            Plain(x=bad)


def test_non_utf8_and_binary_files(tmp_path, capsys):
    code, _, err = _cli(capsys, "check", _write(tmp_path, text=b"name: caf\xe9\n"))
    assert code == 2 and "not UTF-8" in err and "line 1" in err
    code, _, err = _cli(capsys, "check", _write(tmp_path, text=bytes(range(256)) * 4))
    assert code == 2


def test_input_paths_that_are_not_files(tmp_path, capsys):
    for path in ("n" * 300 + ".yaml", str(tmp_path), "/dev/null", "missing.yaml"):
        code, _, err = _cli(capsys, "check", path)
        assert code == 2 and "file" in err, path


def test_base_outside_file_is_not_echoed(tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:do-not-echo\n")
    camp = _write(tmp_path, {"name": "c", "base": str(secret), "seeds": 2}, name="c.yaml")
    code, _, err = _cli(capsys, "check", camp)
    assert code == 2 and "do-not-echo" not in err and "base" in err


# ----------------------------------------------------------------------------- domains
@pytest.mark.parametrize("updates, path", [
    ({"seed": 2**64}, "seed"),
    ({"seed": -1}, "seed"),
    ({"cluster__device__p_states": []}, "cluster.device.p_states"),
    ({"cluster__device__gemm_tile": [0, 0]}, "cluster.device.gemm_tile"),
    ({"cluster__device__kernel_overhead_us": 1e9}, "cluster.device.kernel_overhead_us"),
    ({"power__thermal__ambient_c": float("nan")}, "power.thermal.ambient_c"),
    ({"power__thermal__ambient_c": -300.0}, "power.thermal.ambient_c"),
    ({"power__thermal__initial_c": float("inf")}, "power.thermal.initial_c"),
    ({"faults": [{"kind": "cooling_failure", "devices": [0], "time_s": 0.0, "rise_k": 1e6}]},
     "faults.0.rise_k"),
    ({"workload__parallelism__dp": 10**30}, "workload.parallelism.dp"),
    ({"cluster__links_per_edge": 10**9}, "cluster.links_per_edge"),
])
def test_field_domains(tmp_path, capsys, updates, path):
    code, _, err = _cli(capsys, "check", _write(tmp_path, _doc(**updates)))
    assert code == 2 and path in err


def test_cooling_failure_cannot_heat_inlet_air_past_its_range(tmp_path, capsys):
    doc = _doc(power__thermal__ambient_c=30.0)
    doc["faults"] = [{"kind": "cooling_failure", "devices": [0], "time_s": 0.0, "rise_k": 90.0}]
    code, _, err = _cli(capsys, "check", _write(tmp_path, doc))
    assert code == 2 and "faults.0.rise_k: inlet air would reach 120 C" in err


def test_a_diverging_simulation_exits_2(tmp_path, capsys, monkeypatch):
    from twin.kernel.engine import Engine

    step = Engine.step

    def overflowing(self):  # as math.exp does in a thermal runaway
        if self.events_processed > 50:
            raise OverflowError("math range error")
        step(self)

    monkeypatch.setattr(Engine, "step", overflowing)
    code, _, err = _cli(capsys, "run", _write(tmp_path, _doc(workload__iterations=1)))
    assert code == 2 and "diverged" in err and not list(tmp_path.glob("q.h5*"))


def test_three_mistakes_in_three_sections_in_one_pass(tmp_path, capsys):
    doc = _doc(seed="x", cluster__links_per_edge=0, power__thermal__ambient_c=float("nan"))
    doc["workload"]["precision"] = "bf17"
    doc["workload"]["model"] = "llama9"  # a catalog name does not stop the others
    code, _, err = _cli(capsys, "check", _write(tmp_path, doc))
    assert code == 2 and "5 problem(s)" in err
    for path in ("seed", "cluster.links_per_edge", "power.thermal.ambient_c",
                 "workload.precision", "workload.model"):
        assert f"- {path}:" in err


def test_messages_have_no_python_type_names(tmp_path, capsys):
    doc = _doc(power__dvfs__stage_frequency_mhz="x")
    doc["faults"] = [{"kind": "straggler", "devices": 3.5, "factor": 2.0, "time_s": 0.0}]
    code, _, err = _cli(capsys, "check", _write(tmp_path, doc))
    assert code == 2 and "power.dvfs.stage_frequency_mhz: wrong value" in err
    for internal in ("constrained", "literal[", "list[", "Input should", "str'", "int'"):
        assert internal not in err, internal


# ----------------------------------------------------------------------------- budget
@pytest.mark.parametrize("updates, key", [
    ({"cluster__topology__shape": [100000, 100000]}, "max_devices"),
    ({"cluster__topology__shape": [2**31, 1], "workload__parallelism": {"dp": 2**31}},
     "max_memory_gb"),
    ({"workload__global_batch": 10**9}, "max_events"),
    ({"power__alerts__window_s": 1e-12}, "power.alerts.window_s"),
    ({"memory__model": "queue", "memory__dma__rate_gbps": 1e12}, "max_memory_gb"),
    ({"network__model": "packet", "network__packet_kib": 0.001}, "max_events"),
    ({"cluster__link": {"base": "nvlink4", "bandwidth_gbps": 1e-300}}, "max_sim_time_s"),
    ({"faults": [{"kind": "accelerator_failure", "devices": "all",
                  "ttf": {"dist": "exponential", "mean_s": 1e-6}}]}, "never finish"),
    ({"faults": [{"kind": "link_failure", "links": "all",
                  "ttf": {"dist": "exponential", "mean_s": 1e-6}}]}, "never finish"),
    # one device 1000x slower for the whole run: the others idle in ~1e7 thermal segments
    ({"faults": [{"kind": "straggler", "device": 3, "factor": 1000, "time_s": 0}],
      "power__thermal": {"enabled": True, "max_step_s": 1e-4}}, "max_events"),
    ({"faults": [{"kind": "hbm_degradation", "device": 3, "time_s": 0,
                  "tail": {"name": "deterministic", "mean": 1000}}],
      "power__thermal": {"enabled": True, "max_step_s": 1e-4}}, "max_events"),
])
def test_budget_refuses_before_building(tmp_path, capsys, monkeypatch, updates, key):
    import twin.build

    monkeypatch.setattr(twin.build, "build_topology", _must_not_run)
    code, _, err = _cli(capsys, "run", _write(tmp_path, _doc(**updates)))
    assert code == 2 and key in err and "allowed:" in err
    assert not list(tmp_path.glob("q.h5*"))


def _must_not_run(*args, **kwargs):
    raise AssertionError("built although the budget refuses the scenario")


def test_budget_admits_the_library_and_the_benchmark_layouts():
    from experiments.bench_e2e import scenario_dict
    from twin.budget import check_budget
    from twin.scenario import load_scenario

    for n in (4096, 16384):
        assert check_budget(load_scenario(scenario_dict(n))) == []
    for p in sorted((ROOT / "scenarios").glob("*.yaml")):
        raw = yaml.safe_load(p.read_text())
        if "cluster" in raw:
            assert check_budget(load_scenario(p)) == [], p.name


@pytest.mark.parametrize("overrides", [
    [], ["network.model=packet"], ["workload.parallelism={dp: 4, tp: 2, pp: 2}",
                                   "workload.global_batch=16", "simulation.symmetry=false"]])
def test_event_estimate_bounds_the_simulated_count(overrides):
    """Reference: the number of events the engine actually processed."""
    from twin.budget import estimate
    from twin.runner import run
    from twin.scenario import load_scenario

    scen = load_scenario(QUICK, ["trace.enabled=false", "workload.iterations=1", *overrides])
    summary = run(scen).summary
    est = estimate(scen)
    assert summary["events"] <= est.events <= 100 * summary["events"]
    assert est.sim_time_s <= summary["makespan_s"]  # a lower bound of the simulated time


def test_engine_budget():
    from twin.kernel.engine import Engine
    from twin.kernel.errors import BudgetExceeded

    def ticker(env):
        while True:
            yield env.timeout(1.0)

    for kwargs, key in (({"max_events": 10}, "max_events"), ({"max_time": 5.0}, "max_sim")):
        env = Engine(**kwargs)
        env.process(ticker(env))
        with pytest.raises(BudgetExceeded, match=key):
            env.run()
        assert env.events_processed <= kwargs.get("max_events", 10**9) + 1
        assert env.now <= kwargs.get("max_time", math.inf)


def test_run_stopped_by_its_event_budget_leaves_no_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("twin.budget.check_budget", lambda scen: [])  # let it start
    code, _, err = _cli(capsys, "run", _write(tmp_path, _doc()), "--set",
                        "simulation.limits.max_events=100")
    assert code == 2 and "simulation.limits.max_events" in err and "100 events" in err
    assert not list(tmp_path.glob("q.h5*"))  # neither the trace nor a partial file


def test_campaign_sizes_are_bounded(tmp_path, capsys):
    for extra in ({"seeds": 100_000_000}, {"bootstrap": 10**9}, {"seeds": 60_000}):
        doc = {"name": "c", "base": str(QUICK), **extra}
        code, _, err = _cli(capsys, "check", _write(tmp_path, doc, name="c.yaml"))
        assert code == 2 and ("seeds" in err or "bootstrap" in err)


# ----------------------------------------------------------------------------- check / --set
def test_check_detects_campaign_and_sweep_files(capsys):
    code, out, _ = _cli(capsys, "check", str(ROOT / "scenarios/campaign_faults.yaml"),
                        str(ROOT / "scenarios/sweep_small.yaml"), str(QUICK))
    assert code == 0 and "campaign campaign_faults" in out and "sweep sweep_small" in out


def test_set_null_restores_the_default(tmp_path, capsys):
    path = _write(tmp_path, _doc(power__cap_w=500.0))
    for key in ("power.cap_w", "simulation.symmetry", "workload.seq_len", "trace.path",
                "network", "cluster.links_per_edge"):
        code, _, err = _cli(capsys, "check", path, "--set", f"{key}=null")
        assert code == 0, (key, err)
    code, _, err = _cli(capsys, "check", path, "--set", "name=null")
    assert code == 2 and "name: required key is missing" in err


# ----------------------------------------------------------------------------- runs
@pytest.mark.parametrize("kind, shape", [("torus2d", [1, 1]), ("mesh2d", [1, 1]),
                                         ("ring", [1]), ("torus3d", [1, 1, 1]),
                                         ("dragonfly2d", [1, 1]), ("switched", [1, 1])])
def test_one_device_runs_on_every_topology(tmp_path, capsys, kind, shape):
    doc = _doc(cluster__topology={"kind": kind, "shape": shape},
               workload__parallelism={"dp": 1}, workload__global_batch=2,
               workload__iterations=1)
    code, out, _ = _cli(capsys, "run", _write(tmp_path, doc), "--json")
    s = json.loads(out)
    assert code == 0 and s["completed"] and s["devices"] == 1


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"bare {name} in JSON")
    return json.loads(text, parse_constant=refuse)


def test_links_all_down_at_start_reports_null_times(tmp_path, capsys):
    doc = _doc(cluster__topology={"kind": "torus2d", "shape": [2, 2]},
               workload__parallelism={"dp": 4}, workload__global_batch=8)
    doc["faults"] = [{"kind": "link_failure", "links": "all", "time_s": 0.0}]
    code, out, _ = _cli(capsys, "run", _write(tmp_path, doc), "--json")
    s = _strict(out)
    assert code == 0 and s["completed"] is False and s["iteration_time_s"] is None
    assert "iteration_time_s" in s["undefined_keys"]
    code, out, _ = _cli(capsys, "summary", "q.h5", "--json")
    assert code == 0 and _strict(out)["iteration_time_p99_s"] is None
    code, out, _ = _cli(capsys, "limits", "q.h5", "--json")
    assert code == 0 and _strict(out)


def test_stale_partial_of_a_killed_run_is_removed_and_reported(tmp_path, capsys):
    dead = 2**22 + 12345  # above the default pid_max of 2^22: no such process
    stale = tmp_path / f"q.h5.partial-{dead}"
    stale.write_bytes(b"half a trace")
    code, _, err = _cli(capsys, "run", _write(tmp_path, _doc()))
    assert code == 0 and not stale.exists() and "removed stale partial trace" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.h5", "s.yaml"]


# ----------------------------------------------------------------------------- outputs
def test_output_paths_are_checked_before_simulating(tmp_path, capsys, monkeypatch):
    import twin.runner

    monkeypatch.setattr(twin.runner, "simulate", _must_not_run)
    path = _write(tmp_path, _doc())
    (tmp_path / "adir").mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_text("precious\n")
    device = tmp_path / "device"  # a private character device like /dev/null
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:  # not root: a FIFO is not a regular file either
        os.mkfifo(device)
    cases = [("-o", "adir"), ("-o", "/proc/meshtwin.h5"), ("-o", str(device)),
             ("-o", "n" * 300 + ".h5"), ("-o", "notes.txt"), ("-o", ""),
             ("--plot", "adir"), ("--plot", "/proc/p.png"), ("--plot", "notes.txt"),
             ("--plot", "new.txt"), ("--plot", "new"),  # the suffix picks the plot's format
             ("--report", "adir"), ("--report", str(device)), ("--report", "notes.txt")]
    for flag, target in cases:
        code, _, err = _cli(capsys, "run", path, flag, target)
        assert code == 2 and flag in err, (flag, target, err)
    assert notes.read_text() == "precious\n"
    assert not stat.S_ISREG(os.stat(device).st_mode)


def test_export_and_report_outputs_are_checked_before_reading(tmp_path, capsys,
                                                              monkeypatch, good_trace):
    """``twin export -o`` and ``twin report -o`` refuse a folder, a device node and a foreign
    file before any work, and leave the foreign file alone."""
    import twin.export
    import twin.report

    monkeypatch.setattr(twin.export, "export_trace", _must_not_run)
    monkeypatch.setattr(twin.report, "build_report", _must_not_run)
    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "g.h5"
    trace.write_bytes(good_trace)
    (tmp_path / "adir").mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_text("precious\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for command in ("export", "report"):
        for target in ("adir", str(fifo), "notes.txt", "/proc/t.json"):
            code, _, err = _cli(capsys, command, str(trace), "-o", target)
            assert code == 2 and "-o" in err, (command, target, err)
    assert notes.read_text() == "precious\n"


def test_scenario_cannot_write_outside_the_working_directory(tmp_path, capsys, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for target in ("../../outside.h5", str(tmp_path / "abs.h5")):
        for command in ("run", "check"):
            code, _, err = _cli(capsys, command, _write(work, _doc(trace__path=target)))
            assert code == 2 and "outside the working directory" in err, command
    (work / "adir").mkdir()
    code, _, err = _cli(capsys, "check", _write(work, _doc(trace__path="adir")))
    assert code == 2 and "trace.path" in err and "folder" in err
    (work / "notes.h5").write_text("not a trace")  # `run --force` may overwrite it
    assert _cli(capsys, "check", _write(work, _doc(trace__path="notes.h5")))[0] == 0
    assert not (tmp_path / "outside.h5").exists() and not (tmp_path / "abs.h5").exists()


def test_force_overwrites_a_foreign_file(tmp_path, capsys):
    (tmp_path / "notes.h5").write_text("not a trace")
    path = _write(tmp_path, _doc(workload__iterations=1))
    assert _cli(capsys, "run", path, "-o", "notes.h5")[0] == 2
    assert _cli(capsys, "run", path, "-o", "notes.h5", "--force")[0] == 0
    assert _cli(capsys, "summary", "notes.h5")[0] == 0


# ----------------------------------------------------------------------------- traces
@pytest.fixture(scope="module")
def good_trace(tmp_path_factory) -> bytes:
    from twin.runner import run
    from twin.scenario import load_scenario

    out = tmp_path_factory.mktemp("good") / "g.h5"
    scen = load_scenario(QUICK, ["workload.iterations=1"])
    return Path(run(scen, trace_path=out).trace_path).read_bytes()


def _damaged(kind: str, good: bytes, path: Path) -> None:
    if kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "garbage":
        path.write_bytes(b"\x00" * 100)
    elif kind == "foreign":
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=[1, 2, 3])
    else:
        path.write_bytes(good)
        with h5py.File(path, "a") as f:
            if kind == "incomplete":
                f.attrs["complete"] = False
            elif kind == "summary":
                f.attrs["summary"] = "{not json"
            elif kind == "column":
                del f["ops"]["t_start"]
            elif kind == "scenario":  # the resolved scenario no longer YAML
                f.attrs["scenario"] = "workload: {model: [unclosed"
            elif kind == "scenario-list":  # YAML, but not a mapping
                f.attrs["scenario"] = "- 1\n- 2\n"
            elif kind == "short-column":  # one column a row short of the others
                ds = f["ops"]["t_start"]
                ds.resize((ds.shape[0] - 1,))
            elif kind == "units":
                f["links"].attrs["units"] = "["
            elif kind in ("code-low", "code-high"):  # a category code outside its list
                ds = f["ops"]["kind"]
                n = len(json.loads(f["ops"].attrs["categories/kind"]))
                ds[0] = -2 if kind == "code-low" else n  # -1 is "missing"; each side's first bad
            elif kind == "no-schema":  # twin_version alone: an older meshtwin trace
                del f.attrs["schema_version"]


@pytest.mark.parametrize("kind, words", [
    ("truncated", "corrupted or truncated"), ("garbage", "not a meshtwin trace"),
    ("foreign", "not a meshtwin trace"), ("incomplete", "trace incomplete"),
    ("summary", "summary is corrupted"), ("column", "dataset ops/t_start is missing"),
    ("short-column", "table ops is corrupted (columns of different lengths)"),
    ("scenario", "trace attribute scenario is corrupted (not a YAML mapping)"),
    ("scenario-list", "trace attribute scenario is corrupted (not a YAML mapping)"),
    ("units", "table links is corrupted"),
    ("code-low", "dataset ops/kind is corrupted (codes outside its categories)"),
    ("code-high", "dataset ops/kind is corrupted (codes outside its categories)"),
    ("no-schema", "trace schema None is not one this version of meshtwin reads")])
def test_damaged_traces_exit_2_with_what_is_wrong(tmp_path, capsys, good_trace, kind, words):
    path = tmp_path / "t.h5"
    _damaged(kind, good_trace, path)
    for cmd in (["summary"], ["limits"], ["summary", "--json"], ["limits", "--json"]):
        code, _, err = _cli(capsys, cmd[0], str(path), *cmd[1:])
        if cmd[0] == "summary" and kind in ("column", "short-column", "units", "code-low",
                                            "code-high"):
            assert code == 0  # summary needs neither table
        else:
            assert code == 2 and words in err, (cmd, err)


@pytest.mark.parametrize("table", ["ops", "devices"])
def test_a_table_claiming_more_rows_than_its_bytes_can_hold_is_refused(tmp_path, capsys,
                                                                      good_trace, table):
    """A damaged header can make a column claim 10^14 rows in a few hundred stored bytes
    (the fuzzer, seed 44: `twin report` then asked NumPy for 836 TiB). No compression packs
    rows that tightly (DEFLATE at most ~1032:1), so the column is refused as corrupted before
    it is read, by the trace check and by every command reading the table (report reads the
    devices table after the check)."""
    path = tmp_path / "t.h5"
    path.write_bytes(good_trace)
    with h5py.File(path, "a") as f:
        for data in f[table].values():  # every column: the lengths still agree
            data.resize((10**14,))
    commands = [["report"]]
    if table == "ops":  # (export and limits do not read the devices table)
        commands += [["limits"], ["export", "-o", str(tmp_path / "t.json")]]
    for cmd in commands:
        code, _, err = _cli(capsys, cmd[0], str(path), *cmd[1:])
        assert code == 2 and f"dataset {table}/" in err and "more than any compression" in err, (
            cmd, err)


def test_a_column_of_eight_byte_rows_claiming_a_few_times_its_bound_is_refused(tmp_path):
    """The bound is on bytes, rows x row size: 10^6 float64 rows (8 MB) in the few hundred
    bytes of 100 stored values exceed 1100 x stored + 1 MiB; 10^4 rows (80 kB) do not."""
    import numpy as np

    from twin.kernel.trace import MAX_COMPRESSION, _implausible

    with h5py.File(tmp_path / "c.h5", "w") as f:
        ds = f.create_dataset("x", shape=(0,), maxshape=(None,), dtype="f8", chunks=(1024,),
                              compression="gzip")
        ds.resize((100,))
        ds[:] = np.arange(100.0)
        stored = ds.id.get_storage_size()
        assert 1 << 20 < 10**6 * 8 - MAX_COMPRESSION * stored  # 8 MB past the bound
        ds.resize((10**4,))
        assert _implausible(ds) is None
        ds.resize((10**6,))
        assert "claims 1000000 rows (8000000 bytes)" in _implausible(ds)


def test_pid_alive_tells_a_live_process_from_a_reaped_one():
    import subprocess
    import sys

    from twin.kernel.trace import pid_alive

    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not pid_alive(child.pid)


def test_the_trace_check_gets_a_second_per_20_mb(tmp_path, good_trace, monkeypatch):
    """The time limit of the forked check: CHECK_TIMEOUT_S plus 1 s per 20 MB of file (a
    sparse 200 MB tail: 10 s more)."""
    import twin.kernel.trace as tr

    path = tmp_path / "t.h5"
    path.write_bytes(good_trace)
    with open(path, "r+b") as fh:
        fh.truncate(200_000_000)
    limits, wait = [], tr.wait_child

    def record(pid, timeout_s):
        limits.append(timeout_s)
        return wait(pid, 60.0)

    monkeypatch.setattr(tr, "wait_child", record)
    try:
        tr.open_trace(path)
    except tr.TraceError:
        pass  # (the check's verdict on the padded file does not matter here)
    assert limits == [pytest.approx(tr.CHECK_TIMEOUT_S + 10.0)]


@pytest.mark.parametrize("compression, opts", [("gzip", 1), ("lzf", None), ("none", None)])
def test_each_trace_compression_writes_a_trace_that_reads_back(tmp_path, compression, opts):
    """gzip at level 1 with byte shuffle (fast, and shuffle packs the float columns), LZF
    (no level to give), or none; the tables read back the same."""
    from twin.runner import run
    from twin.scenario import load_scenario
    from twin.trace import read_table

    scen = load_scenario(QUICK, ["workload.iterations=1", f"trace.compression={compression}"])
    res = run(scen, trace_path=tmp_path / "t.h5")
    with h5py.File(res.trace_path, "r") as f:
        ds = f["ops"]["t_start"]
        assert ds.compression == (None if compression == "none" else compression)
        assert ds.compression_opts == opts and ds.shuffle == (compression != "none")
    ops = read_table(res.trace_path, "ops")
    assert len(ops) > 0 and (ops["t_end"] >= ops["t_start"]).all()


def test_a_column_whose_storage_cannot_be_read_is_corrupted():
    """HDF5 may fail to report a damaged column's stored size (fuzzer, seed 44: a
    RuntimeError 'Unable to get storage size' from `twin report`): the column is corrupted,
    said in words, not an exception out of the size check."""
    import numpy as np

    from twin.kernel.trace import _implausible

    class _Id:
        @staticmethod
        def get_storage_size():
            raise RuntimeError("Unable to get storage size (attempting I/O in temporary file "
                               "space)")

    class _Column:
        shape, ndim, dtype, id = (10,), 1, np.dtype("int32"), _Id()

    assert _implausible(_Column()).startswith("its storage cannot be read: Unable to get")


@pytest.mark.parametrize("units", [None, "{}"])
def test_a_table_without_units_is_checked_column_by_column(tmp_path, capsys, good_trace,
                                                           units):
    """A table whose units attribute is lost (or names no column) is read column by column
    (every member), and the trace check reads the same columns: a damaged compressed chunk is
    exit 2 naming the dataset, not an HDF5 OSError taken for an output failure (exit 1;
    found by the fuzzer, seed 19)."""
    path = tmp_path / "t.h5"
    path.write_bytes(good_trace)
    with h5py.File(path, "a") as f:
        g = f["ops"]
        if units is None:
            del g.attrs["units"]
        else:
            g.attrs["units"] = units
        chunk = g["t_end"].id.get_chunk_info(0)
    data = bytearray(path.read_bytes())
    data[chunk.byte_offset:chunk.byte_offset + chunk.size] = bytes(chunk.size)
    path.write_bytes(bytes(data))
    for cmd in (["limits"], ["limits", "--json"]):
        code, _, err = _cli(capsys, *cmd[:1], str(path), *cmd[1:])
        assert code == 2 and "dataset ops/t_end is corrupted" in err, (cmd, err)


def test_a_trace_check_that_never_ends_is_cut_off(tmp_path, good_trace, monkeypatch):
    """Some corrupted files make the HDF5 library loop; the check runs in a child that is
    killed at its time limit (here the loop is simulated)."""
    import time

    import twin.kernel.trace as tr

    path = tmp_path / "t.h5"
    path.write_bytes(good_trace)
    monkeypatch.setattr(tr, "_validate", lambda *a: time.sleep(60))
    monkeypatch.setattr(tr, "CHECK_TIMEOUT_S", 0.5)
    with pytest.raises(tr.TraceError, match="did not finish"):
        tr.open_trace(path)


def test_a_trace_without_the_version_of_the_twin_that_wrote_it_still_opens(tmp_path,
                                                                           good_trace):
    """Either trace attribute marks a meshtwin trace: ``schema_version`` alone is enough."""
    from twin.kernel.trace import open_trace

    path = tmp_path / "t.h5"
    path.write_bytes(good_trace)
    with h5py.File(path, "a") as f:
        del f.attrs["twin_version"]
    assert open_trace(path, need=("ops",))["complete"]


def test_tables_written_in_blocks_read_back_whole(tmp_path):
    """Rows buffered in blocks of 2, then whole columns, then more rows: the table reads back
    every row in order, categories decoded, and the file checks out."""
    from twin.kernel.trace import TraceWriter, open_trace, read_table

    path = tmp_path / "b.h5"
    with TraceWriter(path, block_rows=2) as w:
        t = w.table("t", {"x": "float64", "name": "category"})
        for i in range(5):
            t.append(float(i), f"n{i % 2}")
        t.extend({"x": [5.0, 6.0], "name": ["n2", "n0"]})
        t.append(7.0, "n1")
        w.finish({"summary": {}})
    got = read_table(path, "t")
    assert got["x"].tolist() == [float(i) for i in range(8)]
    assert got["name"].astype(str).tolist() == ["n0", "n1", "n0", "n1", "n0", "n2", "n0", "n1"]
    assert open_trace(path, need=("t",), verify=True)["complete"]


def test_checksum_detects_changed_data(tmp_path, good_trace):
    from twin.kernel.errors import TraceError
    from twin.kernel.trace import open_trace

    path = tmp_path / "t.h5"
    path.write_bytes(good_trace)
    assert open_trace(path, verify=True)["complete"]
    with h5py.File(path, "a") as f:
        f["ops"]["t_end"][0] += 1.0
    open_trace(path)  # structurally fine ...
    with pytest.raises(TraceError, match="checksum mismatch"):
        open_trace(path, verify=True)  # ... but not the data written


def test_resume_reruns_a_corrupted_kept_trace(tmp_path):
    from experiments.campaign import load_campaign, run_campaign

    camp = load_campaign({"name": "c", "base": str(QUICK), "seeds": 2, "baseline": False,
                          "overrides": {"workload.iterations": 1}, "bootstrap": 100})
    out = tmp_path / "camp"
    first = run_campaign(camp, out, progress=False, plots=False)
    assert first.ran == 2
    trace = sorted((out / "traces").glob("*.h5"))[0]
    with h5py.File(trace, "a") as f:
        f["ops"]["flops"][0] = -1.0  # 'complete' stays set
    again = run_campaign(camp, out, resume=True, progress=False, plots=False)
    assert again.ran == 1 and again.skipped == 1


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    from twin.outputs import atomic_write

    target = tmp_path / "points.csv"

    def half(tmp: Path) -> None:
        tmp.write_text("a,b\n1,2\n")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, name", [
    (["export", "{trace}", "-o", "{out}/t.json"], "t.json"),
    (["export", "{trace}", "-o", "{out}/t.pftrace"], "t.pftrace"),
    (["report", "{trace}", "-o", "{out}/r.html"], "r.html"),
    (["validate", "--only", "flops", "--csv", "{out}/v.csv"], "v.csv"),
])
def test_single_file_outputs_are_complete_or_absent(tmp_path, monkeypatch, good_trace, argv,
                                                    name):
    """Timelines, HTML reports and the validation table are written beside their path and
    renamed into place (twin.outputs.atomic_write), into folders made for them: a command
    stopped while writing leaves neither the file nor its temporary copy; one that is not
    stopped writes it into a folder that did not exist."""
    import twin.outputs

    trace = tmp_path / "q.h5"
    trace.write_bytes(good_trace)
    args = [a.format(trace=trace, out=tmp_path / "new" / "deeper") for a in argv]

    def stopped(*_a):
        raise KeyboardInterrupt

    monkeypatch.setattr(twin.outputs.os, "replace", stopped)
    assert main(args) not in (0, 2)  # ("interrupted")
    assert not any(p.is_file() for p in (tmp_path / "new").rglob("*"))
    monkeypatch.undo()
    if name.endswith(".html"):  # (written whole by tests/test_report.py; a render is seconds)
        return
    assert main(args) == 0
    assert [p.name for p in (tmp_path / "new").rglob("*") if p.is_file()] == [name]


def test_cli_json_is_strict():
    from twin.cli import to_json

    text = to_json({"a": math.nan, "b": [math.inf, 1.0], "c": {"d": -math.inf}})
    assert _strict(text) == {"a": None, "b": [None, 1.0], "c": {"d": None}}


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_no_partial_trace(tmp_path):
    """Kill ``twin run`` at 12 moments from start-up to the end: the trace path holds either
    nothing or a complete, checksum-valid trace, and the next run leaves no partial file."""
    import signal
    import subprocess
    import sys
    import time

    from twin.kernel.trace import open_trace

    out = tmp_path / "k.h5"
    cmd = [sys.executable, "-m", "twin.cli", "run", str(QUICK), "-o", str(out), "--set",
           "workload.iterations=4"]
    for delay in [0.25 * i for i in range(1, 13)]:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if out.exists():
            assert open_trace(out, verify=True)["complete"]
            out.unlink()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert open_trace(out, verify=True)["complete"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.h5"], done.stderr


def test_a_trace_argument_that_is_no_file_says_what_is_there(tmp_path, capsys):
    """``twin summary`` / ``limits`` / ``report`` / ``export`` on a missing path, a folder or a
    device: exit 2 naming ``trace`` and what is there (a device used to be reported as "not
    found"; ``report`` and ``export`` called a folder "not found")."""
    (tmp_path / "adir").mkdir()
    out = str(tmp_path / "t.json")
    for command in (["summary"], ["limits"], ["report"], ["export", "-o", out]):
        for target, why in (("missing.h5", "trace file not found"), ("adir", "is a folder"),
                            ("/dev/null", "not a regular file")):
            code, _, err = _cli(capsys, command[0], target, *command[1:])
            assert code == 2 and "trace:" in err and why in err, (command, target, err)


@pytest.mark.parametrize("command, spec", [("campaign", "campaign_faults.yaml"),
                                           ("pareto", "sweep_small.yaml"),
                                           ("contention", "contention_map.yaml")])
def test_a_worker_count_out_of_range_is_refused_before_dask_starts(tmp_path, capsys, command,
                                                                   spec):
    """``--workers`` below 0, or above four processes per core (a count by the thousand
    would start that many interpreters), exits 2 naming the flag and the range; nothing
    is written."""
    most = 4 * (os.cpu_count() or 1)
    for workers in (-1, most + 1, 10**20):
        code, _, err = _cli(capsys, command, str(ROOT / "scenarios" / spec),
                            "-o", str(tmp_path / "out"), "--workers", str(workers))
        assert code == 2 and "--workers" in err and f"0 (no Dask) .. {most}" in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _mapping_paths(node, prefix=()):
    """Every path to a mapping in a parsed YAML document (the root included)."""
    if isinstance(node, dict):
        yield prefix
        for k, v in node.items():
            yield from _mapping_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _mapping_paths(v, (*prefix, i))


def test_an_unknown_key_anywhere_in_a_library_scenario_lists_the_keys_allowed_there():
    """For every mapping of every library scenario (cluster, device and link specs, power
    sections, faults of each kind and their distributions, memory models, ...), an unknown
    key added there is one problem at its path whose allowed keys include every key the
    scenario validly gives in that mapping (the model's own keys, not its parent's, not
    none)."""
    from twin.kernel.errors import ScenarioError
    from twin.scenario import load_scenario

    checked = 0
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if "cluster" not in doc:
            continue  # campaign, sweep and map files
        for where in _mapping_paths(doc):
            bad = yaml.safe_load(path.read_text())
            node = bad
            for k in where:
                node = node[k]
            node["bogus_key"] = 1
            with pytest.raises(ScenarioError) as exc:
                load_scenario(bad)
            dotted = ".".join(str(k) for k in (*where, "bogus_key"))
            parent = dotted.rsplit(".", 1)[0] if where else ""
            found = [p for p in exc.value.problems if p.path == dotted]
            if not found:  # a distribution's own check (an HBM tail): at the mapping, naming
                (p,) = [p for p in exc.value.problems  # the key and its parameters
                        if p.path == parent and "bogus_key" in p.message]
                assert p.allowed or "allowed: " in p.message, (path.name, dotted)
                continue
            (p,) = found
            allowed = p.allowed.split(", ")
            assert p.message == "unknown key" and set(node) - {"bogus_key"} <= set(allowed), (
                path.name, dotted, p.allowed)
            checked += 1
    assert checked > 100


def test_an_unknown_key_in_campaign_sweep_and_map_files_lists_the_keys_allowed_there(
        monkeypatch):
    """The multi-run files too: a contention map's configuration (a mapping of named
    configurations; its keys were not found before), a sweep's NSGA-II section and its
    parallelism space, a campaign's top level."""
    from experiments.campaign import load_campaign
    from experiments.contention import load_map
    from experiments.sweep import load_sweep
    from twin.kernel.errors import ScenarioError

    monkeypatch.chdir(ROOT / "scenarios")  # the files' bases are relative to them

    def allowed(load, name, edit):
        doc = yaml.safe_load((ROOT / "scenarios" / name).read_text())
        edit(doc)
        with pytest.raises(ScenarioError) as exc:
            load(doc)
        return {p.path: p.allowed for p in exc.value.problems if p.message == "unknown key"}

    got = allowed(load_map, "contention_map.yaml",
                  lambda d: d["configurations"]["bandwidth"].update(bogus=1))
    assert got == {"configurations.bandwidth.bogus": "base, set"}
    got = allowed(load_sweep, "sweep_small.yaml", lambda d: d.update(nsga2={"bogus": 1}))
    assert got == {"nsga2.bogus": "pop_size, generations, seed, max_evaluations, patience"}
    got = allowed(load_sweep, "sweep_small.yaml",
                  lambda d: d["space"].update(parallelism={"dp": [1], "bogus": [2]}))
    assert got == {"space.parallelism.bogus": "dp, tp, pp"}
    got = allowed(load_campaign, "campaign_faults.yaml", lambda d: d.update(bogus=1))
    assert got["bogus"].startswith("name, description, base, seeds, seed_start, overrides")
