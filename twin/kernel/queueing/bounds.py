"""Bounds on the service-time distributions' parameters, without NumPy: the scenario schema
checks them when a file is read (``twin check`` imports no array library)."""

from __future__ import annotations

import math

#: Largest coefficient of variation accepted: beyond it a finite run cannot resolve the
#: distribution (for the lognormal at cov 1e3 one draw in ~1e6 carries half the mean) and the
#: moments overflow float64 long before cov ~ 1e154.
MAX_COV = 1e3
#: Largest lognormal sigma, the one of ``MAX_COV`` (``sqrt(log(1 + MAX_COV^2))``).
MAX_SIGMA = math.sqrt(math.log1p(MAX_COV**2))
#: Largest Pareto tail index accepted: at alpha = 1e3 the cov is ~1e-3 (nearly deterministic),
#: and the variance's ``(alpha - 1)^2 (alpha - 2)`` overflows float64 near alpha ~ 1e102.
MAX_ALPHA = 1e3
