"""Output paths checked before a run (``twin.outputs``), case by case against the rules of its
module docstring: name and path lengths at their limits, what may be overwritten without
``--force``, folders that do not exist yet, and scenario paths confined to the working
directory (``tests/test_robust.py`` drives the same checks through the CLI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from twin.kernel.errors import ScenarioError
from twin.outputs import MAX_NAME_BYTES, MAX_PATH_BYTES, check_output, confine


def _refused(path, **kw) -> str:
    with pytest.raises(ScenarioError) as err:
        check_output(path, key="-o", **kw)
    (problem,) = err.value.problems
    assert problem.path == "-o"
    return problem.message


def test_empty_names_nul_bytes_and_folders_are_not_file_names(tmp_path):
    for bad in ("", "a\x00b.h5", str(tmp_path / "x.h5\x00")):
        assert _refused(bad) == "not a usable file name"
    for bad in (str(tmp_path / "out") + os.sep, ".", f"{tmp_path}{os.sep}.."):
        assert _refused(bad) == "names a folder, not a file"
    (tmp_path / "adir").mkdir()
    assert _refused(tmp_path / "adir") == "is a folder"


def test_name_and_path_lengths_at_their_limits(tmp_path):
    """A file name of 255 bytes is a name the file system takes; 256 is refused. A path of
    4095 bytes (in folders still to be made) is checked further; 4096 is refused."""
    assert check_output(tmp_path / ("n" * MAX_NAME_BYTES)).name == "n" * MAX_NAME_BYTES
    assert "longer than 255 bytes" in _refused(tmp_path / ("n" * (MAX_NAME_BYTES + 1)))
    head = os.fsencode(str(tmp_path))
    # folders of 200 bytes below tmp_path, then a file name filling up to the limit
    parts, size = [], len(head)
    while size + 1 + 200 + 1 + 10 < MAX_PATH_BYTES:
        parts.append("d" * 200)
        size += 201
    name = "f" * (MAX_PATH_BYTES - 1 - size - 1)
    ok = os.path.join(str(tmp_path), *parts, name)
    assert len(os.fsencode(ok)) == MAX_PATH_BYTES - 1
    assert str(check_output(ok)) == ok
    assert "longer than 4096 bytes" in _refused(ok + "g")


def test_long_values_are_shortened_in_the_message(tmp_path):
    with pytest.raises(ScenarioError) as err:
        check_output("x" * 300 + "\x00")
    assert err.value.problems[0].value == "x" * 117 + "..."
    with pytest.raises(ScenarioError) as err:
        check_output("y" * 119 + "\x00")  # 120 characters: shown whole
    assert err.value.problems[0].value == "y" * 119 + "\x00"


def test_only_the_commands_own_kind_of_file_is_overwritten_without_force(tmp_path):
    text = tmp_path / "notes.csv"
    text.write_text("a,b\n1,2\n")
    binary = tmp_path / "blob.csv"
    binary.write_bytes(b"PK\x03\x04\x00\x00")
    parquet = tmp_path / "t.parquet"
    parquet.write_bytes(b"PAR1\x00\x00\x00\x00")
    assert check_output(text, kind="table") == text        # a text table: the command's kind
    assert check_output(parquet, kind="table") == parquet  # Parquet by its magic
    assert "refusing to overwrite it" in _refused(binary, kind="table")
    assert check_output(binary, kind="table", force=True) == binary
    not_png = tmp_path / "notes.png"
    not_png.write_text("a,b\n1,2\n")
    assert "refusing to overwrite it" in _refused(not_png, kind="png")
    assert "written as a PNG image" in _refused(text, kind="png")  # the suffix picks the format
    assert "refusing to overwrite it" in _refused(text)  # a trace by default, not forced
    empty = tmp_path / "empty.h5"
    empty.write_bytes(b"")
    assert check_output(empty) == empty
    assert binary.read_bytes() == b"PK\x03\x04\x00\x00" and text.read_text() == "a,b\n1,2\n"


def test_folders_still_to_be_made_are_fine_but_not_below_a_file(tmp_path):
    deep = tmp_path / "a" / "b" / "c" / "t.h5"
    assert check_output(deep) == deep and not (tmp_path / "a").exists()
    (tmp_path / "plain").write_text("x")
    assert _refused(tmp_path / "plain" / "b" / "t.h5") == "cannot be used (Not a directory)"


def test_scenario_paths_stay_inside_the_root(tmp_path, monkeypatch):
    """A relative path is taken from the root, not from the current folder; absolute paths
    and ``..`` must land inside it."""
    root = tmp_path / "work"
    (root / "sub").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert confine("runs/t.h5", "trace.path", root) == root.joinpath("runs/t.h5").relative_to(
        root)
    assert confine(root / "sub" / "t.h5", "trace.path", root) == root / "sub" / "t.h5"
    assert confine("sub/../t.h5", "trace.path", root) == Path("sub/../t.h5")
    for bad in ("../t.h5", str(tmp_path / "t.h5"), "sub/../../t.h5"):
        with pytest.raises(ScenarioError) as err:
            confine(bad, "trace.path", root)
        assert "outside the working directory" in str(err.value)
    monkeypatch.chdir(root)
    assert confine("t.h5", "trace.path") == root.joinpath("t.h5").relative_to(root)
