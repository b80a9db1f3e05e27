"""The data path (workloads/data.py, devices/host.py): a starved GPU waits, and by how much.

References independent of the code under test: the rate of a tandem line is the rate of its
slowest stage (derived here from the scenario's parameters), a producer-limited loop runs at
the producer's rate (so the compute stream waits ``1 - data rate / consumption rate`` of the
time), and a hand-built timeline of a prefetch queue.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

import twin
from tests.conftest import DEVICE_TIME_KEYS, ROOT
from twin.trace import read_table
from workloads.data import DataPath, LoadCost, NodePlan

# the dgx-h100 catalog entry (checked against the catalog below)
H100_HOST = {"gpus": 8, "cpu_cores": 112, "storage_read_gbps": 40, "pcie_h2d_gbps": 57}
TOKENS = 1024                              # micro_batch 1 x seq_len 1024
BASE = {
    "name": "data-test", "seed": 0,
    "cluster": {"topology": {"kind": "torus2d", "shape": [2, 2]}, "device": "h100-sxm",
                "link": "nvlink4", "links_per_edge": 4},
    "workload": {"model": {"name": "tiny", "arch": "gpt", "layers": 4, "hidden": 1024,
                           "heads": 16, "vocab": 32000, "seq_len": TOKENS},
                 "global_batch": 128, "micro_batch": 1, "parallelism": {"dp": 4},
                 "iterations": 16},
    "trace": {"enabled": False},
}
RANKS_PER_NODE = 4  # the 2x2 torus is one dgx-h100 node of 8 GPUs: 4 loading ranks


def _run(overrides=None, base=BASE):
    return twin.run(twin.load_scenario(base, overrides))


@pytest.fixture(scope="module")
def no_data():
    return _run().summary


def test_host_catalog_matches_constants_used_here():
    from devices.host import HostSpec
    from twin.catalogs import catalog

    spec = HostSpec.model_validate(catalog("hosts").get("dgx-h100").values)
    assert {k: getattr(spec, k) for k in H100_HOST} == H100_HOST
    for entry in catalog("hosts"):
        HostSpec.model_validate(entry.values)
        assert entry.sources and all(s.strip() for s in entry.sources.values())


def test_host_spec_bounds():
    """A host of one GPU and one core, with 1e-6 GB/s (1 kB/s) PCIe and storage, is the
    smallest valid one; zero GPUs or cores, or less bandwidth, are refused."""
    from pydantic import ValidationError

    from devices.host import HostSpec

    least = {"gpus": 1, "cpu_cores": 1, "pcie_h2d_gbps": 1e-6, "storage_read_gbps": 1e-6}
    HostSpec(name="h", **least)
    for key, bad in (("gpus", 0), ("cpu_cores", 0), ("pcie_h2d_gbps", 0.9e-6),
                     ("storage_read_gbps", 0.9e-6)):
        with pytest.raises(ValidationError, match=key):
            HostSpec(name="h", **{**least, key: bad})


def _rank_rate(d: dict) -> float:
    """Microbatches per second one loading rank gets: the slowest stage of the tandem line
    storage -> CPU workers -> PCIe, from the ``data`` section alone (micro_batch 1)."""
    c = RANKS_PER_NODE
    bpt = d.get("bytes_per_token", 2)            # vocab 32000 fits in 16 bits
    storage = d.get("storage_gbps", H100_HOST["storage_read_gbps"]) * 1e9 / (c * TOKENS * bpt)
    cores = d.get("host", {}).get("cpu_cores", H100_HOST["cpu_cores"]) \
        if isinstance(d.get("host"), dict) else H100_HOST["cpu_cores"]
    w = d.get("workers", 2)
    t = d.get("preprocess_ms_per_sample", 0) * 1e-3
    cpu = min(w, cores / c) / t if t > 0 else math.inf   # cores time-shared beyond w * c
    h2d = TOKENS * d.get("h2d_bytes_per_token", 16)
    pcie = d.get("pcie_gbps", H100_HOST["pcie_h2d_gbps"]) * 1e9 / h2d
    return min(storage, cpu, pcie)


def _starved(kind: str, rate: float) -> dict:
    """A data section whose ``kind`` stage delivers ``rate`` microbatches/s per rank."""
    d = {"enabled": True, "host": "dgx-h100", "workers": 1, "prefetch_batches": 32}
    if kind == "cpu":
        d["preprocess_ms_per_sample"] = 1e3 / rate
    elif kind == "cpu-oversubscribed":  # 4 ranks x 2 workers on 2 cores
        d.update(host={"base": "dgx-h100", "cpu_cores": 2}, workers=2,
                 preprocess_ms_per_sample=1e3 * 2 / (RANKS_PER_NODE * rate))
    elif kind == "storage":
        d["storage_gbps"] = rate * RANKS_PER_NODE * TOKENS * 2 / 1e9
    else:
        d["pcie_gbps"] = rate * TOKENS * 16 / 1e9
    return d


@pytest.mark.parametrize("kind, ratio", [("cpu", 0.5), ("cpu-oversubscribed", 0.3),
                                         ("storage", 0.25), ("pcie", 0.75)])
def test_slow_data_path_wait_fraction_is_one_minus_rate_ratio(no_data, kind, ratio):
    """The loader never stalls (its queue holds a whole iteration), so the run is
    producer-limited: each iteration takes m / r and the compute stream waits
    1 - r / (m / T0) of the time; MFU drops by the same share. A finite run adds the last
    microbatch's compute and the optimizer after the last input (a tail), which biases the
    fraction up by at most (1 - f) * tail * r / K: < 1% relative here."""
    t0, m = no_data["iteration_time_s"], no_data["microbatches"]
    consumption = m / t0
    d = _starved(kind, ratio * consumption)
    rate = _rank_rate(d)
    assert rate == pytest.approx(ratio * consumption, rel=1e-9)  # the set-up is what we think
    s = _run({"data": d}).summary
    expected = 1.0 - rate / consumption
    assert s["data_path"]["bottleneck"] == kind.split("-")[0]
    assert s["data_wait_fraction"] == pytest.approx(expected, rel=0.02)
    assert s["data_wait_fraction"] >= expected * (1 - 1e-6)   # the finite-run bias is upward
    assert s["mfu"] / no_data["mfu"] == pytest.approx(rate / consumption, rel=0.02)
    # the input waits are their own part of each device's time, which adds up to the makespan
    assert sum(s[k] for k in DEVICE_TIME_KEYS) == pytest.approx(s["makespan_s"], rel=1e-9)


def test_fast_data_path_waits_only_for_the_first_input(no_data, tmp_path):
    """Three times the consumption rate: after the first microbatch's load (the warm-up: the
    node's 4 reads one after the other, the preprocessing, the copy) the compute stream never
    waits, and every later iteration takes exactly as long as without a data path."""
    t0, m = no_data["iteration_time_s"], no_data["microbatches"]
    d = {**_starved("cpu", 3 * m / t0), "prefetch_batches": 2}
    res = _run({"data": d, "trace": {"path": str(tmp_path / "t.h5"), "tables": ["ops"]}})
    ops = read_table(res.trace_path, "ops")
    waits = ops[ops.kind == "data_wait"]
    assert list(waits.iteration) == [0] and list(waits.mb) == [0]
    assert list(waits.chunk) == [-1] and list(waits.layer) == [-1]  # a wait for input only
    first = (RANKS_PER_NODE * TOKENS * 2 / (H100_HOST["storage_read_gbps"] * 1e9)
             + d["preprocess_ms_per_sample"] * 1e-3
             + TOKENS * 16 / (H100_HOST["pcie_h2d_gbps"] * 1e9))
    assert waits.t_end.iloc[0] - waits.t_start.iloc[0] == pytest.approx(first, rel=1e-9)
    np.testing.assert_allclose(res.iteration_times_s[1:], t0, rtol=1e-9)


def _hand_path(depth: int, prep_s: float, n: int) -> tuple[simpy.Environment, DataPath]:
    env = simpy.Environment()
    path = DataPath(env, [NodePlan(0, 1, (0,), (0,))], LoadCost(1.0, prep_s, 1.0),
                    storage_bps=1e15, pcie_bps=1e15, workers=1, cpu_cores=1, depth=depth,
                    microbatches=1, iterations=n, record=True)
    return env, path


def _consumer(env, path, wants, taken):
    """Take microbatch k at time wants[k] at the earliest (a hand-built compute stream)."""
    for k, t in enumerate(wants):
        if env.now < t:
            yield env.timeout(t - env.now)
        ev = path.ready(0, k, 0)
        if not ev.triggered:
            yield ev
        path.consumed(0, k, 0)
        taken.append(env.now)


def test_prefetch_depth_bounds_the_lead():
    """A loader 10^4 x faster than the consumer: microbatch k starts loading exactly when
    microbatch k - depth is taken (the first `depth` at once), so at most `depth` are ever
    loaded ahead."""
    depth, n = 3, 12
    wants = [0.010 * (k + 1) + (0.004 if k % 3 == 0 else 0.0) for k in range(n)]
    env, path = _hand_path(depth, 1e-6, n)
    taken: list[float] = []
    env.process(_consumer(env, path, wants, taken))
    env.run()
    rows = sorted(path.rows, key=lambda r: r[4])
    start = [r[6] for r in rows]
    assert taken == pytest.approx(wants, abs=1e-12)             # never starved
    expected = [0.0] * depth + taken[: n - depth]
    assert start == pytest.approx(expected, abs=1e-12)
    # the lead: loads started minus microbatches taken, at every start
    lead = [sum(s <= t for s in start) - sum(c <= t for c in taken) for t in start]
    assert max(lead) == depth


def test_slow_loader_timeline_by_hand():
    """One worker at 25 ms per microbatch, a consumer wanting one every 10 ms, depth 3: the
    worker never idles (a slot is free long before it is needed), so microbatch k is ready at
    25 (k + 1) ms and taken then; its load starts when microbatch k - 3 is taken."""
    depth, n, prep = 3, 10, 0.025
    wants = [0.010 * k for k in range(n)]
    env, path = _hand_path(depth, prep, n)
    taken: list[float] = []
    env.process(_consumer(env, path, wants, taken))
    env.run()
    rows = sorted(path.rows, key=lambda r: r[4])
    assert [r[8] for r in rows] == pytest.approx([prep * (k + 1) for k in range(n)], abs=1e-9)
    assert taken == pytest.approx([max(w, prep * (k + 1)) for k, w in enumerate(wants)],
                                  abs=1e-9)
    assert [r[6] for r in rows] == pytest.approx([0.0] * depth + taken[: n - depth], abs=1e-9)
    assert [r[10] for r in rows] == pytest.approx(taken, abs=1e-12)


SYM_BASE = {**BASE, "cluster": {**BASE["cluster"], "topology": {"kind": "torus2d",
                                                                "shape": [5, 2]}},
            "workload": {**BASE["workload"], "global_batch": 160, "parallelism": {"dp": 10},
                         "iterations": 4}}


def test_symmetry_on_and_off_agree():
    """10 GPUs, 4 per node: nodes with 4, 4 and 2 loading ranks share a storage server each.
    With symmetry the stage's class is simulated on one node of each kind (2) and moves with
    the slower one; without, all 3 nodes and 10 ranks are simulated and the faster ranks wait
    at the gradient all-reduce instead. The iteration times agree."""
    d = {"enabled": True, "host": "dgx-h100", "gpus_per_node": 4, "workers": 1,
         "prefetch_batches": 16, "storage_gbps": 1e-3}
    sym = _run({"data": d}, SYM_BASE).summary
    full = _run({"data": d, "simulation": {"symmetry": False}}, SYM_BASE).summary
    assert sym["symmetry_used"] and not full["symmetry_used"]
    assert (sym["data_path"]["simulated_nodes"], full["data_path"]["simulated_nodes"]) == (2, 3)
    assert sym["data_path"]["nodes"] == full["data_path"]["nodes"] == 3
    assert sym["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    # storage-bound on the 4-rank nodes: 4 reads of 2 kB at 1 MB/s per microbatch
    per_mb = RANKS_PER_NODE * TOKENS * 2 / 1e6
    assert sym["iteration_time_s"] > 16 * per_mb * 0.99


def test_same_seed_same_trace(tmp_path):
    """Compute jitter makes the run random (and turns symmetry off): two runs with one seed
    write identical ops and data tables."""
    d = {"enabled": True, "host": "dgx-h100", "preprocess_ms_per_sample": 1.0}
    tables = []
    for i in range(2):
        res = _run({"data": d, "simulation": {"compute_jitter_cov": 0.2},
                    "workload": {**BASE["workload"], "iterations": 2},
                    "trace": {"path": str(tmp_path / f"t{i}.h5"), "tables": ["ops", "data"]}})
        tables.append((read_table(res.trace_path, "ops"), read_table(res.trace_path, "data")))
    for a, b in zip(tables[0], tables[1], strict=True):
        assert len(a) > 0
        assert a.equals(b)


def test_data_path_off_changes_nothing(no_data):
    """Data keys given but the path disabled: the summary is the one without a data
    section (every key but the wall time)."""
    s = _run({"data": {"enabled": False, "host": "dgx-h100", "workers": 7,
                       "preprocess_ms_per_sample": 50}}).summary
    for k, v in no_data.items():
        if k != "wall_time_s":
            assert s[k] == v or (isinstance(v, float) and math.isnan(v) and math.isnan(s[k])), k
    assert s["data_wait_fraction"] == 0.0 and s["data_path"] is None


@pytest.mark.parametrize("override, field", [
    ({"data": {"enabled": True}}, "data.host"),
    ({"data": {"enabled": True, "host": "dgx-h900"}}, "data.host"),
    ({"data": {"enabled": True, "host": "dgx-h100", "workers": 0}}, "data.workers"),
    ({"data": {"enabled": True, "host": "dgx-h100", "prefetch_batches": 0}},
     "data.prefetch_batches"),
    ({"data": {"enabled": True, "host": "dgx-h100", "storage_gbps": -1}}, "data.storage_gbps"),
    ({"data": {"host": {"base": "dgx-h100", "cpu_cores": 0}}}, "data.host.cpu_cores"),
    ({"data": {"colour": 1}}, "data.colour"),
    ({"data": {"enabled": True, "host": "dgx-h100", "pcie_switch": "dgx-z9"}},
     "data.pcie_switch"),
    # the documented bounds, just past them
    ({"data": {"workers": 4097}}, "data.workers"),
    ({"data": {"pcie_gbps": 0.9e-6}}, "data.pcie_gbps"),
    ({"data": {"storage_gbps": 0.9e-6}}, "data.storage_gbps"),
    ({"data": {"preprocess_ms_per_sample": 1.5e9}}, "data.preprocess_ms_per_sample"),
    ({"data": {"prefetch_batches": (1 << 16) + 1}}, "data.prefetch_batches"),
    ({"data": {"bytes_per_token": 1.5e9}}, "data.bytes_per_token"),
    ({"data": {"h2d_bytes_per_token": 1.5e9}}, "data.h2d_bytes_per_token"),
])
def test_bad_data_section_names_the_field(override, field):
    from twin.kernel.errors import ScenarioError

    with pytest.raises(ScenarioError) as exc:
        twin.load_scenario(BASE, override)
    assert field in [p.path for p in exc.value.problems]


@pytest.mark.parametrize("data", [
    {"workers": 4096}, {"pcie_gbps": 1.5e-6}, {"storage_gbps": 1.5e-6},
    {"preprocess_ms_per_sample": 1e9}, {"prefetch_batches": 1}, {"bytes_per_token": 1e9},
    {"h2d_bytes_per_token": 1e9}, {"pcie_switch": "dgx-h100"},
])
def test_data_section_bounds_are_inclusive(data):
    """Values at (or just inside) the documented bounds load."""
    scen = twin.load_scenario(BASE, {"data": {"enabled": True, "host": "dgx-h100", **data}})
    for k, v in data.items():
        assert getattr(scen.data, k) == v


@pytest.mark.parametrize("vocab, bpt", [(2, 2.0), (1 << 16, 2.0), ((1 << 16) + 1, 4.0),
                                        (128256, 4.0)])
def test_token_bytes_default_to_the_smallest_integer_holding_the_vocabulary(vocab, bpt):
    """Token ids 0 .. vocab - 1 fit in 16 bits up to a vocabulary of 65536."""
    from workloads.data import DataSpec

    cost = LoadCost.of(DataSpec(), micro_batch=3, seq=100, vocab=vocab)
    assert cost.read_bytes == 300 * bpt
    assert cost.h2d_bytes == 300 * 16.0                      # int64 ids and labels
    assert LoadCost.of(DataSpec(bytes_per_token=1.0), 3, 100, vocab).read_bytes == 300.0
    assert cost.preprocess_s == 0.0             # no preprocessing unless it is given


def test_gpus_per_node_of_a_switched_node_or_the_host():
    from devices.host import HostSpec
    from workloads.data import DataSpec

    host = HostSpec(name="h", **H100_HOST)
    assert DataSpec(host=host).node_gpus("switched", (8, 4)) == 8
    assert DataSpec(host=host).node_gpus("torus2d", (4, 2)) == H100_HOST["gpus"]
    assert DataSpec(host=host, gpus_per_node=2).node_gpus("switched", (8, 4)) == 2


def test_rows_name_iteration_and_microbatch():
    """The trace rows of a 3-microbatch, 2-iteration path: load k is microbatch k mod 3 of
    iteration k div 3."""
    env = simpy.Environment()
    path = DataPath(env, [NodePlan(0, 1, (0,), (0,))], LoadCost(1.0, 1e-3, 1.0),
                    storage_bps=1e15, pcie_bps=1e15, workers=1, cpu_cores=1, depth=6,
                    microbatches=3, iterations=2, record=True)
    env.run()
    rows = sorted(path.rows, key=lambda r: r[8])
    assert [(r[4], r[5]) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_host_copies_per_device_add_up_over_simulated_nodes():
    """Two simulated nodes of one class, standing for 3 and 1 nodes of one loading rank
    each: every microbatch puts h2d_bytes on each of the class's 4 loading devices, so the
    per-device bytes ``on_copied`` books for one microbatch add up to h2d_bytes."""
    env = simpy.Environment()
    booked: dict[int, float] = {}
    calls = []

    def on_copied(cls, t0, t1, nbytes):
        calls.append((cls, t0, t1, nbytes))

    plans = [NodePlan(0, 3, (0,), (0,)), NodePlan(3, 1, (3,), (0,))]
    path = DataPath(env, plans, LoadCost(10.0, 0.0, 1000.0), storage_bps=1e6,
                    pcie_bps=1e6, workers=1, cpu_cores=8, depth=1, microbatches=1,
                    iterations=1, on_copied=on_copied)
    env.run()
    for cls, t0, t1, nbytes in calls:
        assert cls == 0 and t1 - t0 == pytest.approx(1000.0 / 1e6, rel=1e-12)
        booked[cls] = booked.get(cls, 0.0) + nbytes
    assert sorted(c[3] for c in calls) == pytest.approx([250.0, 750.0], rel=1e-12)
    assert booked == {0: pytest.approx(1000.0, rel=1e-12)}
    assert path.ready(0, 0, 0).triggered


def test_report_of_unequal_nodes_is_the_busiest_node():
    """Nodes of 4, 4 and 2 loading ranks (symmetry: one of each kind simulated), storage at
    1 MB/s, workers at 0.5 ms a sample, copies at 57 GB/s: the rate limits are those of a
    4-rank node, derived from the section; the utilizations are the busiest node's busy
    time (4 reads per microbatch on it, 1 rank's workers and port) over the makespan."""
    d = {"enabled": True, "host": "dgx-h100", "gpus_per_node": 4, "workers": 2,
         "prefetch_batches": 16, "storage_gbps": 1e-3, "preprocess_ms_per_sample": 0.5}
    s = _run({"data": d}, SYM_BASE).summary
    rep = s["data_path"]
    read, h2d, prep = TOKENS * 2.0, TOKENS * 16.0, 0.5e-3    # micro batch 1
    assert rep["loading_ranks_per_node_max"] == 4
    lim = rep["rate_limit_microbatches_per_s"]
    assert lim["storage"] == pytest.approx(1e6 / (4 * read), rel=1e-12)
    assert lim["cpu"] == pytest.approx(2 / prep, rel=1e-12)          # 8 workers on 112 cores
    assert lim["pcie"] == pytest.approx(H100_HOST["pcie_h2d_gbps"] * 1e9 / h2d, rel=1e-12)
    loads = s["microbatches"] * s["iterations"]
    span = s["makespan_s"]
    util = rep["utilization"]
    assert util["storage"] == pytest.approx(loads * 4 * read / 1e6 / span, rel=1e-9)
    assert util["cpu"] == pytest.approx(loads * prep / 2 / span, rel=1e-9)
    assert util["pcie"] == pytest.approx(loads * h2d / (H100_HOST["pcie_h2d_gbps"] * 1e9)
                                         / span, rel=1e-9)
    assert rep["bottleneck"] == "storage" and util["storage"] > 0.9


def test_report_of_an_empty_run_gives_busy_seconds():
    """A makespan of 0 (nothing ran) does not divide by zero: utilizations are then the
    busy seconds themselves (0 here)."""
    env = simpy.Environment()
    path = DataPath(env, [NodePlan(0, 1, (0,), (0,))], LoadCost(1.0, 0.0, 1.0),
                    storage_bps=1e6, pcie_bps=1e6, workers=1, cpu_cores=1, depth=1,
                    microbatches=1, iterations=1)
    rep = path.report(0.0)
    assert rep["utilization"] == {"storage": 0.0, "cpu": 0.0, "pcie": 0.0}
    env.run()
    assert path.report(0.0)["utilization"]["storage"] == pytest.approx(1e-6, rel=1e-12)


def test_twin_validate_data_rows(capsys):
    from twin.cli import main

    assert main(["validate", "--only", "data", "--strict"]) == 0
    assert "data-starved wait fraction" in capsys.readouterr().out


def test_data_starved_library_scenario(tmp_path):
    """scenarios/data_starved.yaml (README numbers): 2 workers per rank at 100 ms per sample,
    2 sequences per microbatch: 2 / 0.2 s = 10 microbatches/s per rank, 2 per iteration, so
    every iteration after the first takes 0.2 s (the loader's pace)."""
    scen = twin.load_scenario("scenarios/data_starved.yaml",
                              [f"trace.path={tmp_path / 'd.h5'}"])
    d = scen.data
    w = scen.workload
    rate = d.workers / (w.micro_batch * d.preprocess_ms_per_sample * 1e-3)
    res = twin.run(scen)
    m = res.summary["microbatches"]
    np.testing.assert_allclose(res.iteration_times_s[1:], m / rate, rtol=1e-4)
    assert res.summary["data_path"]["bottleneck"] == "cpu"
    assert res.summary["iteration_time_converged"] is True


def _switch_file(name: str) -> dict:
    """A PCIe switch's catalog file as written (each number with its source)."""
    from twin.kernel.schema import read_yaml

    return read_yaml(ROOT / f"devices/catalog/pcie/{name}.yaml", "pcie")


def test_a_copy_stream_writes_hbm_at_the_data_paths_pcie_rate():
    """The rate the HBM models give one host-to-device copy stream: none without a data
    path, else the port's PCIe rate: the host's (catalog constant above), the scenario's
    ``pcie_gbps``, or the PCIe switch's port (its catalog file, read here)."""
    from twin.runner import _h2d_bytes_per_s

    on = {"enabled": True, "host": "dgx-h100"}
    assert _h2d_bytes_per_s(twin.load_scenario(BASE)) == 0.0
    host_rate = H100_HOST["pcie_h2d_gbps"] * 1e9
    assert _h2d_bytes_per_s(twin.load_scenario(BASE | {"data": on})) == host_rate
    assert _h2d_bytes_per_s(twin.load_scenario(BASE | {"data": on | {"pcie_gbps": 20.0}})) == 20e9
    switch = _switch_file("dgx-a100")["port_gbps"]["value"]
    assert _h2d_bytes_per_s(twin.load_scenario(
        BASE | {"data": on | {"pcie_switch": "dgx-a100"}})) == switch * 1e9


@pytest.mark.parametrize("switch", [None, "dgx-a100"])
def test_the_shared_pcie_fabric_is_the_switch_the_scenario_names(monkeypatch, switch):
    """With a contention model the data path's copies go through a PCIe fabric the device
    agents see: the catalog switch the scenario names (its file, read here), or a port of
    its own per GPU at the host's PCIe rate."""
    import twin.runner as R

    made = []
    real = R.device_streams

    def spy(*a, **k):
        out = real(*a, **k)
        made.append(out[1])
        return out

    monkeypatch.setattr(R, "device_streams", spy)
    data = {"enabled": True, "host": "dgx-h100"} | ({"pcie_switch": switch} if switch else {})
    scen = twin.load_scenario(BASE | {"data": data, "memory": {"model": "frfcfs"},
                                      "workload": BASE["workload"] | {"iterations": 1}})
    R.run(scen)
    (pcie,) = made
    if switch is None:
        want = (1, H100_HOST["pcie_h2d_gbps"], H100_HOST["pcie_h2d_gbps"])
    else:
        raw = _switch_file(switch)
        want = tuple(raw[k]["value"] for k in ("gpus_per_switch", "port_gbps", "uplink_gbps"))
    got = (pcie.spec.gpus_per_switch, pcie.spec.port_gbps, pcie.spec.uplink_gbps)
    assert got == pytest.approx(want)


@pytest.mark.parametrize("switched", [True, False])
def test_network_streams_leave_by_the_nic_only_where_the_cluster_has_nics(monkeypatch,
                                                                           switched):
    """On a switched cluster of two nodes (a NIC link) the device agents report every network
    stream to the PCIe fabric, where it shares the GPU's port with the host copies; a torus
    has no NIC, so nothing is reported. Counted here by wrapping the fabric's ``nic``."""
    import devices.pcie as P

    calls = []
    real = P.PcieFabric.nic

    def counted(self, devices, delta):
        calls.append(delta)
        return real(self, devices, delta)

    monkeypatch.setattr(P.PcieFabric, "nic", counted)
    cluster = ({"topology": {"kind": "switched", "shape": [2, 2]}, "device": "h100-sxm",
                "link": "nvlink4-switch", "links_per_edge": 18, "nic_link": "ib-ndr400-port"}
               if switched else BASE["cluster"])
    scen = twin.load_scenario(BASE | {"cluster": cluster,
                                      "data": {"enabled": True, "host": "dgx-h100"},
                                      "overlap": {"sm_contention": True},
                                      "workload": BASE["workload"] | {"iterations": 1}})
    twin.run(scen)
    if switched:
        assert calls.count(1) == calls.count(-1) > 0  # every stream started and ended
    else:
        assert calls == []


def test_the_prefetch_queue_is_two_microbatches_per_worker_unless_given():
    """README: ``data.prefetch_batches`` defaults to 2 x workers (PyTorch's prefetch_factor
    2 per worker); a value given is taken as is."""
    from workloads.data import DataSpec

    assert [DataSpec(workers=w).depth for w in (1, 3, 8)] == [2, 6, 16]
    assert DataSpec(workers=3, prefetch_batches=1).depth == 1
