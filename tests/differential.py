"""Random small scenarios run in the fast mode and in exact mode: the two must agree.

Exact mode (``simulation.exact: true``) simulates every rank and every transfer and takes none
of the fast mode's shortcuts (rank symmetry, the replica quotient, closed-form and optimistic
tensor-parallel collectives, one agent per TP group, running ahead of the clock, lock-step
rings, chained transfers, microbatch aggregation), so it is the fast mode's reference. The
hand-written cases of ``tests/test_exact.py`` check each shortcut where it was built for;
this module draws *combinations* of what a scenario can say (topology kind and shape, the
parallel layout, the pipeline schedule, sharding, overlap switches, the ring model, an HBM
contention model, compute jitter, DVFS, a power cap, the thermal model, one fault: a
straggler, an HBM degradation, a cooling, link or accelerator failure) and checks that the
fast mode's iteration time and energy stay within :data:`REL_TOL` of exact mode's: the
tolerance the fast mode promises (README, "Validation and benchmarks").

Used by ``tests/test_differential.py`` (a few seeded cases in ``make test``) and by
``python -m tests.differential --cases N --seed S`` (the long run, not part of the suite).
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

#: Agreement the fast mode promises on iteration time and energy (relative).
REL_TOL = 5e-3
#: Summary keys compared.
KEYS = ("iteration_time_s", "energy_j")


def _divisors(n: int, most: int) -> list[int]:
    return [d for d in range(1, min(n, most) + 1) if n % d == 0]


def make_scenario(rng: random.Random, light: bool = False) -> dict[str, Any]:
    """One random small scenario (a mapping for ``twin.load_scenario``; fast mode, no trace).

    ``light``: at most two microbatches per stage and short sequences (the suite's draws;
    exact mode's cost grows with the microbatches). Some draws are not valid scenarios (a
    stage plan the schedule refuses, memory that does not fit): :func:`compare` reports them
    as ``invalid`` and they are skipped, as a user would be told.
    """
    kind = rng.choice(["torus2d", "torus2d", "mesh2d", "ring", "switched"])
    shape = {"torus2d": [[2, 2], [4, 2], [2, 4], [4, 4], [3, 2], [4, 3]],
             "mesh2d": [[2, 2], [4, 2], [4, 4], [3, 2], [4, 3]],
             "ring": [[4], [6], [8]], "switched": [[2, 2], [2, 4], [4, 2]]}[kind]
    shape = rng.choice(shape)
    n = 1
    for s in shape:
        n *= s
    # the model's heads and MLP width take powers of two
    tp = rng.choice([d for d in _divisors(n, 8) if d & (d - 1) == 0])
    pp = rng.choice(_divisors(n // tp, 4))
    dp = n // (tp * pp)
    schedule = rng.choice(["1f1b", "gpipe", "interleaved"]) if pp > 1 else "1f1b"
    micro = rng.choice([1, 2])
    accumulation = rng.choice([1, 2] if light else [1, 2, 4, 16]) * pp
    workload: dict[str, Any] = {
        "model": "llama3.2-1b", "precision": "bf16",
        "seq_len": rng.choice([256, 512] if light else [512, 1024]),
        "global_batch": dp * micro * accumulation, "micro_batch": micro,
        "parallelism": {"dp": dp, "tp": tp, "pp": pp}, "iterations": rng.choice([1, 2]),
        "schedule": schedule}
    if schedule == "interleaved":
        workload["virtual_stages"] = 2
    if 16 % (pp * workload.get("virtual_stages", 1)):  # the model's 16 layers, uneven stages
        workload["stage_layers"] = "auto"
    if dp > 1 and rng.random() < 0.4:
        strategy = rng.choice(["zero1", "zero2", "zero3", "full_shard", "shard_grad_op",
                               "hybrid_shard"])
        workload["sharding"] = {"strategy": strategy}
        if strategy == "hybrid_shard":
            workload["sharding"]["group"] = rng.choice(_divisors(dp, dp))
    overlap = {key: value for key, value, p in (("tp_comm", True, 0.3),
                                                ("dp_buckets", False, 0.3),
                                                ("dp_streams", 2, 0.2),
                                                ("pipeline", False, 0.2),
                                                ("sm_contention", True, 0.2))
               if rng.random() < p}
    if "sharding" in workload:  # DDP's bucket knobs (refused beside a sharded strategy)
        overlap = {k: v for k, v in overlap.items() if k not in ("dp_buckets", "dp_streams")}
    memory = rng.choice([{}] * 15 + [{"model": "frfcfs"}] * 3 + [{"model": "queue"}] * 2)
    power: dict[str, Any] = {}
    if rng.random() < 0.3:
        power["communication_energy"] = True
    r = rng.random()
    if r < 0.2:
        power["dvfs"] = {"frequency_mhz": rng.choice([1980, 1530, 1080])}
    elif r < 0.35:
        power["dvfs"] = {"policy": "stage_plan", "stage_frequency_mhz": "auto"}
    if rng.random() < 0.2:
        power["cap_w"] = rng.choice([400, 550])
    r = rng.random()
    if r < 0.2:
        power["thermal"] = {"initial": "idle"}
    elif r < 0.6:  # without it, microbatches may be aggregated
        power["thermal"] = {"enabled": False}
    faults: list[dict[str, Any]] = []
    r = rng.random()
    if r < 0.15:
        faults.append({"kind": "straggler", "device": rng.randrange(n), "factor": 1.5,
                       "time_s": 0.01, "duration_s": 0.2})
    elif r < 0.25:
        faults.append({"kind": "hbm_degradation", "device": rng.randrange(n), "time_s": 0.01,
                       "duration_s": 0.3, "tail": {"name": "pareto", "alpha": 1.5,
                                                   "mean": 2.0}})
    elif r < 0.3:
        faults.append({"kind": "cooling_failure", "devices": [rng.randrange(n)],
                       "time_s": 0.0, "rise_k": 30})
    elif r < 0.35 and kind != "switched":  # devices 0 and 1 are neighbours on every grid
        faults.append({"kind": "link_failure", "link": [0, 1], "time_s": 0.002,
                       "duration_s": 0.05})
    elif r < 0.4:  # the job stops, restarts from its last checkpoint
        faults.append({"kind": "accelerator_failure", "device": rng.randrange(n),
                       "time_s": 0.01})
    cluster: dict[str, Any] = {"topology": {"kind": kind, "shape": shape},
                               "device": "h100-sxm", "link": "nvlink4"}
    if kind == "switched":  # GPUs on an NVSwitch per node, nodes on an InfiniBand fat-tree
        cluster.update(link="nvlink4-switch", links_per_edge=18, nic_link="ib-ndr400-port")
    return {
        "name": "differential", "seed": rng.randrange(1000), "cluster": cluster,
        "workload": workload,
        "simulation": {"compute_jitter_cov": 0.05} if rng.random() < 0.4 else {},
        "overlap": overlap,
        "network": {"ring_model": "step"} if rng.random() < 0.3 else {},
        "memory": memory, "power": power, "faults": faults, "trace": {"enabled": False}}


def make_aggregation_scenario(rng: random.Random) -> dict[str, Any]:
    """A draw of :func:`make_scenario` that the fast mode may aggregate
    (``twin.aggregate``): two or more stages, enough microbatches for the three reduced runs
    (``6 pp + 6`` or a few more for 1F1B / GPipe, ``18 pp`` interleaved), and none of what
    blocks aggregation (faults, jitter, an HBM contention model, DVFS, a cap, the thermal
    model). Plain draws reach it about once in 150; these make the shortcut's combinations
    with sharding, overlap, ring models, topologies and communication energy common."""
    while True:
        d = make_scenario(rng)
        w = d["workload"]
        par = w["parallelism"]
        if par["pp"] >= 2:
            break
    pp, dp, micro = par["pp"], par["dp"], w["micro_batch"]
    m = 18 * pp if w["schedule"] == "interleaved" else 6 * pp + 6 + rng.choice([0, 1, 3])
    w.update(global_batch=dp * micro * m, seq_len=256)
    d.update(faults=[], simulation={}, memory={})
    power = d["power"]
    for key in ("dvfs", "cap_w"):
        power.pop(key, None)
    power["thermal"] = {"enabled": False}
    return d


@dataclass
class Outcome:
    """The verdict on one scenario: ``agree``, ``differ`` or ``invalid``."""

    verdict: str
    scenario: dict[str, Any]
    fast: dict[str, Any] | None = None
    exact: dict[str, Any] | None = None
    detail: str = ""
    wall_s: float = 0.0
    worst: float = 0.0  # largest |fast / exact - 1| over KEYS

    def describe(self) -> str:
        """One line: verdict, the largest relative difference, the fast mode's shortcuts,
        what differs."""
        used = ",".join(self.fast.get("shortcuts_used", [])) if self.fast else "-"
        return (f"{self.verdict:7s} {self.wall_s:5.1f}s {self.worst:.1e} [{used}] "
                f"{self.detail}")


def compare(scenario: dict[str, Any]) -> Outcome:
    """Run ``scenario`` in the fast mode and in exact mode; compare :data:`KEYS`."""
    from twin.kernel.errors import ScenarioError
    from twin.runner import run
    from twin.scenario import load_scenario

    t0 = time.perf_counter()
    out: dict[bool, dict[str, Any]] = {}
    for exact in (False, True):
        d = copy.deepcopy(scenario)
        d["simulation"] = {**d.get("simulation", {}), "exact": exact}
        try:
            out[exact] = run(load_scenario(d)).summary
        except ScenarioError as exc:
            return Outcome("invalid", scenario, detail=str(exc).splitlines()[-1][:200])
    fast, ref = out[False], out[True]
    far = [f"{k}: fast {fast[k]:.9g}, exact {ref[k]:.9g} ({fast[k] / ref[k] - 1:+.3%})"
           for k in KEYS if abs(fast[k] - ref[k]) > REL_TOL * abs(ref[k])]
    worst = max(abs(fast[k] / ref[k] - 1.0) for k in KEYS)
    return Outcome("differ" if far else "agree", scenario, fast, ref, "; ".join(far),
                   time.perf_counter() - t0, worst)


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.differential --cases N --seed S``: exit 1 if any case differs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200, help="valid scenarios to compare")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--aggregation", type=int, default=5, metavar="K",
                    help="every K-th draw one the fast mode may aggregate (from a stream of "
                         "its own: the other draws are those of --seed); 0: none")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    rng_agg = random.Random(f"aggregation-{args.seed}")
    counts = {"agree": 0, "differ": 0, "invalid": 0}
    worst = 0.0
    draws = 0
    while counts["agree"] + counts["differ"] < args.cases:
        draws += 1
        agg = args.aggregation > 0 and draws % args.aggregation == 0
        res = compare(make_aggregation_scenario(rng_agg) if agg else make_scenario(rng))
        counts[res.verdict] += 1
        worst = max(worst, res.worst)
        if res.verdict != "invalid":
            print(res.describe(), flush=True)
        if res.verdict == "differ":
            print(f"  scenario: {res.scenario}", flush=True)
    print(f"{counts['agree']} agree, {counts['differ']} differ beyond {REL_TOL:.1%} (largest "
          f"relative difference {worst:.2e}), {counts['invalid']} invalid draws skipped")
    return 1 if counts["differ"] else 0


if __name__ == "__main__":
    sys.exit(main())
