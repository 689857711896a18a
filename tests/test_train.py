"""PPO training in replay: the hindsight oracle is the best per-cycle choice, the replay scores are the
environment's accounting, and `python -m harness task=train` writes a policy file that `policy=ppo` loads."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pandas as pd
import pytest

from policies.envs.data import TraceSet
from policies.envs.replay import ORACLE_KEYS, oracle_gammas, replay_scores
from policies.registry import make_policy
from policies.train.ppo import WarmupLinear, split_requests
from spectune.costmodel.profile import Profile
from spectune.errors import SpectuneError


def _traces(leading: list[int], gamma: int = 3, accept_prob: float | None = 0.5) -> TraceSet:
    """One recorded cycle per entry, batch 1, whose first ``leading`` drafts are accepted (every draft's acceptance
    probability ``accept_prob``; None: its outcome, 1 or 0)."""
    rows = []
    for cycle, lead in enumerate(leading):
        for position in range(1, gamma + 1):
            rows.append({"cycle": cycle, "row": 0, "request_id": cycle, "position": position, "batch_size": 1,
                         "context_length": 10, "recent_acceptance": 0.5, "token_prob": 0.5, "entropy": 1.0,
                         "margin": 0.1, "cum_prob": 0.5 ** position,
                         "accept_prob": float(position <= lead) if accept_prob is None else accept_prob,
                         "accepted": position <= lead})
    return TraceSet(pd.DataFrame(rows))


def _profile(draft: float, slope: float, gamma: int = 3) -> Profile:
    verify = [1.0 + slope * n for n in range(gamma + 1)]
    return Profile("test", [1], gamma + 1, {1: draft}, {1: verify}, {1: 0.0})


def test_replay_scores_of_fixed_gammas_and_the_oracle_are_known_answers():
    """Cycles with 3, 0, 1 leading accepts; draft step 0.1, verify 1 + 0.1 n (seconds, AR step 1).
    γ = k costs 1 + 0.2 k per cycle; tokens min(lead, k) + 1. Fixed: k=0 3/3 = 1.0; k=1 5/3.6; k=2 6/4.2;
    k=3 7/4.8 = 1.458. The oracle drafts 3, 0, 1: tokens 4 + 1 + 2 = 7 in 1.6 + 1 + 1.2 = 3.8 s -> 1.842."""
    traces = _traces([3, 0, 1])
    scores = replay_scores(traces, _profile(0.1, 0.1), 3, np.array([3, 0, 1]))
    np.testing.assert_allclose(scores["fixed_tok_s"], [1.0, 5 / 3.6, 6 / 4.2, 7 / 4.8])
    assert scores["best_fixed_gamma"] == 3
    assert scores["oracle_tok_s"] == pytest.approx(7 / 3.8) == scores["policy_tok_s"]
    assert scores["vs_best_fixed_pct"] == pytest.approx(100 * ((7 / 3.8) / (7 / 4.8) - 1))


def test_the_informed_oracle_knows_acceptance_odds_not_the_coin():
    """Same cycles. With every draft's acceptance probability 0.4 the odds tell the cycles apart not at all: the
    informed oracle's expected tokens per γ are 1, 1.4, 1.56, 1.624 for costs 1, 1.2, 1.4, 1.6 (rates 1, 1.167,
    1.114, 1.015: γ 1) in every cycle, so it scores fixed γ 1 on the realised outcomes. With
    probabilities equal to the outcomes (0 or 1) it knows what the hindsight oracle knows and matches it."""
    traces = _traces([3, 0, 1], accept_prob=0.4)
    scores = replay_scores(traces, _profile(0.1, 0.1), 3, np.zeros(3, dtype=int))
    assert scores["informed_oracle_tok_s"] == pytest.approx(5 / 3.6)
    assert scores["informed_oracle_vs_best_fixed_pct"] == pytest.approx(100 * ((5 / 3.6) / (7 / 4.8) - 1))
    scores = replay_scores(_traces([3, 0, 1], accept_prob=None), _profile(0.1, 0.1), 3, np.zeros(3, dtype=int))
    assert scores["informed_oracle_tok_s"] == pytest.approx(scores["oracle_tok_s"]) == pytest.approx(7 / 3.8)


def _batch_traces(leading: list[list[int]], gamma: int = 3) -> TraceSet:
    """Batch cycles: ``leading[c]`` holds the leading accepts of cycle c's rows (one slot each)."""
    rows = []
    for cycle, leads in enumerate(leading):
        for row, lead in enumerate(leads):
            for position in range(1, gamma + 1):
                rows.append({"cycle": cycle, "row": row, "request_id": row, "position": position,
                             "batch_size": len(leads), "context_length": 10, "recent_acceptance": 0.5,
                             "token_prob": 0.5, "entropy": 1.0, "margin": 0.1, "cum_prob": 0.5 ** position,
                             "accept_prob": 0.5, "accepted": position <= lead})
    return TraceSet(pd.DataFrame(rows))


def test_rows_of_a_batch_are_charged_the_cycle_their_deepest_row_runs_to():
    """Two cycles of two rows (leads 3, 0 and 1, 1); draft step 0.1, verify 1 + 0.1 n at batch 2, so a cycle of
    γ = k costs 1 + 0.2 k. γ (3, 0), (1, 1): tokens 4 + 1 + 2 + 2 = 9. In lockstep (per request: every row
    waits for its whole cycle) the charge is 2·1.6 + 2·1.2 = 5.6 s; at each row's own γ it was 1.6 + 1.0 +
    1.2 + 1.2 = 5.0 s, the cheaper fiction a per-row policy was scored by. The lockstep oracle picks one γ per
    cycle: 3 for the first (5 tokens / 3.2 s; γ 0: 2 / 2.0) and 1 for the second (4 / 2.4): 9 / 5.6, below the
    per-row oracle's unrealisable 9 / 5.0."""
    traces = _batch_traces([[3, 0], [1, 1]])
    profile = Profile("test", [2], 4, {2: 0.1}, {2: [1.0 + 0.1 * n for n in range(4)]}, {2: 0.0})
    gammas = np.array([3, 0, 1, 1])
    locked = replay_scores(traces, profile, 3, gammas, rate="request")
    own = replay_scores(traces, profile, 3, gammas, rate="request", lockstep=False)
    assert locked["policy_tok_s"] == pytest.approx(9 / 5.6) and own["policy_tok_s"] == pytest.approx(9 / 5.0)
    assert own["oracle_tok_s"] == pytest.approx(9 / 5.0)  # the per-row oracle chose exactly these γ
    assert locked["oracle_tok_s"] == pytest.approx(9 / 5.6)
    assert locked["fixed_tok_s"] == own["fixed_tok_s"]  # a fixed γ is the same in both accounts
    batch_one = _traces([3, 0, 1])  # one row per cycle: nothing to wait for
    for lockstep in (True, False):
        scores = replay_scores(batch_one, _profile(0.1, 0.1), 3, np.array([3, 0, 1]), lockstep=lockstep)
        assert scores["policy_tok_s"] == pytest.approx(7 / 3.8) == scores["oracle_tok_s"]


def test_scores_without_the_oracles_are_the_same_scores():
    """Callers that score many γ choices on one set of traces (threshold tuning, the table, the comparison)
    leave the oracles out: they depend on the traces and costs only. The policy's scores do not change."""
    traces = _batch_traces([[3, 0], [1, 1]])
    profile = Profile("test", [2], 4, {2: 0.1}, {2: [1.0 + 0.1 * n for n in range(4)]}, {2: 0.0})
    full = replay_scores(traces, profile, 3, np.array([3, 0, 1, 1]), rate="request")
    bare = replay_scores(traces, profile, 3, np.array([3, 0, 1, 1]), rate="request", oracles=False)
    assert not any("oracle" in key for key in bare)
    assert set(full) - set(bare) == set(ORACLE_KEYS)
    assert bare == {key: value for key, value in full.items() if "oracle" not in key}


def test_the_oracle_stops_before_its_first_rejection_only_when_verification_pays():
    """With verification of each extra position as dear as 2 AR steps, drafting loses: the oracle drafts nothing."""
    traces = _traces([3, 0, 1])
    tokens = np.minimum(traces.leading[:, None], np.arange(4)[None, :]) + 1.0
    costs = np.array([[1.0 + 2.1 * k for k in range(4)]] * 3)
    assert oracle_gammas(tokens, costs).tolist() == [0, 0, 0]
    rng = np.random.default_rng(0)  # and it is never beaten by any per-cycle choice (exhaustive, 3 cycles)
    for _ in range(20):
        costs = 1.0 + rng.uniform(0, 1, (3, 1)) * np.arange(4)[None, :]
        best = oracle_gammas(tokens, costs)
        rate = tokens[np.arange(3), best].sum() / costs[np.arange(3), best].sum()
        for choice in np.ndindex(4, 4, 4):
            other = tokens[np.arange(3), choice].sum() / costs[np.arange(3), choice].sum()
            assert other <= rate + 1e-12


def test_learning_rate_warms_up_then_decays_linearly():
    schedule = WarmupLinear(1e-3, 0.1)
    assert schedule(1.0) == pytest.approx(1e-5)  # 1% floor at the very start
    assert schedule(0.95) == pytest.approx(0.5e-3)
    assert schedule(0.9) == pytest.approx(1e-3)
    assert schedule(0.45) == pytest.approx(0.5e-3)
    assert schedule(0.0) == 0.0


def test_an_empty_or_too_large_split_fails_in_one_line():
    with pytest.raises(SpectuneError, match=r"train\.train_prompts=8"):
        split_requests(list(range(5)), 8, 2)
    assert split_requests(list(range(10)), 6, 3) == ([0, 1, 2, 3, 4, 5], [6, 7, 8])


@pytest.mark.slow(reason="trains a PPO γ policy through python -m harness task=train")
def test_train_cli_writes_a_policy_that_policy_ppo_loads(cli, tmp_path):
    """The whole task on the embedded pair, tiny, through the front door: trace 5 prompts, measure the profile, 256
    PPO steps; bad input through its alias python -m policies.train."""
    result = cli("task=train", "+workload=en", "train.train_prompts=5", "train.heldout_prompts=1",
                 "train.timesteps=256", "train.eval_every=128", "train.max_gamma=4", "train.profile_repeats=1",
                 "workload.max_new_tokens=12", run_dir=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("gamma.zip", "curves.csv", "curves.png", "train.json", "traces.parquet", "profile.json"):
        assert (tmp_path / name).is_file(), name
    with zipfile.ZipFile(tmp_path / "gamma.zip") as archive:
        extra = json.loads(archive.read("spectune.json"))
    assert extra["profile"]["kind"] == "spectune-profile" and extra["observation"]["version"] == 1 \
        and len(extra["observation"]["features"]) == 10
    policy = make_policy({"name": "ppo", "gamma_path": str(tmp_path / "gamma.zip"), "trust_pickle": False,
                          "profile": None, "allow_profile_mismatch": False, "deterministic": True, "seed": 0}, 4)
    assert policy.describe()["profile"] == extra["profile"]["label"]
    distilled = extra["distilled"]  # the stops distilled on the training traces, for policy=ppo-distilled
    assert len(distilled["thresholds"]) == 3 and sum(distilled["decisions"]) > 0
    assert 0 < distilled["overall_agreement"] <= 1
    assert distilled["start_decisions"] > 0 and 0 < distilled["start_agreement"] <= 1  # step 0's rule, beside them
    node = {"name": "ppo-distilled", "gamma_path": str(tmp_path / "gamma.zip"), "trust_pickle": False,
            "profile": None, "allow_profile_mismatch": False, "thresholds": None, "start_threshold": None}
    loaded = make_policy(node, 4)
    assert list(loaded.thresholds) == distilled["thresholds"]
    assert loaded.start_threshold == distilled["start_threshold"] is not None
    curves = pd.read_csv(tmp_path / "curves.csv")
    assert curves["timesteps"].tolist()[0] == 0 and curves["timesteps"].max() >= 256
    assert (curves["oracle_tok_s"] >= curves[["policy_tok_s", "best_fixed_tok_s"]].max(axis=1) - 1e-9).all()
    bad = cli("+workload=en", "train.train_prompts=100000", run_dir=tmp_path / "bad", module="policies.train")
    assert bad.returncode == 2 and "train.train_prompts=100000" in bad.stdout + bad.stderr
    assert not (tmp_path / "bad" / "gamma.zip").exists()
