"""The FR-FCFS engine's compiled loops (Numba): the counting sort by channel and the scheduler loop.

Kept apart from :mod:`devices.hbm.engine` so that one source serves two builds: Numba's
just-in-time compiler (``@numba.njit(cache=True)``, compiled on first call and cached in
``__pycache__``) and an ahead-of-time extension module built from these same functions at
install time (:mod:`devices.hbm.aot`), which a fresh process loads without importing Numba.
"""

from __future__ import annotations

import numba
import numpy as np

_u = np.uint64
"""Index cast used in the compiled functions: Numba emits negative-index wraparound code for signed
indices; their indices are never negative, and unsigned ones make it ~20% faster."""


@numba.njit(cache=True)
def group_by_channel(  # pragma: no cover - compiled
    channel: np.ndarray,
    base: np.ndarray,
    n_channels: int,
    arrival: np.ndarray,
    bank: np.ndarray,
    row: np.ndarray,
    is_write: np.ndarray,
):
    """Counting sort of ``base`` (an age order) by channel.

    Returns (order, start, arrival, bank, row, is_write): ``order[start[c]:start[c + 1]]`` are
    the request indices of channel c in age order, and the other arrays are the inputs
    gathered into that order (so that the engine reads them sequentially).
    """
    n = base.shape[0]
    start = np.zeros(n_channels + 1, dtype=np.int64)
    for i in range(n):
        start[channel[_u(i)] + 1] += 1
    for c in range(n_channels):
        start[_u(c + 1)] += start[_u(c)]
    fill = start[:-1].copy()
    order = np.empty(n, dtype=np.int64)
    arr_c = np.empty(n, dtype=np.float64)
    bank_c = np.empty(n, dtype=np.int32)
    row_c = np.empty(n, dtype=np.int64)
    wr_c = np.empty(n, dtype=np.bool_)
    for j in range(n):
        i = base[_u(j)]
        c = channel[_u(i)]
        k = fill[_u(c)]
        fill[_u(c)] = k + 1
        order[_u(k)] = i
        arr_c[_u(k)] = arrival[_u(i)]
        bank_c[_u(k)] = bank[_u(i)]
        row_c[_u(k)] = row[_u(i)]
        wr_c[_u(k)] = is_write[_u(i)]
    return order, start, arr_c, bank_c, row_c, wr_c


@numba.njit(cache=True, nogil=True)
def _list_insert(lb: np.ndarray, ld: np.ndarray, la: np.ndarray, n: int,
                 b: int, d: int, age: int) -> int:  # pragma: no cover - compiled
    """Insert (bank, direction, age) into a list kept in ascending age; return new length."""
    j = n
    while j > 0 and la[_u(j - 1)] > age:
        lb[_u(j)] = lb[_u(j - 1)]
        ld[_u(j)] = ld[_u(j - 1)]
        la[_u(j)] = la[_u(j - 1)]
        j -= 1
    lb[_u(j)] = b
    ld[_u(j)] = d
    la[_u(j)] = age
    return n + 1


@numba.njit(cache=True, nogil=True)
def _hit_insert(lb: np.ndarray, ld: np.ndarray, la: np.ndarray, lg: np.ndarray, lr: np.ndarray,
                n: int, b: int, d: int, age: int, g: int,
                ro: float) -> int:  # pragma: no cover - compiled
    """:func:`_list_insert` for the hit list, whose entries also carry the bank's group and
    the time its open row became usable (both fixed while the class exists)."""
    j = n
    while j > 0 and la[_u(j - 1)] > age:
        lb[_u(j)] = lb[_u(j - 1)]
        ld[_u(j)] = ld[_u(j - 1)]
        la[_u(j)] = la[_u(j - 1)]
        lg[_u(j)] = lg[_u(j - 1)]
        lr[_u(j)] = lr[_u(j - 1)]
        j -= 1
    lb[_u(j)] = b
    ld[_u(j)] = d
    la[_u(j)] = age
    lg[_u(j)] = g
    lr[_u(j)] = ro
    return n + 1


@numba.njit(cache=True, nogil=True)
def _list_remove(lb: np.ndarray, ld: np.ndarray, la: np.ndarray, n: int,
                 b: int, d: int) -> int:  # pragma: no cover - compiled
    """Remove the entry (bank, direction) from a list; return new length."""
    j = 0
    while lb[_u(j)] != b or ld[_u(j)] != d:
        j += 1
    for k in range(j, n - 1):
        lb[_u(k)] = lb[_u(k + 1)]
        ld[_u(k)] = ld[_u(k + 1)]
        la[_u(k)] = la[_u(k + 1)]
    return n - 1


@numba.njit(cache=True, nogil=True)
def fr_fcfs_engine(  # pragma: no cover - compiled; checked against simulate_reference
    arrival: np.ndarray,
    bank: np.ndarray,
    row: np.ndarray,
    is_write: np.ndarray,
    order: np.ndarray,
    start: np.ndarray,
    n_banks: int,
    n_groups: int,
    qcap: int,
    tim: np.ndarray,
    refresh: bool,
    completion: np.ndarray,
    kind: np.ndarray,
    c_first: int,
    c_last: int,
) -> int:
    """FR-FCFS over channels ``c_first .. c_last - 1``; see the module docstring.

    ``arrival``, ``bank``, ``row``, ``is_write`` are in channel order (see
    :func:`group_by_channel`); ``order`` maps that order to request indices, which index
    ``completion`` and ``kind``. Returns 0, or 1 if a channel stalled (an invariant violation).

    Makes the decisions of the per-request scan in :func:`simulate_reference`, organised by
    *classes*: the queued read hits of a bank, its write hits, its requests waiting for an
    ACT (closed bank) or for a PRE (open bank without queued hits). All requests of a class
    share the timing of their next command, so only the class's oldest request matters. The
    classes sit in three lists kept in age order (hits, ACT, PRE). A class's earliest time is
    ``max(local, gate)`` with a gate common to its list and direction (data bus for hits, tRRD
    / tFAW for ACTs), so walking a list in age order can stop at the first class whose local
    part is within the gate: no later class can be ready earlier or be older at equal time.
    Queued requests are linked per bank in age order.
    """
    inf = np.inf
    t_cl = tim[0]
    t_cwl = tim[1]
    t_rcd = tim[2]
    t_rp = tim[3]
    t_ras = tim[4]
    t_rtp = tim[5]
    t_wr = tim[6]
    t_wtr_cl = tim[7]
    t_rtw = tim[8]
    t_ccdl = tim[9]
    t_rrd = tim[10]
    t_faw = tim[11]
    t_refi = tim[12]
    t_rfc = tim[13]
    t_burst = tim[14]

    # per bank
    open_row = np.empty(n_banks, dtype=np.int64)
    row_ok = np.empty(n_banks, dtype=np.float64)
    act_ready = np.empty(n_banks, dtype=np.float64)
    pre_ready = np.empty(n_banks, dtype=np.float64)
    grp = np.empty(n_banks, dtype=np.int64)
    for b in range(n_banks):
        grp[_u(b)] = b % n_groups
    head = np.empty(n_banks, dtype=np.int64)  # oldest queued request (j) of the bank, -1 if none
    tail = np.empty(n_banks, dtype=np.int64)
    n_rd = np.empty(n_banks, dtype=np.int64)  # queued read hits
    n_wr = np.empty(n_banks, dtype=np.int64)  # queued write hits
    old_rd = np.empty(n_banks, dtype=np.int64)  # oldest queued read hit (j), -1 if none
    old_wr = np.empty(n_banks, dtype=np.int64)
    bg_cas = np.empty(n_groups, dtype=np.float64)
    faw = np.empty(4, dtype=np.float64)
    # class lists in age order: hits (bank, direction), ACT (bank), PRE (bank)
    hl_b = np.empty(2 * n_banks, dtype=np.int64)
    hl_d = np.empty(2 * n_banks, dtype=np.int64)
    hl_a = np.empty(2 * n_banks, dtype=np.int64)
    hl_g = np.empty(2 * n_banks, dtype=np.int64)  # bank group of the entry's bank
    hl_r = np.empty(2 * n_banks, dtype=np.float64)  # row_ok of the entry's bank
    al_b = np.empty(n_banks, dtype=np.int64)
    al_d = np.zeros(n_banks, dtype=np.int64)
    al_a = np.empty(n_banks, dtype=np.int64)
    pl_b = np.empty(n_banks, dtype=np.int64)
    pl_d = np.zeros(n_banks, dtype=np.int64)
    pl_a = np.empty(n_banks, dtype=np.int64)
    # a queued request is named by its position j in the channel-ordered arrays, which is
    # also its age; per bank, queued requests are linked in age order
    nxt_j = np.empty(arrival.shape[0], dtype=np.int32)
    prv_j = np.empty(arrival.shape[0], dtype=np.int32)

    for c in range(c_first, c_last):
        lo = start[_u(c)]
        hi = start[_u(c + 1)]
        n_c = hi - lo
        if n_c == 0:
            continue
        for b in range(n_banks):
            open_row[_u(b)] = -1
            row_ok[_u(b)] = 0.0
            act_ready[_u(b)] = 0.0
            pre_ready[_u(b)] = 0.0
            head[_u(b)] = -1
            tail[_u(b)] = -1
            n_rd[_u(b)] = 0
            n_wr[_u(b)] = 0
            old_rd[_u(b)] = -1
            old_wr[_u(b)] = -1
        n_q = 0  # queued requests
        n_hl = 0
        n_hl_rd = 0  # hit classes per direction
        n_hl_wr = 0
        n_al = 0
        n_pl = 0
        bg_cas[:] = -inf
        faw[:] = -inf
        faw_pos = 0
        last_act = -inf
        bus_free = 0.0
        last_dir = -1  # -1 none, 0 read, 1 write
        k_ref = 1
        next_ref = t_refi * k_ref if refresh else inf
        t = 0.0
        p = 0  # next request (age rank within the channel) not yet admitted
        done = 0
        while done < n_c:
            # 1. admit arrivals while the queue has room, oldest first
            while n_q < qcap and p < n_c:
                s = lo + p
                if arrival[_u(s)] > t:
                    break
                n_q += 1
                b = bank[_u(s)]
                r = row[_u(s)]
                w = is_write[_u(s)]
                nxt_j[_u(s)] = -1
                prv_j[_u(s)] = tail[_u(b)]
                was_empty = tail[_u(b)] < 0
                if was_empty:
                    head[_u(b)] = s
                else:
                    nxt_j[tail[_u(b)]] = s
                tail[_u(b)] = s
                if open_row[_u(b)] == r:  # a hit: joins (or founds) its hit class
                    if w:
                        n_wr[_u(b)] += 1
                        if old_wr[_u(b)] < 0:
                            old_wr[_u(b)] = s
                            n_hl = _hit_insert(hl_b, hl_d, hl_a, hl_g, hl_r, n_hl, b, 1, s,
                                               grp[_u(b)], row_ok[_u(b)])
                            n_hl_wr += 1
                    else:
                        n_rd[_u(b)] += 1
                        if old_rd[_u(b)] < 0:
                            old_rd[_u(b)] = s
                            n_hl = _hit_insert(hl_b, hl_d, hl_a, hl_g, hl_r, n_hl, b, 0, s,
                                               grp[_u(b)], row_ok[_u(b)])
                            n_hl_rd += 1
                    if n_rd[_u(b)] + n_wr[_u(b)] == 1 and not was_empty:
                        n_pl = _list_remove(pl_b, pl_d, pl_a, n_pl, b, 0)  # now protected
                elif was_empty:
                    if open_row[_u(b)] < 0:
                        n_al = _list_insert(al_b, al_d, al_a, n_al, b, 0, s)
                    else:
                        n_pl = _list_insert(pl_b, pl_d, pl_a, n_pl, b, 0, s)
                p += 1
            # 2. refresh windows that have begun: every row closes
            if t >= next_ref:
                while t >= next_ref:
                    end = next_ref + t_rfc
                    for b in range(n_banks):
                        open_row[_u(b)] = -1
                        n_rd[_u(b)] = 0
                        n_wr[_u(b)] = 0
                        old_rd[_u(b)] = -1
                        old_wr[_u(b)] = -1
                        if act_ready[_u(b)] < end:
                            act_ready[_u(b)] = end
                    if t < end:
                        t = end
                    k_ref += 1
                    next_ref = t_refi * k_ref
                n_hl = 0
                n_hl_rd = 0
                n_hl_wr = 0
                n_pl = 0
                n_al = 0
                for b in range(n_banks):
                    if head[_u(b)] >= 0:
                        n_al = _list_insert(al_b, al_d, al_a, n_al, b, 0, head[_u(b)])
                continue
            if n_q == 0:
                t = arrival[_u(lo + p)]
                continue
            # 3. FR-FCFS decision at t
            gate_act = last_act + t_rrd
            g2 = faw[_u(faw_pos)] + t_faw
            if g2 > gate_act:
                gate_act = g2
            if last_dir == 1:
                bus_rd = bus_free + t_wtr_cl
            else:
                bus_rd = bus_free
            if last_dir == 0:
                bus_wr = bus_free + t_rtw
            else:
                bus_wr = bus_free
            gate_rd = bus_rd - t_cl
            gate_wr = bus_wr - t_cwl
            # hits: the first ready class in age order is the oldest ready hit; otherwise
            # keep the earliest (time, age) to jump to
            hit_b = -1
            hit_d = 0
            hit_k = -1  # position of the chosen class in the hit list
            nh_e = inf
            nh_age = hi
            nh_b = -1
            nh_d = 0
            nh_k = -1
            done_rd = n_hl_rd == 0
            done_wr = n_hl_wr == 0
            for k in range(n_hl):
                d = hl_d[_u(k)]
                if d == 0:
                    if done_rd:
                        continue
                    g = gate_rd
                else:
                    if done_wr:
                        continue
                    g = gate_wr
                loc = hl_r[_u(k)]
                x = bg_cas[hl_g[_u(k)]] + t_ccdl
                if x > loc:
                    loc = x
                e = loc if loc > g else g
                if e <= t:
                    hit_b = hl_b[_u(k)]
                    hit_d = d
                    hit_k = k
                    break
                if e < nh_e or (e == nh_e and hl_a[_u(k)] < nh_age):
                    nh_e = e
                    nh_age = hl_a[_u(k)]
                    nh_b = hl_b[_u(k)]
                    nh_d = d
                    nh_k = k
                if loc <= g:
                    if d == 0:
                        done_rd = True
                    else:
                        done_wr = True
                    if done_rd and done_wr:
                        break
            row_b = -1
            nr_e = inf
            if hit_b < 0:
                # row commands: oldest ready ACT or PRE; otherwise earliest (time, age)
                row_age = hi
                nr_age = hi
                nr_b = -1
                for k in range(n_al):
                    b = al_b[_u(k)]
                    loc = act_ready[_u(b)]
                    e = loc if loc > gate_act else gate_act
                    if e <= t:
                        row_b = b
                        row_age = al_a[_u(k)]
                        break
                    if e < nr_e or (e == nr_e and al_a[_u(k)] < nr_age):
                        nr_e = e
                        nr_age = al_a[_u(k)]
                        nr_b = b
                    if loc <= gate_act:
                        break
                for k in range(n_pl):
                    if pl_a[_u(k)] >= row_age:
                        break
                    b = pl_b[_u(k)]
                    e = pre_ready[_u(b)]
                    if e <= t:
                        row_b = b
                        break
                    if e < nr_e or (e == nr_e and pl_a[_u(k)] < nr_age):
                        nr_e = e
                        nr_age = pl_a[_u(k)]
                        nr_b = b
                if row_b < 0:
                    # 4. nothing ready: advance time to the next event. If it is a command
                    # becoming ready (no admission, no refresh first), nothing else changes
                    # until then, so the ready set then is exactly the commands whose time
                    # equals it: issue the best of them without deciding again.
                    nxt = nh_e if nh_e < nr_e else nr_e
                    direct = True
                    if n_q < qcap and p < n_c:
                        x = arrival[_u(lo + p)]
                        if x <= nxt:
                            nxt = x
                            direct = False
                    if nxt >= next_ref:
                        direct = False
                    if nxt == inf or nxt <= t:
                        return 1
                    t = nxt
                    if not direct:
                        continue
                    if nh_e == nxt:
                        hit_b = nh_b
                        hit_d = nh_d
                        hit_k = nh_k
                    else:
                        row_b = nr_b
            if hit_b >= 0:
                # column command for the oldest hit of class (hit_b, hit_d)
                b = hit_b
                if hit_d == 1:
                    s = old_wr[_u(b)]
                    ds = t + t_cwl
                    if bus_wr > ds:
                        ds = bus_wr
                    de = ds + t_burst
                    x = de + t_wr
                    if x > pre_ready[_u(b)]:
                        pre_ready[_u(b)] = x
                    last_dir = 1
                    n_wr[_u(b)] -= 1
                    left = n_wr[_u(b)]
                else:
                    s = old_rd[_u(b)]
                    ds = t + t_cl
                    if bus_rd > ds:
                        ds = bus_rd
                    de = ds + t_burst
                    x = t + t_rtp
                    if x > pre_ready[_u(b)]:
                        pre_ready[_u(b)] = x
                    last_dir = 0
                    n_rd[_u(b)] -= 1
                    left = n_rd[_u(b)]
                bus_free = de
                bg_cas[grp[_u(b)]] = t
                completion[order[_u(s)]] = de
                # the class's next oldest request lies after s in the bank's list
                w = hit_d == 1
                orow = open_row[_u(b)]
                found = -1
                if left > 0:
                    nx = nxt_j[_u(s)]
                    while nx >= 0:
                        if is_write[_u(nx)] == w and row[_u(nx)] == orow:
                            found = nx
                            break
                        nx = nxt_j[_u(nx)]
                # move the class back to its new age (later), or drop it
                k = hit_k
                if found >= 0:
                    x = found
                    ro = hl_r[_u(k)]
                    while k + 1 < n_hl and hl_a[_u(k + 1)] < x:
                        hl_b[_u(k)] = hl_b[_u(k + 1)]
                        hl_d[_u(k)] = hl_d[_u(k + 1)]
                        hl_a[_u(k)] = hl_a[_u(k + 1)]
                        hl_g[_u(k)] = hl_g[_u(k + 1)]
                        hl_r[_u(k)] = hl_r[_u(k + 1)]
                        k += 1
                    hl_b[_u(k)] = b
                    hl_d[_u(k)] = hit_d
                    hl_a[_u(k)] = x
                    hl_g[_u(k)] = grp[_u(b)]
                    hl_r[_u(k)] = ro
                else:
                    for kk in range(k, n_hl - 1):
                        hl_b[_u(kk)] = hl_b[_u(kk + 1)]
                        hl_d[_u(kk)] = hl_d[_u(kk + 1)]
                        hl_a[_u(kk)] = hl_a[_u(kk + 1)]
                        hl_g[_u(kk)] = hl_g[_u(kk + 1)]
                        hl_r[_u(kk)] = hl_r[_u(kk + 1)]
                    n_hl -= 1
                    if hit_d == 1:
                        n_hl_wr -= 1
                    else:
                        n_hl_rd -= 1
                if hit_d == 1:
                    old_wr[_u(b)] = found
                else:
                    old_rd[_u(b)] = found
                # unlink s from its bank; its queue entry frees
                pv = prv_j[_u(s)]
                nx = nxt_j[_u(s)]
                if pv >= 0:
                    nxt_j[_u(pv)] = nx
                else:
                    head[_u(b)] = nx
                if nx >= 0:
                    prv_j[_u(nx)] = pv
                else:
                    tail[_u(b)] = pv
                n_q -= 1
                done += 1
                if n_rd[_u(b)] + n_wr[_u(b)] == 0 and head[_u(b)] >= 0:  # only conflicts left
                    n_pl = _list_insert(pl_b, pl_d, pl_a, n_pl, b, 0, head[_u(b)])
                continue
            # row command for the oldest request of bank row_b
            b = row_b
            s = head[_u(b)]
            i = order[_u(s)]
            if open_row[_u(b)] < 0:  # ACT
                n_al = _list_remove(al_b, al_d, al_a, n_al, b, 0)
                r = row[_u(s)]
                open_row[_u(b)] = r
                row_ok[_u(b)] = t + t_rcd
                pre_ready[_u(b)] = t + t_ras
                last_act = t
                faw[_u(faw_pos)] = t
                faw_pos = (faw_pos + 1) % 4
                if kind[_u(i)] < 1:
                    kind[_u(i)] = 1
                o_r = -1
                o_w = -1
                x = s
                while x >= 0:
                    if row[_u(x)] == r:
                        if is_write[_u(x)]:
                            n_wr[_u(b)] += 1
                            if o_w < 0:
                                o_w = x
                        else:
                            n_rd[_u(b)] += 1
                            if o_r < 0:
                                o_r = x
                    x = nxt_j[_u(x)]
                old_rd[_u(b)] = o_r
                old_wr[_u(b)] = o_w
                if o_r >= 0:
                    n_hl = _hit_insert(hl_b, hl_d, hl_a, hl_g, hl_r, n_hl, b, 0, o_r,
                                       grp[_u(b)], t + t_rcd)
                    n_hl_rd += 1
                if o_w >= 0:
                    n_hl = _hit_insert(hl_b, hl_d, hl_a, hl_g, hl_r, n_hl, b, 1, o_w,
                                       grp[_u(b)], t + t_rcd)
                    n_hl_wr += 1
            else:  # PRE
                n_pl = _list_remove(pl_b, pl_d, pl_a, n_pl, b, 0)
                open_row[_u(b)] = -1
                act_ready[_u(b)] = t + t_rp
                kind[_u(i)] = 2
                n_al = _list_insert(al_b, al_d, al_a, n_al, b, 0, s)
    return 0
