"""HBM memory controller: open-page FR-FCFS scheduling over banks, with refresh.

One HBM *stack* is described by :class:`HbmSpec` (:mod:`~devices.hbm.spec`, read from
``devices/catalog/hbm/*.yaml``); a device has ``stacks`` of them and its aggregate bandwidth is
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
compiled loop per channel (:mod:`devices.hbm.kernels`: Numba source, built ahead of time at
install into an extension module that loads without Numba, or just in time when that module is
absent or older than the source; :mod:`devices.hbm.aot`). The loop makes exactly the decisions
described above but organises queued requests by *class* (read hits, write hits,
waiting-for-ACT, waiting-for-PRE, per bank), because
all requests of a class share their next command's timing; it jumps straight from one event
to the next. Channels can be spread over threads (``workers``); the result does not depend on
it. :func:`simulate_reference` is a literal per-request implementation with lists and dicts;
the tests require identical completion times and kinds from both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twin.kernel.lazy import lazy_exports

#: Where each public name lives. The engine (Numba) and the results (pandas) are imported on
#: first use: the scenario schema reads the HBM catalog without them.
_HOME = {
    "CATALOG_DIR": "spec",
    "CONFLICT": "result",
    "effective_bandwidth": "contention",
    "EffectiveBandwidth": "contention",
    "generate_requests": "requests",
    "hbm_catalog": "spec",
    "HbmContention": "contention",
    "HbmRequests": "requests",
    "HbmResult": "result",
    "HbmSpec": "spec",
    "HIT": "result",
    "load_hbm_spec": "spec",
    "MISS": "result",
    "simulate": "engine",
    "simulate_reference": "reference",
    "spec_from_entry": "spec",
    "StreamSpec": "requests",
}

if TYPE_CHECKING:
    from devices.hbm.contention import EffectiveBandwidth, HbmContention, effective_bandwidth
    from devices.hbm.engine import simulate
    from devices.hbm.reference import simulate_reference
    from devices.hbm.requests import HbmRequests, StreamSpec, generate_requests
    from devices.hbm.result import CONFLICT, HIT, MISS, HbmResult
    from devices.hbm.spec import CATALOG_DIR, HbmSpec, hbm_catalog, load_hbm_spec, spec_from_entry

__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())

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
    "spec_from_entry",
]
