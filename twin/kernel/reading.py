"""Reading input files safely: bounded size, strict UTF-8, bounded YAML.

Every YAML input of the front door (scenario, campaign and sweep files, ``base:`` scenarios,
``--set`` values) goes through :func:`load_yaml_text`, which parses with PyYAML's safe loader
and refuses, as a :class:`~twin.kernel.errors.ScenarioError` with line and column:

* nesting deeper than :data:`MAX_DEPTH` levels (counted through aliases);
* documents of more than :data:`MAX_NODES` nodes, refused while they are read, or that
  expand to more once aliases are expanded (a "billion laughs" alias bomb is refused in
  milliseconds instead of eating memory);
* duplicate keys in one mapping (YAML says keys are unique; PyYAML would keep the last);
* integers of more than :data:`MAX_INT_DIGITS` digits (the schema then checks ranges).

:func:`read_input` reads a file of at most :data:`MAX_INPUT_BYTES` bytes that must be a
regular file and valid UTF-8. Messages never quote the file's content beyond a position, so
pointing a command at an unrelated file (``/etc/passwd``) does not echo it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from twin.kernel.errors import Problem, ScenarioError

if TYPE_CHECKING:
    import pandas as pd

#: Largest input file, bytes (scenario files are a few kB).
MAX_INPUT_BYTES = 4 << 20
#: Deepest nesting of mappings / lists (a scenario needs fewer than 10).
MAX_DEPTH = 64
#: Most nodes a document may expand to, aliases expanded.
MAX_NODES = 200_000
#: Largest CSV table a command reads, bytes (a sweep's points.csv: a few hundred bytes per
#: point, at most 100,000 points).
MAX_TABLE_BYTES = 256 << 20
#: Most digits an integer literal may have (int64 has 19).
MAX_INT_DIGITS = 40

_INT_DIGITS = re.compile(r"[0-9a-fA-F]")


class _InputTooComplex(yaml.YAMLError):
    """The document exceeds a bound of this module."""

    def __init__(self, problem: str, mark: Any = None):
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounded nesting and alias expansion, unique keys and
    bounded integer literals."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Compose one node, refusing nesting deeper than :data:`MAX_DEPTH` and, as it is
        read, a document of more than :data:`MAX_NODES` values as written (an alias counts
        once here; expanded, in :func:`_check_expansion`)."""
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _InputTooComplex(f"nesting deeper than {MAX_DEPTH} levels",
                                       self.peek_event().start_mark)
            if self._nodes > MAX_NODES:
                raise _InputTooComplex(f"the document has more than {MAX_NODES} values",
                                       self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Any:
        """The document's root node, after checking its expanded size and depth."""
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """A mapping; a key given twice is an error naming the key and its line."""
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:
                    continue  # unhashable key: PyYAML reports it below
                if dup:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {str(key)[:60]!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        """An integer literal of at most :data:`MAX_INT_DIGITS` digits."""
        text = str(node.value)
        if len(_INT_DIGITS.findall(text)) > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})",
                node.start_mark)
        return super().construct_yaml_int(node)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


def _check_expansion(root: Any) -> None:
    """Refuse a node graph whose alias-expanded size or depth exceeds the bounds
    (iterative, memoized per node: alias bombs cost their compact size)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in size:
            continue
        kids = _children(node)
        if not children_done:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in size)
            continue
        size[key] = 1 + sum(size[id(k)] for k in kids)
        depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
        if size[key] > MAX_NODES:
            raise _InputTooComplex(f"the document expands to more than {MAX_NODES} values "
                                   "(aliases expanded): an alias bomb?", node.start_mark)
        if depth[key] > MAX_DEPTH:
            raise _InputTooComplex(f"nesting deeper than {MAX_DEPTH} levels (aliases "
                                   "expanded)", node.start_mark)


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def load_yaml_text(text: str, source: str = "", path: str = "") -> Any:
    """Parse YAML ``text`` with :class:`BoundedLoader`.

    Args:
        text: the document.
        source: file name for messages.
        path: field path for messages (``""`` for a whole file, ``--set`` key for a value).

    Raises:
        ScenarioError: malformed YAML or a bound exceeded, with line and column.
    """
    loader = None
    try:
        loader = BoundedLoader(text)
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = getattr(exc, "problem", None)
        if isinstance(exc, yaml.reader.ReaderError):
            line = text[: exc.position].count("\n") + 1
            where = f" at line {line}"
            reason = f"character #x{exc.character:04x} is not allowed in YAML"
        reason = reason or type(exc).__name__
        raise ScenarioError([Problem(path, f"malformed YAML{where}: {reason}")],
                            source=source or None) from None
    except RecursionError:  # pragma: no cover (nesting is bounded above)
        raise ScenarioError([Problem(path, "malformed YAML: nested too deeply")],
                            source=source or None) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_input(path: str | Path, what: str = "scenario", *, field: str = "",
               allowed: str = "a path to a YAML file", limit: int = MAX_INPUT_BYTES) -> str:
    """The text of an input file: a regular file of at most ``limit`` bytes, valid UTF-8.
    Problems are reported under ``field`` (``""``: the file itself; a command-line option
    such as ``"--sweep"`` for a file an option names), with ``allowed`` as what is allowed.

    Raises:
        ScenarioError: missing, not a regular file, too large, unreadable or not UTF-8.
    """
    p = Path(path)
    src = str(p)[:300]

    def refuse(message: str, given: Any = None, allow: str = allowed) -> ScenarioError:
        return ScenarioError([Problem(field, message, given, allow)], source=src)

    try:
        st = os.stat(p)
    except (OSError, ValueError) as exc:
        too_long = getattr(exc, "errno", None) == errno.ENAMETOOLONG
        reason = "name too long" if too_long else "not found"
        raise refuse(f"{what} file {reason}", src) from None
    if not stat.S_ISREG(st.st_mode):
        raise refuse(f"{what} file is not a regular file (a directory or device?)", src)
    if st.st_size > limit:
        raise refuse(f"{what} file too large: {st.st_size} bytes", None, f"at most {limit} bytes")
    try:
        with open(p, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise refuse(f"{what} file cannot be read: {exc.strerror}", None, "") from None
    if len(data) > limit:
        raise refuse(f"{what} file too large", None, f"at most {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise refuse(f"{what} file is not UTF-8 text: byte 0x{data[exc.start]:02x} at line "
                     f"{line} cannot be decoded", None, "a text file in UTF-8") from None


def read_csv_table(path: str | Path, what: str, field: str, columns: dict[str, bool],
                   allowed: str) -> pd.DataFrame:
    """A CSV table a command-line option names (``twin report --sweep``'s ``points.csv``,
    ``twin pareto --reference``'s ``pareto.csv``): :func:`read_input`'s checks (at most
    :data:`MAX_TABLE_BYTES`), then a header and rows pandas can parse, with every column of
    ``columns`` present; a column mapped to True must hold numbers (empty cells allowed).
    Messages name rows and columns, never the file's content.

    Raises:
        ScenarioError: under ``field``, with ``allowed`` as what is allowed.
    """
    import io

    import pandas as pd

    text = read_input(path, what, field=field, allowed=allowed, limit=MAX_TABLE_BYTES)
    src = str(path)[:300]

    def refuse(message: str) -> ScenarioError:
        return ScenarioError([Problem(field, f"{what} file {message}", src, allowed)], source=src)

    try:
        table = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        lines = str(exc).strip().splitlines()
        raise refuse(f"is not a CSV table ({lines[0][:120] if lines else type(exc).__name__})"
                     ) from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise refuse(f"has no column {', '.join(missing)}")
    for col, numeric in columns.items():
        if not numeric:
            continue
        values = pd.to_numeric(table[col], errors="coerce")
        bad = values.isna() & table[col].notna()
        if bad.any():
            row = int(bad.to_numpy().argmax()) + 1
            raise refuse(f"has a value in column {col} that is not a number (data row {row})")
        table[col] = values
    return table


def read_yaml_file(path: str | Path, what: str = "scenario") -> Any:
    """:func:`read_input` then :func:`load_yaml_text`."""
    return load_yaml_text(read_input(path, what), source=str(path)[:300])
