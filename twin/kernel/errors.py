"""Errors for users (bad input, infeasible configurations), kept apart from invariants.

A :class:`ScenarioError` carries every :class:`Problem` found, each naming the field path
(``workload.parallelism.dp``), the value given and what is allowed, so a user fixes all of
them in one pass. The CLI prints them and exits with code 2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input.

    Attributes:
        path: dotted field path, e.g. ``cluster.topology.shape`` (``""`` for the whole file,
            printed as ``<file>``: a scenario, campaign, sweep or map file).
        message: what is wrong, in words.
        value: the offending value as given (``None`` when absent).
        allowed: what would be accepted, in words (may be empty).
    """

    path: str
    message: str
    value: Any = None
    allowed: str = ""

    def __str__(self) -> str:
        where = self.path or "<file>"
        text = f"{where}: {self.message}"
        if self.value is not None:
            shown = repr(self.value)
            if len(shown) > 80:
                shown = shown[:77] + "..."
            text += f" (given: {shown})"
        if self.allowed:
            text += f"; allowed: {self.allowed}"
        return text


class ScenarioError(ValueError):
    """An input file or override is wrong. Holds every problem found, not only the first."""

    def __init__(self, problems: Iterable[Problem] | Problem | str, source: str | None = None):
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        lines = [f"{head}{len(self.problems)} problem(s)"] + [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class InfeasibleConfig(ScenarioError):
    """A well-formed configuration that cannot run (does not fit in HBM, no valid placement).

    Sweeps catch it, record the point as infeasible and go on.
    """


class CatalogError(ScenarioError):
    """A catalog file is malformed (e.g. a number without a ``source``)."""


class BudgetExceeded(ScenarioError):
    """A run exceeded its resource budget (``simulation.limits``) while simulating."""


class TraceError(ValueError):
    """A file is not a readable, complete meshtwin trace (the message says why, starting with
    the path); the CLI prints it and exits with code 2."""
