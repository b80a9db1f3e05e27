"""Fast mode against exact mode on random combinations of scenario features.

A few seeded draws of :func:`tests.differential.make_scenario` (topology, layout, schedule,
sharding, overlap, ring model, HBM contention model, jitter, DVFS, power cap, thermal model,
one device fault) per suite run; ``python -m tests.differential --cases N --seed S`` runs
many more. Each must agree with exact mode within the fast mode's 0.5% on iteration time and
energy.
"""

from __future__ import annotations

import random

from tests.differential import compare, make_scenario

#: Valid draws compared (invalid draws, refused as a user would be, are skipped).
CASES = 4


def test_random_scenarios_agree_with_exact_mode():
    rng = random.Random(0)
    done = []
    while len(done) < CASES:
        res = compare(make_scenario(rng, light=True))
        if res.verdict == "invalid":
            continue
        assert res.verdict == "agree", f"{res.describe()}\n{res.scenario}"
        done.append(res)
    # the draws reach the fast mode's shortcuts, not only runs that take none
    assert any(r.fast["shortcuts_used"] != ["chained_transfers"] for r in done)
