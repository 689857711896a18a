"""Policies against grid search across languages: ``comparison.parquet`` of ``policies.evaluate`` runs as one frame,
and the summary the question needs — does a policy beat the best fixed γ, where, by how much, and at what cost.

    python -m analysis.comparison RUN_OR_MULTIRUN_DIR [--metric decode|e2e] [--out comparison-summary.md]
    python -m analysis.comparison RUN_OR_MULTIRUN_DIR --pair METHOD_A METHOD_B   # any two methods, paired

``load_comparisons`` finds every ``comparison.parquet`` at or below the paths (a multirun over languages is one
directory) with its run's context (``analysis.load``), refusing runs of different models or hardware unless
``allow_mixed``. ``policy_summary`` gives, per (concurrency, policy): the mean over languages of the % vs the best
fixed γ, in how many languages the paired CI lies wholly above 0 and the estimate is ≥ ``goal_pct``, in how many
the CI lies wholly below ``floor_pct``, the mean decision time and the mean gap to the oracle. ``load_map`` gives,
per (language, concurrency), which γ to run at that load and what adaptation adds there: the grid's best fixed γ
(0: speculation off) with its speed-up over AR, and the best policy with its paired CI against that γ; per
language, the grid's choices in vLLM's ``num_speculative_tokens_per_batch_size`` form. ``paired_decode`` compares
any two methods of one run (two policies doing the same work, say) on decode tok/s, paired over the (repeat, prompt)
clusters both completed, as the comparison's own columns are.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pandas as pd

from analysis.load import Paths, find_dirs, fixed_gamma, load_table
from analysis.policy_table import AA_POLICY, BEST_FIXED
from analysis.report import markdown_table
from spectune.errors import SpectuneError
from spectune.io import write_text
from spectune.methods import BASELINE
from spectune.run import cli, rundir
from spectune.stats.compare import EQUIVALENCE_MARGIN, decode_units
from spectune.stats.intervals import mde, verdict
from spectune.stats.units import components, speedup_interval, unit_size_of
from spectune.vllm_export import vllm_schedule

log = logging.getLogger(__name__)

COMPARISON = rundir.COMPARISON.name
FLOAT = "{:.2f}"


def load_comparisons(paths: Paths, allow_mixed: bool = False) -> pd.DataFrame:
    """One row per (run, concurrency, policy) from every ``comparison.parquet`` at or below ``paths``."""
    return load_table(paths, rundir.COMPARISON, allow_mixed, marker=rundir.COMPARISON.name)


METRICS = {"decode": "decode_vs_best_fixed_pct", "e2e": "vs_best_fixed_pct"}


def policy_summary(frame: pd.DataFrame, goal_pct: float = 10.0, floor_pct: float = -2.0, metric: str = "decode"
                   ) -> pd.DataFrame:
    """Per (concurrency, policy), over languages: see the module docstring. ``metric``: decode tok/s (the primary
    one) or end-to-end tok/s. Rows sorted by mean % vs best fixed."""
    if metric not in METRICS:
        raise SpectuneError(f"metric={metric!r} is invalid: choose from {', '.join(METRICS)}")
    key = METRICS[metric]
    if key not in frame or frame[key].isna().all():
        raise SpectuneError(f"metric={metric!r}: these comparisons have no {key} column (runs made before decode "
                            "throughput was recorded): use --metric e2e")
    rows = []
    for (concurrency, policy), group in frame.groupby(["concurrency", "policy"], sort=False):
        pct = group[key].astype(float)
        lo, hi = group[f"{key}_ci95_lo"].astype(float), group[f"{key}_ci95_hi"].astype(float)
        rows.append({"concurrency": int(concurrency), "policy": policy, "languages": int(group["language"].nunique()),
                     "mean_vs_best_fixed_pct": float(pct.mean()),
                     "min_vs_best_fixed_pct": float(pct.min()), "max_vs_best_fixed_pct": float(pct.max()),
                     f"languages_ci_above_0_and_ge_{goal_pct:g}pct": int(((lo > 0) & (pct >= goal_pct)).sum()),
                     "languages_ci_above_0": int((lo > 0).sum()),
                     f"languages_ci_below_{floor_pct:g}pct": int((hi < floor_pct).sum()),
                     "mean_speedup_vs_ar": _mean(group, "decode_speedup_vs_ar" if metric == "decode"
                                                 else "speedup_vs_ar"),
                     "mean_decision_pct_of_cycle": _mean(group, "decision_pct_of_cycle"),
                     "mean_no_draft_cycles_pct": _mean(group, "no_draft_cycles_pct"),
                     "mean_oracle_gap_pct": _mean(group, "oracle_gap_pct")})
    out = pd.DataFrame(rows)
    return out.sort_values(["concurrency", "mean_vs_best_fixed_pct"], ascending=[True, False], ignore_index=True)


def _mean(group: pd.DataFrame, column: str) -> float | None:
    if column not in group:
        return None
    values = pd.to_numeric(group[column], errors="coerce").dropna()
    return float(values.mean()) if len(values) else None


FIXED_ROWS = (BASELINE, BEST_FIXED, AA_POLICY)  # the comparison's non-adaptive rows, beside the "fixed:gamma=N" ones


def load_map(frame: pd.DataFrame, metric: str = "decode") -> pd.DataFrame:
    """Which γ at which load, and what adaptation adds there: one row per (language, concurrency) with the grid's
    best fixed γ (0 = speculation off; chosen on the training prompts) and its speed-up over AR, the
    hindsight-fixed γ where it was measured, the best adaptive policy and PPO with their % and paired 95% CI
    against the best fixed γ, by ``metric``."""
    if metric not in METRICS:
        raise SpectuneError(f"metric={metric!r} is invalid: choose from {', '.join(METRICS)}")
    key = METRICS[metric]
    speedup = "decode_speedup_vs_ar" if metric == "decode" else "speedup_vs_ar"
    rows = []
    for (language, concurrency), group in frame.groupby(["language", "concurrency"], sort=True):
        best = int(group["best_fixed_gamma"].iloc[0])
        fixed = group[group["policy"] == BEST_FIXED]
        adaptive = group[~group["policy"].isin(FIXED_ROWS) & ~fixed_gamma(group["policy"])]
        row = {"language": language, "concurrency": int(concurrency), "best_fixed_gamma": best,
               "best_fixed_speedup_vs_ar": float(fixed[speedup].iloc[0]) if best and len(fixed) else 1.0,
               "hindsight_gamma": _first(group, "hindsight_gamma")}
        if len(adaptive):
            top = adaptive.loc[adaptive[key].astype(float).idxmax()]
            row.update(best_policy=top["policy"], **_pct(top, key, "best_policy"))
        ppo = adaptive[adaptive["policy"] == "ppo"]
        if len(ppo):
            row.update(_pct(ppo.iloc[0], key, "ppo"))
        rows.append(row)
    return pd.DataFrame(rows)


def vllm_schedules(frame: pd.DataFrame) -> dict[str, list[list[int]]]:
    """Per language, the grid's best fixed γ per measured concurrency as vLLM's
    ``num_speculative_tokens_per_batch_size`` ranges (``harness.tasks.tune.vllm_schedule``)."""
    return {language: vllm_schedule({int(c): int(g) for c, g in
                                     group.groupby("concurrency")["best_fixed_gamma"].first().items()})
            for language, group in frame.groupby("language", sort=True)}


def _pct(row: pd.Series, key: str, name: str) -> dict[str, float]:
    return {f"{name}_vs_best_fixed_pct": float(row[key]), f"{name}_ci95_lo": float(row[f"{key}_ci95_lo"]),
            f"{name}_ci95_hi": float(row[f"{key}_ci95_hi"])}


def _first(group: pd.DataFrame, column: str) -> int | None:
    if column not in group:
        return None
    values = pd.to_numeric(group[column], errors="coerce").dropna()
    return int(values.iloc[0]) if len(values) else None


PER_LANGUAGE = ["language", "concurrency", "policy", "best_fixed_gamma", "hindsight_gamma", "decode_tok_s",
                "decode_speedup_vs_ar", "decode_vs_best_fixed_pct", "decode_vs_best_fixed_pct_ci95_lo",
                "decode_vs_best_fixed_pct_ci95_hi", "decode_vs_hindsight_pct", "tok_s", "speedup_vs_ar",
                "vs_best_fixed_pct", "vs_best_fixed_pct_ci95_lo", "vs_best_fixed_pct_ci95_hi", "acceptance_length",
                "mean_drafts_per_cycle", "no_draft_cycles_pct", "tpot_p50_ms", "decision_pct_of_cycle",
                "oracle_gap_pct"]


def paired_decode(paths: Paths, a: str, b: str) -> pd.DataFrame:
    """Per run (``requests.parquet`` at or below ``paths``) and concurrency: method ``a``'s pooled decode tok/s over
    ``b``'s on the prompts both completed (each prompt's repeats together), with its paired 95% t-interval
    (jackknife over prompts, with the method × repeat component) and its minimum detectable effect, in %. Runs at
    concurrency > 1 take one batch of consecutive prompts as the unit."""
    rows = []
    runs = find_dirs(paths, rundir.REQUESTS.name)
    if not runs:
        raise SpectuneError(f"no {rundir.REQUESTS.name} at or below {paths}: give policies.evaluate or bench runs")
    for run in runs:
        requests = rundir.REQUESTS.read(run)
        if "concurrency" not in requests:  # a bench run: one concurrency, in its config
            config = rundir.METADATA.read_if_present(run, {}).get("config", {})
            requests = requests.assign(concurrency=config.get("concurrency"))
        groups = requests.groupby("concurrency", dropna=False)
        for concurrency, group in groups:
            methods = sorted(group["method"].unique())
            missing = [m for m in (a, b) if m not in methods]
            if missing:
                raise SpectuneError(f"--pair method {missing[0]!r} is not in {run} at concurrency {concurrency}: "
                                    f"its methods are {', '.join(methods)}")
            level = None if pd.isna(concurrency) else int(concurrency)
            table = decode_units(group[group["method"].isin([a, b])], unit_size_of(level or 1, None))
            iv = speedup_interval(table, a, b)
            effect = mde(iv)
            parts = components(table, a, b)
            rows.append({"run": str(run), "concurrency": level, "a": a, "b": b, "units": iv.n, "unit": table.unit,
                         "a_vs_b_pct": 100 * (iv.estimate - 1), "ci95_lo": 100 * (iv.lo - 1),
                         "ci95_hi": 100 * (iv.hi - 1), "mde_pct": None if effect is None else 100 * effect,
                         "verdict": verdict(iv, EQUIVALENCE_MARGIN), "between_units_sd_pct":
                         parts["between_units_sd_pct"], "between_repeats_sd_pct": parts["between_repeats_sd_pct"],
                         "drift_pct": parts["drift_pct"], "interval": iv.method})
    return pd.DataFrame(rows)


def report(frame: pd.DataFrame, metric: str = "decode") -> str:
    """The summary over languages (ranked by ``metric``), then every language's rows."""
    per_language = frame[[c for c in PER_LANGUAGE if c in frame]].sort_values(["concurrency", "language", "policy"],
                                                                              kind="stable", ignore_index=True)
    schedules = [f"- {language}: `{table}`" for language, table in vllm_schedules(frame).items()]
    parts = [f"## Over languages (by {metric} tok/s)", "", markdown_table(policy_summary(frame, metric=metric), FLOAT),
             "", f"## Per load (by {metric} tok/s)", "", markdown_table(load_map(frame, metric), FLOAT), "",
             "The grid's best fixed γ per concurrency as vLLM's `num_speculative_tokens_per_batch_size`:", "",
             *schedules, "", "## Per language", "", markdown_table(per_language, FLOAT)]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m analysis.comparison", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="policies.evaluate run or multirun directories")
    parser.add_argument("--out", help="also write the report (Markdown) here")
    parser.add_argument("--metric", default="decode", choices=sorted(METRICS),
                        help="rank by decode tok/s (after the first token; default) or end-to-end tok/s")
    parser.add_argument("--allow-mixed", action="store_true", help="pool runs of different models or hardware")
    parser.add_argument("--pair", nargs=2, metavar=("A", "B"), help="instead: method A against method B of each run "
                        "(decode tok/s, paired over prompts)")
    return cli.run_command(parser, _print_report, argv)


def _print_report(args: argparse.Namespace) -> None:
    if args.pair:
        if args.metric != "decode":
            raise SpectuneError(f"--metric={args.metric} is invalid with --pair: it compares decode tok/s only")
        text = markdown_table(paired_decode(args.paths, *args.pair), FLOAT)
    else:
        text = report(load_comparisons(args.paths, args.allow_mixed), args.metric)
    log.info(text)
    if args.out:
        write_text(Path(args.out), text)


if __name__ == "__main__":
    raise SystemExit(main())
