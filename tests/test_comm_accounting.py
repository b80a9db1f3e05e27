"""What communication costs the rank classes (``workloads/comm_accounting.py``): the pieces
a class's TP collective is cut into, one per group, against the collective built group by
group; and the energy a piece books on its class."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from devices.interference import SmShares
from devices.phase import Phase
from topologies.graph import build_topology
from workloads.collectives import collective_phases
from workloads.comm_accounting import CommEnergy


def _flows(phases) -> list[tuple]:
    return sorted((int(a), int(b), float(n), p.steps, p.step_latency_s, p.base_latency_s,
                   p.hop_latency_ref_s)
                  for p in phases for a, b, n in zip(p.src, p.dst, p.nbytes, strict=True))


@pytest.mark.parametrize("n_groups", [2, 3])
@pytest.mark.parametrize("op", ["allreduce", "allgather", "reduce_scatter"])
def test_per_group_pieces_are_the_collective_built_for_each_group_alone(op, n_groups):
    """Two or three rings of four on a 4x3 torus (one per row): the pieces of the
    multi-group phases are, flow for flow (ends, bytes, steps, protocol latencies), the
    phases built for each group alone; a single group is not cut."""
    topo = build_topology("torus2d", (4, 3), "nvlink4")
    groups = np.arange(12).reshape(3, 4)[:n_groups]
    whole = [replace(p, step_latency_s=2e-6, base_latency_s=5e-6)  # as NCCL tuning sets
             for p in collective_phases(op, "ring", groups, 1e6, topo)]
    book = CommEnergy(SmShares(24, 8, 2), [], [np.arange(12)])
    pieces = book.per_group(whole, groups)
    assert len(pieces) == n_groups and book.split_of(whole) is pieces
    for row, piece in zip(groups, pieces, strict=True):
        alone = [replace(p, step_latency_s=2e-6, base_latency_s=5e-6)
                 for p in collective_phases(op, "ring", row[None, :], 1e6, topo)]
        assert _flows(piece) == _flows(alone)
    assert book.per_group(whole[:1], groups[:1]) is None and book.split_of(whole[:1]) is None


def _agent(got: list):
    return SimpleNamespace(communication=lambda t0, t1, b, sms, act: got.append(
        (t0, t1, b, sms, act)))


def test_a_piece_books_its_share_of_the_class():
    """A class standing for three TP groups of four (12 devices): one group's piece books a
    third of the class's devices (its agent books per device of the class), so the three
    pieces book what the whole collective books in one go. Reference: ``2 x bytes /
    devices`` and the SM count, written here."""
    topo = build_topology("torus2d", (4, 3), "nvlink4")
    groups = np.arange(12).reshape(3, 4)
    whole = collective_phases("allreduce", "ring", groups, 1e6, topo)
    got: list[tuple] = []
    book = CommEnergy(SmShares(24, 8, 2, activity=0.3), [_agent(got)], [np.arange(12)])
    moved = sum(float(np.sum(p.nbytes)) * p.steps for p in whole)
    book.charge([0], whole, 1.0, 2.0, "tp_blocking")
    assert got[-1] == pytest.approx((1.0, 2.0, 2 * moved / 12, 24, 0.3))
    for piece in book.per_group(whole, groups):
        book.charge([0], piece, 1.0, 2.0, "tp_blocking")
    assert [g[2] for g in got[1:]] == pytest.approx([2 * moved / 12 / 3] * 3)
    assert [g[3] for g in got[1:]] == pytest.approx([8.0] * 3)


def test_a_send_books_only_the_devices_of_a_class_that_take_part():
    """One TP group of four with one agent (class 1) receives a pipeline send from a rank of
    its own class (class 0: one device): the send moves bytes between two devices, so each
    books ``2 x bytes / 2`` on one device; class 1's agent books a quarter of its four
    (found by the differential tests: one agent per TP group beside a straggler, energy
    +1.6e-3 against exact mode, the receiving group booked whole for each of its four
    senders)."""
    send = [Phase(np.array([0]), np.array([5]), np.array([3e6]))]
    got: list[tuple] = []
    book = CommEnergy(SmShares(24, 8, 2, activity=0.3), [_agent(got), _agent(got)],
                      [np.array([0]), np.array([4, 5, 6, 7])])
    book.charge([0, 1], send, 0.0, 1e-3, "p2p")
    assert got[0] == pytest.approx((0.0, 1e-3, 3e6, 24, 0.3))  # p2p: a collective's SMs
    assert got[1] == pytest.approx((0.0, 1e-3, 3e6 / 4, 24 / 4, 0.3))
