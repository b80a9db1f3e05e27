"""HBM memory controller: open-page FR-FCFS scheduling over banks, with refresh.

One HBM *stack* is described by :class:`HbmSpec` (read from ``devices/catalog/hbm/*.yaml``); a
device has ``stacks`` of them and its aggregate bandwidth is
``stacks x channels x channel_bandwidth``. Requests are structure-of-arrays
(:class:`HbmRequests`): one request is one burst of ``spec.burst_bytes`` to one (pseudo-)channel,
bank and row. :func:`generate_requests` superposes request streams (a compute kernel, DMA
engines); :func:`simulate` runs the compiled (Numba) scheduler, :func:`simulate_reference` runs a
plain-Python implementation of the same policy that the tests compare against, and
:class:`HbmContention` turns the simulator into cached slowdown factors for the accelerator
agents.

The policy (per pseudo-channel; channels are independent)
----------------------------------------------------------

Time is continuous (seconds); commands take no command-bus time (HBM has separate row and column
command buses) and several commands may issue at the same instant.

*Queue and admission.* A channel's requests are taken in age order: by arrival time, ties by
request index. At most ``queue_depth`` of them are *queued* (visible to the scheduler). A request
leaves the queue when its column command (RD/WR) issues. Requests that arrive while the queue is
full wait outside in a FIFO (same age order) and are admitted, oldest first, at the instant a
slot frees (when a column command issues). Latency is counted from *arrival*, so it includes
the wait outside.

*Commands and timing.* A queued request needs, depending on the state of its bank:

* row hit (its row is open): one column command, CAS;
* row miss (bank closed): ACT then CAS;
* row conflict (another row open): PRE, ACT, then CAS.

Constraints (all times in the spec are ns, converted to s):

* ACT(b) at t: ``t >= act_ready[b]`` (PRE + tRP, or end of refresh), ``t >= last ACT + tRRD``
  and ``t >= 4th-last ACT + tFAW`` (per channel). The row can take a CAS from ``t + tRCD``.
* PRE(b) at t: ``t >= ACT + tRAS``, ``t >= RD command + tRTP`` and
  ``t >= write-data end + tWR`` for every column command to bank b since its last ACT.
* CAS at t: ``t >= ACT + tRCD``; ``t >= last CAS to the same bank group + tCCD_L`` (bank
  ``b`` is in group ``b mod (stack_ids * bank_groups)``); and the data bus: a read's data starts
  at ``t + tCL``, a write's at ``t + tCWL``; data must start at or after the end of the previous
  burst on the channel (``bus_free``), plus ``tWTR + tCL`` after a write burst if this is a read
  (i.e. the RD command waits tWTR after the write data), plus ``rd_to_wr_gap`` after a read burst
  if this is a write. The burst occupies the bus for ``burst_bytes / channel bandwidth``; the
  request *completes* when its burst ends (reads and writes alike).

*Refresh* (all-bank, per channel, all channels in lockstep): refresh k occupies
``[k tREFI, k tREFI + tRFC)``, k = 1, 2, ... At ``k tREFI`` every row of the channel closes and no
command issues until ``k tREFI + tRFC``; bursts whose command issued before ``k tREFI`` finish
undisturbed (the precharge-all that precedes REF is folded into tRFC). Refresh time fraction is
the share of ``[0, last completion]`` covered by refresh windows. :class:`HbmSpec` requires
``tREFI > tRFC + tRP + tRRD + tFAW + tRCD + tCCD_L + 2 tCL + tCWL + tWTR + rd_to_wr_gap + one
burst``, which guarantees that every refresh interval completes at least one queued request
(otherwise refreshes could close every row before any column command, forever).

*FR-FCFS decision.* At the current time t the controller admits arrivals, applies a due refresh,
then considers every queued request's *next* command and whether its constraints hold at t
("ready"):

1. the oldest queued request whose next command is a ready CAS (a *first-ready row hit*);
2. otherwise the oldest queued request whose next command is a ready ACT or PRE; a PRE is
   *not eligible* while any queued request hits the row that is open in that bank (open rows
   are kept as long as they have queued hits - no cap on how long, so an old conflicting
   request can wait behind a run of younger hits);
3. otherwise time advances to the earliest instant at which any eligible command becomes ready,
   an outside request can be admitted, or (implicitly) a refresh is due.

After a command issues the decision is repeated at the same t. "Oldest" is always (arrival
time, request index). A request is classified by the commands issued on its behalf: *conflict*
if a PRE was, else *miss* if an ACT was, else *hit* (it found its row open, possibly opened by
an earlier request to the same row).

Consequences worth knowing: reads become ready earlier than writes after a read burst
(tCL > tCWL + rd_to_wr_gap for the catalog parts), so under a read backlog writes wait (there is
no write-drain mode); and consecutive hits to one bank are spaced by tCCD_L, so a single stream
run in one bank cannot use the whole bus when tCCD_L exceeds the burst time.

Not modelled: command-bus slots, tRRD_L, per-bank refresh, write buffering / write drain
modes, read-modify-write, ECC, and any address hashing below the (channel, bank, row) level.

Engine
------

:func:`simulate` groups requests by channel (a counting sort that keeps age order) and runs a
Numba-compiled loop per channel (``@numba.njit(cache=True)``; compiled on first call, cached in
``__pycache__``). The loop makes exactly the decisions described above but organises queued
requests by *class* (read hits, write hits, waiting-for-ACT, waiting-for-PRE, per bank), because
all requests of a class share their next command's timing; it jumps straight from one event
to the next. Channels can be spread over threads (``workers``); the result does not depend on
it. :func:`simulate_reference` is a literal per-request implementation with lists and dicts;
the tests require identical completion times and kinds from both.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections import deque
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numba
import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from twin.kernel.catalog import Catalog, CatalogEntry, load_entry
from twin.kernel.errors import Problem, ScenarioError

__all__ = [
    "CATALOG_DIR",
    "CONFLICT",
    "HIT",
    "MISS",
    "EffectiveBandwidth",
    "HbmContention",
    "HbmRequests",
    "HbmResult",
    "HbmSpec",
    "StreamSpec",
    "effective_bandwidth",
    "generate_requests",
    "hbm_catalog",
    "load_hbm_spec",
    "simulate",
    "simulate_reference",
]

CATALOG_DIR = Path(__file__).resolve().parent / "catalog" / "hbm"

HIT = 0
"""Request kind: its row was open when its column command was issued, no ACT/PRE for it."""
MISS = 1
"""Request kind: an ACT (but no PRE) was issued on its behalf."""
CONFLICT = 2
"""Request kind: a PRE (then an ACT) was issued on its behalf."""

_NS = 1e-9


# --------------------------------------------------------------------------------------------
# Specification
# --------------------------------------------------------------------------------------------


class HbmSpec(BaseModel):
    """Organisation and timing of ONE HBM stack (all channels are identical).

    Times are in ns (the ``_ns`` suffix), sizes in bytes, rates in Gb/s per pin. A device with
    ``stacks`` stacks has ``stacks * channels`` independent channels.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field("", description="catalog entry name (file stem)")
    description: str = Field("", description="free text")
    channels: int = Field(gt=0, description="independent pseudo-channels per stack (count)")
    stack_ids: int = Field(1, gt=0, description="stack IDs (SIDs / ranks) sharing a channel")
    bank_groups: int = Field(gt=0, description="bank groups per SID and pseudo-channel (count)")
    banks_per_group: int = Field(gt=0, description="banks per bank group (count)")
    row_bytes: int = Field(
        gt=0, description="row (page) size per pseudo-channel, bytes (descriptive: the model "
        "addresses rows by index; a sequential stream finds row_bytes / burst_bytes bursts "
        "in a row)")
    burst_bytes: int = Field(gt=0, description="bytes moved by one column access (one request)")
    channel_width_bits: int = Field(gt=0, description="data pins (DQ) per pseudo-channel, bits")
    data_rate_gbps: float = Field(gt=0, description="data rate per pin, Gb/s")
    tCL_ns: float = Field(ge=0, description="read latency: RD command to first data, ns")
    tCWL_ns: float = Field(ge=0, description="write latency: WR command to first data, ns")
    tRCD_ns: float = Field(ge=0, description="ACT to column command, ns")
    tRP_ns: float = Field(ge=0, description="PRE to ACT (same bank), ns")
    tRAS_ns: float = Field(ge=0, description="ACT to PRE (same bank), ns")
    tRTP_ns: float = Field(ge=0, description="RD command to PRE (same bank), ns")
    tWR_ns: float = Field(ge=0, description="end of write data to PRE (same bank), ns")
    tWTR_ns: float = Field(ge=0, description="end of write data to a RD command, ns")
    rd_to_wr_gap_ns: float = Field(
        ge=0, description="idle data-bus time between a read burst and a following write, ns"
    )
    tCCD_L_ns: float = Field(ge=0, description="column-to-column, same bank group, ns")
    tRRD_ns: float = Field(ge=0, description="ACT to ACT, different banks of a channel, ns")
    tFAW_ns: float = Field(ge=0, description="window holding at most four ACTs per channel, ns")
    tREFI_ns: float = Field(gt=0, description="interval between all-bank refreshes, ns")
    tRFC_ns: float = Field(ge=0, description="duration of an all-bank refresh, ns")
    queue_depth: int = Field(gt=0, description="controller queue entries per pseudo-channel")

    @model_validator(mode="after")
    def _consistent(self) -> HbmSpec:
        # Every refresh closes all rows. Between two refreshes there must be room for the
        # longest command sequence of one request (PRE/ACT gates, ACT, data-bus gates, CAS),
        # or no request could ever complete; this bound is generous (real parts have several
        # times the room).
        burst_ns = self.burst_bytes * 8 / (self.data_rate_gbps * self.channel_width_bits)
        room = (self.tRP_ns + self.tRRD_ns + self.tFAW_ns + self.tRCD_ns + self.tCCD_L_ns
                + 2 * self.tCL_ns + self.tCWL_ns + self.tWTR_ns + self.rd_to_wr_gap_ns
                + burst_ns)
        if self.tREFI_ns <= self.tRFC_ns + room:
            raise ValueError(
                f"tREFI_ns ({self.tREFI_ns}) must exceed tRFC_ns ({self.tRFC_ns}) plus the "
                f"longest command sequence of one request ({room:g} ns: tRP + tRRD + tFAW + "
                "tRCD + tCCD_L + 2 tCL + tCWL + tWTR + rd_to_wr_gap + one burst), otherwise "
                "refreshes could close every row before any request completes"
            )
        if self.burst_bytes > self.row_bytes:
            raise ValueError(
                f"burst_bytes ({self.burst_bytes}) must not exceed row_bytes ({self.row_bytes})"
            )
        return self

    # ---- derived quantities (SI units) ----

    @property
    def banks_per_channel(self) -> int:
        """Independently addressable banks per pseudo-channel (SIDs x groups x banks)."""
        return self.stack_ids * self.bank_groups * self.banks_per_group

    @property
    def bank_group_count(self) -> int:
        """Distinct bank groups per pseudo-channel, counting each SID's groups separately."""
        return self.stack_ids * self.bank_groups

    @property
    def channel_bandwidth_bytes_per_s(self) -> float:
        """Peak data-bus bandwidth of one pseudo-channel, bytes/s."""
        return self.data_rate_gbps * 1e9 * self.channel_width_bits / 8.0

    @property
    def stack_bandwidth_bytes_per_s(self) -> float:
        """Peak bandwidth of one stack (all channels), bytes/s."""
        return self.channels * self.channel_bandwidth_bytes_per_s

    def device_bandwidth_bytes_per_s(self, stacks: int) -> float:
        """Peak bandwidth of a device with ``stacks`` stacks, bytes/s."""
        return stacks * self.stack_bandwidth_bytes_per_s

    @property
    def burst_time_s(self) -> float:
        """Data-bus occupancy of one burst, s."""
        return self.burst_bytes / self.channel_bandwidth_bytes_per_s

    def timing_s(self) -> np.ndarray:
        """The engine's timing vector, seconds, in the order of the ``_T_*`` indices."""
        t = np.empty(_T_COUNT, dtype=np.float64)
        t[_T_CL] = self.tCL_ns * _NS
        t[_T_CWL] = self.tCWL_ns * _NS
        t[_T_RCD] = self.tRCD_ns * _NS
        t[_T_RP] = self.tRP_ns * _NS
        t[_T_RAS] = self.tRAS_ns * _NS
        t[_T_RTP] = self.tRTP_ns * _NS
        t[_T_WR] = self.tWR_ns * _NS
        t[_T_WTR_CL] = (self.tWTR_ns + self.tCL_ns) * _NS
        t[_T_RTW] = self.rd_to_wr_gap_ns * _NS
        t[_T_CCDL] = self.tCCD_L_ns * _NS
        t[_T_RRD] = self.tRRD_ns * _NS
        t[_T_FAW] = self.tFAW_ns * _NS
        t[_T_REFI] = self.tREFI_ns * _NS
        t[_T_RFC] = self.tRFC_ns * _NS
        t[_T_BURST] = self.burst_time_s
        return t


# indices into the timing vector shared by the engine and the reference
(_T_CL, _T_CWL, _T_RCD, _T_RP, _T_RAS, _T_RTP, _T_WR, _T_WTR_CL, _T_RTW, _T_CCDL, _T_RRD,
 _T_FAW, _T_REFI, _T_RFC, _T_BURST) = range(15)
_T_COUNT = 15


def hbm_catalog(directory: Path | None = None) -> Catalog:
    """The catalog of HBM stack specs (``devices/catalog/hbm`` unless ``directory`` given)."""
    return Catalog("hbm", Path(directory) if directory is not None else CATALOG_DIR)


def spec_from_entry(entry: CatalogEntry) -> HbmSpec:
    """Validate a catalog entry into an :class:`HbmSpec`.

    Raises:
        ScenarioError: naming every invalid field as ``hbm.<entry>.<field>``.
    """
    try:
        return HbmSpec.model_validate(entry.values)
    except ValidationError as exc:
        problems = [
            Problem(
                ".".join(["hbm", entry.name, *(str(p) for p in err["loc"])]),
                err["msg"],
                err.get("input"),
            )
            for err in exc.errors()
        ]
        raise ScenarioError(problems, source=str(entry.path) if entry.path else None) from None


def load_hbm_spec(name_or_path: str | Path) -> HbmSpec:
    """Load an HBM spec by catalog name (``"hbm3"``) or from a YAML file path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return spec_from_entry(load_entry(p))
    return spec_from_entry(hbm_catalog().get(str(name_or_path), path="hbm"))


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HbmRequests:
    """Memory requests as parallel arrays; request ``i`` is one burst of ``burst_bytes``.

    Attributes:
        arrival_s: arrival time at the controller, s (float64, finite, >= 0).
        channel: pseudo-channel index in ``[0, spec.channels)`` (int32).
        bank: bank index in ``[0, spec.banks_per_channel)`` (int32).
        row: row index, >= 0 (int64).
        is_write: True for a write (bool).
        stream: stream id (int32; 0 when there is only one stream).
    """

    arrival_s: np.ndarray
    channel: np.ndarray
    bank: np.ndarray
    row: np.ndarray
    is_write: np.ndarray
    stream: np.ndarray

    @classmethod
    def from_arrays(
        cls,
        arrival_s: Any,
        channel: Any,
        bank: Any,
        row: Any,
        is_write: Any = None,
        stream: Any = None,
    ) -> HbmRequests:
        """Build from array-likes, coercing dtypes (missing ``is_write``/``stream`` -> 0)."""
        arr = np.ascontiguousarray(arrival_s, dtype=np.float64).reshape(-1)
        n = arr.shape[0]
        wr = (np.zeros(n, dtype=np.bool_) if is_write is None
              else np.ascontiguousarray(is_write, dtype=np.bool_).reshape(-1))
        st = (np.zeros(n, dtype=np.int32) if stream is None
              else np.ascontiguousarray(stream, dtype=np.int32).reshape(-1))
        return cls(
            arrival_s=arr,
            channel=np.ascontiguousarray(channel, dtype=np.int32).reshape(-1),
            bank=np.ascontiguousarray(bank, dtype=np.int32).reshape(-1),
            row=np.ascontiguousarray(row, dtype=np.int64).reshape(-1),
            is_write=wr,
            stream=st,
        )

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def validate(self, spec: HbmSpec) -> None:
        """Check shapes and ranges against ``spec``.

        Raises:
            ScenarioError: listing every problem, each naming the offending array.
        """
        n = len(self)
        problems: list[Problem] = []
        for name in ("channel", "bank", "row", "is_write", "stream"):
            m = getattr(self, name).shape[0]
            if m != n:
                problems.append(Problem(f"requests.{name}", "length differs from arrival_s",
                                        m, f"{n} entries"))
        if problems:
            raise ScenarioError(problems)
        if n == 0:
            return
        if not np.all(np.isfinite(self.arrival_s)) or float(self.arrival_s.min()) < 0.0:
            problems.append(Problem("requests.arrival_s", "arrival times must be finite and >= 0",
                                    float(np.nanmin(self.arrival_s)), "finite seconds >= 0"))
        for name, hi in (("channel", spec.channels), ("bank", spec.banks_per_channel)):
            a = getattr(self, name)
            lo_v, hi_v = int(a.min()), int(a.max())
            if lo_v < 0 or hi_v >= hi:
                problems.append(Problem(f"requests.{name}", "index out of range",
                                        lo_v if lo_v < 0 else hi_v, f"0 .. {hi - 1}"))
        if int(self.row.min()) < 0:
            problems.append(Problem("requests.row", "row index must be >= 0",
                                    int(self.row.min()), "0 or more"))
        if problems:
            raise ScenarioError(problems)


@dataclass(frozen=True)
class StreamSpec:
    """One request stream to superpose with others in :func:`generate_requests`.

    Attributes:
        n_requests: number of bursts; or give ``nbytes`` (rounded up to whole bursts).
        nbytes: bytes to move, alternative to ``n_requests``.
        arrival: ``"backlogged"`` (every request present at ``start_s``: a saturating, closed
            source), ``"poisson"`` (exponential inter-arrival times) or ``"periodic"``.
        rate_bytes_per_s: offered load of the stream over the whole stack, bytes/s (required
            for ``poisson`` and ``periodic``).
        read_fraction: probability that a request is a read, in [0, 1].
        row_locality: probability that a request goes to the same (channel, bank, row) as the
            stream's previous request; otherwise the stream jumps to a new location. Runs in a
            row are therefore geometric with mean ``1 / (1 - row_locality)`` requests, all in
            one bank (so their column commands are spaced by at least tCCD_L).
        interleave: where a jump goes. ``"sequential"``: the next channel (round robin from a
            random start), moving to the next bank after a sweep of all channels, random row;
            ``"random"``: uniformly random channel, bank and row.
        start_s: time of the first arrival, s.
        stream_id: id recorded in :attr:`HbmRequests.stream` (default: position in the list).
    """

    n_requests: int | None = None
    nbytes: int | None = None
    arrival: Literal["backlogged", "poisson", "periodic"] = "backlogged"
    rate_bytes_per_s: float | None = None
    read_fraction: float = 1.0
    row_locality: float = 0.0
    interleave: Literal["sequential", "random"] = "sequential"
    start_s: float = 0.0
    stream_id: int | None = None

    def count(self, spec: HbmSpec) -> int:
        """Number of requests (bursts) of this stream."""
        if self.n_requests is not None:
            return int(self.n_requests)
        return -(-int(self.nbytes or 0) // spec.burst_bytes)

    def problems(self, where: str) -> list[Problem]:
        """What is wrong with this stream description (empty if nothing)."""
        out: list[Problem] = []
        if (self.n_requests is None) == (self.nbytes is None):
            out.append(Problem(where, "give exactly one of n_requests and nbytes",
                               (self.n_requests, self.nbytes)))
        for name in ("n_requests", "nbytes"):
            v = getattr(self, name)
            if v is not None and v < 0:
                out.append(Problem(f"{where}.{name}", "must be >= 0", v))
        if self.arrival not in ("backlogged", "poisson", "periodic"):
            out.append(Problem(f"{where}.arrival", "unknown arrival process", self.arrival,
                               "backlogged, poisson, periodic"))
        if self.arrival != "backlogged" and not (
            self.rate_bytes_per_s is not None and self.rate_bytes_per_s > 0
        ):
            out.append(Problem(f"{where}.rate_bytes_per_s",
                               f"a {self.arrival} stream needs a rate > 0",
                               self.rate_bytes_per_s, "bytes/s > 0"))
        for name in ("read_fraction", "row_locality"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                out.append(Problem(f"{where}.{name}", "must be a probability", v, "0 .. 1"))
        if self.row_locality >= 1.0:
            out.append(Problem(f"{where}.row_locality", "must be < 1 (a stream must move on)",
                               self.row_locality, "0 .. 1 (exclusive)"))
        if self.interleave not in ("sequential", "random"):
            out.append(Problem(f"{where}.interleave", "unknown interleaving", self.interleave,
                               "sequential, random"))
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            out.append(Problem(f"{where}.start_s", "must be finite and >= 0", self.start_s))
        return out


def _one_stream(
    spec: HbmSpec, s: StreamSpec, n: int, rng: np.random.Generator, rows: int
) -> tuple[np.ndarray, ...]:
    if s.arrival == "backlogged":
        arr = np.full(n, s.start_s, dtype=np.float64)
    else:
        rate = float(s.rate_bytes_per_s or 0.0) / spec.burst_bytes  # requests/s
        if s.arrival == "poisson":
            arr = s.start_s + np.cumsum(rng.exponential(1.0 / rate, size=n))
        else:
            arr = s.start_s + np.arange(n, dtype=np.float64) / rate
    jump = rng.random(n) >= s.row_locality
    if n:
        jump[0] = True
    run = np.cumsum(jump) - 1
    n_runs = int(run[-1]) + 1 if n else 0
    n_ch, n_bk = spec.channels, spec.banks_per_channel
    if s.interleave == "random":
        ch_r = rng.integers(0, n_ch, size=n_runs)
        bk_r = rng.integers(0, n_bk, size=n_runs)
    else:
        k = np.arange(n_runs, dtype=np.int64)
        c0 = int(rng.integers(0, n_ch))
        b0 = int(rng.integers(0, n_bk))
        ch_r = (c0 + k) % n_ch
        bk_r = (b0 + (c0 + k) // n_ch) % n_bk
    row_r = rng.integers(0, rows, size=n_runs)
    is_write = rng.random(n) >= s.read_fraction
    return arr, ch_r[run], bk_r[run], row_r[run], is_write


def generate_requests(
    spec: HbmSpec,
    rng: np.random.Generator,
    streams: Sequence[StreamSpec],
    *,
    rows_per_bank: int = 1 << 14,
) -> HbmRequests:
    """Superpose request streams on one stack.

    Requests are ordered by arrival time; equal arrival times are ordered by the position
    within their stream, then by stream id, so backlogged streams interleave round robin. The
    request index (the FR-FCFS tie breaker) is the position in this order.

    Args:
        spec: the stack.
        rng: the only source of randomness.
        streams: the streams (see :class:`StreamSpec`).
        rows_per_bank: rows to draw from when a stream jumps (a jump lands on the open row of
            its bank only by chance, with probability about 1/rows_per_bank).

    Raises:
        ScenarioError: naming every bad stream field (``streams[i].<field>``).
    """
    problems: list[Problem] = []
    if not streams:
        problems.append(Problem("streams", "at least one stream is needed"))
    for i, s in enumerate(streams):
        problems.extend(s.problems(f"streams[{i}]"))
    if rows_per_bank < 1:
        problems.append(Problem("rows_per_bank", "must be >= 1", rows_per_bank))
    if problems:
        raise ScenarioError(problems)
    parts = []
    for i, s in enumerate(streams):
        n = s.count(spec)
        arr, ch, bk, row, wr = _one_stream(spec, s, n, rng, rows_per_bank)
        sid = i if s.stream_id is None else s.stream_id
        parts.append((arr, ch, bk, row, wr, np.full(n, sid, dtype=np.int32),
                      np.arange(n, dtype=np.int64)))
    cols = [np.concatenate([p[j] for p in parts]) for j in range(7)]
    if len(parts) > 1:
        order = np.lexsort((cols[5], cols[6], cols[0]))
        cols = [c[order] for c in cols]
    return HbmRequests.from_arrays(cols[0], cols[1], cols[2], cols[3], cols[4], cols[5])


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HbmResult:
    """Outcome of a simulation: per-request arrays plus aggregates (computed on first access).

    Attributes:
        spec: the stack simulated.
        requests: the input requests.
        completion_s: time the request's data burst ended, s.
        kind: :data:`HIT`, :data:`MISS` or :data:`CONFLICT` per request (int8).
        refresh: whether refresh was simulated.
    """

    spec: HbmSpec
    requests: HbmRequests
    completion_s: np.ndarray
    kind: np.ndarray
    refresh: bool = True

    @cached_property
    def latency_s(self) -> np.ndarray:
        """Completion minus arrival, s (includes the wait outside a full queue)."""
        return self.completion_s - self.requests.arrival_s

    @property
    def n_requests(self) -> int:
        """Number of requests."""
        return len(self.requests)

    @property
    def total_bytes(self) -> int:
        """Bytes moved, bytes."""
        return self.n_requests * self.spec.burst_bytes

    @cached_property
    def makespan_s(self) -> float:
        """Last completion minus first arrival, s (0 for no requests)."""
        if self.n_requests == 0:
            return 0.0
        return float(self.completion_s.max() - self.requests.arrival_s.min())

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Achieved bandwidth, bytes/s: total bytes over the makespan."""
        return self.total_bytes / self.makespan_s if self.makespan_s > 0 else 0.0

    @cached_property
    def _kind_counts(self) -> np.ndarray:
        return np.bincount(self.kind.astype(np.intp), minlength=3)[:3]

    @property
    def row_hit_rate(self) -> float:
        """Fraction of requests that were row hits."""
        return float(self._kind_counts[HIT]) / max(self.n_requests, 1)

    @property
    def row_miss_rate(self) -> float:
        """Fraction of requests that found their bank closed."""
        return float(self._kind_counts[MISS]) / max(self.n_requests, 1)

    @property
    def row_conflict_rate(self) -> float:
        """Fraction of requests that needed a precharge."""
        return float(self._kind_counts[CONFLICT]) / max(self.n_requests, 1)

    @property
    def mean_latency_s(self) -> float:
        """Mean latency, s."""
        return float(self.latency_s.mean()) if self.n_requests else float("nan")

    @cached_property
    def p99_latency_s(self) -> float:
        """99th-percentile latency (linear interpolation), s."""
        return float(np.quantile(self.latency_s, 0.99)) if self.n_requests else float("nan")

    @cached_property
    def refresh_fraction(self) -> float:
        """Share of [0, last completion] covered by refresh windows (0 without refresh)."""
        if not self.refresh or self.n_requests == 0:
            return 0.0
        end = float(self.completion_s.max())
        if end <= 0:
            return 0.0
        refi, rfc = self.spec.tREFI_ns * _NS, self.spec.tRFC_ns * _NS
        k = math.floor(end / refi)
        covered = max(k - 1, 0) * rfc + (min(rfc, end - k * refi) if k >= 1 else 0.0)
        return covered / end

    def per_stream(self) -> pd.DataFrame:
        """One row per stream id: requests, bytes, bandwidth_bytes_per_s (stream bytes over
        the stream's own first-arrival-to-last-completion span), mean/p99 latency (s) and
        row_hit_rate."""
        rows = []
        st = self.requests.stream
        for sid in np.unique(st):
            m = st == sid
            lat = self.latency_s[m]
            span = float(self.completion_s[m].max() - self.requests.arrival_s[m].min())
            nb = int(m.sum()) * self.spec.burst_bytes
            rows.append({
                "stream": int(sid),
                "requests": int(m.sum()),
                "bytes": nb,
                "bandwidth_bytes_per_s": nb / span if span > 0 else 0.0,
                "mean_latency_s": float(lat.mean()),
                "p99_latency_s": float(np.quantile(lat, 0.99)),
                "row_hit_rate": float(np.mean(self.kind[m] == HIT)),
            })
        return pd.DataFrame(rows, columns=["stream", "requests", "bytes",
                                           "bandwidth_bytes_per_s", "mean_latency_s",
                                           "p99_latency_s", "row_hit_rate"])

    def summary(self) -> dict[str, float]:
        """Aggregates as a flat dict (SI units)."""
        return {
            "requests": float(self.n_requests),
            "bytes": float(self.total_bytes),
            "makespan_s": self.makespan_s,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "row_hit_rate": self.row_hit_rate,
            "row_miss_rate": self.row_miss_rate,
            "row_conflict_rate": self.row_conflict_rate,
            "mean_latency_s": self.mean_latency_s,
            "p99_latency_s": self.p99_latency_s,
            "refresh_fraction": self.refresh_fraction,
        }


# --------------------------------------------------------------------------------------------
# Compiled engine
# --------------------------------------------------------------------------------------------


_u = np.uint64
"""Index cast used in the compiled functions: Numba emits negative-index wraparound code for signed
indices; their indices are never negative, and unsigned ones make it ~20% faster."""


@numba.njit(cache=True)
def _group_by_channel(  # pragma: no cover - compiled
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
def _fr_fcfs_engine(  # pragma: no cover - compiled; checked against simulate_reference
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
    :func:`_group_by_channel`); ``order`` maps that order to request indices, which index
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


def _channel_chunks(start: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Split channels into ``parts`` contiguous ranges of about equal request counts."""
    n_channels = start.shape[0] - 1
    if parts <= 1:
        return [(0, n_channels)]
    targets = np.linspace(0, start[-1], parts + 1)[1:-1]
    cuts = [0, *sorted({int(x) for x in np.searchsorted(start, targets)}), n_channels]
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _age_order(arrival: np.ndarray) -> np.ndarray:
    """Request indices by (arrival, index)."""
    n = arrival.shape[0]
    if n < 2 or bool(np.all(arrival[1:] >= arrival[:-1])):
        return np.arange(n, dtype=np.int64)
    return np.argsort(arrival, kind="stable").astype(np.int64)


def simulate(
    spec: HbmSpec, requests: HbmRequests, *, refresh: bool = True, workers: int = 1
) -> HbmResult:
    """Simulate FR-FCFS scheduling of ``requests`` on one stack (compiled engine).

    Args:
        spec: the stack.
        requests: the requests (channel/bank indices within this stack).
        refresh: simulate all-bank refresh (True) or not (False, for what-if comparisons).
        workers: threads to spread the (independent) channels over; the result does not
            depend on it. The default 1 suits runs that are themselves parallel (Dask).

    Returns:
        :class:`HbmResult` with per-request completion times (s) and kinds.

    Raises:
        ScenarioError: if requests are inconsistent with ``spec`` or ``workers < 1``.
    """
    if workers < 1:
        raise ScenarioError(Problem("workers", "must be >= 1", workers))
    requests.validate(spec)
    n = len(requests)
    if n >= 2**31 - 1:  # the engine links queued requests with int32 indices
        raise ScenarioError(Problem("requests", "too many requests for one call", n,
                                    "fewer than 2**31 - 1; split the stream"))
    completion = np.zeros(n, dtype=np.float64)
    kind = np.zeros(n, dtype=np.int8)
    if n:
        order, start, arr_c, bank_c, row_c, wr_c = _group_by_channel(
            requests.channel, _age_order(requests.arrival_s), spec.channels,
            requests.arrival_s, requests.bank, requests.row, requests.is_write)
        args = (arr_c, bank_c, row_c, wr_c, order, start,
                spec.banks_per_channel, spec.bank_group_count, spec.queue_depth,
                spec.timing_s(), bool(refresh), completion, kind)
        chunks = _channel_chunks(start, min(workers, spec.channels))
        if len(chunks) == 1:
            status = [_fr_fcfs_engine(*args, *chunks[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
                status = list(pool.map(lambda ch: _fr_fcfs_engine(*args, *ch), chunks))
        if any(st != 0 for st in status):  # an invariant of the policy, not a user error
            raise RuntimeError("HBM engine stalled: no command could ever become ready")
    return HbmResult(spec=spec, requests=requests, completion_s=completion, kind=kind,
                     refresh=bool(refresh))


# --------------------------------------------------------------------------------------------
# Plain-Python reference of the same policy (slow, obviously correct; used by the tests)
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Contention helper for the accelerator agents
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EffectiveBandwidth:
    """What an op's memory stream gets from HBM, alone and next to k DMA streams.

    Attributes:
        contention: number of concurrent DMA streams (k).
        op_bandwidth_bytes_per_s: the op's achieved bandwidth on the whole device with k DMA
            streams, bytes/s.
        op_alone_bytes_per_s: the same with no DMA stream, bytes/s.
        slowdown: ``op_alone / op_bandwidth`` (>= 1 in practice): multiply the op's
            memory-bound time by it.
        op_mean_latency_s: mean latency of the op's requests with k DMA streams, s.
        op_p99_latency_s: 99th-percentile latency of the op's requests, s.
        op_row_hit_rate: the op's row-hit rate with k DMA streams.
        dma_bandwidth_bytes_per_s: bandwidth achieved by all DMA streams together, bytes/s.
    """

    contention: int
    op_bandwidth_bytes_per_s: float
    op_alone_bytes_per_s: float
    slowdown: float
    op_mean_latency_s: float
    op_p99_latency_s: float
    op_row_hit_rate: float
    dma_bandwidth_bytes_per_s: float


def effective_bandwidth(
    spec: HbmSpec,
    stacks: int,
    op: StreamSpec,
    dma: Sequence[StreamSpec],
    rng: np.random.Generator,
    *,
    op_alone_bytes_per_s: float | None = None,
) -> EffectiveBandwidth:
    """Bandwidth the op's stream achieves on a device of ``stacks`` stacks next to ``dma``.

    Semantics: one stack is simulated with the op's stream and the DMA streams superposed
    (stream ids: op = 0, DMA = 1..k); stacks are identical and the address interleaving spreads
    every stream evenly over them, so device figures are the one-stack figures times
    ``stacks``. Stream rates (``rate_bytes_per_s``) and sizes are therefore *per stack*: divide
    a device-level DMA rate by ``stacks`` before passing it. The op's bandwidth is its bytes
    over its own first-arrival-to-last-completion span; the op should be large enough to
    overlap the DMA streams for its whole span (a backlogged op and rate-limited DMA streams
    that last at least as long is the intended use).

    Args:
        op_alone_bytes_per_s: the op's device bandwidth without contention if already known
            (otherwise it is simulated).
    """
    if stacks < 1:
        raise ScenarioError(Problem("stacks", "must be >= 1", stacks))
    op0 = replace(op, stream_id=0)
    dmas = [replace(d, stream_id=k + 1) for k, d in enumerate(dma)]
    res = simulate(spec, generate_requests(spec, rng, [op0, *dmas]))
    if op_alone_bytes_per_s is None:
        alone = res if not dmas else simulate(spec, generate_requests(spec, rng, [op0]))
        op_alone_bytes_per_s = stacks * _stream_bandwidth(alone, 0)
    m = res.requests.stream == 0
    lat = res.latency_s[m]
    op_bw = stacks * _stream_bandwidth(res, 0)
    dma_bw = 0.0
    if dmas:
        md = ~m
        span = float(res.completion_s[md].max() - res.requests.arrival_s[md].min())
        dma_bw = stacks * int(md.sum()) * spec.burst_bytes / span if span > 0 else 0.0
    return EffectiveBandwidth(
        contention=len(dmas),
        op_bandwidth_bytes_per_s=op_bw,
        op_alone_bytes_per_s=float(op_alone_bytes_per_s),
        slowdown=float(op_alone_bytes_per_s) / op_bw if op_bw > 0 else math.inf,
        op_mean_latency_s=float(lat.mean()) if lat.size else float("nan"),
        op_p99_latency_s=float(np.quantile(lat, 0.99)) if lat.size else float("nan"),
        op_row_hit_rate=float(np.mean(res.kind[m] == HIT)) if lat.size else float("nan"),
        dma_bandwidth_bytes_per_s=dma_bw,
    )


def _stream_bandwidth(res: HbmResult, sid: int) -> float:
    m = res.requests.stream == sid
    if not m.any():
        return 0.0
    span = float(res.completion_s[m].max() - res.requests.arrival_s[m].min())
    return int(m.sum()) * res.spec.burst_bytes / span if span > 0 else 0.0


@dataclass
class HbmContention:
    """Cached HBM slowdowns for accelerator agents: (op class, contention level) -> result.

    The first query for an op class key and a number k of concurrent DMA streams simulates
    one stack (see :func:`effective_bandwidth`) with ``k`` copies of ``dma_stream``; later
    queries with the same key and k return the cached :class:`EffectiveBandwidth`. Each cache
    entry draws from its own generator derived from ``rng`` (one draw at construction) and
    the key, so results do not depend on the order of queries. The op's stream for a key is
    fixed by the first query with that key.

    Attributes:
        spec: the stack.
        stacks: stacks on the device.
        rng: source of the base seed (one draw at construction).
        dma_stream: template of one DMA stream, per stack (e.g. a link's DMA rate / stacks).
    """

    spec: HbmSpec
    stacks: int
    rng: np.random.Generator
    dma_stream: StreamSpec
    _entropy: int = field(init=False, repr=False)
    _cache: dict[tuple[Hashable, int], EffectiveBandwidth] = field(
        init=False, repr=False, default_factory=dict)
    _ops: dict[Hashable, StreamSpec] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.stacks < 1:
            raise ScenarioError(Problem("stacks", "must be >= 1", self.stacks))
        self._entropy = int(self.rng.integers(0, 2**63 - 1))

    def _rng_for(self, key: Hashable, k: int) -> np.random.Generator:
        h = zlib.crc32(repr(key).encode("utf-8"))
        return np.random.Generator(np.random.PCG64(
            np.random.SeedSequence(self._entropy, spawn_key=(h, k))))

    def query(self, op_key: Hashable, op_stream: StreamSpec, k: int) -> EffectiveBandwidth:
        """Effective bandwidth of op class ``op_key`` next to ``k`` DMA streams (cached)."""
        if k < 0:
            raise ScenarioError(Problem("contention", "must be >= 0", k))
        key = (op_key, int(k))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        op = self._ops.setdefault(op_key, op_stream)
        alone_key = (op_key, 0)
        if alone_key not in self._cache:
            self._cache[alone_key] = effective_bandwidth(
                self.spec, self.stacks, op, [], self._rng_for(op_key, 0))
        alone = self._cache[alone_key]
        if k == 0:
            return alone
        res = effective_bandwidth(
            self.spec, self.stacks, op, [self.dma_stream] * k, self._rng_for(op_key, k),
            op_alone_bytes_per_s=alone.op_bandwidth_bytes_per_s)
        self._cache[key] = res
        return res

    def slowdown(self, op_key: Hashable, op_stream: StreamSpec, k: int) -> float:
        """Factor by which the op's memory time grows with ``k`` DMA streams (cached)."""
        return self.query(op_key, op_stream, k).slowdown

    def __len__(self) -> int:
        return len(self._cache)
