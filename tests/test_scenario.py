"""Scenario loading: every bad input is reported with its field path, exit code 2."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, scenario_dict
from twin.cli import main
from twin.kernel.errors import InfeasibleConfig, ScenarioError
from twin.scenario import load_scenario, parse_override


def _problems(raw, overrides=None):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(raw, overrides)
    return exc.value.problems


def _paths(raw, overrides=None):
    return [p.path for p in _problems(raw, overrides)]


def test_valid_scenario_resolves_catalog_names():
    s = load_scenario(scenario_dict())
    assert s.cluster.device.name == "h100-sxm"
    assert s.cluster.device.peak_tflops["bf16"] == 989
    assert "cluster.device.peak_tflops" in s.sources
    assert s.workload.model.hidden == 2048


def test_unknown_key_named_with_allowed_keys():
    raw = scenario_dict(workload__paralelism={"dp": 8})
    (p,) = _problems(raw)
    assert p.path == "workload.paralelism" and "unknown key" in p.message
    assert "parallelism" in p.allowed


def test_wrong_type():
    (p,) = _problems(scenario_dict(workload__global_batch="many"))
    assert p.path == "workload.global_batch" and "integer" in p.message


@pytest.mark.parametrize(("key", "value", "path", "wants"), [
    ("workload__iterations", True, "workload.iterations", "integer"),  # lax mode: 1 iteration
    ("seed", False, "seed", "integer"),
    ("cluster__links_per_edge", True, "cluster.links_per_edge", "integer"),
    ("cluster__topology", {"kind": "torus2d", "shape": [4, True]},
     "cluster.topology.shape.1", "integer"),
    ("workload__grad_bucket_mb", True, "workload.grad_bucket_mb", "number"),
    ("overlap", {"tp_comm": 1}, "overlap.tp_comm", "true or false"),
    ("simulation__exact", "no", "simulation.exact", "true or false"),
    ("workload__sequence_parallel", 0.0, "workload.sequence_parallel", "true or false"),
])
def test_booleans_and_numbers_are_not_read_as_each_other(key, value, path, wants):
    (p,) = _problems(scenario_dict(**{key: value}))
    assert p.path == path and "wrong type" in p.message and wants in p.allowed
    assert p.value is not None  # the value given is named


def test_a_number_that_yaml_reads_as_text_still_reads_as_a_number():
    # PyYAML (YAML 1.1) reads 1e6 without a dot as the text "1e6"
    assert yaml.safe_load("x: 1e6")["x"] == "1e6"
    s = load_scenario(scenario_dict(workload__grad_bucket_mb="1e6", overlap={"tp_comm": True}))
    assert s.workload.grad_bucket_mb == 1e6 and s.overlap.tp_comm is True


def test_seed_bounds_and_ring_substeps_beside_their_ring_model():
    """The seed goes up to 2^63 - 1, the largest signed 64-bit integer (the bound of every
    integer in a scenario), and no further; barriers per chunk belong to the step ring model
    only."""
    assert load_scenario(scenario_dict(seed=2**63 - 1)).seed == 2**63 - 1
    (p,) = _problems(scenario_dict(seed=2**63))
    assert p.path == "seed"
    assert load_scenario(scenario_dict(network={"ring_model": "step", "ring_substeps": 4})
                         ).network.ring_substeps == 4
    for model in ("lockstep", "auto"):
        (p,) = _problems(scenario_dict(network={"ring_model": model, "ring_substeps": 4}))
        assert "ring_substeps" in p.message and "ring_model: step" in p.message


def test_an_explicit_algorithm_is_checked_against_the_groups_it_runs_on():
    """torus2d fits the data-parallel group of all eight devices of a 4 x 2 torus; with
    hybrid sharding in groups of 2 the data-parallel algorithm runs on the shard groups too
    (pairs, not grids)."""
    ok = load_scenario(scenario_dict(network={"dp_algorithm": "torus2d"}))
    assert ok.network.dp_algorithm == "torus2d"
    (p,) = _problems(scenario_dict(network={"dp_algorithm": "torus2d"}, workload__sharding={
        "strategy": "hybrid_shard", "group": 2}))
    assert p.path == "network.dp_algorithm" and "shard groups" in p.message
    # the TP algorithm runs on the TP groups only (2 x 4 blocks of a 4 x 4 torus), not on
    # the shard groups of hybrid sharding (pairs)
    tp = load_scenario(scenario_dict(
        network={"tp_algorithm": "torus2d"}, cluster__topology={"kind": "torus2d",
                                                                "shape": [4, 4]},
        workload__parallelism={"dp": 2, "tp": 8, "pp": 1},
        workload__sharding={"strategy": "hybrid_shard", "group": 2}))
    assert tp.network.tp_algorithm == "torus2d"


def test_unknown_catalog_name_lists_entries():
    (p,) = _problems(scenario_dict(cluster__device="h900"))
    assert p.path == "cluster.device" and "h100-sxm" in p.allowed


@pytest.mark.parametrize("bw", [0, -5])
def test_non_positive_bandwidth(bw):
    paths = _paths(scenario_dict(), [f"cluster.link.bandwidth_gbps={bw}"])
    assert paths == ["cluster.link.bandwidth_gbps"]


def test_parallelism_must_match_devices():
    (p,) = _problems(scenario_dict(workload__parallelism={"dp": 4, "tp": 1, "pp": 1}))
    assert p.path == "workload.parallelism" and "8 devices" in p.message


def test_shape_must_match_kind():
    (p,) = _problems(scenario_dict(cluster__topology={"kind": "torus2d", "shape": [2, 2, 2]}))
    assert p.path == "cluster.topology" and "shape of 2" in p.message


def test_every_problem_reported_at_once():
    raw = scenario_dict(workload__global_batch=0, workload__precision="fp64",
                        cluster__links_per_edge=0)
    paths = _paths(raw)
    assert {"workload.global_batch", "workload.precision", "cluster.links_per_edge"} <= set(paths)


def test_precision_must_exist_on_device():
    (p,) = _problems(scenario_dict(cluster__device="a100-sxm-80gb", workload__precision="fp8"))
    assert p.path == "workload.precision" and "bf16" in p.allowed


def test_out_of_hbm_is_infeasible():
    raw = scenario_dict(workload__model="gpt3-175b", workload__seq_len=2048)
    with pytest.raises(InfeasibleConfig) as exc:
        load_scenario(raw)
    assert "out of HBM" in exc.value.problems[0].message


def test_fault_on_missing_edge():
    raw = scenario_dict(faults=[{"kind": "link_down", "time_s": 0.1, "link": [0, 5]}])
    assert _paths(raw) == ["faults.0.link"]


def test_missing_file_and_malformed_yaml(tmp_path):
    (p,) = _problems(tmp_path / "nope.yaml")
    assert "not found" in p.message
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncluster: {topology: [\n")
    (p,) = _problems(bad)
    assert "malformed YAML at line" in p.message


def test_overrides_use_schema_types():
    s = load_scenario(scenario_dict(), ["workload.parallelism.dp=4",
                                        "cluster.topology.shape=[2, 2]", "seed=11",
                                        "cluster.device.tdp_w=500"])
    assert s.workload.parallelism.dp == 4 and s.cluster.topology.shape == (2, 2)
    assert s.seed == 11 and s.cluster.device.tdp_w == 500
    assert "cluster.device.tdp_w" not in s.sources  # the user replaced the catalog value
    assert "cluster.device.peak_tflops" in s.sources  # the others are still the catalog's
    s2 = load_scenario(scenario_dict(), ["cluster.device=a100-sxm-80gb"])
    assert s2.cluster.device.name == "a100-sxm-80gb"
    # a catalog name given by one override and a value inside it by the next
    s3 = load_scenario(scenario_dict(), ["cluster.device=a100-sxm-80gb",
                                         "cluster.device.tdp_w=300"])
    assert s3.cluster.device.name == "a100-sxm-80gb" and s3.cluster.device.tdp_w == 300
    assert s3.cluster.device.peak_tflops == s2.cluster.device.peak_tflops
    assert "cluster.device.tdp_w" not in s3.sources
    assert s3.sources["cluster.device.peak_tflops"] == s2.sources["cluster.device.peak_tflops"]


def test_bad_override_syntax_and_unknown_override_key():
    assert _paths(scenario_dict(), ["seed"]) == ["--set"]
    assert _paths(scenario_dict(), ["workload.nope=3"]) == ["workload.nope"]


def test_a_dotted_key_with_an_empty_part_is_refused_from_every_door():
    """A key with an empty part (``a..b``, ``workload.``, ``''``) used to be walked as if
    ``''`` were a key, so a campaign's grid or a sweep's ``set`` answered with an unknown key
    elsewhere (``a``) or the file itself; it is refused as the key it is."""
    for key in ("", "workload..micro_batch", "workload.", ".seed"):
        with pytest.raises(ScenarioError) as exc:
            load_scenario(scenario_dict(), {key: 1})
        (p,) = exc.value.problems
        assert p.message.startswith("not a dotted scenario key") and p.value == key
    assert _paths(scenario_dict(), ["workload..micro_batch=1"]) == ["--set"]


def test_a_tagged_mapping_without_its_tag_lists_the_tags_allowed():
    """pydantic names no tags when the tag is missing; the problem lists them from the
    union in the schema, a fault's kinds and a failure process's distributions."""
    raw = scenario_dict(faults=[{}, {"kind": "straggler", "factor": 2, "ttf": {}}])
    with pytest.raises(ScenarioError) as exc:
        load_scenario(raw)
    wants = {p.path: p.allowed for p in exc.value.problems}
    assert wants["faults.0"] == ("kind: one of link_down, link_up, link_failure, nic_failure, "
                                 "accelerator_failure, straggler, hbm_degradation, "
                                 "cooling_failure")
    assert wants["faults.1.ttf"] == "dist: one of exponential, weibull, lognormal, fixed"


def test_the_schema_walk_follows_tuples_by_position_and_stops_where_the_document_does():
    """``annotation_at`` (the walk behind unknown-key answers and tag lists): a fixed tuple's
    item by its position, a string key into a list leads nowhere, and a location past the end
    of the document's list keeps the type without the document's value."""
    from pydantic import BaseModel

    from twin.kernel.schema import annotation_at
    from twin.scenario import Scenario

    class Sub(BaseModel):
        x: int = 0

    class Holder(BaseModel):
        pair: tuple[int, Sub]

    assert annotation_at(Holder, ["pair", 1]) == (Sub, None)
    assert annotation_at(Holder, ["pair", 0]) == (int, None)
    assert annotation_at(Scenario, ["faults", "kind"]) is None
    ann, node = annotation_at(Scenario, ["faults", 5], {"faults": [{"kind": "straggler"}]})
    assert node is None and ann is not None


def test_a_die_temperature_above_250_c_is_refused():
    """Junctions are rated to ~150-175 C; a scenario may give up to 250 C (MAX_DIE_C), and
    is refused beyond it by the schema, before any power rule."""
    with pytest.raises(ScenarioError, match=r"temp_limit_c: out of range.*<= 250"):
        load_scenario(scenario_dict(), ["cluster.device.temp_limit_c=250.5"])


def test_device_with_base_and_overrides():
    s = load_scenario(scenario_dict(cluster__device={"base": "h100-sxm", "tdp_w": 600}))
    assert s.cluster.device.tdp_w == 600 and s.cluster.device.hbm_gb == 80


def test_resolved_yaml_roundtrip():
    s = load_scenario(scenario_dict())
    again = load_scenario(yaml.safe_load(s.to_yaml()))
    assert again.to_dict() == s.to_dict()


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(["seed", "workload.global_batch", "workload.micro_batch",
                            "cluster.links_per_edge", "workload.precision",
                            "cluster.topology.shape", "network.model", "workload.iterations"]),
       value=st.one_of(st.integers(-5, 100), st.text(max_size=6), st.floats(allow_nan=True),
                       st.lists(st.integers(-2, 9), max_size=3), st.none(), st.booleans()))
def test_any_override_gives_scenario_or_field_error(key, value):
    """Property: an arbitrary override yields a valid scenario or a ScenarioError that names
    a field, never another exception."""
    try:
        load_scenario(scenario_dict(), {key: value})
    except ScenarioError as exc:
        assert exc.problems
        assert all(isinstance(p.path, str) for p in exc.problems)


def test_compute_jitter_cov_is_bounded_and_the_bound_runs(tmp_path, capsys):
    """``simulation.compute_jitter_cov`` above 10 is a field error (at 1e308 sigma^2 =
    log(1 + cov^2) overflowed and the run died in a traceback); at 10 a run finishes with a
    finite iteration time."""
    path = _write(tmp_path, scenario_dict())
    assert main(["run", path, "--set", "simulation.compute_jitter_cov=1e308", "-o",
                 str(tmp_path / "bad.h5")]) == 2
    err = capsys.readouterr().err
    assert "simulation.compute_jitter_cov" in err and "<= 10" in err
    assert not (tmp_path / "bad.h5").exists()
    from twin.api import run

    res = run(load_scenario(path, {"simulation.compute_jitter_cov": 10.0}),
              trace_path=tmp_path / "ok.h5")
    assert math.isfinite(res.summary["iteration_time_s"]) and res.summary["iteration_time_s"] > 0


@given(st.from_regex(r"[a-z_]{1,8}(\.[a-z_]{1,8}){0,3}", fullmatch=True),
       st.one_of(st.integers(), st.lists(st.integers(), max_size=3), st.sampled_from(
           ["fp8", "true", "1.5"])))
def test_parse_override_roundtrip(key, value):
    text = f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...')}"
    k, v = parse_override(text.strip())
    assert k == key
    assert v == yaml.safe_load(yaml.safe_dump(value))


# ------------------------------------------------------------------------------- CLI
def _write(tmp_path, raw, name="s.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw) if not isinstance(raw, str) else raw)
    return str(p)


@pytest.mark.parametrize("raw, field", [
    (scenario_dict(workload__paralelism={}), "workload.paralelism"),
    (scenario_dict(cluster__device="h900"), "cluster.device"),
    (scenario_dict(workload__parallelism={"dp": 3}), "workload.parallelism"),
    ("name: [unclosed\n", "malformed YAML"),
])
@pytest.mark.parametrize("command", ["check", "run"])
def test_cli_bad_input_exit_2(tmp_path, capsys, raw, field, command):
    code = main([command, _write(tmp_path, raw)])
    err = capsys.readouterr().err
    assert code == 2
    assert field in err and "Traceback" not in err


def test_cli_missing_file_exit_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["summary", str(tmp_path / "missing.h5")]) == 2


def test_cli_bad_set_exit_2(tmp_path, capsys):
    code = main(["run", _write(tmp_path, scenario_dict()), "--set",
                 "cluster.link.bandwidth_gbps=-1"])
    assert code == 2 and "cluster.link.bandwidth_gbps" in capsys.readouterr().err


def test_cli_subprocess_no_traceback(tmp_path):
    path = _write(tmp_path, scenario_dict(workload__parallelism={"dp": 5}))
    proc = subprocess.run([sys.executable, "-m", "twin.cli", "run", path],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "workload.parallelism" in proc.stderr and "Traceback" not in proc.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """``twin check FILE | head -1``: once the reader has closed the pipe, the next write
    fails; the command stops with the shell's SIGPIPE code and no traceback (the trace of a
    run is written before its summary is printed)."""
    path = _write(tmp_path, scenario_dict())
    cmd = [sys.executable, "-c", "import sys; from twin.cli import main; sys.stdout.write("
           "'x' * 200000); sys.exit(main(sys.argv[1:]))", "check", path]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.read(10)  # more than a pipe holds is waiting to be written: then go away
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "Exception ignored" not in err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_a_full_disk_is_an_error_message_not_a_traceback(tmp_path):
    """Standard output on a full device (``/dev/full``: every write fails with ENOSPC)."""
    path = _write(tmp_path, scenario_dict())
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "twin.cli", "check", path], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert "No space left on device" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("text", "kind"), [("", "null"), ("# only a comment\n", "null"),
                                             ("- 1\n- 2\n", "a list"), ("42\n", "a number"),
                                             # a text, once taken by `check` for a file name
                                             ("scenarios/quickstart.yaml\n", "a text")])
@pytest.mark.parametrize("sub", ["check", "run"])
def test_a_file_that_is_not_a_mapping_is_a_field_error(sub, text, kind, tmp_path, capsys):
    """A YAML document that parses but is not a mapping (empty, a list, a scalar) is reported
    at the top level with exit code 2 by every command that reads a scenario (a fuzzed file
    that was a comment alone made `twin check` raise a TypeError)."""
    path = tmp_path / "in.yaml"
    path.write_text(text)
    assert main([sub, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"must be a YAML mapping, not {kind}" in err and "Traceback" not in err


@pytest.mark.parametrize("sub", ["run", "summary", "check", "catalog", "limits", "validate",
                                 "campaign", "pareto"])
def test_cli_help(sub, capsys):
    with pytest.raises(SystemExit) as exc:
        main([sub, "--help"])
    assert exc.value.code == 0
    assert sub in capsys.readouterr().out


def test_scenario_library_checks():
    files = sorted(str(p) for p in (ROOT / "scenarios").glob("*.yaml")
                   if not any(w in p.name for w in ("campaign", "sweep", "pareto")))
    assert files
    assert main(["check", *files]) == 0


def _leaf_paths(model, prefix=""):
    from pydantic import BaseModel

    from devices.spec import DeviceSpec, LinkSpec
    from workloads.spec import ModelSpec

    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and ann not in (
                DeviceSpec, LinkSpec, ModelSpec):
            out += _leaf_paths(ann, path + ".")
        else:
            out.append(path)
    return out


def test_readme_documents_every_scenario_key():
    """Keeps the README's key table true as the schema grows."""
    import typing

    from twin.scenario import Scenario

    readme = (ROOT / "README.md").read_text()
    missing = [p for p in _leaf_paths(Scenario) if f"`{p}`" not in readme]
    fault_types = typing.get_args(typing.get_args(Scenario.model_fields["faults"].annotation)[0])
    for ft in [t for t in fault_types if hasattr(t, "model_fields")] or []:
        missing += [f"faults[].{k}" for k in ft.model_fields if f"`faults[].{k}`" not in readme]
    assert not missing, f"README lacks scenario keys: {missing}"


def test_cli_validate_theory_rows(capsys):
    """`twin validate` on the fast theory checks: every row within its target, exit 0 with
    --strict."""
    assert main(["validate", "--only", "collectives", "--only", "flops", "--strict"]) == 0
    out = capsys.readouterr().out
    assert "ring allreduce" in out and "within target" in out and "MISS" not in out
