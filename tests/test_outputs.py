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
    with pytest.raises(ScenarioError) as err:
        check_output("z" * 120 + "\x00")  # 121: cut to 120 with the dots
    assert err.value.problems[0].value == "z" * 117 + "..."


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


def test_reports_timelines_and_traces_are_recognised_by_content(tmp_path):
    """An HTML report (its 9-byte doctype was once read in 8 bytes: `twin report` refused to
    overwrite its own report), a timeline (gzip or JSON; a Perfetto protobuf by its name) and a
    meshtwin trace are overwritten without ``--force``, empty files too; other files are not.
    A damaged meshtwin trace may be replaced; an HDF5 file of another program may not."""
    import h5py

    page, other = tmp_path / "r.html", tmp_path / "o.html"
    page.write_text("<!DOCTYPE html><html></html>")
    other.write_text("a,b\n")
    (tmp_path / "e.html").write_bytes(b"")
    assert check_output(page, kind="html") == page
    assert check_output(tmp_path / "e.html", kind="html") == tmp_path / "e.html"
    assert "not an HTML report" in _refused(other, kind="html")
    for name, body in (("t.json", b"{}"), ("t.json.gz", b"\x1f\x8b\x08"),
                       ("t.pftrace", b"\x0a\x02"), ("e.json", b"")):
        (tmp_path / name).write_bytes(body)
        assert check_output(tmp_path / name, kind="timeline") == tmp_path / name
    (tmp_path / "p.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(16))
    assert check_output(tmp_path / "p.png", kind="png") == tmp_path / "p.png"
    (tmp_path / "x.json").write_bytes(b"a,b\n")
    assert "refusing to overwrite it" in _refused(tmp_path / "x.json", kind="timeline")
    with h5py.File(tmp_path / "damaged.h5", "w") as f:
        f.attrs["schema_version"] = 1  # a meshtwin trace whose run never finished
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = [1, 2, 3]
    assert check_output(tmp_path / "damaged.h5") == tmp_path / "damaged.h5"
    assert "not a meshtwin trace" in _refused(tmp_path / "foreign.h5")


def test_a_file_that_cannot_be_read_is_not_taken_for_the_commands_own(tmp_path, monkeypatch):
    """Its kind is unknown, so it is overwritten only with ``--force`` (``open`` fails here
    by hand: as root a mode of 000 still reads)."""
    import twin.outputs

    table = tmp_path / "t.csv"
    table.write_text("a,b\n")

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(twin.outputs, "open", unreadable, raising=False)
    assert "refusing to overwrite it" in _refused(table, kind="table")
    assert check_output(table, kind="table", force=True) == table


def test_an_atomic_write_clears_a_dead_writers_leftover_of_a_hyphenated_name(tmp_path):
    """The writer's pid is what follows the last hyphen of ``.NAME.tmp-PID``, whatever
    hyphens NAME holds (a live writer's file stays: ``tests/test_many.py``)."""
    import subprocess
    import sys

    from twin.outputs import atomic_write

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "run-a-b.csv"
    left = tmp_path / f".run-a-b.csv.tmp-{dead.pid}"
    left.write_text("partial")
    atomic_write(target, lambda tmp: tmp.write_text("a,b\n"))
    assert target.read_text() == "a,b\n" and not left.exists()
