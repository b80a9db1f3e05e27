"""How far a run is from three lower bounds, in orders of magnitude (``log10(actual / bound)``).

* **Roofline (compute roof).** No rank can finish an iteration faster than its GEMM FLOPs at
  the datasheet peak of the run's precision: ``T_roof = max over ranks of FLOPs / peak``
  (memory traffic is not part of this roof, so it is a floor, not the full roofline time).
* **Communication.** The bytes the run moved must cross links of finite bandwidth:
  ``T_link = max over directed links of bytes / capacity`` (for the routes the run used) and
  ``T_inject = bytes sent / sum of the devices' outgoing link capacity`` (any routing). The
  bound is the larger of the two.
* **Landauer.** Erasing one bit costs at least ``k T ln 2`` (``T``: inlet air temperature, the
  heat bath). Counting assumption: every FLOP's result overwrites one word of the run's
  precision, so each FLOP erases that many bits; data movement and every other state change are
  counted as free (reversible). It is therefore a floor for the arithmetic alone, and a
  reversible computer would not be bound by it.
* **Shannon-Hartley.** A lane of symbol rate ``f_s`` has the Nyquist bandwidth ``B = f_s / 2``;
  carrying ``R`` bit/s (the link's nominal rate per direction over its lanes) needs
  ``R <= B log2(1 + S / N)`` with noise ``N = N0 B``, so the received energy per bit is at least
  ``E_b = S / R = N0 (2^(R/B) - 1) / (R/B)``. Noise assumption: thermal noise of the heat bath
  (the inlet air, as for Landauer) plus the receiver's noise figure ``F`` (link catalog
  ``noise_figure_db``, default 0 dB), ``N0 = k (T + (F - 1) 290 K)``; a lossless channel (no
  attenuation between transmitter and receiver) and nothing spent on clocking, equalization or
  coding. The bound of a run is every link's bits (bytes carried x 8) times its ``E_b``, against
  the energy the links drew (bytes x pJ/bit + idle power; the routers are not links). Link
  types without ``lanes`` / ``symbol_rate_gbaud`` in the catalog have no bound (reported).

Input either from a finished simulation (``twin.summary``) or from a trace (``twin limits``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

BOLTZMANN_J_PER_K = 1.380649e-23
#: Bits per stored word of each precision (tf32 is stored in a 32-bit container).
BITS_PER_WORD = {"fp32": 32, "tf32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "fp4": 4}
SHANNON_ASSUMPTION = (
    "received energy per bit at the Shannon-Hartley capacity of each lane (bandwidth = symbol "
    "rate / 2, the link's nominal rate spread over its lanes), noise N0 = k (T + (F - 1) 290 K) "
    "with T the inlet air and F the catalog noise figure (default 0 dB), lossless channel, "
    "no clocking / equalization / coding overhead")
NOISE_REF_K = 290.0  # reference temperature of the noise figure (IEEE definition), K
LANDAUER_ASSUMPTION = (
    "each FLOP erases one result word of the run's precision (k T ln 2 per bit at the inlet "
    "air temperature); data movement and other state changes counted as reversible (free)")


def _orders(actual: float, bound: float) -> float | None:
    if bound <= 0 or actual <= 0:
        return None
    return math.log10(actual / bound)


def shannon_energy_per_bit(rate_bps: float, bandwidth_hz: float, temperature_k: float,
                           noise_figure_db: float = 0.0) -> float:
    """Least received energy per bit to carry ``rate_bps`` over a channel of ``bandwidth_hz``
    with white noise ``N0 = k (T + (F - 1) 290 K)``: ``N0 (2^eta - 1) / eta``, ``eta = R / B``
    (J per bit; tends to ``N0 ln 2`` as ``eta -> 0``)."""
    f = 10.0 ** (noise_figure_db / 10.0)
    n0 = BOLTZMANN_J_PER_K * (temperature_k + (f - 1.0) * NOISE_REF_K)
    eta = rate_bps / bandwidth_hz
    x = eta * math.log(2.0)
    if x > 700.0:  # 2^eta beyond a float: a rate no finite signal power carries in B
        return math.inf
    if x < 1e-9:  # wideband limit: expm1(x) / eta = ln 2 (1 + x / 2 + ...), error < 1e-9
        return n0 * math.log(2.0)
    return n0 * math.expm1(x) / eta


def link_shannon(spec: dict[str, Any], temperature_k: float) -> dict[str, Any] | None:
    """The bound of one link type (a link spec mapping), or None without lanes / symbol rate
    (or when its rate needs over 1000 bit/s/Hz, e.g. a bandwidth override no lane carries)."""
    lanes, baud = spec.get("lanes"), spec.get("symbol_rate_gbaud")
    if not lanes or not baud:
        return None
    rate = float(spec["bandwidth_gbps"]) * 8e9 / int(lanes)  # nominal bit/s of one lane
    bw = float(baud) * 1e9 / 2.0
    nf = float(spec.get("noise_figure_db") or 0.0)
    e_b = shannon_energy_per_bit(rate, bw, temperature_k, nf)
    if not math.isfinite(e_b):
        return None
    actual = float(spec["energy_pj_per_bit"]) * 1e-12
    return {"lane_rate_bps": rate, "bandwidth_hz": bw, "spectral_efficiency": rate / bw,
            "noise_figure_db": nf, "j_per_bit": e_b, "catalog_j_per_bit": actual,
            "orders_of_magnitude": _orders(actual, e_b)}


def shannon_limit(link_types: list[str], link_bytes: np.ndarray, link_energy_j: np.ndarray,
                  specs: dict[str, dict[str, Any]], temperature_k: float) -> dict[str, Any]:
    """Shannon-Hartley bound of a run's link energy (per the arrays' period, e.g. one
    iteration): ``sum over links of bits x E_b(type)`` vs the links' energy."""
    per_type = {t: link_shannon(specs[t], temperature_k) for t in sorted(set(link_types))}
    bits = np.asarray(link_bytes, dtype=float) * 8.0
    eb = np.array([per_type[t]["j_per_bit"] if per_type[t] else np.nan for t in link_types])
    known = ~np.isnan(eb)
    bound = float((bits[known] * eb[known]).sum())
    actual = float(np.asarray(link_energy_j, dtype=float)[known].sum())
    return {"bound_j": bound, "actual_j": actual, "orders_of_magnitude": _orders(actual, bound),
            "temperature_k": temperature_k, "link_types": per_type,
            "without_bound": sorted(t for t, v in per_type.items() if v is None),
            "assumption": SHANNON_ASSUMPTION}


def compute_limits(iteration_time_s: float, energy_per_iteration_j: float,
                   rank_flops_per_iteration: np.ndarray, peak_flops: float,
                   link_bytes_per_iteration: np.ndarray, link_capacity: np.ndarray,
                   injection_capacity: float, bytes_sent_per_iteration: float,
                   executed_flops_per_iteration: float, precision: str,
                   ambient_c: float, shannon: dict[str, Any] | None = None) -> dict[str, Any]:
    """The three bounds and the run's distance from them.

    Args:
        iteration_time_s: mean iteration time of the run, s.
        energy_per_iteration_j: whole-job energy per iteration, J.
        rank_flops_per_iteration: GEMM FLOPs of each rank (or rank class) per iteration.
        peak_flops: datasheet peak of one device at the run's precision, FLOP/s.
        link_bytes_per_iteration: bytes carried by each directed link per iteration.
        link_capacity: bandwidth of each directed link, B/s.
        injection_capacity: sum of the devices' outgoing link bandwidth, B/s.
        bytes_sent_per_iteration: bytes the devices sent per iteration.
        executed_flops_per_iteration: FLOPs the whole job executed per iteration.
        precision: the run's precision.
        ambient_c: temperature of the heat bath, C.
        shannon: :func:`shannon_limit` of the run's links (per iteration), if computed.
    """
    rank_flops = np.asarray(rank_flops_per_iteration, dtype=float)
    t_roof = float(rank_flops.max() / peak_flops) if rank_flops.size and peak_flops > 0 else 0.0
    cap = np.asarray(link_capacity, dtype=float)
    lb = np.asarray(link_bytes_per_iteration, dtype=float)
    t_link = float((lb / cap).max()) if cap.size else 0.0
    t_inj = bytes_sent_per_iteration / injection_capacity if injection_capacity > 0 else 0.0
    t_comm = max(t_link, t_inj)
    bits = BITS_PER_WORD[precision]
    temp_k = ambient_c + 273.15
    e_bit = BOLTZMANN_J_PER_K * temp_k * math.log(2.0)
    e_land = executed_flops_per_iteration * bits * e_bit
    out = {
        "roofline": {"bound_s": t_roof, "actual_s": iteration_time_s,
                     "orders_of_magnitude": _orders(iteration_time_s, t_roof)},
        "communication": {"bound_s": t_comm, "link_bound_s": t_link,
                          "injection_bound_s": t_inj, "actual_s": iteration_time_s,
                          "orders_of_magnitude": _orders(iteration_time_s, t_comm)},
        "landauer": {"bound_j": e_land, "actual_j": energy_per_iteration_j,
                     "orders_of_magnitude": _orders(energy_per_iteration_j, e_land),
                     "j_per_bit": e_bit, "bits_per_flop": bits, "temperature_k": temp_k,
                     "assumption": LANDAUER_ASSUMPTION},
    }
    if shannon is not None:
        out["shannon_hartley"] = shannon
    return out


def limits_from_trace(path: str | Path) -> dict[str, Any]:
    """:func:`compute_limits` for a finished trace (needs its ``ops`` and ``links`` tables).

    Raises:
        TraceError: the file is not a complete trace with those tables, or its stored
            scenario / summary lack what the bounds need (``twin.kernel.trace.open_trace``).
    """
    from twin.kernel.errors import ScenarioError, TraceError
    from twin.kernel.reading import load_yaml_text
    from twin.kernel.trace import open_trace, read_table

    attrs = open_trace(path, need=("ops", "links"))
    summ = attrs["summary"]
    try:
        scen = load_yaml_text(str(attrs.get("scenario", "")), source=str(path))
        iters = int(summ["iterations"])
        prec = scen["workload"]["precision"]
        peak = float(scen["cluster"]["device"]["peak_tflops"][prec]) * 1e12
        ambient = float(((scen.get("power") or {}).get("thermal") or {}).get("ambient_c", 25.0))
        ops = read_table(path, "ops")
        rank_flops = ops.groupby("cls", observed=True)["flops"].sum().to_numpy() / iters
        links = read_table(path, "links")
        n_dev = int(summ["devices"])
        inject = float(links.loc[links["src"] < n_dev, "capacity"].sum())
        args = (_num(summ["iteration_time_s"]), _num(summ["energy_per_iteration_j"]),
                rank_flops, peak, links["bytes"].to_numpy() / iters,
                links["capacity"].to_numpy(), inject, _num(summ["bytes_sent"]) / iters,
                _num(summ["executed_flops_per_iteration"]), prec, ambient)
        cl = scen["cluster"]
        specs = {v["name"]: v for k in ("link", "nic_link", "global_link")
                 if isinstance(v := cl.get(k), dict)}
        types = [str(t) for t in links["type"]]
        sh = shannon_limit(types, links["bytes"].to_numpy() / iters,
                           links["energy_j"].to_numpy() / iters, specs, ambient + 273.15)
    except (ScenarioError, KeyError, TypeError, ValueError, AttributeError,
            ZeroDivisionError) as exc:
        raise TraceError(f"{path}: the trace's stored scenario or summary lacks what the "
                         f"bounds need ({type(exc).__name__ if not str(exc) else str(exc)[:120]})"
                         ) from None
    return compute_limits(*args, sh)


def _num(v: Any) -> float:
    """A summary number; null (undefined, e.g. no iteration completed) as NaN."""
    return math.nan if v is None else float(v)


def format_limits(lim: dict[str, Any]) -> str:
    """Human-readable report."""
    lines = []
    for name, unit, key_b, key_a in (("roofline", "s", "bound_s", "actual_s"),
                                     ("communication", "s", "bound_s", "actual_s"),
                                     ("landauer", "J", "bound_j", "actual_j")):
        d = lim[name]
        o = d["orders_of_magnitude"]
        shown = "n/a (no bound)" if o is None else f"{o:.2f} orders of magnitude above"
        lines.append(f"  {name:<14} bound {d[key_b]:.4g} {unit:<2} actual {d[key_a]:.4g} "
                     f"{unit:<2} {shown}")
    c = lim["communication"]
    lines.append(f"  (communication: busiest link {c['link_bound_s']:.4g} s, injection "
                 f"{c['injection_bound_s']:.4g} s per iteration)")
    lines.append(f"  Landauer counting: {lim['landauer']['assumption']}")
    sh = lim.get("shannon_hartley")
    if sh is not None:
        o = sh["orders_of_magnitude"]
        shown = "n/a (no bound)" if o is None else f"{o:.2f} orders of magnitude above"
        lines.append(f"  {'shannon-hartley':<14} bound {sh['bound_j']:.4g} J  actual "
                     f"{sh['actual_j']:.4g} J  {shown} (link energy)")
        for t, v in sh["link_types"].items():
            if v is None:
                lines.append(f"    {t}: no bound (no lanes / symbol_rate_gbaud in the "
                             "catalog, or a rate above 1000 b/s/Hz)")
                continue
            lines.append(f"    {t}: {v['lane_rate_bps'] / 1e9:.4g} Gb/s per lane in "
                         f"{v['bandwidth_hz'] / 1e9:.4g} GHz ({v['spectral_efficiency']:.3g} "
                         f"b/s/Hz), noise figure {v['noise_figure_db']:g} dB: "
                         f"{v['j_per_bit']:.3e} J/bit vs catalog {v['catalog_j_per_bit']:.3e}")
        lines.append(f"  Shannon-Hartley assumption: {sh['assumption']} "
                     f"(T = {sh['temperature_k']:.2f} K)")
    return "\n".join(lines)
