"""Print this page's tables and the registered readings' verdicts from the committed run directories:
python bench/results/lookup-timed-smollm2-cpu-20261205/judge.py

Measured: ``greedy-LANG/`` and ``t1-LANG/`` (task=bench, AR and prompt lookup at γ = 8); predicted:
``../lookup-prediction-smollm2-cpu-20261205/predict-LANG/prediction.json`` (registered at c3b5515). The readings
are REGISTERED.md's, fixed before the runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from spectune import rundir

HERE = Path(__file__).resolve().parent
PREDICTED = HERE.parent / "lookup-prediction-smollm2-cpu-20261205"
TASKS = ["chat", "summarise", "qa", "translate", "rewrite", "code", "all"]
METHOD, GAMMA = "fixed:gamma=8", 8
WITHIN, FLOOR, COPYABLE, LOWER = 0.10, 1.5, 0.6, 0.97  # readings 1-3 of REGISTERED.md


def per_cycle(cycles: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Per task and overall, as the prediction counts them: decode tokens per cycle (Σ emitted / cycles, cycles
    without a proposal included) and the share of request-cycles that asked for drafts (γ > 0) and got none."""
    mine = cycles[(cycles["method"] == METHOD) & (cycles["gamma"] > 0)]
    out = {task: (float(rows["emitted"].mean()), float((rows["num_drafts"] == 0).mean()))
           for task, rows in mine.groupby("task")}
    out["all"] = (float(mine["emitted"].mean()), float((mine["num_drafts"] == 0).mean()))
    return out


def measured(run: Path) -> tuple[dict[str, dict], dict[str, tuple[float, float]], pd.DataFrame]:
    """The method's by_task rows by task, its tokens per cycle and no-proposal share by task, and the request
    rows."""
    summary = rundir.SUMMARY.read(run)
    requests, cycles = rundir.REQUESTS.read(run), rundir.CYCLES.read(run)
    tasks = requests[["method", "repeat", "request_id", "task"]].drop_duplicates()
    cycles = cycles.merge(tasks, on=["method", "repeat", "request_id"])
    rows = {r["task"]: r for r in summary["by_task"] if r["method"] == METHOD}
    return rows, per_cycle(cycles), requests


def same_outputs(requests: pd.DataFrame) -> tuple[int, int]:
    """Requests whose lookup output equals AR's in the same repeat (greedy lookup must decode as AR), of all."""
    key = ["repeat", "request_id"]
    ar = requests[requests["method"] == "ar"].set_index(key)["output_ids"]
    spec = requests[requests["method"] == METHOD].set_index(key)["output_ids"]
    same = sum(list(spec[k]) == list(ar[k]) for k in spec.index if k in ar.index)
    return same, len(spec)


def greedy(lang: str) -> list[str]:
    predicted = {r["task"]: r for r in rundir.PREDICTION_SUMMARY.read(PREDICTED / f"predict-{lang}")["by_task"]
                 if r["gamma"] == GAMMA}
    rows, share, requests = measured(HERE / f"greedy-{lang}")
    replayed = rundir.PREDICTION.read(PREDICTED / f"predict-{lang}")
    replayed = replayed[replayed["gamma"] == GAMMA].set_index("prompt_id")["output_tokens"]
    ar = requests[(requests["method"] == "ar") & (requests["repeat"] == 0)].set_index("prompt_id")["output_tokens"]
    same, total = same_outputs(requests)
    lines = [f"\n### {lang}, greedy (3 repeats)\n",
             f"Prompts: {len(ar)} timed, {len(replayed)} predicted, {len(set(ar.index) & set(replayed.index))} in "
             f"both; AR output lengths equal to the prediction's on {int((ar == replayed.reindex(ar.index)).sum())}"
             f" of {len(ar)}; lookup output equal to AR's on {same} of {total} requests.\n",
             "| task | copyable fraction | tokens per cycle predicted / measured | no-proposal share predicted / "
             "measured | decode speed-up predicted | measured [95% CI] | measured / predicted | 1: within 10% "
             "| 2: ≥ 1.5× | 3: lower bound ≥ −3% |",
             "| --- " * 10 + "|"]
    for task in TASKS:
        p, m = predicted[task], rows[task]
        ratio = m["decode_speedup"] / p["predicted_speedup"]
        judged = task != "all"
        one = ("pass" if abs(ratio - 1) <= WITHIN else "fail") if judged else "-"
        two = (("pass" if m["decode_speedup"] >= FLOOR else "fail") if p["copyable_fraction"] >= COPYABLE
               else "n/a") if judged else "-"
        three = ("pass" if m["decode_speedup_ci95_lo"] >= LOWER else "fail") if judged else "-"
        tokens, none = share[task]
        lines.append(f"| {task} | {p['copyable_fraction']:.2f} | {p['acceptance_length']:.2f} / "
                     f"{tokens:.2f} | {p['no_proposal_share']:.2f} / {none:.2f} | "
                     f"{p['predicted_speedup']:.2f}× | {m['decode_speedup']:.2f}× [{m['decode_speedup_ci95_lo']:.2f}, "
                     f"{m['decode_speedup_ci95_hi']:.2f}] | {ratio:.3f} | {one} | {two} | {three} |")
    return lines


def sampled(lang: str) -> list[str]:
    rows, share, _ = measured(HERE / f"t1-{lang}")
    lines = [f"\n### {lang}, T = 1 (one repeat; reported, not judged)\n",
             "| task | tokens per cycle | acceptance length | no-proposal share | decode speed-up [95% CI] "
             "| wall speed-up [95% CI] |",
             "| --- " * 6 + "|"]
    for task in TASKS:
        m = rows[task]
        tokens, none = share[task]
        lines.append(f"| {task} | {tokens:.2f} | {m['acceptance_length']:.2f} | {none:.2f} | "
                     f"{m['decode_speedup']:.2f}× "
                     f"[{m['decode_speedup_ci95_lo']:.2f}, {m['decode_speedup_ci95_hi']:.2f}] | "
                     f"{m['speedup']:.2f}× [{m['speedup_ci95_lo']:.2f}, {m['speedup_ci95_hi']:.2f}] |")
    return lines


def main() -> None:
    for lang in ("en", "it"):
        print("\n".join(greedy(lang)))
    for lang in ("en", "it"):
        if (HERE / f"t1-{lang}").exists():
            print("\n".join(sampled(lang)))


if __name__ == "__main__":
    main()
