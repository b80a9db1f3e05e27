"""Published training runs and collective bandwidths for `twin validate --only published`.

The reference figures live in ``twin/data/published_runs.yaml`` (copied with their sources from
the project's calibration folder, so a clean clone can validate); ``MESHTWIN_CALIBRATION`` may
name a folder with a ``calibration.yaml`` of the calibration folder's layout to compare with that
instead. Each run is simulated with the real engine and reported with a breakdown of one device's
iteration: GEMM compute (with the unfused attention's score GEMMs), fused attention
(FlashAttention kernels), other kernels (norms, activations, residual adds, loss,
casts, embedding), the optimizer step (and gradient clipping), exposed tensor-parallel
communication, exposed data-parallel / sharding communication, pipeline wait (bubble + exposed
pipeline sends) and the rest (idle, and compute slowed beyond its kernels' own times: SMs
taken by collectives beside it, clocks below the top one). The kernel times are those of the
device alone at the top clock.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from pathlib import Path

import yaml

#: environment variable naming an external calibration folder (its calibration.yaml)
ENV_VAR = "MESHTWIN_CALIBRATION"


@cache
def _bundled() -> dict:
    text = resources.files("twin").joinpath("data/published_runs.yaml").read_text()
    return yaml.safe_load(text)


def _external(folder: str) -> dict | None:
    """The calibration.yaml of ``folder`` in the bundled layout (None: absent or unreadable)."""
    path = Path(folder) / "calibration.yaml"
    if not path.is_file():
        return None
    raw = yaml.safe_load(path.read_text())
    data = dict(_bundled())
    k = raw.get("training_a100_selective_recompute_seqpar")
    if k:
        names = {"22B": "gpt-22b", "175B": "gpt3-175b", "530B": "gpt-530b", "1T": "gpt-1t"}
        rows = [[names[r["model"]], r["gpus"], r["tp"], r["pp"], r["interleave"],
                 r["global_batch"], r.get("micro_batch", k["common"]["micro_batch"]),
                 r["iteration_time_s"]] for r in k["rows"] if r["model"] in names]
        data["korthikanti"] = {**data["korthikanti"], "rows": rows}
    m = raw.get("training_a100_fsdp_mpt")
    if m:
        rows = [[r["model"], r["seq"], r["gpus"], r["micro"], r["accum"], r["batch"], r["ckpt"],
                 r["tokens_per_s_per_gpu"], r["mfu"]] for r in m["rows"]]
        data["mpt"] = {**data["mpt"], "models": m["models"], "rows": rows}
    return data


def published_data() -> dict:
    """The reference figures: the external calibration folder if ``MESHTWIN_CALIBRATION`` names
    one with a calibration.yaml, else the bundled copy."""
    folder = os.environ.get(ENV_VAR)
    if folder:
        ext = _external(folder)
        if ext is not None:
            return ext
    return _bundled()


# ----------------------------------------------------------------------------- scenarios
def _cluster(c: dict, gpus: int) -> dict:
    """The scenario's cluster section for ``gpus`` GPUs on the data file's nodes: ``switched``
    nodes of ``gpus_per_node`` GPUs, the NIC link only when there is more than one node."""
    per_node = int(c["gpus_per_node"])
    nodes = max(gpus // per_node, 1)
    return {"topology": {"kind": "switched", "shape": [min(gpus, per_node), nodes]},
            "device": c["device"], "link": c["link"], "links_per_edge": c["links_per_edge"],
            **({"nic_link": c["nic_link"]} if nodes > 1 else {})}


def korthikanti_scenario(model: str, gpus: int, tp: int, pp: int, v: int, gb: int, mb: int):
    """Korthikanti et al. Table 5 setup: DGX A100 nodes (8 GPUs on NVSwitch, 8 HDR200 NICs),
    fp16, sequence 2048, selective recompute, sequence parallelism, TP inside a node, and the
    unfused (standard) attention of the Megatron-LM of 2022."""
    from twin.scenario import load_scenario

    raw = {
        "name": f"korthikanti-{model}",
        "cluster": _cluster(published_data()["korthikanti"]["cluster"], gpus),
        "workload": {"model": model, "precision": "fp16", "seq_len": 2048,
                     "global_batch": gb, "micro_batch": mb,
                     "parallelism": {"dp": gpus // (tp * pp), "tp": tp, "pp": pp},
                     "schedule": "interleaved" if v > 1 else "1f1b", "virtual_stages": v,
                     "recompute": "selective", "sequence_parallel": True,
                     "attention": "standard"},
        "trace": {"enabled": False},
    }
    return load_scenario(raw)


def mpt_scenario(name: str, seq: int, gpus: int, micro: int, batch: int, ckpt: bool,
                 dims: list[int], vocab: int):
    """MosaicML MPT benchmark setup: DGX-class A100 80GB nodes (NVSwitch inside, eight 200 Gb/s
    ports between: 1600 Gb/s per node, modelled with the HDR200 port), bf16, PyTorch FSDP
    FULL_SHARD over every GPU, the data file's fused attention kernel (the benchmark's Triton
    FlashAttention), full recompute when ``ckpt``. FSDP issues its all-gathers (prefetch) and
    reduce-scatters beside compute on a separate CUDA stream, so the NCCL kernels take SMs from
    the GEMMs while they run: ``overlap.sm_contention`` is on (``devices.interference``, the
    catalog's NCCL CTA count). The Korthikanti rows leave it off: with dp = 1 and TP
    communication not overlapped in the Megatron-LM of 2022, only the pipeline sends run beside
    compute there (measured: no change in the 22B / 175B iteration time)."""
    from twin.scenario import load_scenario

    h, heads, layers = dims
    raw = {
        "name": f"mpt-{name}-{seq}",
        "cluster": _cluster(published_data()["mpt"]["cluster"], gpus),
        "workload": {"model": {"name": f"mpt-{name}", "arch": "gpt", "layers": layers,
                               "hidden": h, "heads": heads, "vocab": vocab, "seq_len": seq},
                     "precision": "bf16", "global_batch": batch, "micro_batch": micro,
                     "parallelism": {"dp": gpus}, "recompute": "full" if ckpt else "none",
                     "attention": published_data()["mpt"].get("attention", "flash"),
                     "sharding": {"strategy": "full_shard"}},
        "overlap": {"sm_contention": True},
        "trace": {"enabled": False},
    }
    return load_scenario(raw)


def cases(which: str, large: bool = False):
    """The published training rows of set ``which`` (``korthikanti`` or ``mpt``) as
    ``(label, published iteration time s, scenario, source note)``, scenarios built lazily;
    Korthikanti rows above 64 GPUs (530B, 1T: minutes of simulation) only when ``large``."""
    data = published_data()
    if which == "korthikanti":
        for model, gpus, tp, pp, v, gb, mb, ref in data["korthikanti"]["rows"]:
            if (gpus > 64) == large:
                yield (f"korthikanti {model} {gpus} A100 tp{tp} pp{pp} v{v}", ref,
                       korthikanti_scenario(model, gpus, tp, pp, v, gb, mb),
                       "Korthikanti et al. 2022 Table 5")
    elif which == "mpt":
        m = data["mpt"]
        for name, seq, gpus, micro, _accum, batch, ckpt, tps, mfu in m["rows"]:
            yield (f"mpt {name} seq{seq} {gpus} A100 FSDP{' ckpt' if ckpt else ''}",
                   batch * seq / (tps * gpus),  # iteration time from tokens/s per GPU
                   mpt_scenario(name, seq, gpus, micro, batch, ckpt, m["models"][name],
                                m["vocab"]),
                   f"llm-foundry MPT benchmarks (published MFU {mfu:.3f})")
    else:
        raise ValueError(f"unknown published set {which!r}; allowed: korthikanti, mpt")


# ----------------------------------------------------------------------------- breakdown
BREAKDOWN = ("compute", "attention", "other_kernels", "optimizer", "exposed_tp", "exposed_dp",
             "pipeline_wait", "other")


def breakdown(model, summary: dict) -> dict[str, float]:
    """Seconds per iteration of one device, by cause (see the module docstring): the slowest
    stage's compute split by kernel kind, the waits from the run's summary."""
    from workloads.schedules import COMPUTE

    iters = max(summary["iterations"], 1)
    comp = model.compute
    best = None
    for stage, prog in model.programs.items():
        parts = {"compute": 0.0, "attention": 0.0, "other_kernels": 0.0, "optimizer": 0.0}
        for ins in prog:
            if ins[0] != COMPUTE:
                continue
            block = model.blocks[stage][ins[1]]
            times = comp.kernel_times(block)
            if ins[1] == "optimizer":
                parts["optimizer"] += float(times.sum())
                continue
            for k, t in zip(block.kernels, times, strict=True):
                kind = "attention" if k.fused else "compute" if k.gemm else "other_kernels"
                parts[kind] += float(t)
        if best is None or sum(parts.values()) > sum(best.values()):
            best = parts
    assert best is not None
    out = dict(best)
    out["exposed_tp"] = summary["tp_comm_time_per_device_s"] / iters
    out["exposed_dp"] = (summary["dp_wait_per_device_s"]
                         + summary.get("sharding", {}).get("allgather_wait_per_device_s", 0.0)
                         ) / iters
    out["pipeline_wait"] = summary["pipeline_wait_per_device_s"] / iters
    out["other"] = max(summary["iteration_time_s"] - sum(out.values()), 0.0)
    return out


def simulate_summary(scen) -> tuple[dict, dict[str, float]]:
    """Run ``scen`` (no trace) and return its summary and the breakdown of its iteration."""
    import time

    from twin.build import build
    from twin.runner import simulate_untraced
    from twin.summary import summarize

    t0 = time.perf_counter()
    model = build(scen)
    env, fabric, ex, _ = simulate_untraced(model)
    s = summarize(model, env, fabric, ex, time.perf_counter() - t0)
    return s, breakdown(model, s)
