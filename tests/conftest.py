"""Shared fixtures: small scenarios built in code so tests do not depend on file edits."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BASE = {
    "name": "tiny",
    "seed": 7,
    "cluster": {
        "topology": {"kind": "torus2d", "shape": [4, 2]},
        "device": "h100-sxm",
        "link": "nvlink4",
        "links_per_edge": 4,
    },
    "workload": {
        "model": "llama3.2-1b",
        "precision": "bf16",
        "seq_len": 512,
        "global_batch": 16,
        "micro_batch": 1,
        "parallelism": {"dp": 8, "tp": 1, "pp": 1},
        "iterations": 1,
    },
}


#: summary keys that split a device's time (s per device); with the sharding all-gather wait
#: (``sharding.allgather_wait_per_device_s``) they add up to the makespan
DEVICE_TIME_KEYS = ("compute_time_per_device_s", "tp_comm_time_per_device_s",
                    "pipeline_wait_per_device_s", "dp_wait_per_device_s",
                    "data_wait_per_device_s", "idle_time_per_device_s")


def scenario_dict(**updates) -> dict:
    """A copy of the tiny base scenario with dotted-key updates applied."""
    d = copy.deepcopy(BASE)
    for key, value in updates.items():
        node = d
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return d


@pytest.fixture
def tiny(tmp_path):
    """Factory: a loaded tiny scenario whose trace goes to tmp_path."""
    from twin.scenario import load_scenario

    def make(overrides=None, **updates):
        d = scenario_dict(**updates)
        d.setdefault("trace", {})["path"] = str(tmp_path / f"{d['name']}.h5")
        return load_scenario(d, overrides or [])

    return make
