"""The public Python API: load a scenario, run it."""

from __future__ import annotations

from twin.runner import RunResult, run
from twin.scenario import Scenario, load_scenario

__all__ = ["RunResult", "Scenario", "load_scenario", "run"]
