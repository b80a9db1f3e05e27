"""Step targets of the bulk-synchronous transfers of a component: :func:`step_target` for one
transfer, and :func:`step_targets_compiled` for all of a component's in one compiled call
(the large components, where the loop would cost most: ``twin.kernel.flows._JIT_FLOWS``).

Kernel: links are array indices, nothing of GPUs.
"""

from __future__ import annotations

import math
from itertools import accumulate

import numpy as np

from twin.kernel.transfer import Component, Transfer


def _compiled():
    """``twin.kernel.maxmin_jit``, imported at the first large component (numba)."""
    import twin.kernel.maxmin_jit as jit  # (after the first call: a lookup in sys.modules)

    return jit


def step_target(tr: Transfer, act: np.ndarray, rate: np.ndarray) -> np.ndarray | None:
    """Remaining bytes of ``tr``'s active flows at the end of the current step, or None
    when every unfinished flow is active and all take the same time per step and to the
    end of the step (they then stay in step without per-step events).

    Called for every stepped transfer of a component at every change of its rates, on a
    few (tens of) flows: plain Python floats, not NumPy reductions (the same float64
    operations in the same order, so the same results to the last bit)."""
    rl = rate.tolist()
    rem = tr.remaining.tolist()
    if tr.uniform and len(act) == len(rem):  # the common case, checked cheaply
        r_max = max(rl)
        if (r_max - min(rl) <= 1e-9 * r_max
                and max(rem) - min(rem) <= 1e-9 * float(tr.step_size[0])):
            return None
    per = tr._per_step.tolist()
    parked = tr.parked.tolist()
    top = 0.0
    wait = -1.0  # step count of the parked flows (-1: none)
    n_pending = 0
    for r, p, pk in zip(rem, per, parked, strict=True):
        if r > 0:  # pending; steps left as in Transfer.steps_left
            q = max(math.ceil(r * p - 1e-6), 0.0)
            n_pending += 1
            if q > top:
                top = q
            if pk and q > wait:
                wait = q
    if wait >= 0.0 and wait + 1.0 > top:
        # Parked flows wait at the end of their step for the active ones. An active flow
        # that drained to within the step count's tolerance of that end (a timer of
        # another flow left it there) has arrived but was not marked done: its target is
        # that end (a remainder of < 1e-6 step), so its timer marks it done and releases
        # the barrier, instead of letting it run on into the next step alone.
        top = wait + 1.0
    step = tr.step_size[act]
    # every pending flow within the tolerance of its end (top 0): the target is that end
    target = (max(top, 1.0) - 1.0) * step
    if len(act) == n_pending:
        sl = step.tolist()
        tl = target.tolist()
        ra = tr.remaining[act].tolist()
        t_step = [s / r for s, r in zip(sl, rl, strict=True)]
        t_end = [(x - t) / r for x, t, r in zip(ra, tl, rl, strict=True)]
        ts_max = max(t_step)
        if (ts_max - min(t_step) <= 1e-9 * ts_max
                and max(t_end) - min(t_end) <= 1e-9 * ts_max):
            return None
    return target


def step_targets_compiled(comp: Component, rate: np.ndarray, rem: np.ndarray | None = None
                          ) -> tuple[np.ndarray, np.ndarray | None]:
    """``(bytes of every flow to its next event, step targets or None)``: what
    :meth:`~twin.kernel.flows.FlowNetwork._allocate` derives with :func:`step_target` slice by
    slice, in one compiled call over the component's stepped transfers (a slice without a
    target has target 0, and ``rem - 0.0`` is ``rem``: the same values). What does not change
    while the component holds the same stepped transfers (their flows' step sizes, their
    offsets) is kept on the component. ``rem``: the remaining bytes of the active flows in
    slice order, when the caller has them."""
    slices = comp.slices
    if rem is None:
        rem = np.concatenate([tr.remaining[act] for tr, act in slices])
    if not comp.nstep:
        return rem, None
    b = comp.bounds.tolist()
    stepped = [(tr, b[j], b[j + 1]) for j, (tr, _act) in enumerate(slices) if tr.steps > 1]
    ids = tuple(tr.id for tr, _l, _h in stepped)
    statics = comp.statics
    if statics is None or statics[0] != ids:
        f_lo = np.fromiter(accumulate((len(tr.remaining) for tr, _lo, _hi in stepped),
                                      initial=0), dtype=np.int64, count=len(stepped) + 1)
        statics = comp.statics = (
            ids, f_lo, np.concatenate([tr._per_step for tr, _l, _h in stepped]),
            np.concatenate([tr.step_size for tr, _l, _h in stepped]),
            np.array([tr.uniform for tr, _l, _h in stepped], dtype=bool))
    _ids, f_lo, per_step, step_size, uniform = statics
    target = np.zeros(len(rate))
    has = _compiled().step_targets(
        rate, np.array([lo for _t, lo, _h in stepped], dtype=np.int64),
        np.array([hi for _t, _l, hi in stepped], dtype=np.int64),
        np.concatenate([act for _tr, act in slices]), f_lo,
        np.concatenate([tr.remaining for tr, _l, _h in stepped]), per_step,
        np.concatenate([tr.parked for tr, _l, _h in stepped]), step_size, uniform, target)
    if not has.any():
        return rem, None
    return rem - target, target


__all__ = ["_compiled", "step_target", "step_targets_compiled"]
