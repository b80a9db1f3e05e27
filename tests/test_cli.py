"""The command line's own logic (``twin/cli.py``): the summary printout, ``twin check`` over
several files, ``twin validate``'s arguments and the exit code of an interrupted command."""

from __future__ import annotations

import io

import pandas as pd
import pytest
import yaml

from tests.conftest import scenario_dict
from twin.cli import main, print_summary


def test_summary_lines_are_aligned_and_a_mean_that_does_not_settle_is_flagged():
    s = {"iteration_time_s": 1.5, "energy_j": 2.0, "iteration_time_converged": False,
         "iteration_time_mean_is": "finite-sample average",
         "iteration_time_warnings": ["Hill alpha 1.4 < 2"], "some_other_key": 1}
    out = io.StringIO()
    print_summary(s, out, everything=True)
    lines = out.getvalue().splitlines()
    values = [ln for ln in lines if ln.startswith("  ") and not ln.startswith("  warning")
              and not ln.startswith("    ")]
    assert len(values) == len(s)
    assert len({ln.index(" ", 2 + max(len(k) for k in s)) for ln in values}) == 1
    assert values[0] == f"  {'iteration_time_s':<{max(len(k) for k in s)}}  1.5"
    assert "  warning: iteration_time_s is a finite-sample average:" in lines
    assert "    - Hill alpha 1.4 < 2" in lines
    for converged in (True, None):
        out = io.StringIO()
        print_summary({**s, "iteration_time_converged": converged}, out, everything=True)
        assert "  warning:" not in out.getvalue()


def test_check_counts_the_files_that_failed(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(scenario_dict()))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(scenario_dict(seed=-1)))
    assert main(["check", str(good)]) == 0
    assert "failed" not in capsys.readouterr().err
    assert main(["check", str(bad), str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("FAIL") == 2 and err.splitlines()[-1] == "2 of 3 file(s) failed"


def test_validate_refuses_an_unknown_check_and_writes_a_plain_csv(tmp_path, capsys):
    assert main(["validate", "--only", "pipeline", "--only", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--only" in err and "nope" in err and "pipeline" in err  # the allowed names
    out = tmp_path / "v.csv"
    assert main(["validate", "--only", "pipeline", "--csv", str(out)]) == 0
    df = pd.read_csv(out)
    assert list(df.columns[:3]) == ["group", "check", "predicted"] and len(df) == 3


def test_an_interrupted_command_exits_130(monkeypatch, capsys):
    import twin.cli

    def interrupted(self, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(twin.cli.CatalogCommand, "run", interrupted)
    assert main(["catalog", "devices"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_a_failing_write_exits_1_naming_the_file_if_the_system_says_which(monkeypatch,
                                                                         capsys):
    """An OSError from the machine (a full disk): exit 1 and the file, when the error names
    one; without a name, "a file or the output", and standard output is pointed at
    /dev/null (most likely it was what failed)."""
    import twin.cli

    dropped = []
    monkeypatch.setattr(twin.cli, "_drop_stdout", lambda: dropped.append(True))
    for err, where, drops in ((OSError(28, "No space left on device", "/data/t.h5"),
                               "/data/t.h5", False),
                              (OSError(5, "Input/output error"), "a file or the output", True)):
        def failing(self, args, err=err):
            raise err

        monkeypatch.setattr(twin.cli.CatalogCommand, "run", failing)
        dropped.clear()
        assert main(["catalog", "devices"]) == 1
        text = capsys.readouterr().err
        assert f"input/output failed on {where}: {err.strerror}" in text
        assert bool(dropped) == drops


@pytest.mark.parametrize("argv,missing", [
    (["run"], "scenario"), (["check"], "scenarios"), (["export"], "trace"),
    (["export", "t.h5"], "-o/--output"),  # where the timeline goes has no default
    (["campaign", "scenarios/campaign_faults.yaml"], "-o/--output")])
def test_missing_arguments_are_usage_errors(argv, missing, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "usage:" in err
    assert f"the following arguments are required: {missing}" in err


def test_by_default_the_summary_prints_the_contract_keys_and_counts_the_rest():
    s = {"iteration_time_s": 1.5, "energy_j": 2.0, "some_other_key": 1, "another": 2}
    out = io.StringIO()
    print_summary(s, out)
    text = out.getvalue()
    assert "iteration_time_s" in text and "energy_j" in text
    assert "some_other_key" not in text and "(2 more keys: --all or --json)" in text


@pytest.mark.parametrize("argv,hint", [
    (["run", "scenarios/sweep_small.yaml"], "a sweep file, not a scenario file: `twin pareto`"),
    (["run", "scenarios/contention_map.yaml"], "a contention map file, not a scenario file"),
    (["campaign", "scenarios/quickstart.yaml", "-o", "OUT", "--workers", "0"],
     "a scenario file, not a campaign file: `twin run`"),
    (["pareto", "scenarios/campaign_faults.yaml", "-o", "OUT", "--workers", "0"],
     "a campaign file, not a sweep file: `twin campaign`"),
    (["contention", "scenarios/sweep_small.yaml", "-o", "OUT", "--workers", "0"],
     "a sweep file, not a contention map file"),
])
def test_a_file_of_another_kind_is_named_as_such(argv, hint, tmp_path, capsys):
    """A sweep given to ``twin run`` (and every such mix-up): besides the unknown keys, one
    line says what the file is and which command runs it; nothing is written."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unknown key" in err and f"hint: {argv[1]} is {hint}" in err
    assert not (tmp_path / "out").exists()


def test_a_scenario_with_an_unknown_key_gets_no_kind_hint(tmp_path, capsys):
    """A scenario with a misspelt key is a scenario: no hint about other kinds."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**scenario_dict(), "grid": 1}))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "grid: unknown key" in err and "hint:" not in err


def test_a_mapping_with_no_sign_of_any_kind_gets_no_kind_hint(tmp_path, capsys):
    """A file with neither ``base`` nor ``cluster`` / ``workload`` (a campaign that lost its
    base, say) is no evidence of another kind: `twin pareto` lists its problems and says
    nothing of scenarios."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "c", "seeds": 4, "grid": {"seed": [1]}}))
    assert main(["pareto", str(path), "-o", str(tmp_path / "out"), "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert "seeds: unknown key" in err and "hint:" not in err


def test_a_trace_path_the_system_cannot_stat_is_not_found(capsys):
    """A trace name longer than the file system allows (stat fails with ENAMETOOLONG):
    `twin summary` says the trace is not found, like any missing file."""
    assert main(["summary", "x" * 5000 + ".h5"]) == 2
    assert "trace: trace file not found" in capsys.readouterr().err
