"""Per-device truth on grids (the ``devices`` table, summary ``edge_effect``) against routes
written out here: dimension-order routing and the torus2d all-reduce's ring hops, independent of
the twin's router, collectives and fabric."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.conftest import scenario_dict
from twin.catalogs import catalog
from twin.runner import run
from twin.scenario import load_scenario
from twin.trace import read_table

N = 4  # 4 x 4 grid, device d at (d % 4, d // 4)


def _scenario(tmp_path, kind: str, extra: list[str] | None = None):
    raw = scenario_dict(cluster__topology={"kind": kind, "shape": [N, N]})
    raw["trace"] = {"path": str(tmp_path / f"{kind}.h5")}
    return load_scenario(raw, [
        "workload.parallelism.dp=16", "workload.global_batch=16", "workload.micro_batch=1",
        "workload.grad_bucket_mb=1e6", "network.dp_algorithm=torus2d",
        "simulation.symmetry=false", *(extra or [])])


def _dor_route(a: int, b: int, wrap: bool) -> list[int]:
    """Devices visited from a to b, x first then y (shorter way round on a torus, ties +)."""
    (ax, ay), (bx, by) = (a % N, a // N), (b % N, b // N)
    path = [a]

    def walk(c, target, put):
        d = (target - c) % N if wrap else target - c
        step = 1 if (d > 0 and (not wrap or d <= N // 2)) else -1
        while c != target:
            c = (c + step) % N if wrap else c + step
            path.append(put(c))
        return c

    x = walk(ax, bx, lambda c: c + N * ay)
    walk(ay, by, lambda c: x + N * c)
    return path


def _ring_edges() -> list[tuple[int, int, float]]:
    """(src, dst, bytes per unit of n) of the torus2d all-reduce on 4 x 4: rings along x (rows,
    members by x: reduce-scatter 3 steps of n/4 + all-gather 3 steps of n/4) and along y
    (columns: all-reduce of n/4 in 6 steps of n/16)."""
    edges = []
    for y in range(N):
        row = [x + N * y for x in range(N)]
        edges += [(row[i], row[(i + 1) % N], 6 / 4) for i in range(N)]
    for x in range(N):
        col = [x + N * y for y in range(N)]
        edges += [(col[i], col[(i + 1) % N], 6 / 16) for i in range(N)]
    return edges


def _expected(wrap: bool, n_bytes: float, makespan: float):
    """Forwarded bytes, router bytes and link-port energy per device implied by the routes."""
    link = catalog("links").get("nvlink4").values
    dev = catalog("devices").get("h100-sxm").values
    pj = link["energy_pj_per_bit"] * 8e-12
    idle = link["idle_w"] * 4 / 2 * makespan       # 4 links per edge, idle split per direction
    fwd = np.zeros(N * N)
    link_bytes: dict[tuple[int, int], float] = {}
    for a, b, share in _ring_edges():
        path = _dor_route(a, b, wrap)
        for mid in path[1:-1]:
            fwd[mid] += share * n_bytes
        for u, v in itertools.pairwise(path):
            link_bytes[(u, v)] = link_bytes.get((u, v), 0.0) + share * n_bytes
    port = np.zeros(N * N)
    neighbours = []
    for d in range(N * N):
        x, y = d % N, d // N
        nb = [((x + dx) % N if wrap else x + dx) + N * ((y + dy) % N if wrap else y + dy)
              for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1))
              if wrap or (0 <= x + dx < N and 0 <= y + dy < N)]
        neighbours.append(nb)
        for v in nb:  # half of each directed link at each end
            port[d] += 0.5 * (link_bytes.get((d, v), 0.0) * pj + idle)
            port[d] += 0.5 * (link_bytes.get((v, d), 0.0) * pj + idle)
    inflow = np.array([sum(link_bytes.get((v, d), 0.0) for v in neighbours[d])
                       for d in range(N * N)])
    outflow = np.array([sum(link_bytes.get((d, v), 0.0) for v in neighbours[d])
                        for d in range(N * N)])
    router_j = (inflow + outflow - fwd) * 8e-12 * dev["router_pj_per_bit"]
    return fwd, port, router_j


def test_mesh_interior_forwards_and_spends_what_the_routes_imply(tmp_path):
    res = run(_scenario(tmp_path, "mesh2d"))
    s = res.summary
    n_bytes = s["bytes_sent"] / 30  # bandwidth-optimal all-reduce: 2 (p - 1) n bytes in all
    df = read_table(res.trace_path, "devices").sort_values("device")
    fwd, port, router = _expected(False, n_bytes, s["makespan_s"])
    np.testing.assert_allclose(df["forwarded_bytes"], fwd, rtol=1e-9, atol=1.0)
    np.testing.assert_allclose(df["port_j"], port, rtol=1e-9)
    np.testing.assert_allclose(df["router_j"], router, rtol=1e-9)
    pos = df["position"].astype(str).to_numpy()
    corner, interior = df[pos == "corner"], df[pos == "interior"]
    assert (corner["forwarded_bytes"] == 0).all()
    # the routes: an interior device relays one x-ring wrap (1.5 n) and one y-ring wrap
    # (0.375 n); a corner relays nothing
    assert interior["forwarded_bytes"].to_numpy() == pytest.approx(1.875 * n_bytes, rel=1e-9)
    assert interior["port_j"].min() > corner["port_j"].max()
    assert (interior["port_j"].mean() - corner["port_j"].mean()
            == pytest.approx(port[pos == "interior"].mean() - port[pos == "corner"].mean(),
                             rel=1e-9))
    classes = s["edge_effect"]["classes"]
    assert {c: v["devices"] for c, v in classes.items()} == {"corner": 4, "edge": 8,
                                                              "interior": 4}
    assert classes["interior"]["forwarded_bytes"]["mean"] == pytest.approx(1.875 * n_bytes)
    assert classes["corner"]["forwarded_bytes"]["mean"] == 0


def test_torus_positions_are_alike(tmp_path):
    res = run(_scenario(tmp_path, "torus2d"))
    s = res.summary
    df = read_table(res.trace_path, "devices")
    n_bytes = s["bytes_sent"] / 30
    fwd, port, _router = _expected(True, n_bytes, s["makespan_s"])
    assert (df["forwarded_bytes"] == 0).all() and fwd.sum() == 0   # every ring edge is 1 hop
    np.testing.assert_allclose(df.sort_values("device")["port_j"], port, rtol=1e-9)
    assert set(df["position"].astype(str)) == {"all"}
    e = s["edge_effect"]["classes"]["all"]
    assert e["devices"] == 16
    for q in ("energy_j", "port_j", "router_j", "board_j"):
        assert e[q]["std"] <= 1e-9 * e[q]["mean"]


def test_device_energies_add_up_to_the_run_energy(tiny):
    """Symmetry on: per-class numbers are shared by a class's devices, network numbers are
    each device's own; summed over devices they are the summary's components."""
    for scen in (tiny(), tiny(["simulation.symmetry=false"])):
        res = run(scen)
        s = res.summary
        df = read_table(res.trace_path, "devices")
        b = s["energy_breakdown_j"]
        board = b["compute"] + b["memory"] + b["static"] + b["idle"] + b["regulator"]
        assert df["board_j"].sum() == pytest.approx(board, rel=1e-9)
        assert df["network_j"].sum() == pytest.approx(b["network"], rel=1e-9)  # no switches
        assert df["energy_j"].sum() == pytest.approx(s["energy_j"], rel=1e-9)
        assert df["hbm_j"].sum() == pytest.approx(b["memory"], rel=1e-9)
        assert s["router_energy_j"] == pytest.approx(df["router_j"].sum(), rel=1e-12)


def test_inlet_gradient_sets_air_by_position_and_heat_follows(tmp_path):
    scen = _scenario(tmp_path, "mesh2d", ["power.thermal.inlet_gradient_k=12",
                                          "power.thermal.inlet_gradient_along=center",
                                          "simulation.symmetry=true"])
    res = run(scen)
    assert res.summary["symmetry_used"] is False       # positions get their own air
    df = read_table(res.trace_path, "devices").sort_values("device")
    x, y = df["x"].to_numpy(), df["y"].to_numpy()
    mid = (N - 1) / 2
    expect = 25 + 12 * (1 - np.maximum(np.abs(x - mid), np.abs(y - mid)) / mid)
    np.testing.assert_allclose(df["inlet_c"], expect, rtol=1e-12)
    pos = df["position"].astype(str).to_numpy()
    assert (df["max_temp_c"][pos == "interior"].min()
            > df["max_temp_c"][pos == "corner"].max() + 5)


def test_edge_effect_experiment_writes_fronts_and_the_answer(tmp_path):
    import json

    from experiments.edge_effect import main

    assert main(["-o", str(tmp_path), "--fast"]) == 0
    ans = json.loads((tmp_path / "edge_effect.json").read_text())
    mesh = ans["mesh2d/none"]
    assert mesh["classes"] == ["corner", "edge", "interior"]
    assert mesh["interior_vs_corner_energy_gap"]["min"] > 0   # more links, more forwarding
    assert ans["torus2d/none"]["classes"] == ["all"]
    assert (tmp_path / "edge_effect.png").stat().st_size > 0
    assert len((tmp_path / "edge_effect.csv").read_text().splitlines()) == 1 + 2 * 3 * 4


def test_device_times_split_the_makespan_and_match_the_summary(tiny):
    """Pipeline of 2 stages, 2 iterations, every device its own class: per device the busy
    time, the three waits and the idle time add up to the makespan (no input waits here), the
    waits' column is their sum, and their means over devices are the summary's per-device
    keys; the mean die temperature is the time-weighted mean of the power table's rows of
    the device's class, below its maximum."""
    res = run(tiny(["workload.parallelism.dp=4", "workload.parallelism.pp=2",
                    "workload.iterations=2", "simulation.symmetry=false"]))
    s = res.summary
    df = read_table(res.trace_path, "devices").sort_values("device")
    assert s["data_wait_per_device_s"] == 0.0
    waits = df["tp_wait_s"] + df["pipeline_wait_s"] + df["dp_wait_s"]
    np.testing.assert_allclose(df["wait_s"], waits, rtol=1e-12)
    np.testing.assert_allclose(df["busy_s"] + waits + df["idle_s"], s["makespan_s"], rtol=1e-9)
    assert (df["pipeline_wait_s"] > 0).any() and (df["idle_s"] >= 0).all()
    for col, key in (("busy_s", "compute_time_per_device_s"),
                     ("tp_wait_s", "tp_comm_time_per_device_s"),
                     ("pipeline_wait_s", "pipeline_wait_per_device_s"),
                     ("dp_wait_s", "dp_wait_per_device_s"),
                     ("idle_s", "idle_time_per_device_s")):
        assert df[col].mean() == pytest.approx(s[key], rel=1e-9, abs=1e-15), col
    power = read_table(res.trace_path, "power")
    dur = power["t_end"] - power["t_start"]
    mean = (power["temp_c"] * dur).groupby(power["cls"]).sum() / dur.groupby(power["cls"]).sum()
    np.testing.assert_allclose(df["mean_temp_c"], mean.loc[df["cls"]].to_numpy(), rtol=1e-12)
    assert (df["mean_temp_c"] < df["max_temp_c"]).all()


def test_edge_effect_is_per_iteration_and_says_whose_numbers_are_whose(tmp_path):
    """Two iterations: energies, bytes and times in ``edge_effect`` are the devices table's
    totals / 2, the peak temperature is not divided; board energy and times are per class,
    the network's numbers per device (module docstring of twin.per_device)."""
    res = run(_scenario(tmp_path, "mesh2d", ["workload.iterations=2"]))
    e = res.summary["edge_effect"]
    df = read_table(res.trace_path, "devices")
    pos = df["position"].astype(str).to_numpy()
    for q in ("energy_j", "board_j", "network_j", "port_j", "router_j", "forwarded_bytes",
              "busy_s", "wait_s"):
        assert e["classes"]["interior"][q]["mean"] == pytest.approx(
            df[q][pos == "interior"].mean() / 2, rel=1e-12), q
    assert e["classes"]["corner"]["max_temp_c"]["max"] == df["max_temp_c"][pos == "corner"].max()
    assert e["per_class_columns"] == ["board_j", "busy_s", "wait_s", "max_temp_c"]
    assert e["per_device_columns"] == ["energy_j", "network_j", "port_j", "router_j",
                                       "forwarded_bytes"]


def test_no_router_model_means_no_router_energy(tiny):
    """A device without ``router_pj_per_bit``: every router column and key is 0, and the
    network energy is the links' alone (ports at both ends)."""
    res = run(tiny(["cluster.device.router_pj_per_bit=null"]))
    s = res.summary
    df = read_table(res.trace_path, "devices")
    assert s["router_energy_j"] == 0.0 and (df["router_j"] == 0).all()
    assert df["port_j"].sum() == pytest.approx(s["energy_breakdown_j"]["network"], rel=1e-12)


def test_router_energy_without_a_router_model_is_zero():
    """The job controller's network energy adds the routers' through ``router_energy_j``:
    nothing without ``router_pj_per_bit`` (the fabric is not even read)."""
    from types import SimpleNamespace

    from twin.per_device import router_energy_j

    model = SimpleNamespace(scenario=SimpleNamespace(cluster=SimpleNamespace(
        device=SimpleNamespace(router_pj_per_bit=None))))
    assert router_energy_j(model, fabric=None) == 0.0


def test_devices_table_of_a_3d_torus_has_its_z(tmp_path):
    """On a 2x2x2 torus the table's x, y, z are the devices' grid coordinates (x fastest)."""
    raw = scenario_dict(cluster__topology={"kind": "torus3d", "shape": [2, 2, 2]})
    raw["trace"] = {"path": str(tmp_path / "t3.h5")}
    res = run(load_scenario(raw, ["workload.parallelism.dp=8"]))
    df = read_table(res.trace_path, "devices").sort_values("device")
    d = df["device"].to_numpy()
    np.testing.assert_array_equal(df["x"], d % 2)
    np.testing.assert_array_equal(df["y"], (d // 2) % 2)
    np.testing.assert_array_equal(df["z"], d // 4)


def test_a_one_kelvin_gradient_along_x(tiny):
    """``inlet_gradient_k`` 1 K along x on a 4x2 mesh: inlet air ambient + x / 3 K."""
    res = run(tiny(["cluster.topology.kind=mesh2d", "power.thermal.inlet_gradient_k=1",
                    "power.thermal.inlet_gradient_along=x"]))
    df = read_table(res.trace_path, "devices").sort_values("device")
    np.testing.assert_allclose(df["inlet_c"], 25.0 + df["x"] / 3.0, rtol=1e-12)


def test_an_edge_effect_point_is_its_devices_table_per_position_class(tmp_path):
    """``run_point`` against the same scenario run here: one row per position class of the
    4x4 mesh (corner 4, edge 8, interior 4 devices), each the class's mean and spread of
    energy per device per iteration, network energy, forwarded bytes and waits per device per
    iteration from the devices table, the run's iteration time, the hottest die; the trace is
    not kept."""
    from experiments.edge_effect import run_point, scenario

    rows = run_point("mesh2d", "dp4-tp4", 1530, True, tmp_path)
    d = scenario("mesh2d", "dp4-tp4", 1530, True)
    d["trace"]["path"] = str(tmp_path / "again.h5")
    res = run(load_scenario(d))
    iters = res.summary["iterations_completed"]
    dev = read_table(res.trace_path, "devices")
    assert not list(tmp_path.glob("edge-*.h5"))
    assert [(r["position"], r["devices"]) for r in rows] == [("corner", 4), ("edge", 8),
                                                             ("interior", 4)]
    for r in rows:
        g = dev[dev.position.astype(str) == r["position"]]
        e = g.energy_j.to_numpy() / iters
        assert (r["topology"], r["failed_link"], r["strategy"], r["clock_mhz"]) == (
            "mesh2d", "0-1", "dp4-tp4", 1530)
        assert r["iteration_time_s"] == res.summary["iteration_time_s"]
        assert r["energy_per_device_j"] == pytest.approx(e.mean(), rel=1e-12)
        assert r["energy_std_j"] == pytest.approx(e.std(), rel=1e-9, abs=1e-12)
        assert r["network_per_device_j"] == pytest.approx(g.network_j.mean() / iters, rel=1e-12)
        assert r["forwarded_bytes_per_device"] == pytest.approx(
            g.forwarded_bytes.mean() / iters, rel=1e-12)
        assert r["wait_per_device_s"] == pytest.approx(g.wait_s.mean() / iters, rel=1e-12)
        assert r["max_temp_c"] == g.max_temp_c.max()


def test_the_edge_effect_study_is_the_one_the_readme_describes():
    """The README: five strategies at 1980 / 1530 / 1080 MHz on a 4x4 mesh and a 4x4 torus,
    healthy and with link 0-1 (at a corner of the mesh) failed; every rank simulated (the
    position classes need each device's own numbers)."""
    from experiments import edge_effect as ee

    assert ee.CLOCKS_MHZ == (1980, 1530, 1080) and ee.FAILED_LINK == (0, 1)
    assert set(ee.TOPOLOGIES) == {"mesh2d", "torus2d"} and len(ee.STRATEGIES) == 5
    for name, (dp, tp, pp, _placement, _algo) in ee.STRATEGIES.items():
        d = ee.scenario("mesh2d", name, 1980, True)
        assert d["cluster"]["topology"] == {"kind": "mesh2d", "shape": [4, 4]}
        assert d["cluster"]["links_per_edge"] == 4 and dp * tp * pp == 16
        assert d["simulation"]["symmetry"] is False
        assert d["faults"] == [{"kind": "link_down", "link": [0, 1], "time_s": 0.0}]
        assert "faults" not in ee.scenario("mesh2d", name, 1980, False)
        load_scenario(d)  # a valid scenario


def test_the_edge_effect_figure_puts_each_run_in_its_own_panel():
    """Hand-made rows for two topologies, healthy and failed: each panel (sorted by topology,
    then failure) scatters exactly its own rows per class and draws its front through the
    rows marked on it, fastest first."""
    from experiments.edge_effect import figure

    rows = []
    for t, topo in enumerate(("mesh2d", "torus2d")):
        for f, fail in enumerate(("0-1", "none")):
            classes = ("corner", "interior") if topo == "mesh2d" else ("all",)
            for c, pos in enumerate(classes):
                for k in range(3):
                    rows.append({"topology": topo, "failed_link": fail, "position": pos,
                                 "iteration_time_s": 1.0 + t + 0.1 * f + 0.01 * k,
                                 "energy_per_device_j": 10.0 * (t + 1) + f + c - k,
                                 "on_front": k != 1})
    fig = figure(rows)
    assert [ax.get_title() for ax in fig.axes] == [
        "mesh2d, failed link 0-1", "mesh2d, failed link none", "torus2d, failed link 0-1",
        "torus2d, failed link none"]
    for ax in fig.axes:
        topo, fail = ax.get_title().replace(", failed link", "").split()
        mine = [r for r in rows if (r["topology"], r["failed_link"]) == (topo, fail)]
        shown = np.concatenate([c.get_offsets() for c in ax.collections])
        assert sorted(map(tuple, shown.tolist())) == sorted(
            (r["iteration_time_s"], r["energy_per_device_j"]) for r in mine)
        for line, pos in zip(ax.lines, dict.fromkeys(r["position"] for r in mine), strict=True):
            front = sorted((r for r in mine if r["position"] == pos and r["on_front"]),
                           key=lambda r: r["iteration_time_s"])
            assert list(line.get_xdata()) == [r["iteration_time_s"] for r in front]
            assert list(line.get_ydata()) == [r["energy_per_device_j"] for r in front]


def test_the_edge_effect_answer_by_hand():
    """``answer`` on hand-made rows: two configurations on a mesh, healthy and failed; the
    gaps of each class against the corners (median, min, max over configurations), each
    strategy's largest spread inside a class (std / mean), each class's front points and
    whether all classes share them."""
    from experiments.edge_effect import answer

    def row(fail, strategy, clock, pos, energy, std, on_front):
        return {"topology": "mesh2d", "failed_link": fail, "strategy": strategy,
                "clock_mhz": clock, "position": pos, "energy_per_device_j": energy,
                "energy_std_j": std, "on_front": on_front}

    rows = [row("none", "a", 1980, "corner", 100.0, 1.0, True),
            row("none", "a", 1980, "edge", 102.0, 2.04, True),
            row("none", "a", 1980, "interior", 104.0, 0.0, True),
            row("none", "b", 1080, "corner", 50.0, 5.0, True),
            row("none", "b", 1080, "edge", 50.5, 0.0, True),
            row("none", "b", 1080, "interior", 53.0, 0.53, False),
            row("0-1", "a", 1980, "corner", 10.0, 0.0, True),
            row("0-1", "a", 1980, "edge", 11.0, 0.0, True)]
    out = answer(rows)
    assert list(out) == ["mesh2d/0-1", "mesh2d/none"]
    healthy = out["mesh2d/none"]
    assert healthy["classes"] == ["corner", "edge", "interior"]
    edge = healthy["edge_vs_corner_energy_gap"]     # +2% (a) and +1% (b)
    inner = healthy["interior_vs_corner_energy_gap"]  # +4% (a) and +6% (b)
    assert (edge["median"], edge["min"], edge["max"]) == pytest.approx((0.015, 0.01, 0.02))
    assert (inner["median"], inner["min"], inner["max"]) == pytest.approx((0.05, 0.04, 0.06))
    assert healthy["within_class_spread_max"] == pytest.approx({"a": 0.02, "b": 0.1})
    assert healthy["fronts"] == {"corner": ["a@1980", "b@1080"], "edge": ["a@1980", "b@1080"],
                                 "interior": ["a@1980"]}
    assert healthy["same_front_points"] is False
    failed = out["mesh2d/0-1"]
    assert failed["classes"] == ["corner", "edge"] and failed["same_front_points"] is True
    assert failed["edge_vs_corner_energy_gap"]["median"] == pytest.approx(0.1)
    assert failed["within_class_spread_max"] == {"a": 0.0}


def test_mean_temperature_of_segments_without_length_is_the_last_ones():
    """Time-weighted mean of the segments' end temperatures (column 5); when every segment
    has zero length (nothing ran), the last segment's temperature; with no segment, the
    die's current temperature."""
    from types import SimpleNamespace

    from twin.per_device import _mean_temp

    def acc(seg):
        return SimpleNamespace(power_segments=lambda: np.array(seg, dtype=float).reshape(-1, 6),
                               temp_c=25.0)

    assert _mean_temp(acc([[0, 1, 0, 0, 0, 40.0], [1, 4, 0, 0, 0, 60.0]])) == 55.0
    assert _mean_temp(acc([[2, 2, 0, 0, 0, 40.0], [2, 2, 0, 0, 0, 41.0]])) == 41.0
    assert _mean_temp(acc([])) == 25.0


@pytest.mark.parametrize("case", ["thermal", "held", "no data"])
def test_device_temperatures_are_those_the_model_used(tmp_path, case):
    """With a thermal model the hottest device of the table is the summary's
    ``max_temperature_c`` and each position class's max is its devices'. With it off
    (``held``) the die is held at ``initial_c`` for its leakage: every device shows that, and
    the summary, which gives the thermal model's result, None. A device with neither thermal
    nor leakage data (``no data``: the TPU v5p) has no temperature in the model: NaN in the
    table, None in the class statistics and in the summary, which stays strict JSON; the
    report's heatmaps leave the temperature panel out."""
    import json

    from twin.reading import TraceData
    from twin.report.html import heatmap_grids

    extra = {"thermal": [], "held": ["power.thermal.enabled=false", "power.thermal.initial_c=61"],
             "no data": ["cluster.device=tpu-v5p", "power.thermal.enabled=false"]}[case]
    res = run(_scenario(tmp_path, "mesh2d", extra))
    s = res.summary
    df = read_table(res.trace_path, "devices")
    temp = s["edge_effect"]["classes"]
    json.dumps(s, allow_nan=False)
    labels = [label for label, _ in heatmap_grids(TraceData(res.trace_path, need=("devices",)))]
    assert all(c["energy_j"]["mean"] > 0 for c in temp.values())  # the rest as ever
    if case == "thermal":
        assert df["max_temp_c"].max() == s["max_temperature_c"]
        assert (df["mean_temp_c"] <= df["max_temp_c"]).all()
        for pos, g in df.groupby("position", observed=True):
            assert temp[str(pos)]["max_temp_c"]["max"] == g["max_temp_c"].max()
    elif case == "held":
        assert s["max_temperature_c"] is None
        assert (df["max_temp_c"] == 61.0).all() and (df["mean_temp_c"] == 61.0).all()
    else:
        assert s["max_temperature_c"] is None
        assert df["max_temp_c"].isna().all() and df["mean_temp_c"].isna().all()
        assert all(c["max_temp_c"] == dict.fromkeys(("mean", "std", "min", "max"))
                   for c in temp.values())
    assert ("max die temperature (C)" in labels) == (case != "no data")


def test_class_statistics_skip_the_devices_without_a_value():
    """Per class: mean, population std, min, max over the values that are not NaN, worked
    out by hand; None where a class has none."""
    from devices.position import class_stats

    classes = np.array(["corner", "edge", "edge", "edge", "interior"])
    got = class_stats({"t": np.array([np.nan, 40.0, np.nan, 50.0, np.nan])}, classes)
    assert got["edge"] == {"devices": 3, "t": {"mean": 45.0, "std": 5.0, "min": 40.0,
                                               "max": 50.0}}
    assert got["corner"]["t"] == got["interior"]["t"] == dict.fromkeys(
        ("mean", "std", "min", "max"))
    assert got["corner"]["devices"] == 1
