"""Compiled counterparts of the flow engine's per-allocation arithmetic, for large components.

:func:`twin.kernel.maxmin._max_min_local` (NumPy, progressive filling) costs a handful of
array passes per level; :func:`twin.kernel.steps.step_target` a Python loop per
stepped transfer. A component of a run without rank symmetry on thousands of devices (data-
parallel rings crossing the tensor-parallel groups' links, out of step under jitter) holds
tens of transfers and hundreds of flows and is re-allocated at every ring step of every flow,
so these dominate there. The functions below do the same IEEE float64 operations on the same
values in the same order (no fast-math): the rates and targets are the same to the last bit
(``tests/test_flows_compiled.py`` compares both forms bit for bit). The engine uses them for
components of ``twin.kernel.flows._JIT_FLOWS`` flows or more, once a run has made
``_JIT_AFTER`` such allocations: numba's import and cache load (~0.6 s) pay only for runs that
make many, so small runs never import this module.
"""

from __future__ import annotations

import heapq
import math

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def compact_max_min(entry_flow: np.ndarray, entry_link: np.ndarray, n_flows: int,
                    capacity: np.ndarray, scratch: np.ndarray, cert: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """``(rate, ulinks, inv)``: the links the entries cross (sorted, as ``np.unique``), each
    entry's index into them, and the max-min rates of ``_max_min_local(entry_flow, inv,
    n_flows, capacity[ulinks], cert)``, bytes/s (``cert``: each flow's bottleneck, an index
    into ``ulinks``, written).

    ``scratch`` is an int64 array over every link of the network holding -1; it is used as
    the link -> local index table and left holding -1 again."""
    n_ent = entry_link.size
    n_all = scratch.size
    n_u = 0
    for e in range(n_ent):
        lk = entry_link[e]
        if scratch[lk] < 0:
            scratch[lk] = 0
            n_u += 1
    ulinks = np.empty(n_u, dtype=np.int64)
    k = 0
    if 16 * n_u < n_all:  # few links: sort them (numba's sort costs ~30 ns per element)
        for e in range(n_ent):
            lk = entry_link[e]
            if scratch[lk] == 0:
                scratch[lk] = 1
                ulinks[k] = lk
                k += 1
        ulinks.sort()
    else:  # a good part of the network: scan it in order
        for lk in range(n_all):
            if scratch[lk] >= 0:
                ulinks[k] = lk
                k += 1
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
    return max_min_local(entry_flow, inv, n_flows, cap, cert), ulinks, inv


#: levels solved by scanning every live link and entry before :func:`max_min_local` turns
#: to its heap of link shares (a few levels is the common case: a scan costs less than the
#: heap's pushes; many distinct rates would cost levels x entries by scanning)
_SCAN_LEVELS = 12


@numba.njit(cache=True, nogil=True)
def max_min_local(entry_flow: np.ndarray, local: np.ndarray, n_flows: int,
                  cap: np.ndarray, cert: np.ndarray) -> np.ndarray:  # pragma: no cover
    """:func:`twin.kernel.maxmin._max_min_local`, level by level: the least share
    ``rem / count`` among links with live entries is the level, every link within ``1e-12``
    of it a bottleneck, its flows frozen at the level, and on every link they cross
    ``rem -= level x (entries leaving)``, clipped at 0, once per level.

    The first ``_SCAN_LEVELS`` levels scan the live links and entries (compacted after each
    level, as the NumPy form does); a component with more distinct rates goes on with
    :func:`_heap_levels`, which re-shares only the links a level touches. ``cert`` receives
    each flow's bottleneck link (-1 for flows without links), as in the NumPy form."""
    n_links = cap.size
    n_ent = local.size
    rate = np.full(n_flows, np.inf)
    cert[:] = -1
    if n_ent == 0:
        return rate
    rem = cap.copy()
    cnt = np.zeros(n_links, dtype=np.int64)
    for e in range(n_ent):
        cnt[local[e]] += 1
    ef = entry_flow.copy()
    lk = local.copy()
    live = np.empty(n_links, dtype=np.int64)  # links with live entries
    n_live = 0
    for j in range(n_links):
        if cnt[j] > 0:
            live[n_live] = j
            n_live += 1
    frozen = np.zeros(n_flows, dtype=np.bool_)
    bott = np.zeros(n_links, dtype=np.bool_)
    gone = np.zeros(n_links, dtype=np.int64)
    n_e = n_ent
    levels = 0
    while n_e > 0:
        if levels == _SCAN_LEVELS:
            _heap_levels(ef[:n_e], lk[:n_e], n_flows, rem, cnt, rate, frozen, cert)
            return rate
        levels += 1
        level = np.inf
        for i in range(n_live):
            j = live[i]
            s = rem[j] / cnt[j]
            if s < level:
                level = s
        thr = level * (1 + 1e-12)
        for i in range(n_live):
            j = live[i]
            bott[j] = rem[j] / cnt[j] <= thr
        for e in range(n_e):
            if bott[lk[e]]:
                f = ef[e]
                if not frozen[f]:
                    frozen[f] = True
                    rate[f] = level
                    cert[f] = lk[e]
        w = 0
        for e in range(n_e):
            f = ef[e]
            if frozen[f]:
                gone[lk[e]] += 1
            else:
                ef[w] = f
                lk[w] = lk[e]
                w += 1
        n_e = w
        k = 0
        for i in range(n_live):
            j = live[i]
            bott[j] = False
            g = gone[j]
            if g > 0:
                r = rem[j] - level * g
                if r < 0.0:
                    r = 0.0
                rem[j] = r
                cnt[j] -= g
                gone[j] = 0
            if cnt[j] > 0:
                live[k] = j
                k += 1
        n_live = k
    return rate


@numba.njit(cache=True, nogil=True)
def _heap_levels(entry_flow: np.ndarray, local: np.ndarray, n_flows: int, rem: np.ndarray,
                 cnt: np.ndarray, rate: np.ndarray, frozen: np.ndarray,
                 cert: np.ndarray) -> None:  # pragma: no cover - compiled
    """The remaining levels of :func:`max_min_local` from its state (the live entries,
    each link's ``rem`` and live ``cnt``, the rates and frozen flows so far), with a heap of
    the links' shares: only the links a level touches are re-shared (the others' ``rem /
    count`` is what it was), so a level costs what it freezes, not every entry."""
    n_links = rem.size
    n_ent = local.size
    f_cnt = np.zeros(n_flows + 1, dtype=np.int64)
    for e in range(n_ent):
        f_cnt[entry_flow[e] + 1] += 1
    # live entries by link and by flow (CSR)
    l_start = np.zeros(n_links + 1, dtype=np.int64)
    for j in range(n_links):
        l_start[j + 1] = l_start[j] + cnt[j]
    for f in range(n_flows):
        f_cnt[f + 1] += f_cnt[f]
    l_ent = np.empty(n_ent, dtype=np.int64)
    f_ent = np.empty(n_ent, dtype=np.int64)
    l_pos = l_start[:-1].copy()
    f_pos = f_cnt[:-1].copy()
    for e in range(n_ent):
        j = local[e]
        l_ent[l_pos[j]] = e
        l_pos[j] += 1
        f = entry_flow[e]
        f_ent[f_pos[f]] = e
        f_pos[f] += 1
    ver = np.zeros(n_links, dtype=np.int64)
    # (share, link, version): an entry is live while its version is the link's
    heap = [(rem[j] / cnt[j], j, ver[j]) for j in range(n_links) if cnt[j] > 0]
    heapq.heapify(heap)
    gone = np.zeros(n_links, dtype=np.int64)
    touched = np.empty(n_links, dtype=np.int64)
    bott = np.empty(n_links, dtype=np.int64)
    is_b = np.zeros(n_links, dtype=np.bool_)
    while len(heap) > 0:
        level, j, v = heapq.heappop(heap)
        if v != ver[j] or cnt[j] == 0:
            continue  # a stale share
        thr = level * (1 + 1e-12)
        bott[0] = j
        n_b = 1
        while len(heap) > 0 and heap[0][0] <= thr:
            _s, j, v = heapq.heappop(heap)
            if v == ver[j] and cnt[j] > 0:
                bott[n_b] = j
                n_b += 1
        n_t = 0
        for b in range(n_b):
            is_b[bott[b]] = True
        for b in range(n_b):
            j = bott[b]
            for k in range(l_start[j], l_start[j + 1]):
                f = entry_flow[l_ent[k]]
                if frozen[f]:
                    continue
                frozen[f] = True
                rate[f] = level
                for m in range(f_cnt[f], f_cnt[f + 1]):  # its first entry on a bottleneck
                    if is_b[local[f_ent[m]]]:
                        cert[f] = local[f_ent[m]]
                        break
                for m in range(f_cnt[f], f_cnt[f + 1]):
                    lk = local[f_ent[m]]
                    if gone[lk] == 0:
                        touched[n_t] = lk
                        n_t += 1
                    gone[lk] += 1
        for b in range(n_b):
            is_b[bott[b]] = False
        for t in range(n_t):
            lk = touched[t]
            r = rem[lk] - level * gone[lk]
            if r < 0.0:
                r = 0.0
            rem[lk] = r
            cnt[lk] -= gone[lk]
            gone[lk] = 0
            ver[lk] += 1
            if cnt[lk] > 0:
                heapq.heappush(heap, (rem[lk] / cnt[lk], lk, ver[lk]))


@numba.njit(cache=True, nogil=True)
def _max_min(x: np.ndarray, lo: int, hi: int) -> tuple[float, float]:  # pragma: no cover
    """``(max, min)`` of ``x[lo:hi]`` (``hi > lo``), as Python's ``max`` / ``min`` of it."""
    x_max = x[lo]
    x_min = x[lo]
    for k in range(lo + 1, hi):
        if x[k] > x_max:
            x_max = x[k]
        if x[k] < x_min:
            x_min = x[k]
    return x_max, x_min


@numba.njit(cache=True, nogil=True)
def step_targets(rate: np.ndarray, lo: np.ndarray, hi: np.ndarray, act: np.ndarray,
                 f_lo: np.ndarray, remaining: np.ndarray, per_step: np.ndarray,
                 parked: np.ndarray, step_size: np.ndarray, uniform: np.ndarray,
                 target: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """:func:`twin.kernel.steps.step_target` of several stepped transfers.

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
            r_max, r_min = _max_min(rate, a, b)
            m_max, m_min = _max_min(remaining, f0, f1)
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


@numba.njit(cache=True, nogil=True)
def link_totals(inv: np.ndarray, entry_flow: np.ndarray, rate: np.ndarray,
                n_links: int) -> tuple:  # pragma: no cover - compiled
    """``(load, top, count)`` per link of a component in one pass over its entries: the sum
    of the rates on each (entry order, as ``np.bincount`` adds them), bytes/s, the largest,
    and the number of entries (``twin.kernel.joins.Ledger``)."""
    load = np.zeros(n_links)
    top = np.zeros(n_links)
    count = np.zeros(n_links, dtype=np.int64)
    for e in range(inv.size):
        count[inv[e]] += 1
    _sum_and_top(inv, entry_flow, rate, load, top)
    return load, top, count


@numba.njit(cache=True, nogil=True)
def _sum_and_top(inv: np.ndarray, owner: np.ndarray, rate: np.ndarray, acc: np.ndarray,
                 top: np.ndarray) -> None:  # pragma: no cover - compiled
    """Add each entry's rate ``rate[owner[e]]`` to ``acc[inv[e]]`` in entry order (as
    ``np.bincount`` adds them) and raise ``top[inv[e]]`` to it."""
    for e in range(inv.size):
        lk = inv[e]
        r = rate[owner[e]]
        acc[lk] += r
        if r > top[lk]:
            top[lk] = r


@numba.njit(cache=True, nogil=True)
def ledger_slots(links: np.ndarray, lid: np.ndarray, lown: np.ndarray, serial: int,
                 gl: np.ndarray, n: int) -> tuple:  # pragma: no cover - compiled
    """``(sub, sub_inv, n)`` of ``Ledger.join``: the slots ``links`` cross (sorted, as
    ``np.unique``), each entry's index into them, and the ledger's new slot count. A link
    without a slot gets one, in increasing link order from ``n`` (``Ledger._slots``). When
    ``gl`` has no room for them, nothing is written and ``sub`` is empty with the count that
    needs room: the caller grows the ledger and asks again."""
    m = links.size
    idx = np.empty(m, dtype=np.int64)
    fresh = np.empty(m, dtype=np.int64)
    nf = 0
    for e in range(m):
        lk = links[e]
        if lown[lk] == serial:
            idx[e] = lid[lk]
        else:
            idx[e] = -1
            fresh[nf] = lk
            nf += 1
    if nf:
        new = np.unique(fresh[:nf])
        k = new.size
        if n + k > gl.size:
            return idx[:0], idx[:0], n + k
        for j in range(k):
            gl[n + j] = new[j]
            lid[new[j]] = n + j
            lown[new[j]] = serial
        for e in range(m):
            if idx[e] < 0:
                idx[e] = lid[links[e]]
        n += k
    sub = np.unique(idx)
    return sub, np.searchsorted(sub, idx), n


@numba.njit(cache=True, nogil=True)
def ledger_join(local: np.ndarray, links: np.ndarray, sub: np.ndarray, sub_inv: np.ndarray,
                y: np.ndarray, capacity: np.ndarray, gl: np.ndarray, load: np.ndarray,
                top: np.ndarray, count: np.ndarray, since: np.ndarray, busy: float,
                tol: float, single: bool, held: np.ndarray) -> bool:  # pragma: no cover
    """The arithmetic of ``Ledger.join`` after its slots (:func:`ledger_slots`), in the same
    operations and order: with ``single`` (one new flow), its rate is worked out here into
    ``y[0]`` (the progressive filling's one level), else ``y`` holds the new flows' rates.
    True, the ledger updated and ``held`` (-1 on entry) holding each flow's bottleneck link
    id, when every new flow has a bottleneck; else False and the ledger as it was."""
    ns = sub.size
    cap = np.empty(ns)
    cnt = np.zeros(ns, dtype=np.int64)
    for s in range(ns):
        cap[s] = capacity[gl[sub[s]]]
    for e in range(sub_inv.size):
        cnt[sub_inv[e]] += 1
    if single:
        lvl = math.inf
        for s in range(ns):
            r = cap[s] - load[sub[s]]
            if r < 0.0:
                r = 0.0
            r = r / cnt[s]
            if r < lvl or r != r:
                lvl = r
        y[0] = lvl
    for i in range(y.size):
        if not (math.isfinite(y[i]) and y[i] > 0.0):
            return False
    acc = np.zeros(ns)
    tp = np.empty(ns)
    for s in range(ns):
        tp[s] = top[sub[s]]
    _sum_and_top(sub_inv, local, y, acc, tp)
    f = 1.0 - tol
    for e in range(sub_inv.size):
        s = sub_inv[e]
        if load[sub[s]] + acc[s] >= cap[s] * f and y[local[e]] >= tp[s] * f:
            held[local[e]] = links[e]
    for i in range(held.size):
        if held[i] < 0:
            return False
    for s in range(ns):
        k = sub[s]
        load[k] = load[k] + acc[s]
        top[k] = tp[s]
        if count[k] == 0:
            since[k] = busy
        count[k] += cnt[s]
    return True


@numba.njit(cache=True, nogil=True)
def ledger_leave(links: np.ndarray, rates: np.ndarray, lid: np.ndarray, gl: np.ndarray,
                 load: np.ndarray, top: np.ndarray, count: np.ndarray, since: np.ndarray,
                 link_busy: np.ndarray, busy: float) -> None:  # pragma: no cover - compiled
    """``Ledger.leave`` in one pass: the same sums per slot (entry order, as
    ``np.bincount`` adds them) taken off the loads."""
    m = links.size
    idx = np.empty(m, dtype=np.int64)
    for e in range(m):
        idx[e] = lid[links[e]]
    u = np.unique(idx)
    inv = np.searchsorted(u, idx)
    acc = np.zeros(u.size)
    cnt = np.zeros(u.size, dtype=np.int64)
    for e in range(m):
        acc[inv[e]] += rates[e]
        cnt[inv[e]] += 1
    for j in range(u.size):
        k = u[j]
        load[k] -= acc[j]
        count[k] -= cnt[j]
        if count[k] == 0:
            link_busy[gl[k]] += busy - since[k]
            load[k] = 0.0
            top[k] = 0.0
