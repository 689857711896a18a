"""Comparing methods measured with repeats: paired intervals over independent units, what each comparison can
resolve, the best method and its indistinguishable set, the median − 1.4826·MAD rule, and the A/A noise floor.

The unit is a prompt (all of its repeats together) or, at concurrency > 1, a block of prompts batched together
(:mod:`spectune.stats.units`). A method's throughput over a set of units is Σ output tokens / Σ time shares,
where a request's time share is its E2EL scaled so that the shares of one (method, repeat) add up to that run's
measured duration (first dispatch → last completion). Over all units that is exactly the pooled throughput
Σ tokens / Σ durations; at concurrency 1 a share is ≈ the request's own E2EL. The intervals are jackknife
t-intervals over the units, with the method × repeat component (:mod:`spectune.stats.intervals`), paired: the
same units for both methods.

Each comparison says what it resolved: "faster"/"slower" where its interval excludes no difference,
"equivalent" where the interval lies inside ± the equivalence margin, and otherwise "not resolved" with its
minimum detectable effect (80% power). The best method is the top estimate; it is called resolved only where
every other method's interval of the difference to it lies below 0.

Two ways to pick γ, shown side by side: that ranking, and the rule of vLLM pull request 49163 (not merged):
per method, median − 1.4826·MAD of the per-repeat throughputs; the highest score wins, and scores within 1%
of it go to the smallest γ.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from spectune.methods import AA_LABEL, BASELINE
from spectune.stats.intervals import (
    CONFIDENCE,
    N_RESAMPLES,
    POWER,
    T_METHOD,
    Interval,
    mde,
    quantile_interval,
    ratio_interval,
    verdict,
)
from spectune.stats.units import Units, components, speedup_interval, units_of

log = logging.getLogger(__name__)

T = TypeVar("T")
MAD_SCALE = 1.4826  # MAD → σ for normal data
MAD_TIE = 0.01  # scores within 1% of the best go to the smallest γ
EQUIVALENCE_MARGIN = 0.02  # "equivalent" only where a speedup's whole interval lies within ±2%
MIN_P99_SAMPLES = 100  # a p99 (and its CI) is reported only with at least this many samples behind it
LATENCIES = ("ttft_ms", "tpot_ms", "e2el_ms")
PROCESS_NOTE = ("between processes: not visible inside one process; task=coverage measures it across fresh "
                "processes")


def rotation(methods: Sequence[T], repeat: int) -> list[T]:
    """The order of repeat ``repeat`` (0-based): ABC, BCA, CAB, ... so that slow drift on a shared
    machine does not always favour the method that runs first (or last)."""
    if not methods:
        return []
    k = repeat % len(methods)
    return [*methods[k:], *methods[:k]]


def throughput_terms(requests: pd.DataFrame, durations: Mapping[tuple[str, int], float],
                     value: str = "output_tokens") -> pd.DataFrame:
    """Per request: ``num`` its ``value`` and ``den`` its time share, the E2EL scaled so that the shares of one
    (method, repeat) add up to that run's duration. A subset of the rows (one category's) keeps the shares it had in
    the whole run, so subsets' sums add up to the run's. Failed requests count 0 and take no time."""
    keep = [c for c in ("method", "repeat", "request_id", "status", "e2el_ms", value, "category") if c in requests]
    frame = requests[list(dict.fromkeys(keep))].copy()
    ok = frame["status"] == "ok"
    frame["num"] = np.where(ok, frame[value].astype(float), 0.0)
    frame["e2el"] = np.where(ok, frame["e2el_ms"].astype(float).fillna(0.0), 0.0)
    total = frame.groupby(["method", "repeat"])["e2el"].transform("sum")
    scale = np.array([durations.get((m, r), np.nan) for m, r in zip(frame["method"], frame["repeat"], strict=True)])
    frame["den"] = np.where(total > 0, frame["e2el"] / total.where(total > 0, 1.0) * scale, 0.0)
    return frame


def throughput_units(requests: pd.DataFrame, durations: Mapping[tuple[str, int], float],
                     value: str = "output_tokens", unit_size: int = 1) -> Units:
    """The unit table of throughput from ``requests`` (columns method, repeat, request_id, status, e2el_ms and
    ``value``) and each (method, repeat) run's duration in seconds (:func:`throughput_terms`)."""
    return units_of(throughput_terms(requests, durations, value), unit_size)


def decode_terms(requests: pd.DataFrame) -> pd.DataFrame:
    """Per request: ``num`` the tokens after the first, ``den`` the seconds they took (E2EL − TTFT); failed requests
    and those with fewer than two tokens count 0 and take no time."""
    keep = ["method", "repeat", "request_id", "status", "output_tokens", "ttft_ms", "e2el_ms"]
    frame = requests[keep + (["category"] if "category" in requests else [])].copy()
    ok = (frame["status"] == "ok") & (frame["output_tokens"] > 1)
    frame["num"] = np.where(ok, frame["output_tokens"].astype(float) - 1.0, 0.0)
    decode_ms = frame["e2el_ms"].astype(float) - frame["ttft_ms"].astype(float)
    frame["den"] = np.where(ok, decode_ms.fillna(0.0) / 1e3, 0.0)
    return frame


def decode_units(requests: pd.DataFrame, unit_size: int = 1) -> Units:
    """The unit table of decode throughput: per unit the tokens after the first and the time they took
    (E2EL − TTFT), every repeat summed. Σ over units gives tokens per second after the first token — 1 / TPOT
    pooled over requests, the rate a reader sees once the answer has started; prefill and queueing are left out,
    so a policy is judged on the cycles it chose. Requests with fewer than two tokens, or failed, count 0."""
    return units_of(decode_terms(requests), unit_size)


def decode_rates(requests: pd.DataFrame) -> dict[str, float]:
    """Per method, pooled decode tok/s over all of its requests (:func:`decode_units`' terms summed, without
    aligning units across methods: a method whose run failed does not drop the others' requests)."""
    sums = decode_terms(requests).groupby("method")[["num", "den"]].sum()
    return {str(m): float(row.num / row.den) for m, row in sums.iterrows() if row.den > 0}


def mad_score(values: Sequence[float]) -> float:
    """median − 1.4826·MAD of per-repeat values (a robust 'reliably at least this fast')."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if arr.size == 0:
        return float("nan")
    med = float(np.median(arr))
    return med - MAD_SCALE * float(np.median(np.abs(arr - med)))


def mad_rule(per_repeat: Mapping[str, Sequence[float]], gammas: Mapping[str, int]
             ) -> tuple[str | None, dict[str, float]]:
    """The pick of vLLM PR 49163's rule: the highest median − 1.4826·MAD; any method within 1% of that score
    with a smaller γ wins the tie (the smallest such γ). Returns (pick, scores)."""
    scores = {m: mad_score(v) for m, v in per_repeat.items()}
    finite = {m: s for m, s in scores.items() if np.isfinite(s)}
    if not finite:
        return None, scores
    top = max(finite.values())
    tied = [m for m, s in finite.items() if s >= top - abs(top) * MAD_TIE]
    return min(tied, key=lambda m: (gammas.get(m, 0), -finite[m])), scores


def indistinguishable(best: str, differences: Mapping[str, Interval]) -> list[str]:
    """``best`` and every method whose paired CI of (its value − best's) contains 0."""
    return [best, *[m for m, iv in differences.items() if m != best and iv.contains(0.0)]]


def noise_floor_pct(aa: Interval) -> float:
    """How far from 1 the A/A speedup's CI reaches, in percent: differences smaller than this are noise."""
    return 100.0 * max(abs(aa.lo - 1.0), abs(aa.hi - 1.0))


@dataclass
class Comparison:
    """The result of :func:`compare`: flat summary fields per method and the ranking."""

    fields: dict[str, dict[str, Any]]
    best: str | None
    indistinguishable: list[str]
    mad_pick: str | None
    mad_scores: dict[str, float]
    noise_floor_pct: float | None
    statistics: dict[str, Any] = field(default_factory=dict)
    best_resolved: bool = False


def _difference(ratio: Interval, reference: float) -> Interval:
    """A rate's difference to ``reference`` read off the paired interval of their ratio (so that "contains 0" and
    "contains 1" always agree, the method × repeat component included)."""
    return replace(ratio, estimate=reference * (ratio.estimate - 1), lo=reference * (ratio.lo - 1),
                   hi=reference * (ratio.hi - 1), scale="linear", se=None)


def _put(fields: dict[str, Any], key: str, iv: Interval, *, ratio: bool, margin: float) -> None:
    """An interval's estimate, bounds, MDE (in %, for a ratio) and verdict under ``key``."""
    fields[key], fields[f"{key}_ci95_lo"], fields[f"{key}_ci95_hi"] = iv.estimate, iv.lo, iv.hi
    effect = mde(iv)
    if ratio:
        fields[f"{key}_mde_pct"] = None if effect is None else 100.0 * effect
    fields[f"{key}_verdict"] = verdict(iv, margin, null=1.0 if ratio else 0.0)


def compare(requests: pd.DataFrame, durations: Mapping[tuple[str, int], float],
            per_repeat: Mapping[str, Sequence[float]], gammas: Mapping[str, int], *,
            value: str = "output_tokens", metric: str = "output_throughput", baseline: str = BASELINE,
            unit_size: int = 1, margin: float = EQUIVALENCE_MARGIN) -> Comparison:
    """Paired comparison of every method in ``requests`` on ``metric`` = Σ value / Σ time, over units of
    ``unit_size`` consecutive prompts (1: the prompt).

    ``per_repeat[method]`` is the metric per repeat (for the MAD rule); ``gammas[method]`` the γ
    (0 for AR). With ``value='good'`` (a 0/1 column) the metric is the request goodput.
    """
    table = throughput_units(requests, durations, value, unit_size)
    methods = [m for m in table.num if m != AA_LABEL]
    fields: dict[str, dict[str, Any]] = {m: {} for m in table.num}
    for m in table.num:
        iv = ratio_interval(table.num[m], table.den[m])
        fields[m][f"{metric}_pooled"] = iv.estimate
        fields[m][f"{metric}_ci95_lo"], fields[m][f"{metric}_ci95_hi"] = iv.lo, iv.hi
    prefix = "speedup" if metric == "output_throughput" else f"{metric}_ratio"
    if baseline in table.num:
        for m in table.num:
            iv = speedup_interval(table, m, baseline)
            _put(fields[m], prefix, iv, ratio=True, margin=margin)
            if m != baseline:
                fields[m].update({f"{prefix}_{k}": v for k, v in components(table, m, baseline).items()
                                  if k not in ("units", "repeats")})
    pooled = {m: fields[m][f"{metric}_pooled"] for m in methods if np.isfinite(fields[m][f"{metric}_pooled"])}
    best = max(pooled, key=lambda m: (pooled[m], -gammas.get(m, 0))) if pooled else None
    same: list[str] = []
    resolved = False
    if best is not None:
        diffs = {m: _difference(speedup_interval(table, m, best), pooled[best]) for m in methods if m != best}
        for m, iv in diffs.items():
            _put(fields[m], f"{metric}_diff_vs_best", iv, ratio=False, margin=0.0)
        same = indistinguishable(best, diffs)
        resolved = bool(diffs) and all(iv.hi < 0 for iv in diffs.values())
    pick, scores = mad_rule({m: v for m, v in per_repeat.items() if m in methods}, gammas)
    floor = None
    if AA_LABEL in table.num and baseline in table.num:
        floor = noise_floor_pct(speedup_interval(table, AA_LABEL, baseline))
    for m in table.num:
        fields[m]["best"] = m == best
        fields[m]["indistinguishable_from_best"] = m in same
        fields[m]["mad_score"] = scores.get(m)
    repeats = int(table.cells["repeat"].nunique()) if len(table.cells) else 0
    statistics = {"interval": T_METHOD, "unit": table.unit, "unit_size": int(unit_size), "n_units": table.n,
                  "repeats": repeats, "confidence_level": CONFIDENCE, "power": POWER,
                  "equivalence_margin": margin, "metric": metric, "best_resolved": resolved,
                  "components": f"{prefix}_between_units_sd_pct, _between_repeats_sd_pct, _drift_pct, "
                                "_machine_drift_pct per method (spectune.stats.units.components)",
                  "process_component": PROCESS_NOTE,
                  "indistinguishable_rule": "paired CI of the difference to the best contains 0",
                  "mad_rule": f"max median - {MAD_SCALE}*MAD over repeats; within {MAD_TIE:.0%} to the smaller γ "
                              "(vLLM PR 49163, not merged)"}
    return Comparison(fields, best, same, pick, scores, floor, statistics, resolved)


def latency_intervals(requests: pd.DataFrame, *, seed: int, n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """p50 TTFT/TPOT/E2EL over all repeats of one method with CIs (clusters = its requests), and p99 with
    its CI only where at least 100 samples stand behind it."""
    ok = requests[requests["status"] == "ok"]
    out: dict[str, Any] = {}
    for name in LATENCIES:
        values = ok[name].dropna().astype(float).to_numpy()
        out[f"{name.removesuffix('_ms')}_samples"] = int(values.size)
        for q in (50, 99):
            key = f"p{q}_{name}"
            if values.size == 0 or (q == 99 and values.size < MIN_P99_SAMPLES):
                out[f"{key}_ci95_lo"] = out[f"{key}_ci95_hi"] = None
                continue
            iv = quantile_interval(values, q, seed=seed, n_resamples=n_resamples)
            out[f"{key}_ci95_lo"], out[f"{key}_ci95_hi"] = iv.lo, iv.hi
    return out
