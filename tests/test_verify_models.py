"""The exactness audit on the real (embedded tiny) model pair: `task=verify task.source=models`.

Seeded throughout (seed 20260923). Rule: the audit's own (every cell |freq−p| < 4.5 SE, chi-square
p-value > 1e-3, no p=0 hit), on the cells of :func:`spectune.audit.bins.make_bins` (n·p ≥ 5 own cell).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from spectune.audit.bins import REST, ZERO, binned_fit, chi2_power, event_test, make_bins
from spectune.audit.fit import FitRule
from spectune.errors import SpectuneError

REPO = Path(__file__).resolve().parent.parent
RULE = FitRule()
SEED = 20260923


def test_bins_follow_expected_counts_and_keep_zero_tokens_apart() -> None:
    p = np.array([0.5, 0.3, 0.1, 0.06, 0.04, 0.0])
    bins = make_bins(p, n=100, min_expected=5)  # expected 50, 30, 10, 6, 4, 0
    assert bins.labels == ["0", "1", "2", "3", REST, ZERO]
    assert bins.law(p) == pytest.approx([0.5, 0.3, 0.1, 0.06, 0.04, 0.0])
    counts = np.array([50, 30, 10, 6, 3, 1])
    res, _ = binned_fit(counts, p, 5, RULE)
    assert not res.passed and res.zero_prob_hits == [5]  # one draw of a p=0 token fails the rule


def test_one_cell_is_untestable_not_a_failure() -> None:
    """n·p < 5 everywhere: a lone 'rest' cell with law exactly 1, no chi-square, no |Δ|/SE = inf."""
    p = np.full(1000, 1e-3)
    res, bins = binned_fit(np.bincount([3, 7, 7], minlength=1000), p, 5, RULE)
    assert bins.labels == [REST] and res.law.tolist() == [1.0]
    assert res.chi2_dof == 0 and res.max_z == 0.0 and res.passed


def test_power_and_event_test_are_consistent() -> None:
    p_cells, alt = np.array([0.5, 0.5]), np.array([0.45, 0.55])
    assert chi2_power(p_cells, p_cells, 1000, 1e-3) == pytest.approx(1e-3, rel=1e-6)  # size at the null
    assert chi2_power(p_cells, alt, 10_000, 1e-3) > 0.99  # λ = 10000·0.01 = 100
    ev = event_test(np.array([True] * 40 + [False] * 60), np.full(100, 0.5), alt_prob=np.full(100, 0.4))
    assert ev.z == pytest.approx(-2.0) and ev.alt_z == pytest.approx(-2.0)
    assert 0.1 < ev.alt_power(0.05) < 0.6


@pytest.fixture(scope="module")
def real() -> tuple:
    from hydra import compose, initialize_config_dir

    from spectune.models.loading import load_pair
    from workloads.loader import load_workload

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+workload=en", "workload.categories=[chat-lines]"])
    pair = load_pair(cfg.models, cfg.hardware)
    return pair, load_workload(cfg.workload, pair.tokenizer)


def test_the_pairs_laws_are_the_warped_next_token_laws_and_continue_the_prompt() -> None:
    """The laws the models audit tests (spectune.audit.real_pair), on a tiny real Llama (vocabulary 64, 60 ids
    used): float64 rows summing to 1, and p(· | prompt, t) from the cached continuation equal to a fresh forward
    over prompt + t (to 1e-9)."""
    from spectune.audit.real_pair import continuation_laws, next_law
    from spectune.sampling import SamplingParams
    from tests.tiny_models import tiny_llama

    model, sampling, prompt = tiny_llama(seed=1, init=0.1), SamplingParams(temperature=1.0), [5, 9, 2, 33, 7]
    law = next_law(model, prompt, sampling, vocab=60)
    assert law.dtype == np.float64 and law.shape == (60,) and abs(law.sum() - 1) < 1e-12
    firsts = [int(t) for t in np.argsort(law)[-3:]]  # the three likeliest next tokens
    rows = continuation_laws(model, prompt, firsts, sampling, vocab=60)
    fresh = np.stack([next_law(model, [*prompt, t], sampling, vocab=60) for t in firsts])
    assert rows.shape == fresh.shape == (3, 60) and np.abs(rows - fresh).max() < 1e-9


@pytest.mark.slow(reason="a Monte Carlo of thousands of trials per prompt on the model pair")
def test_naive_is_caught_at_the_sampler_level_on_the_real_pair(real) -> None:
    """Among the first 3 en prompts, the next position with the largest TV(naive, p) (analytic, float64).

    n = 3000 trials; the binned chi-square's power against the naive law there is computed (noncentral
    chi-square) and must be ≥ 0.95 for the test to be meaningful; then exact must PASS and naive FAIL.
    """
    from spectune.audit.laws import PositionLaws
    from spectune.audit.montecarlo import first_token_counts
    from spectune.audit.real_pair import next_law
    from spectune.sampling.rejection import get_sampler

    pair, wl = real
    laws = [PositionLaws.of(next_law(pair.target, pr.input_ids, wl.sampling),
                            next_law(pair.draft, pr.input_ids, wl.sampling)) for pr in wl.prompts[:3]]
    worst = max(laws, key=lambda law: law.tv_naive)
    assert worst.tv_naive > 0.05  # measured ≈ 0.068 on the embedded pair at T = 1
    n = 3000
    bins = make_bins(worst.p, n, 5)
    power = chi2_power(bins.law(worst.p), bins.law(worst.naive), n, RULE.min_pvalue)
    assert power is not None and power >= 0.95, power
    samplers = {name: get_sampler(name) for name in ("exact", "naive")}
    counts = first_token_counts(samplers, worst.p, worst.q, n, SEED)
    exact, _ = binned_fit(counts["exact"], worst.p, 5, RULE)
    naive, _ = binned_fit(counts["naive"], worst.p, 5, RULE)
    assert exact.passed, exact.reasons
    assert not naive.passed


@pytest.mark.slow(reason="the whole models audit: 2000 sampler trials and 64 engine requests per sampler")
def test_models_mode_end_to_end(harness_in_process, tmp_path: Path, caplog) -> None:
    """The user command with small counts, in process (front-door checks, composition, the task): 1 prompt × 2000
    trials, 64 engine requests per sampler."""
    caplog.set_level("INFO")
    code = harness_in_process(tmp_path, "task=verify", "task.source=models", "+workload=en", "task.real.prompts=1",
                              "task.real.trials=2000", "task.real.engine_requests=64",
                              "task.real.engine_concurrency=64")
    assert code == 0
    assert any("Verdict: exact PASS (configured)" in r.getMessage() for r in caplog.records)
    out = json.loads((tmp_path / "verify.json").read_text())
    assert out["source"] == "models" and out["exit_code"] == 0 and out["verdict"]["exact"] == "PASS"
    level = out["models_audit"]["sampler_level"]
    (prompt,) = level["prompts"]
    assert level["trials"] == 2000 and prompt["tv_naive_vs_p"] > 0 and prompt["tv_corrected_vs_p"] < 1e-9
    assert sum(prompt["variants"]["exact"]["counts"]) == 2000 and prompt["variants"]["exact"]["verdict"] == "PASS"
    assert 0 <= prompt["chi2_power_vs_naive"] <= 1 and prompt["cell_labels"][-1] == REST
    engine = out["models_audit"]["engine_level"]
    assert engine["gamma"] == 3 and engine["requests"] == 64
    exact = engine["variants"]["exact"]
    assert exact["passed"] and exact["n"] + exact["ended_at_eos"] == 64
    assert exact["residual_event"]["expected"] > 0 and "power_vs_naive" in exact["residual_event"]
    assert out["models"]["target"]["vocab_size"] == 8192 and out["workload"]["name"] == "en"


def test_models_mode_without_workload_is_a_one_line_error(harness_in_process, tmp_path: Path) -> None:
    with pytest.raises(SpectuneError, match="needs a workload") as err:
        harness_in_process(tmp_path, "task=verify", "task.source=models")
    assert "\n" not in str(err.value) and not list(tmp_path.iterdir())


@pytest.mark.slow(reason="the engine level twice over on the model pair: one setting, then a batch of three mixed")
def test_models_mode_audits_a_mixed_batch_row_by_row(harness_in_process, tmp_path: Path) -> None:
    """``task.real.engine_mix``: 96 requests per sampler at concurrency 48, greedy / T = 1 / T = 0.7 with top-k 50
    and top-p 0.9 in turn (32 each, every batch mixing the three), each setting's law of token 2 given token 1 judged
    against its own laws with the audit's rule (seed 20260923). The exact sampler passes every setting; on the greedy
    rows every sampler emits the argmax (each is right where p is one-hot), so a wrong one can only show on the
    rows that sample."""
    code = harness_in_process(tmp_path, "task=verify", "task.source=models", "+workload=en", "task.real.prompts=1",
                              "task.real.trials=500", "task.real.engine_requests=96",
                              "task.real.engine_concurrency=48",
                              "task.real.engine_mix=[{temperature:0},{temperature:1.0},"
                              "{temperature:0.7,top_k:50,top_p:0.9}]")
    assert code == 0
    mixed = json.loads((tmp_path / "verify.json").read_text())["models_audit"]["mixed_batch"]
    assert mixed["requests"] == 96 and [s["temperature"] for s in mixed["settings"]] == [0, 1.0, 0.7]
    exact = mixed["variants"]["exact"]
    assert exact["passed"] and [s["sampling"]["top_k"] for s in exact["by_setting"]] == [0, 0, 50]
    assert all(s["n"] + s["ended_at_eos"] == 32 for s in exact["by_setting"])
    for variant in mixed["variants"].values():
        assert variant["by_setting"][0]["not_the_argmax"] == 0 and variant["by_setting"][0]["passed"]


@pytest.mark.parametrize("value, message", [
    ("[{temperature:0}]", "task.real.engine_mix=[{'temperature': 0}] is invalid: a list of at least two"),
    ("[{temperature:0},{temperature:1,top_n:3}]", "task.real.engine_mix[1].top_n is not a key of a setting"),
])
def test_a_bad_engine_mix_is_a_one_line_error_before_any_model(harness_in_process, tmp_path: Path, value: str,
                                                                message: str) -> None:
    with pytest.raises(SpectuneError, match=re.escape(message)) as err:
        harness_in_process(tmp_path, "task=verify", "task.source=models", "+workload=en",
                           f"task.real.engine_mix={value}")
    assert "\n" not in str(err.value) and not list(tmp_path.iterdir())
