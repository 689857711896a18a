"""Tables of this page from the committed run directories (their acceptance.json only).

python bench/results/alpha-tasks-smollm2-cpu-20261205/spread.py   # prints the markdown tables and the spreads

The same computation as bench/results/alpha-tasks-cpu-20261204/spread.py (registered there), on these runs:

Per (pair, language, task) α and its interval are the product's own (`alpha_by_task`), per (pair, language) the run's
`alpha` / `alpha_ci95_over_prompts`. The spreads (max − min) and their intervals are the registered percentile
bootstrap: 10,000 resamples of prompts within each (language, task) stratum, seed 0 per pair, every statistic on the
same resample. `tiny48` is the amendment's larger tiny set (8 prompts per task, 128 new tokens). The basic-bootstrap
column (2·estimate − the percentile bounds) is a sensitivity check added after the runs, not registered: it reflects the
upward bias of a max − min statistic, which the percentile interval does not.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from spectune import rundir

HERE = Path(__file__).resolve().parent
TASKS = ["chat", "summarise", "qa", "translate", "rewrite", "code"]
PAIRS = {"smollm2-eagle": ["en", "it"], "smollm2": ["en", "it"]}
B = 10_000


def load(pair: str, lang: str) -> dict | None:
    run = HERE / f"{pair}-{lang}"
    return rundir.ACCEPTANCE.read(run) if rundir.ACCEPTANCE.exists(run) else None


def fmt(a: float, lo: float, hi: float) -> str:
    return f"{a:.3f} [{lo:.3f}, {hi:.3f}]"


def pct(x: np.ndarray) -> tuple[float, float]:
    return float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))


def main() -> None:
    for pair, langs in PAIRS.items():
        rng = np.random.default_rng(0)  # per pair: a pair's intervals do not depend on which other runs exist
        runs = {lang: r for lang in langs if (r := load(pair, lang)) is not None}
        print(f"\n### {pair}\n")
        if not runs:
            print("not run\n")
            continue
        print("| language | " + " | ".join(TASKS) + " | all tasks | prompts | positions |")
        print("| --- | " + " | ".join("---" for _ in TASKS) + " | --- | --- | --- |")
        for lang, r in runs.items():
            bt = r["alpha_by_task"]
            cells = [fmt(bt[t]["alpha"], bt[t]["alpha_ci95_lo"], bt[t]["alpha_ci95_hi"]) + f" ({bt[t]['prompts']}p, "
                     f"{bt[t]['positions']})" for t in TASKS]
            ci = r["alpha_ci95_over_prompts"]
            n_pos = sum(p["positions"] for p in r["alpha_per_prompt"])
            print(f"| {lang} | " + " | ".join(cells) + f" | {fmt(r['alpha'], ci['lo'], ci['hi'])} | "
                  f"{len(r['alpha_per_prompt'])} | {n_pos} |")
        print("\nCells: α [95% CI over the task's prompts] (prompts, positions). Target stopped (share of prompts):")
        for lang, r in runs.items():
            print(f"{lang}: " + ", ".join(f"{t} {r['alpha_by_task'][t]['stop_share']:.2f}" for t in TASKS) + ";")
        # strata: per (lang, task) arrays of (sum, count) per prompt
        strata = {}
        for lang, r in runs.items():
            for t in TASKS:
                rows = [p for p in r["alpha_per_prompt"] if p["task"] == t]
                cnt = np.array([p["positions"] for p in rows], float)
                strata[(lang, t)] = (np.array([p["alpha"] for p in rows]) * cnt, cnt)
        # point estimates and bootstrap replicates of per-(lang, task) sums and counts
        reps = {}
        for key, (s, c) in strata.items():
            idx = rng.integers(0, len(s), size=(B, len(s)))
            reps[key] = (s[idx].sum(1), c[idx].sum(1))
        point = {k: (s.sum(), c.sum()) for k, (s, c) in strata.items()}

        def stats(src: dict, runs: list = runs) -> dict:
            out = {}
            lang_alpha = []
            for lang in runs:
                ts = [src[(lang, t)][0] / src[(lang, t)][1] for t in TASKS]
                out[f"task spread {lang}"] = np.max(ts, axis=0) - np.min(ts, axis=0)
                tot_s = sum(src[(lang, t)][0] for t in TASKS)
                tot_c = sum(src[(lang, t)][1] for t in TASKS)
                lang_alpha.append(tot_s / tot_c)
            out["language spread"] = np.max(lang_alpha, axis=0) - np.min(lang_alpha, axis=0)
            for lang in runs:
                out[f"task spread {lang} − language spread"] = out[f"task spread {lang}"] - out["language spread"]
            mean_task = np.mean([out[f"task spread {lang}"] for lang in runs], axis=0)
            out["mean task spread − language spread"] = mean_task - out["language spread"]
            return out

        est, boot = stats(point), stats(reps)
        print(f"\nSpreads (max − min; 95% percentile bootstrap over prompts within (language, task), {B:,} "
              "resamples, seed 0):\n")
        print("| statistic | estimate [95% CI, percentile: registered] | verdict (registered rule) | basic bootstrap "
              "[2·est − q97.5, 2·est − q2.5] (not registered) |")
        print("| --- | --- | --- | --- |")
        for k in est:
            lo, hi = pct(boot[k])
            verdict = ""
            if "−" in k:
                verdict = "task spread larger" if lo > 0 else "task spread not shown larger"
            e = float(est[k])
            basic = f"[{2 * e - hi:.3f}, {2 * e - lo:.3f}]" + (
                (" larger" if 2 * e - hi > 0 else " not shown larger") if "−" in k else "")
            print(f"| {k} | {fmt(e, lo, hi)} | {verdict} | {basic} |")


if __name__ == "__main__":
    main()
