"""Repeats and intervals on synthetic data with known answers: rotation, units, paired t-intervals, MDE and
verdicts, the MAD rule, the indistinguishable set, the noise floor, and vLLM-style goodput / MLPerf p99 checks.
(Coverage over thousands of simulated runs: tests/test_coverage.py.)"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectune.errors import SpectuneError
from spectune.stats.compare import (
    AA_LABEL,
    compare,
    decode_units,
    indistinguishable,
    latency_intervals,
    mad_rule,
    mad_score,
    noise_floor_pct,
    rotation,
    throughput_units,
)
from spectune.stats.goodput import good_requests, nearest_rank, p99_check, parse_slo
from spectune.stats.intervals import (
    T_METHOD,
    Interval,
    paired_difference_interval,
    paired_ratio_interval,
    quantile_interval,
    ratio_interval,
)


def test_rotation_order_is_abc_bca_cab_then_wraps():
    assert [rotation("ABC", r) for r in range(4)] == [list("ABC"), list("BCA"), list("CAB"), list("ABC")]
    assert rotation([], 3) == []
    # every method takes every position exactly once in len(methods) repeats
    orders = [rotation(list(range(5)), r) for r in range(5)]
    assert all(sorted(o[pos] for o in orders) == list(range(5)) for pos in range(5))


def test_ratio_ci_of_a_mean_matches_the_normal_theory_interval():
    # n = 400 clusters, den = 1: Σx/n is the mean; its 95% CI ≈ mean ± 1.96 s/√n. Tolerance 10% of the half-width.
    rng = np.random.default_rng(1)
    x = rng.normal(50.0, 8.0, 400)
    iv = ratio_interval(x, np.ones_like(x))
    half = 1.96 * x.std(ddof=1) / np.sqrt(x.size)
    assert iv.estimate == pytest.approx(x.mean())
    assert iv.lo == pytest.approx(x.mean() - half, abs=0.1 * half)
    assert iv.hi == pytest.approx(x.mean() + half, abs=0.1 * half)
    assert iv.n == 400 and iv.method == T_METHOD and iv.df == 399


def test_paired_speedup_ci_covers_the_true_speedup_about_95_percent_of_the_time():
    # 100 synthetic benches (seeds 0..99), 30 clusters each, true speedup 1.25 with a shared per-cluster
    # effect and 10% independent noise. Coverage of a 95% CI must be in [0.87, 1.0] (±3.6 binomial SD).
    hits = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        length = rng.integers(20, 48, 30).astype(float)  # tokens per request (same prompt, both methods)
        base_time = length * rng.lognormal(0, 0.3, 30)  # cluster effect: prompt difficulty / machine state
        t_a = base_time * rng.lognormal(0, 0.1, 30)
        t_b = base_time / 1.25 * rng.lognormal(0, 0.1, 30)
        iv = paired_ratio_interval(length, t_b, length, t_a)
        hits += iv.contains(1.25 * np.sum(base_time) / np.sum(base_time))
    assert 0.87 <= hits / 100 <= 1.0, hits


def test_a_over_a_paired_interval_contains_no_difference_and_pairing_narrows_it():
    # A/A: two runs of the same method on 48 clusters (seed 7), strong cluster effect, 5% run noise.
    rng = np.random.default_rng(7)
    tokens = rng.integers(24, 48, 48).astype(float)
    base = tokens * rng.lognormal(0, 0.5, 48)
    t1, t2 = base * rng.lognormal(0, 0.05, 48), base * rng.lognormal(0, 0.05, 48)
    ratio = paired_ratio_interval(tokens, t2, tokens, t1)
    diff = paired_difference_interval(tokens, t2, tokens, t1)
    assert ratio.contains(1.0) and diff.contains(0.0)
    # unpaired (independent resampling of the two runs) is much wider when clusters differ this much
    one, two = ratio_interval(tokens, t1), ratio_interval(tokens, t2)
    assert (ratio.hi - ratio.lo) < 0.5 * ((two.hi - two.lo) / one.estimate)
    assert noise_floor_pct(ratio) == pytest.approx(100 * max(1 - ratio.lo, ratio.hi - 1))


def test_degenerate_and_tiny_samples_give_a_point_interval_not_nan():
    same = np.full(10, 3.0)
    iv = ratio_interval(same, np.ones(10))
    assert (iv.lo, iv.estimate, iv.hi) == (3.0, 3.0, 3.0)
    one = ratio_interval(np.array([5.0]), np.array([2.0]))
    assert (one.lo, one.hi, one.n) == (2.5, 2.5, 1)


def test_quantile_interval_brackets_the_true_median():
    # n = 300 draws of Exp(1), seed 11: the true median ln 2 lies in the 95% CI (this seed; a fixed check).
    x = np.random.default_rng(11).exponential(1.0, 300)
    iv = quantile_interval(x, 50, seed=0)
    assert iv.lo < np.log(2) < iv.hi and iv.lo < np.median(x) < iv.hi


def test_mad_rule_scores_and_ties_go_to_the_smaller_gamma():
    assert mad_score([100, 101, 99]) == pytest.approx(100 - 1.4826 * 1)
    assert mad_score([110, 80, 112]) == pytest.approx(110 - 1.4826 * 2)
    # a noisy faster γ loses to a steady one; within 1% the smaller γ wins
    pick, scores = mad_rule({"g2": [100, 101, 99], "g4": [140, 60, 105, 135, 104]}, {"g2": 2, "g4": 4})
    assert pick == "g2" and scores["g4"] < scores["g2"]
    pick, _ = mad_rule({"g2": [100, 100, 100], "g4": [100.9, 100.9, 100.9]}, {"g2": 2, "g4": 4})
    assert pick == "g2"
    pick, _ = mad_rule({"g2": [100, 100, 100], "g4": [101.5, 101.5, 101.5]}, {"g2": 2, "g4": 4})
    assert pick == "g4"
    pick, _ = mad_rule({"ar": [100.5] * 3, "g1": [101] * 3}, {"ar": 0, "g1": 1})
    assert pick == "ar"  # γ = 0 (no speculation) is the smallest γ


def test_indistinguishable_set_uses_the_paired_difference_ci():
    diffs = {"a": Interval(-5, -9, -1, 48, T_METHOD), "b": Interval(-1, -3, 0.5, 48, T_METHOD)}
    assert indistinguishable("best", diffs) == ["best", "b"]


def _synthetic_requests(speed: dict[str, float], repeats: int = 3, prompts: int = 16, seed: int = 0
                        ) -> tuple[pd.DataFrame, dict[tuple[str, int], float]]:
    """A bench at concurrency 1: request time = tokens / speed × cluster effect × 3% noise."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(24, 48, prompts)
    rows, durations = [], {}
    for r in range(repeats):
        effect = rng.lognormal(0, 0.2, prompts)
        for m, s in speed.items():
            e2el = tokens / s * effect * rng.lognormal(0, 0.03, prompts) * 1e3
            for i in range(prompts):
                rows.append({"method": m, "repeat": r, "request_id": i, "status": "ok", "output_tokens": tokens[i],
                             "e2el_ms": e2el[i], "ttft_ms": 5.0 + i, "tpot_ms": 4.0, "good": int(e2el[i] < 300)})
            durations[(m, r)] = e2el.sum() / 1e3 * 1.01  # 1% idle between requests
    return pd.DataFrame(rows), durations


def test_time_shares_add_up_to_each_run_duration_so_the_pooled_throughput_is_exact():
    frame, durations = _synthetic_requests({"ar": 100.0, "fixed:gamma=2": 130.0})
    table = throughput_units(frame, durations)
    assert table.n == 16  # the unit is the prompt: its three repeats are summed, not counted as three draws
    total = sum(d for (m, _), d in durations.items() if m == "ar")
    assert table.den["ar"].sum() == pytest.approx(total)
    assert table.num["ar"].sum() / table.den["ar"].sum() == pytest.approx(
        frame[frame.method == "ar"]["output_tokens"].sum() / total)


def test_decode_clusters_count_tokens_after_the_first_over_e2el_minus_ttft():
    frame, _ = _synthetic_requests({"ar": 100.0, "fixed:gamma=2": 130.0})
    frame.loc[0, "status"] = "error"  # a failed request and a one-token one count 0 and take no time
    frame.loc[1, "output_tokens"] = 1
    table = decode_units(frame)
    assert table.n == 16
    mine = frame[(frame.method == "ar") & (frame.status == "ok") & (frame.output_tokens > 1)]
    assert table.num["ar"].sum() == mine["output_tokens"].sum() - len(mine)
    assert table.den["ar"].sum() == pytest.approx(((mine["e2el_ms"] - mine["ttft_ms"]) / 1e3).sum())
    cells = table.cells[(table.cells.method == "ar") & (table.cells.repeat == 0)].set_index("unit")
    assert cells.loc[0, "num"] == 0 and cells.loc[0, "den"] == 0 and cells.loc[1, "den"] == 0
    # at concurrency 1 with one request per cluster, pooled decode tok/s is the token-weighted 1/TPOT
    assert table.num["fixed:gamma=2"].sum() / table.den["fixed:gamma=2"].sum() > table.num["ar"].sum() / table.den[
        "ar"].sum()


def test_compare_finds_the_best_its_indistinguishable_twin_and_the_noise_floor():
    # 3 repeats x 16 prompts (seed 0): γ=2 and γ=3 equally fast (1.30x), γ=6 slower (1.05x); AR run twice.
    speed = {"ar": 100.0, AA_LABEL: 100.0, "fixed:gamma=2": 130.0, "fixed:gamma=3": 130.0, "fixed:gamma=6": 105.0}
    frame, durations = _synthetic_requests(speed)
    per_repeat = {m: [frame[(frame.method == m) & (frame.repeat == r)].output_tokens.sum() / durations[(m, r)]
                      for r in range(3)] for m in speed}
    gammas = {"ar": 0, AA_LABEL: 0, "fixed:gamma=2": 2, "fixed:gamma=3": 3, "fixed:gamma=6": 6}
    result = compare(frame, durations, per_repeat, gammas)
    assert result.best in {"fixed:gamma=2", "fixed:gamma=3"}
    assert set(result.indistinguishable) == {"fixed:gamma=2", "fixed:gamma=3"}
    g2 = result.fields["fixed:gamma=2"]
    assert g2["speedup_ci95_lo"] < 1.3 < g2["speedup_ci95_hi"]
    assert result.fields["fixed:gamma=6"]["speedup_ci95_hi"] < g2["speedup_ci95_lo"]
    assert result.mad_pick == "fixed:gamma=2"  # within 1% of γ=3: the smaller γ
    assert result.noise_floor_pct is not None and 0 < result.noise_floor_pct < 5
    assert AA_LABEL not in result.indistinguishable and result.fields[AA_LABEL]["best"] is False
    assert result.statistics["n_units"] == 16 and result.statistics["interval"] == T_METHOD
    assert result.statistics["unit"].startswith("prompt") and result.statistics["repeats"] == 3
    assert g2["speedup_verdict"] == "faster" and result.fields["fixed:gamma=6"]["speedup_verdict"] == "faster"
    assert result.fields[AA_LABEL]["speedup_verdict"].startswith(("not resolved", "equivalent"))
    assert not result.best_resolved  # γ=2 and γ=3 are the same speed: the top estimate is not a resolved winner


def test_latency_p99_is_reported_only_with_100_samples_behind_it():
    frame, _ = _synthetic_requests({"ar": 100.0}, repeats=3, prompts=16)
    few = latency_intervals(frame, seed=0, n_resamples=199)
    assert few["p99_ttft_ms_ci95_lo"] is None and few["ttft_samples"] == 48
    assert few["p50_ttft_ms_ci95_lo"] <= np.median(frame.ttft_ms) <= few["p50_ttft_ms_ci95_hi"]
    many, _ = _synthetic_requests({"ar": 100.0}, repeats=5, prompts=20)
    assert latency_intervals(many, seed=0, n_resamples=199)["p99_ttft_ms_ci95_hi"] is not None


def test_goodput_counts_requests_meeting_every_set_slo_as_vllm_does():
    frame = pd.DataFrame({"status": ["ok", "ok", "ok", "failed", "ok"],
                          "ttft_ms": [10.0, 10.0, 30.0, 1.0, 20.0],
                          "tpot_ms": [5.0, 6.0, 5.0, 1.0, None],  # None: one output token → TPOT 0
                          "e2el_ms": [100.0, 100.0, 100.0, 1.0, 20.0]})
    slo = parse_slo({"ttft_ms": 20, "tpot_ms": 5, "e2el_ms": None})
    assert slo == {"ttft_ms": 20.0, "tpot_ms": 5.0}
    assert good_requests(frame, slo).tolist() == [1, 0, 0, 0, 1]  # limits inclusive; failed never good
    assert good_requests(frame, {}).tolist() == [1, 1, 1, 0, 1]


@pytest.mark.parametrize("bad", [{"ttft_ms": 0}, {"tpot_ms": -5}, {"e2el_ms": "fast"}, {"latency_ms": 3}])
def test_bad_slo_values_are_one_line_errors(bad):
    with pytest.raises(SpectuneError, match=r"^slo\.\w+"):
        parse_slo(bad)


def test_mlperf_p99_uses_the_nearest_rank():
    assert nearest_rank(np.arange(1, 101), 99) == 99.0
    assert nearest_rank(np.arange(1, 11), 99) == 10.0
    frame = pd.DataFrame({"status": ["ok"] * 100, "ttft_ms": np.arange(1.0, 101.0), "tpot_ms": [4.0] * 100})
    check = p99_check(frame, {"ttft_ms": 99.0, "tpot_ms": 3.9})
    assert check["slo_p99_ttft_ms_pass"] and not check["slo_p99_tpot_ms_pass"] and not check["slo_p99_pass"]
    assert p99_check(frame, {}) == {}
