"""The published γ baselines as policies of the one protocol: each keeps greedy output identical to autoregressive
decoding, stays under its ceiling, rejects bad parameters in one line, and stops where its rule says it must."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from policies.adaedl import AdaEDL
from policies.bandit import UCBBandit
from policies.classifier import KIND, AcceptanceClassifier, fit_classifier, load_classifier, save_classifier
from policies.confidence import AdaptiveConfidence, roc_threshold
from policies.heuristic import HFHeuristic, HFHeuristicTransient
from policies.registry import POLICIES, make_policy
from policies.svip import SVIP
from spectune.engine import Engine
from spectune.engine.policy import CycleFeedback, DraftStep
from spectune.errors import SpectuneError
from spectune.io import write_json
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests

GREEDY = SamplingParams(temperature=0)


def _constant_classifier(path, p_accept: float) -> str:
    """A logistic model predicting the same acceptance probability for every draft (known-answer stops)."""
    write_json(path, {"kind": KIND, "version": 1, "features": ["token_prob"], "mean": [0.0], "std": [1.0],
                      "layers": [{"weight": [[0.0]], "bias": [math.log(p_accept / (1 - p_accept))]}]})
    return str(path)


# (policy config node, grid γ, the largest number of drafts a cycle may have)
def _cases(tmp_path) -> list[tuple[dict, int, int]]:
    return [
        ({"name": "hf-heuristic", "max_gamma": 6}, 2, 6),
        ({"name": "hf-heuristic-transient", "max_gamma": 6}, 2, 6),
        ({"name": "confidence", "threshold": 0.05}, 4, 4),
        ({"name": "confidence-adaptive", "threshold": 0.05, "fn_weight": 3.0, "min_samples": 5, "scope": "run"}, 4, 4),
        ({"name": "confidence-adaptive", "threshold": 0.05, "fn_weight": 3.0, "min_samples": 2,
          "scope": "request"}, 4, 4),
        ({"name": "step-thresholds", "thresholds": [0.0, 0.05, 2.0]}, 4, 4),
        ({"name": "svip", "h": 1.5}, 4, 4),
        ({"name": "adaedl", "c_e": 0.1, "lam": 0.3, "epsilon": 0.05, "beta": 0.9, "lam_min": 0.0, "lam_max": 0.95},
         4, 4),
        ({"name": "acceptance-classifier", "weights_path": _constant_classifier(tmp_path / "c.json", 0.8),
          "threshold": 0.5}, 5, 5),
        ({"name": "bandit", "min_gamma": 0, "exploration": 1.0}, 4, 4),
        ({"name": "model-based", "min_gamma": 0, "prior_strength": 8.0, "cost_halflife": 64.0,
          "verify_slope": 0.05}, 4, 4),
    ]


def test_every_registered_policy_is_tested(tmp_path):
    # fixed: tests/test_engine.py; ppo: tests/test_policy_files.py, ppo-cycle: tests/test_ppo_cycle.py,
    # ppo-distilled: tests/test_ppo_distilled.py (SB3 files); match-length: tests/test_match_length.py, suffix-prob:
    # tests/test_suffix_prob.py (model-free); hysteresis: tests/test_hysteresis.py, regime-map:
    # tests/test_static_answers.py (per-row γ 0 inside a drafting cycle, which the ceiling check below does not allow)
    tested = {node["name"] for node, _, _ in _cases(tmp_path)} | {"fixed", "ppo", "ppo-cycle", "ppo-distilled",
                                                                   "match-length", "suffix-prob", "hysteresis",
                                                                   "regime-map"}
    assert tested == set(POLICIES)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_policies_keep_greedy_output_and_respect_their_ceiling(pair, tmp_path, concurrency):
    """Greedy: whatever each policy decides, the output is the autoregressive output, token for token."""
    target, draft = pair
    requests = random_requests(3, max_new=9)
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    for node, gamma, ceiling in _cases(tmp_path):
        policy = make_policy(node, gamma)
        result = engine.run(requests, policy, concurrency)
        assert {r.request_id: r.output_ids for r in result.requests} == reference, node["name"]
        assert all(c.num_drafts <= c.gamma <= ceiling and (c.num_drafts >= 1) == (c.gamma >= 1)
                   for c in result.cycles), node["name"]
        assert policy.describe()["name"] == node["name"]


def test_policy_files_compose_and_build(compose_config, tmp_path):
    """Every conf/policy file composes through Hydra and builds (the classifier and the regime map given a file)."""
    weights = _constant_classifier(tmp_path / "c.json", 0.7)
    regime_map = tmp_path / "map.json"
    write_json(regime_map, {"kind": "spectune-regime-map", "version": 1, "static": 2, "regimes": []})
    for name in set(POLICIES) - {"ppo", "ppo-cycle", "ppo-distilled"}:  # SB3 files: their own test files
        extra = {"acceptance-classifier": [f"policy.weights_path={weights}"],
                 "regime-map": [f"policy.path={regime_map}"]}.get(name, [])
        cfg = compose_config(f"policy={name}", *extra)
        policy = make_policy(OmegaConf.to_container(cfg.policy, resolve=True), 3)
        assert policy.name == name


@pytest.mark.parametrize(("node", "gamma", "key"), [
    ({"name": "hf-heuristic-transient", "max_gamma": 2}, 3, "max_gamma"),
    ({"name": "confidence-adaptive", "threshold": 1.5, "fn_weight": 3.0, "min_samples": 5, "scope": "run"}, 3,
     "threshold"),
    ({"name": "confidence-adaptive", "threshold": 0.4, "fn_weight": 0, "min_samples": 5, "scope": "run"}, 3,
     "fn_weight"),
    ({"name": "confidence-adaptive", "threshold": 0.4, "fn_weight": 3.0, "min_samples": 5, "scope": "batch"}, 3,
     "scope"),
    ({"name": "svip", "h": -1}, 3, "h"),
    ({"name": "svip", "h": 0.3}, 0, "gamma"),
    ({"name": "adaedl", "c_e": 0.5, "lam": 1.5, "epsilon": 0.01, "beta": 0.9, "lam_min": 0.0, "lam_max": 0.95}, 3,
     "lam"),
    ({"name": "adaedl", "c_e": 0.5, "lam": 0.3, "epsilon": 0.01, "beta": 2, "lam_min": 0.0, "lam_max": 0.95}, 3,
     "beta"),
    ({"name": "acceptance-classifier", "weights_path": None, "threshold": 0.3}, 3, "weights_path"),
    ({"name": "acceptance-classifier", "weights_path": "/nonexistent.json", "threshold": 0.3}, 3, "weights_path"),
    ({"name": "bandit", "min_gamma": 5, "exploration": 1.0}, 3, "min_gamma"),
    ({"name": "bandit", "min_gamma": 1, "exploration": -1}, 3, "exploration"),
    ({"name": "svip", "h": 0.3, "tau": 1}, 3, "tau"),
    ({"name": "model-based", "min_gamma": 4, "prior_strength": 8.0, "cost_halflife": 64.0, "verify_slope": 0.05}, 3,
     "min_gamma"),
    ({"name": "model-based", "min_gamma": 0, "prior_strength": -1, "cost_halflife": 64.0, "verify_slope": 0.05}, 3,
     "prior_strength"),
    ({"name": "model-based", "min_gamma": 0, "prior_strength": 8.0, "cost_halflife": 0.5, "verify_slope": 0.05}, 3,
     "cost_halflife"),
    ({"name": "model-based", "min_gamma": 0, "prior_strength": 8.0, "cost_halflife": 64.0, "verify_slope": 0.05,
      "refresh": 0}, 3, "refresh"),
])
def test_bad_parameters_fail_in_one_line_naming_the_value(node, gamma, key):
    with pytest.raises(SpectuneError) as err:
        make_policy(node, gamma)
    message = str(err.value)
    assert "\n" not in message and key in message, message


def test_a_malformed_classifier_file_fails_in_one_line(tmp_path):
    path = tmp_path / "bad.json"
    write_json(path, {"kind": KIND, "features": ["token_prob", "hidden_state"], "mean": [0, 0], "std": [1, 1],
                      "layers": []})
    with pytest.raises(SpectuneError, match="hidden_state"):
        load_classifier(path)


# ---- known answers of each stop rule on hand-built draft steps ----

def _step(step: int, batch: int = 4, context: list[int] | None = None, **signals) -> DraftStep:
    tensors = {k: torch.tensor(v, dtype=torch.float64) for k, v in signals.items()}
    return DraftStep(step=step, active=torch.ones(batch, dtype=torch.bool),
                     context_length=torch.tensor(context or [10] * batch), batch_size=batch, **tensors)


def test_svip_stops_rows_whose_sqrt_entropy_exceeds_h():
    keep = SVIP(gamma=5, h=0.3).continue_drafting(_step(0, entropy=[0.04, 0.0899, 0.0901, 1.0]))
    assert keep.tolist() == [True, True, False, False]


def test_adaedl_bound_and_its_threshold_adaptation():
    policy = AdaEDL(gamma=5, c_e=0.5, lam=0.3, epsilon=0.01, beta=0.9, lam_min=0.0, lam_max=0.95)
    # 1 - sqrt(0.5 H): H=0.5 -> 0.5 (keep), H=0.98 -> 0.3000 (keep, just), H=1.0 -> 0.293 (stop), H=2 -> 0 (stop)
    keep = policy.continue_drafting(_step(0, entropy=[0.5, 0.979, 1.0, 2.0]))
    assert keep.tolist() == [True, True, False, False]
    policy.observe(CycleFeedback([4], [2], 0.1, 0.1, 0.2))  # rate 0.5: sets the average, λ unchanged
    assert policy.lam == pytest.approx(0.3)
    policy.observe(CycleFeedback([4], [0], 0.1, 0.1, 0.2))  # 0 < average 0.5: stop earlier
    assert policy.lam == pytest.approx(0.31)
    policy.observe(CycleFeedback([2, 2], [2, 2], 0.1, 0.1, 0.2))  # 1.0 > average 0.45: draft longer
    assert policy.lam == pytest.approx(0.30)
    policy.reset()
    assert policy.lam == 0.3 and policy.rate_avg is None


def test_roc_threshold_minimises_fpr_plus_three_fnr():
    # thresholds inf, .9, .8, .35: tpr 0, .5, 1, 1; fpr 0, 0, 0, 1; cost 3, 1.5, 0, 1 -> 0.8
    assert roc_threshold(np.array([0.9, 0.8, 0.35]), np.array([1, 1, 0])) == 0.8
    # one positive below two negatives: cost at .7 is 0 + 3*.5=1.5, at .2 is 1 + 0 = 1.0, at .9: 0.5 + 1.5 = 2
    scores, labels = np.array([0.9, 0.7, 0.5, 0.2]), np.array([0, 1, 0, 1])
    assert roc_threshold(scores, labels) == 0.2
    assert roc_threshold(scores, labels, fn_weight=0.5) == np.inf  # cheap misses: predict nothing accepted


def test_adaptive_confidence_refits_from_labels_and_restarts_per_request():
    policy = AdaptiveConfidence(gamma=4, threshold=0.3, fn_weight=3.0, min_samples=2, scope="request")
    policy.reset()
    assert policy.begin_cycle(1) == 4
    for step, prob in enumerate([0.9, 0.8, 0.35]):  # all above 0.3: keep drafting
        assert policy.continue_drafting(_step(step, batch=1, context=[10], token_prob=[prob])).tolist() == [True]
    policy.observe(CycleFeedback([4], [2], 0.1, 0.1, 0.2, rows=[0]))  # labels 1, 1, 0 -> threshold 0.8 (see above)
    assert policy.threshold_of(0) == 0.8
    policy.begin_cycle(1)  # the same request goes on at context 10 + 2 + 1
    assert policy.continue_drafting(_step(0, batch=1, context=[13], token_prob=[0.5])).tolist() == [False]
    policy.observe(CycleFeedback([1], [1], 0.1, 0.1, 0.2, rows=[0]))
    policy.begin_cycle(1)  # context 20 is not 13 + 1 + 1: a new request, back to the configured 0.3
    assert policy.continue_drafting(_step(0, batch=1, context=[20], token_prob=[0.5])).tolist() == [True]


def test_adaptive_confidence_labels_the_slots_the_feedback_names():
    """An empty slot (context 0) is not listed in the feedback; its ``rows`` name the slots: labels go to them."""
    policy = AdaptiveConfidence(gamma=3, threshold=0.1, fn_weight=3.0, min_samples=1, scope="request")
    policy.begin_cycle(2)
    policy.continue_drafting(_step(0, batch=3, context=[12, 0, 9], token_prob=[0.9, 0.5, 0.2]))
    policy.continue_drafting(_step(1, batch=3, context=[12, 0, 9], token_prob=[0.3, 0.5, 0.7]))
    # slot 0: 0.9 ok, 0.3 rejected; slot 2: 0.2, 0.7 ok
    policy.observe(CycleFeedback([3, 3], [1, 2], 0.1, 0.1, 0.2, rows=[0, 2]))
    assert policy.labels[0] == ([0.9, 0.3], [1, 0]) and policy.labels[2] == ([0.2, 0.7], [1, 1])
    assert policy.threshold_of(0) == 0.9 and policy.threshold_of(2) == 0.1  # slot 2 has no rejection yet


@pytest.mark.parametrize("make", [
    lambda: AdaptiveConfidence(gamma=3, threshold=0.1, fn_weight=3.0, min_samples=1, scope="request"),
    lambda: HFHeuristicTransient(gamma=2, max_gamma=6),
], ids=["confidence", "heuristic"])
def test_a_per_row_policy_refuses_feedback_without_its_rows_slots_in_one_line(make):
    """The slots are the feedback's (the engine's session and the replay give them), never guessed from the busy
    rows a policy was shown."""
    policy = make()
    policy.reset()
    policy.begin_cycle(2)
    with pytest.raises(SpectuneError, match=r"CycleFeedback\.rows is None") as err:
        policy.observe(CycleFeedback([3, 3], [1, 2], 0.1, 0.1, 0.2))
    assert "\n" not in str(err.value)


def test_classifier_stops_when_the_chance_of_a_rejection_exceeds_the_threshold(tmp_path):
    """p_acc = 0.8 per draft: P(some rejection) after i drafts = 1 - 0.8^i = .2, .36, .488, .59 -> stop after 4."""
    policy = AcceptanceClassifier(gamma=8, weights_path=_constant_classifier(tmp_path / "c.json", 0.8),
                                  threshold=0.5)
    policy.begin_cycle(2)
    keeps = [policy.continue_drafting(_step(i, batch=2, token_prob=[0.5, 0.5])).tolist() for i in range(5)]
    assert keeps == [[True, True]] * 3 + [[False, False]] * 2


def test_classifier_stop_in_the_engine_drafts_exactly_where_the_rule_says(pair, tmp_path):
    target, draft = pair
    policy = AcceptanceClassifier(gamma=8, weights_path=_constant_classifier(tmp_path / "c.json", 0.8),
                                  threshold=0.5)
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    result = engine.run(random_requests(2, max_new=10), policy, 2)
    assert {c.num_drafts for c in result.cycles} == {4}


def test_fitted_classifier_recovers_a_known_acceptance_law(tmp_path):
    """n = 4000 synthetic draft positions (seed 0) whose acceptance probability is sigmoid(4·token_prob − 2);
    the fitted logistic model predicts it within 0.03 everywhere on [0, 1], and survives a save/load."""
    rng = np.random.default_rng(0)
    n = 4000
    prob = rng.uniform(0, 1, n)
    frame = pd.DataFrame({"cycle": np.arange(n) // 4, "row": 0, "position": np.arange(n) % 4 + 1,
                          "token_prob": prob, "entropy": rng.uniform(0, 3, n), "margin": rng.uniform(0, 1, n),
                          "cum_prob": prob, "context_length": rng.integers(5, 50, n),
                          "accept_prob": 1 / (1 + np.exp(-(4 * prob - 2)))})
    frame["accepted"] = rng.uniform(0, 1, n) < frame["accept_prob"]
    model = fit_classifier(frame, features=["token_prob"], epochs=400)
    grid = torch.linspace(0, 1, 11, dtype=torch.float64).unsqueeze(1)
    truth = torch.sigmoid(4 * grid.squeeze(1) - 2)
    assert torch.allclose(model(grid), truth, atol=0.03)
    loaded = load_classifier(save_classifier(model, tmp_path / "m.json"))
    assert torch.allclose(loaded(grid), model(grid))
    # The SpecDec++ labels (realised accept/reject up to each cycle's first rejection): noisier, same law.
    realised = fit_classifier(frame, features=["token_prob"], target="accepted", epochs=400)
    assert torch.allclose(realised(grid), truth, atol=0.1)


class _Untold(HFHeuristicTransient):
    """The transient schedule as a caller that does not call before_cycle drives it: requests found at step 0."""

    def before_cycle(self, rows, request_ids, context_lengths=None) -> None:
        pass


@pytest.mark.parametrize("transient", [HFHeuristicTransient, _Untold])
def test_transient_schedule_restarts_per_request_while_the_classic_one_carries_over(pair, transient):
    """Draft = target (everything accepted): each request's cycles draft start, start+2, ... up to the cap, whether
    the requests are named by before_cycle or found at step 0; transformers' persistent "heuristic" carries its
    grown value into the next request instead."""
    target, _ = pair
    engine = Engine(target, target, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    requests = random_requests(3, max_new=20)
    for concurrency in (1, 2):
        result = engine.run(requests, transient(gamma=1, max_gamma=5), concurrency)
        for request in requests:
            drafts = [c.num_drafts for c in result.cycles if c.request_id == request.request_id]
            assert drafts == [min(5, 1 + 2 * i) for i in range(len(drafts))], (concurrency, drafts)
    classic = engine.run(requests, HFHeuristic(gamma=1, max_gamma=5), 1)
    second = [c.num_drafts for c in classic.cycles if c.request_id == 1]
    assert second[0] == 5  # grown during request 0, not restarted


def test_told_the_requests_the_transient_schedule_makes_no_decision_where_no_row_stops(pair):
    """One row at a time: its schedule value is the cycle's ceiling, so no draft step needs a stop decision (found
    at step 0 instead, every cycle takes one)."""
    target, _ = pair
    engine = Engine(target, target, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    counts = {}
    for transient in (HFHeuristicTransient, _Untold):
        policy = transient(gamma=1, max_gamma=5)
        decisions = []
        original = policy.continue_drafting
        policy.continue_drafting = lambda step, _f=original, _d=decisions: _d.append(_f(step)) or _d[-1]
        result = engine.run(random_requests(2, max_new=12), policy, 1)
        counts[transient] = sum(keep is not None for keep in decisions)
        assert [c.num_drafts for c in result.cycles if c.request_id == 0][:3] == [1, 3, 5]
    assert counts[HFHeuristicTransient] == 0 and counts[_Untold] > 0


def test_bandit_plays_every_arm_once_then_settles_on_the_fastest():
    """Deterministic rewards (tokens/s): γ=3 pays most. After 200 cycles it is the most played arm, per batch size."""
    policy = UCBBandit(gamma=4, min_gamma=1, exploration=0.5)
    speed = {1: 100.0, 2: 140.0, 3: 180.0, 4: 150.0}
    first = []
    for _ in range(200):
        gamma = policy.begin_cycle(1)
        first.append(gamma)
        policy.observe(CycleFeedback([gamma], [gamma], 0.0, 0.0, (gamma + 1) / speed[gamma]))
    assert first[:4] == [1, 2, 3, 4]
    counts = dict(zip(policy.arms, policy.counts[1], strict=True))
    assert max(counts, key=counts.get) == 3 and counts[3] > 100
    assert policy.estimates(1)[3] == pytest.approx(180.0)
    assert policy.begin_cycle(4) == 1  # another batch size starts its own exploration


def test_fit_classifier_command_writes_a_model_file_with_the_traces_provenance(tmp_path):
    from policies.train.fit_classifier import main

    rng = np.random.default_rng(1)
    n = 200  # 50 cycles x 4 positions, seed 1
    frame = pd.DataFrame({"cycle": np.arange(n) // 4, "row": 0, "position": np.arange(n) % 4 + 1,
                          "token_prob": rng.uniform(0, 1, n), "entropy": rng.uniform(0, 3, n),
                          "margin": rng.uniform(0, 1, n), "cum_prob": rng.uniform(0, 1, n),
                          "context_length": rng.integers(5, 50, n), "accept_prob": rng.uniform(0, 1, n)})
    frame["accepted"] = frame["accept_prob"] > 0.5
    frame.to_parquet(tmp_path / "traces.parquet")
    write_json(tmp_path / "traces.metadata.json", {"models": {"target": "t"}, "max_gamma": 4})
    assert main([str(tmp_path / "traces.parquet"), str(tmp_path / "m.json"), "--hidden", "4", "--epochs", "20"]) == 0
    model = load_classifier(tmp_path / "m.json")
    assert [layer.out_features for layer in model.layers] == [4, 1]
    recorded = json.loads((tmp_path / "m.json").read_text())["metadata"]
    assert recorded["traces_metadata"]["max_gamma"] == 4 and recorded["rows"] == n
    assert main([str(tmp_path / "missing.parquet"), str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_the_catalogue_is_the_policy_configs_and_imports_only_the_policy_named():
    """A policy is its module and its config: the catalogue finds every class with a ``name`` in the package's
    modules (read, not imported), one per conf/policy/*.yaml; looking one up imports its module only."""
    import subprocess
    import sys

    from tests.conftest import REPO

    configs = {path.stem for path in (REPO / "conf" / "policy").glob("*.yaml")}
    assert set(POLICIES) == configs
    probe = ("import sys; from policies.registry import POLICIES, make_policy; "
             "make_policy({'name': 'confidence', 'threshold': 0.4}, 3); "
             "print(sorted(m for m in sys.modules if m.startswith('policies.') or m == 'stable_baselines3'))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "['policies.confidence', 'policies.registry', 'policies.rows']", loaded.stdout
