"""HBM controller: compiled FR-FCFS engine vs the plain-Python reference, policy, catalog.

The engine and the reference are two independent implementations of one policy; they must agree
bit for bit. The behavioural tests check the policy against what it promises (FR-FCFS reorders,
locality raises the hit rate, refresh costs tRFC/tREFI, streaming reaches the bus bandwidth) with
tolerances derived from the timing parameters, not pinned seeded numbers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from devices.hbm import (
    CONFLICT,
    HIT,
    MISS,
    HbmContention,
    HbmRequests,
    HbmSpec,
    StreamSpec,
    effective_bandwidth,
    generate_requests,
    hbm_catalog,
    load_hbm_spec,
    simulate,
    simulate_reference,
    spec_from_entry,
)
from devices.hbm.aot import _load_aot
from twin.kernel.catalog import CatalogEntry
from twin.kernel.errors import ScenarioError

NS = 1e-9

# a small stack with short, distinct timings (ns) so that refresh, turnarounds, tFAW and the
# queue bound all bite within a few dozen requests
TINY = {
    "name": "tiny",
    "channels": 2,
    "stack_ids": 1,
    "bank_groups": 2,
    "banks_per_group": 2,
    "row_bytes": 64,
    "burst_bytes": 32,
    "channel_width_bits": 32,
    "data_rate_gbps": 8.0,  # 32 GB/s per channel: one burst = 1 ns
    "tCL_ns": 3.0,
    "tCWL_ns": 2.0,
    "tRCD_ns": 3.0,
    "tRP_ns": 3.0,
    "tRAS_ns": 7.0,
    "tRTP_ns": 2.0,
    "tWR_ns": 3.0,
    "tWTR_ns": 2.0,
    "rd_to_wr_gap_ns": 1.0,
    "tCCD_L_ns": 2.0,
    "tRRD_ns": 1.0,
    "tFAW_ns": 6.0,
    "tREFI_ns": 60.0,
    "tRFC_ns": 10.0,
    "queue_depth": 4,
}


def tiny(**changes: float) -> HbmSpec:
    return HbmSpec(**{**TINY, **changes})


def requests(arrival_ns, channel, bank, row, write=None, stream=None) -> HbmRequests:
    return HbmRequests.from_arrays(np.asarray(arrival_ns, dtype=float) * NS, channel, bank, row,
                                   write, stream)


#: the builds of the compiled loop to check (the ahead-of-time one when it is built and current)
BUILDS = ["jit", *(["aot"] if _load_aot() is not None else [])]


def assert_same(spec: HbmSpec, req: HbmRequests, refresh: bool = True) -> None:
    ref = simulate_reference(spec, req, refresh=refresh)
    for build in BUILDS:
        fast = simulate(spec, req, refresh=refresh, build=build)
        np.testing.assert_array_equal(fast.completion_s, ref.completion_s)
        np.testing.assert_array_equal(fast.kind, ref.kind)
        assert np.all(fast.completion_s > req.arrival_s)


# ---------------------------------------------------------------- engine == reference


@st.composite
def cases(draw):
    params = dict(
        queue_depth=draw(st.integers(1, 6)),
        tCL_ns=draw(st.sampled_from([1.0, 3.0, 4.5])),
        tCWL_ns=draw(st.sampled_from([0.0, 2.0, 5.0])),
        tRCD_ns=draw(st.sampled_from([0.0, 3.0, 7.0])),
        tRP_ns=draw(st.sampled_from([0.0, 3.0])),
        tRAS_ns=draw(st.sampled_from([0.0, 7.0, 20.0])),
        tWR_ns=draw(st.sampled_from([0.0, 3.0, 9.0])),
        tCCD_L_ns=draw(st.sampled_from([0.0, 2.0, 3.0])),
        tFAW_ns=draw(st.sampled_from([0.0, 6.0, 15.0])),
        tREFI_ns=draw(st.sampled_from([45.0, 70.0, 500.0])),
        tRFC_ns=draw(st.sampled_from([0.0, 5.0, 20.0])),
        bank_groups=draw(st.sampled_from([1, 2])),
    )
    try:
        spec = tiny(**params)
    except ValidationError:  # refresh interval too short for these timings
        assume(False)
    n = draw(st.integers(1, 40))
    ints = st.lists(st.integers(0, 1), min_size=n, max_size=n)
    arrival = draw(st.lists(st.integers(0, 120), min_size=n, max_size=n))  # ties are likely
    req = requests(
        np.asarray(arrival) * 0.5,
        draw(ints),
        draw(st.lists(st.integers(0, spec.banks_per_channel - 1), min_size=n, max_size=n)),
        draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)),
        draw(st.lists(st.booleans(), min_size=n, max_size=n)),
    )
    return spec, req, draw(st.booleans())


@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_engine_equals_reference_on_random_small_cases(case):
    spec, req, refresh = case
    assert_same(spec, req, refresh=refresh)


@pytest.mark.parametrize("locality", [0.0, 0.6, 0.95])
def test_engine_equals_reference_on_generated_mixed_streams(locality):
    spec = load_hbm_spec("hbm3").model_copy(update={"channels": 4, "queue_depth": 8})
    streams = [
        StreamSpec(n_requests=1000, read_fraction=0.7, row_locality=locality),
        StreamSpec(n_requests=500, arrival="poisson", rate_bytes_per_s=40e9, read_fraction=0.0,
                   row_locality=0.9, interleave="random"),
        StreamSpec(n_requests=200, arrival="periodic", rate_bytes_per_s=10e9,
                   row_locality=0.0, interleave="random", start_s=2e-7),
    ]
    req = generate_requests(spec, np.random.default_rng(7), streams, rows_per_bank=64)
    assert_same(spec, req)


def test_engine_equals_reference_when_refresh_interrupts_a_backlog():
    spec = tiny(queue_depth=3, tREFI_ns=40.0, tRFC_ns=8.0)
    n = 60
    req = requests(np.zeros(n), np.zeros(n, int), np.arange(n) % 4, (np.arange(n) // 8) % 3,
                   np.arange(n) % 5 == 0)
    assert_same(spec, req)
    assert_same(spec, req, refresh=False)


def test_multithreaded_engine_is_identical():
    spec = load_hbm_spec("hbm2e")
    req = generate_requests(spec, np.random.default_rng(3),
                            [StreamSpec(n_requests=20000, read_fraction=0.5, row_locality=0.8)])
    one, two = simulate(spec, req), simulate(spec, req, workers=2)
    np.testing.assert_array_equal(one.completion_s, two.completion_s)
    np.testing.assert_array_equal(one.kind, two.kind)


# ---------------------------------------------------------------- the policy


def test_fr_fcfs_serves_a_younger_row_hit_before_an_older_conflict():
    spec = tiny(channels=1)
    # 0 opens row 5 of bank 0; 1 (older) needs row 6 of bank 0; 2 (younger) hits row 5
    req = requests([0.0, 1.0, 2.0], [0, 0, 0], [0, 0, 0], [5, 6, 5])
    res = simulate(spec, req)
    assert list(res.kind) == [MISS, CONFLICT, HIT]
    assert res.completion_s[2] < res.completion_s[1]
    # first-come-first-served would have finished request 1 first: FR-FCFS reordered
    assert_same(spec, req)
    # the hit's burst follows the first one back to back on the bus (tCCD_L = 2 ns bound)
    tb = spec.burst_time_s
    assert res.completion_s[2] == pytest.approx(res.completion_s[0] + max(tb, 2 * NS), rel=1e-12)


def test_a_hit_served_before_an_older_conflict_in_queue_slot_0():
    """As above, but request 0 has left the queue before 1 arrives, so the older conflict
    holds queue slot 0 when the younger hit is unlinked from the bank's list in front of it:
    the conflict must stay queued and be served after the hit."""
    spec = tiny(channels=1, tRFC_ns=0.0, tREFI_ns=1e6)
    req = requests([0.0, 30.0, 30.0], [0, 0, 0], [0, 0, 0], [5, 6, 5])  # 1 before 2 by index
    res = simulate(spec, req)
    assert list(res.kind) == [MISS, CONFLICT, HIT]
    assert res.completion_s[0] < 30 * NS < res.completion_s[2] < res.completion_s[1]
    assert_same(spec, req)


def test_oldest_first_among_ready_hits_and_index_breaks_ties():
    spec = tiny(channels=1, tRFC_ns=0.0, tREFI_ns=1e6)
    # row 1 of banks 0 and 1 opened early; later hits: by age, and equal times by index
    req = requests([0, 0, 50, 40, 60, 60], [0] * 6, [0, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1])
    res = simulate(spec, req)
    assert list(res.kind) == [MISS, MISS, HIT, HIT, HIT, HIT]
    c = res.completion_s
    assert c[3] < c[2]  # arrived at 40 ns although its index is larger
    assert c[4] < c[5]  # same arrival (60 ns): the lower index first
    assert_same(spec, req)


def test_queue_bound_admits_waiting_requests_in_order():
    spec = tiny(channels=1, queue_depth=1, tREFI_ns=1e6, tRFC_ns=0.0)
    # with one slot there is no choice: strictly first come first served, even for hits
    req = requests([0, 1, 2], [0, 0, 0], [0, 0, 0], [5, 6, 5])
    res = simulate(spec, req)
    assert list(res.kind) == [MISS, CONFLICT, CONFLICT]
    assert res.completion_s[0] < res.completion_s[1] < res.completion_s[2]
    assert_same(spec, req)


@pytest.mark.parametrize("name", ["hbm3"])
def test_row_hit_rate_rises_with_locality(name):
    spec = load_hbm_spec(name)
    rates = []
    for loc in (0.0, 0.5, 0.9):
        req = generate_requests(spec, np.random.default_rng(11),
                                [StreamSpec(n_requests=20000, row_locality=loc)])
        rates.append(simulate(spec, req).row_hit_rate)
    assert rates[0] < rates[1] < rates[2]
    # a lone stream keeps its row open, so a request that stays in its row hits unless a
    # refresh closed the row meanwhile (about one run per channel per tREFI, i.e. < 1% here);
    # a jump lands on the open row with probability 1/rows_per_bank. Binomial standard error
    # of a rate over 20000 requests is <= 0.0035, so +-0.03 is a > 8-sigma band.
    for loc, rate in zip((0.0, 0.5, 0.9), rates, strict=True):
        assert rate == pytest.approx(loc, abs=0.03)


def _streaming(spec: HbmSpec, per_channel: int, write: bool = False) -> HbmRequests:
    """Backlogged bursts, each channel cycling over banks of distinct bank groups, one row."""
    groups = spec.bank_group_count
    n = per_channel * spec.channels
    k = np.arange(n)
    channel = k % spec.channels
    bank = (k // spec.channels) % groups  # bank b is in group b mod groups
    return HbmRequests.from_arrays(np.zeros(n), channel, bank, np.full(n, 3),
                                   np.full(n, write))


@pytest.mark.parametrize("write", [False, True])
def test_streaming_reaches_the_data_bus_bandwidth(write):
    spec = load_hbm_spec("hbm3")
    per_channel = 4000
    res = simulate(spec, _streaming(spec, per_channel, write), refresh=False)
    peak = spec.stack_bandwidth_bytes_per_s
    # bursts go back to back; the only loss is the pipeline fill (ACT + CAS latency) before the
    # first burst of each channel: at most (tRCD + tCL + tCWL) over per_channel bursts.
    fill = (spec.tRCD_ns + spec.tCL_ns + spec.tCWL_ns) * NS
    lower = peak * per_channel * spec.burst_time_s / (per_channel * spec.burst_time_s + fill)
    assert lower <= res.bandwidth_bytes_per_s <= peak * (1 + 1e-9)
    assert res.bandwidth_bytes_per_s > 0.99 * peak
    assert res.row_hit_rate > 1 - spec.bank_group_count / per_channel - 1e-12


def test_refresh_costs_trfc_over_trefi():
    spec = load_hbm_spec("hbm3").model_copy(update={"channels": 1})
    intervals = 80
    per_channel = int(intervals * spec.tREFI_ns * NS / spec.burst_time_s)
    req = _streaming(spec, per_channel)
    on, off = simulate(spec, req), simulate(spec, req, refresh=False)
    ratio = on.bandwidth_bytes_per_s / off.bandwidth_bytes_per_s
    refi, rfc = spec.tREFI_ns, spec.tRFC_ns
    # each refresh takes the bus for tRFC, plus re-opening the closed row (tRCD) and refilling
    # the read pipeline (at most tCL + one burst) afterwards; the run ends inside an interval, so
    # the refresh share of the run may differ from tRFC/tREFI by up to one refresh out of
    # `intervals`.
    extra = spec.tRCD_ns + spec.tCL_ns + spec.burst_time_s / NS
    lower = 1 - (rfc + extra) / refi - rfc / refi / intervals
    upper = 1 - rfc / refi + rfc / refi / intervals
    assert lower <= ratio <= upper
    assert on.refresh_fraction == pytest.approx(rfc / refi, abs=rfc / refi / intervals)
    assert off.refresh_fraction == 0.0
    assert_same(spec.model_copy(update={"tREFI_ns": 300.0, "tRFC_ns": 60.0}),
                _streaming(spec, 700))


# ---------------------------------------------------------------- results and generator


def test_aggregates_and_per_stream_statistics():
    spec = tiny()
    req = requests([0, 0, 1, 3, 3, 9], [0, 1, 0, 1, 0, 0], [0, 1, 0, 2, 3, 0], [1, 1, 1, 2, 0, 4],
                   [False, True, False, False, True, False], [0, 1, 0, 1, 1, 0])
    res = simulate(spec, req)
    lat = res.completion_s - req.arrival_s
    assert res.mean_latency_s == pytest.approx(lat.mean())
    assert res.p99_latency_s == pytest.approx(np.quantile(lat, 0.99))
    assert res.total_bytes == 6 * 32
    assert res.bandwidth_bytes_per_s == pytest.approx(192 / res.completion_s.max())
    assert res.row_hit_rate + res.row_miss_rate + res.row_conflict_rate == pytest.approx(1.0)
    table = res.per_stream()
    assert list(table["stream"]) == [0, 1]
    assert table["requests"].sum() == 6
    s1 = req.stream == 1
    span = res.completion_s[s1].max() - req.arrival_s[s1].min()
    assert table.loc[1, "bandwidth_bytes_per_s"] == pytest.approx(3 * 32 / span)
    assert set(res.summary()) >= {"bandwidth_bytes_per_s", "row_hit_rate", "mean_latency_s",
                                  "p99_latency_s", "refresh_fraction"}
    # one request alone finds its bank closed: a miss, all of the (one-request) run
    one = simulate(spec, requests([0], [0], [0], [5]))
    assert (one.row_hit_rate, one.row_miss_rate, one.row_conflict_rate) == (0.0, 1.0, 0.0)
    assert one.completion_s.max() < spec.tREFI_ns * NS and one.refresh_fraction == 0.0
    # its makespan is its own sojourn: a miss's activate, CAS latency and burst after t = 0
    assert one.makespan_s == one.completion_s[0] - one.requests.arrival_s[0] > 0.0
    assert one.makespan_s >= (spec.tRCD_ns + spec.tCL_ns) * NS + spec.burst_time_s


def test_refresh_fraction_is_the_windows_share_of_the_run():
    """Refresh windows [j tREFI, j tREFI + tRFC], j = 1, 2, ...: the share of [0, last
    completion] they cover, summed window by window here, for a backlog that spans several."""
    spec = tiny(queue_depth=3, tREFI_ns=40.0, tRFC_ns=8.0)
    n = 60
    req = requests(np.zeros(n), np.zeros(n, int), np.arange(n) % 4, (np.arange(n) // 8) % 3)
    res = simulate(spec, req)
    end = float(res.completion_s.max())
    refi, rfc = 40.0 * NS, 8.0 * NS
    assert end > 3 * refi
    covered = sum(max(0.0, min(end, j * refi + rfc) - j * refi)
                  for j in range(1, int(end / refi) + 2))
    assert res.refresh_fraction == pytest.approx(covered / end, rel=1e-12)
    assert simulate(spec, req, refresh=False).refresh_fraction == 0.0


def test_an_empty_stream_has_no_requests_and_no_problem():
    """A stream of 0 bytes or 0 requests is valid and makes no request; a negative one is
    refused."""
    spec = load_hbm_spec("hbm3")
    for empty in (StreamSpec(nbytes=0), StreamSpec(n_requests=0)):
        assert empty.problems("s") == [] and empty.count(spec) == 0
        assert len(generate_requests(spec, np.random.default_rng(1), [empty])) == 0
    assert StreamSpec(nbytes=spec.burst_bytes + 1).count(spec) == 2  # bursts, rounded up
    # simulated, an empty stream is an empty run: no time, no bandwidth, no rates
    res = simulate(spec, generate_requests(spec, np.random.default_rng(1),
                                           [StreamSpec(n_requests=0)]))
    assert (res.makespan_s, res.bandwidth_bytes_per_s, res.refresh_fraction) == (0.0, 0.0, 0.0)
    assert (res.row_hit_rate, res.row_miss_rate, res.row_conflict_rate) == (0.0, 0.0, 0.0)
    assert res.per_stream().empty
    assert [p.path for p in StreamSpec(n_requests=-1).problems("s")] == ["s.n_requests"]


def test_a_sequential_stream_starts_at_a_uniform_channel_and_bank():
    """A sequential stream's first row run sits on a uniformly drawn channel and bank (its
    later runs step on from there): over 400 seeds every one of the 32 channels and 32
    banks is a start (a given one is missed with probability (31/32)^400 ~ 3e-6), and the
    counts pass a chi-square test against the uniform law (31 degrees of freedom, 99.9th
    percentile 61.1)."""
    spec = load_hbm_spec("hbm3")
    one = StreamSpec(n_requests=1, interleave="sequential")
    starts = [generate_requests(spec, np.random.default_rng(seed), [one])
              for seed in range(400)]
    for name, size in (("channel", spec.channels), ("bank", spec.banks_per_channel)):
        counts = np.bincount([int(getattr(r, name)[0]) for r in starts], minlength=size)
        assert len(counts) == size and counts.min() > 0, name
        expected = 400 / size
        assert ((counts - expected) ** 2 / expected).sum() < 61.1, name


def test_generator_is_seeded_sorted_and_labels_streams():
    spec = load_hbm_spec("hbm3")
    streams = [StreamSpec(nbytes=64 * 1000, read_fraction=0.5, row_locality=0.9),
               StreamSpec(n_requests=500, arrival="poisson", rate_bytes_per_s=1e11,
                          read_fraction=0.0, interleave="random", stream_id=7)]
    a = generate_requests(spec, np.random.default_rng(5), streams)
    b = generate_requests(spec, np.random.default_rng(5), streams)
    c = generate_requests(spec, np.random.default_rng(6), streams)
    assert len(a) == 2000 + 500
    for name in ("arrival_s", "channel", "bank", "row", "is_write", "stream"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.row, c.row)
    assert np.all(np.diff(a.arrival_s) >= 0)
    assert set(np.unique(a.stream)) == {0, 7}
    assert not a.is_write[a.stream == 0].all() and a.is_write[a.stream == 7].all()
    # stream 0 writes with probability 1 - read_fraction = 0.5: 2000 Bernoulli draws, within
    # 4 standard errors (sqrt(0.25 / 2000) = 1.1%)
    assert abs(a.is_write[a.stream == 0].mean() - 0.5) <= 4 * np.sqrt(0.25 / 2000)
    # Poisson stream of 32 B requests at 1e11 B/s: exponential gaps of mean 32 / 1e11 s; the
    # sample mean within 4 standard errors (SE from the gaps themselves, ~4.5% for 499)
    gaps = np.diff(a.arrival_s[a.stream == 7])
    se = gaps.std(ddof=1) / np.sqrt(len(gaps))
    assert abs(gaps.mean() - 32 / 1e11) <= 4 * se
    assert gaps.std(ddof=1) / gaps.mean() == pytest.approx(1.0, abs=4 * np.sqrt(2 / len(gaps)))


def test_contention_slows_the_op_and_is_cached():
    spec = load_hbm_spec("hbm3")
    op = StreamSpec(n_requests=12000, read_fraction=0.8, row_locality=0.95)
    dma = StreamSpec(n_requests=3000, arrival="poisson", rate_bytes_per_s=120e9,
                     read_fraction=0.0, row_locality=0.95, interleave="random")
    model = HbmContention(spec, 5, np.random.default_rng(1), dma)
    alone = model.query("gemm", op, 0)
    assert alone.slowdown == pytest.approx(1.0)
    assert alone.op_bandwidth_bytes_per_s <= 5 * spec.stack_bandwidth_bytes_per_s
    slow = [model.slowdown("gemm", op, k) for k in (1, 2, 4)]
    assert 1.0 < slow[0] < slow[1] < slow[2]
    assert model.query("gemm", op, 2) is model.query("gemm", op, 2)
    assert len(model) == 4
    # independent of the order of queries
    other = HbmContention(spec, 5, np.random.default_rng(1), dma)
    assert other.slowdown("gemm", op, 4) == slow[2]
    res = effective_bandwidth(spec, 5, op, [dma, dma], np.random.default_rng(2))
    assert res.contention == 2 and res.dma_bandwidth_bytes_per_s > 0
    # a one-stack device is valid (its figures are the stack's), none is refused
    one = HbmContention(spec, 1, np.random.default_rng(1), dma)
    assert one.query("gemm", op, 0).op_bandwidth_bytes_per_s == pytest.approx(
        alone.op_bandwidth_bytes_per_s / 5, rel=1e-12)  # the same draws: one stack of five
    with pytest.raises(ScenarioError, match="stacks"):
        HbmContention(spec, 0, np.random.default_rng(1), dma)


def test_unsaturated_streams_get_their_offered_rate():
    """Two periodic streams (an op and a write DMA stream) at 4 GB/s per stack, far below a
    stack's 670 GB/s, starting at 0.1 ms: an unsaturated stream's throughput is its offered
    rate, N bursts over (N - 1) gaps plus one sojourn at the end (bounded here by 10 us, far
    above an unloaded request's ~0.1 us); device figures are per stack times 2 stacks; the DMA
    stream's rate inside the op's span is the same. A one-stack device is valid."""
    spec = load_hbm_spec("hbm3")
    r, n, stacks = 4e9, 20_000, 2
    op = StreamSpec(n_requests=n, arrival="periodic", rate_bytes_per_s=r, start_s=1e-4)
    dma = StreamSpec(n_requests=n, arrival="periodic", rate_bytes_per_s=r, start_s=1e-4,
                     read_fraction=0.0)
    res = effective_bandwidth(spec, stacks, op, [dma], np.random.default_rng(3))
    gaps = (n - 1) * spec.burst_bytes / r
    hi = stacks * n * spec.burst_bytes / gaps
    lo = stacks * n * spec.burst_bytes / (gaps + 10e-6)
    assert lo <= res.op_bandwidth_bytes_per_s <= hi
    assert lo <= res.dma_bandwidth_bytes_per_s <= hi
    assert res.dma_window_bytes_per_s[0] == pytest.approx(stacks * r, rel=0.04)
    one = effective_bandwidth(spec, 1, op, [], np.random.default_rng(3))
    assert one.op_bandwidth_bytes_per_s == pytest.approx(r, rel=0.04)


# ---------------------------------------------------------------- catalog and validation


def test_catalog_entries_validate_and_every_number_has_a_source():
    catalog = hbm_catalog()
    assert {"hbm2e", "hbm3", "hbm3e"} <= set(catalog.names())
    numeric = [f for f, info in HbmSpec.model_fields.items() if info.annotation in (int, float)]
    for entry in catalog:
        spec = spec_from_entry(entry)
        assert spec.name == entry.name
        for f in numeric:
            assert entry.sources.get(f, "").strip(), f"{entry.name}.{f} has no source"
        estimates = [f for f in numeric if entry.sources[f].lower().startswith("estimate")]
        assert estimates, "modelling estimates must say so"


@pytest.mark.parametrize(("name", "device"),
                         [("hbm2e", "a100-sxm-80gb"), ("hbm3", "h100-sxm"), ("hbm3e", "b200-sxm")])
def test_device_bandwidth_matches_the_device_datasheet(name, device):
    """The HBM part's stack bandwidth x the device's stack count = the device's published HBM
    bandwidth (device catalog, copied with its source from shared/calibration)."""
    from twin.catalogs import catalog as product_catalog

    dev = product_catalog("devices").get(device).values
    assert dev["hbm_type"] == name
    published = dev["hbm_bandwidth_gbps"] * 1e9
    assert load_hbm_spec(name).device_bandwidth_bytes_per_s(dev["hbm_stacks"]) == (
        pytest.approx(published, rel=2e-3))


@pytest.mark.parametrize(("field", "value"), [("tRCD_ns", -1.0), ("channels", 0),
                                              ("queue_depth", 0), ("data_rate_gbps", 0.0)])
def test_bad_spec_values_name_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        tiny(**{field: value})
    entry = CatalogEntry(name="broken", values={**TINY, field: value}, sources={})
    with pytest.raises(ScenarioError, match=rf"hbm\.broken\.{field}"):
        spec_from_entry(entry)


@pytest.mark.parametrize("field", ["tRAS_ns", "tREFI_ns", "data_rate_gbps"])
def test_an_infinite_or_nan_timing_is_refused(field):
    """Fields the refresh-room check does not read (tRAS, tREFI's upper side, the pin rate)
    are still refused when infinite or NaN."""
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValidationError, match=field):
            tiny(**{field: bad})


def test_the_least_organisation_and_timings_are_allowed():
    """One bank group, or one bank per group, is an organisation (the bounds are > 0); an
    interval of 0.5 ns between refreshes is allowed when nothing else takes time (only the
    0.125 ns burst: 32 B on 32 pins at 64 Gb/s)."""
    assert tiny(bank_groups=1).bank_groups == 1
    assert tiny(banks_per_group=1).banks_per_group == 1
    zero = {k: 0.0 for k in TINY if k.endswith("_ns")}
    assert tiny(**{**zero, "data_rate_gbps": 64.0, "tREFI_ns": 0.5}).tREFI_ns == 0.5


def test_refresh_interval_must_leave_room_for_one_request():
    """The tiny stack: tRP 3 + tRRD 1 + tFAW 6 + tRCD 3 + tCCD_L 2 + 2 tCL 6 + tCWL 2 + tWTR 2
    + rd_to_wr_gap 1 + one burst (32 B on 32 bits at 8 Gb/s: 1 ns) = 27 ns of room; with tRFC
    10 ns, tREFI 37 ns is refused and 37.01 ns accepted."""
    with pytest.raises(ValidationError, match="27 ns"):
        tiny(tREFI_ns=37.0)
    assert tiny(tREFI_ns=37.01).tREFI_ns == 37.01


def test_inconsistent_spec_and_inputs_are_rejected():
    with pytest.raises(ValidationError, match="tRFC_ns"):
        tiny(tRFC_ns=70.0)
    # 60 - 40 ns leaves less than one request's command sequence (27 ns) between refreshes
    with pytest.raises(ValidationError, match="longest command sequence"):
        tiny(tRFC_ns=40.0)
    with pytest.raises(ValidationError, match="extra"):
        HbmSpec(**{**TINY, "tXYZ_ns": 1.0})
    with pytest.raises(ScenarioError, match=r"requests\.bank"):
        simulate(tiny(), requests([0.0], [0], [4], [0]))
    with pytest.raises(ScenarioError, match=r"requests\.arrival_s"):
        simulate(tiny(), requests([-1.0], [0], [0], [0]))
    # the offending value is named, also when it is not the first or the largest
    with pytest.raises(ScenarioError) as exc:
        simulate(tiny(), requests([5.0, -1.0, 2.0], [0, 0, 0], [0, 0, 0], [0, 0, 0]))
    (p,) = exc.value.problems
    assert p.path == "requests.arrival_s" and p.value == pytest.approx(-1.0 * NS)
    with pytest.raises(ScenarioError) as exc:
        simulate(tiny(), requests([0.0, 0.0], [0, 0], [1, -1], [0, 0]))
    assert [(q.path, q.value) for q in exc.value.problems] == [("requests.bank", -1)]
    with pytest.raises(ScenarioError, match=r"streams\[0\]\.row_locality"):
        generate_requests(tiny(), np.random.default_rng(0),
                          [StreamSpec(n_requests=3, row_locality=1.5)])
    with pytest.raises(ScenarioError, match=r"streams\[0\]\.row_locality"):
        generate_requests(tiny(), np.random.default_rng(0),  # a stream must move on
                          [StreamSpec(n_requests=3, row_locality=1.0)])
    for start in (-1e-9, math.inf):
        with pytest.raises(ScenarioError, match=r"streams\[0\]\.start_s"):
            generate_requests(tiny(), np.random.default_rng(0),
                              [StreamSpec(n_requests=3, start_s=start)])
    with pytest.raises(ScenarioError, match=r"rows_per_bank"):
        generate_requests(tiny(), np.random.default_rng(0), [StreamSpec(n_requests=3)],
                          rows_per_bank=0)
    with pytest.raises(ScenarioError, match=r"streams\[0\]\.rate_bytes_per_s"):
        generate_requests(tiny(), np.random.default_rng(0),
                          [StreamSpec(n_requests=3, arrival="poisson")])
    with pytest.raises(ScenarioError, match="unknown hbm name"):
        load_hbm_spec("hbm9")


def test_sequential_interleave_sweeps_channels_then_moves_to_the_next_bank():
    """``interleave: sequential``: each jump goes to the next channel (round robin from a
    random start) and to the next bank after a sweep of all channels, so the (channel, bank)
    of jump j is ((c0 + j) mod C, (b0 + (c0 + j) div C) mod B); a stream that never stays
    (row locality 0) jumps at every request. With one row per bank every request is on row
    0."""
    spec = tiny(channels=4)
    c, b = spec.channels, spec.banks_per_channel
    n = 3 * c * b + 5  # more than one sweep of every bank
    req = generate_requests(spec, np.random.default_rng(4),
                            [StreamSpec(n_requests=n, row_locality=0.0)], rows_per_bank=1)
    c0, b0 = int(req.channel[0]), int(req.bank[0])
    j = np.arange(n)
    np.testing.assert_array_equal(req.channel, (c0 + j) % c)
    np.testing.assert_array_equal(req.bank, (b0 + (c0 + j) // c) % b)
    assert (req.row == 0).all()


def test_backlogged_streams_interleave_round_robin():
    """Requests are ordered by arrival, then by position in their stream, then by stream id:
    three streams backlogged from t = 0 interleave round robin in the order of their ids
    (0, 2, 5, 0, 2, 5, ...), and a fourth starting later comes after all of them; written out
    by hand for 4 requests each."""
    spec = load_hbm_spec("hbm3")
    streams = [StreamSpec(n_requests=4), StreamSpec(n_requests=4, stream_id=5),
               StreamSpec(n_requests=4, stream_id=2),
               StreamSpec(n_requests=4, start_s=1e-6, stream_id=1)]
    req = generate_requests(spec, np.random.default_rng(0), streams)
    assert req.stream.tolist() == [0, 2, 5] * 4 + [1] * 4
    assert req.arrival_s.tolist() == [0.0] * 12 + [1e-6] * 4


def test_random_interleave_lands_on_every_channel_bank_and_default_row():
    """A stream that jumps on every request with random interleaving picks channel, bank and
    row uniformly: 4000 requests on HBM3 touch every channel and bank (0 included; missing
    one has probability below 1e-20) and draw rows from the default 16384 per bank, the
    largest above 16000 (probability of none above: (16000/16384)^4000, about 1e-41)."""
    spec = load_hbm_spec("hbm3")
    req = generate_requests(spec, np.random.default_rng(2),
                            [StreamSpec(n_requests=4000, row_locality=0.0,
                                        interleave="random")])
    assert set(req.channel.tolist()) == set(range(spec.channels))
    assert set(req.bank.tolist()) == set(range(spec.banks_per_channel))
    assert 16000 <= req.row.max() < 16384 and req.row.min() >= 0
