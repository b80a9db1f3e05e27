"""Compiled counterparts of the flow engine's per-allocation arithmetic, for large components.

:func:`twin.kernel.maxmin._max_min_local` (NumPy, progressive filling) costs a handful of
array passes per level; :meth:`twin.kernel.flows.FlowNetwork._step_target` a Python loop per
stepped transfer. A component of a run without rank symmetry on thousands of devices (data-
parallel rings crossing the tensor-parallel groups' links, out of step under jitter) holds
tens of transfers and hundreds of flows and is re-allocated at every ring step of every flow,
so these dominate there. The functions below do the same IEEE float64 operations on the same
values in the same order (no fast-math): the rates and targets are the same to the last bit,
and the engine uses them only above a component size at which they pay for their call
(``tests/test_flows_reference.py`` compares both forms bit for bit).

Imported when first used (numba's import costs ~0.3 s; small runs never need it).
"""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def compact_max_min(entry_flow: np.ndarray, entry_link: np.ndarray, n_flows: int,
                    capacity: np.ndarray, scratch: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """``(rate, ulinks, inv)``: the links the entries cross (sorted, as ``np.unique``), each
    entry's index into them, and the max-min rates of ``_max_min_local(entry_flow, inv,
    n_flows, capacity[ulinks])``, bytes/s.

    ``scratch`` is an int64 array over every link of the network holding -1; it is used as
    the link -> local index table and left holding -1 again."""
    n_ent = entry_link.size
    ulist = np.empty(n_ent, dtype=np.int64)
    n_u = 0
    for e in range(n_ent):
        lk = entry_link[e]
        if scratch[lk] < 0:
            scratch[lk] = 0
            ulist[n_u] = lk
            n_u += 1
    ulinks = np.sort(ulist[:n_u])
    for j in range(n_u):
        scratch[ulinks[j]] = j
    inv = np.empty(n_ent, dtype=np.int64)
    for e in range(n_ent):
        inv[e] = scratch[entry_link[e]]
    for j in range(n_u):
        scratch[ulinks[j]] = -1
    cap = np.empty(n_u)
    for j in range(n_u):
        cap[j] = capacity[ulinks[j]]
    return max_min_local(entry_flow, inv, n_flows, cap), ulinks, inv


@numba.njit(cache=True, nogil=True)
def max_min_local(entry_flow: np.ndarray, local: np.ndarray, n_flows: int,
                  cap: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """:func:`twin.kernel.maxmin._max_min_local`, level by level: the share ``rem / count``
    of every link with live entries, the least share as the level, every link within
    ``1e-12`` of it a bottleneck, its flows frozen at the level, ``rem -= level x (entries
    leaving)`` and clipped at 0 on every link (links without live entries are never read
    again, so they are skipped)."""
    rate = np.full(n_flows, np.inf)
    n_links = cap.size
    rem = cap.copy()
    n_ent = local.size
    live = np.ones(n_ent, dtype=np.bool_)
    n_live = n_ent
    cnt = np.zeros(n_links, dtype=np.int64)
    for e in range(n_ent):
        cnt[local[e]] += 1
    share = np.empty(n_links)
    bott = np.zeros(n_links, dtype=np.bool_)
    newly = np.zeros(n_flows, dtype=np.bool_)
    gone = np.zeros(n_links, dtype=np.int64)
    while n_live > 0:
        level = np.inf
        for j in range(n_links):
            if cnt[j] > 0:
                s = rem[j] / cnt[j]
                share[j] = s
                if s < level:
                    level = s
        thr = level * (1 + 1e-12)
        for j in range(n_links):
            bott[j] = cnt[j] > 0 and share[j] <= thr
        for e in range(n_ent):
            if live[e] and bott[local[e]]:
                newly[entry_flow[e]] = True
        for e in range(n_ent):
            if live[e] and newly[entry_flow[e]]:
                live[e] = False
                n_live -= 1
                gone[local[e]] += 1
        for j in range(n_links):
            if cnt[j] > 0:
                r = rem[j] - level * gone[j]
                if r < 0.0:
                    r = 0.0
                rem[j] = r
                cnt[j] -= gone[j]
                gone[j] = 0
        for f in range(n_flows):
            if newly[f]:
                rate[f] = level
                newly[f] = False
    return rate


@numba.njit(cache=True, nogil=True)
def step_targets(rate: np.ndarray, lo: np.ndarray, hi: np.ndarray, act: np.ndarray,
                 f_lo: np.ndarray, remaining: np.ndarray, per_step: np.ndarray,
                 parked: np.ndarray, step_size: np.ndarray, uniform: np.ndarray,
                 target: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """:meth:`twin.kernel.flows.FlowNetwork._step_target` of several stepped transfers.

    Transfer ``i``'s active flows are ``act[lo[i]:hi[i]]`` (indices into its own flows) at
    rates ``rate[lo[i]:hi[i]]``; its own flows' ``remaining``, ``per_step``, ``parked`` and
    ``step_size`` start at ``f_lo[i]`` (to ``f_lo[i + 1]``) of the concatenated arrays.
    Writes each transfer's targets into ``target[lo[i]:hi[i]]`` (left 0 where it has none)
    and returns whether it has them (False: the method's None, its flows stay in step)."""
    n_tr = lo.size
    has = np.zeros(n_tr, dtype=np.bool_)
    for i in range(n_tr):
        a, b = lo[i], hi[i]
        f0, f1 = f_lo[i], f_lo[i + 1]
        n_act = b - a
        n_all = f1 - f0
        if n_act == 0:
            continue  # (never asked: a slice has active flows)
        if uniform[i] and n_act == n_all:
            r_max = rate[a]
            r_min = rate[a]
            for k in range(a + 1, b):
                if rate[k] > r_max:
                    r_max = rate[k]
                if rate[k] < r_min:
                    r_min = rate[k]
            m_max = remaining[f0]
            m_min = remaining[f0]
            for k in range(f0 + 1, f1):
                if remaining[k] > m_max:
                    m_max = remaining[k]
                if remaining[k] < m_min:
                    m_min = remaining[k]
            if r_max - r_min <= 1e-9 * r_max and m_max - m_min <= 1e-9 * step_size[f0]:
                continue
        top = 0.0
        wait = -1.0
        n_pending = 0
        for k in range(f0, f1):
            r = remaining[k]
            if r > 0:
                q = max(float(math.ceil(r * per_step[k] - 1e-6)), 0.0)
                n_pending += 1
                if q > top:
                    top = q
                if parked[k] and q > wait:
                    wait = q
        if wait >= 0.0 and wait + 1.0 > top:
            top = wait + 1.0
        steps_done = max(top, 1.0) - 1.0
        for k in range(a, b):
            target[k] = steps_done * step_size[f0 + act[k]]
        if n_act == n_pending:
            ts_max = -np.inf
            ts_min = np.inf
            te_max = -np.inf
            te_min = np.inf
            for k in range(a, b):
                f = f0 + act[k]
                t_step = step_size[f] / rate[k]
                t_end = (remaining[f] - target[k]) / rate[k]
                if t_step > ts_max:
                    ts_max = t_step
                if t_step < ts_min:
                    ts_min = t_step
                if t_end > te_max:
                    te_max = t_end
                if t_end < te_min:
                    te_min = t_end
            if ts_max - ts_min <= 1e-9 * ts_max and te_max - te_min <= 1e-9 * ts_max:
                for k in range(a, b):
                    target[k] = 0.0
                continue
        has[i] = True
    return has
