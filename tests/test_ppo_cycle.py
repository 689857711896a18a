"""The cycle-level PPO γ policy: ``spectune/CycleGamma-v0`` and ``policy=ppo-cycle``.

One definition each, as tests/test_one_definition.py checks for the per-step policy: what the cycle environment
observes on a recorded cycle is, bit for bit, what ``policy=ppo-cycle`` builds inside the engine; a fixed action d
is charged, entry by entry, what the replay's accounting charges fixed γ = d; the policy drafts each row to its
own γ with no per-step decision. Tiny random pair (tests/tiny_models.py), T = 1, seed 5, concurrency 2,
3 requests × 14 tokens, γ 4; exact equality unless stated.
"""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pandas as pd
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from stable_baselines3 import PPO

from policies.envs import make_env
from policies.envs.cycle_gamma import CycleGammaEnv
from policies.envs.data import TraceSet
from policies.envs.observation import CYCLE_FIELDS
from policies.envs.replay import replay_costs, replay_gammas, replay_scores
from policies.ppo_cycle import PPOCycle
from policies.registry import make_policy
from policies.sb3_files import annotate_policy_file
from spectune.costmodel.profile import load_profile
from spectune.engine import Engine
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests, record_three_requests

GAMMA, SLOTS = 4, 2
PROFILE = "tiny-cpu-2core-vm"


@pytest.fixture(scope="module")
def recorded(pair):
    """The engine, its requests, and traces of them drafted to GAMMA every cycle."""
    return record_three_requests(pair, GAMMA, SLOTS)


def _constant_file(path, traces: TraceSet, gamma: int, **extra) -> str:
    """A real SB3 cycle policy file whose actor picks ``gamma`` whatever it sees (last layer: bias only)."""
    env = CycleGammaEnv("replay", traces, PROFILE, GAMMA, allow_profile_mismatch=True)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": [8]})
    with torch.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.copy_(torch.tensor([5.0 if k == gamma else -5.0 for k in range(GAMMA + 1)]))
    model.save(path)
    annotate_policy_file(path, {"observation": list(CYCLE_FIELDS), "actions": "gamma",
                                "profile": load_profile(PROFILE).to_json(), "max_gamma": GAMMA, **extra})
    return str(path)


class Watched(PPOCycle):
    """PPOCycle that keeps every observation it builds (cycle, slots, [R, 5] float32) and counts the per-step
    decisions it returns (any non-None continue_drafting)."""

    def reset(self) -> None:
        super().reset()
        self.cycle, self.seen, self.decisions, self.chosen, self.where = -1, [], 0, [], ""

    def begin_cycle(self, batch_size: int) -> int:
        self.cycle += 1
        self.where = "begin_cycle"
        return super().begin_cycle(batch_size)

    def end_drafting(self, step):
        self.where = "end_drafting"
        return super().end_drafting(step)

    def continue_drafting(self, step):
        keep = super().continue_drafting(step)
        self.decisions += keep is not None
        return keep

    def observation(self, context, slots):
        obs = super().observation(context, slots)
        self.seen.append((self.cycle, self.where, list(slots), obs.copy()))
        return obs

    def observe(self, feedback) -> None:
        self.chosen.append(dict(self._gammas))
        super().observe(feedback)


def _policy(path: str, cls=Watched, gamma: int = GAMMA) -> PPOCycle:
    return cls(gamma, path, False, None, False, True, 0)


def test_the_cycle_env_passes_the_checker(recorded):
    _, _, traces, _ = recorded
    check_env(CycleGammaEnv("replay", traces, PROFILE, GAMMA, outcome="expected", profile_jitter=0.3,
                            allow_profile_mismatch=True))
    env = make_env("spectune/CycleGamma-v0", traces=traces, profile=PROFILE, allow_profile_mismatch=True)
    assert env.action_space.n == traces.max_gamma + 1 and env.observation_space.shape == (len(CYCLE_FIELDS),)


@pytest.mark.parametrize("reads_context", [True, False])
def test_the_environment_observes_what_policy_ppo_cycle_builds_in_the_engine_bit_for_bit(recorded, tmp_path,
                                                                                      reads_context):
    """With the context from before_cycle every row, a new request's included, is chosen before drafting; without
    it (a caller that does not pass it) new requests' rows are chosen once the first draft step shows it."""
    engine, requests, traces, outputs = recorded
    policy = _policy(_constant_file(tmp_path / "cycle.zip", traces, GAMMA))
    policy.reads_context = reads_context
    live = engine.run(requests, policy, SLOTS)
    assert {c.num_drafts for c in live.cycles} == {GAMMA}  # drafted to the ceiling, as the recording
    assert {r.request_id: r.output_ids for r in live.requests} == outputs  # the same cycles, the same tokens
    assert policy.decisions == 0
    env = CycleGammaEnv("replay", traces, PROFILE, GAMMA, allow_profile_mismatch=True)
    entry = {(int(c), int(r)): i for i, (c, r) in enumerate(zip(traces.cycle, traces.row, strict=True))}
    compared, where = set(), set()
    for cycle, called_in, slots, obs in policy.seen:
        for slot, row_obs in zip(slots, obs, strict=True):
            env_obs, _ = env.reset(options={"entry": entry[(cycle, slot)]})
            assert env_obs.dtype == row_obs.dtype == np.float32
            assert env_obs.tobytes() == row_obs.tobytes(), (cycle, slot, env_obs, row_obs)
            assert (cycle, slot) not in compared  # each row's γ is chosen once per cycle
            compared.add((cycle, slot))
        where.add(called_in)
    assert len(compared) == traces.count  # every recorded (cycle, row)
    assert where == ({"begin_cycle"} if reads_context else {"begin_cycle", "end_drafting"})


@pytest.mark.parametrize("gamma", [0, 1, 3])
def test_each_row_drafts_its_own_gamma_with_no_per_step_decision(recorded, tmp_path, gamma):
    """A constant choice d below the ceiling: every row of every cycle verifies d drafts (d = 0: plain target
    steps once the rows are known), live and in replay."""
    engine, requests, traces, _ = recorded
    path = _constant_file(tmp_path / "cycle.zip", traces, gamma)
    policy = _policy(path)
    live = engine.run(requests, policy, SLOTS)
    assert {c.num_drafts for c in live.cycles} == {gamma} and policy.decisions == 0
    assert policy.signals == frozenset() and all(set(c.values()) <= {gamma} for c in policy.chosen)
    assert (replay_gammas(_policy(path), traces, GAMMA, load_profile(PROFILE)) == gamma).all()


class PerSlot(Watched):
    """The actor's choice replaced by a known one per slot (slot 0: 1 draft, slot 1: 3), to see each row cut to
    its own γ inside one batch."""

    def choose(self, context, slots) -> None:
        self.observation(context, slots)
        self._gammas.update({slot: 1 + 2 * (slot % 2) for slot in slots})


def test_rows_of_one_batch_verify_their_own_gammas(recorded, tmp_path):
    engine, requests, traces, _ = recorded
    policy = _policy(_constant_file(tmp_path / "cycle.zip", traces, GAMMA), PerSlot)
    live = engine.run(requests, policy, SLOTS)
    assert all(c.num_drafts == 1 + 2 * (c.slot % 2) for c in live.cycles) and policy.decisions == 0
    assert {c.batch_size for c in live.cycles} == {1, 2} and {c.slot for c in live.cycles} == {0, 1}
    assert {c.gamma for c in live.cycles if c.batch_size == 2} >= {3}  # the batch drafts to its deepest row


@pytest.mark.parametrize("gamma", range(GAMMA + 1))
def test_a_fixed_action_scores_what_the_replay_gives_that_fixed_gamma(recorded, gamma):
    """Entry by entry, the environment's tokens and time at action d are the replay's at fixed γ = d (exact);
    their ratio is replay_scores' fixed_tok_s[d] to 1e-12 (summation order)."""
    _, _, traces, _ = recorded
    profile = load_profile(PROFILE)
    env = CycleGammaEnv("replay", traces, PROFILE, GAMMA, allow_profile_mismatch=True)
    tokens, times = np.zeros(traces.count), np.zeros(traces.count)
    for entry in range(traces.count):
        env.reset(options={"entry": entry})
        _, _, done, _, info = env.step(gamma)
        assert done and info["gamma"] == gamma
        tokens[entry], times[entry] = info["tokens"], info["time_s"]
    assert times.tolist() == replay_costs(traces, profile, GAMMA)[:, gamma].tolist()
    assert tokens.tolist() == (np.minimum(traces.leading, gamma) + 1.0).tolist()
    scores = replay_scores(traces, profile, GAMMA, np.full(traces.count, gamma))
    assert tokens.sum() / times.sum() == pytest.approx(scores["fixed_tok_s"][gamma], rel=1e-12)
    assert scores["policy_tok_s"] == pytest.approx(scores["fixed_tok_s"][gamma], rel=1e-12)


def test_the_policy_config_composes_and_builds(recorded, compose_config, tmp_path):
    from omegaconf import OmegaConf

    _, _, traces, _ = recorded
    path = _constant_file(tmp_path / "cycle.zip", traces, 2)
    cfg = compose_config("policy=ppo-cycle", f"policy.path={path}")
    policy = make_policy(OmegaConf.to_container(cfg.policy, resolve=True), 3)
    assert isinstance(policy, PPOCycle) and policy.describe()["profile"] == load_profile(PROFILE).label


def test_bad_inputs_fail_in_one_line(recorded, tmp_path):
    _, _, traces, _ = recorded
    node = {"name": "ppo-cycle", "trust_pickle": False, "profile": None, "allow_profile_mismatch": False,
            "deterministic": True, "seed": 0}
    cases = [({"path": None}, "policy.path is unset"),
             ({"path": str(tmp_path / "missing.zip")}, "no such file"),
             ({"path": _constant_file(tmp_path / "wrong.zip", traces, 1, max_gamma=GAMMA + 2)}, "max_gamma=6")]
    gamma_file = tmp_path / "gamma.zip"  # a per-step policy file given to the cycle policy
    _constant_file(gamma_file, traces, 1, actions=["stop", "continue"])
    cases.append(({"path": str(gamma_file)}, "per-step γ policy file"))
    for override, message in cases:
        with pytest.raises(SpectuneError, match=message) as err:
            make_policy({**node, **override}, GAMMA)
        assert "\n" not in str(err.value)
    with pytest.raises(SpectuneError, match=r"max_gamma=9 is out of range") as err:
        CycleGammaEnv("replay", traces, PROFILE, 9, allow_profile_mismatch=True)
    assert "\n" not in str(err.value)
    with pytest.raises(SpectuneError, match="only replay"):
        CycleGammaEnv("live", traces, PROFILE, GAMMA)


def test_the_pipeline_writes_a_cycle_policy_that_runs_in_the_engine(pair, tmp_path):
    """policies.train in process on the embedded pair (5 prompts, the shipped profile, 64 γ and 128 cycle PPO
    steps: a couple of seconds), then the cycle.zip it wrote in the engine at batches 1 and 2."""
    from policies.train.pipeline import train_policies
    from tests.pinning import compose

    cfg = compose("config", "task=train", "+workload=en", "workload.max_new_tokens=10", "train.train_prompts=5",
                  "train.heldout_prompts=1", "train.max_gamma=4", f"train.profile={PROFILE}",
                  "train.allow_profile_mismatch=true", "train.timesteps=64", "train.eval_every=64",
                  "train.ppo.n_steps=64", "train.ppo.batch_size=32", "train.ppo.n_epochs=1",
                  "train.cycle_timesteps=128")
    assert train_policies(cfg, tmp_path) == 0
    with zipfile.ZipFile(tmp_path / "cycle.zip") as archive:
        extra = json.loads(archive.read("spectune.json"))
    assert extra["observation"] == {"kind": "cycle", "version": 1, "features": list(CYCLE_FIELDS)}
    assert extra["max_gamma"] == 4
    curves = pd.read_csv(tmp_path / "curves.csv")
    cycle = curves[curves["policy"] == "cycle"]
    assert cycle["timesteps"].tolist()[0] == 0 and cycle["timesteps"].max() >= 128
    assert set(curves["policy"]) == {"gamma", "cycle"}
    assert "cycle_validation" in json.loads((tmp_path / "train.json").read_text(encoding="utf-8"))
    target, draft = pair
    engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                    device="cpu", seed=5)
    policy = make_policy({"name": "ppo-cycle", "path": str(tmp_path / "cycle.zip"), "trust_pickle": False,
                          "profile": None, "allow_profile_mismatch": False, "deterministic": True, "seed": 0}, 3)
    decisions = []
    step_rule = policy.continue_drafting
    policy.continue_drafting = lambda step: decisions.append(step_rule(step)) or decisions[-1]
    for concurrency in (1, 2):
        result = engine.run(random_requests(3, max_new=9, seed=1), policy, concurrency)
        assert result.cycles and all(c.num_drafts <= c.gamma <= 3 for c in result.cycles)
    assert all(d is None for d in decisions)
    assert policy.describe()["name"] == "ppo-cycle" and policy.describe()["file_max_gamma"] == 4
