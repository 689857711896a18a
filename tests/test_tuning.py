"""policies.tuning: each threshold baseline replayed at every value of its grid on training traces; the value with
the best replay tokens/s is chosen, and its score is exactly what a replay of that policy gives."""

from __future__ import annotations

import pytest

from harness.engine import Engine
from harness.engine.traces import record
from harness.profile import load_profile
from harness.sampling import SamplingParams
from harness.sampling.rejection import get_sampler
from policies.envs.data import TraceSet
from policies.registry import make_policy
from policies.replay import replay_depths, replay_scores
from policies.tuning import GRIDS, tunable, tune
from tests.tiny_models import random_requests

DEPTH = 4
PROFILE = "tiny-cpu-2core-vm"


@pytest.fixture(scope="module")
def traces(pair) -> TraceSet:
    target, draft = pair
    engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                    device="cpu", seed=5)
    requests = random_requests(4, max_new=14, seed=2)
    frame = record(engine.session(requests, None, 1, keep_laws=True), requests, DEPTH)
    return TraceSet(frame, {"concurrency": 1}, "memory")


def test_the_chosen_value_is_the_best_replay_and_scores_what_a_replay_gives(traces):
    profile = load_profile(PROFILE)
    nodes = {"confidence": {"name": "confidence", "threshold": 0.4}, "svip": {"name": "svip", "h": 0.3},
             "bandit": {"name": "bandit", "min_gamma": 0, "exploration": 1.0}}
    tuned, table = tune(nodes, traces, profile, DEPTH)
    assert tuned["bandit"] == nodes["bandit"]  # no threshold: unchanged, not tried
    assert set(table["policy"]) == {"confidence", "svip"}
    for name in ("confidence", "svip"):
        parameter, values = GRIDS[name]
        rows = table[table["policy"] == name]
        assert list(rows["value"]) == list(values) and (rows["parameter"] == parameter).all()
        best = rows.loc[rows["replay_tok_s"].idxmax()]
        assert tuned[name][parameter] == best["value"] and rows["chosen"].sum() == 1
        assert rows.loc[rows["chosen"], "value"].item() == best["value"]
        depths = replay_depths(make_policy(tuned[name], DEPTH), traces, DEPTH, profile)
        assert replay_scores(traces, profile, DEPTH, depths)["policy_tok_s"] == pytest.approx(best["replay_tok_s"],
                                                                                              rel=1e-12)
    # the grids reach far enough to matter: on these traces the extremes give different depths
    low = replay_depths(make_policy({"name": "confidence", "threshold": 0.001}, DEPTH), traces, DEPTH, profile)
    high = replay_depths(make_policy({"name": "confidence", "threshold": 0.8}, DEPTH), traces, DEPTH, profile)
    assert low.mean() > high.mean()


def test_only_policies_with_a_grid_are_tunable():
    assert tunable(["hf-heuristic", "confidence", "ppo", "adaedl", "bandit"]) == ["confidence", "adaedl"]
