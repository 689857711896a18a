"""Print this page's tables and the registered readings' verdicts from the committed run directories:
python bench/results/adaptive-suffix-smollm2-cpu-20261206/judge.py

Measured: ``evaluate-LANG/`` (``python -m policies.evaluate`` with suffix decoding: AR, the grid's best fixed γ,
``suffix-prob`` and ``match-length`` tuned in replay, and ``ppo`` on 24 held-out prompts). The readings are
REGISTERED.md's, fixed before the runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.timed_vs_predicted import same_outputs
from spectune import rundir
from spectune.stats.by_task import by_task

HERE = Path(__file__).resolve().parent
LANGUAGES = ("en", "it")
GOAL, FLOOR = 1.10, 0.97  # readings 1 and 2 of REGISTERED.md
LEARNED = "ppo"


def runs(lang: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The comparison rows, held-out requests and cycles, and the tuning table of one language's run."""
    run = HERE / f"evaluate-{lang}"
    return (rundir.COMPARISON.read(run), rundir.REQUESTS.read(run), rundir.CYCLES.read(run),
            rundir.TUNING.read(run))


def against(requests: pd.DataFrame, cycles: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Every method's decode speed-up over ``baseline`` per task and overall (the product's paired intervals,
    prompt as the unit). Only the decode columns are read: the wall-clock ones need each run's duration, which
    stands in here as the sum of its requests' E2E latencies (concurrency 1)."""
    durations = {(str(m), int(r)): float(rows["e2el_ms"].sum()) / 1e3
                 for (m, r), rows in requests.groupby(["method", "repeat"])}
    return by_task(requests, cycles, durations, baseline=baseline)


def value(v: object) -> object:
    """A tuned value as its policy takes it (tuning.csv's column mixes integers and floats)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def interval(row: pd.Series) -> str:
    return (f"{100 * (row['decode_speedup'] - 1):+.1f}% [{100 * (row['decode_speedup_ci95_lo'] - 1):+.1f}, "
            f"{100 * (row['decode_speedup_ci95_hi'] - 1):+.1f}]")


def abstention(cycles: pd.DataFrame) -> pd.DataFrame:
    """Per method: the share of its cycles that verified nothing, the share of those that came after the request's
    last verified chain (once a request stops speculating and never starts again, every later cycle is there), and
    the requests that ended in such a run of 50 cycles or more."""
    rows = []
    for method, own in cycles.groupby("method", sort=False):
        none = trailing = stuck = requests = 0
        for _, request in own.sort_values("cycle").groupby(["repeat", "request_id"]):
            drafted = request["num_drafts"].to_numpy() > 0
            after = len(drafted) - (drafted.nonzero()[0].max() + 1 if drafted.any() else 0)
            none += int((~drafted).sum())
            trailing += after
            stuck += after >= 50
            requests += 1
        rows.append({"method": method, "no_draft_pct": 100 * none / len(own),
                     "after_last_draft_pct": 100 * trailing / none if none else 0.0, "stuck": stuck,
                     "requests": requests})
    return pd.DataFrame(rows)


def language(lang: str) -> list[str]:
    comparison, requests, cycles, tuning = runs(lang)
    methods = list(dict.fromkeys(comparison["method"]))
    best_fixed = next(m for m in methods if m.startswith("fixed:"))
    rules = [best_fixed, "suffix-prob", "match-length"]
    rate = dict(zip(comparison["method"], comparison["decode_tok_s"], strict=True))
    rule = max(rules, key=lambda m: rate[m])
    chosen = tuning[tuning["chosen"]]
    lines = [f"\n### {lang}\n",
             f"Best fixed γ on the 12 training prompts: `{best_fixed}`; tuned in replay: "
             + ", ".join(f"`{n}` {p}={value(v)}" for n, p, v in zip(chosen["policy"], chosen["parameter"],
                                                                      chosen["value"], strict=True))
             + f". Best non-learned rule on the held-out prompts: `{rule}`.\n",
             "| method | decode tok/s | over AR [95% CI] | over the best fixed γ [95% CI] | acceptance length | "
             "cycles with γ 0 chosen before drafting | held-out replay over the best fixed γ in hindsight | "
             "the hindsight oracle over it |",
             "| --- " * 8 + "|"]
    for _, r in comparison.iterrows():
        def pct(key: str, r: pd.Series = r) -> str:
            v, lo, hi = r[key], r[f"{key}_ci95_lo"], r[f"{key}_ci95_hi"]
            return "–" if pd.isna(v) else f"{v:+.1f}% [{lo:+.1f}, {hi:+.1f}]" if pd.notna(lo) else f"{v:+.1f}%"
        replay = "–" if pd.isna(r["replay_vs_best_fixed_pct"]) else f"{r['replay_vs_best_fixed_pct']:+.1f}%"
        oracle = "–" if pd.isna(r["oracle_vs_best_fixed_pct"]) else f"{r['oracle_vs_best_fixed_pct']:+.1f}%"
        acc = "–" if pd.isna(r["acceptance_length"]) else f"{r['acceptance_length']:.2f}"
        lines.append(f"| {r['method']} | {r['decode_tok_s']:.1f} | {pct('decode_vs_ar_pct')} | "
                     f"{pct('decode_vs_best_fixed_pct')} | {acc} | {r['no_draft_cycles_pct']:.0f}% | {replay} | "
                     f"{oracle} |")
    table = against(requests, cycles, rule)
    mine = table[table["method"] == LEARNED].set_index("task")
    overall = mine.loc["all"]
    one = "pass" if overall["decode_speedup"] >= GOAL and overall["decode_speedup_ci95_lo"] > 1 else "fail"
    lines += ["", f"Reading 1 (`{LEARNED}` ≥ +10% over `{rule}`, lower bound > 0): {interval(overall)} over "
              f"{int(overall['prompts'])} prompts — **{one}**.", "",
              f"| task | prompts | `{LEARNED}` over `{rule}` [95% CI] | reading 2: lower bound ≥ −3% |",
              "| --- | --- | --- | --- |"]
    for task, r in mine.drop(index="all").iterrows():
        lo = r["decode_speedup_ci95_lo"]
        two = "no interval" if pd.isna(lo) else "pass" if lo >= FLOOR else "fail"
        lines.append(f"| {task} | {int(r['prompts'])} | {interval(r)} | {two} |")
    exact = {m: same_outputs(requests, m) for m in methods if m != "ar"}
    three = "pass" if all(same == total for same, total in exact.values()) else "fail"
    lines += ["", "Reading 3 (greedy output equals AR's): "
              + ", ".join(f"`{m}` {same}/{total}" for m, (same, total) in exact.items()) + f" — **{three}**."]
    stops = abstention(cycles)
    lines += ["", "| method | cycles verifying nothing | of those, after the request's last verified chain | "
              "requests ending in ≥ 50 such cycles |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.method} | {r.no_draft_pct:.1f}% | {r.after_last_draft_pct:.1f}% | {r.stuck}/{r.requests} |"
              for r in stops.itertuples() if r.method != "ar"]
    threshold = against(requests, cycles, best_fixed)
    prob = threshold[(threshold["method"] == "suffix-prob") & (threshold["task"] == "all")].iloc[0]
    four = "pass" if prob["decode_speedup"] > 1 else "fail"
    lines += ["", f"Reading 4 (`suffix-prob` faster than `{best_fixed}`, point estimate > 0): {interval(prob)} — "
              f"**{four}**."]
    return lines


if __name__ == "__main__":
    print("\n".join(line for lang in LANGUAGES for line in language(lang)))
