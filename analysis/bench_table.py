"""The bench's one-glance table: per method tokens/s, speedup vs AR with its CI and what that interval resolves,
which method is best and which are indistinguishable from it, the MAD rule's pick, acceptance length, latency,
memory, goodput; under it the unit of the intervals, where their variance comes from and the smallest effect
they resolve.

It reads the per-method entries of summary.json (``methods``); entries of runs without repeats (no CI
fields) still work: the speedup is then computed from the throughputs and shown without an interval.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd

from spectune.methods import BASELINE

COLUMNS = {
    "output_throughput": "tok/s",
    "speedup": "speedup",
    "speedup_ci": "95% CI",
    "speedup_verdict": "vs ar",
    "rank": "rank",
    "spec_decode_acceptance_length": "acc_len",
    "p50_ttft_ms": "TTFT p50 ms",
    "p99_ttft_ms": "TTFT p99 ms",
    "p50_tpot_ms": "TPOT p50 ms",
    "p99_tpot_ms": "TPOT p99 ms",
    "peak_mb": "peak MB",
}
GOODPUT_COLUMNS = {"request_goodput": "goodput req/s", "slo_p99": "p99 SLO"}
MIN_P99_SAMPLES = 100


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _ci(lo: Any, hi: Any) -> str:
    return f"[{lo:.2f}, {hi:.2f}]" if _finite(lo) and _finite(hi) else "-"


def _rank(entry: dict[str, Any], ranking: dict[str, Any]) -> str:
    tp = ranking.get("output_throughput") or {}
    marks = []
    if entry["method"] == tp.get("best"):
        marks.append("best" if tp.get("best_resolved", True) else "top (not resolved)")
    elif entry["method"] in (tp.get("indistinguishable") or []):
        marks.append("≈best")
    if entry["method"] == tp.get("mad_pick"):
        marks.append("MAD")
    gp = ranking.get("request_goodput") or {}
    if gp and entry["method"] == gp.get("best"):
        marks.append("best goodput")
    elif gp and entry["method"] in (gp.get("indistinguishable") or []):
        marks.append("≈best goodput")
    return ", ".join(marks)


def bench_table(summaries: list[dict[str, Any]], ranking: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per method; speedup = paired pooled-throughput ratio vs AR when measured with CIs, else
    output throughput / the AR baseline's (same run, same prompts)."""
    ranking = ranking or {}
    frame = pd.DataFrame(summaries)
    if frame.empty:
        return frame
    for key in ("output_throughput", "peak_rss_bytes", "speedup", "speedup_ci95_lo", "speedup_ci95_hi"):
        if key not in frame:
            frame[key] = float("nan")
    if "speedup_verdict" not in frame:
        frame["speedup_verdict"] = "-"
    frame["speedup_verdict"] = [("-" if m == BASELINE or not isinstance(v, str) else v)
                                for m, v in zip(frame["method"], frame["speedup_verdict"], strict=True)]
    base = frame.loc[frame["method"] == BASELINE, "output_throughput"]
    base_tps = float(base.iloc[0]) if len(base) and pd.notna(base.iloc[0]) else None
    ratio = frame["output_throughput"] / base_tps if base_tps else float("nan")
    frame["speedup"] = frame["speedup"].astype(float).fillna(ratio) if base_tps else frame["speedup"]
    frame["speedup_ci"] = [_ci(lo, hi) for lo, hi in zip(frame["speedup_ci95_lo"], frame["speedup_ci95_hi"],
                                                          strict=True)]
    frame["rank"] = [_rank(e, ranking) for e in frame.to_dict("records")]
    memory = frame["peak_allocated_bytes"] if "peak_allocated_bytes" in frame else frame["peak_rss_bytes"]
    frame["peak_mb"] = memory / 2**20
    for name in ("ttft", "tpot"):  # a p99 of fewer than 100 samples is the maximum in disguise: not shown
        if f"{name}_samples" in frame and f"p99_{name}_ms" in frame:
            few = frame[f"{name}_samples"].fillna(0) < MIN_P99_SAMPLES
            frame[f"p99_{name}_ms"] = frame[f"p99_{name}_ms"].where(~few)
    columns = dict(COLUMNS)
    if "request_goodput" in frame:
        frame["slo_p99"] = ["-" if not isinstance(v, bool) else ("pass" if v else "FAIL")
                            for v in frame.get("slo_p99_pass", pd.Series([None] * len(frame)))]
        columns.update(GOODPUT_COLUMNS)
    for key in columns:
        if key not in frame:
            frame[key] = float("nan")
    table = frame[["method", "status", *columns]].rename(columns=columns)
    return table.set_index("method")


def format_table(table: pd.DataFrame) -> str:
    return table.to_string(float_format=lambda v: f"{v:,.2f}", na_rep="-")


def format_ranking(ranking: dict[str, Any], methods: list[dict[str, Any]]) -> list[str]:
    """The lines under the table: how the CIs were made, the best method, its indistinguishable set, the
    MAD rule's pick and the noise floor, so users see both ways of choosing and how sure each is."""
    tp = ranking.get("output_throughput")
    if not tp:
        return []
    by_name = {m["method"]: m for m in methods}
    st = tp["statistics"]
    repeats = max((m.get("repeats") or 0 for m in methods), default=0)
    plural = "s" if repeats != 1 else ""
    lines = [f"tok/s: median over {repeats} repeat{plural}; speedup and best: pooled throughput (Σ tokens / Σ time "
             f"over all repeats), paired vs ar", *statistics_lines(st, methods)]
    for metric, title in (("output_throughput", "throughput"), ("request_goodput", "goodput")):
        rank = ranking.get(metric)
        if not rank or rank.get("best") is None:
            continue
        best = by_name[rank["best"]]
        value = best.get(metric)
        others = [m for m in rank["indistinguishable"] if m != rank["best"]]
        resolved = rank.get("best_resolved", True)
        lines.append(f"{'best' if resolved else 'top estimate (not resolved)'} by {title}: {rank['best']} "
                     f"({value:,.2f}{' tok/s' if metric == 'output_throughput' else ' req/s'}); indistinguishable "
                     f"from it (paired 95% CI of the difference contains 0): {', '.join(others) if others else 'none'}")
        lines.append(f"MAD rule by {title} (vLLM PR 49163, not merged: median - 1.4826*MAD over repeats, ties "
                     f"within 1% to the smaller γ): {rank['mad_pick']}")
    floor = tp.get("noise_floor_pct")
    lines.append(f"noise floor (A/A: ar run twice per repeat): ±{floor:.1f}% — smaller differences are noise"
                 if floor is not None else "noise floor: not measured (task.noise_floor=true runs ar twice per repeat)")
    slo = ranking.get("slo")
    if slo:
        lines.append("SLOs: " + ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
                     + " (goodput: requests meeting every SLO / duration, as vLLM --goodput; "
                       "p99 SLO: nearest-rank p99 TTFT/TPOT within the limits, MLPerf style)")
    return lines


def _median(values: list[Any]) -> float | None:
    finite = [v for v in values if _finite(v)]
    return statistics.median(finite) if finite else None


def _pct(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+.1f}%" if signed else f"{value:.1f}%")


def statistics_lines(st: dict[str, Any], methods: list[dict[str, Any]]) -> list[str]:
    """How the intervals were made (their unit and number), where their variance comes from (median over the
    methods compared with ar) and the smallest speedup they resolve. A summary written before units were prompts
    (its statistics name a bootstrap over (repeat, prompt) clusters) is described as what it was."""
    if "ci_method" in st:  # the old unit
        return [f"95% CI: {st['ci_method']}, {st.get('n_resamples')} resamples of {st.get('n_clusters')} (repeat, "
                "prompt) clusters — repeats counted as independent: these intervals are too narrow"]
    others = [m for m in methods if m.get("method") != BASELINE and m.get("status") == "ok"]
    lines = [f"95% CI: {st['interval']} — {st['n_units']} units, unit = {st['unit']}, {st['repeats']} repeat(s) "
             f"each; a method is faster or slower only where its interval excludes 1, equivalent where it lies "
             f"within ±{100 * st['equivalence_margin']:g}%"]
    if others:
        get = {k: _median([m.get(f"speedup_{k}") for m in others])
               for k in ("between_units_sd_pct", "between_repeats_sd_pct", "drift_pct", "machine_drift_pct",
                         "mde_pct")}
        lines.append(f"variance of the speedup vs ar (SD, median over methods): between units "
                     f"{_pct(get['between_units_sd_pct'])}, between repeats of a unit "
                     f"{_pct(get['between_repeats_sd_pct'])}; drift of the ratio over the run "
                     f"{_pct(get['drift_pct'], True)} (the machine's own: {_pct(get['machine_drift_pct'], True)}); "
                     f"{st['process_component']}")
        lines.append(f"smallest speedup this run resolves (MDE, {100 * st['power']:.0f}% power, median over "
                     f"methods): {_pct(get['mde_pct'])}")
    return lines


CATEGORY_COLUMNS = {
    "prompts": "prompts",
    "requests": "requests",
    "output_tokens": "out tokens",
    "decode_s": "decode s",
    "wall_s": "wall s",
    "acceptance_length": "acc_len",
    "no_proposal_share": "no-prop %",
    "decode_throughput": "decode tok/s",
    "output_throughput": "tok/s",
    "speedup": "speedup",
    "speedup_ci": "95% CI",
    "speedup_verdict": "vs ar",
    "token_share": "tokens %",
    "time_share": "time %",
}


def category_table(rows: list[dict[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """The per-category breakdown (:func:`spectune.stats.by_category.by_category`, or ``summary.json``'s
    ``by_category``) as printed: one row per (method, category), the method's ``all`` row last; shares in
    percent."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["speedup_ci"] = [_ci(lo, hi) for lo, hi in zip(frame["speedup_ci95_lo"], frame["speedup_ci95_hi"],
                                                          strict=True)]
    frame["speedup_verdict"] = frame["speedup_verdict"].fillna("-")
    if "no_proposal_share" not in frame:  # runs recorded before the share was
        frame["no_proposal_share"] = None
    for key in ("token_share", "time_share", "no_proposal_share"):
        frame[key] = frame[key].astype(float) * 100
    for key in ("acceptance_length", "decode_throughput", "output_throughput", "speedup"):
        frame[key] = frame[key].astype(float)
    return frame.set_index(["method", "category"])[list(CATEGORY_COLUMNS)].rename(columns=CATEGORY_COLUMNS)


def format_category_table(rows: list[dict[str, Any]] | pd.DataFrame) -> str:
    """The per-category table with the line that says how to read it. Columns that say nothing in this table are left
    out: ``requests`` where every row's is its prompts times one number (no request failed; the line gives the
    number), ``no-prop %`` where no cycle went without a proposal (a draft model always proposes)."""
    table = category_table(rows)
    if table.empty:
        return ""
    notes = ["tokens and seconds summed over repeats, the 'all' row their sums",
             "wall s: each request's share of its run's duration", "decode s: E2EL - TTFT",
             "speedup: paired vs ar over the category's prompts"]
    per_prompt = {round(float(r) / float(p), 9) for r, p in zip(table["requests"], table["prompts"], strict=True)}
    if len(per_prompt) == 1 and float(next(iter(per_prompt))).is_integer():
        table = table.drop(columns="requests")
        runs = int(next(iter(per_prompt)))
        notes.insert(1, f"every prompt ran {runs} time{'s' if runs != 1 else ''} per method (requests)")
    if table["no-prop %"].fillna(0).eq(0).all():
        table = table.drop(columns="no-prop %")
    else:
        notes.append("no-prop %: cycles that asked for drafts and got no proposal")
    return "per category (Spec-Bench style): " + "; ".join(notes) + "\n" + format_table(table)
