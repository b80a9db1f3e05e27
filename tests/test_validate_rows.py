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
