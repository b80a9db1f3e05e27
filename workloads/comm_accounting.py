"""What communication costs the rank classes: the seconds their compute streams spend
blocked on it (:class:`CommStats`) and the device energy of its kernels
(``power.communication_energy``, :class:`CommEnergy`).

A finished collective or pipeline send is booked on the accelerators of the rank classes that
took part (:meth:`CommEnergy.charge`): its HBM bytes at the access energy and its SMs at a
share of a GEMM's dynamic power for the kernel's duration (``Accelerator.communication``),
on the devices of each class that take part. A class's agent books per device of the class,
so a class whose devices take part only in part books that fraction: one agent per TP group
receiving a send from one of its four ranks' peers books a quarter (booked whole, the
receiving group counted four kernels per send: +1.6e-3 of the energy against exact mode).

Under rank symmetry one class stands for several tensor-parallel groups, and the executor
starts their collective as one set of fabric phases that ends with the slowest group. The
kernel of each group's devices ends with that group's own transfers, so a whole-set booking
charged every device until the slowest group was done: +0.17% of the energy of a
deterministic run against exact mode (a 4x3 mesh with hybrid sharding, whose collectives load
some TP groups' links more). :meth:`CommEnergy.per_group` cuts the phases into one list per
group, so that each group runs (and is booked) on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from devices.interference import SmShares
from devices.phase import Phase


@dataclass
class CommStats:
    """Per-device seconds a rank class's compute stream spent blocked, by cause."""

    tp_s: float = 0.0
    recv_s: float = 0.0
    dp_wait_s: float = 0.0
    data_wait_s: float = 0.0
    shard_wait_s: float = 0.0     # compute stream waiting for parameter all-gathers
    shard_stream_s: float = 0.0   # busy time of the sharding streams (shard + replica)
    iteration_end: list[float] = field(default_factory=list)


class CommEnergy:
    """Books communication kernels on the accelerators of their classes.

    Args:
        shares: SMs per stream kind and their activity (``devices.interference``).
        accelerators: the run's agents, indexed by rank class.
        class_devices: the devices each class stands for (``Layout.device`` of its ranks).
    """

    def __init__(self, shares: SmShares, accelerators: Sequence,
                 class_devices: Sequence[np.ndarray]):
        self.shares = shares
        self.accelerators = accelerators
        self.class_devices = class_devices
        # id(phases) -> (devices taking part, HBM bytes per device, class -> its share)
        self._booked: dict[int, tuple[np.ndarray, float, dict[int, float]]] = {}
        self._groups: dict[int, list[list[Phase]]] = {}  # id(phase list) -> per group

    def charge(self, classes, phases: list[Phase], t0: float, t1: float, kind: str) -> None:
        """Book a finished collective or send that ran from ``t0`` to ``t1`` (s) on each of
        ``classes``: each byte moved is read from HBM at its sender and written at its
        receiver, so a device's HBM bytes are ``2 x bytes moved / devices taking part``
        (exact for the symmetric collectives and sends), and its NCCL kernel holds
        ``SmShares.of(kind)`` SMs (``tp_blocking``: an NCCL collective) meanwhile. Only the
        devices of a class that take part are booked: a class's agent books per device of
        the class, so it books the fraction of its devices among the phases' ends (one of
        the ``n`` TP groups a class stands for: ``1 / n``; a send of one rank to a TP group
        with one agent: a quarter of a group of four). A collective without phases (a group
        of one rank) moves nothing and launches no kernel."""
        if not phases:
            return
        hit = self._booked.get(id(phases))
        if hit is None:
            moved = sum(p.total_bytes for p in phases)
            devs = np.unique(np.concatenate([np.concatenate([p.src, p.dst]) for p in phases]))
            hit = self._booked[id(phases)] = (devs, 2.0 * moved / max(len(devs), 1), {})
        devs, per_dev, shares = hit
        ce = self.shares
        sms = ce.collective_ctas if kind == "tp_blocking" else ce.of(kind)
        for c in classes:
            share = shares.get(c)
            if share is None:
                mine = self.class_devices[c]
                share = shares[c] = np.count_nonzero(np.isin(mine, devs)) / len(mine)
            self.accelerators[c].communication(t0, t1, per_dev * share, sms * share,
                                               ce.activity)

    def per_group(self, phases: list[Phase], groups: np.ndarray) -> list[list[Phase]] | None:
        """``phases`` cut into one phase list per row of ``groups`` (the devices of each TP
        group the phases cover; a collective's messages stay inside its group), or None for
        a single group. Every piece keeps its phase's steps and protocol latencies (tuned
        by group size, not by the number of groups). Cached per phase list."""
        if len(groups) < 2:
            return None
        hit = self._groups.get(id(phases))
        if hit is None:
            hit = self._groups[id(phases)] = [
                [replace(p, src=p.src[m], dst=p.dst[m],
                         nbytes=np.asarray(p.nbytes)[m] if np.ndim(p.nbytes) else p.nbytes)
                 for p in phases for m in (np.isin(p.src, row),)]
                for row in groups]
        return hit

    def split_of(self, phases: list[Phase]) -> list[list[Phase]] | None:
        """The per-group pieces :meth:`per_group` made of ``phases``, or None (a single
        group, or not cut: runs on a replica quotient, whose groups are images of one
        another and end together)."""
        return self._groups.get(id(phases))
