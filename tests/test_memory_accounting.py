"""The HBM contention models' bookkeeping (devices.memory): what a run reports about the
draws it made, clipping of stream mixes, the transfer caps, and the diagnostic runs' size.

References are independent of the code under test: the draws themselves (a report's mean,
maximum and block counts are sums and maxima of the values the test received), the
documented clipping rule (network streams first, at most ``max_streams`` in all), Poisson
counts (a stationary run of ``n`` requests in all holds ``n`` within a few ``sqrt(n)``), the
M/M/1 sojourn of an op alone, and work conservation for the transfer caps (an
oversubscribed FIFO server gives every stream its share of the peak, less than it offers).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from devices.memory import FrfcfsContention, QueueContention, build_memory_model
from twin.kernel.errors import ScenarioError
from twin.kernel.queueing import service_distribution

SBAR = 1e-9  # s, mean service time of the synthetic models
REQ = 5120.0  # device bytes behind one request


def queue(op_load=0.4, dma_load=0.1, h2d_load=0.0, **kw):
    return QueueContention(op_load=op_load, dma_load=dma_load, h2d_load=h2d_load,
                           bytes_per_request=REQ, entropy=7, batches=16,
                           service=service_distribution("exponential", mean=SBAR), **kw)


# ------------------------------------------------------------------ the report of the draws
def test_report_of_draws_is_their_weighted_mean_and_maximum():
    m = queue()
    rng = np.random.default_rng(3)
    got = [(k, w, m.draw(2e7, k, rng, weight=w)) for k, w in
           [(1, 2.0), (2, 1.0), (0, 3.0), (2, 5.0), (1, 1.0), (3, 0.5)]]
    rep = m.report()
    total = sum(w for _k, w, _s in got)
    assert rep["memory_slowdown_mean"] == pytest.approx(
        sum(w * s for _k, w, s in got) / total, rel=1e-12)
    assert rep["memory_slowdown_max"] == max(s for *_, s in got)
    assert rep["memory_contended_fraction"] == pytest.approx(
        sum(w for k, w, _s in got if k) / total, rel=1e-12)
    blocks = {lv["k"]: lv["blocks"] for lv in rep["memory_levels"]}
    assert blocks == {0: 3.0, 1: 3.0, 2: 6.0, 3: 0.5}


def test_recorded_slowdowns_count_like_draws():
    """``record`` / ``record_many`` book ops whose slowdown came from elsewhere (the device
    streams): the level's block count and mean and the run's maximum are theirs."""
    m = queue()
    m.record((2, 0), 1.5, 2.0)
    m.record_many((2, 0), [1.25, 3.0, 1.0], 0.5)
    m.record((0, 0), 1.0, 4.0)
    rep = m.report()
    (lv0, lv2) = rep["memory_levels"]
    assert (lv0["k"], lv0["blocks"], lv0["slowdown_mean"]) == (0, 4.0, 1.0)
    assert lv2["blocks"] == pytest.approx(2.0 + 3 * 0.5)
    assert lv2["slowdown_mean"] == pytest.approx((2 * 1.5 + 0.5 * 5.25) / 3.5, rel=1e-12)
    assert rep["memory_slowdown_max"] == 3.0
    assert rep["memory_slowdown_mean"] == pytest.approx((4 + 3 + 2.625) / 7.5, rel=1e-12)


def test_a_block_with_no_transfer_beside_it_is_not_slowed():
    m = queue()
    block = SimpleNamespace(bytes=1e8)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    assert m.draw_block(block, 0, rng, weight=2.0, count=3) == [1.0, 1.0, 1.0]
    assert rng.bit_generator.state == state                      # nothing drawn
    lv = m.report()["memory_levels"][0]
    assert (lv["k"], lv["blocks"], lv["slowdown_mean"]) == (0, 6.0, 1.0)
    assert m.draw_block(block, 2, rng) >= 1.0 and m._bucket[id(block)] == m.requests_for(1e8)
    assert m._weight[(2, 0)] == 1.0  # one op, of weight 1 unless told


@pytest.mark.parametrize("mix, kept", [((20, 0), (16, 0)), ((10, 10), (10, 6)),
                                       ((0, 17), (0, 16)), ((9, 7), (9, 7)), (5, (5, 0))])
def test_clipping_keeps_network_streams_first(mix, kept):
    m = queue()
    assert m.clip(mix, 2.0) == kept
    clipped = sum(mix) > 16 if isinstance(mix, tuple) else mix > 16
    assert m._clipped == (2.0 if clipped else 0.0)


def test_model_refuses_an_op_load_above_the_peak():
    for bad in (1.5, 0.0):
        with pytest.raises(ScenarioError) as exc:
            queue(op_load=bad)
        assert [p.path for p in exc.value.problems] == ["memory.op.load"]
    assert queue(op_load=1.0).op_load == 1.0


# ------------------------------------------------------------------ transfer caps
def test_saturated_mix_caps_each_kind_at_its_share():
    """Op at 0.6 of the peak, 4 network streams at 0.2 and 2 copy streams at 0.15 offer
    1.7: the FIFO server, never idle while the op runs, gives every request the same chance,
    so each stream gets about its offered load / 1.7 of the peak; both kinds are capped
    below what they offer, network streams in all (4 x), copies per stream."""
    m = queue(op_load=0.6, dma_load=0.2, h2d_load=0.15)
    peak = REQ / SBAR
    net, h2d = m.dma_caps((4, 2))
    offered_net, offered_h2d = m.offered_bytes_per_s()
    assert (offered_net, offered_h2d) == pytest.approx((0.2 * peak, 0.15 * peak), rel=1e-12)
    assert net == pytest.approx(4 * 0.2 * peak / 1.7, rel=0.05)
    assert h2d == pytest.approx(0.15 * peak / 1.7, rel=0.05)
    # one kind alone, saturated too (0.6 + 3 x 0.2 = 1.2; 0.6 + 3 x 0.15 = 1.05)
    assert m.dma_caps((3, 0))[0] == pytest.approx(3 * 0.2 * peak / 1.2, rel=0.05)
    assert m.dma_caps((3, 0))[1] == math.inf
    only = m.dma_caps((0, 3))
    assert only[0] == math.inf and only[1] == pytest.approx(0.15 * peak / 1.05, rel=0.05)


def test_light_mix_is_not_capped():
    m = queue(op_load=0.3, dma_load=0.05, h2d_load=0.05)
    assert m.dma_caps((2, 1)) == (math.inf, math.inf)
    assert m.dma_caps((0, 0)) == (math.inf, math.inf)


# ------------------------------------------------------------------ diagnostic runs
@pytest.mark.parametrize("op_load, dma_load, k", [(0.5, 0.2, 1), (0.3, 0.1, 4), (0.8, 0.0001, 1)])
def test_stationary_run_holds_n_requests_in_all(op_load, dma_load, k):
    """n x op_load / rho of the requests are the op's; the streams' Poisson counts over the
    op's span make up the rest: n in all, within 6 sqrt(n)."""
    n = 1 << 14
    m = queue(op_load=op_load, dma_load=dma_load)
    times, services, is_op, _res = m.stationary(k, n, np.random.default_rng(5))
    assert int(is_op.sum()) == round(n * op_load / m.rho(k))
    assert abs(times.size - n) < 6 * math.sqrt(n)
    assert np.all(np.diff(times) >= 0) and services.size == times.size


def test_fresh_latency_of_an_op_alone_averages_one():
    """k = 0: the op's own mean sojourn over the mean of its alone batches; the draws
    average 1 (M/M/1 at the op's load both ways), within 4 standard errors."""
    m = queue(op_load=0.5)
    rng = np.random.default_rng(1)
    x = np.array([m.fresh_latency(256, 0, rng) for _ in range(400)])
    assert np.all(np.isfinite(x))
    assert abs(x.mean() - 1.0) < 4 * x.std(ddof=1) / math.sqrt(x.size) + 0.02


def test_fresh_batches_laid_end_to_end_start_on_an_empty_server():
    """Two batches on one axis: the gap before the second batch's first point covers all
    the work of the first (so it begins on an empty server)."""
    m = queue(op_load=0.6, dma_load=0.2)
    n = 64
    gaps, services, ops = m.fresh_inputs(n, 2, np.random.default_rng(2), 2)
    start = int(ops[n - 1]) + 1
    assert gaps[start] >= services[:start].sum()


# ------------------------------------------------------------------ the FR-FCFS model
@pytest.fixture(scope="module")
def frfcfs_model():
    from twin.scenario import load_scenario

    from .conftest import scenario_dict

    d = scenario_dict(memory={"model": "frfcfs", "requests_per_batch": 256, "batches": 4})
    d["trace"] = {"enabled": False}
    scen = load_scenario(d)
    dev = scen.cluster.device

    def make(h2d=0.0, op_load=None):
        spec = scen.memory if op_load is None else scen.memory.model_copy(
            update={"op": scen.memory.op.model_copy(update={"load": op_load})})
        return build_memory_model(spec, dev, scen.cluster.link, scen.cluster.links_per_edge,
                                  np.random.default_rng(0), h2d_bytes_per_s=h2d)
    return make, dev


def test_frfcfs_copy_stream_offers_its_pcie_rate(frfcfs_model):
    make, dev = frfcfs_model
    m = make(h2d=25e9)
    assert isinstance(m, FrfcfsContention)
    assert m.offered_bytes_per_s()[1] == pytest.approx(25e9, rel=1e-12)
    assert m.h2d_load == pytest.approx(25e9 / (dev.hbm_bandwidth_gbps * 1e9), rel=1e-12)
    assert make().offered_bytes_per_s()[1] == 0.0


def test_frfcfs_copy_streams_are_the_standalone_controller_beside_a_pcie_writer(frfcfs_model):
    """A block beside one host-to-device copy (mix (0, 1)), and beside a copy and a network
    stream (1, 1): each batch's slowdown is the FR-FCFS engine's run standalone on the same
    inputs, the copy stream built here from the catalog and the data path (HBM writes only,
    in whole rows, at its rate per stack) and the same random numbers. (The copy's rate is
    ten PCIe 5 x16 links', so that a 256-request op meets enough of its requests to slow.)"""
    from devices.hbm import StreamSpec, effective_bandwidth, load_hbm_spec

    make, dev = frfcfs_model
    h2d = 640e9
    m = make(h2d=h2d)
    hbm, stacks = load_hbm_spec(dev.hbm_type), dev.hbm_stacks
    peak = dev.hbm_bandwidth_gbps * 1e9
    n = 256
    op = StreamSpec(n_requests=n, arrival="poisson",
                    rate_bytes_per_s=dev.memory_efficiency * peak / stacks,
                    read_fraction=2 / 3, row_locality=0.9)
    for mix in ((0, 1), (1, 1)):
        streams = m._streams(n, mix)[1]  # their lengths (inputs of the run)
        copy = StreamSpec(n_requests=streams[-1].n_requests, arrival="poisson",
                          rate_bytes_per_s=h2d / stacks, read_fraction=0.0,
                          row_locality=0.97, interleave="random")
        beside = [copy]
        if mix[0]:
            beside.insert(0, streams[0])
        tab = m.table(n, mix)
        assert tab.mean > 1.0
        for r in range(m.batches):
            alone = effective_bandwidth(hbm, stacks, op, [], m._rng(0, n, r))
            same = effective_bandwidth(hbm, stacks, op, beside, m._rng(0, n, r),
                                       op_alone_bytes_per_s=alone.op_bandwidth_bytes_per_s)
            assert tab.samples[r] == pytest.approx(same.slowdown, rel=1e-12), (mix, r)


def test_a_cap_needs_the_mean_three_standard_errors_below_the_offered_rate(frfcfs_model):
    """The DMA cap rule on measured windows set by hand (4 batches, one stream): values
    ``rate (c +- d)`` have mean ``c rate`` and standard error ``d rate sqrt(4/3) / 2`` (the
    sample standard deviation over sqrt(4)); with d = 0.1 that is 0.0577 rate, so c = 0.82
    (mean + 3 se = 0.993 rate) is capped at its mean and c = 0.84 (1.013 rate) is not."""
    from devices.memory_results import SlowdownTable

    make, _dev = frfcfs_model
    for c, capped in ((0.82, True), (0.84, False)):
        m = make()
        n, mix = m.requests_per_batch, (1, 0)
        rate = m.offered_bytes_per_s()[0]
        m._tables[(n, mix)] = SlowdownTable(n, 1, np.full(m.batches, 1.5), mix)
        m._windows[(n, mix)] = rate * (c + 0.1 * np.array([[-1.0], [1.0], [-1.0], [1.0]]))
        cap = m.dma_caps(mix)[0]
        assert cap == (pytest.approx(c * rate, rel=1e-12) if capped else math.inf), c


def test_saturation_is_where_the_offered_load_reaches_the_peak():
    """``saturation_streams``: the (fractional) number of network streams at which
    ``rho = op_load + k dma_load`` is 1."""
    for op_load, dma_load in ((0.4, 0.1), (0.7, 0.04), (0.95, 0.3)):
        m = queue(op_load=op_load, dma_load=dma_load)
        k = m.saturation_streams
        assert op_load + k * dma_load == pytest.approx(1.0, rel=1e-12)


def test_frfcfs_oversubscribed_level_is_unstable(frfcfs_model):
    make, _dev = frfcfs_model
    m = make(op_load=0.95)
    k = math.ceil(0.06 / m.dma_load) + 1          # rho = 0.95 + k dma_load > 1
    m.table(256, k)
    lv = m.level(k)
    assert m.rho(k) >= 1.0 and lv.status == "unstable" and lv.unstable
    light = make(op_load=0.3)
    light.table(256, 1)
    assert light.rho(1) < 1.0 and light.level(1).status != "unstable"


def test_frfcfs_level_settles_on_the_relative_standard_error(frfcfs_model):
    """A level is ``not_settled`` when its slowdown's standard error exceeds 5% of its mean:
    tables of mean 4 with a 3% and a 7.5% relative standard error (set by hand)."""
    from devices.memory_results import SlowdownTable

    make, _dev = frfcfs_model
    base = np.array([-1.0, 1.0] * 8)                  # mean 0, sd 1.033, se 0.258
    for rel, status in ((0.03, "converged"), (0.075, "not_settled")):
        m = make(op_load=0.3)
        samples = 4.0 + base * (rel * 4.0 / (base.std(ddof=1) / 4.0))
        tab = SlowdownTable(256, 1, samples, (1, 0))
        assert tab.standard_error / tab.mean == pytest.approx(rel, rel=1e-9)
        m._tables[(256, (1, 0))] = tab
        assert m.level(1).status == status


def test_frfcfs_latency_view_is_the_ratio_of_mean_latencies(frfcfs_model):
    """``bound: latency``: a batch's slowdown is its op's mean request latency beside the
    streams over the same op's alone (module docstring), so 1 <= s and it grows with the
    streams; the standalone FR-FCFS engine run on the same inputs gives the same ratio."""
    make, _dev = frfcfs_model
    m = make(op_load=0.6)
    m.bound = "latency"
    assert np.all(m.table(256, 0).samples == 1.0)
    lo, hi = m.table(256, 1).samples, m.table(256, 4).samples
    assert np.all(lo > 0.99) and hi.mean() > lo.mean() > 1.0 and hi.mean() < 50
    s, eb = m.batch(256, 4, 0)
    s0, alone = m.batch(256, 0, 0)
    assert s0 == 1.0  # an op alone is not slowed
    assert s == pytest.approx(eb.op_mean_latency_s / alone.op_mean_latency_s, rel=1e-12)
    assert s == hi[0]


def test_a_stream_that_sends_nothing_leaves_the_op_as_it_was():
    """A DMA stream whose rate gives it no request during the op (1e-12 of the peak: about
    1e-8 expected requests over a 1024-request op) changes nothing: with common random
    numbers the op's queue is the one it had alone, so every batch's slowdown is exactly 1,
    in both views."""
    for bound in ("bandwidth", "latency"):
        m = queue(op_load=0.5, dma_load=1e-12, bound=bound)
        assert np.all(m.table(1024, 1).samples == 1.0), bound


# ------------------------------------------------------------------ windows by a plain loop
@pytest.mark.parametrize("k", [(1, 0), (2, 0), (1, 2)])
def test_queue_windows_against_a_plain_fifo_loop(k):
    """What each stream got while the op ran (``batch_windows``), against a plain loop over
    the same arrivals: merged in time order (ties: the op, then the streams in order), served
    first come first served by one server, each stream's departures counted between the op's
    first arrival and its last departure, times the request's bytes, over that span; the
    slowdown is the op's span over its span alone."""
    m = queue(op_load=0.5, dma_load=0.2, h2d_load=0.15)
    n, r = 64, 3
    s, _waits, win = m.batch_windows(n, k, r)
    arr, srv, span0, _soj0 = m._op_batch(n, r)  # the batch's inputs, from its generators
    streams = [(0, arr, srv)]
    for j in range(1, k[0] + 1):
        streams.append((j, *m._dma(n, r, j, float(arr[-1]))))
    for j in range(1, k[1] + 1):
        streams.append((k[0] + j, *m._dma(n, r, 1000 + j, float(arr[-1]),
                                          m.h2d_load / m.service_mean_s)))
    jobs = sorted(((float(t), who, i) for who, a, _s in streams for i, t in enumerate(a)),
                  key=lambda x: (x[0], x[1], x[2]))
    free, dep = 0.0, []
    for t, who, i in jobs:
        free = max(free, t) + float(streams[who][2][i])
        dep.append((who, free))
    t0 = float(arr[0])
    t1 = max(d for who, d in dep if who == 0)
    counts = [sum(1 for who, d in dep if who == j and t0 <= d <= t1)
              for j in range(1, len(streams))]
    assert win.tolist() == pytest.approx([c * REQ / (t1 - t0) for c in counts], rel=1e-12,
                                         abs=0)
    assert s == pytest.approx((t1 - t0) / span0, rel=1e-12, abs=0)
    assert sum(counts) > 0


# ------------------------------------------------------------------ the results' own rules


def test_a_run_without_a_contention_model_reports_no_contention(tiny):
    """``memory.model: roofline`` (the default): no block is slowed, none shares HBM, nothing
    can fail to converge; the keys say so exactly."""
    from twin.runner import run

    s = run(tiny()).summary
    assert s["memory_model"] == "roofline" and s["memory_bound"] == "bandwidth"
    assert s["memory_slowdown_mean"] == 1.0 and s["memory_slowdown_max"] == 1.0
    assert s["memory_contended_fraction"] == 0.0 and s["memory_max_transfers"] == 0
    assert s["memory_converged"] is True
    assert s["memory_variance_infinite"] is False and s["memory_unstable"] is False
    assert s["memory_warnings"] == [] and s["memory_levels"] == []
    assert "exact" in s["memory_slowdown_is"]


def test_standard_error_of_two_batches_is_half_their_distance():
    """Two samples a, b: sample standard deviation |a - b| / sqrt(2), over sqrt(2)."""
    from devices.memory_results import SlowdownTable

    assert SlowdownTable(8, 1, np.array([1.2, 1.5]), (1, 0)).standard_error == pytest.approx(0.15)
    assert SlowdownTable(8, 1, np.array([1.2]), (1, 0)).standard_error == math.inf
