"""Step targets of the bulk-synchronous transfers of a component in one compiled call: what
``twin.kernel.flows.FlowNetwork._step_target`` derives transfer by transfer, for the large
components where that loop would cost most (``twin.kernel.flows._JIT_FLOWS``).

Kernel: links are array indices, nothing of GPUs.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np

from twin.kernel.transfer import Component


def _compiled():
    """``twin.kernel.maxmin_jit``, imported at the first large component (numba)."""
    import twin.kernel.maxmin_jit as jit  # (after the first call: a lookup in sys.modules)

    return jit


def step_targets_compiled(comp: Component, rate: np.ndarray, rem: np.ndarray | None = None
                          ) -> tuple[np.ndarray, np.ndarray | None]:
    """``(bytes of every flow to its next event, step targets or None)``: what
    :meth:`~twin.kernel.flows.FlowNetwork._allocate` derives with ``_step_target`` slice by
    slice, in one compiled call over the component's stepped transfers (a slice without a
    target has target 0, and ``rem - 0.0`` is ``rem``: the same values). What does not change
    while the component holds the same stepped transfers (their flows' step sizes, their
    offsets) is kept on the component. ``rem``: the remaining bytes of the active flows in
    slice order, when the caller has them."""
    slices = comp.slices
    if rem is None:
        rem = np.concatenate([tr.remaining[act] for tr, _lo, _hi, act in slices])
    stepped = [(tr, lo, hi) for tr, lo, hi, _act in slices if tr.steps > 1]
    if not stepped:
        return rem, None
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
        np.concatenate([act for _tr, _lo, _hi, act in slices]), f_lo,
        np.concatenate([tr.remaining for tr, _l, _h in stepped]), per_step,
        np.concatenate([tr.parked for tr, _l, _h in stepped]), step_size, uniform, target)
    if not has.any():
        return rem, None
    return rem - target, target


__all__ = ["_compiled", "step_targets_compiled"]
