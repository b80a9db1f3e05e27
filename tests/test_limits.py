"""Limits report: Landauer constant vs the published figure, bounds are really lower bounds,
trace and summary agree, the CLI command."""

from __future__ import annotations

import math

import pytest

from twin.limits import BOLTZMANN_J_PER_K, compute_limits, limits_from_trace
from twin.runner import run


@pytest.mark.parametrize("precision, bits", [("fp32", 32), ("tf32", 32), ("bf16", 16),
                                             ("fp16", 16), ("fp8", 8), ("fp4", 4)])
def test_landauer_bound_counts_the_stored_bits_of_each_precision(precision, bits):
    """One bit erased per stored bit of every executed FLOP's result: tf32 is stored in a
    32-bit container, fp4 in 4 bits. A device without links (injection capacity 0) has no
    injection bound."""
    lim = compute_limits(1.0, 1.0, [1e12], 1e12, [], [], 0.0, 0.0, 1e6, precision,
                         300.0 - 273.15)
    assert lim["landauer"]["bound_j"] == pytest.approx(
        1e6 * bits * BOLTZMANN_J_PER_K * 300.0 * math.log(2), rel=1e-12, abs=0)
    assert lim["communication"]["injection_bound_s"] == 0.0
    assert lim["communication"]["bound_s"] == 0.0


def test_landauer_per_bit_matches_published_value():
    """kT ln 2 = 2.87e-21 J at 300 K (calibration README)."""
    lim = compute_limits(1.0, 1.0, [1.0], 1.0, [0.0], [1.0], 1.0, 0.0, 1.0, "bf16",
                         300.0 - 273.15)
    assert lim["landauer"]["j_per_bit"] == pytest.approx(2.87e-21, rel=2e-3, abs=0)
    assert BOLTZMANN_J_PER_K * 300 * math.log(2) == pytest.approx(2.87e-21, rel=2e-3, abs=0)


def test_bound_arithmetic():
    lim = compute_limits(
        iteration_time_s=2.0, energy_per_iteration_j=1000.0,
        rank_flops_per_iteration=[4e12, 8e12], peak_flops=1e12,
        link_bytes_per_iteration=[1e9, 3e9], link_capacity=[1e9, 1e9],
        injection_capacity=2e9, bytes_sent_per_iteration=4e9,
        executed_flops_per_iteration=1e13, precision="fp8", ambient_c=25.0)
    assert lim["roofline"]["bound_s"] == 8.0
    assert lim["roofline"]["orders_of_magnitude"] == pytest.approx(math.log10(2 / 8))
    assert lim["communication"]["link_bound_s"] == 3.0
    assert lim["communication"]["injection_bound_s"] == 2.0
    assert lim["communication"]["bound_s"] == 3.0
    e = 1e13 * 8 * BOLTZMANN_J_PER_K * 298.15 * math.log(2)
    assert lim["landauer"]["bound_j"] == pytest.approx(e, rel=1e-12, abs=0)
    assert lim["landauer"]["orders_of_magnitude"] == pytest.approx(math.log10(1000 / e))


@pytest.mark.parametrize("iterations", [1, 2])
def test_run_is_above_every_bound_and_trace_agrees_with_summary(tiny, capsys, iterations):
    """The summary's limits (per iteration) against those the trace gives, on one and on two
    iterations (the run's energy, link bytes and FLOPs divided by the iterations)."""
    res = run(tiny(["workload.parallelism.dp=4", "workload.parallelism.tp=2",
                    f"workload.iterations={iterations}"]))
    lim = limits_from_trace(res.trace_path)
    summ = res.summary["limits_orders_of_magnitude"]
    for k in ("roofline", "communication", "landauer"):
        o = lim[k]["orders_of_magnitude"]
        assert o is not None and o >= 0.0, k                # lower bounds hold
        assert o == pytest.approx(summ[k], rel=1e-9), k
    # the law itself: log10(E / (executed FLOPs x 16 bits x k T ln 2)), T = 25 C inlet default
    s = res.summary
    e_land = s["executed_flops_per_iteration"] * 16 * BOLTZMANN_J_PER_K * 298.15 * math.log(2)
    assert lim["landauer"]["orders_of_magnitude"] == pytest.approx(
        math.log10(s["energy_per_iteration_j"] / e_land), rel=1e-9)
    with capsys.disabled():
        print("\nlimits (orders of magnitude): " + ", ".join(f"{k} {v:.2f}"
                                                           for k, v in summ.items()))


def test_cli_limits(tiny, capsys):
    from twin.cli import main

    res = run(tiny())
    assert main(["limits", str(res.trace_path)]) == 0
    out = capsys.readouterr().out
    assert "landauer" in out and "orders of magnitude" in out and "k T ln 2" in out
    assert main(["limits", str(res.trace_path), "--json"]) == 0
    assert '"roofline"' in capsys.readouterr().out
    assert main(["limits", str(res.trace_path) + ".missing"]) == 2


def test_cli_limits_help(capsys):
    from twin.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["limits", "--help"])
    assert exc.value.code == 0
    assert "limits" in capsys.readouterr().out


def test_no_gemm_and_no_link_means_no_bound():
    """A job without GEMM FLOPs on one device without links: no roofline and no link bound
    (0 s, shown as n/a), the injection bound alone (1 GB over 2 GB/s)."""
    from twin.limits import format_limits

    lim = compute_limits(1.0, 10.0, [], 1e12, [], [], 2e9, 1e9, 1e9, "bf16", 25.0)
    assert lim["roofline"]["bound_s"] == 0.0 and lim["roofline"]["orders_of_magnitude"] is None
    assert lim["communication"]["link_bound_s"] == 0.0
    assert lim["communication"]["bound_s"] == lim["communication"]["injection_bound_s"] == 0.5
    text = format_limits(lim)
    assert "roofline       bound 0 s  actual 1 s  n/a (no bound)" in text


def test_shannon_line_of_the_report():
    """The Shannon-Hartley line says n/a without a bound and the orders of magnitude with one."""
    from twin.limits import format_limits

    lim = compute_limits(1.0, 10.0, [1e12], 1e12, [1.0], [1.0], 1.0, 1.0, 1e9, "bf16", 25.0)
    sh = {"bound_j": 0.0, "actual_j": 1.0, "orders_of_magnitude": None, "link_types": {},
          "assumption": "x", "temperature_k": 298.15}
    assert "J  n/a (no bound) (link energy)" in format_limits(dict(lim, shannon_hartley=sh))
    sh = dict(sh, bound_j=1e-3, orders_of_magnitude=3.0)
    assert "3.00 orders of magnitude above (link energy)" in format_limits(
        dict(lim, shannon_hartley=sh))
