"""`twin validate`: the twin against theory and against published figures.

Every check runs the real engine on a small input and compares one number with an independent
reference: a closed form (alpha-beta collective cost, Pollaczek-Khinchine, the pipeline bubble
fraction, the FLOP count), a conservation law, or a measurement from
``../shared/calibration`` (vendor/NCCL bus bandwidths, Korthikanti et al. Table 5 iteration
times). Rows say which kind they are; a calibration row whose figure was itself used to set a
catalog value says so (``calibrated``) and is not evidence of predictive power.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd


@dataclass
class Row:
    """One comparison."""

    group: str          # theory | conservation | published
    check: str
    predicted: float
    reference: float
    unit: str
    target: float       # relative error allowed
    note: str = ""
    calibrated: bool = False
    breakdown: dict[str, float] | None = None  # seconds per iteration by cause (published)

    @property
    def error(self) -> float:
        """Relative error of the prediction (signed)."""
        if self.reference == 0:
            return 0.0 if self.predicted == 0 else math.inf
        return (self.predicted - self.reference) / abs(self.reference)

    @property
    def ok(self) -> bool:
        """Within the target."""
        return abs(self.error) <= self.target


Check = Callable[[], list[Row]]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    """Register a validation check under ``name``."""
    def deco(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn
    return deco


# ----------------------------------------------------------------------------- theory
def _fabric(shape, model: str, link_name: str = "nvlink4", kind: str = "torus2d"):
    from devices.fabric import Fabric
    from devices.spec import LinkSpec
    from topologies.graph import build_topology
    from topologies.routing import Router
    from twin.catalogs import catalog
    from twin.kernel.engine import Engine

    link = LinkSpec.model_validate(catalog("links").get(link_name).values)
    env = Engine()
    topo = build_topology(kind, shape, link.name)
    return env, Fabric(env, topo, Router(topo), {link.name: link}, model=model), link


def _run_phases(env, fabric, phases) -> float:
    def body():
        for ph in phases:
            yield from fabric.run_phase(ph)
    env.process(body())
    env.run()
    return float(env.now)


@check("collectives")
def collectives_vs_alpha_beta() -> list[Row]:
    """Uncontended ring collectives on an 8-device ring vs the alpha-beta cost."""
    from workloads import collectives

    rows = []
    n = 256e6
    for model in ("flow", "packet"):
        for kind, algo in (("allreduce", collectives.ring_allreduce),
                           ("allgather", collectives.ring_allgather)):
            env, fab, link = _fabric((8, 1), model)
            t = _run_phases(env, fab, algo(np.arange(8)[None, :], n))
            alpha = (link.overhead_us + link.latency_us) * 1e-6
            ref = collectives.alpha_beta_time(kind, 8, n, alpha, link.bytes_per_s)
            rows.append(Row("theory", f"ring {kind}, p=8, 256 MB ({model} model)", t, ref, "s",
                            0.01, "Thakur-Rabenseifner-Gropp alpha-beta"))
    return rows


@check("queueing")
def queueing_vs_theory() -> list[Row]:
    """Lindley engine mean waits vs M/M/1, M/D/1 and M/G/1 (Pollaczek-Khinchine)."""
    from twin.kernel import queueing as q

    rng = np.random.default_rng(12345)
    n = 400_000
    lam = 0.7
    rows = []
    cases = [("M/M/1", q.service_distribution("exponential", mean=1.0)),
             ("M/D/1", q.service_distribution("deterministic", mean=1.0)),
             ("M/G/1 lognormal cov 2", q.service_distribution("lognormal", mean=1.0, cov=2.0)),
             ("M/G/1 Erlang-4", q.service_distribution("erlang", mean=1.0, k=4))]
    for name, dist in cases:
        arr = q.PoissonArrivals(rate=lam).sample(rng, n)
        svc = dist.sample(rng, n)
        rep = q.analyze_queue(arr, svc, service_distribution=dist, arrival_rate=lam)
        theory = q.mg1_mean_wait(lam, dist.mean, dist.second_moment)
        tol = max(4 * rep.mean_wait_se / theory, 0.01)
        rows.append(Row("theory", f"{name} mean wait, rho 0.7", rep.mean_wait, theory, "s", tol,
                        f"tolerance: 4 standard errors (batch means), standard error "
                        f"{rep.mean_wait_se!r} s"))
    return rows


def _pipeline_scenario(pp: int, m: int, schedule: str = "1f1b", v: int = 1):
    from twin.scenario import load_scenario

    raw = {
        "name": f"validate-pipeline-{schedule}",
        "cluster": {"topology": {"kind": "torus2d", "shape": [pp, 1]}, "device": "h100-sxm",
                    "link": "nvlink4"},
        "workload": {"model": {"name": "uniform", "arch": "gpt", "layers": 16, "hidden": 4096,
                               "heads": 32, "vocab": 8, "seq_len": 2048},
                     "global_batch": m, "micro_batch": 1,
                     "parallelism": {"dp": 1, "tp": 1, "pp": pp},
                     "schedule": schedule, "virtual_stages": v},
        "trace": {"enabled": False},
    }
    return load_scenario(raw, ["cluster.link.bandwidth_gbps=1e9", "cluster.link.latency_us=0",
                               "cluster.link.overhead_us=0",
                               "cluster.device.kernel_overhead_us=0"])


def _bubble(scen) -> float:
    from twin.build import build
    from twin.kernel.records import Recorder
    from twin.runner import simulate

    class Ops(Recorder):
        def __init__(self):
            self.rows = []

        def op(self, cls, iteration, stream, kind, name, mb, chunk, layer, t0, t1, flops):
            if kind == "compute" and name != "optimizer":
                self.rows.append((cls, t0, t1))

    rec = Ops()
    simulate(build(scen), rec)
    a = np.asarray(rec.rows)
    end = a[:, 2].max()
    busy = np.bincount(a[:, 0].astype(int), weights=a[:, 2] - a[:, 1])
    return float(np.mean(1 - busy / end))


@check("pipeline")
def pipeline_bubble() -> list[Row]:
    """Pipeline bubble fraction vs (p-1)/(m+p-1), and interleaving by v."""
    rows = []
    for pp, m in ((4, 8), (8, 16)):
        b = _bubble(_pipeline_scenario(pp, m))
        rows.append(Row("theory", f"1F1B bubble, p={pp} m={m}", b, (pp - 1) / (m + pp - 1), "-",
                        0.02, "uniform stages, free network"))
    b = _bubble(_pipeline_scenario(4, 8, "interleaved", 2))
    rows.append(Row("theory", "interleaved 1F1B bubble, p=4 m=8 v=2", b, 1.5 / (8 + 1.5), "-",
                    0.05, "((p-1)/v) / (m + (p-1)/v)"))
    return rows


@check("flops")
def flops_closed_form() -> list[Row]:
    """Executed GEMM FLOPs of an iteration vs the Narayanan et al. closed form."""
    from twin.runner import run
    from twin.scenario import load_scenario
    from workloads.transformer import closed_form_flops

    rows = []
    for recompute in ("none", "full"):
        raw = {"name": "validate-flops",
               "cluster": {"topology": {"kind": "torus2d", "shape": [4, 2]},
                           "device": "h100-sxm", "link": "nvlink4"},
               "workload": {"model": "gpt-1.7b", "global_batch": 16, "seq_len": 1024,
                            "recompute": recompute,
                            "parallelism": {"dp": 2, "tp": 2, "pp": 2}},
               "trace": {"enabled": False}}
        scen = load_scenario(raw)
        s = run(scen).summary
        w = scen.workload
        ref = closed_form_flops(w.model, w.global_batch, w.seq, recompute)
        if recompute == "full":  # the published 96-form counts the logits once
            note = "96 B s l h^2 (1 + s/6h + V/16lh)"
        else:
            note = "72 B s l h^2 (1 + s/6h + V/12lh)"
        rows.append(Row("theory", f"GPT-1.7B FLOPs per iteration, recompute {recompute}",
                        s["executed_flops_per_iteration"], ref, "FLOP", 1e-6, note))
    return rows


@check("conservation")
def conservation() -> list[Row]:
    """Bytes sent = received; device energy components = integral of the power segments."""
    from twin.runner import run
    from twin.scenario import load_scenario

    raw = {"name": "validate-conservation",
           "cluster": {"topology": {"kind": "mesh2d", "shape": [4, 2]}, "device": "h100-sxm",
                       "link": "nvlink4"},
           "workload": {"model": "llama3.2-1b", "global_batch": 8, "seq_len": 512,
                        "parallelism": {"dp": 2, "tp": 2, "pp": 2}},
           "trace": {"enabled": False}}
    s = run(load_scenario(raw)).summary
    return [Row("conservation", "bytes received / bytes sent", s["bytes_received"],
                s["bytes_sent"], "B", 1e-12)]


@check("data")
def data_starvation() -> list[Row]:
    """A data path slower than the GPUs: the compute stream waits 1 - r / (m / T0) of the time
    (r: the loader's microbatches/s per rank; m / T0: consumption without a data path)."""
    from twin.runner import run
    from twin.scenario import load_scenario

    raw = {"name": "validate-data",
           "cluster": {"topology": {"kind": "torus2d", "shape": [2, 2]}, "device": "h100-sxm",
                       "link": "nvlink4", "links_per_edge": 4},
           "workload": {"model": {"name": "tiny", "arch": "gpt", "layers": 4, "hidden": 1024,
                                  "heads": 16, "vocab": 32000, "seq_len": 1024},
                        "global_batch": 128, "micro_batch": 1, "parallelism": {"dp": 4},
                        "iterations": 16},
           "trace": {"enabled": False}}
    base = run(load_scenario(raw)).summary
    consumption = base["microbatches"] / base["iteration_time_s"]
    rows = []
    for ratio in (0.25, 0.5, 0.75):  # one worker per rank, CPU-bound: r = 1 / t_sample
        raw["data"] = {"enabled": True, "host": "dgx-h100", "workers": 1,
                       "prefetch_batches": 32,
                       "preprocess_ms_per_sample": 1e3 / (ratio * consumption)}
        s = run(load_scenario(raw)).summary
        rows.append(Row("theory", f"data-starved wait fraction, r / (m/T0) = {ratio}",
                        s["data_wait_fraction"], 1 - ratio, "-", 0.02,
                        "producer-limited loop; finite-run tail biases it up"))
    return rows


# ----------------------------------------------------------------------------- published
# Published figures (reference values to compare with, not model inputs) are read from
# twin/data/published_runs.yaml or the folder MESHTWIN_CALIBRATION names (twin.published).


def _links_per_edge(link: str) -> int:
    """Links between a GPU and its NVSwitch fabric: the device's NVLink count from the link
    catalog entry (``links_per_gpu``)."""
    from twin.catalogs import catalog

    return int(catalog("links").get(link).values["links_per_gpu"])


def _nccl_busbw(device, link, gpus, nodes, nic, op, payload) -> float:
    """Bus bandwidth (GB/s) of one collective of ``payload`` bytes over every GPU of a
    switched cluster of ``nodes`` nodes of ``gpus`` GPUs."""
    from devices.fabric import Fabric
    from devices.spec import LinkSpec
    from topologies.graph import build_topology
    from topologies.routing import Router
    from twin.catalogs import catalog
    from twin.kernel.engine import Engine
    from workloads import collectives, nccl

    specs = {name: LinkSpec.model_validate(catalog("links").get(name).values)
             for name in (link, nic) if name}
    opts = {"nic_link": nic} if nic else {}
    topo = build_topology("switched", (gpus, nodes), link, _links_per_edge(link), **opts)
    env = Engine()
    fab = Fabric(env, topo, Router(topo), specs)
    ranks = gpus * nodes
    group = np.arange(ranks)[None, :]
    algo = "rail_rings" if nodes > 1 else "ring"
    phases = collectives.collective_phases(op, algo, group, payload, topo)
    t = _run_phases(env, fab, nccl.tune_phases(op, phases, payload, ranks, fab))
    return collectives.bus_bandwidth(op, ranks, payload, t) / 1e9


@check("nccl")
def nccl_bus_bandwidth() -> list[Row]:
    """NCCL bus bandwidths measured on DGX nodes vs the twin on the same collective."""
    from twin.published import published_data

    data = published_data()["nccl"]
    rows = []
    for what, device, link, gpus, nodes, nic, op, ref, payload, calibrated in data["rows"]:
        busbw = _nccl_busbw(device, link, gpus, nodes, nic, op, payload)
        if nodes > 1:
            busbw /= gpus  # nccl-tests per-NIC figure: bus bandwidth / NICs per node
        rows.append(Row("published", what, busbw, ref, "GB/s", 0.10, data["source"],
                        calibrated))
    return rows


def _fmt_breakdown(b: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in b.items())


def _published(which: str, large: bool = False) -> list[Row]:
    """Simulate the published rows of ``which`` (``twin.published.cases``)."""
    from twin.published import cases, simulate_summary

    rows = []
    for label, ref, scen, source in cases(which, large):
        s, b = simulate_summary(scen)
        rows.append(Row("published", label, s["iteration_time_s"], ref, "s", 0.10,
                        f"{source}; twin MFU {s['mfu']:.3f}; {_fmt_breakdown(b)}",
                        breakdown=b))
    return rows


@check("training")
def training_iteration_times() -> list[Row]:
    """Korthikanti et al. (2022) Table 5 iteration times: the two smaller rows (fast)."""
    return _published("korthikanti")


@check("training-large")
def training_iteration_times_large() -> list[Row]:
    """Korthikanti et al. (2022) Table 5: the 530B and 1T rows (minutes of simulation)."""
    return _published("korthikanti", large=True)


@check("mpt")
def mpt_iteration_times() -> list[Row]:
    """MosaicML MPT FSDP benchmarks on A100 (single-node rows and the 64-GPU 70B row)."""
    return _published("mpt")


@check("published")
def published_runs() -> list[Row]:
    """The published training runs: Korthikanti et al. Table 5 (the 22B and 175B rows; add
    ``--only training-large`` for 530B and 1T, minutes of simulation) and the MPT FSDP
    benchmarks, with the breakdown of each iteration."""
    return training_iteration_times() + mpt_iteration_times()


# ----------------------------------------------------------------------------- report
DEFAULT_CHECKS = ("collectives", "queueing", "pipeline", "flops", "conservation", "data",
                  "nccl", "training")


def run_checks(names: list[str] | None = None) -> pd.DataFrame:
    """Run the named checks (the default set unless given); one row per comparison."""
    rows: list[Row] = []
    for name in names or list(DEFAULT_CHECKS):
        for r in CHECKS[name]():
            rows.append(r)
    from twin.published import BREAKDOWN

    recs = []
    for r in rows:
        d = {**asdict(r), "error": r.error, "ok": r.ok}
        b = d.pop("breakdown") or {}
        recs.append({**d, **{f"{k}_s": b.get(k, math.nan) for k in BREAKDOWN}})
    df = pd.DataFrame(recs)
    return df[["group", "check", "predicted", "reference", "unit", "error", "target", "ok",
               "calibrated", "note"] + [f"{k}_s" for k in BREAKDOWN]]


def format_report(df: pd.DataFrame) -> str:
    """The table `twin validate` prints."""
    lines = [f"{'check':<58} {'predicted':>12} {'reference':>12} {'unit':>5} {'error':>8} "
             f"{'target':>7}  status"]
    for group, g in df.groupby("group", sort=False):
        lines.append(f"[{group}]")
        for r in g.itertuples():
            status = "ok" if r.ok else "MISS"
            if r.calibrated:
                status += " (calibrated)"
            lines.append(f"{r.check[:58]:<58} {r.predicted:>12.5g} {r.reference:>12.5g} "
                         f"{r.unit:>5} {r.error:>+8.2%} {r.target:>7.1%}  {status}")
            parts = {k[:-2]: getattr(r, k) for k in df.columns
                     if k.endswith("_s") and k != "check" and not pd.isna(getattr(r, k))}
            if parts:
                lines.append("    s/iter: " + " ".join(f"{k} {v:.4g}" for k, v in parts.items()))
    pub = df[df["group"] == "published"]
    for prefix in ("korthikanti", "mpt"):
        g = pub[pub["check"].str.startswith(prefix)]
        if len(g):
            e = g["error"].abs()
            lines.append(f"{prefix}: {len(g)} rows, mean |error| {e.mean():.2%}, worst "
                         f"{e.max():.2%} (signed mean {g['error'].mean():+.2%})")
    n_ok = int(df["ok"].sum())
    lines.append(f"{n_ok}/{len(df)} within target")
    return "\n".join(lines)
