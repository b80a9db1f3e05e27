"""The Shannon-Hartley bound of the links in ``twin limits`` and the Pareto outputs, against the
closed form derived here: a lane of symbol rate f_s has Nyquist bandwidth B = f_s / 2; carrying
R bit/s needs R <= B log2(1 + S/N) with N = N0 B, so E_b = S / R >= N0 (2^(R/B) - 1) / (R/B)."""

from __future__ import annotations

import json
import math

import pytest

from twin.catalogs import catalog
from twin.cli import main
from twin.runner import run

K_B = 1.380649e-23  # J/K (SI definition)


def _closed_form(link: dict, temp_k: float, nf_db: float = 0.0) -> float:
    rate = link["bandwidth_gbps"] * 8e9 / link["lanes"]
    bw = link["symbol_rate_gbaud"] * 1e9 / 2
    n0 = K_B * (temp_k + (10 ** (nf_db / 10) - 1) * 290.0)
    return n0 * (2 ** (rate / bw) - 1) / (rate / bw)


@pytest.mark.parametrize("nf_db", [0.0, 3.0])
def test_limits_report_the_shannon_hartley_energy_per_bit(tiny, capsys, nf_db):
    scen = tiny([f"cluster.link.noise_figure_db={nf_db}", "power.thermal.ambient_c=30"])
    res = run(scen)
    assert main(["limits", str(res.trace_path), "--json"]) == 0
    lim = json.loads(capsys.readouterr().out)["shannon_hartley"]
    link = catalog("links").get("nvlink4").values
    expect = _closed_form(link, 303.15, nf_db)
    got = lim["link_types"]["nvlink4"]
    assert got["j_per_bit"] == pytest.approx(expect, rel=1e-12, abs=0)
    catalog_j = link["energy_pj_per_bit"] * 1e-12
    assert got["catalog_j_per_bit"] == pytest.approx(catalog_j, rel=1e-12, abs=0)
    assert got["orders_of_magnitude"] == pytest.approx(math.log10(catalog_j / expect), rel=1e-12)
    rate = link["bandwidth_gbps"] * 8e9 / link["lanes"]  # one lane's bit/s over B = f_s / 2
    assert got["spectral_efficiency"] == pytest.approx(
        rate / (link["symbol_rate_gbaud"] * 1e9 / 2), rel=1e-12)
    assert lim["without_bound"] == []
    assert "noise" in lim["assumption"] and "lossless" in lim["assumption"]
    # the run's bound: every bit each link carried at that energy, against the links' energy
    from twin.trace import read_table

    links = read_table(res.trace_path, "links")
    iters = res.summary["iterations"]
    assert lim["bound_j"] == pytest.approx(links["bytes"].sum() * 8 * expect / iters, rel=1e-9)
    assert lim["orders_of_magnitude"] == pytest.approx(
        math.log10(links["energy_j"].sum() / iters / lim["bound_j"]), rel=1e-9)
    assert res.summary["limits_orders_of_magnitude"]["shannon_hartley"] == pytest.approx(
        lim["orders_of_magnitude"], rel=1e-9)
    assert main(["limits", str(res.trace_path)]) == 0
    text = capsys.readouterr().out
    assert "shannon-hartley" in text and "J/bit" in text and "lossless" in text


def test_wideband_limit_is_kT_ln2():
    """As the bandwidth grows without bound, E_b -> N0 ln 2 (the wideband Shannon limit)."""
    from twin.limits import shannon_energy_per_bit

    t = 300.0
    # abs=0: pytest.approx would otherwise accept anything within 1e-12 J of 3e-21 J
    assert shannon_energy_per_bit(1e9, 1e18, t) == pytest.approx(K_B * t * math.log(2),
                                                                 rel=1e-8, abs=0)
    # at and past the float limits of eta = R / B (a fuzzed 1e308 GBd lane divided by eta = 0)
    for bw in (1e300, math.inf):
        assert shannon_energy_per_bit(1e9, bw, t) == pytest.approx(K_B * t * math.log(2),
                                                                   rel=1e-12, abs=0)
    # the default noise figure is 0 dB: N0 = k T; eta = 1 gives E_b = k T (2 - 1) / 1
    assert shannon_energy_per_bit(1e9, 1e9, t) == pytest.approx(K_B * t, rel=1e-12, abs=0)


def test_symbol_rate_is_bounded_and_the_bound_runs(tiny):
    """A lane symbol rate at the schema's bound (1e6 GBd: eta = R / B ~ 1e-4) runs, and its
    bound is the closed form; above the bound is a field error naming the key."""
    from twin.kernel.errors import ScenarioError
    from twin.limits import link_shannon

    scen = tiny(["cluster.link.symbol_rate_gbaud=1e6", "cluster.link.lanes=4"])
    res = run(scen)
    assert res.summary["iteration_time_s"] > 0
    link = scen.cluster.link.model_dump()
    got = link_shannon(link, 298.15)["j_per_bit"]
    assert got == pytest.approx(_closed_form(link, 298.15), rel=1e-9, abs=0)
    with pytest.raises(ScenarioError, match="symbol_rate_gbaud"):
        tiny(["cluster.link.symbol_rate_gbaud=1e308"])


def test_pareto_rows_carry_the_distances_to_both_bounds(tiny):
    from experiments.pareto.evaluate import metrics_row

    scen = tiny()
    res = run(scen)
    s = res.summary
    row = metrics_row(scen, s)
    k_t_ln2 = K_B * 298.15 * math.log(2)   # 25 C inlet (the default ambient), bf16 = 16 bits
    landauer = math.log10(s["energy_per_iteration_j"]
                          / (s["executed_flops_per_iteration"] * 16 * k_t_ln2))
    assert row["landauer_orders_of_magnitude"] == pytest.approx(landauer, rel=1e-9)
    # Shannon-Hartley: log10(link energy / (bits carried x E_b)), E_b of nvlink4 at the 25 C
    # inlet and the link's noise figure, from the closed form above and the trace's link table
    from twin.trace import read_table

    links = read_table(res.trace_path, "links")
    link = catalog("links").get("nvlink4").values
    e_b = _closed_form(link, 298.15, link.get("noise_figure_db", 0.0))
    shannon = math.log10(links["energy_j"].sum() / (links["bytes"].sum() * 8 * e_b))
    assert row["shannon_hartley_orders_of_magnitude"] == pytest.approx(shannon, rel=1e-9)


def test_link_types_without_lane_data_are_listed_as_without_a_bound():
    """A link type whose catalog entry gives no lanes or symbol rate has no Shannon bound: it
    is named in ``without_bound`` and its bits are left out of the bound and its energy
    out of the comparison; a type with the data is not named."""
    import numpy as np

    from twin.limits import shannon_limit

    nv = dict(catalog("links").get("nvlink4").values)
    bare = {k: v for k, v in nv.items() if k not in ("lanes", "symbol_rate_gbaud")}
    out = shannon_limit(["nv", "bare"], np.array([1e9, 1e9]), np.array([2.0, 3.0]),
                        {"nv": nv, "bare": bare}, 300.0)
    assert out["without_bound"] == ["bare"] and out["link_types"]["bare"] is None
    assert out["actual_j"] == 2.0
    assert out["bound_j"] == pytest.approx(8e9 * _closed_form(nv, 300.0), rel=1e-12)
