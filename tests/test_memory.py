"""HBM contention between compute and communication (devices.memory) and its wiring.

References are independent of the code under test: M/M/1 waits (Poisson arrivals see time
averages, so the op's mean wait is the M/M/1 one of the merged stream), the M/M/1 sojourn
ratio for latency-bound ops, and work conservation (an oversubscribed FIFO server is busy
all the time, so an op's memory phase stretches to the total offered work).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from devices.memory import (
    FrfcfsContention,
    MemorySpec,
    QueueContention,
    build_memory_model,
)
from twin.kernel.errors import ScenarioError
from twin.kernel.queueing import mm1_mean_wait, service_distribution

from .conftest import ROOT, scenario_dict

SBAR = 1e-9  # s, mean service time of the synthetic models


def queue(dist: str = "exponential", *, op_load: float = 0.4, dma_load: float = 0.1,
          bound: str = "bandwidth", entropy: int = 3, batches: int = 32, **shape):
    return QueueContention(op_load=op_load, dma_load=dma_load, bytes_per_request=5120.0,
                           bound=bound, batches=batches, entropy=entropy,
                           service=service_distribution(dist, mean=SBAR, **shape))


# ------------------------------------------------------------------ slowdown properties
@pytest.mark.parametrize("bound", ["bandwidth", "latency"])
@pytest.mark.parametrize("dist,shape", [("exponential", {}), ("pareto", {"alpha": 1.8}),
                                        ("lognormal", {"cov": 2.0})])
def test_queue_slowdown_is_one_alone_and_rises_with_streams(bound, dist, shape):
    m = queue(dist, op_load=0.6, dma_load=0.08, bound=bound, batches=16, **shape)
    assert np.all(m.table(1024, 0).samples == 1.0)
    tables = [m.table(1024, k).samples for k in range(6)]
    # common random numbers, nested DMA streams and FIFO monotonicity: never faster, batch
    # by batch, when a stream is added
    for lo, hi in itertools.pairwise(tables):
        assert np.all(hi >= lo * (1 - 1e-12))
    means = [t.mean() for t in tables]
    assert means[-1] > means[1] > 1.0


def test_frfcfs_slowdown_is_one_alone_and_rises_with_streams(tiny):
    scen = tiny(memory={"model": "frfcfs", "requests_per_batch": 1024, "batches": 6})
    m = build_memory_model(scen.memory, scen.cluster.device, scen.cluster.link,
                           scen.cluster.links_per_edge, np.random.default_rng(0))
    assert isinstance(m, FrfcfsContention)
    n = m.requests_for(1e9)
    assert n == 1024
    assert np.all(m.table(n, 0).samples == 1.0)
    means = [m.table(n, k).mean for k in (1, 2, 4)]
    assert 1.0 < means[0] < means[1] < means[2]


def test_queue_mm1_mean_wait_of_the_op():
    """Exponential service, Poisson op and DMA streams: the op's mean wait is M/M/1's."""
    m = queue(op_load=0.4, dma_load=0.1)
    for k in range(4):
        lv = m.level(k)
        lam = (0.4 + 0.1 * k) / SBAR
        theory = mm1_mean_wait(lam, 1.0 / SBAR)
        assert lv.converged, lv.warnings
        assert abs(lv.op_mean_wait_s - theory) < 4 * lv.op_mean_wait_se_s, (k, lv)
        assert abs(lv.mean_wait_s - theory) < 4 * lv.mean_wait_se_s
        assert lv.rho == pytest.approx(0.4 + 0.1 * k)


def test_latency_bound_slowdown_is_the_mm1_sojourn_ratio():
    m = queue(op_load=0.4, dma_load=0.1, bound="latency")
    for k in (1, 2, 4):
        tab = m.table(4096, k)
        theory = (1 - 0.4) / (1 - 0.4 - 0.1 * k)  # E[T_k] / E[T_0] of M/M/1
        # batches start empty (a small downward bias) on top of the sampling error
        assert abs(tab.mean - theory) < 3 * tab.standard_error + 0.02 * theory, (k, tab.mean)


@pytest.mark.parametrize("dist,shape", [("exponential", {}), ("pareto", {"alpha": 1.8})])
def test_oversubscribed_bandwidth_slowdown_is_total_work(dist, shape):
    """rho > 1: the server never idles, the op's memory phase stretches to the total work
    (op_load + k dma_load) / op_load x op_load = rho of its span, for any distribution."""
    m = queue(dist, op_load=0.9, dma_load=0.05, **shape)
    for k in (4, 8, 16):
        rho = 0.9 + 0.05 * k
        assert m.table(4096, k).mean == pytest.approx(rho, rel=0.04)
        assert m.level(k).unstable and m.level(k).status == "unstable"


# ------------------------------------------------------------------ heavy tails
def test_pareto_18_is_flagged_25_is_not():
    heavy = queue("pareto", op_load=0.5, dma_load=0.1, alpha=1.8)
    for k in (0, 2):
        lv = heavy.level(k)
        assert lv.variance_infinite and not lv.converged
        assert lv.status == "infinite_variance"
        assert math.isinf(lv.mean_wait_se_s)
        assert any("infinite service variance" in w for w in lv.warnings)
    light = queue("pareto", op_load=0.5, dma_load=0.1, alpha=2.5)
    lv = light.level(2)
    assert not lv.variance_infinite and lv.status != "infinite_variance"
    assert lv.tail_index > 2.0


def test_report_never_presents_a_non_converged_mean_as_converged():
    m = queue("pareto", op_load=0.5, dma_load=0.1, alpha=1.8)
    rng = np.random.default_rng(0)
    for k in (0, 1, 1, 2):
        m.draw(1e8, k, rng, weight=4)
    rep = m.report()
    assert rep["memory_variance_infinite"] and not rep["memory_converged"]
    assert "not converged" in rep["memory_slowdown_is"]
    assert rep["memory_warnings"] and rep["memory_max_transfers"] == 2
    assert [lv["k"] for lv in rep["memory_levels"]] == [0, 1, 2]
    assert rep["memory_levels"][1]["blocks"] == 8


# ------------------------------------------------------------------ caching, determinism
def test_same_entropy_same_tables_in_any_order_different_entropy_differs():
    a, b, c = queue(entropy=5), queue(entropy=5), queue(entropy=6)
    ta2 = a.table(512, 2).samples
    b.table(512, 1)  # another entry first: entries have their own generators
    np.testing.assert_array_equal(b.table(512, 2).samples, ta2)
    assert not np.array_equal(c.table(512, 2).samples, ta2)


def test_draws_are_cached_per_class_and_level_and_seeded():
    m = queue()
    seq = [m.draw(3e8, 2, np.random.default_rng(11)) for _ in range(3)]
    draws_a = [m.draw(3e8, k % 3, rng) for k, rng in
               enumerate([np.random.default_rng(1)] * 300)]
    m2 = queue()
    draws_b = [m2.draw(3e8, k % 3, rng) for k, rng in
               enumerate([np.random.default_rng(1)] * 300)]
    assert draws_a == draws_b
    draws_c = [m2.draw(3e8, k % 3, rng) for k, rng in
               enumerate([np.random.default_rng(2)] * 300)]
    assert draws_c != draws_b
    assert len(m._tables) == 2  # (class, k = 1) and (class, k = 2): k = 0 needs no table
    assert all(s in m.table(m.requests_for(3e8), 2).samples for s in seq)
    assert m.requests_for(1.0) == 16 and m.requests_for(1e12) == m.requests_per_batch
    assert m.requests_for(5120.0 * 100) == 128


def test_clipped_streams_are_reported():
    m = queue()
    m.max_streams = 2
    m.draw(1e6, 5, np.random.default_rng(0))
    rep = m.report()
    assert rep["memory_max_transfers"] == 2
    assert any("max_streams" in w for w in rep["memory_warnings"])


# ------------------------------------------------------------------ scenario input
def test_bad_memory_input_names_field_value_and_allowed(tiny):
    with pytest.raises(ScenarioError) as exc:
        tiny(memory={"model": "magic"})
    p = exc.value.problems[0]
    assert p.path == "memory.model" and p.value == "magic" and "queue" in p.allowed
    with pytest.raises(ScenarioError) as exc:
        tiny(memory={"model": "queue", "service": {"dist": "pareto"}})
    assert [q.path for q in exc.value.problems] == ["memory.service.alpha"]
    with pytest.raises(ScenarioError) as exc:
        tiny(memory={"model": "queue", "service": {"dist": "pareto", "alpha": 0.9}})
    assert exc.value.problems[0].path == "memory.service.alpha"
    with pytest.raises(ScenarioError) as exc:
        tiny(memory={"model": "queue", "service": {"dist": "lognormal", "alpha": 2}})
    paths = sorted(q.path for q in exc.value.problems)
    assert paths == ["memory.service.alpha", "memory.service.cov"]
    with pytest.raises(ScenarioError) as exc:
        tiny(memory={"model": "queue", "service": {"dist": "hyperexponential", "cov": 0.5}})
    assert exc.value.problems[0].path == "memory.service.cov"
    with pytest.raises(ScenarioError) as exc:
        tiny(memory={"model": "queue", "sevice": {}})
    assert exc.value.problems[0].path == "memory.sevice"
    assert "service" in exc.value.problems[0].allowed
    with pytest.raises(ScenarioError) as exc:
        tiny(overrides=["cluster.device.hbm_type=hbm9", "memory.model=frfcfs"])
    p = exc.value.problems[0]
    assert p.path == "cluster.device.hbm_type" and p.value == "hbm9" and "hbm3" in p.allowed
    with pytest.raises(ScenarioError) as exc:
        tiny(memory={"op": {"load": 1.5}})
    assert exc.value.problems[0].path == "memory.op.load"


def test_dma_rate_from_the_link_or_given(tiny):
    scen = tiny(memory={"model": "queue"})
    dev, link = scen.cluster.device, scen.cluster.link
    m = build_memory_model(scen.memory, dev, link, 4, np.random.default_rng(0))
    rate = link.bandwidth_gbps * 1e9 * link.efficiency * 4 * 2
    assert m.dma_load == pytest.approx(rate / (dev.hbm_bandwidth_gbps * 1e9))
    assert m.op_load == dev.memory_efficiency
    assert m.service_mean_s == pytest.approx(32 * 32 * 5 / (dev.hbm_bandwidth_gbps * 1e9))
    spec = MemorySpec.model_validate({"model": "queue", "dma": {"rate_gbps": 100},
                                      "op": {"load": 0.5}})
    m = build_memory_model(spec, dev, link, 4, np.random.default_rng(0))
    assert m.dma_load == pytest.approx(100 / dev.hbm_bandwidth_gbps) and m.op_load == 0.5
    assert build_memory_model(MemorySpec(), dev, link, 4, np.random.default_rng(0)) is None


# ------------------------------------------------------------------ whole runs
OVERLAP = dict(workload__seq_len=2048, workload__micro_batch=4, workload__global_batch=32)


def _run(tiny, memory=None, seed=None):
    from twin.runner import run

    upd = dict(OVERLAP)
    if memory is not None:
        upd["memory"] = memory
    if seed is not None:
        upd["seed"] = seed
    return run(tiny(trace={"enabled": False}, **upd))


def test_run_queue_with_concurrent_allreduce_is_slower_and_flagged(tiny):
    base = _run(tiny).summary
    heavy = _run(tiny, {"model": "queue", "service": {"dist": "pareto", "alpha": 1.8}}).summary
    assert base["memory_model"] == "roofline" and base["memory_converged"]
    assert base["memory_slowdown_mean"] == 1.0 and base["memory_warnings"] == []
    assert heavy["iteration_time_s"] > base["iteration_time_s"]
    assert heavy["compute_time_per_device_s"] > base["compute_time_per_device_s"]
    assert heavy["memory_max_transfers"] >= 1 and heavy["memory_contended_fraction"] > 0
    assert heavy["memory_slowdown_mean"] > 1.0
    assert heavy["memory_variance_infinite"] and not heavy["memory_converged"]
    assert "not converged" in heavy["memory_slowdown_is"]
    assert any("infinite service variance" in w for w in heavy["memory_warnings"])
    assert not heavy["symmetry_used"]  # per-block random draws tell ranks apart
    light = _run(tiny, {"model": "queue", "service": {"dist": "pareto", "alpha": 2.5}}).summary
    assert not light["memory_variance_infinite"]
    assert light["iteration_time_s"] > base["iteration_time_s"]


def test_run_is_deterministic_and_seed_dependent(tiny):
    mem = {"model": "queue", "bound": "latency", "service": {"dist": "lognormal", "cov": 2}}
    a, b = _run(tiny, mem).summary, _run(tiny, mem).summary
    assert a["iteration_time_s"] == b["iteration_time_s"]
    assert a["memory_slowdown_mean"] == b["memory_slowdown_mean"]
    c = _run(tiny, mem, seed=8).summary
    assert c["memory_slowdown_mean"] != a["memory_slowdown_mean"]
    assert c["iteration_time_s"] != a["iteration_time_s"]


def test_run_frfcfs_and_transfers_balance(tiny):
    from twin.build import build
    from twin.kernel.records import Recorder
    from twin.runner import simulate

    scen = tiny(trace={"enabled": False}, memory={"model": "frfcfs", "batches": 8},
                **OVERLAP)
    _, _, ex, _ = simulate(build(scen), Recorder())
    assert all(s.mix == (0, 0) for s in ex.streams)  # every stream started has ended
    rep = ex.accelerators[0].memory.report()
    assert rep["memory_model"] == "frfcfs" and rep["memory_slowdown_mean"] > 1.0
    assert rep["memory_max_transfers"] >= 1


def test_hbm_scenarios_check_and_run(tmp_path):
    from twin.runner import run
    from twin.scenario import load_scenario

    files = sorted((ROOT / "scenarios").glob("hbm_*.yaml"))
    assert len(files) >= 2
    for f in files:
        scen = load_scenario(f, [f"trace.path={tmp_path / f.stem}.h5"])
        assert scen.memory.model != "roofline"
        summary = run(scen).summary
        assert summary["memory_model"] == scen.memory.model
        assert summary["memory_max_transfers"] >= 1


def test_roofline_default_is_unchanged(tiny):
    d = scenario_dict()
    assert "memory" not in d
    a = _run(tiny).summary
    b = _run(tiny, {"model": "roofline"}).summary
    assert a["iteration_time_s"] == b["iteration_time_s"] and b["symmetry_used"]


def test_each_block_beyond_max_streams_counts_once_unless_weighted():
    """A lookup beyond ``max_streams`` counts as one clipped block by default, ``weight``
    blocks when it stands for several; the report says how many."""
    m = queue()
    m.max_streams = 2
    assert m.clip(5) == (2, 0) and m.clip((1, 4)) == (1, 1)
    m.clip(3, weight=3.0)
    assert m.clip(2) == (2, 0)  # within the limit: not clipped
    (w,) = [w for w in m.report()["memory_warnings"] if "max_streams" in w]
    assert w.startswith("5 block(s) ran next to more than max_streams = 2")


def test_offered_load_counts_every_stream_of_the_mix():
    """rho = op load + net x DMA load + h2d x copy load (all shares of the peak bandwidth):
    0.5 + 0.2 + 0.35 = 1.05 with one network stream and one copy, oversubscribed; a model
    made without a copy load (no data path) adds nothing for copies."""
    m = QueueContention(op_load=0.5, dma_load=0.2, h2d_load=0.35, bytes_per_request=5120.0,
                        service=service_distribution("exponential", mean=SBAR))
    assert m.rho((1, 0)) == pytest.approx(0.7)
    assert m.rho((1, 1)) == pytest.approx(1.05)
    assert m.rho((0, 2)) == pytest.approx(1.2)
    plain = queue(op_load=0.5, dma_load=0.2)
    assert plain.rho((1, 2)) == plain.rho((1, 0)) == pytest.approx(0.7)


def test_frfcfs_level_latency_is_the_mean_of_eight_batches(tiny):
    """The FR-FCFS level report's op latency is the mean of the op's mean latency over the
    first 8 batches (of 12) of the level's op class, with the standard error of those 8
    (ddof 1, / sqrt 8)."""
    scen = tiny(memory={"model": "frfcfs", "requests_per_batch": 256, "batches": 12})
    m = build_memory_model(scen.memory, scen.cluster.device, scen.cluster.link,
                           scen.cluster.links_per_edge, np.random.default_rng(0))
    m.table(256, (1, 0))
    lat = np.array([m.batch(256, (1, 0), r)[1].op_mean_latency_s for r in range(8)])
    rep = m.level((1, 0))
    assert rep.mean_wait_s == pytest.approx(lat.mean(), rel=1e-12)
    assert rep.mean_wait_se_s == pytest.approx(lat.std(ddof=1) / math.sqrt(8), rel=1e-12)
