"""policy=suffix-prob, a threshold on the running product of a suffix-decoding chain's scores: the replay keeps the
prefix at or above it, the live engine decides what its replay decides on the same cycles, greedy output stays the
target's, the threshold is tuned in replay, and under a draft model nothing is verified.

Recordings: tests/tiny_models.record_lookup with suffix decoding (per-request tries, SuffixDecoding's adaptive rule,
ceiling GAMMA) on the tiny pair's target, greedy, seed 5, concurrency 1; exact equality, no tolerance.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from policies.envs.data import TraceSet
from policies.envs.replay import replay_gammas
from policies.registry import make_policy
from policies.suffix_prob import MIN_PROBS
from spectune.costmodel.profile import load_profile
from spectune.engine import Engine
from spectune.engine.policy import SIGNALS, FixedGamma
from spectune.engine.proposers.suffix import SuffixDrafting
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import live_against_replay, random_requests, record_lookup, tuned_in_replay

GAMMA = 6
PROFILE = "tiny-cpu-2core-vm"
SUFFIX = SuffixDrafting(max_gamma=GAMMA)


def _prob(min_prob: float, gamma: int = GAMMA):
    return make_policy({"name": "suffix-prob", "min_prob": min_prob}, gamma)


@pytest.fixture(scope="module")
def recorded(pair):
    """(engine, requests, traces, each entry's output position at its cycle's start, outputs)."""
    engine, requests, frame, outputs = record_lookup(pair, GAMMA, 1, SUFFIX)
    positions = frame.groupby(["cycle", "row"], sort=True)["output_position"].first().to_numpy()  # TraceSet's order
    return engine, requests, TraceSet(frame, {"concurrency": 1}, "memory"), positions, outputs


def _signal(traces: TraceSet, name: str) -> np.ndarray:
    """[N, GAMMA] one signal of every recorded (cycle, row), by draft step."""
    return traces.signals[:, :, list(SIGNALS).index(name)]


@pytest.mark.parametrize("min_prob", [0.1, 0.5, 0.7])
def test_suffix_prob_keeps_the_chains_prefix_whose_running_product_is_high_enough(recorded, min_prob):
    _, _, traces, _, _ = recorded
    gammas = replay_gammas(_prob(min_prob), traces, GAMMA, load_profile(PROFILE))
    prob = _signal(traces, "suffix_prob")
    expected = np.minimum((np.cumprod(prob >= min_prob, axis=1)).sum(1), traces.chain)
    assert (gammas == expected).all()
    if min_prob == 0.1:  # the proposer's own min_token_prob: every chain it grew is kept whole
        assert (gammas == np.minimum(traces.chain, GAMMA)).all()
    if min_prob == 0.5:
        assert 0 < (gammas < np.minimum(traces.chain, GAMMA)).sum() < (traces.chain > 0).sum()  # some cut, not all


@pytest.mark.parametrize("value", [0.5, 0.7])
def test_live_the_rule_drafts_what_its_replay_decides_on_the_same_cycles(recorded, value):
    """Greedy, concurrency 1: every live cycle that starts where a recorded one does, with the same text so far,
    verifies what the replay of that recorded cycle verifies."""
    engine, requests, traces, positions, traced = recorded
    replayed = replay_gammas(_prob(value), traces, GAMMA, load_profile(PROFILE))
    compared, decided = live_against_replay(engine, requests, _prob(value), traces, positions, traced, replayed)
    assert compared >= len(requests) and any(decided.values())


def test_greedy_output_is_the_targets_whatever_the_threshold(pair):
    """Greedy, suffix decoding, concurrency 1 and 3, min_prob 0.1, 0.5 and 1: the autoregressive output token for
    token, within the ceiling; 0.1 decides as the fixed γ (the proposer grew nothing below it)."""
    target, _ = pair
    engine = Engine(target, SUFFIX, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    requests = random_requests(3, max_new=10, seed=2)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    for concurrency in (1, 3):
        fixed = engine.run(requests, FixedGamma(GAMMA), concurrency)
        for policy in (_prob(0.1), _prob(0.5), _prob(1.0)):
            result = engine.run(requests, policy, concurrency)
            assert {r.request_id: r.output_ids for r in result.requests} == reference, policy.describe()
            assert all(c.num_drafts <= GAMMA for c in result.cycles)
            if policy.describe() == {"name": "suffix-prob", "max_gamma": GAMMA, "min_prob": 0.1}:
                assert [c.num_drafts for c in result.cycles] == [c.num_drafts for c in fixed.cycles]


def test_under_a_draft_model_nothing_is_verified_and_the_log_says_so_once(pair, caplog):
    target, draft = pair
    engine = Engine(target, draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    with caplog.at_level(logging.WARNING, logger="policies.suffix_prob"):
        none = engine.run(random_requests(2, max_new=8), _prob(0.5), 1)
    assert all(c.num_drafts == 0 for c in none.cycles)
    assert sum("it is not suffix decoding" in r.getMessage() for r in caplog.records) == 1


def test_the_threshold_is_tuned_in_replay_on_the_suffix_traces(recorded):
    """Every grid value replayed once; the chosen one has the best replay tok/s; the extremes decide differently."""
    _, _, traces, _, _ = recorded
    table = tuned_in_replay("suffix-prob", {"name": "suffix-prob", "min_prob": 0.1}, MIN_PROBS, traces,
                            load_profile(PROFILE), GAMMA)
    means = table["mean_gamma"].to_numpy()
    assert means[0] != means[-1]


@pytest.mark.parametrize("value", [-0.1, 1.5, "high"])
def test_a_bad_threshold_fails_in_one_line(value):
    with pytest.raises(SpectuneError, match=r"policy\.min_prob=") as err:
        _prob(value)
    assert "\n" not in str(err.value)


def test_training_warns_when_the_policy_replayed_with_its_own_history_falls_below_the_fixed_gamma(recorded, caplog):
    """policies.train's check (own_history_gap), on the suffix traces: a policy as fast as the best fixed γ passes
    silently; one that never speculates (AR's replay rate, far below) is reported in one warning."""
    from policies.envs.replay import replay_scores
    from policies.train.pipeline import own_history_gap

    _, _, traces, _, _ = recorded
    profile = load_profile(PROFILE)
    best = replay_scores(traces, profile, GAMMA, np.zeros(traces.count, dtype=int), rate="request",
                         oracles=False)
    never = replay_scores(traces, profile, GAMMA, np.zeros(traces.count, dtype=int), rate="request",
                          oracles=False)["policy_tok_s"]
    with caplog.at_level(logging.WARNING, logger="policies.train.pipeline"):
        assert own_history_gap(best["best_fixed_tok_s"], traces, profile, GAMMA) == pytest.approx(0.0, abs=1e-9)
        assert not caplog.records
        assert own_history_gap(never, traces, profile, GAMMA) < -10
    assert best["best_fixed_gamma"] > 0 and len(caplog.records) == 1
    assert "with its own decisions' history" in caplog.records[0].getMessage()
