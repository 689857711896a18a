"""Print this page's tables and the registered readings' verdicts from the committed run directories:
python bench/results/adaptive-suffix-smollm2-cpu-20261206/judge.py

Measured: ``evaluate-LANG/`` (``python -m policies.evaluate`` with suffix decoding: AR, the grid's best fixed γ,
``suffix-prob`` and ``match-length`` tuned in replay, and ``ppo`` on 24 held-out prompts). The readings are
REGISTERED.md's, fixed before the runs."""

from __future__ import annotations

from pathlib import Path

from analysis.adaptive_readings import (
    abstention,
    against,
    baselines,
    comparison_lines,
    exactness_line,
    goal_lines,
    interval,
    runs,
    value,
)

HERE = Path(__file__).resolve().parent
LANGUAGES = ("en", "it")
GOAL, FLOOR = 1.10, 0.97  # readings 1 and 2 of REGISTERED.md
LEARNED = "ppo"


def language(lang: str) -> list[str]:
    comparison, requests, cycles, tuning = runs(HERE / f"evaluate-{lang}")
    methods, best_fixed, rule = baselines(comparison, ("suffix-prob", "match-length"))
    chosen = tuning[tuning["chosen"]]
    lines = [f"\n### {lang}\n",
             f"Best fixed γ on the 12 training prompts: `{best_fixed}`; tuned in replay: "
             + ", ".join(f"`{n}` {p}={value(v)}" for n, p, v in zip(chosen["policy"], chosen["parameter"],
                                                                      chosen["value"], strict=True))
             + f". Best non-learned rule on the held-out prompts: `{rule}`.\n", *comparison_lines(comparison)]
    lines += goal_lines(requests, cycles, LEARNED, rule, GOAL, FLOOR)
    lines += exactness_line(requests, methods, 3)
    stops = abstention(cycles)
    lines += ["", "| method | cycles verifying nothing | of those, after the request's last verified chain | "
              "requests ending in ≥ 50 such cycles |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.method} | {r.no_draft_pct:.1f}% | {r.after_last_draft_pct:.1f}% | {r.stuck}/{r.requests} |"
              for r in stops.itertuples() if r.method != "ar"]
    threshold = against(requests, cycles, best_fixed)
    prob = threshold[(threshold["method"] == "suffix-prob") & (threshold["category"] == "all")].iloc[0]
    four = "pass" if prob["decode_speedup"] > 1 else "fail"
    lines += ["", f"Reading 4 (`suffix-prob` faster than `{best_fixed}`, point estimate > 0): {interval(prob)} — "
              f"**{four}**."]
    return lines


if __name__ == "__main__":
    print("\n".join(line for lang in LANGUAGES for line in language(lang)))
