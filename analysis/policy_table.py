"""The comparison table of ``policies.evaluate``: every policy against the best fixed γ, one row per policy.

Built from the held-out runs of one (language, concurrency): the per-point summaries and request/cycle rows
of every method, paired over independent units (prompts; blocks at concurrency > 1) as ``task=bench`` pairs them
(``spectune.stats.compare``). The
headline column is ``vs_best_fixed_pct``: the policy's throughput over the best fixed γ's *on the same
clusters* (a paired bootstrap CI), where that γ was chosen by a grid search over every γ on the training
prompts (never on the held-out ones). The oracle's gap comes from replaying the held-out traces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from spectune.methods import BASELINE
from spectune.stats.compare import EQUIVALENCE_MARGIN, decode_units, throughput_units
from spectune.stats.intervals import mde, ratio_interval, verdict
from spectune.stats.units import Units, components, speedup_interval

# Columns of comparison.parquet, in order (``format_comparison`` prints a subset).
BEST_FIXED = "best fixed γ"  # the policy label of the grid's best fixed γ row (AR keeps "ar" when γ = 0)
AA_POLICY = "ar (A/A)"  # the policy label of AR's second run (evaluate.noise_floor): its row vs AR is the noise floor
# What a policy's name does not say, printed under every table where it ran: a distilled policy is not the network.
WHAT_RAN = {
    "ppo-distilled": "per-step q(x) thresholds fitted to mimic the ppo network's decisions (no network runs)",
    "step-thresholds": "per-step q(x) thresholds tuned in replay for throughput (no network: ppo-distilled's "
                       "rule without ppo)",
}

COLUMNS = (
    "language", "concurrency", "policy", "method", "gamma", "best_fixed_gamma", "repeats", "prompts",
    "tok_s_median", "tok_s", "tok_s_ci95_lo", "tok_s_ci95_hi",
    "speedup_vs_ar", "speedup_vs_ar_ci95_lo", "speedup_vs_ar_ci95_hi",
    "vs_best_fixed_pct", "vs_best_fixed_pct_ci95_lo", "vs_best_fixed_pct_ci95_hi",
    "acceptance_length", "per_position_acceptance", "mean_drafts_per_cycle", "no_draft_cycles_pct",
    "tpot_p50_ms", "tpot_p99_ms", "decision_pct_of_cycle",
    "decode_tok_s", "decode_tok_s_ci95_lo", "decode_tok_s_ci95_hi", "decode_repeat_cv_pct", "decode_speedup_vs_ar",
    "decode_vs_ar_pct", "decode_vs_ar_pct_ci95_lo", "decode_vs_ar_pct_ci95_hi",
    "decode_vs_best_fixed_pct", "decode_vs_best_fixed_pct_ci95_lo", "decode_vs_best_fixed_pct_ci95_hi",
    "decode_vs_best_fixed_mde_pct", "decode_vs_best_fixed_verdict", "units", "unit",
    "decode_vs_best_fixed_between_units_sd_pct", "decode_vs_best_fixed_between_repeats_sd_pct",
    "decode_vs_best_fixed_drift_pct",
    "hindsight_gamma", "decode_vs_hindsight_pct", "decode_vs_hindsight_pct_ci95_lo", "decode_vs_hindsight_pct_ci95_hi",
    "replay_tok_s", "replay_error_pct", "replay_vs_best_fixed_pct", "oracle_gap_pct", "oracle_vs_best_fixed_pct",
    "informed_oracle_vs_best_fixed_pct",
)


def _cycle_stats(cycles: pd.DataFrame) -> dict[str, float | None]:
    """Drafts per cycle, the share of cycles that did not speculate, and the policy's decision time as a share
    of the cycle time (when the engine recorded ``policy_s``), over every repeat's cycles of one method."""
    if not len(cycles):
        return {"mean_drafts_per_cycle": None, "no_draft_cycles_pct": None, "decision_pct_of_cycle": None}
    per_cycle = cycles.drop_duplicates(["repeat", "cycle"]) if "repeat" in cycles else cycles.drop_duplicates("cycle")
    out: dict[str, float | None] = {"mean_drafts_per_cycle": float(cycles["num_drafts"].mean()),
                                    "no_draft_cycles_pct": float(100 * (per_cycle["gamma"] == 0).mean())}
    if "policy_s" in per_cycle:
        total = (per_cycle["draft_s"] + per_cycle["verify_s"] + per_cycle["rest_s"]
                 + per_cycle.get("policy_outside_s", 0.0)).sum()
        out["decision_pct_of_cycle"] = float(100 * per_cycle["policy_s"].sum() / total) if total > 0 else None
    else:
        out["decision_pct_of_cycle"] = None
    return out


def comparison_rows(methods: list[dict[str, Any]], requests: pd.DataFrame, cycles: pd.DataFrame,
                    points: list[dict[str, Any]], labels: Mapping[str, str], best_label: str, *, language: str,
                    concurrency: int, best_gamma: int, replay: Mapping[str, Mapping[str, float]] | None,
                    fixed: Mapping[str, int] | None = None, unit_size: int = 1) -> list[dict[str, Any]]:
    """One row per method of the held-out runs.

    ``methods`` are ``spectune.measure.repeats.aggregate``'s per-method summaries (throughput and speedup CIs,
    latencies, acceptance), ``labels`` maps a method label to its policy name, ``best_label`` is the best fixed
    γ's method, ``replay`` maps a method label to its replay scores on the held-out traces, ``fixed`` maps the
    label of every fixed-γ method that ran (AR: γ 0) to its γ: with more than AR and the best fixed γ among them,
    the best of them on these prompts is the hindsight-fixed ceiling. Intervals are over units of ``unit_size``
    consecutive prompts (1: the prompt, its repeats together).
    """
    ok = {(p["method"], int(p["repeat"])): float(p["duration_s"]) for p in points if p.get("status") == "ok"}
    good = requests[[(m, int(r)) in ok for m, r in zip(requests["method"], requests["repeat"], strict=True)]]
    table = throughput_units(good, ok, unit_size=unit_size)
    decode = decode_units(good, unit_size)
    hindsight = _hindsight(decode, fixed or {}, best_label)
    rows = []
    for entry in methods:
        label = entry["method"]
        row: dict[str, Any] = {"language": language, "concurrency": concurrency, "policy": labels.get(label, label),
                               "method": label, "gamma": int(entry.get("gamma", 0)), "best_fixed_gamma": best_gamma,
                               "repeats": entry.get("repeats", 0), "units": decode.n, "unit": decode.unit}
        if entry.get("status") != "ok":
            rows.append(row)
            continue
        mine = requests[requests["method"] == label]
        row["prompts"] = int(mine["request_id"].nunique())
        row["tok_s_median"] = entry.get("output_throughput")
        row["tok_s"] = entry.get("output_throughput_pooled")
        row["tok_s_ci95_lo"], row["tok_s_ci95_hi"] = (entry.get("output_throughput_ci95_lo"),
                                                      entry.get("output_throughput_ci95_hi"))
        for key in ("", "_ci95_lo", "_ci95_hi"):
            row[f"speedup_vs_ar{key}"] = entry.get(f"speedup{key}")
        if label in table.num and best_label in table.num:
            iv = speedup_interval(table, label, best_label)
            row["vs_best_fixed_pct"] = 100 * (iv.estimate - 1)
            row["vs_best_fixed_pct_ci95_lo"], row["vs_best_fixed_pct_ci95_hi"] = 100 * (iv.lo - 1), 100 * (iv.hi - 1)
        row.update(_decode(decode, label, best_label, hindsight, fixed or {}))
        row["acceptance_length"] = entry.get("spec_decode_acceptance_length")
        row["per_position_acceptance"] = list(entry.get("spec_decode_per_position_acceptance_rates") or [])
        row["tpot_p50_ms"] = entry.get("median_tpot_ms")
        row["tpot_p99_ms"] = entry.get("p99_tpot_ms") if (entry.get("tpot_samples") or 0) >= 100 else None
        row.update(_cycle_stats(cycles[cycles["method"] == label]))
        scores = (replay or {}).get(label)
        if scores:
            row["replay_tok_s"] = scores["policy_tok_s"]
            if row.get("decode_tok_s"):  # replay times cycles only: it predicts decode throughput
                row["replay_error_pct"] = 100 * (scores["policy_tok_s"] / row["decode_tok_s"] - 1)
            row["replay_vs_best_fixed_pct"] = scores["vs_best_fixed_pct"]
            row["oracle_gap_pct"] = 100 * (scores["policy_tok_s"] / scores["oracle_tok_s"] - 1)
            row["oracle_vs_best_fixed_pct"] = scores["oracle_vs_best_fixed_pct"]
            row["informed_oracle_vs_best_fixed_pct"] = scores.get("informed_oracle_vs_best_fixed_pct")
        rows.append(row)
    return rows


def _hindsight(decode: Units, fixed: Mapping[str, int], best_label: str) -> str | None:
    """The fixed-γ method with the highest decode tok/s on the held-out clusters, when more fixed γ ran than AR
    and the training grid's pick (else there is nothing to choose among)."""
    ran = [label for label in fixed if label in decode.num]
    if len(set(ran) - {BASELINE, best_label}) == 0:
        return None
    return max(ran, key=lambda label: (decode.rate(label), -fixed[label]))


def _decode(decode: Units, label: str, best_label: str, hindsight: str | None, fixed: Mapping[str, int]
            ) -> dict[str, Any]:
    """Decode tok/s with its CI, over AR, and paired % against the best fixed γ and the hindsight ceiling."""
    if label not in decode.num or not decode.den[label].sum() > 0:
        return {}
    num, den = decode.num[label], decode.den[label]
    iv = ratio_interval(num, den)
    out: dict[str, Any] = {"decode_tok_s": iv.estimate, "decode_tok_s_ci95_lo": iv.lo, "decode_tok_s_ci95_hi": iv.hi}
    per_repeat = decode.per_repeat(label)
    if len(per_repeat) > 1:  # the live run-to-run noise: what a replay's prediction can be held to
        out["decode_repeat_cv_pct"] = float(100 * np.std(per_repeat, ddof=1) / np.mean(per_repeat))
    if BASELINE in decode.num:
        out["decode_speedup_vs_ar"] = decode.rate(label) / decode.rate(BASELINE)
    for key, other in (("decode_vs_best_fixed_pct", best_label), ("decode_vs_hindsight_pct", hindsight),
                       ("decode_vs_ar_pct", BASELINE)):
        if other is None or other not in decode.num:
            continue
        pair = speedup_interval(decode, label, other)
        out[key], out[f"{key}_ci95_lo"], out[f"{key}_ci95_hi"] = (100 * (pair.estimate - 1), 100 * (pair.lo - 1),
                                                                   100 * (pair.hi - 1))
        if key == "decode_vs_best_fixed_pct" and other != label:
            effect = mde(pair)
            out["decode_vs_best_fixed_mde_pct"] = None if effect is None else 100 * effect
            out["decode_vs_best_fixed_verdict"] = verdict(pair, EQUIVALENCE_MARGIN)
            parts = components(decode, label, other)
            for part in ("between_units_sd_pct", "between_repeats_sd_pct", "drift_pct"):
                out[f"decode_vs_best_fixed_{part}"] = parts[part]
    if hindsight is not None:
        out["hindsight_gamma"] = fixed[hindsight]
    return out


def comparison_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows → a frame with every column of :data:`COLUMNS` (missing values NaN/None), in that order."""
    frame = pd.DataFrame(rows)
    for column in COLUMNS:
        if column not in frame:
            frame[column] = None
    return frame[list(COLUMNS)]


def _num(value: Any, spec: str) -> str:
    return "–" if value is None or (isinstance(value, float) and not np.isfinite(value)) else format(value, spec)


def format_comparison(frame: pd.DataFrame) -> str:
    """The printed table, rows in run order: decode tok/s (primary) with its speed-up over AR
    and paired % against the best fixed γ and the hindsight ceiling, end-to-end tok/s and its % beside, then
    acceptance, TPOT, decision time and the oracle's gap."""
    head = (f"{'lang':<4} {'conc':>4} {'policy':<24} {'decode':>7} {'vs AR':>6} {'decode vs best fixed γ':>24} "
            f"{'verdict':<26} {'vs hindsight':>22} {'e2e tok/s':>9} {'e2e vs best fixed':>24} {'acc.len':>7} "
            f"{'TPOT p50':>8} {'decide%':>7} {'oracle gap':>10}")
    lines = ["decode tok/s (tokens after the first / (E2EL - TTFT)) is the primary metric; % are paired, [95% CI]",
             head, "-" * len(head)]
    for row in frame.itertuples(index=False):
        lines.append(f"{row.language:<4} {row.concurrency:>4} {str(row.method)[:24]:<24} "
                     f"{_num(row.decode_tok_s, '.1f'):>7} {_num(row.decode_speedup_vs_ar, '.2f'):>6} "
                     f"{_pct(row, 'decode_vs_best_fixed_pct'):>24} {_text(row.decode_vs_best_fixed_verdict):<26} "
                     f"{_pct(row, 'decode_vs_hindsight_pct'):>22} "
                     f"{_num(row.tok_s, '.1f'):>9} {_pct(row, 'vs_best_fixed_pct'):>24} "
                     f"{_num(row.acceptance_length, '.2f'):>7} {_num(row.tpot_p50_ms, '.2f'):>8} "
                     f"{_num(row.decision_pct_of_cycle, '.2f'):>7} {_num(row.oracle_gap_pct, '+.1f'):>10}")
    for (language, concurrency), group in frame.groupby(["language", "concurrency"], sort=False):
        first = group.iloc[0]
        lines.append(f"intervals ({language}, concurrency {concurrency}): t (jackknife) over {first['units']} "
                     f"units, unit = {first['unit']}, plus the method x repeat component; a policy wins or loses "
                     f"only where its interval excludes 0, 'equivalent' where it lies within "
                     f"±{100 * EQUIVALENCE_MARGIN:g}%, else 'not resolved' with the minimum detectable effect (80% "
                     "power)")
        spread = {part: group[f"decode_vs_best_fixed_{part}"].dropna().median()
                  for part in ("between_units_sd_pct", "between_repeats_sd_pct", "drift_pct")}
        lines.append(f"variance of decode vs best fixed γ (SD, median over policies): between units "
                     f"{_num(spread['between_units_sd_pct'], '.1f')}%, between repeats "
                     f"{_num(spread['between_repeats_sd_pct'], '.1f')}%, drift of the ratio "
                     f"{_num(spread['drift_pct'], '+.1f')}%; between processes: task=coverage")
    for name, what in WHAT_RAN.items():
        if (frame["policy"] == name).any():
            lines.append(f"{name}: {what}")
    for row in frame[frame["policy"] == AA_POLICY].itertuples(index=False):
        lines.append(f"noise floor ({row.language}, concurrency {row.concurrency}): AR run twice, the second against "
                     f"the first: decode {_pct(row, 'decode_vs_ar_pct')}; a difference inside it is not resolved")
    return "\n".join(lines)


def _text(value: Any) -> str:
    """A text cell; a missing one (None, or NaN once a frame has held it) prints as a dash, never as "nan"."""
    return "–" if value is None or (isinstance(value, float) and not np.isfinite(value)) else str(value)


def _pct(row: Any, key: str) -> str:
    return (f"{_num(getattr(row, key), '+.1f')}% [{_num(getattr(row, f'{key}_ci95_lo'), '+.1f')}, "
            f"{_num(getattr(row, f'{key}_ci95_hi'), '+.1f')}]")
