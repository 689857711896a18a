"""Traces of a model-free draft (spectune/engine/traces.py with prompt lookup): each recorded (cycle, row) says where
its chain reached (``drafted``) and what it matched (the match signals), the values the proposer computes from that
cycle's context; past the chain nothing is accepted, so the replay still scores every γ exactly against the live
engine; the γ environment and the replay show the match signals and stop where the chain ended.

Tiny pair's target (tests/tiny_models.py) with PromptLookup(max_n=3), greedy, seed 5, 4 requests whose prompts repeat a
phrase three times, 12 new tokens, concurrency 2, every cycle drafted to γ 4; exact equality, no tolerance.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from policies.envs.cycle_gamma import CycleGammaEnv
from policies.envs.data import TraceSet
from policies.envs.gamma import DRAFT, DraftGammaEnv
from policies.envs.observation import OBS_FIELDS, SCALE
from policies.envs.replay import cycle_gammas, replay_costs, replay_gammas, replay_scores
from spectune.costmodel.profile import load_profile
from spectune.engine.policy import MATCH_SIGNALS, SIGNALS, FixedGamma
from spectune.engine.proposers.ngram import clip, lookup_chain
from spectune.engine.traces import CHAIN_COLUMNS, TRACE_COLUMNS, realised_accepted
from spectune.errors import SpectuneError
from tests.tiny_models import LOOKUP_MAX_NEW, record_lookup, record_three_requests

GAMMA, SLOTS = 4, 2
PROFILE = "tiny-cpu-2core-vm"


@pytest.fixture(scope="module")
def recorded(pair):
    """(engine, requests, traces frame, outputs) of prompt lookup on the tiny pair's target, drafted to GAMMA."""
    return record_lookup(pair, GAMMA, SLOTS)


def test_a_lookup_trace_records_where_each_chain_reached_and_the_match_the_proposer_computed(recorded):
    """Every (cycle, row) against lookup_chain on its context (prompt + output before the cycle), clipped at the
    request's length limit: the drafted prefix, the match length and count at every position, score and running
    product 1 where drafted and 0 past it, nothing accepted past it."""
    _, requests, frame, outputs = recorded
    assert list(frame.columns) == [*TRACE_COLUMNS, *CHAIN_COLUMNS]
    assert (frame.groupby(["cycle", "row"]).size() == GAMMA).all()
    prompts = {r.request_id: r.input_ids for r in requests}
    lengths = set()
    for (_, _), entry in frame.groupby(["cycle", "row"]):
        entry = entry.sort_values("position")
        rid, position = int(entry["request_id"].iloc[0]), int(entry["output_position"].iloc[0])
        found = lookup_chain([*prompts[rid], *outputs[rid][:position]], 3, 1, 1 << 16)
        chain = clip(list(found.tokens), [], LOOKUP_MAX_NEW - position - 1)
        depth = min(len(chain), GAMMA)
        drafted = entry["drafted"].to_numpy()
        assert drafted.tolist() == [True] * depth + [False] * (GAMMA - depth)
        expected = (found.match_length, found.matches) if chain else (0, 0)
        assert (entry["match_length"] == expected[0]).all() and (entry["matches"] == expected[1]).all()
        assert (entry["suffix_score"] == drafted.astype(float)).all()
        assert (entry["suffix_prob"] == drafted.astype(float)).all()
        assert not entry["accepted"][~drafted].any() and (entry["accept_prob"][~drafted] == 0).all()
        lengths.add(expected[0])
    assert len(lengths) >= 3  # no match, and matches of more than one length, were recorded


def test_the_lookup_trace_scores_every_gamma_as_the_live_engine_runs_it(recorded):
    """Live FixedGamma(k), k = 1..GAMMA, against the recording: every live cycle that starts where a recorded one
    does, with the same text so far, drafts min(k, the recorded chain) and accepts min(k, leading accepted)."""
    engine, requests, frame, traced = recorded
    by_key = {key: g.sort_values("position") for key, g in frame.groupby(["request_id", "output_position"])}
    compared = 0
    for k in range(1, GAMMA + 1):
        result = engine.run(requests, FixedGamma(k), SLOTS)
        live = {r.request_id: r.output_ids for r in result.requests}
        start = {r.request_id: 1 for r in requests}
        for c in result.cycles:
            pos = start[c.request_id]
            start[c.request_id] += c.emitted
            key = (c.request_id, pos)
            if key not in by_key or live[c.request_id][:pos] != traced[c.request_id][:pos]:
                continue
            entry = by_key[key]
            assert c.num_drafts == min(k, int(entry["drafted"].sum())), (k, key)
            assert c.accepted == realised_accepted(entry["accepted"].to_numpy(), k), (k, key)
            compared += 1
    assert compared >= 4 * GAMMA  # at least every request's first cycle at every γ


def test_the_trace_set_the_environment_and_the_replay_read_the_match_signals(recorded):
    """TraceSet holds the 8 signals and each entry's chain; the γ environment with the match features observes the
    recorded values (scaled) and verifies where the chain ended; a replayed policy is shown them and drafts no row
    past its chain."""
    _, _, frame, _ = recorded
    traces = TraceSet(frame, {"concurrency": SLOTS}, "memory")
    assert traces.match_signals and traces.signals.shape == (traces.count, GAMMA, len(SIGNALS))
    assert traces.chain.tolist() == frame.groupby(["cycle", "row"], sort=True)["drafted"].sum().tolist()
    features = (*OBS_FIELDS, *MATCH_SIGNALS)
    env = DraftGammaEnv("replay", traces, PROFILE, GAMMA, allow_profile_mismatch=True, features=features)
    index = {name: i for i, name in enumerate(features)}
    short = [i for i in range(traces.count) if 0 < traces.chain[i] < GAMMA]
    assert short, "some chain must end before the ceiling"
    for entry in short[:5]:
        obs, _ = env.reset(options={"entry": entry})
        assert obs[index["match_length"]] == 0.0  # before the first draft step: not known yet
        for step in range(int(traces.chain[entry])):
            obs, _, done, _, info = env.step(DRAFT)
            recorded_length = traces.signals[entry, step, list(SIGNALS).index("match_length")]
            assert obs[index["match_length"]] == np.float32(recorded_length / SCALE["match_length"])
        assert done and info["gamma"] == traces.chain[entry]  # verified where the chain ended, not at GAMMA

    class ShownMatch(FixedGamma):
        signals = frozenset(MATCH_SIGNALS)

        def reset(self) -> None:
            self.lengths: list[list[float]] = []

        def continue_drafting(self, step):
            self.lengths.append(step.match_length.tolist())
            return None

    policy = ShownMatch(GAMMA)
    gammas = replay_gammas(policy, traces, GAMMA, load_profile(PROFILE))
    assert (gammas == np.minimum(GAMMA, traces.chain)).all()
    assert any(value > 0 for shown in policy.lengths for value in shown)


def test_the_environment_refuses_match_features_on_a_draft_models_traces(pair):
    _, _, traces, _ = record_three_requests(pair, 3, 1)
    assert not traces.match_signals and traces.signals.shape[-1] == 4 and (traces.chain == 3).all()
    with pytest.raises(SpectuneError, match=r"features \['match_length'\] are invalid for traces=memory"):
        DraftGammaEnv("replay", traces, PROFILE, 3, allow_profile_mismatch=True, features=("position", "match_length"))


def test_task_trace_with_prompt_lookup_writes_the_chain_columns(harness_in_process, tmp_path):
    """python -m harness task=trace proposer=lookup on the tiny pair (2 English prompts, 6 tokens, γ 3): the chain
    columns are written, a position is drafted only after a drafted one, and only rows with a match draft."""
    code = harness_in_process(tmp_path, "task=trace", "proposer=lookup", "+workload=en", "workload.num_prompts=2",
                              "workload.max_new_tokens=6", "task.max_gamma=3", "task.warmup=0")
    assert code == 0
    frame = pd.read_parquet(tmp_path / "traces.parquet")
    assert list(frame.columns) == [*TRACE_COLUMNS, *CHAIN_COLUMNS] and frame["drafted"].any()
    for _, entry in frame.groupby(["cycle", "row"]):
        drafted = entry.sort_values("position")["drafted"].to_numpy()
        assert (np.diff(drafted.astype(int)) <= 0).all()
        assert drafted[0] == (entry["match_length"] > 0).all()


def test_a_ppo_file_reading_the_match_signals_observes_live_what_its_environment_observes(recorded, tmp_path):
    """One definition (tests/test_one_definition.py's claim, for a model-free draft): a real SB3 γ policy file that
    names the match signals and always continues, run live on prompt lookup, builds at every draft step the vector
    the environment builds from the recorded row, bytes to bytes (every (cycle, row) at steps within its chain, and
    the step-0 observation)."""
    from stable_baselines3 import PPO

    from policies.sb3_files import annotate_policy_file
    from tests.watched import Watched

    engine, requests, frame, outputs = recorded
    traces = TraceSet(frame, {"concurrency": SLOTS}, "memory")
    features = (*OBS_FIELDS, "match_length", "matches")
    env = DraftGammaEnv("replay", traces, PROFILE, GAMMA, allow_profile_mismatch=True, features=features)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": [8]})
    with torch.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.copy_(torch.tensor([-5.0, 5.0]))  # always "continue"
    path = tmp_path / "gamma.zip"
    model.save(path)
    annotate_policy_file(path, {"observation": {"kind": "gamma", "version": 1, "features": list(features)},
                                "actions": ["stop", "continue"], "profile": load_profile(PROFILE).to_json(),
                                "max_gamma": GAMMA})

    policy = Watched(GAMMA, str(path), False, None, False, True, 0)
    assert {"match_length", "matches"} <= policy.signals
    live = engine.run(requests, policy, SLOTS)
    assert {r.request_id: r.output_ids for r in live.requests} == outputs  # the recorded cycles, the same tokens
    entry = {(int(c), int(r)): i for i, (c, r) in enumerate(zip(traces.cycle, traces.row, strict=True))}
    compared = matched = 0
    for cycle, step, obs in policy.seen:
        for row in range(obs.shape[0]):
            i = entry.get((cycle, row))
            if i is None or step + 1 > traces.chain[i]:  # an idle slot, or past the row's chain: no env step there
                continue
            env_obs, _ = env.reset(options={"entry": i})
            for _ in range(step + 1):
                env_obs, *_ = env.step(DRAFT)
            assert env_obs.tobytes() == obs[row].tobytes(), (cycle, step, row, env_obs, obs[row])
            compared += 1
            matched += step >= 0 and obs[row][len(OBS_FIELDS)] > 0
    assert compared > traces.count and matched > 0


def test_train_features_name_fields_of_the_gamma_observation_or_fail_in_one_line():
    from policies.train.pipeline import check_features

    assert check_features(None) is None
    assert check_features(["position", "match_length"]) == ("position", "match_length")
    for bad in (["speed_of_light"], [], ["position", "position"]):
        with pytest.raises(SpectuneError, match=r"train\.features=.* is invalid: give distinct names of token_prob"):
            check_features(bad)


MATCH_FEATURES = ("position", "context_length", "recent_acceptance", "c", "g", "match_length", "matches")


SUFFIX_FEATURES = (*MATCH_FEATURES, "suffix_score", "suffix_prob")


@pytest.mark.slow(reason="trains a PPO γ policy through python -m policies.train on model-free traces")
@pytest.mark.parametrize(("proposer", "features", "measured"), [
    ("+proposer=lookup", MATCH_FEATURES, False),  # the spelling committed commands use
    ("proposer=suffix", SUFFIX_FEATURES, True),  # its measured profile notes the suffix corpus, an enum choice
], ids=["lookup", "suffix"])
def test_policies_train_trains_ppo_on_model_free_traces_with_the_match_features(cli, tmp_path, proposer, features,
                                                                              measured):
    """policies.train with a model-free proposer and train.features naming the match signals: the training traces
    carry the chain columns, gamma.zip names those features, and policy=ppo loads it and replays on the traces."""
    import json
    import zipfile

    from policies.registry import make_policy

    profile = [] if measured else [f"train.profile={PROFILE}", "train.allow_profile_mismatch=true"]
    result = cli("+workload=en", proposer, "train.train_prompts=4", "train.heldout_prompts=1",
                 "train.timesteps=128", "train.eval_every=64", "train.max_gamma=3", "train.profile_repeats=1",
                 "workload.max_new_tokens=10", "train.ppo.n_steps=64", "train.ppo.batch_size=32",
                 f"train.features=[{','.join(features)}]", *profile, run_dir=tmp_path, module="policies.train")
    assert result.returncode == 0, result.stderr[-3000:]
    frame = pd.read_parquet(tmp_path / "traces.parquet")
    assert list(frame.columns) == [*TRACE_COLUMNS, *CHAIN_COLUMNS]
    with zipfile.ZipFile(tmp_path / "gamma.zip") as archive:
        extra = json.loads(archive.read("spectune.json"))
    assert extra["observation"]["features"] == list(features)
    used = str(tmp_path / "profile.json") if measured else PROFILE
    policy = make_policy({"name": "ppo", "gamma_path": str(tmp_path / "gamma.zip"), "trust_pickle": False,
                          "profile": used, "allow_profile_mismatch": True, "deterministic": True, "seed": 0}, 3)
    assert {"match_length", "matches"} <= policy.signals
    gammas = replay_gammas(policy, TraceSet(frame, {}, "traces"), 3, load_profile(used))
    assert ((gammas >= 0) & (gammas <= 3)).all()


@pytest.mark.parametrize("k", [1, 2, GAMMA])
def test_a_fixed_gamma_on_lookup_traces_is_its_fixed_column_charged_no_deeper_than_the_cycles_chains(recorded, k):
    """The replay charges a γ beyond a cycle's longest chain that depth (the engine verifies no further), so a
    fixed γ replayed (each row drafting min(k, its chain)) scores exactly as the fixed-γ column beside the oracle."""
    _, _, frame, _ = recorded
    traces = TraceSet(frame, {"concurrency": SLOTS}, "memory")
    profile = load_profile(PROFILE)
    gammas = replay_gammas(FixedGamma(k), traces, GAMMA, profile)
    assert (gammas == np.minimum(k, traces.chain)).all()
    scores = replay_scores(traces, profile, GAMMA, gammas)
    assert scores["policy_tok_s"] == pytest.approx(scores["fixed_tok_s"][k], rel=1e-12)
    costs, depth = replay_costs(traces, profile, GAMMA), cycle_gammas(traces, traces.chain)
    shallow = depth < k
    assert (costs[shallow, k] == costs[shallow, depth[shallow]]).all() and (shallow.any() or k < GAMMA)


def test_the_cycle_environment_charges_a_gamma_beyond_a_rows_chain_that_depth(recorded):
    """spectune/CycleGamma-v0 on lookup traces: the γ chosen before drafting is verified no deeper than the row's
    recorded chain (the live engine stops there), so γ = GAMMA costs a short chain's own depth; the tokens are the
    accepted prefix plus one. Every entry of the recorded traces, exact."""
    _, _, frame, _ = recorded
    traces = TraceSet(frame, {"concurrency": SLOTS}, "memory")
    profile = load_profile(PROFILE)
    env = CycleGammaEnv("replay", traces, profile, GAMMA, allow_profile_mismatch=True)
    env.reset(seed=0)
    assert (traces.chain < GAMMA).any() and (traces.chain == GAMMA).any()
    for entry in range(traces.count):
        env.reset(options={"entry": entry})
        *_, info = env.step(GAMMA)
        batch, depth = int(traces.batch_size[entry]), min(GAMMA, int(traces.chain[entry]))
        assert info["time_s"] == profile.costs(batch).cycle_s(depth) / batch
        assert info["tokens"] == min(GAMMA, traces.leading[entry]) + 1
