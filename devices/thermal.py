"""Lumped RC thermal model of a device: one node (die + heat sink) coupled to inlet air.

``C dT/dt = P - (T - T_amb) / R``. Over a segment of constant dissipated power ``P`` the
solution is closed form::

    T(t) = T_ss + (T0 - T_ss) exp(-t / tau),   T_ss = T_amb + R P,   tau = R C

so the twin advances temperature exactly at every power-state change, never by time steps.
The same form gives the exact time at which a rising (or falling) temperature crosses a level,
used for throttling and temperature alerts.
"""

from __future__ import annotations

import math


class ThermalRC:
    """One lumped thermal node.

    Args:
        r_k_per_w: thermal resistance to inlet air, K/W.
        c_j_per_k: thermal capacitance, J/K.
        limit_c: temperature at which the device throttles, C.
    """

    def __init__(self, r_k_per_w: float, c_j_per_k: float, limit_c: float):
        self.r = float(r_k_per_w)
        self.c = float(c_j_per_k)
        self.tau = self.r * self.c
        self.limit_c = float(limit_c)

    def steady(self, power_w: float, ambient_c: float) -> float:
        """Steady-state temperature at constant ``power_w`` (W), C."""
        return ambient_c + self.r * power_w

    def advance(self, t0_c: float, power_w: float, dt_s: float, ambient_c: float) -> float:
        """Temperature after ``dt_s`` seconds at constant ``power_w``, starting at ``t0_c``."""
        ss = ambient_c + self.r * power_w
        return ss + (t0_c - ss) * math.exp(-dt_s / self.tau)

    def crossing(self, t0_c: float, power_w: float, level_c: float,
                 ambient_c: float) -> float:
        """Seconds until the temperature reaches ``level_c`` at constant ``power_w``.

        Returns ``inf`` if it never does (the level is not between ``t0_c`` and the steady
        state), ``0`` if it is already there.
        """
        ss = ambient_c + self.r * power_w
        a, b = t0_c - ss, level_c - ss
        if a == 0.0:
            return 0.0 if b == 0.0 else math.inf
        ratio = b / a  # in (0, 1] exactly when the level lies between T0 and the steady state
        if ratio > 1.0 or ratio <= 0.0:
            return math.inf
        return -self.tau * math.log(ratio)
