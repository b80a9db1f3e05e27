"""Results of the HBM contention models (``devices.memory``): the empirical slowdown
distribution of one (op class, mix) and the diagnostics of one contention level."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from devices.memory_spec import Mix


@dataclass(frozen=True, eq=False)
class SlowdownTable:
    """Empirical slowdowns of one (op class, contention level): one per simulated batch.

    Attributes:
        n_requests: op requests per batch.
        k: concurrent streams beside the op (network DMA and host copies).
        samples: slowdown of each batch (dimensionless, >= 1 for the queue model).
        mix: ``(network DMA streams, host-to-device copy streams)``.
    """

    n_requests: int
    k: int
    samples: np.ndarray
    mix: Mix

    @cached_property
    def values(self) -> list[float]:
        """:attr:`samples` as Python floats (for the draws)."""
        return self.samples.tolist()

    @property
    def mean(self) -> float:
        """Mean slowdown over the batches."""
        return float(self.samples.mean())

    @property
    def standard_error(self) -> float:
        """Standard error of :attr:`mean` (batches are independent)."""
        n = self.samples.size
        return float(self.samples.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf

    def quantile(self, q: float) -> float:
        """Empirical ``q``-quantile of the slowdown."""
        return float(np.quantile(self.samples, q))


@dataclass(frozen=True)
class LevelReport:
    """Diagnostics of one contention level ``k`` (all times in seconds).

    Attributes:
        k: concurrent streams beside the op (network DMA and host copies).
        h2d: of which host-to-device copies.
        rho: offered load on the peak bandwidth, ``op_load + k dma_load``.
        status: ``converged``, ``unstable`` (rho >= 1), ``infinite_variance``,
            ``uncertain_tail``, ``not_settled`` (queue model: from
            :func:`twin.kernel.queueing.analyze_queue`); FR-FCFS: ``converged``, ``unstable`` or
            ``not_settled`` (slowdown standard error above 5%).
        converged: ``status == "converged"``.
        variance_infinite: the service variance is infinite (queue model).
        mean_wait_s: queue model: stationary mean wait of a request at this load (sample
            mean of the diagnostic run; a limit only if converged); FR-FCFS: mean latency of
            the op's requests.
        mean_wait_se_s: its standard error (``inf`` when the limit is infinite).
        op_mean_wait_s: queue model: mean wait of the op's requests in the diagnostic run
            (after 10% warm-up); FR-FCFS: as ``mean_wait_s``.
        op_mean_wait_se_s: its batch-means standard error (20 batches); ``inf`` when the
            limit is infinite (unstable or infinite variance).
        tail_index: Hill estimate of the service tail index (queue model; None: FR-FCFS).
        warnings: reasons the level is not converged.
    """

    k: int
    h2d: int
    rho: float
    status: str
    converged: bool
    variance_infinite: bool
    mean_wait_s: float
    mean_wait_se_s: float
    op_mean_wait_s: float
    op_mean_wait_se_s: float
    tail_index: float | None
    warnings: tuple[str, ...] = ()

    @property
    def unstable(self) -> bool:
        """The offered load reaches the peak bandwidth (rho >= 1)."""
        return self.rho >= 1.0

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the summary (non-finite numbers stay ``inf``/``nan``)."""
        return {"k": self.k, "h2d": self.h2d, "rho": self.rho, "status": self.status,
                "converged": self.converged, "variance_infinite": self.variance_infinite,
                "unstable": self.unstable, "mean_wait_s": self.mean_wait_s,
                "mean_wait_se_s": self.mean_wait_se_s, "op_mean_wait_s": self.op_mean_wait_s,
                "op_mean_wait_se_s": self.op_mean_wait_se_s, "tail_index": self.tail_index,
                "warnings": list(self.warnings)}


def roofline_report() -> dict[str, Any]:
    """The ``memory_*`` summary keys of a run without a contention model."""
    return {"memory_model": "roofline", "memory_bound": "bandwidth",
            "memory_slowdown_mean": 1.0, "memory_slowdown_is": "exact (no contention model)",
            "memory_slowdown_max": 1.0, "memory_contended_fraction": 0.0,
            "memory_max_transfers": 0, "memory_converged": True,
            "memory_variance_infinite": False, "memory_unstable": False,
            "memory_warnings": [], "memory_levels": []}
