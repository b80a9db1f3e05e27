"""Link energy from bytes and pJ/bit, worked out here from the catalog figures and the routes
(independent of the fabric's per-byte arrays): E = bits x pJ/bit per hop, constant W per
edge (idle + switch/NIC share)."""

from __future__ import annotations

from itertools import pairwise

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


class _Agent:
    """Stand-in for an accelerator agent: ``n`` devices with the given power segments."""

    def __init__(self, seg, n):
        self._seg, self.n = np.asarray(seg, dtype=float), n

    def power_segments(self):
        return self._seg


def _peak_reference(agents):
    """Plain: the summed power on every elementary interval between breakpoints (max)."""
    cuts = sorted({float(x) for a in agents for s in a.power_segments() for x in s[:2]})
    best = 0.0
    for lo, hi in pairwise(cuts):
        mid = 0.5 * (lo + hi)
        total = sum(s[2] * a.n for a in agents for s in a.power_segments() if s[0] <= mid < s[1])
        best = max(best, total)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_peak_power_is_the_max_of_the_summed_segments(seed):
    from devices.peak import peak_power

    rng = np.random.default_rng(seed)
    agents = []
    for _ in range(int(rng.integers(1, 4))):
        edges = np.cumsum(rng.choice([0.5, 1.0, 0.25], 12))
        watts = rng.uniform(50, 700, 11)
        seg = np.column_stack([edges[:-1], edges[1:], watts, np.zeros((11, 3))])
        agents.append(_Agent(seg, int(rng.integers(1, 9))))
    assert peak_power(agents) == pytest.approx(_peak_reference(agents), rel=1e-12)


def test_peak_power_back_to_back_segments_do_not_add():
    """A segment ending at t and the next starting at t never overlap: 300 W, not 700 W."""
    from devices.peak import peak_power

    a = _Agent([[0.0, 1.0, 300.0, 0, 0, 0], [1.0, 2.0, 400.0, 0, 0, 0]], 1)
    b = _Agent([[0.0, 1.0, 100.0, 0, 0, 0], [1.0, 3.0, 50.0, 0, 0, 0]], 2)
    assert peak_power([a, b]) == pytest.approx(max(300 + 200, 400 + 100))
    assert peak_power([]) == 0.0
    assert peak_power([_Agent(np.empty((0, 6)), 3)]) == 0.0


@pytest.mark.parametrize("seed", range(8))
def test_the_step_order_is_lexsorts_with_every_kind_of_tie(seed):
    """``step_order`` against ``np.lexsort((d, t))``, the permutation it replaces, index for
    index: sorted runs of times as the agents' segments make them, with ties of two (a
    segment ending as the next starts), of many (agents in step), equal changes at equal
    times, and times in no order."""
    from devices.peak import step_order

    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(int(rng.integers(1, 30))):
        edges = np.cumsum(rng.choice([0.0, 0.25, 0.5, 1.0], int(rng.integers(1, 40))))
        runs.append(edges)
    runs.append(rng.choice([0.0, 0.5, 3.0], int(rng.integers(0, 20))))  # no order
    t = np.concatenate(runs)
    d = rng.choice([-2.0, -1.0, 0.0, 1.0, 2.0, 700.0], len(t))
    np.testing.assert_array_equal(step_order(t, d), np.lexsort((d, t)))
    for n in range(3):  # the shortest arrays
        np.testing.assert_array_equal(step_order(t[:n], d[:n]), np.lexsort((d[:n], t[:n])))
