"""The published validation rows with the device interference model on.

``twin validate --only published`` runs the Korthikanti et al. Table 5 rows (22B, 175B) and the
MPT FSDP rows with roofline memory and no SM sharing (``twin validate`` takes no ``--set``).
This runs the same scenarios (``twin.published``) as they are and again with overrides
(default ``overlap.sm_contention=true``; e.g. ``--set memory.model=frfcfs --set
memory.per_device_draws=false``), and prints the iteration time of each against the published
one: how much of the rows' gap (the twin predicting them too fast) the interference of
communication kernels with compute accounts for.

``python -m experiments.validate_contention [--only mpt|korthikanti] [--set KEY=VALUE ...]``
"""

from __future__ import annotations

import argparse

import pandas as pd


def _rows(only: str | None):
    from twin.published import cases

    for which in ("korthikanti", "mpt"):
        if only in (None, which):
            for label, ref, scen, _source in cases(which):
                yield label, ref, scen


def run(sets: list[str], only: str | None = None) -> pd.DataFrame:
    """One row per published run: published, twin as-is and twin with ``sets`` (s)."""
    from twin.published import simulate_summary

    out = []
    for name, ref, scen in _rows(only):
        base, _ = simulate_summary(scen)
        on, _ = simulate_summary(scen.replace(sets))
        out.append({"row": name, "published_s": ref, "twin_s": base["iteration_time_s"],
                    "with_s": on["iteration_time_s"],
                    "error": base["iteration_time_s"] / ref - 1,
                    "error_with": on["iteration_time_s"] / ref - 1,
                    "sm_max_used": on["sm_max_used"], "hbm_max_streams": on["hbm_max_streams"],
                    "contention_slowdown": on["contention_slowdown_mean"]})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> None:
    """CLI (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["mpt", "korthikanti"])
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override for the second run (default overlap.sm_contention=true)")
    args = p.parse_args(argv)
    df = run(args.set or ["overlap.sm_contention=true"], args.only)
    print(f"overrides: {args.set or ['overlap.sm_contention=true']}")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
