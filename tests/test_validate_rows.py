"""``twin validate``'s fast rows (collectives against alpha-beta, queueing theory, pipeline
bubbles, FLOPs, conservation, data starvation, NCCL bus bandwidth): every row within its
target, and the references it prints are the closed forms worked out here, not whatever the
command computes (a wrong reference would make a wrong model look right)."""

from __future__ import annotations

import math

import pytest

from twin.cli import main
from twin.validate import run_checks

FAST = ("collectives", "queueing", "pipeline", "flops", "conservation", "data", "nccl")


@pytest.fixture(scope="module")
def rows():
    """The queueing, pipeline, data and NCCL rows, run once for the tests below."""
    return run_checks(["queueing", "pipeline", "data", "nccl"])


def test_fast_rows_are_within_their_targets(capsys):
    args = ["validate", "--strict"]
    for name in FAST:
        args += ["--only", name]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "MISS" not in out and "22/22 within target" in out


def test_the_references_are_the_closed_forms(rows):
    """M/G/1 mean wait (Pollaczek-Khinchine) at rho 0.7 with mean service 1 s:
    rho / (1 - rho) x (1 + cov^2) / 2 for exponential, deterministic, lognormal cov 2 and
    Erlang-4 service; the 1F1B bubble (p - 1) / (m + p - 1) and the interleaved one
    (p - 1) / (v m + p - 1); a GPU fed at r times its consumption waits 1 - r of the
    time."""
    df = rows[rows["group"] == "theory"].set_index("check")
    pk = 0.7 / 0.3
    want = {"M/M/1 mean wait, rho 0.7": pk, "M/D/1 mean wait, rho 0.7": pk / 2,
            "M/G/1 lognormal cov 2 mean wait, rho 0.7": pk * (1 + 4) / 2,
            "M/G/1 Erlang-4 mean wait, rho 0.7": pk * (1 + 1 / 4) / 2,
            "1F1B bubble, p=4 m=8": 3 / 11, "1F1B bubble, p=8 m=16": 7 / 23,
            "interleaved 1F1B bubble, p=4 m=8 v=2": 3 / 19,
            **{f"data-starved wait fraction, r / (m/T0) = {r:g}": 1 - r
               for r in (0.25, 0.5, 0.75)}}
    assert set(df.index) == set(want)
    for check, ref in want.items():
        assert df.loc[check, "reference"] == pytest.approx(ref, rel=1e-12), check
        assert abs(df.loc[check, "predicted"] / ref - 1) <= df.loc[check, "target"]
        assert df.loc[check, "error"] == pytest.approx(df.loc[check, "predicted"] / ref - 1,
                                                       rel=1e-9)


def test_the_targets_are_the_documented_accuracies(rows):
    """The targets the rows are held to (a looser one would hide a worse model): 2% for the
    1F1B bubbles, 5% for the interleaved one (the stages are not quite the theory's uniform
    ones: the first also holds the embedding, the last the output layer and the loss, and
    interleaving crosses those ends v times as often); 10% for every NCCL row."""
    df = rows.set_index("check")
    assert df.loc["1F1B bubble, p=4 m=8", "target"] == 0.02
    assert df.loc["1F1B bubble, p=8 m=16", "target"] == 0.02
    assert df.loc["interleaved 1F1B bubble, p=4 m=8 v=2", "target"] == 0.05
    nccl = df[df["unit"] == "GB/s"]
    assert len(nccl) == 5 and (nccl["target"] == 0.10).all()


def test_the_report_prints_each_published_rows_breakdown_and_the_sets_errors(monkeypatch):
    """A row with a breakdown is followed by its seconds per iteration by name (the columns'
    ``_s`` dropped); one without has none; each published set ends with its mean and worst
    |error|; the last line counts the rows within target."""
    from twin.validate import CHECKS, Row, format_report

    b = {"compute": 0.125, "exposed_tp": 0.25}
    monkeypatch.setitem(CHECKS, "fake", lambda: [
        Row("published", "mpt-7b 2k", 1.1, 1.0, "s", 0.15, breakdown=b),
        Row("published", "mpt-30b 2k", 0.8, 1.0, "s", 0.10, calibrated=True)])
    out = format_report(run_checks(["fake"])).splitlines()
    assert out[1] == "[published]"
    assert out[2].startswith("mpt-7b 2k ") and out[2].endswith("+10.00%   15.0%  ok")
    assert out[3] == "    s/iter: compute 0.125 exposed_tp 0.25"
    assert out[4].startswith("mpt-30b 2k ") and out[4].endswith("MISS (calibrated)")
    assert out[5:] == ["mpt: 2 rows, mean |error| 15.00%, worst 20.00% (signed mean -5.00%)",
                       "1/2 within target"]


def test_queueing_targets_are_four_standard_errors(rows):
    """The queueing rows' targets: 4 standard errors of the simulated mean (batch means, as
    the note reports it) relative to the theory, at least 1%."""
    df = rows[rows["check"].str.contains("mean wait")]
    for r in df.itertuples():
        se = float(r.note.rsplit("standard error ", 1)[1].removesuffix(" s"))
        assert 0 < se < 0.05 * r.reference
        assert r.target == max(4 * se / r.reference, 0.01)


def test_calibrated_rows_are_marked_and_only_they(rows):
    """Only the NCCL rows that set a catalog number say so; theory rows never."""
    df = rows.set_index("check")
    assert set(df.index[df["calibrated"]]) == {
        "8x H100 NVLink all-reduce (ring)",
        "2x8 H100 NDR400 all-reduce (rail rings), busbw per NIC"}


def test_a_zero_reference_is_met_only_by_zero():
    from twin.validate import Row

    assert Row("t", "c", 0.0, 0.0, "s", 0.0).error == 0.0 and Row("t", "c", 0.0, 0.0, "s", 0.0).ok
    assert Row("t", "c", 1e-30, 0.0, "s", 0.5).error == math.inf
    assert not Row("t", "c", -1.0, 0.0, "s", 0.5).ok
    assert Row("t", "c", 3.0, -2.0, "s", 0.0).error == pytest.approx(2.5)  # against |reference|


@pytest.mark.parametrize("check,large", [("training", False), ("training-large", True)])
def test_the_large_published_rows_run_only_when_asked(monkeypatch, check, large):
    """``training`` runs Korthikanti's two smaller rows, ``training-large`` the 530B and 1T
    ones (minutes each): which is asked of ``twin.published.cases``."""
    import twin.published
    from twin.validate import CHECKS

    asked = []
    monkeypatch.setattr(twin.published, "cases",
                        lambda which, big=False: asked.append((which, big)) or [])
    assert CHECKS[check]() == []
    assert asked == [("korthikanti", large)]


def test_the_cross_node_nccl_row_is_bound_by_its_nics():
    """The 2x8 row's collective crosses the network: its per-NIC bus bandwidth follows the
    NIC's (HDR 200 against NDR 400 ports: at most in proportion, 0.5, and within 10% of it,
    the NVLink steps inside each node being much faster). A ring that stayed inside a node
    (a rank count of gpus / nodes once gave one) would not move at all."""
    from twin.catalogs import catalog
    from twin.validate import _nccl_busbw

    bw = {n: catalog("links").get(n).values["bandwidth_gbps"]
          for n in ("ib-hdr200-port", "ib-ndr400-port")}
    ratio = (_nccl_busbw("h100-sxm", "nvlink4-switch", 8, 2, "ib-hdr200-port", "allreduce",
                         2**30)
             / _nccl_busbw("h100-sxm", "nvlink4-switch", 8, 2, "ib-ndr400-port", "allreduce",
                           2**30))
    want = bw["ib-hdr200-port"] / bw["ib-ndr400-port"]
    assert want <= ratio <= 1.1 * want
