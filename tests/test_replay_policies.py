"""Any registered policy replayed on recorded traces (policies.envs.replay): fixed γ replay to themselves and score
as replay_scores' fixed column, the hindsight oracle bounds every policy, and a stateless stopping rule replays to
the γ the live engine chose on the same requests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from stable_baselines3 import PPO

from policies.classifier import fit_classifier, save_classifier
from policies.envs.cycle_gamma import CycleGammaEnv
from policies.envs.data import TraceSet
from policies.envs.gamma import DraftGammaEnv
from policies.envs.observation import CYCLE_FIELDS, OBS_FIELDS
from policies.envs.replay import replay_gammas, replay_scores, replay_table
from policies.registry import POLICIES, make_policy
from policies.sb3_files import annotate_policy_file
from policies.svip import SVIP
from spectune.costmodel.profile import load_profile
from spectune.engine import Engine
from spectune.engine.policy import FixedGamma
from spectune.engine.traces import record
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests

GAMMA = 4
PROFILE = "tiny-cpu-2core-vm"  # shipped; verifies up to 13 positions
CONF = Path(__file__).resolve().parent.parent / "conf" / "policy"


def _engine(pair, temperature: float) -> Engine:
    target, draft = pair
    return Engine(target, draft, sampling=SamplingParams(temperature=temperature), sampler=get_sampler("exact"),
                  device="cpu", seed=5)


@pytest.fixture(scope="module")
def recorded(pair):
    """Traces of 4 requests × 14 new tokens at T = 1, seed 5, concurrency 2 (batches of 1 and 2 rows)."""
    requests = random_requests(4, max_new=14, seed=2)
    frame = record(_engine(pair, 1.0).session(requests, None, 2, keep_laws=True), requests, GAMMA)
    return frame, TraceSet(frame, {"concurrency": 2}, "memory")


def _ppo_file(path: Path, traces: TraceSet) -> str:
    """A real (briefly trained) PPO γ policy file for the γ environment on these traces."""
    env = DraftGammaEnv("replay", traces, PROFILE, GAMMA, allow_profile_mismatch=True)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": [8]})
    model.learn(32)
    model.save(path)
    annotate_policy_file(path, {"observation": list(OBS_FIELDS), "actions": ["stop", "continue"],
                                "profile": load_profile(PROFILE).to_json(), "max_gamma": GAMMA})
    return str(path)


def _cycle_file(path: Path, traces: TraceSet) -> str:
    """A real (briefly trained) PPO cycle policy file for the cycle environment on these traces."""
    env = CycleGammaEnv("replay", traces, PROFILE, GAMMA, allow_profile_mismatch=True)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu",
                policy_kwargs={"net_arch": [8]})
    model.learn(32)
    model.save(path)
    annotate_policy_file(path, {"observation": list(CYCLE_FIELDS), "actions": "gamma",
                                "profile": load_profile(PROFILE).to_json(), "max_gamma": GAMMA})
    return str(path)


def _map_file(path: Path) -> str:
    """A regime map that lists no regime: every row drafts its static γ 2 (traces carry no temperature)."""
    path.write_text(json.dumps({"kind": "spectune-regime-map", "version": 1, "static": 2, "regimes": []}),
                    encoding="utf-8")
    return str(path)


def _every_policy(frame, traces: TraceSet, tmp_path: Path) -> dict:
    """Every registered policy at its conf/policy defaults, ceiling GAMMA (model files fitted/trained here)."""
    weights = save_classifier(fit_classifier(frame, epochs=20), tmp_path / "classifier.json")
    extra = {"acceptance-classifier": {"weights_path": str(weights)},
             "ppo": {"gamma_path": _ppo_file(tmp_path / "gamma.zip", traces), "profile": PROFILE},
             "ppo-distilled": {"gamma_path": str(tmp_path / "gamma.zip"), "profile": PROFILE,
                               "thresholds": [0.001, 0.01, 0.1]},
             "ppo-cycle": {"path": _cycle_file(tmp_path / "cycle.zip", traces), "profile": PROFILE},
             "hf-heuristic": {"max_gamma": GAMMA}, "hf-heuristic-transient": {"max_gamma": GAMMA},
             "regime-map": {"path": _map_file(tmp_path / "map.json")}}
    out = {}
    for name in sorted(POLICIES):
        node = {**yaml.safe_load((CONF / f"{name}.yaml").read_text()), **extra.get(name, {})}
        out[name] = make_policy(node, 2 if name.startswith("hf-heuristic") else GAMMA)
    return out


@pytest.mark.parametrize("k", [1, 2, GAMMA])
def test_fixed_gamma_replays_to_its_gamma_and_scores_as_the_fixed_column(recorded, k):
    _, traces = recorded
    profile = load_profile(PROFILE)
    gammas = replay_gammas(FixedGamma(k), traces, GAMMA, profile)
    assert (gammas == k).all()
    scores = replay_scores(traces, profile, GAMMA, gammas)
    assert scores["policy_tok_s"] == pytest.approx(scores["fixed_tok_s"][k], rel=1e-12)


def test_every_registered_policy_replays_and_the_oracle_bounds_them(recorded, tmp_path):
    frame, traces = recorded
    profile = load_profile(PROFILE)
    policies = _every_policy(frame, traces, tmp_path)
    assert set(policies) == set(POLICIES)
    table = replay_table(policies, traces, profile, GAMMA, fixed_gamma=2)
    oracle = table["tok_s"].iloc[-1]
    assert table["policy"].iloc[-1].startswith("oracle") and len(table) == len(POLICIES) + 3
    assert (table["tok_s"] <= oracle * (1 + 1e-12)).all()
    assert (table["gap_to_oracle_pct"] <= 1e-9).all()
    assert ((table["mean_gamma"] >= 0) & (table["mean_gamma"] <= GAMMA)).all()
    fixed = table.set_index("policy").loc["fixed"]
    assert fixed["mean_gamma"] == GAMMA  # conf/policy/fixed.yaml has no γ of its own: the ceiling
    reference = table[table["policy"].str.startswith("fixed γ chosen beforehand")].iloc[0]
    assert reference["vs_best_fixed_pct"] == 0 and reference["mean_gamma"] == 2


class SVIPKeepTwo(SVIP):
    """SVIP whose end_drafting verifies at most the first two drafts of each row (a real cut through the hook)."""

    def end_drafting(self, step) -> list[int]:
        return [2] * step.active.shape[0]


@pytest.mark.parametrize("policy_cls", [SVIP, SVIPKeepTwo])
def test_a_stateless_rule_replays_to_the_live_engines_gammas_on_the_same_cycles(pair, policy_cls):
    """T = 1 with keyed streams, seed 5, concurrency 1, 4 requests × 16 tokens. SVIP is stateless: its γ on a
    cycle depends only on that cycle's draft signals (and, with the cut, on the end_drafting hook). Compared: every
    live cycle (its per-cycle num_drafts record) that starts at the output position of a recorded cycle of the same
    request with the live text so far equal to the recorded one — then it drafts from the same context with the
    same uniforms; the first cycle of every request always qualifies. Exact equality of the γ, no tolerance."""
    requests = random_requests(4, max_new=16, seed=3)
    engine = _engine(pair, 1.0)
    session = engine.session(requests, None, 1, keep_laws=True)
    frame = record(session, requests, GAMMA)
    traced = {r.request_id: r.output_ids for r in session.result().requests}
    traces = TraceSet(frame, {"concurrency": 1}, "memory")
    h = float(np.median(np.sqrt(traces.signals[:, :, 1])))  # the rule stops some cycles early, not all
    replayed = replay_gammas(policy_cls(GAMMA, h), traces, GAMMA, load_profile(PROFILE))
    assert 0 < (replayed < min(GAMMA, 2 if policy_cls is SVIPKeepTwo else GAMMA)).mean() < 1
    start = frame.groupby(["cycle", "row"], sort=False)[["request_id", "output_position"]].first()
    by_start = dict(zip(map(tuple, start.to_numpy()), replayed, strict=True))
    live = engine.run(requests, policy_cls(GAMMA, h), 1)
    output = {r.request_id: r.output_ids for r in live.requests}
    position = {r.request_id: 1 for r in requests}
    compared, firsts = [], 0
    for cycle in live.cycles:
        rid, pos = cycle.request_id, position[cycle.request_id]
        position[rid] += cycle.emitted
        if (rid, pos) in by_start and output[rid][:pos] == traced[rid][:pos]:
            compared.append((cycle.num_drafts, int(by_start[(rid, pos)])))
            firsts += pos == 1
    assert firsts == len(requests) and len(compared) >= len(requests)
    assert len({d for d, _ in compared}) > 1  # the rule really stopped at different γ
    assert [live_d for live_d, _ in compared] == [replay_d for _, replay_d in compared]


def test_bad_gamma_fails_in_one_line(recorded):
    _, traces = recorded
    with pytest.raises(SpectuneError, match=r"max_gamma=9 is out of range: must be an integer in 1\.\.4"):
        replay_gammas(FixedGamma(1), traces, 9, load_profile(PROFILE))
