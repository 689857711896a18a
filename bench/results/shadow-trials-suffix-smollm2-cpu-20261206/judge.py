"""Print this page's table and the registered readings' verdicts from the committed run directories:
python bench/results/shadow-trials-suffix-smollm2-cpu-20261206/judge.py

Measured: ``evaluate-en/`` (``python -m policies.evaluate`` with suffix decoding, the PPO file of
``../adaptive-suffix-smollm2-cpu-20261206/evaluate-en/train/c1`` with shadow acceptance tests, AR, γ 12, ``suffix-prob``
and ``match-length`` tuned in replay, on the same 24 held-out prompts). The earlier run's figures beside them are read
from that page's run directory. The readings are REGISTERED.md's, fixed before the run."""

from __future__ import annotations

from pathlib import Path

from analysis.adaptive_readings import (
    abstention,
    against,
    baselines,
    comparison_lines,
    exactness_line,
    interval,
    runs,
    value,
)

HERE = Path(__file__).resolve().parent
EARLIER = HERE.parent / "adaptive-suffix-smollm2-cpu-20261206" / "evaluate-en"
TRAP_FLOOR, NO_DRAFT_MAX, ONE_CHAIN_MAX, GOAL = 0.85, 70.0, 5, 1.10  # readings 1-3 of REGISTERED.md
LEARNED = "ppo"


def main() -> list[str]:
    comparison, requests, cycles, tuning = runs(HERE / "evaluate-en")
    _, earlier_requests, earlier_cycles, _ = runs(EARLIER)
    methods, best_fixed, rule = baselines(comparison, ("suffix-prob", "match-length"))
    chosen = tuning[tuning["chosen"]]
    lines = ["### en (shadow acceptance tests)\n",
             f"Best fixed γ on the 12 training prompts: `{best_fixed}`; tuned in replay: "
             + ", ".join(f"`{n}` {p}={value(v)}" for n, p, v in zip(chosen["policy"], chosen["parameter"],
                                                                      chosen["value"], strict=True))
             + f". Best non-learned rule on the held-out prompts: `{rule}`.\n", *comparison_lines(comparison)]

    now = against(requests, cycles, best_fixed).set_index(["method", "category"])
    before = against(earlier_requests, earlier_cycles, best_fixed).set_index(["method", "category"])
    lines += ["", f"| method over `{best_fixed}` | this run (shadow tests) | the earlier run (none) |",
              "| --- | --- | --- |"]
    lines += [f"| {m} | {interval(now.loc[(m, 'all')])} | {interval(before.loc[(m, 'all')])} |"
              for m in ("suffix-prob", "match-length", LEARNED)]

    ppo = now.loc[(LEARNED, "all")]
    one = "pass" if ppo["decode_speedup"] >= TRAP_FLOOR else "fail"
    lines += ["", f"Reading 1 (`{LEARNED}` over `{best_fixed}`, point estimate ≥ −15%): {interval(ppo)} — **{one}**."]

    stops = {r.method: r for r in abstention(cycles).itertuples()}
    stops_before = {r.method: r for r in abstention(earlier_cycles).itertuples()}
    lines += ["", "| method | run | cycles verifying nothing | of those, after the request's last verified chain | "
              "requests ending in ≥ 50 such cycles | requests verifying one chain and no other |",
              "| --- | --- | --- | --- | --- | --- |"]
    for method in ("suffix-prob", "match-length", LEARNED):
        for label, table in (("this", stops), ("earlier", stops_before)):
            r = table[method]
            lines.append(f"| {method} | {label} | {r.no_draft_pct:.1f}% | {r.after_last_draft_pct:.1f}% | "
                         f"{r.stuck}/{r.requests} | {r.one_chain}/{r.requests} |")
    mine = stops[LEARNED]
    two = "pass" if mine.no_draft_pct <= NO_DRAFT_MAX and mine.one_chain <= ONE_CHAIN_MAX else "fail"
    lines += ["", f"Reading 2 (`{LEARNED}`: ≤ 70% of cycles verify nothing and ≤ 5 requests verify one chain only): "
              f"{mine.no_draft_pct:.1f}%, {mine.one_chain}/{mine.requests} — **{two}**."]

    goal = against(requests, cycles, rule).set_index(["method", "category"]).loc[(LEARNED, "all")]
    three = "pass" if goal["decode_speedup"] >= GOAL and goal["decode_speedup_ci95_lo"] > 1 else "fail"
    lines += ["", f"Reading 3 (`{LEARNED}` ≥ +10% over `{rule}`, lower bound > 0): {interval(goal)} over "
              f"{int(goal['prompts'])} prompts — **{three}**."]

    return lines + exactness_line(requests, methods, 4)


if __name__ == "__main__":
    print("\n".join(main()))
