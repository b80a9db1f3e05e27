"""The same FR-FCFS policy in plain Python, one request at a time: slow and obviously correct;
the tests require identical completion times and kinds from :func:`devices.hbm.engine.simulate`.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from devices.hbm.requests import HbmRequests
from devices.hbm.result import CONFLICT, HIT, MISS, HbmResult
from devices.hbm.spec import (
    _T_BURST,
    _T_CCDL,
    _T_CL,
    _T_CWL,
    _T_FAW,
    _T_RAS,
    _T_RCD,
    _T_REFI,
    _T_RFC,
    _T_RP,
    _T_RRD,
    _T_RTP,
    _T_RTW,
    _T_WR,
    _T_WTR_CL,
    HbmSpec,
)


class _RefChannel:
    """One pseudo-channel of the reference controller: plain state, one method per step."""

    def __init__(self, spec: HbmSpec, refresh: bool) -> None:
        tm = [float(x) for x in spec.timing_s()]
        self.t_cl, self.t_cwl, self.t_rcd = tm[_T_CL], tm[_T_CWL], tm[_T_RCD]
        self.t_rp, self.t_ras, self.t_rtp, self.t_wr = tm[_T_RP], tm[_T_RAS], tm[_T_RTP], tm[_T_WR]
        self.t_wtr_cl, self.t_rtw, self.t_ccdl = tm[_T_WTR_CL], tm[_T_RTW], tm[_T_CCDL]
        self.t_rrd, self.t_faw = tm[_T_RRD], tm[_T_FAW]
        self.t_refi, self.t_rfc, self.t_burst = tm[_T_REFI], tm[_T_RFC], tm[_T_BURST]
        self.depth = spec.queue_depth
        self.n_groups = spec.bank_group_count
        self.refresh = refresh
        inf = math.inf
        self.banks = {
            b: {"open": None, "row_ok": 0.0, "act_ready": 0.0, "act_time": -inf,
                "last_rd_cmd": -inf, "last_wr_end": -inf}
            for b in range(spec.banks_per_channel)
        }
        self.group_last_cas = {g: -inf for g in range(self.n_groups)}
        self.act_times: list[float] = []
        self.bus_free = 0.0
        self.last_dir: str | None = None  # "R" or "W" of the last burst
        self.k_ref = 1  # index of the next refresh
        self.queue: list[dict] = []  # age order
        self.t = 0.0

    # -- readiness of each request's next command --

    def bus_start(self, write: bool) -> float:
        """Earliest start of a burst in direction ``write`` on the data bus."""
        if write:
            return self.bus_free + self.t_rtw if self.last_dir == "R" else self.bus_free
        return self.bus_free + self.t_wtr_cl if self.last_dir == "W" else self.bus_free

    def act_gate(self) -> float:
        last = self.act_times[-1] if self.act_times else -math.inf
        fourth_last = self.act_times[-4] if len(self.act_times) >= 4 else -math.inf
        return max(last + self.t_rrd, fourth_last + self.t_faw)

    def next_command(self, r: dict) -> tuple[str, float] | None:
        """(command, earliest issue time) of ``r``'s next command; None if not eligible."""
        bk = self.banks[r["bank"]]
        if bk["open"] == r["row"]:
            latency = self.t_cwl if r["write"] else self.t_cl
            return "CAS", max(bk["row_ok"],
                              self.group_last_cas[r["bank"] % self.n_groups] + self.t_ccdl,
                              self.bus_start(r["write"]) - latency)
        if bk["open"] is None:
            return "ACT", max(bk["act_ready"], self.act_gate())
        if any(q["bank"] == r["bank"] and q["row"] == bk["open"] for q in self.queue):
            return None  # the open row still has queued hits: no precharge
        return "PRE", max(bk["act_time"] + self.t_ras, bk["last_rd_cmd"] + self.t_rtp,
                          bk["last_wr_end"] + self.t_wr)

    # -- issuing --

    def issue_cas(self, r: dict, completion: list[float]) -> None:
        t, bk = self.t, self.banks[r["bank"]]
        if r["write"]:
            start = max(t + self.t_cwl, self.bus_start(True))
            bk["last_wr_end"] = max(bk["last_wr_end"], start + self.t_burst)
            self.last_dir = "W"
        else:
            start = max(t + self.t_cl, self.bus_start(False))
            bk["last_rd_cmd"] = t
            self.last_dir = "R"
        self.bus_free = start + self.t_burst
        self.group_last_cas[r["bank"] % self.n_groups] = t
        completion[r["i"]] = start + self.t_burst
        self.queue.remove(r)

    def issue_act(self, r: dict, kind: list[int]) -> None:
        bk = self.banks[r["bank"]]
        bk["open"] = r["row"]
        bk["row_ok"] = self.t + self.t_rcd
        bk["act_time"] = self.t
        bk["last_rd_cmd"] = -math.inf  # PRE constraints count from the last ACT on
        bk["last_wr_end"] = -math.inf
        self.act_times.append(self.t)
        kind[r["i"]] = max(kind[r["i"]], MISS)

    def issue_pre(self, r: dict, kind: list[int]) -> None:
        bk = self.banks[r["bank"]]
        bk["open"] = None
        bk["act_ready"] = self.t + self.t_rp
        kind[r["i"]] = CONFLICT

    def refresh_due(self) -> bool:
        return self.refresh and self.t >= self.t_refi * self.k_ref

    def do_refreshes(self) -> None:
        while self.t >= self.t_refi * self.k_ref:
            end = self.t_refi * self.k_ref + self.t_rfc
            for bk in self.banks.values():
                bk["open"] = None
                bk["act_ready"] = max(bk["act_ready"], end)
            self.t = max(self.t, end)
            self.k_ref += 1

    def run(self, waiting: deque, completion: list[float], kind: list[int]) -> None:
        remaining = len(waiting)
        while remaining > 0:
            while len(self.queue) < self.depth and waiting and waiting[0]["arrival"] <= self.t:
                self.queue.append(waiting.popleft())
            if self.refresh_due():
                self.do_refreshes()
                continue
            if not self.queue:
                self.t = waiting[0]["arrival"]
                continue
            commands = [(r, self.next_command(r)) for r in self.queue]
            ready_hits = [r for r, cmd in commands
                          if cmd is not None and cmd[0] == "CAS" and cmd[1] <= self.t]
            ready_rows = [(r, cmd[0]) for r, cmd in commands
                          if cmd is not None and cmd[0] != "CAS" and cmd[1] <= self.t]
            if ready_hits:
                self.issue_cas(ready_hits[0], completion)
                remaining -= 1
            elif ready_rows:
                r, what = ready_rows[0]
                if what == "ACT":
                    self.issue_act(r, kind)
                else:
                    self.issue_pre(r, kind)
            else:
                candidates = [cmd[1] for _, cmd in commands if cmd is not None]
                if len(self.queue) < self.depth and waiting:
                    candidates.append(waiting[0]["arrival"])
                self.t = min(candidates)


def simulate_reference(spec: HbmSpec, requests: HbmRequests, *,
                       refresh: bool = True) -> HbmResult:
    """The policy of :func:`simulate`, written plainly with lists and dicts.

    Same arguments, same result, bit for bit; thousands of times slower.
    """
    requests.validate(spec)
    reqs = [
        {"i": i, "arrival": float(requests.arrival_s[i]), "channel": int(requests.channel[i]),
         "bank": int(requests.bank[i]), "row": int(requests.row[i]),
         "write": bool(requests.is_write[i])}
        for i in range(len(requests))
    ]
    completion = [0.0] * len(reqs)
    kind = [HIT] * len(reqs)
    for c in range(spec.channels):
        mine = sorted((r for r in reqs if r["channel"] == c),
                      key=lambda r: (r["arrival"], r["i"]))
        _RefChannel(spec, bool(refresh)).run(deque(mine), completion, kind)
    return HbmResult(spec=spec, requests=requests,
                     completion_s=np.asarray(completion, dtype=np.float64),
                     kind=np.asarray(kind, dtype=np.int8), refresh=bool(refresh))
