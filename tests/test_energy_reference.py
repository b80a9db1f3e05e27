"""Link energy from bytes and pJ/bit, worked out here from the catalog figures and the routes
(independent of the fabric's per-byte arrays): E = bits x pJ/bit per hop, constant W per
edge (idle + switch/NIC share)."""

from __future__ import annotations

import numpy as np
import pytest

from devices.fabric import Fabric, Phase
from devices.spec import LinkSpec
from topologies.graph import build_topology
from topologies.routing import Router
from twin.catalogs import catalog
from twin.kernel.engine import Engine


@pytest.mark.parametrize("name, lpe", [("nvlink4", 1), ("nvlink4", 4), ("ib-ndr400", 1)])
def test_link_energy_is_bits_times_pj_per_bit_per_hop(name, lpe):
    raw = catalog("links").get(name).values
    spec = LinkSpec.model_validate(raw)
    pj = float(raw["energy_pj_per_bit"]["value"] if isinstance(raw["energy_pj_per_bit"], dict)
               else raw["energy_pj_per_bit"])
    def figure(key: str) -> float:
        v = raw.get(key, 0.0)
        return float(v["value"] if isinstance(v, dict) else v)

    # constant power per physical link: its idle power + its share of switch/NIC hardware
    idle = figure("idle_w") + figure("device_w")
    env = Engine()
    topo = build_topology("torus2d", (4, 4), spec.name, lpe)
    fab = Fabric(env, topo, Router(topo), {spec.name: spec})
    # 0 -> 5 is two hops, 3 -> 2 one, 10 -> 10 none (a local copy costs nothing)
    ph = Phase(np.array([0, 3, 10]), np.array([5, 2, 10]), np.array([1e6, 3e6, 7e6]), steps=2)

    def body():
        yield from fab.run_phase(ph)
    env.process(body())
    env.run()
    hops = [len(fab.router.route(0, 5)), len(fab.router.route(3, 2)), 0]
    assert hops == [2, 1, 0]
    bits = 8 * 2 * (1e6 * 2 + 3e6 * 1)
    energy = float(fab.link_bytes @ fab.energy_per_byte)
    assert energy == pytest.approx(bits * pj * 1e-12, rel=1e-12)
    # constant: every edge (both directions together) draws idle_w + device_w per link
    assert fab.idle_w.sum() == pytest.approx(topo.n_links / 2 * lpe * idle, rel=1e-12)
