"""The ``memory`` section's schema (devices/memory_spec.py) and which kernels ``bound: auto``
treats as latency-bound: bounds at their documented values, defaults that change runs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from devices.memory_spec import MemorySpec, latency_bound
from tests.conftest import scenario_dict
from twin.runner import run
from twin.scenario import load_scenario
from workloads.transformer import Kernel


def test_latency_bound_kernels():
    """Every non-GEMM kernel is latency-bound; a GEMM only below the threshold (1 MB)."""
    small = Kernel("g", 1e9, 0.5e6, True, (1.0, 64, 64), depth=64)
    large = Kernel("g", 1e12, 2e6, True, (1.0, 1024, 1024), depth=1024)
    norm = Kernel("norm", 1e6, 5e9, False)
    assert latency_bound(small, 1e6) and not latency_bound(large, 1e6)
    assert latency_bound(norm, 1e6)


@pytest.mark.parametrize(("good", "bad", "field"), [
    ({"service": {"dist": "pareto", "alpha": 1.01}},
     {"service": {"dist": "pareto", "alpha": 1.0}}, "alpha"),
    ({"service": {"dist": "erlang", "k": 1}}, {"service": {"dist": "erlang", "k": 0}}, "k"),
    ({"dma": {"read_fraction": 1.0}}, {"dma": {"read_fraction": 1.01}}, "read_fraction"),
    ({"latency_below_mb": 1e6}, {"latency_below_mb": 1.0001e6}, "latency_below_mb"),
    ({"requests_per_batch": 1 << 20}, {"requests_per_batch": (1 << 20) + 1},
     "requests_per_batch"),
    ({"max_streams": 1}, {"max_streams": 0}, "max_streams"),
    ({"max_streams": 256}, {"max_streams": 257}, "max_streams"),
])
def test_bounds_at_their_values(good, bad, field):
    """Each bound's last allowed value is accepted and the next refused (Pareto alpha > 1:
    a finite mean; at least one Erlang phase; a read share up to 1; ...)."""
    MemorySpec.model_validate(good)
    with pytest.raises(ValidationError, match=field):
        MemorySpec.model_validate(bad)


def test_every_device_draws_its_own_slowdowns_by_default():
    """``memory.per_device_draws`` defaults to true: a contention run keeps no rank symmetry
    unless asked to (``false``)."""
    assert MemorySpec().per_device_draws is True
    d = scenario_dict()
    d["memory"] = {"model": "queue"}
    d["trace"] = {"enabled": False}
    assert run(load_scenario(d)).summary["symmetry_used"] is False
    d["memory"]["per_device_draws"] = False
    assert run(load_scenario(d)).summary["symmetry_used"] is True


def test_transfers_pay_for_hbm_contention_by_default():
    """``memory.transfer_cap`` defaults to true: under FR-FCFS the devices' HBM ports cap the
    data-parallel buckets that run beside the backward pass (some seconds capped, the
    iteration longer); with ``false`` no port is ever capped."""
    assert MemorySpec().transfer_cap is True
    d = scenario_dict()
    d["memory"] = {"model": "frfcfs", "per_device_draws": False}
    d["trace"] = {"enabled": False}
    capped = run(load_scenario(d)).summary
    d["memory"]["transfer_cap"] = False
    free = run(load_scenario(d)).summary
    assert capped["hbm_port_capped_s"] > 0 and free["hbm_port_capped_s"] == 0
    assert capped["iteration_time_s"] > free["iteration_time_s"]
