"""analysis.signals: the tested positions of a trace and the ROC AUC of each draft signal."""

import numpy as np
import pandas as pd
import pytest

from analysis.signals import auc, signal_auc, verified_positions


def _trace(accepted: list[list[bool]], token_prob: list[list[float]]) -> pd.DataFrame:
    rows = []
    for cycle, (acc, prob) in enumerate(zip(accepted, token_prob, strict=True)):
        for position, (a, p) in enumerate(zip(acc, prob, strict=True), start=1):
            rows.append({"cycle": cycle, "row": 0, "request_id": cycle % 2, "position": position, "accepted": a,
                         "token_prob": p, "entropy": -p, "margin": p, "cum_prob": p})
    return pd.DataFrame(rows)


def test_only_positions_up_to_the_first_rejection_are_tested():
    frame = _trace([[True, False, True], [False, True, True], [True, True, True]], [[0.9, 0.2, 0.8]] * 3)
    kept = verified_positions(frame.sample(frac=1.0, random_state=0))  # order of rows does not matter
    assert sorted(zip(kept["cycle"], kept["position"], strict=True)) == [(0, 1), (0, 2), (1, 1), (2, 1), (2, 2), (2, 3)]


def test_auc_is_the_probability_of_ranking_an_accepted_draft_higher_ties_half():
    assert auc(np.array([0.9, 0.8, 0.1]), np.array([1, 1, 0])) == 1.0
    assert auc(np.array([0.1, 0.2, 0.9]), np.array([1, 1, 0])) == 0.0
    assert auc(np.array([0.5, 0.5]), np.array([1, 0])) == 0.5
    assert auc(np.array([0.3, 0.7, 0.5, 0.5]), np.array([1, 1, 0, 1])) == pytest.approx((0 + 1 + 0.5) / 3)
    assert np.isnan(auc(np.array([0.3]), np.array([1])))


def test_a_signal_that_decides_acceptance_scores_one_and_noise_scores_near_half():
    rng = np.random.default_rng(7)
    n = 4000  # one-position cycles, so every position is tested
    prob = rng.random(n)
    frame = pd.DataFrame({"cycle": np.arange(n), "row": 0, "request_id": np.arange(n) % 50, "position": 1,
                          "accepted": prob > 0.4, "token_prob": prob, "entropy": -prob,
                          "margin": rng.random(n), "cum_prob": prob})
    table = signal_auc(frame, resamples=200, seed=1).set_index("signal")
    assert table.loc["token_prob", "auc"] == 1.0 and table.loc["-entropy", "auc"] == 1.0
    # an unrelated signal over 4000 positions: AUC within 0.05 of chance (its sd here is ~0.009)
    assert abs(table.loc["margin", "auc"] - 0.5) < 0.05
    assert table.loc["margin", "ci95_lo"] < 0.5 < table.loc["margin", "ci95_hi"]
    assert (table["positions"] == n).all() and (table["requests"] == 50).all()
