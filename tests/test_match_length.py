"""policy=match-length, the model-free draft's baseline rule: a row's chain is verified up to the ceiling only where its
match covers at least min_match tokens, else nothing; greedy output stays the target's, the replay on prompt-lookup
traces decides what the live engine decides on the same cycles, min_match is tuned in replay, and under a draft model
(no match) every row reads 0.

Recordings: tests/tiny_models.record_lookup (prompt lookup on the tiny pair's target, greedy, seed 5, γ 4,
concurrency 1 or 2); exact equality, no tolerance.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from policies.envs.data import TraceSet
from policies.envs.replay import replay_gammas
from policies.match_length import MIN_MATCHES
from policies.registry import make_policy
from spectune.costmodel.profile import load_profile
from spectune.engine import Engine
from spectune.engine.policy import SIGNALS, FixedGamma
from spectune.engine.proposers.lookup import PromptLookup
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import live_against_replay, random_requests, record_lookup, tuned_in_replay

GAMMA = 4
PROFILE = "tiny-cpu-2core-vm"


def _policy(min_match: int, gamma: int = GAMMA):
    return make_policy({"name": "match-length", "min_match": min_match}, gamma)


@pytest.fixture(scope="module")
def recorded(pair):
    """(engine, requests, traces, each entry's output position at its cycle's start, outputs)."""
    engine, requests, frame, outputs = record_lookup(pair, GAMMA, 1)
    positions = frame.groupby(["cycle", "row"], sort=True)["output_position"].first().to_numpy()  # TraceSet's order
    return engine, requests, TraceSet(frame, {"concurrency": 1}, "memory"), positions, outputs


def _first_match(traces: TraceSet) -> np.ndarray:
    """[N] each recorded (cycle, row)'s match length (the same at every position)."""
    return traces.signals[:, 0, list(SIGNALS).index("match_length")]


@pytest.mark.parametrize("min_match", [0, 1, 2, 3])
def test_the_replayed_rule_verifies_the_chain_where_the_match_is_long_enough_and_nothing_elsewhere(recorded,
                                                                                                    min_match):
    _, _, traces, _, _ = recorded
    gammas = replay_gammas(_policy(min_match), traces, GAMMA, load_profile(PROFILE))
    expected = np.where(_first_match(traces) >= min_match, np.minimum(GAMMA, traces.chain), 0)
    assert (gammas == expected).all()
    if min_match == 2:
        assert 0 < (gammas > 0).sum() < (traces.chain > 0).sum()  # some chains verified, some dropped


@pytest.mark.parametrize("gamma", [1, GAMMA])
def test_live_the_rule_drafts_what_its_replay_decides_on_the_same_cycles(recorded, gamma):
    """Greedy, concurrency 1, min_match 2, ceiling 1 (the cut alone decides: no step is offered to continue_drafting)
    and GAMMA: every live cycle that starts where a recorded one does, with the same text so far, verifies what the
    replay of that recorded cycle verifies."""
    engine, requests, traces, positions, traced = recorded
    replayed = replay_gammas(_policy(2, gamma), traces, gamma, load_profile(PROFILE))
    compared, decided = live_against_replay(engine, requests, _policy(2, gamma), traces, positions, traced, replayed)
    assert compared >= len(requests) and any(decided.values()) and not all(decided.values())


def test_greedy_output_is_the_targets_whatever_the_threshold(pair):
    """Greedy, prompt lookup, concurrency 1 and 3, min_match 0..3 and 8: the autoregressive output token for token;
    min_match 0 decides as the fixed γ."""
    target, _ = pair
    engine = Engine(target, PromptLookup(max_n=3), sampling=SamplingParams(temperature=0),
                    sampler=get_sampler("exact"), device="cpu", seed=0)
    requests = random_requests(3, max_new=10, seed=2)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    for concurrency in (1, 3):
        fixed = engine.run(requests, FixedGamma(GAMMA), concurrency)
        for min_match in (0, 1, 2, 3, 8):
            result = engine.run(requests, _policy(min_match), concurrency)
            assert {r.request_id: r.output_ids for r in result.requests} == reference, min_match
            assert all(c.num_drafts <= GAMMA for c in result.cycles)
            if min_match == 0:
                assert [c.num_drafts for c in result.cycles] == [c.num_drafts for c in fixed.cycles]
            if min_match == 8:  # longer than any prompt-lookup match (max_n 3): nothing is verified
                assert all(c.num_drafts == 0 for c in result.cycles)


def test_under_a_draft_model_every_row_reads_no_match_and_the_log_says_so_once(pair, caplog):
    target, draft = pair
    engine = Engine(target, draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    requests = random_requests(2, max_new=8)
    with caplog.at_level(logging.WARNING, logger="policies.match_length"):
        none = engine.run(requests, _policy(1), 1)
    assert all(c.num_drafts == 0 for c in none.cycles)
    assert sum("reports no match" in r.getMessage() for r in caplog.records) == 1
    every, fixed = engine.run(requests, _policy(0), 1), engine.run(requests, FixedGamma(GAMMA), 1)
    assert [c.num_drafts for c in every.cycles] == [c.num_drafts for c in fixed.cycles]


def test_min_match_is_tuned_in_replay_on_the_lookup_traces(recorded):
    """Every grid value replayed once; the chosen one has the best replay tok/s; the extremes decide differently."""
    _, _, traces, _, _ = recorded
    table = tuned_in_replay("match-length", {"name": "match-length", "min_match": 2}, MIN_MATCHES, traces,
                            load_profile(PROFILE), GAMMA)
    means = dict(zip(table["value"], table["mean_gamma"], strict=True))
    assert means[0] > means[3] and means[16] == 0


@pytest.mark.parametrize("value", [-1, 1.5, "many"])
def test_a_bad_min_match_fails_in_one_line(value):
    with pytest.raises(SpectuneError, match=r"policy\.min_match=") as err:
        _policy(value)
    assert "\n" not in str(err.value)
