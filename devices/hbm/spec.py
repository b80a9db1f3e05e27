"""One HBM stack (:class:`HbmSpec`, read from ``devices/catalog/hbm/*.yaml``): geometry, timings
(ns in the catalog, s inside) and the queue bound; the catalog readers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from twin.kernel.catalog import Catalog, CatalogEntry, load_entry
from twin.kernel.errors import Problem, ScenarioError

CATALOG_DIR = Path(__file__).resolve().parent.parent / "catalog" / "hbm"

_NS = 1e-9




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
