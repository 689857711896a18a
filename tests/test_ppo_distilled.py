"""The per-step PPO policy distilled into q(x) thresholds: the fit is the best split (against brute force), a network
that is itself a per-step threshold rule distils to its thresholds and replays to its own γ, and
``policy=ppo-distilled`` runs in the engine reading q(x) only."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import torch
from stable_baselines3 import PPO

from policies.envs.data import TraceSet
from policies.envs.gamma import DraftGammaEnv
from policies.envs.observation import OBS_FIELDS, scales
from policies.envs.replay import replay_gammas
from policies.ppo_distilled import NEVER, best_threshold, distill
from policies.registry import make_policy
from policies.sb3_files import annotate_policy_file
from spectune.costmodel.profile import Profile
from spectune.engine import Engine
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests

GAMMA = 4


def test_the_threshold_is_the_best_split_of_known_answers():
    assert best_threshold(np.array([0.1, 0.2, 0.3, 0.4]), np.array([0, 0, 1, 1], bool)) == (pytest.approx(0.25), 4)
    assert best_threshold(np.array([0.2, 0.1]), np.array([1, 1], bool)) == (0.0, 2)  # all continue
    assert best_threshold(np.array([0.2, 0.1]), np.array([0, 0], bool)) == (NEVER, 2)  # none does
    # a tie between "all continue" (3) and "continue above 0.15" (3): the lower threshold, the deeper draft
    assert best_threshold(np.array([0.1, 0.2, 0.3, 0.4]), np.array([1, 0, 1, 1], bool)) == (0.0, 3)
    # equal values cannot be split: one of the two decisions is matched whatever the threshold
    assert best_threshold(np.array([0.5, 0.5]), np.array([1, 0], bool)) == (0.0, 1)


def test_the_threshold_matches_as_many_decisions_as_any_threshold_can():
    """200 seeded cases of 1–12 decisions over 5 distinct values (ties likely): the matches equal the brute-force
    maximum over every candidate threshold, and the returned threshold achieves them."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 13))
        probs = rng.choice([0.05, 0.2, 0.4, 0.6, 0.9], n)
        keeps = rng.random(n) < 0.5
        tau, matched = best_threshold(probs, keeps)
        candidates = [0.0, NEVER, *((a + b) / 2 for a, b in itertools.pairwise(sorted(set(probs))))]
        brute = max(int(((probs >= t) == keeps).sum()) for t in candidates)
        assert matched == brute == int(((probs >= tau) == keeps).sum())


def _traces(cycles: int = 120, seed: int = 1, request_cycles: int | None = None) -> TraceSet:
    """Batches of two rows (concurrency 2), GAMMA drafts a cycle, q(x) uniform in [0, 1] (seeded); each slot takes
    a new request every ``request_cycles`` cycles (None: one request a slot)."""
    return TraceSet(_frame(cycles, seed, request_cycles), {"concurrency": 2}, "memory")


def _frame(cycles: int, seed: int, request_cycles: int | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for cycle in range(cycles):
        for row in range(2):
            probs = rng.uniform(0, 1, GAMMA)
            request = row + 2 * (cycle // request_cycles if request_cycles else 0)
            for position in range(1, GAMMA + 1):
                rows.append({"cycle": cycle, "row": row, "request_id": request, "position": position, "batch_size": 2,
                             "context_length": 10 + 3 * cycle, "recent_acceptance": 0.5,
                             "token_prob": probs[position - 1], "entropy": 1.0, "margin": 0.1,
                             "cum_prob": float(np.prod(probs[:position])), "accept_prob": 0.5,
                             "accepted": bool(rng.random() < probs[position - 1])})
    return pd.DataFrame(rows)


def _profile() -> Profile:
    verify = [1.0 + 0.1 * n for n in range(GAMMA + 1)]
    return Profile("test", [1, 2], GAMMA + 1, {1: 0.1, 2: 0.12}, {1: verify, 2: [v * 1.2 for v in verify]},
                   {1: 0.0, 2: 0.0})


def _linear_file(path, traces: TraceSet, profile: Profile, weights: dict[str, float], bias: float) -> str:
    """A real SB3 γ-policy file whose actor is linear: logit(continue) − logit(stop) = bias + Σ weight·raw
    value (weights on the raw fields: the observation's scales are undone here)."""
    env = DraftGammaEnv("replay", traces, profile, GAMMA, allow_profile_mismatch=True)
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": []})
    model.learn(16)
    divisors = dict(zip(OBS_FIELDS, scales(OBS_FIELDS), strict=True))
    with torch.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.zero_()
        for name, weight in weights.items():
            model.policy.action_net.weight[1, OBS_FIELDS.index(name)] = weight * divisors[name]
        model.policy.action_net.bias[1] = bias
    model.save(path)
    annotate_policy_file(path, {"observation": list(OBS_FIELDS), "actions": ["stop", "continue"],
                                "profile": profile.to_json(), "max_gamma": GAMMA})
    return str(path)


def _node(path: str, **extra) -> dict:
    return {"name": "ppo-distilled", "gamma_path": path, "trust_pickle": False, "profile": None,
            "allow_profile_mismatch": False, **extra}


def test_a_network_that_is_a_threshold_rule_distils_to_it_and_replays_to_its_gammas(tmp_path):
    """Continue iff 10·q(x) − 5·position + 2 > 0: always speculate (position 0), then after draft step k
    (position k + 1) continue iff q(x) > 0.3 + 0.5·k — 0.3, then 0.8, then never. On 240 rows of uniform q(x)
    the distilled thresholds fall within 0.05 of 0.3 and 0.8 and the third is NEVER, every decision is matched,
    and the distilled policy replays to exactly the network's γ."""
    traces, profile = _traces(), _profile()
    path = _linear_file(tmp_path / "gamma.zip", traces, profile, {"token_prob": 10.0, "position": -5.0}, 2.0)
    result = distill(path, traces, profile, GAMMA)
    assert len(result.thresholds) == GAMMA - 1 and all(d > 0 for d in result.decisions[:2])
    assert result.thresholds[0] == pytest.approx(0.3, abs=0.05)
    assert result.thresholds[1] == pytest.approx(0.8, abs=0.05)
    assert result.thresholds[2] == NEVER and result.overall == 1.0
    assert result.distilled_tok_s == pytest.approx(result.network_tok_s, rel=1e-12)
    network = make_policy({"name": "ppo", "gamma_path": path, "trust_pickle": False, "profile": None,
                           "allow_profile_mismatch": False, "deterministic": True, "seed": 0}, GAMMA)
    distilled = make_policy(_node(path, thresholds=list(result.thresholds)), GAMMA)
    gammas = replay_gammas(network, traces, GAMMA, profile)
    assert set(gammas.tolist()) == {1, 2, 3}  # stopped after the first, second and third draft
    assert (replay_gammas(distilled, traces, GAMMA, profile) == gammas).all()


def test_what_a_threshold_cannot_keep_shows_as_agreement_below_one(tmp_path):
    """A network that also reads the context: continue iff q(x) + context/1000 − position + 0.5 > 0 (always
    speculate; after the first draft continue iff q(x) > 0.5 − context/1000, contexts 10..367 growing over the
    cycles). No single q(x) threshold matches every decision after the first draft, and the agreement says so."""
    traces, profile = _traces(), _profile()
    path = _linear_file(tmp_path / "gamma.zip", traces, profile,
                        {"token_prob": 1.0, "context_length": 0.001, "position": -1.0}, 0.5)
    result = distill(path, traces, profile, GAMMA)
    assert result.decisions[0] == 240 and 0.6 < result.agreement[0] < 0.95
    assert 0.6 < result.overall < 0.99


def test_the_step_0_decision_distils_to_a_recent_acceptance_threshold(tmp_path):
    """Continue iff 10·q(x) − 20·position + 4·recent acceptance − 1.8 > 0: at step 0 (position 0, q read as 0)
    speculate iff recent acceptance > 0.45; after any draft always stop. Requests change every 8 cycles (recent
    acceptance restarts at the prior 0.5, then moves with the realised acceptance). The step-0 rule is found
    within 0.1 of 0.45 matching every one of the network's step-0 decisions, the draft steps' thresholds are
    NEVER, and the distilled policy, which runs no network, replays to exactly the network's γ (0 and 1)."""
    traces, profile = _traces(cycles=160, request_cycles=8), _profile()
    path = _linear_file(tmp_path / "gamma.zip", traces, profile,
                        {"token_prob": 10.0, "position": -20.0, "recent_acceptance": 4.0}, -1.8)
    result = distill(path, traces, profile, GAMMA)
    assert result.start_decisions == 320 and result.start_agreement == 1.0
    assert result.start_threshold == pytest.approx(0.45, abs=0.1)
    assert all(t == NEVER for t in result.thresholds)
    network = make_policy({"name": "ppo", "gamma_path": path, "trust_pickle": False, "profile": None,
                           "allow_profile_mismatch": False, "deterministic": True, "seed": 0}, GAMMA)
    gammas = replay_gammas(network, traces, GAMMA, profile)
    assert set(gammas.tolist()) == {0, 1}
    distilled = make_policy(_node(path, thresholds=list(result.thresholds),
                                  start_threshold=result.start_threshold), GAMMA)
    distilled.start_decisions = None  # the network is not asked: calling it would fail
    assert (replay_gammas(distilled, traces, GAMMA, profile) == gammas).all()
    assert distilled.describe()["start"] == "recent acceptance threshold"


def test_the_distilled_policy_reads_q_only_and_keeps_greedy_output(pair, tmp_path):
    """In the engine at concurrency 1 and 2, greedy: the output is the autoregressive output token for token and
    the engine computes q(x) alone for it; with the step-0 threshold above every acceptance no cycle drafts."""
    traces, profile = _traces(), _profile()
    path = _linear_file(tmp_path / "gamma.zip", traces, profile, {"token_prob": 10.0, "position": -5.0}, 2.0)
    target, draft = pair
    engine = Engine(target, draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    requests = random_requests(3, max_new=9)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    for concurrency in (1, 2):
        policy = make_policy(_node(path, thresholds=[0.0, 0.0, NEVER]), GAMMA)
        assert policy.signals == frozenset({"token_prob"})
        result = engine.run(requests, policy, concurrency)
        assert {r.request_id: r.output_ids for r in result.requests} == reference
        assert all(1 <= c.num_drafts <= 3 for c in result.cycles)  # never past the third draft: NEVER at step 2
        assert any(c.num_drafts == 3 for c in result.cycles)
        never = make_policy(_node(path, thresholds=[0.0], start_threshold=NEVER), GAMMA)
        never.start_decisions = None  # the network is not asked
        result = engine.run(requests, never, concurrency)
        assert {r.request_id: r.output_ids for r in result.requests} == reference
        assert all(c.num_drafts == 0 for c in result.cycles)


@pytest.mark.parametrize(("thresholds", "match"), [
    ("0.3", r"policy\.thresholds='0\.3' is invalid"), ([], r"policy\.thresholds=\[\] is invalid"),
    ([0.2, -1], r"policy\.thresholds=\[0\.2, -1\.0\] is invalid"),
    ([True], r"policy\.thresholds\[0\]=True is invalid: must be a number"),
    (None, "holds no distilled thresholds"), ([0.2], r"policy\.start_threshold=-0\.5 is invalid"),
])
def test_bad_thresholds_fail_in_one_line(tmp_path, thresholds, match):
    traces, profile = _traces(cycles=4), _profile()
    path = _linear_file(tmp_path / "gamma.zip", traces, profile, {"token_prob": 1.0}, 0.0)
    start = -0.5 if "start_threshold" in match else None
    with pytest.raises(SpectuneError, match=match) as err:
        make_policy(_node(path, thresholds=thresholds, start_threshold=start), GAMMA)
    assert "\n" not in str(err.value)


def test_the_command_distils_a_file_trained_before_and_fails_in_one_line(tmp_path, capsys):
    """``python -m policies.ppo_distilled GAMMA TRACES`` on a file without thresholds: afterwards
    ``policy=ppo-distilled`` reads them from it (the profile and ceiling are the file's). Bad input: exit 2, one
    line."""
    from policies.ppo_distilled import main

    frame, profile = _frame(120, 1), _profile()
    traces_path = tmp_path / "traces.parquet"
    frame.to_parquet(traces_path)
    path = _linear_file(tmp_path / "gamma.zip", _traces(), profile, {"token_prob": 10.0, "position": -5.0}, 2.0)
    with pytest.raises(SpectuneError, match="holds no distilled thresholds"):
        make_policy(_node(path), GAMMA)
    assert main([path, str(traces_path)]) == 0
    expected = distill(path, _traces(), profile, GAMMA)
    policy = make_policy(_node(path), GAMMA)
    assert policy.thresholds == expected.thresholds and policy.start_threshold == expected.start_threshold == 0.0
    for argv, bad in (([path, str(tmp_path / "none.parquet")], "none.parquet"),
                      ([path, str(traces_path), "--max-gamma", "0"], "--max-gamma=0"),
                      ([str(tmp_path / "none.zip"), str(traces_path)], "none.zip")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert bad in err and "\n" not in err


def test_distilling_into_a_file_reads_it_once_and_keeps_its_other_keys(tmp_path, monkeypatch):
    """``distill_into`` (what ``policies.train`` and the command call) reads the policy file once for the network,
    the thresholds' rule and the keys it writes back; the file already read is a keyword-only argument, so no
    config can pass one (one line naming the parameter)."""
    import policies.ppo_distilled as module
    from policies.sb3_files import read_policy_file

    traces, profile = _traces(), _profile()
    path = _linear_file(tmp_path / "gamma.zip", traces, profile, {"token_prob": 10.0, "position": -5.0}, 2.0)
    reads: list[str] = []

    def counted(*args, **kwargs):
        reads.append(str(args[0]))
        return read_policy_file(*args, **kwargs)

    monkeypatch.setattr(module, "read_policy_file", counted)
    result = module.distill_into(path, traces, profile, None)
    assert reads == [path]
    monkeypatch.undo()
    extra = read_policy_file(path).extra
    assert extra["max_gamma"] == GAMMA and extra["observation"] == list(OBS_FIELDS)
    assert extra["distilled"]["thresholds"] == list(result.thresholds)
    with pytest.raises(SpectuneError, match=r"policy\.policy_file is not a parameter of policy=ppo-distilled") as err:
        make_policy(_node(path, policy_file="x"), GAMMA)
    assert "\n" not in str(err.value)
