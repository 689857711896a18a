"""The gymnasium environments: env checker, seeded determinism, replay = live per cycle at every γ,
the reward's bookkeeping, and bad input (missing/empty traces, unknown backend or id, profile mismatch)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import policies  # noqa: F401  (registers the environments)
from policies.envs import ENV_IDS, make_env
from policies.envs.data import TraceSet
from policies.envs.gamma import DraftGammaEnv
from policies.envs.observation import OBS_FIELDS, gamma_observation
from spectune.costmodel.profile import Profile
from spectune.engine import Engine, Request
from spectune.engine.traces import record
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import perturbed, tiny_llama

GAMMA = 4
RUN = {"models": {"name": "toy", "target": {"name_or_path": "t"}, "draft": {"name_or_path": "d"}},
       "hardware": {"device": "cpu", "device_name": "cpu0", "dtype": "float64", "execution_path": "eager"}}


def _profile(label: str = "toy", draft: float = 0.001) -> Profile:
    verify = {b: [0.01 * b ** 0.5 * (1 + 0.05 * n) for n in range(GAMMA + 1)] for b in (1, 2)}
    return Profile(label, [1, 2], GAMMA + 1, {1: draft, 2: draft * 1.2}, verify, {1: 0.0002, 2: 0.0003},
                   models=RUN["models"], hardware=RUN["hardware"])


@pytest.fixture(scope="module")
def setup():
    """A tiny sampled pair, its requests, and traces of it recorded at γ = GAMMA (seed 4)."""
    target = tiny_llama(vocab=64, hidden=32, layers=2, seed=1, init=0.1)
    draft = perturbed(target, scale=0.3, seed=2)
    gen = torch.Generator().manual_seed(0)
    requests = [Request(i, f"p{i}", "en", torch.randint(0, 64, (5 + i,), generator=gen).tolist(), 14)
                for i in range(3)]
    engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                    device="cpu", seed=4)
    frame = record(engine.session(requests, None, 1, keep_laws=True), requests, GAMMA)
    return engine, requests, TraceSet(frame, RUN, "memory")


@pytest.mark.parametrize("env_id", list(ENV_IDS))
def test_replay_envs_pass_the_checker_and_are_deterministic(setup, env_id):
    _, _, traces = setup
    env = make_env(env_id, backend="replay", traces=traces, profile=_profile()).unwrapped
    check_env(env)

    def rollout(seed: int) -> list:
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(40):
            obs, reward, done, _, _ = env.step(int(rng.integers(env.action_space.n)))
            out.append((obs.tolist(), reward))
            if done:
                out.append(env.reset()[0].tolist())
        return out

    assert rollout(3) == rollout(3)
    assert rollout(3) != rollout(4)


def test_live_gamma_env_passes_the_checker(setup):
    """Rewards from measured wall time cannot repeat, so the checker runs with live_time="profile" (the same
    cycles, charged the profile's cost); observations are deterministic either way."""
    engine, requests, _ = setup
    env = DraftGammaEnv(backend="live", engine=engine, requests=requests, profile=_profile(), max_gamma=GAMMA,
                        live_time="profile")
    check_env(env, skip_render_check=True)
    assert env.reset(seed=1)[0].tolist() == env.reset(seed=1)[0].tolist()


def test_replay_outcome_equals_live_at_every_gamma(setup):
    """First cycle of request 0 (entry 0 of the traces), sampled, seed 4: tokens at γ = k = 0..GAMMA agree."""
    engine, requests, traces = setup
    live = DraftGammaEnv(backend="live", engine=engine, requests=requests, profile=_profile(), max_gamma=GAMMA)
    replay = DraftGammaEnv(backend="replay", traces=traces, profile=_profile())
    seen = set()
    for k in range(GAMMA + 1):
        tokens = []
        for env, kwargs in ((live, {"seed": 0}), (replay, {"seed": 0, "options": {"entry": 0}})):
            env.reset(**kwargs)
            for _ in range(k):
                _, _, done, _, info = env.step(1)
            if k < GAMMA:
                _, _, done, _, info = env.step(0)
            assert done
            tokens.append(info["tokens"])
        assert tokens[0] == tokens[1], k
        seen.add(tokens[0])
    assert len(seen) > 1, "the outcome should depend on the γ, or this test shows little"


def test_reward_charges_the_rows_share_and_uses_the_running_rate(setup):
    _, _, traces = setup
    env = DraftGammaEnv(backend="replay", traces=traces, profile=_profile())
    env.reset(seed=0, options={"entry": 0})
    _, reward, done, _, info = env.step(0)  # don't speculate: one token, the AR step
    p = _profile()
    ar = p.t_verify(1, 1) + p.overhead(1)
    assert done and info["tokens"] == 1 and info["time_s"] == pytest.approx(ar)
    assert reward == pytest.approx(1 - (1 / ar) * ar)  # the prior rate is the AR rate: an AR step earns 0
    env.reset(options={"entry": 0})
    env.step(1)
    _, reward, _, _, info = env.step(0)
    assert info["time_s"] == pytest.approx(p.t_draft(1) + p.t_verify(1, 2) + p.overhead(1))
    assert reward == pytest.approx(info["tokens"] - (2 / (2 * ar)) * info["time_s"])


def test_observation_layout_is_shared():
    """The default layout's first ten fields keep their order (policy files without a feature list read them so)."""
    first = ("token_prob", "entropy", "margin", "cum_prob", "position", "context_length", "batch_size",
             "recent_acceptance", "c", "g")
    assert OBS_FIELDS[:10] == first
    rows = gamma_observation(first, token_prob=np.array([0.5, 0.2]), entropy=3.0, margin=0.1, cum_prob=0.5,
                             position=2, context_length=500, batch_size=4, recent_acceptance=0.7, c=0.15, g=1.02)
    assert rows.shape == (2, 10) and rows.dtype == np.float32
    assert rows[0].tolist() == pytest.approx([0.5, 0.3, 0.1, 0.5, 0.2, 0.5, 0.125, 0.7, 0.15, 1.02])


def test_bad_input_is_one_line_naming_what_is_allowed(setup, tmp_path):
    _, _, traces = setup
    with pytest.raises(SpectuneError, match=r"traces=.* is not found"):
        make_env("spectune/DraftGamma-v0", traces=str(tmp_path / "none.parquet"), profile=_profile())
    empty = tmp_path / "traces.parquet"
    pd.DataFrame({"cycle": pd.Series(dtype=int)}).to_parquet(empty)
    with pytest.raises(SpectuneError, match="holds no cycles"):
        make_env("spectune/DraftGamma-v0", traces=str(empty), profile=_profile())
    with pytest.raises(SpectuneError, match="backend='gpu' is unknown: choose one of replay, live"):
        make_env("spectune/DraftGamma-v0", backend="gpu", traces=traces, profile=_profile())
    with pytest.raises(SpectuneError, match="env='spectune/Nope-v0' is unknown: choose one of spectune/DraftGamma"):
        make_env("spectune/Nope-v0")
    with pytest.raises(SpectuneError, match="max_gamma=0 is out of range"):
        make_env("spectune/DraftGamma-v0", traces=traces, profile=_profile(), max_gamma=0)
    other = Profile.from_json(json.loads(json.dumps(_profile().to_json())) | {"hardware": {"device": "cuda"}})
    with pytest.raises(SpectuneError, match=r"hardware\.device: profile 'cuda' vs run 'cpu'"):
        make_env("spectune/DraftGamma-v0", traces=traces, profile=other)
    env = make_env("spectune/DraftGamma-v0", traces=traces, profile=other, allow_profile_mismatch=True)
    assert env.unwrapped.synthetic.startswith("synthetic: toy acceptance x toy costs")
    with pytest.raises(SpectuneError, match="backend='live' needs engine= and requests="):
        make_env("spectune/VerifySize-v0", backend="live", profile=_profile())


def test_verify_size_keeps_prefixes_by_cumulative_probability(setup):
    _, _, traces = setup
    env = make_env("spectune/VerifySize-v0", traces=traces, profile=_profile(), levels=GAMMA + 1).unwrapped
    env.reset(seed=0)
    kept = [int(env.cut(a)[0]) for a in range(GAMMA + 1)]
    assert kept == list(range(GAMMA + 1))  # batch 1: budget a keeps the first a drafts
    _, _, done, _, info = env.step(GAMMA)
    leading = int(traces.leading[env._slice][0])
    assert done and info["tokens"] == min(GAMMA, leading) + 1


def test_live_verify_size_env_passes_the_checker_and_keeps_greedy_output(setup):
    """Cutting each row's chain to a budget changes what is verified, never what is emitted (greedy: AR text)."""
    engine, requests, _ = setup
    greedy = Engine(engine.target, engine.draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    env = make_env("spectune/VerifySize-v0", backend="live", engine=greedy, requests=requests, profile=_profile(),
                   concurrency=2, draft_gamma=GAMMA, levels=5, live_time="profile").unwrapped
    check_env(env, skip_render_check=True)
    reference = {r.request_id: r.output_ids for r in greedy.run(requests, None, 1).requests}
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    budgets = set()
    while True:
        action = int(rng.integers(5))
        budgets.add(action)
        env.step(action)
        if env._session.done or not env._session.begin_cycle():
            break
        env._rows = env._session.cycle.rows  # drive the next cycle by hand: draft, then the env's cut
        cum = [env._session.draft_step(frozenset({"cum_prob"}))["cum_prob"] for _ in range(GAMMA)]
        env._order = np.argsort(-torch.stack(cum, 1)[env._rows].numpy().ravel(), kind="stable")
        env._batch = len(env._rows)
    assert {r.request_id: r.output_ids for r in env._session.result().requests} == reference
    assert {0, 4} <= budgets or len(budgets) > 2
