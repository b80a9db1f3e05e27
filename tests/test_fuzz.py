"""Fuzzing the front door inside the suite: hostile inputs never give a traceback or a hang.

Hypothesis draws the random choices of :func:`tests.fuzzing.make_case` (mutated library
scenarios, byte damage, extreme values, hostile output paths, damaged traces); every case runs
``twin.cli.main`` in a forked, memory- and time-limited child and must end with exit code 0 or
2 and no traceback. Bounded to well under a minute; ``make fuzz`` runs the same generator for
5,000 cases.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzzing import make_case, run_case

#: Cases per suite run (each ~0.05-1 s).
CASES = 30
#: A case that does not answer within this is a hang, s.
TIMEOUT_S = 20.0


@settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.randoms(use_true_random=False))
def test_hostile_inputs_exit_0_or_2_without_traceback(rng: random.Random):
    case = make_case(rng)
    out = run_case(case, TIMEOUT_S)
    assert out.verdict == "ok", f"{case.describe()}: {out.verdict}\n{out.stderr[-3000:]}"
