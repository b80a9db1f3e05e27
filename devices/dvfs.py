"""Per-pipeline-stage frequency planning (in the spirit of Perseus and EnvPipe).

In a pipeline whose stages do unequal work, only the slowest stage sets the pace; the others
wait in every step. Running them at a lower clock (and voltage) fills that slack with slower,
cheaper compute instead of idle time. The planner here works on the twin's own cost model:

* ``busy_s(s, k)``: compute time of one rank of stage ``s`` per iteration at P-state ``k``
  (sum of its blocks' roofline durations);
* estimated iteration time of a synchronous pipeline with ``m`` microbatches (GPipe / 1F1B
  steady state plus fill and drain, communication ignored):
  ``T = (m - 1) / m * max_s busy_s + sum_s busy_s / m``;
* estimated energy: every stage's busy energy plus its idle power for the rest of ``T``.

Starting from the top clock everywhere, it greedily lowers one stage by one P-state at a time,
taking the step that saves the most energy per second of estimated iteration time it adds
(steps that add none first), as long as ``T`` stays within ``(1 + slack)`` of the all-top
estimate. The simulation then measures what the plan really costs and saves; the
planner's own estimates are reported beside the measurement, never in its place.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class StagePlan:
    """A clock per pipeline stage and the planner's estimates (per rank, one iteration)."""

    states: list[int]
    mhz: list[float]
    busy_s: list[float]
    base_busy_s: list[float]
    est_iteration_s: float
    base_iteration_s: float
    est_energy_j: float
    base_energy_j: float

    @property
    def predicted_slowdown(self) -> float:
        """Estimated relative growth of the iteration time."""
        return self.est_iteration_s / self.base_iteration_s - 1.0 if self.base_iteration_s else 0.0

    @property
    def predicted_saving(self) -> float:
        """Estimated relative energy saving of the accelerators."""
        return 1.0 - self.est_energy_j / self.base_energy_j if self.base_energy_j else 0.0

    def as_dict(self) -> dict:
        """Summary form."""
        return {"stage_frequency_mhz": self.mhz, "predicted_slowdown": self.predicted_slowdown,
                "predicted_energy_saving": self.predicted_saving,
                "stage_busy_s": self.busy_s, "stage_busy_top_clock_s": self.base_busy_s}


def plan_stages(setup, stage_blocks: dict[int, list], microbatches: int,
                slack: float) -> StagePlan:
    """Plan one P-state per stage (see the module docstring).

    Args:
        setup: the run's ``devices.power.PowerSetup`` (device model, cost model).
        stage_blocks: blocks one rank of each stage runs per iteration.
        microbatches: microbatches per iteration and replica.
        slack: allowed relative growth of the estimated iteration time.
    """
    dev = setup.dev
    compute = setup.compute
    temp = setup.initial_temp_c()
    stages = sorted(stage_blocks) or [0]
    n = dev.n_states
    busy = {s: [0.0] * n for s in stages}
    energy = {s: [0.0] * n for s in stages}
    idle_w = [dev.regulator.input_power(dev.idle_chip_w(k, temp)) for k in range(n)]
    for s in stages:
        counts = Counter(id(b) for b in stage_blocks.get(s, []))
        blocks = {id(b): b for b in stage_blocks.get(s, [])}
        for k in range(n):
            for key, cnt in counts.items():
                b = blocks[key]
                dur = compute.block_cost(b, dev.math_scale[k], 1.0).duration_s
                busy[s][k] += cnt * dur
                energy[s][k] += cnt * dur * setup.block_power(b, k, temp)
    m = max(int(microbatches), 1)

    def estimate(states: list[int]) -> tuple[float, float]:
        b = [busy[s][k] for s, k in zip(stages, states, strict=True)]
        t = (m - 1) / m * max(b) + sum(b) / m
        e = sum(energy[s][k] + idle_w[k] * max(t - busy[s][k], 0.0)
                for s, k in zip(stages, states, strict=True))
        return t, e

    states = [0] * len(stages)
    t0, e0 = estimate(states)
    limit = t0 * (1.0 + slack) * (1.0 + 1e-12)
    e_cur, t_cur = e0, t0
    while True:
        best = None
        for i in range(len(stages)):
            if states[i] >= n - 1:
                continue
            cand = states.copy()
            cand[i] += 1
            t, e = estimate(cand)
            if t > limit or e >= e_cur:
                continue
            d_t = t - t_cur
            score = (1, e_cur - e) if d_t <= 0 else (0, (e_cur - e) / d_t)
            if best is None or score > best[0]:
                best = (score, cand, t, e)
        if best is None:
            break
        _, states, t_cur, e_cur = best
    return StagePlan(states=states, mhz=[dev.mhz[k] for k in states],
                     busy_s=[busy[s][k] for s, k in zip(stages, states, strict=True)],
                     base_busy_s=[busy[s][0] for s in stages], est_iteration_s=t_cur,
                     base_iteration_s=t0, est_energy_j=e_cur, base_energy_j=e0)
