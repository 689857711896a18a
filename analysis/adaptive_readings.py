"""What the adaptive-γ results pages judge from a ``policies.evaluate`` run directory: speed-ups against any method
with the product's paired intervals, the comparison table as the pages print it, and how often each method verified
nothing. Every figure comes from the run's files; a page's ``judge.py`` only names its runs and registered thresholds.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.timed_vs_predicted import same_outputs
from spectune.methods import BASELINE, is_fixed_label
from spectune.run import rundir
from spectune.stats.by_category import by_category

NO_DRAFT = "cycles with γ 0 chosen before drafting"  # the comparison's no_draft_cycles_pct column, as pages name it


def runs(run: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The comparison rows, held-out requests and cycles, and the tuning table of one evaluate run."""
    return (rundir.COMPARISON.read(run), rundir.REQUESTS.read(run), rundir.CYCLES.read(run), rundir.TUNING.read(run))


def baselines(comparison: pd.DataFrame, rules: tuple[str, ...]) -> tuple[list[str], str, str]:
    """The run's methods in order, its best fixed γ (the grid's, as the comparison labels it) and the best
    non-learned rule on the held-out prompts: the fastest by decode tok/s of that fixed γ and ``rules``."""
    methods = list(dict.fromkeys(comparison["method"]))
    best_fixed = next(m for m in methods if is_fixed_label(m))
    rate = dict(zip(comparison["method"], comparison["decode_tok_s"], strict=True))
    return methods, best_fixed, max([best_fixed, *rules], key=lambda m: rate[m])


def against(requests: pd.DataFrame, cycles: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Every method's decode speed-up over ``baseline`` per category and overall (the product's paired intervals,
    prompt as the unit). Only the decode columns are read: the wall-clock ones need each run's duration, which
    stands in here as the sum of its requests' E2E latencies (concurrency 1)."""
    durations = {(str(m), int(r)): float(rows["e2el_ms"].sum()) / 1e3
                 for (m, r), rows in requests.groupby(["method", "repeat"])}
    return by_category(requests, cycles, durations, baseline=baseline)


def value(v: object) -> object:
    """A tuned value as its policy takes it (tuning.csv's column mixes integers and floats)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def interval(row: pd.Series) -> str:
    """A speed-up row as "+x.x% [lo, hi]"."""
    return (f"{100 * (row['decode_speedup'] - 1):+.1f}% [{100 * (row['decode_speedup_ci95_lo'] - 1):+.1f}, "
            f"{100 * (row['decode_speedup_ci95_hi'] - 1):+.1f}]")


def comparison_lines(comparison: pd.DataFrame, no_draft: str = NO_DRAFT) -> list[str]:
    """The run's comparison as a Markdown table; ``no_draft`` heads the column of cycles that verified nothing."""
    lines = ["| method | decode tok/s | over AR [95% CI] | over the best fixed γ [95% CI] | acceptance length | "
             f"{no_draft} | held-out replay over the best fixed γ in hindsight | the hindsight oracle over it |",
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
    return lines


def abstention(cycles: pd.DataFrame) -> pd.DataFrame:
    """Per method: the share of its cycles that verified nothing, the share of those that came after the request's
    last verified chain (once a request stops speculating and never starts again, every later cycle is there), the
    requests that ended in such a run of 50 cycles or more, and those that verified one chain and no other."""
    rows = []
    for method, own in cycles.groupby("method", sort=False):
        none = trailing = stuck = single = requests = 0
        for _, request in own.sort_values("cycle").groupby(["repeat", "request_id"]):
            drafted = request["num_drafts"].to_numpy() > 0
            after = len(drafted) - (drafted.nonzero()[0].max() + 1 if drafted.any() else 0)
            none += int((~drafted).sum())
            trailing += after
            stuck += after >= 50
            single += int(drafted.sum()) == 1
            requests += 1
        rows.append({"method": method, "no_draft_pct": 100 * none / len(own),
                     "after_last_draft_pct": 100 * trailing / none if none else 0.0, "stuck": stuck,
                     "one_chain": single, "requests": requests})
    return pd.DataFrame(rows)


def goal_lines(requests: pd.DataFrame, cycles: pd.DataFrame, learned: str, rule: str, goal: float,
               floor: float) -> list[str]:
    """The adaptive goal's readings: ``learned`` at least ``goal``× ``rule`` overall with a lower bound above 1
    (reading 1), and per category a lower bound of at least ``floor``× (reading 2)."""
    mine = against(requests, cycles, rule)
    mine = mine[mine["method"] == learned].set_index("category")
    overall = mine.loc["all"]
    one = "pass" if overall["decode_speedup"] >= goal and overall["decode_speedup_ci95_lo"] > 1 else "fail"
    lines = ["", f"Reading 1 (`{learned}` ≥ {100 * (goal - 1):+.0f}% over `{rule}`, lower bound > 0): "
             f"{interval(overall)} over {int(overall['prompts'])} prompts — **{one}**.", "",
             f"| category | prompts | `{learned}` over `{rule}` [95% CI] | reading 2: lower bound ≥ "
             f"−{100 * (1 - floor):.0f}% |",
             "| --- | --- | --- | --- |"]
    for category, r in mine.drop(index="all").iterrows():
        lo = r["decode_speedup_ci95_lo"]
        two = "no interval" if pd.isna(lo) else "pass" if lo >= floor else "fail"
        lines.append(f"| {category} | {int(r['prompts'])} | {interval(r)} | {two} |")
    return lines


def exactness_line(requests: pd.DataFrame, methods: list[str], reading: int) -> list[str]:
    """Reading ``reading``: every method's greedy output equals AR's, request by request."""
    exact = {m: same_outputs(requests, m) for m in methods if m != BASELINE}
    verdict = "pass" if all(same == total for same, total in exact.values()) else "fail"
    return ["", f"Reading {reading} (greedy output equals AR's): "
            + ", ".join(f"`{m}` {same}/{total}" for m, (same, total) in exact.items()) + f" — **{verdict}**."]
