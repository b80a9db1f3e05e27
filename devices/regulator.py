"""Voltage regulators: conversion losses vs load, and the cost of a voltage/frequency change.

A device's core rail is fed by a multiphase buck regulator. Two things about it matter to the
energy of a run:

* **Conversion loss.** The regulator delivers ``P_out`` to the chip and draws
  ``P_in = P_out / eta(P_out / P_rated)`` from the board supply; ``P_in - P_out`` is counted as
  ``regulator`` energy. ``eta`` is a piecewise-linear curve through catalog points
  ``[[load, efficiency], ...]`` (``load = P_out / P_rated``; ``P_rated`` = the device TDP), held
  constant beyond its first and last points. No curve means an ideal regulator (``eta = 1``).
* **DVFS transitions.** Changing the operating point takes ``latency_s`` during which the device
  stalls (no kernel runs), and charges or discharges the rail's output capacitance ``C``:
  ``E = C/2 * |V1^2 - V0^2|`` per transition, drawn from (or dumped by) the regulator. The stall
  itself costs the device's idle power over ``latency_s``; that is accounted by the device.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


class VoltageRegulator:
    """Efficiency curve and transition cost of one device's core regulator.

    Args:
        curve: ``[(load, efficiency), ...]`` with ``load = P_out / rated_w``; empty or ``None``
            for an ideal regulator.
        rated_w: output power at ``load = 1``, W.
        latency_s: duration of a voltage/frequency transition, s (``None``: transitions are
            not possible on this device).
        capacitance_f: output capacitance charged at a voltage change, F.
    """

    def __init__(self, curve: Sequence[tuple[float, float]] | None, rated_w: float,
                 latency_s: float | None = None, capacitance_f: float = 0.0):
        pts = sorted((float(x), float(e)) for x, e in (curve or []))
        self.ideal = not pts
        self.rated_w = float(rated_w)
        self._x = [x * self.rated_w for x in (p[0] for p in pts)]  # output watts
        self._e = [p[1] for p in pts]
        self.latency_s = latency_s
        self.capacitance_f = float(capacitance_f)

    def efficiency(self, p_out: float) -> float:
        """Efficiency at output power ``p_out`` (W), in (0, 1]."""
        if self.ideal:
            return 1.0
        xs, es = self._x, self._e
        i = bisect_right(xs, p_out)
        if i == 0:
            return es[0]
        if i == len(xs):
            return es[-1]
        x0, x1 = xs[i - 1], xs[i]
        return es[i - 1] + (es[i] - es[i - 1]) * (p_out - x0) / (x1 - x0)

    def input_power(self, p_out: float) -> float:
        """Power drawn from the board supply to deliver ``p_out`` W to the chip."""
        if self.ideal:
            return p_out
        return p_out / self.efficiency(p_out)

    def output_for_input(self, p_in: float) -> float:
        """Inverse of :meth:`input_power` (bisection; ``input_power`` is increasing), W."""
        if self.ideal:
            return p_in
        lo, hi = 0.0, p_in
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if self.input_power(mid) > p_in:
                hi = mid
            else:
                lo = mid
        return lo

    def transition_energy(self, v0: float, v1: float) -> float:
        """Energy of moving the rail from ``v0`` to ``v1`` volts: ``C/2 |v1^2 - v0^2|``, J."""
        return 0.5 * self.capacitance_f * abs(v1 * v1 - v0 * v0)
