"""Benchmark of the FIFO queue engine: vectorized Lindley vs SimPy vs a plain-Python loop.

All engines get identical inputs: an M/G/1 queue with Poisson arrivals and lognormal service
times (``sigma = 1.5`` of the log, so ``cov = sqrt(exp(sigma^2) - 1)`` ~ 2.9), mean service
1 s, utilization ``rho = 0.9``. For every engine the table reports the best wall time of a
few repetitions (``time.perf_counter``), customers per second, the speed ratio to SimPy and
the largest relative difference of the waits from the plain-Python Lindley loop and from
SimPy, measured as ``max |w - w_ref| / max(|w_ref|, mean service)``
(:func:`twin.kernel.queueing.max_relative_difference`). SimPy keeps absolute clock times, so its own
waits carry rounding of order ``ulp(t)`` per event (t ~ 2e5 s here): a few 1e-10.

Targets (``DESIGN.md``): Lindley >= 500x a SimPy ``Resource`` queue on identical inputs,
>= 50 M customers/s at 1e7 customers, waits equal to 1e-9 relative.

Run ``python -m experiments.bench_queueing``; a top-level bench script can call :func:`run`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import simpy

from twin.kernel import queueing

SIGMA = 1.5  # standard deviation of log(service)
RHO = 0.9  # utilization
MEAN_SERVICE_S = 1.0
TARGET_SPEEDUP = 500.0  # x SimPy
TARGET_RATE = 50e6  # customers/s at 1e7 customers
TARGET_REL_DIFF = 1e-9


def make_inputs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times (s) and lognormal service times (s) of ``n`` M/G/1 customers."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, n]))
    cov = math.sqrt(math.expm1(SIGMA**2))
    service = queueing.Lognormal(mean=MEAN_SERVICE_S, cov=cov)
    arrivals = queueing.PoissonArrivals(rate=RHO / MEAN_SERVICE_S).sample(rng, n)
    return arrivals, service.sample(rng, n)


def simpy_waits(arrivals: np.ndarray, services: np.ndarray) -> np.ndarray:
    """Waits (s) from a SimPy ``Resource(capacity=1)`` queue: one process per customer."""
    env = simpy.Environment()
    server = simpy.Resource(env, capacity=1)
    arr = arrivals.tolist()
    serv = services.tolist()
    waits = [0.0] * len(arr)

    def customer(i: int):
        with server.request() as req:
            yield req
            waits[i] = env.now - arr[i]
            yield env.timeout(serv[i])

    def source():
        for i, t in enumerate(arr):
            yield env.timeout(max(0.0, t - env.now))
            env.process(customer(i))

    env.process(source())
    env.run()
    return np.array(waits)


def python_waits(arrivals: np.ndarray, services: np.ndarray) -> np.ndarray:
    """Waits (s) from the plain-Python sequential Lindley loop."""
    return queueing.lindley_reference(arrivals, services)


def lindley_waits(arrivals: np.ndarray, services: np.ndarray) -> np.ndarray:
    """Waits (s) from the vectorized engine."""
    return queueing.fifo_waits(arrivals, services)


def _best_of(fn: Callable[[], np.ndarray], repeats: int) -> tuple[float, np.ndarray]:
    best = math.inf
    out = np.empty(0)
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _small_rows(n: int, seed: int, repeats: int, slow_repeats: int) -> list[dict[str, object]]:
    """All three engines on the same ``n`` customers."""
    arrivals, services = make_inputs(n, seed)
    floor = float(services.mean())
    t_py, ref = _best_of(lambda: python_waits(arrivals, services), slow_repeats)
    t_simpy, w_simpy = _best_of(lambda: simpy_waits(arrivals, services), slow_repeats)
    t_lin, w_lin = _best_of(lambda: lindley_waits(arrivals, services), repeats)
    rows: list[dict[str, object]] = []
    for engine, t, w in (
        ("simpy", t_simpy, w_simpy),
        ("python", t_py, ref),
        ("lindley", t_lin, w_lin),
    ):
        speedup = t_simpy / t
        diff = queueing.max_relative_difference(w, ref, floor=floor)
        diff_simpy = queueing.max_relative_difference(w, w_simpy, floor=floor)
        target: str = ""
        met: bool | None = None
        if engine == "lindley":
            target = f">= {TARGET_SPEEDUP:.0f}x SimPy, diffs <= {TARGET_REL_DIFF:g}"
            met = speedup >= TARGET_SPEEDUP and max(diff, diff_simpy) <= TARGET_REL_DIFF
        rows.append(_row(engine, n, t, speedup, diff, diff_simpy, target, met))
    return rows


def _large_row(
    n: int, seed: int, repeats: int, simpy_rate: float, check: bool
) -> dict[str, object]:
    """Lindley alone on ``n`` customers (optionally checked once against the plain loop)."""
    arrivals, services = make_inputs(n, seed)
    t, w = _best_of(lambda: lindley_waits(arrivals, services), repeats)
    diff = math.nan
    if check:
        ref = python_waits(arrivals, services)
        diff = queueing.max_relative_difference(w, ref, floor=float(services.mean()))
    rate = n / t
    met = rate >= TARGET_RATE and (math.isnan(diff) or diff <= TARGET_REL_DIFF)
    target = f">= {TARGET_RATE / 1e6:.0f} M customers/s, diff <= {TARGET_REL_DIFF:g}"
    return _row("lindley", n, t, rate / simpy_rate, diff, math.nan, target, met)


def _row(
    engine: str,
    n: int,
    t: float,
    speedup: float,
    diff: float,
    diff_simpy: float,
    target: str,
    met: bool | None,
) -> dict[str, object]:
    return {
        "engine": engine,
        "customers": n,
        "wall_s": t,
        "customers_per_s": n / t,
        "speedup_vs_simpy": speedup,
        "max_rel_diff_vs_python": diff,
        "max_rel_diff_vs_simpy": diff_simpy,
        "target": target,
        "met": met,
    }


def run(
    sizes: Sequence[int] = (200_000, 10_000_000),
    *,
    seed: int = 2024,
    repeats: int = 5,
    slow_repeats: int = 2,
    check_large: bool = True,
) -> pd.DataFrame:
    """Measure the engines and return one row per (engine, size).

    Args:
        sizes: customer counts. The first runs every engine (SimPy, plain Python, Lindley) on
            identical inputs; the others run Lindley only (SimPy would take minutes). Speedups
            at the other sizes compare customers/s with SimPy's at the first size.
        seed: root seed of the inputs.
        repeats: repetitions of the Lindley engine (best time kept).
        slow_repeats: repetitions of SimPy and of the plain loop (best time kept).
        check_large: also run the plain loop once at the other sizes to measure the Lindley
            waits' relative difference there (a few seconds per 1e7 customers).

    Returns:
        a DataFrame with columns ``engine, customers, wall_s, customers_per_s,
        speedup_vs_simpy, max_rel_diff_vs_python, target, met`` (``met`` is None where no
        target applies).
    """
    if not sizes:
        raise ValueError("sizes must name at least one customer count")
    rows = _small_rows(int(sizes[0]), seed, repeats, slow_repeats)
    simpy_rate = float(rows[0]["customers_per_s"])  # type: ignore[arg-type]
    rows += [_large_row(int(n), seed, repeats, simpy_rate, check_large) for n in sizes[1:]]
    return pd.DataFrame(rows)


def main() -> None:
    """Print the benchmark table and whether each target is met."""
    cov = math.sqrt(math.expm1(SIGMA**2))
    print(
        f"FIFO queue engines on identical M/G/1 inputs: Poisson arrivals, lognormal service "
        f"(sigma={SIGMA}, cov={cov:.3f}, mean {MEAN_SERVICE_S} s), rho={RHO}"
    )
    df = run()
    fmt = {
        "wall_s": "{:.4f}".format,
        "customers_per_s": lambda v: f"{v / 1e6:.3f} M/s",
        "speedup_vs_simpy": "{:.0f}x".format,
        "max_rel_diff_vs_python": "{:.1e}".format,
        "max_rel_diff_vs_simpy": "{:.1e}".format,
    }
    print(df.to_string(index=False, formatters=fmt))
    checked = df[df["met"].notna()]
    print("all targets met" if bool(checked["met"].all()) else "TARGET MISSED")


if __name__ == "__main__":
    main()
