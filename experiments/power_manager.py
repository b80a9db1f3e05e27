"""Power manager with delayed telemetry: smooth approach vs overshoot-and-collapse (plot + CSV).

Runs ``scenarios/power_manager_tau0.yaml`` once per telemetry delay (the same scenario as
``power_manager_delayed.yaml`` apart from the delay), collects the manager's samples (trace
table ``telemetry``) and writes

* ``power_manager.csv``: one row per sample and delay: ``delay_s``, ``time_s``, ``power_w``
  (cluster power measured over the last period), ``reading_w`` (the stale reading the
  controller acted on), ``cap_mhz`` (the clock cap it set), ``budget_w``;
* ``power_manager.png``: power / budget and the clock cap over time, one line per delay, with
  the budget and the 85% alert line.

Run ``python -m experiments.power_manager [-o DIR] [--delays 0 5] [--set key=value ...]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from twin.kernel.trace import read_table

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "power_manager_tau0.yaml"


def run_delays(delays: list[float], out_dir: str | Path,
               overrides: list[str] | None = None) -> pd.DataFrame:
    """Run the manager scenario once per delay; the samples of all runs as one DataFrame."""
    from twin.api import load_scenario, run

    out_dir = Path(out_dir)
    frames = []
    for tau in delays:
        scen = load_scenario(SCENARIO, [*(overrides or []),
                                        f"power.manager.telemetry_delay_s={tau}"])
        res = run(scen, out_dir / f"power_manager_tau{tau:g}.h5")
        tel = read_table(res.trace_path, "telemetry")
        tel.insert(0, "delay_s", float(tau))
        tel["budget_w"] = scen.power.manager.budget_w
        tel["alert_w"] = scen.power.alerts.power_fraction * scen.power.manager.budget_w
        frames.append(pd.DataFrame(tel))
    return pd.concat(frames, ignore_index=True)


def plot(df: pd.DataFrame, out: str | Path) -> Path:
    """Power / budget and clock cap vs time, one line per delay."""
    fig = Figure(figsize=(10, 6))
    ax_p, ax_f = fig.subplots(2, 1, sharex=True)
    for tau, g in df.groupby("delay_s"):
        ax_p.plot(g["time_s"], g["power_w"] / g["budget_w"], marker=".", label=f"delay {tau:g} s")
        ax_f.plot(g["time_s"], g["cap_mhz"], marker=".", label=f"delay {tau:g} s")
    ax_p.axhline(1.0, color="k", lw=1, label="budget")
    frac = float((df["alert_w"] / df["budget_w"]).iloc[0])
    ax_p.axhline(frac, color="r", lw=1, ls="--", label=f"alert ({frac:.0%} of budget)")
    ax_p.set_ylabel("cluster power / budget")
    ax_p.legend(fontsize=8, loc="lower right")
    ax_f.set_ylabel("clock cap (MHz)")
    ax_f.set_xlabel("time (s)")
    ax_f.legend(fontsize=8, loc="lower right")
    fig.suptitle("Cluster power manager acting on delayed telemetry")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: run, write CSV and PNG."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--out", default="runs/power_manager", help="output directory")
    p.add_argument("--delays", type=float, nargs="+", default=[0.0, 5.0],
                   help="telemetry delays to compare, s")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="scenario override, e.g. workload.iterations=100")
    args = p.parse_args(argv)
    out = Path(args.out)
    df = run_delays(args.delays, out, args.set)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "power_manager.csv", index=False)
    png = plot(df, out / "power_manager.png")
    for tau, g in df.groupby("delay_s"):
        b = float(g["budget_w"].iloc[0])
        print(f"delay {tau:g} s: peak {g['power_w'].max() / b:.3f} x budget, "
              f"lowest cap {g['cap_mhz'].min():.0f} MHz")
    print(f"wrote {out / 'power_manager.csv'} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
