"""policies.train.tuning: each threshold baseline replayed at every value of its grid on training traces; the value with
the best replay tokens/s is chosen, and its score is exactly what a replay of that policy gives."""

from __future__ import annotations

import pytest

from policies.envs.data import TraceSet
from policies.envs.replay import replay_gammas, replay_scores
from policies.registry import make_policy
from policies.train.tuning import GRIDS, tunable, tune
from spectune.costmodel.profile import load_profile
from spectune.engine import Engine
from spectune.engine.traces import record
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests

GAMMA = 4
PROFILE = "tiny-cpu-2core-vm"


@pytest.fixture(scope="module")
def traces(pair) -> TraceSet:
    target, draft = pair
    engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                    device="cpu", seed=5)
    requests = random_requests(4, max_new=14, seed=2)
    frame = record(engine.session(requests, None, 1, keep_laws=True), requests, GAMMA)
    return TraceSet(frame, {"concurrency": 1}, "memory")


def test_the_chosen_value_is_the_best_replay_and_scores_what_a_replay_gives(traces):
    profile = load_profile(PROFILE)
    nodes = {"confidence": {"name": "confidence", "threshold": 0.4}, "svip": {"name": "svip", "h": 0.3},
             "bandit": {"name": "bandit", "min_gamma": 0, "exploration": 1.0}}
    tuned, table = tune(nodes, traces, profile, GAMMA)
    assert tuned["bandit"] == nodes["bandit"]  # no threshold: unchanged, not tried
    assert set(table["policy"]) == {"confidence", "svip"}
    for name in ("confidence", "svip"):
        parameter, values = GRIDS[name]
        rows = table[table["policy"] == name]
        assert list(rows["value"]) == list(values) and (rows["parameter"] == parameter).all()
        best = rows.loc[rows["replay_tok_s"].idxmax()]
        assert tuned[name][parameter] == best["value"] and rows["chosen"].sum() == 1
        assert rows.loc[rows["chosen"], "value"].item() == best["value"]
        gammas = replay_gammas(make_policy(tuned[name], GAMMA), traces, GAMMA, profile)
        assert replay_scores(traces, profile, GAMMA, gammas)["policy_tok_s"] == pytest.approx(best["replay_tok_s"],
                                                                                              rel=1e-12)
    # the grids reach far enough to matter: on these traces the extremes give different γ
    low = replay_gammas(make_policy({"name": "confidence", "threshold": 0.001}, GAMMA), traces, GAMMA, profile)
    high = replay_gammas(make_policy({"name": "confidence", "threshold": 0.8}, GAMMA), traces, GAMMA, profile)
    assert low.mean() > high.mean()


def test_only_policies_with_a_grid_are_tunable():
    assert tunable(["hf-heuristic", "confidence", "ppo", "adaedl", "bandit"]) == ["confidence", "adaedl"]


def test_step_thresholds_search_is_at_least_the_best_single_threshold_and_scores_its_replay(traces):
    """The per-step search starts from the best threshold applied at every step, so its choice never replays below
    it; the chosen vector is marked once and its score is what a replay of it gives (tiny pair, 4 requests)."""
    profile = load_profile(PROFILE)
    node = {"name": "step-thresholds", "thresholds": [0.4]}
    tuned, table = tune({"step-thresholds": node}, traces, profile, GAMMA)
    chosen = tuned["step-thresholds"]["thresholds"]
    assert len(chosen) == GAMMA - 1 and table["chosen"].sum() == 1
    _, values = GRIDS["step-thresholds"]
    uniform = table[[len(set(v)) == 1 for v in table["value"]]]
    assert len(uniform) == len(values)  # every single threshold tried at every step
    best = table.loc[table["chosen"], "replay_tok_s"].item()
    assert best >= uniform["replay_tok_s"].max() and best == table["replay_tok_s"].max()
    gammas = replay_gammas(make_policy(tuned["step-thresholds"], GAMMA), traces, GAMMA, profile)
    assert replay_scores(traces, profile, GAMMA, gammas)["policy_tok_s"] == pytest.approx(best, rel=1e-12)


def test_step_thresholds_stop_where_a_threshold_is_above_one_and_refuse_bad_values(traces):
    """[0, 2]: continue after step 0 always, stop after step 1: every cycle drafts at most 2 (ceiling 4)."""
    from spectune.errors import SpectuneError

    profile = load_profile(PROFILE)
    gammas = replay_gammas(make_policy({"name": "step-thresholds", "thresholds": [0.0, 2.0]}, GAMMA), traces, GAMMA,
                           profile)
    assert gammas.max() == 2
    for bad in ([], "0.4", [-0.1], [True]):
        with pytest.raises(SpectuneError, match=r"policy\.thresholds(\[0\])?="):  # [True]: its item is named
            make_policy({"name": "step-thresholds", "thresholds": bad}, GAMMA)
