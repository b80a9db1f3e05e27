"""Cluster power manager acting on delayed telemetry (the second brief's growth-resource-delay
feedback loop).

Every ``period_s`` the manager samples the cluster's power (accelerator boards, exactly
integrated over the last period, plus link idle power) into a telemetry queue. The controller
acts on the reading that is ``telemetry_delay_s`` old and sets one clock cap for every device,
growing it in proportion to the relative headroom it believes it has, as in the brief's
``X[t+1] = X[t] + r X[t] f(R[t - tau])``::

    cap <- clip(cap * (1 + gain * (budget - P_stale) / budget), f_min, f_max)

With ``tau = 0`` the cap grows while there is headroom and the growth slows as the power nears
the budget: a smooth approach (up to one P-state step, since clocks are discrete). With a long
``tau`` the controller keeps growing on stale, under-budget readings after the power has passed
the budget (overshoot), then keeps cutting on stale, over-budget readings after the power has
fallen back (collapse into throttling at the lowest clock), and the cycle repeats.
"""

from __future__ import annotations

import math
from collections import deque

import simpy


class ClusterPowerManager:
    """A SimPy process capping every accelerator's clock from delayed power telemetry.

    Args:
        env: SimPy environment.
        setup: the run's ``devices.power.PowerSetup`` (``spec.manager`` holds the settings).
        accelerators: the run's accelerator agents.
        link_idle_w: idle power of all links, W (added to every sample).

    Attributes:
        samples: ``(t, measured_w, reading_w, cap_mhz)`` per period: the power measured over
            the period ending at ``t``, the stale reading the controller used (NaN before the
            first one arrives) and the cap it set.
    """

    def __init__(self, env: simpy.Environment, setup, accelerators: list, link_idle_w: float):
        spec = setup.spec.manager
        self.env = env
        self.accelerators = accelerators
        self.budget_w = float(spec.budget_w)
        self.delay_s = float(spec.telemetry_delay_s)
        self.period_s = float(spec.period_s)
        self.gain = float(spec.gain)
        self.link_idle_w = float(link_idle_w)
        dev = setup.dev
        self.f_min, self.f_max = dev.mhz[-1], dev.mhz[0]
        start = spec.initial_frequency_mhz
        self.cap_mhz = float(start) if start is not None else self.f_min
        for a in accelerators:
            a.set_frequency_cap(self.cap_mhz)
        self.samples: list[tuple[float, float, float, float]] = []
        self._queue: deque[tuple[float, float]] = deque()
        self._last_t = 0.0
        self._last_e = 0.0
        self.process = env.process(self._run())

    def measure(self) -> float:
        """Average cluster power since the previous sample, W."""
        t = self.env.now
        e = sum(a.n * a.energy_at(t) for a in self.accelerators)
        dt = t - self._last_t
        p = (e - self._last_e) / dt if dt > 0 else 0.0
        self._last_t, self._last_e = t, e
        return p + self.link_idle_w

    def _run(self):
        eps = 1e-9 * self.period_s
        q = self._queue
        while True:
            yield self.env.timeout(self.period_s)
            t = self.env.now
            p = self.measure()
            q.append((t, p))
            due = t - self.delay_s + eps
            while len(q) > 1 and q[1][0] <= due:
                q.popleft()
            reading = q[0][1] if q[0][0] <= due else math.nan
            if not math.isnan(reading):
                headroom = (self.budget_w - reading) / self.budget_w
                cap = self.cap_mhz * (1.0 + self.gain * headroom)
                self.cap_mhz = min(max(cap, self.f_min), self.f_max)
                for a in self.accelerators:
                    a.set_frequency_cap(self.cap_mhz)
            self.samples.append((t, p, reading, self.cap_mhz))
