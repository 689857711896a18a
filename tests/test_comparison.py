"""analysis.policy_table on a synthetic held-out run: decode throughput (the primary metric), the hindsight-fixed
ceiling, the run-to-run spread and the replay's error, against values computed by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.policy_table import comparison_frame, comparison_rows

SPEED = {"ar": 20.0, "fixed:gamma=1": 24.0, "fixed:gamma=2": 26.0, "fixed:gamma=3": 22.0, "ppo": 25.0}
GAMMA = {"ar": 0, "fixed:gamma=1": 1, "fixed:gamma=2": 2, "fixed:gamma=3": 3, "ppo": 3}


def _run(repeats: int = 3, prompts: int = 12, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """Concurrency 1: per request a TTFT, then (tokens − 1) at the method's decode speed × cluster effect × noise."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(16, 48, prompts)
    rows, cycles, points = [], [], []
    for r in range(repeats):
        effect = rng.lognormal(0, 0.15, prompts)
        for method, speed in SPEED.items():
            ttft = rng.uniform(40, 60, prompts)
            decode = (tokens - 1) / speed * effect * rng.lognormal(0, 0.03, prompts) * 1e3
            for i in range(prompts):
                rows.append({"method": method, "repeat": r, "request_id": i, "status": "ok",
                             "output_tokens": int(tokens[i]), "ttft_ms": ttft[i], "e2el_ms": ttft[i] + decode[i]})
            cycles.append({"method": method, "repeat": r, "cycle": 0, "num_drafts": GAMMA[method],
                           "gamma": GAMMA[method]})
            points.append({"method": method, "repeat": r, "status": "ok", "duration_s": float(
                (ttft.sum() + decode.sum()) / 1e3)})
    return pd.DataFrame(rows), pd.DataFrame(cycles), points


def _rows(fixed: dict[str, int], replay: dict | None = None) -> pd.DataFrame:
    requests, cycles, points = _run()
    methods = [{"method": m, "gamma": GAMMA[m], "status": "ok", "repeats": 3} for m in SPEED]
    labels = {m: m for m in SPEED}
    return comparison_frame(comparison_rows(methods, requests, cycles, points, labels, "fixed:gamma=1",
                                            language="en", concurrency=1, best_gamma=1, replay=replay,
                                            fixed=fixed)).set_index("method")


def test_decode_throughput_is_tokens_after_the_first_over_e2el_minus_ttft():
    requests, _, _ = _run()
    table = _rows({"ar": 0, "fixed:gamma=1": 1})
    for method in SPEED:
        mine = requests[requests["method"] == method]
        expected = (mine["output_tokens"] - 1).sum() / ((mine["e2el_ms"] - mine["ttft_ms"]).sum() / 1e3)
        assert table.loc[method, "decode_tok_s"] == pytest.approx(expected)
        assert table.loc[method, "decode_tok_s_ci95_lo"] <= expected <= table.loc[method, "decode_tok_s_ci95_hi"]
    assert table.loc["fixed:gamma=1", "decode_vs_best_fixed_pct"] == pytest.approx(0.0, abs=1e-9)
    # 3 repeats × 12 prompts, 3% request noise: the 8% faster γ = 2 is resolved from γ = 1
    assert table.loc["fixed:gamma=2", "decode_vs_best_fixed_pct_ci95_lo"] > 0
    # per-repeat decode throughput: its coefficient of variation, by hand
    mine = requests[requests["method"] == "ppo"]
    per_repeat = [(g["output_tokens"] - 1).sum() / ((g["e2el_ms"] - g["ttft_ms"]).sum() / 1e3)
                  for _, g in mine.groupby("repeat")]
    assert table.loc["ppo", "decode_repeat_cv_pct"] == pytest.approx(100 * np.std(per_repeat, ddof=1)
                                                                      / np.mean(per_repeat))


def test_the_hindsight_ceiling_is_the_best_fixed_gamma_on_these_prompts():
    table = _rows({"ar": 0, "fixed:gamma=1": 1, "fixed:gamma=2": 2, "fixed:gamma=3": 3})
    assert (table["hindsight_gamma"] == 2).all()  # γ = 2 is the fastest fixed γ here, not the grid's γ = 1
    assert table.loc["fixed:gamma=2", "decode_vs_hindsight_pct"] == pytest.approx(0.0, abs=1e-9)
    fixed = table.loc[["ar", "fixed:gamma=1", "fixed:gamma=3"], "decode_vs_hindsight_pct"]
    assert (fixed < 0).all()
    # with only AR and the grid's γ there is nothing to choose among: no ceiling
    assert _rows({"ar": 0, "fixed:gamma=1": 1})["hindsight_gamma"].isna().all()


def test_replay_error_is_the_replays_decode_rate_against_the_live_one():
    replay = {"fixed:gamma=2": {"policy_tok_s": 27.0, "vs_best_fixed_pct": 0.0, "oracle_tok_s": 30.0,
                                "oracle_vs_best_fixed_pct": 11.1}}
    table = _rows({"ar": 0, "fixed:gamma=1": 1}, replay)
    live = table.loc["fixed:gamma=2", "decode_tok_s"]
    assert table.loc["fixed:gamma=2", "replay_error_pct"] == pytest.approx(100 * (27.0 / live - 1))
    assert table.loc["fixed:gamma=2", "oracle_gap_pct"] == pytest.approx(-10.0)
    assert np.isnan(table.loc["ppo", "replay_error_pct"])
