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
