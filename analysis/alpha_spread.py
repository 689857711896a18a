"""Acceptance by prompt category and by language, and whether α varies more across categories than across
languages: the tables of the acceptance results pages, from their run directories' ``acceptance.json`` only.

Per (pair, language, category) α and its interval are the product's own (``alpha_by_category``), per (pair, language)
the run's ``alpha`` / ``alpha_ci95_over_prompts``. The spreads (max − min) and their intervals are a percentile
bootstrap: :data:`RESAMPLES` resamples of prompts within each (language, category) stratum, seed 0 per pair (a pair's
intervals do not depend on which other runs exist), every statistic on the same resample. The basic-bootstrap column
(2·estimate − the percentile bounds) is a sensitivity check beside it: it reflects the upward bias of a max − min
statistic, which the percentile interval does not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spectune.run import rundir
from workloads.categories import CATEGORIES

logger = logging.getLogger(__name__)

RESAMPLES = 10_000
Strata = dict[tuple[str, str], tuple[Any, Any]]  # (language, category) -> (Σ accepted mass, positions), or replicates


def load(folder: Path, pair: str, lang: str) -> dict[str, Any] | None:
    """The ``task=acceptance`` result of ``folder/<pair>-<lang>``, or None when that run is not committed."""
    run = folder / f"{pair}-{lang}"
    return rundir.ACCEPTANCE.read(run) if rundir.ACCEPTANCE.exists(run) else None


def fmt(a: float, lo: float, hi: float) -> str:
    return f"{a:.3f} [{lo:.3f}, {hi:.3f}]"


def percentile_interval(x: np.ndarray) -> tuple[float, float]:
    return float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))


def alpha_table(runs: Mapping[str, dict[str, Any]]) -> list[str]:
    """α per category and overall for each language's run, then the share of prompts the target stopped per category."""
    lines = ["| language | " + " | ".join(CATEGORIES) + " | all categories | prompts | positions |",
             "| --- | " + " | ".join("---" for _ in CATEGORIES) + " | --- | --- | --- |"]
    for lang, r in runs.items():
        bt = r["alpha_by_category"]
        cells = [fmt(bt[t]["alpha"], bt[t]["alpha_ci95_lo"], bt[t]["alpha_ci95_hi"]) + f" ({bt[t]['prompts']}p, "
                 f"{bt[t]['positions']})" for t in CATEGORIES]
        ci = r["alpha_ci95_over_prompts"]
        n_pos = sum(p["positions"] for p in r["alpha_per_prompt"])
        lines.append(f"| {lang} | " + " | ".join(cells) + f" | {fmt(r['alpha'], ci['lo'], ci['hi'])} | "
                     f"{len(r['alpha_per_prompt'])} | {n_pos} |")
    lines.append("\nCells: α [95% CI over the category's prompts] (prompts, positions). Target stopped (share of "
                 "prompts):")
    lines += [f"{lang}: " + ", ".join(f"{t} {r['alpha_by_category'][t]['stop_share']:.2f}" for t in CATEGORIES) + ";"
              for lang, r in runs.items()]
    return lines


def strata(runs: Mapping[str, dict[str, Any]]) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """Per (language, category): each prompt's accepted mass (α × positions) and its positions."""
    out = {}
    for lang, r in runs.items():
        for t in CATEGORIES:
            rows = [p for p in r["alpha_per_prompt"] if p["category"] == t]
            cnt = np.array([p["positions"] for p in rows], float)
            out[(lang, t)] = (np.array([p["alpha"] for p in rows]) * cnt, cnt)
    return out


def spreads(src: Strata, langs: Sequence[str]) -> dict[str, Any]:
    """The spreads of α across categories (per language) and across languages, and their differences, from sums and
    counts per stratum (scalars: the estimate; arrays of replicates: the bootstrap)."""
    out: dict[str, Any] = {}
    lang_alpha = []
    for lang in langs:
        ts = [src[(lang, t)][0] / src[(lang, t)][1] for t in CATEGORIES]
        out[f"category spread {lang}"] = np.max(ts, axis=0) - np.min(ts, axis=0)
        tot_s = sum(src[(lang, t)][0] for t in CATEGORIES)
        tot_c = sum(src[(lang, t)][1] for t in CATEGORIES)
        lang_alpha.append(tot_s / tot_c)
    out["language spread"] = np.max(lang_alpha, axis=0) - np.min(lang_alpha, axis=0)
    for lang in langs:
        out[f"category spread {lang} − language spread"] = out[f"category spread {lang}"] - out["language spread"]
    mean_category = np.mean([out[f"category spread {lang}"] for lang in langs], axis=0)
    out["mean category spread − language spread"] = mean_category - out["language spread"]
    return out


def spread_table(runs: Mapping[str, dict[str, Any]], rng: np.random.Generator) -> list[str]:
    """The spreads with their percentile-bootstrap intervals, the verdict of each difference, and the basic
    bootstrap beside them."""
    by_stratum = strata(runs)
    reps = {}
    for key, (s, c) in by_stratum.items():
        idx = rng.integers(0, len(s), size=(RESAMPLES, len(s)))
        reps[key] = (s[idx].sum(1), c[idx].sum(1))
    point = {k: (s.sum(), c.sum()) for k, (s, c) in by_stratum.items()}
    est, boot = spreads(point, list(runs)), spreads(reps, list(runs))
    lines = [f"\nSpreads (max − min; 95% percentile bootstrap over prompts within (language, category), {RESAMPLES:,} "
             "resamples, seed 0):\n",
             "| statistic | estimate [95% CI, percentile: registered] | verdict (registered rule) | basic bootstrap "
             "[2·est − q97.5, 2·est − q2.5] (not registered) |",
             "| --- | --- | --- | --- |"]
    for k in est:
        lo, hi = percentile_interval(boot[k])
        verdict = ""
        if "−" in k:
            verdict = "category spread larger" if lo > 0 else "category spread not shown larger"
        e = float(est[k])
        basic = f"[{2 * e - hi:.3f}, {2 * e - lo:.3f}]" + (
            (" larger" if 2 * e - hi > 0 else " not shown larger") if "−" in k else "")
        lines.append(f"| {k} | {fmt(e, lo, hi)} | {verdict} | {basic} |")
    return lines


def page(folder: Path, pairs: Mapping[str, Sequence[str]]) -> list[str]:
    """Every pair's tables, as the page prints them: ``pairs`` maps a pair to its languages, each run in
    ``folder/<pair>-<language>``; a pair without a committed run reads "not run"."""
    lines: list[str] = []
    for pair, langs in pairs.items():
        rng = np.random.default_rng(0)
        runs = {lang: r for lang in langs if (r := load(folder, pair, lang)) is not None}
        lines.append(f"\n### {pair}\n")
        if not runs:
            lines.append("not run\n")
            continue
        lines += alpha_table(runs) + spread_table(runs, rng)
    return lines
