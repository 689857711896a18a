"""Print this page's tables and the registered readings' verdicts from the committed run directories:
python bench/results/adaptive-lookup-smollm2-cpu-20261206/judge.py

Measured: ``evaluate-LANG/`` (``python -m policies.evaluate`` with prompt lookup: AR, the grid's best fixed γ,
``match-length`` tuned in replay and ``ppo`` on 30 held-out prompts). The readings are REGISTERED.md's, fixed
before the runs."""

from __future__ import annotations

from pathlib import Path

from analysis.adaptive_readings import baselines, comparison_lines, exactness_line, goal_lines, runs

HERE = Path(__file__).resolve().parent
LANGUAGES = ("en", "it")
GOAL, FLOOR = 1.10, 0.97  # readings 1 and 2 of REGISTERED.md
LEARNED = "ppo"


def language(lang: str) -> list[str]:
    comparison, requests, cycles, tuning = runs(HERE / f"evaluate-{lang}")
    methods, best_fixed, rule = baselines(comparison, ("match-length",))
    chosen = tuning[tuning["chosen"]]
    lines = [f"\n### {lang}\n",
             f"Best fixed γ on the 12 training prompts: `{best_fixed}`; `match-length` tuned in replay: "
             + ", ".join(f"{p}={v}" for p, v in zip(chosen["parameter"], chosen["value"], strict=True))
             + f". Best non-learned rule on the held-out prompts: `{rule}`.\n",
             *comparison_lines(comparison, no_draft="no-draft cycles")]
    return (lines + goal_lines(requests, cycles, LEARNED, rule, GOAL, FLOOR)
            + exactness_line(requests, methods, 3))


if __name__ == "__main__":
    print("\n".join(line for lang in LANGUAGES for line in language(lang)))
