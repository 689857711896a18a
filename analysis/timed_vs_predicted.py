"""A timed run of a model-free draft judged against the replay's registered prediction, per category.

``task=predict`` writes, before any timed run, the decode speed-up replay predicts for each category at each γ
(``prediction.json``'s ``by_category``); ``task=bench`` then times AR and the draft at one γ on the same prompts. This
module prints the side-by-side table a results page registers its readings on — the prediction and the measurement
of each category, and three verdicts: the measurement within ``within`` of the prediction, at least ``floor``× AR where
the category's copyable fraction is at least ``copyable``, and the interval's lower bound at least ``lower``× AR — plus
the per-category table of a run nothing was predicted for (T = 1). Every figure comes from the run directories; the
pages' ``judge.py`` scripts only name them and the registered thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectune.methods import BASELINE, Method
from spectune.run import rundir
from spectune.stats.by_category import ALL
from workloads.categories import CATEGORIES

ROWS = (*CATEGORIES, ALL)  # every built category, then the overall row


@dataclass(frozen=True)
class Readings:
    """A page's registered thresholds: |measured / predicted − 1| ≤ ``within``; measured ≥ ``floor`` where the
    copyable fraction is ≥ ``copyable``; the interval's lower bound ≥ ``lower``."""

    within: float = 0.10
    floor: float = 1.5
    copyable: float = 0.6
    lower: float = 0.97


def per_cycle(cycles: pd.DataFrame, method: str) -> dict[str, tuple[float, float]]:
    """Per category and overall, as the prediction counts them: decode tokens per cycle (Σ emitted / cycles, cycles
    without a proposal included) and the share of request-cycles that asked for drafts (γ > 0) and got none."""
    mine = cycles[(cycles["method"] == method) & (cycles["gamma"] > 0)]
    out = {category: (float(rows["emitted"].mean()), float((rows["num_drafts"] == 0).mean()))
           for category, rows in mine.groupby("category")}
    out["all"] = (float(mine["emitted"].mean()), float((mine["num_drafts"] == 0).mean()))
    return out


def measured(run: Path, method: str) -> tuple[dict[str, dict], dict[str, tuple[float, float]], pd.DataFrame]:
    """The method's by_category rows by category, its tokens per cycle and no-proposal share by category, and the
    request rows."""
    summary = rundir.SUMMARY.read(run)
    requests, cycles = rundir.REQUESTS.read(run), rundir.CYCLES.read(run)
    categories = requests[["method", "repeat", "request_id", "category"]].drop_duplicates()
    cycles = cycles.merge(categories, on=["method", "repeat", "request_id"])
    rows = {r["category"]: r for r in summary["by_category"] if r["method"] == method}
    return rows, per_cycle(cycles, method), requests


def same_outputs(requests: pd.DataFrame, method: str) -> tuple[int, int]:
    """Requests whose output equals AR's in the same repeat (greedy drafting must decode as AR), of all."""
    key = ["repeat", "request_id"]
    ar = requests[requests["method"] == BASELINE].set_index(key)["output_ids"]
    spec = requests[requests["method"] == method].set_index(key)["output_ids"]
    same = sum(list(spec[k]) == list(ar[k]) for k in spec.index if k in ar.index)
    return same, len(spec)


def greedy_table(lang: str, run: Path, predicted: Path, gamma: int, draft: str, repeats: str,
                 readings: Readings = Readings()) -> list[str]:
    """The judged table of one language: ``run`` (task=bench, AR and ``fixed:gamma=<gamma>``) against
    ``predicted`` (task=predict) at ``gamma``; ``draft`` names the proposer in the text, ``repeats`` the run's."""
    method = Method.fixed(gamma).label
    prediction = {r["category"]: r for r in rundir.PREDICTION_SUMMARY.read(predicted)["by_category"]
                  if r["gamma"] == gamma}
    rows, share, requests = measured(run, method)
    replayed = rundir.PREDICTION.read(predicted)
    replayed = replayed[replayed["gamma"] == gamma].set_index("prompt_id")["output_tokens"]
    ar = requests[(requests["method"] == BASELINE) & (requests["repeat"] == 0)].set_index("prompt_id")["output_tokens"]
    same, total = same_outputs(requests, method)
    lines = [f"\n### {lang}, greedy ({repeats})\n",
             f"Prompts: {len(ar)} timed, {len(replayed)} predicted, {len(set(ar.index) & set(replayed.index))} in "
             f"both; AR output lengths equal to the prediction's on {int((ar == replayed.reindex(ar.index)).sum())}"
             f" of {len(ar)}; {draft} output equal to AR's on {same} of {total} requests.\n",
             "| category | copyable fraction | tokens per cycle predicted / measured | no-proposal share predicted / "
             "measured | decode speed-up predicted | measured [95% CI] | measured / predicted | 1: within "
             f"{100 * readings.within:.0f}% | 2: ≥ {readings.floor:g}× | 3: lower bound ≥ "
             f"−{100 * (1 - readings.lower):.0f}% |",
             "| --- " * 10 + "|"]
    for category in ROWS:
        p, m = prediction[category], rows[category]
        ratio = m["decode_speedup"] / p["predicted_speedup"]
        judged = category != "all"
        one = ("pass" if abs(ratio - 1) <= readings.within else "fail") if judged else "-"
        two = (("pass" if m["decode_speedup"] >= readings.floor else "fail")
               if p["copyable_fraction"] >= readings.copyable else "n/a") if judged else "-"
        three = ("pass" if m["decode_speedup_ci95_lo"] >= readings.lower else "fail") if judged else "-"
        tokens, none = share[category]
        lines.append(f"| {category} | {p['copyable_fraction']:.2f} | {p['acceptance_length']:.2f} / "
                     f"{tokens:.2f} | {p['no_proposal_share']:.2f} / {none:.2f} | "
                     f"{p['predicted_speedup']:.2f}× | {m['decode_speedup']:.2f}× [{m['decode_speedup_ci95_lo']:.2f}, "
                     f"{m['decode_speedup_ci95_hi']:.2f}] | {ratio:.3f} | {one} | {two} | {three} |")
    return lines


def sampled_table(lang: str, run: Path, gamma: int, heading: str | None = None,
                  same_as_ar: bool = False) -> list[str]:
    """The reported (not judged) per-category table of a run of one repeat (by default a T = 1 run's heading);
    ``same_as_ar``: then how many requests decoded exactly AR's output (a greedy run must)."""
    method = Method.fixed(gamma).label
    rows, share, requests = measured(run, method)
    lines = [f"\n### {heading or f'{lang}, T = 1 (one repeat; reported, not judged)'}\n",
             "| category | tokens per cycle | acceptance length | no-proposal share | decode speed-up [95% CI] "
             "| wall speed-up [95% CI] |",
             "| --- " * 6 + "|"]
    for category in ROWS:
        m = rows[category]
        tokens, none = share[category]
        lines.append(f"| {category} | {tokens:.2f} | {m['acceptance_length']:.2f} | {none:.2f} | "
                     f"{m['decode_speedup']:.2f}× "
                     f"[{m['decode_speedup_ci95_lo']:.2f}, {m['decode_speedup_ci95_hi']:.2f}] | "
                     f"{m['speedup']:.2f}× [{m['speedup_ci95_lo']:.2f}, {m['speedup_ci95_hi']:.2f}] |")
    if same_as_ar:
        same, total = same_outputs(requests, method)
        lines.append(f"\nOutput equal to AR's on {same} of {total} requests.")
    return lines
