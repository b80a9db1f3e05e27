"""The README's scenario key table states each key's default: the schema must use that value.

The README is the reference a user reads (``| `key` | unit | `default` | meaning |``); every row
whose default is a literal (number, boolean, string, list) is checked against the pydantic
schema's default. Rows whose default is a description (``device's tdp_w``, ``2 x workers``) are
defaults computed at run time (the schema holds ``None``) and are not checked here. A number
printed with a limited precision (``0.667``) is compared within half a unit of its last digit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from twin.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent
_ROW = re.compile(r"^\| `([a-z_.]+)` \| [^|]* \| `([^`|]+)` \|", re.M)


def _schema_default(path: str):
    """Default of the scenario key ``a.b.c`` (``PydanticUndefined`` if not a plain field)."""
    model = Scenario
    parts = path.split(".")
    for i, name in enumerate(parts):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) \
                or name not in model.model_fields:
            return PydanticUndefined
        info = model.model_fields[name]
        if i == len(parts) - 1:
            return info.get_default(call_default_factory=True)
        model = info.annotation
    return PydanticUndefined


def _literal(text: str):
    """The README's default as a value, and the rounding half-width of a printed number."""
    try:
        value = float(text) if re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", text) else \
            yaml.safe_load(text)
    except yaml.YAMLError:
        return text, 0.0
    if isinstance(value, float) and re.fullmatch(r"-?\d+\.\d+", text):
        return value, 0.5 * 10.0 ** -len(text.split(".")[1])
    return value, 0.0


def _rows() -> list[tuple[str, str]]:
    out = []
    for path, text in _ROW.findall((ROOT / "README.md").read_text()):
        d = _schema_default(path)
        if d is PydanticUndefined or d is None or isinstance(d, BaseModel):
            continue  # not a leaf, or a default computed at run time (described in words)
        out.append((path, text))
    return out


def test_the_key_table_has_literal_defaults_to_check():
    paths = {p for p, _ in _rows()}
    assert len(paths) >= 60
    for key in ("power.thermal.hysteresis_k", "power.manager.telemetry_delay_s",
                "power.manager.period_s", "power.thermal.throttle_interval_s",
                "power.alerts.power_fraction"):
        assert key in paths, key


@pytest.mark.parametrize("path,text", _rows(), ids=[p for p, _ in _rows()])
def test_schema_default_is_the_readme_default(path, text):
    expect, half = _literal(text)
    got = _schema_default(path)
    if isinstance(got, bool) or not isinstance(got, int | float):
        assert got == expect, f"{path}: schema {got!r}, README `{text}`"
    else:
        assert isinstance(expect, int | float) and not isinstance(expect, bool), (path, text)
        assert abs(got - expect) <= half + 1e-12 * abs(expect), \
            f"{path}: schema {got!r}, README `{text}`"
