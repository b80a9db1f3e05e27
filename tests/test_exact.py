"""Fast mode (symmetry, chained transfers) against ``simulation.exact: true``.

Exact mode simulates every rank and runs every pipeline send and tensor-parallel collective
as its own SimPy process; it shares none of the shortcuts, so it is the reference the
shortcuts are checked against: iteration time and energy within 0.5% (DESIGN, performance
targets). With nothing random the shortcuts are exact, so the agreement is in fact to
floating-point rounding.
"""

from __future__ import annotations

import pytest

from twin.runner import run
from twin.scenario import load_scenario


def _scenario(exact: bool, **workload) -> dict:
    w = {"model": "llama3.2-1b", "precision": "bf16", "seq_len": 1024, "global_batch": 16,
         "micro_batch": 1, "parallelism": {"dp": 2, "tp": 2, "pp": 4}, "iterations": 2}
    w.update(workload)
    return {"name": "exact-check", "seed": 3,
            "cluster": {"topology": {"kind": "torus2d", "shape": [4, 4]}, "device": "h100-sxm",
                        "link": "nvlink4", "links_per_edge": 4},
            "workload": w, "simulation": {"exact": exact}, "trace": {"enabled": False}}


CASES = {
    "1f1b": {},
    "interleaved": {"schedule": "interleaved", "virtual_stages": 2},
    "dp_tp": {"parallelism": {"dp": 4, "tp": 4, "pp": 1}, "global_batch": 8},
}


@pytest.mark.parametrize("case", list(CASES))
def test_fast_mode_agrees_with_exact_mode(case):
    fast = run(load_scenario(_scenario(False, **CASES[case]))).summary
    exact = run(load_scenario(_scenario(True, **CASES[case]))).summary
    assert fast["symmetry_used"] and "symmetry" in fast["shortcuts_used"]
    assert "chained_transfers" in fast["shortcuts_used"]
    assert exact["exact_mode"] and exact["shortcuts_used"] == []
    assert not exact["symmetry_used"] and exact["rank_classes"] == exact["devices"]
    assert exact["rank_classes"] > fast["rank_classes"]
    for key in ("iteration_time_s", "energy_j", "makespan_s"):
        assert fast[key] == pytest.approx(exact[key], rel=5e-3), key
