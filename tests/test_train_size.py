"""The verification-size policy: the protocol's end_drafting hook (the cut keeps the sampler exact, the last draft
step's signals reach policies), the size environment with the γ policy's per-row γ, size.zip files and
their use in the engine (policy=ppo policy.size_path=...), and the size training of python -m policies.train."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import chi2_contingency
from stable_baselines3 import PPO

from policies.confidence import AdaptiveConfidence
from policies.envs.data import TraceSet
from policies.envs.gamma import DraftGammaEnv
from policies.envs.observation import OBS_FIELDS, size_cut, size_observation
from policies.envs.verify_size import VerifySizeEnv
from policies.registry import make_policy
from policies.sb3_files import annotate_policy_file
from policies.train.size import LEVELS, GammaFixedSizeEnv, engine_gammas, size_extra
from spectune.costmodel.profile import Profile
from spectune.engine import Engine
from spectune.engine.policy import DraftStep, FixedGamma
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests

GREEDY = SamplingParams(temperature=0)


class CutFixed(FixedGamma):
    """Fixed γ whose end_drafting keeps ``keep(step)`` drafts per slot; records the last step it was shown."""

    def __init__(self, gamma: int, keep) -> None:
        super().__init__(gamma)
        self.keep, self.shown = keep, []
        self.signals = frozenset({"cum_prob"})

    def end_drafting(self, step: DraftStep) -> list[int]:
        self.shown.append(step)
        return self.keep(step)


def _engine(pair, sampling=GREEDY) -> Engine:
    target, draft = pair
    return Engine(target, draft, sampling=sampling, sampler=get_sampler("exact"), device="cpu", seed=0)


def _outputs(result) -> dict[int, list[int]]:
    return {r.request_id: r.output_ids for r in result.requests}


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_cut_at_full_budget_changes_nothing_and_any_draft_cut_keeps_greedy_output(pair, concurrency):
    """Full budget: the same cycles as fixed γ. A cut that varies by row and cycle (one draft when the row's context
    length is odd, else all; greedy drafts have q(x) = 1, so cum_prob would not vary): greedy output unchanged,
    each cycle verifies what the cut kept. The hook is shown the ceiling step with the declared signals."""
    engine, requests = _engine(pair), random_requests(5, max_new=14)
    fixed = engine.run(requests, FixedGamma(4), concurrency)
    full = CutFixed(4, lambda step: [4] * step.active.shape[0])
    same = engine.run(requests, full, concurrency)
    assert _outputs(same) == _outputs(fixed)
    assert [(c.num_drafts, c.accepted) for c in same.cycles] == [(c.num_drafts, c.accepted) for c in fixed.cycles]
    assert all(s.step == 3 and s.cum_prob is not None for s in full.shown)

    kept: list[list[int]] = []

    def by_confidence(step: DraftStep) -> list[int]:
        out = [1 if n % 2 else 4 for n in step.context_length.tolist()]
        kept.append(out)
        return out

    cut = engine.run(requests, CutFixed(4, by_confidence), concurrency)
    assert _outputs(cut) == _outputs(fixed)
    assert any(k == 1 for row in kept for k in row) and any(k == 4 for row in kept for k in row)
    by_cycle = {c.cycle: [] for c in cut.cycles}
    for c in cut.cycles:
        by_cycle[c.cycle].append((c.slot, c.num_drafts))
    for cycle, rows in by_cycle.items():
        assert all(drafts == kept[cycle][slot] for slot, drafts in rows)


def test_a_cut_to_nothing_is_a_plain_target_step(pair):
    engine, requests = _engine(pair), random_requests(3, max_new=10)
    result = engine.run(requests, CutFixed(3, lambda step: [0] * step.active.shape[0]), 2)
    assert _outputs(result) == _outputs(engine.run(requests, None, 2))
    assert {c.num_drafts for c in result.cycles} == {0}


def test_a_draft_dependent_cut_leaves_the_sampled_law_unchanged(pair):
    """Seeded audit, n = 600 identical requests at temperature 1, 2 new tokens each: the law of the second token
    (the first speculative cycle's first emission) under a cut that keeps 1 draft when the draft is unsure
    (cum_prob < 0.2), else 3, against the autoregressive law. Two-sample chi-square over the tokens with >= 10
    hits in both runs (the rest pooled), p-value > 0.001."""
    engine = _engine(pair, SamplingParams(temperature=1.0))
    requests = [r for r in random_requests(1, max_new=2) for _ in range(600)]
    requests = [type(r)(i, r.prompt_id, r.language, r.input_ids, r.max_new_tokens) for i, r in enumerate(requests)]
    cut = engine.run(requests, CutFixed(3, lambda step: [1 if p < 0.2 else 3 for p in step.cum_prob.tolist()]), 60)
    engine.seed = 1  # independent uniforms for the reference run
    ar = engine.run(requests, None, 60)
    a = np.bincount([r.output_ids[1] for r in cut.requests if len(r.output_ids) > 1], minlength=64)
    b = np.bincount([r.output_ids[1] for r in ar.requests if len(r.output_ids) > 1], minlength=64)
    big = (a >= 10) & (b >= 10)
    table = np.stack([np.r_[a[big], a[~big].sum()], np.r_[b[big], b[~big].sum()]])
    table = table[:, table.sum(0) > 0]
    assert big.sum() >= 2
    assert chi2_contingency(table).pvalue > 0.001


def _step(step: int, token_prob: list[float]) -> DraftStep:
    batch = len(token_prob)
    return DraftStep(step=step, active=torch.ones(batch, dtype=torch.bool), context_length=torch.full((batch,), 10),
                     batch_size=batch, token_prob=torch.tensor(token_prob, dtype=torch.float64))


def test_adaptive_confidence_labels_the_ceiling_position():
    """γ = 3: steps 0 and 1 through continue_drafting, step 2 (the ceiling) through end_drafting; 2 of 3 accepted:
    labels 1, 1 and a 0 for the ceiling's q(x) (before the hook it was left out)."""
    from spectune.engine.policy import CycleFeedback

    policy = AdaptiveConfidence(gamma=3, threshold=0.1, fn_weight=3.0, min_samples=1, scope="run")
    policy.begin_cycle(1)
    for step, prob in enumerate([0.9, 0.8]):
        policy.continue_drafting(_step(step, [prob]))
    assert policy.end_drafting(_step(2, [0.4])) is None
    policy.observe(CycleFeedback([3], [2], 0.1, 0.1, 0.2, rows=[0], request_ids=[0]))
    assert policy.labels[-1] == ([0.9, 0.8, 0.4], [1, 1, 0]) and policy.threshold_of(0) == 0.8
    policy.begin_cycle(1)  # an early stop: the last step was already seen, not recorded twice
    policy.continue_drafting(_step(0, [0.5]))
    policy.end_drafting(_step(0, [0.5]))
    assert len(policy.rows.steps) == 1


def test_adaptive_confidence_in_the_engine_labels_every_position_up_to_the_first_rejection(pair):
    engine, requests = _engine(pair), random_requests(4, max_new=12)
    policy = AdaptiveConfidence(gamma=2, threshold=0.0, fn_weight=3.0, min_samples=10**6, scope="run")
    result = engine.run(requests, policy, 2)
    expected = sum(min(c.accepted + 1, c.num_drafts) for c in result.cycles)
    assert len(policy.labels[-1][0]) == expected and {c.num_drafts for c in result.cycles} == {2}


# -- the size environment and size files ------------------------------------------------------------------------
def _batched_traces(leads: list[list[int]], gamma: int = 4) -> TraceSet:
    """One recorded cycle per item of ``leads`` (a batch with those leading accepts), cum_prob falling per position."""
    rows = []
    for cycle, batch in enumerate(leads):
        for row, lead in enumerate(batch):
            for position in range(1, gamma + 1):
                prob = 0.9 - 0.2 * row
                rows.append({"cycle": cycle, "row": row, "request_id": row, "position": position,
                             "batch_size": len(batch), "context_length": 10, "recent_acceptance": 0.5,
                             "token_prob": prob, "entropy": 1.0, "margin": 0.1, "cum_prob": prob ** position,
                             "accept_prob": 0.5, "accepted": position <= lead})
    return TraceSet(pd.DataFrame(rows))


def _profile(gamma: int = 4) -> Profile:
    return Profile("test", [1, 2], gamma + 1, {1: 0.1, 2: 0.12},
                   {1: [1.0 + 0.1 * n for n in range(gamma + 1)], 2: [1.1 + 0.2 * n for n in range(gamma + 1)]},
                   {1: 0.0, 2: 0.01})


def test_size_cut_keeps_a_prefix_of_each_row_by_cumulative_probability():
    cum = np.array([[0.9, 0.5, 0.2], [0.8, 0.7, 0.0]])
    obs, order = size_observation(cum, np.array([3, 2]), 2, 0.1, 1.5, 6)
    np.testing.assert_allclose(obs, [0.9, 0.8, 0.7, 0.5, 0.2, 0, 2 / 32, 0.1, 1.5], rtol=1e-6)
    assert [size_cut(order, a, 5, np.array([3, 2]), 3).tolist() for a in range(5)] == [
        [0, 0], [1, 0], [1, 1], [2, 2], [3, 2]]  # budgets round(a/4 * 5) = 0, 1, 2 (half to even), 4, 5


def test_size_environment_with_uniform_gammas_is_verify_size():
    """Every row at the traces' γ: the same observation and outcome as spectune/VerifySize-v0, every action."""
    traces, profile = _batched_traces([[3, 0], [1, 4], [2, 2]]), _profile()
    ours = GammaFixedSizeEnv(traces, profile, np.full(traces.count, 4), levels=5, obs_tokens=8)
    theirs = VerifySizeEnv("replay", traces, profile, levels=5, obs_tokens=8)
    for seed in range(6):
        for action in range(5):
            a, _ = ours.reset(seed=seed)
            b, _ = theirs.reset(seed=seed)
            np.testing.assert_allclose(a, b)
            ra, rb = ours.step(action), theirs.step(action)
            assert ra[4]["kept"] == rb[4]["kept"] and ra[4]["tokens"] == rb[4]["tokens"]
            assert ra[4]["time_s"] == pytest.approx(rb[4]["time_s"]) and ra[1] == pytest.approx(rb[1])
    assert engine_gammas(traces, np.array([0, 3, 0, 0, 2, 0])).tolist() == [1, 3, 0, 0, 2, 1]


def _size_file(path, level: int, profile: Profile, traces: TraceSet) -> str:
    """A real SB3 size file whose linear actor always picks ``level``."""
    env = GammaFixedSizeEnv(traces, profile, np.full(traces.count, 4))
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": []})
    model.learn(16)
    with torch.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.zero_()
        model.policy.action_net.bias[level] = 5.0
    model.save(path)
    annotate_policy_file(path, size_extra(profile, 4, {}))
    return str(path)


def _gamma_file(path, profile: Profile, traces: TraceSet) -> str:
    """A real SB3 γ file that always continues."""
    model = PPO("MlpPolicy", DraftGammaEnv("replay", traces, profile), n_steps=16, batch_size=16, n_epochs=1,
                seed=0, device="cpu", policy_kwargs={"net_arch": []})
    model.learn(16)
    with torch.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.zero_()
        model.policy.action_net.bias[1] = 5.0
    model.save(path)
    annotate_policy_file(path, {"observation": list(OBS_FIELDS), "actions": ["stop", "continue"],
                                "profile": profile.to_json()})
    return str(path)


def _node(gamma: str, size: str | None) -> dict:
    return {"name": "ppo", "gamma_path": gamma, "trust_pickle": False, "profile": None,
            "allow_profile_mismatch": False, "deterministic": True, "seed": 0, "size_path": size}


@pytest.mark.parametrize("level", [LEVELS - 1, 8])
def test_ppo_size_policy_in_the_engine_verifies_its_budget_and_keeps_greedy_output(pair, tmp_path, level):
    """γ: always continue to γ = 4; size: always level ``level`` of 16, so each batch verifies
    round(level/16 · Σ drafts) tokens; greedy output is the autoregressive one."""
    traces, profile = _batched_traces([[3, 0], [1, 4]]), _profile()
    policy = make_policy(_node(_gamma_file(tmp_path / "d.zip", profile, traces),
                               _size_file(tmp_path / "s.zip", level, profile, traces)), 4)
    engine, requests = _engine(pair), random_requests(4, max_new=12)
    result = engine.run(requests, policy, 2)
    assert _outputs(result) == _outputs(engine.run(requests, None, 2))
    cycles: dict[int, list[int]] = {}
    for c in result.cycles:
        cycles.setdefault(c.cycle, []).append(c.num_drafts)
    for drafts in cycles.values():
        assert sum(drafts) == round(level / (LEVELS - 1) * 4 * len(drafts))
    assert policy.describe()["size"]["levels"] == LEVELS


def test_size_files_whose_spaces_do_not_match_fail_in_one_line(tmp_path):
    traces, profile = _batched_traces([[3, 0], [1, 4]]), _profile()
    gamma = _gamma_file(tmp_path / "d.zip", profile, traces)
    with pytest.raises(SpectuneError, match=r"policy\.size_path=.*lacks levels") as err:
        make_policy(_node(gamma, gamma), 4)  # a γ file given as the size file
    assert "\n" not in str(err.value)
    size = _size_file(tmp_path / "s.zip", 3, profile, traces)
    for change, match in (({"levels": 9}, r"Discrete\(17\)"), ({"obs_tokens": 10}, "observation shape")):
        annotate_policy_file(size, {**size_extra(profile, 4, {}), **change})
        with pytest.raises(SpectuneError, match=match) as err:
            make_policy(_node(gamma, size), 4)
        assert "\n" not in str(err.value)


@pytest.mark.slow(reason="trains PPO γ and size policies through python -m policies.train")
def test_train_cli_at_concurrency_2_writes_a_size_policy_that_policy_ppo_loads(cli, tmp_path, pair):
    """The whole app on the embedded pair, tiny: 6 prompts at concurrency 2, 256 γ + 256 size steps, 2 rounds,
    then 64 steps of live fine-tuning of the γ policy."""
    result = cli("+workload=en", "train.train_prompts=6", "train.heldout_prompts=1", "train.timesteps=256",
                 "train.eval_every=128", "train.max_gamma=4", "train.profile_repeats=1", "workload.max_new_tokens=12",
                 "train.concurrency=2", "train.size_timesteps=256", "train.rounds=2", "train.live_steps=64",
                 run_dir=tmp_path, module="policies.train")
    assert result.returncode == 0, result.stderr[-2000:]
    with zipfile.ZipFile(tmp_path / "size.zip") as archive:
        extra = json.loads(archive.read("spectune.json"))
    assert extra["levels"] == LEVELS and extra["kind"] == "verify-size"
    curves = pd.read_csv(tmp_path / "curves.csv")
    assert set(curves["policy"]) == {"gamma", "size"} and set(curves["round"].astype(str)) == {"1", "2", "live"}
    live = curves[curves["round"].astype(str) == "live"]
    assert len(live) == 1 and live["timesteps"].item() >= 512 + 64  # two γ rounds of 256, then live
    size = curves[curves["policy"] == "size"]
    assert (size["best_level_tok_s"] >= size[["policy_tok_s", "full_budget_tok_s"]].max(axis=1) - 1e-9).all()
    train = json.loads((tmp_path / "train.json").read_text())
    assert train["size_validation"]["cycles"] >= 1 and train["settings"]["rounds"] == 2
    policy = make_policy(_node(str(tmp_path / "gamma.zip"), str(tmp_path / "size.zip")), 4)
    assert policy.size is not None and "cum_prob" in policy.signals
