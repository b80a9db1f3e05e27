"""``tools/mutate.py``'s choice of mutants on a module written here: presentation keyword
arguments are left alone without renumbering the mutants around them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SOURCE = '''
def draw(ax, n):
    ax.text(0, 1, "x", fontsize=7, bbox={"pad": 2})
    fig = make(figsize=(10, 1.2 + 0.35 * n))
    return n + 1, fig.savefig("p.png", dpi=110), dump({"a": 1}, indent=1)
'''


def _tool():
    path = Path(__file__).resolve().parent.parent / "tools" / "mutate.py"
    spec = importlib.util.spec_from_file_location("mutate_tool", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def test_presentation_arguments_are_not_mutated_and_other_ids_keep_their_numbers():
    """What the presentation skip leaves out is exactly the mutants inside ``fontsize``,
    ``bbox``, ``figsize``, ``dpi`` and ``indent``; every other mutant keeps the id it has
    without the skip (occurrences are counted over all nodes)."""
    tool = _tool()
    tool._SOURCES["fake.py"] = SOURCE
    kept = {m.id for m in tool.mutants("fake.py")}
    tool.PRESENTATION = frozenset()
    every = {m.id for m in tool.mutants("fake.py")}
    assert kept < every
    left = {i.split("|")[3] for i in every - kept}
    assert left == {"7", "2", "10", "1.2 + 0.35 * n", "1.2", "0.35 * n", "0.35", "110", "1"}
    assert "draw|arith|+ -> -|n + 1|0" in kept and "draw|const|0 -> 1|0|0" in kept
    assert sum(i.startswith("draw|const|1 -> 2|1|") for i in kept) == 3  # y, n + 1, {"a": 1}


def test_every_equivalent_entry_names_a_mutant_of_the_code_today():
    """An entry whose mutant no longer exists (its code changed or went) is a claim about
    nothing: remove it or write it again for the new code. Every entry has its reason."""
    tool = _tool()
    equivalent = tool.load_equivalent()
    stale = []
    for module in sorted({m for m, _ in equivalent}):
        ids = {m.id for m in tool.mutants(module)}
        stale += [(module, i) for m, i in equivalent if m == module and i not in ids]
    assert stale == []
    assert all(reason.strip() for reason in equivalent.values())
