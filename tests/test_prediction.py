"""Predictions of a model-free proposer from greedy outputs (spectune.measure.prediction): known answers."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from spectune.costmodel.cycle import CycleCost
from spectune.engine.proposers.lookup import PromptLookup
from spectune.engine.proposers.replay import GreedyOutput, replay
from spectune.measure.prediction import by_category, price


class LinearCosts(CycleCost):
    """A verification of k drafts costs 10 + k, a cycle's overhead 1 (no draft model: drafting costs nothing)."""

    overhead = 1.0

    def draft(self, drafted):
        return 0.0

    def verify(self, drafts):
        return 10.0 + drafts


def outputs() -> list[GreedyOutput]:
    # a: the output's "1 2 3" copies the prompt: one cycle drafts [2, 3] after the first token and both are accepted.
    # b: nothing in the context ever repeats: two cycles, neither proposes.
    return [GreedyOutput(0, "p0", "a", [7, 1, 2, 3, 8], [1, 2, 3, 9], 64),
            GreedyOutput(1, "p1", "b", [5, 6], [7, 8, 9], 64)]


def test_replay_counts_cycles_proposals_and_copyable_tokens_by_hand():
    frame = replay(outputs(), PromptLookup(max_n=3), [2])
    a, b = frame.iloc[0], frame.iloc[1]
    assert (a.cycles, a.drafted, a.accepted, a.no_proposal, a.decode_tokens) == (1, 2, 2, 0, 3)
    assert list(a.drafts_per_cycle) == [0, 0, 1] and a.copyable_tokens == 3  # "1 2 3" of "1 2 3 9"
    assert (b.cycles, b.drafted, b.accepted, b.no_proposal, b.decode_tokens) == (2, 0, 0, 2, 2)
    assert list(b.drafts_per_cycle) == [2, 0, 0] and b.copyable_tokens == 0


def test_predicted_speedup_is_a_ratio_of_summed_seconds_and_all_is_the_tasks_sum():
    table = by_category(price(replay(outputs(), PromptLookup(max_n=3), [2]), LinearCosts(), search_s=0.0))
    rows = {row.category: row for row in table.itertuples()}
    assert list(table["category"]) == ["a", "b", "all"]
    # a: 3 decode tokens at 11 each against one cycle: verify(2) + overhead = 13
    assert rows["a"].ar_s == 33 and rows["a"].spec_s == 13 and rows["a"].predicted_speedup == pytest.approx(33 / 13)
    assert rows["a"].acceptance_length == 3 and rows["a"].copyable_fraction == 0.75
    # b: two cycles with no proposal cost exactly two autoregressive steps
    assert rows["b"].ar_s == rows["b"].spec_s == 22 and rows["b"].no_proposal_share == 1
    assert rows["all"].ar_s == 55 and rows["all"].spec_s == 35 and rows["all"].cycles == 3
    assert rows["all"].predicted_speedup == pytest.approx(55 / 35)  # from the sums, not a mean of the category rows
    assert rows["all"].copyable_fraction == pytest.approx(3 / 7)


def test_a_search_cost_is_charged_every_cycle_whether_it_finds_a_match_or_not():
    frame = price(replay(outputs(), PromptLookup(max_n=3), [2]), LinearCosts(), search_s=0.5)
    assert list(frame["spec_s"]) == [13.5, 23.0]


def test_measured_search_seconds_are_kept_per_row_and_priced_per_cycle():
    frame = replay(outputs(), PromptLookup(max_n=3), [1, 2])
    assert list(frame["gamma"]) == [1, 2, 1, 2] and (frame["search_s"] >= 0).all()
    priced = price(frame, LinearCosts())
    no_search = price(frame, LinearCosts(), search_s=0.0)
    assert ((priced["spec_s"] - no_search["spec_s"]) - frame["search_s"]).abs().max() < 1e-12


# ---- task=predict on the embedded tiny pair -----------------------------------------------------------------

PREDICT = ["task=predict", "proposer=lookup", "+workload=en", "workload.sampling.temperature=0",
           "workload.categories=[rewrite,code]", "workload.num_prompts=4", "workload.task_max_new_tokens=24"]


@pytest.mark.slow(reason="measures a profile, then decodes 4 prompts greedily and runs the engine at two γ (~30 s)")
def test_task_predict_replays_the_engines_greedy_lookup_and_prices_it_with_a_profile(harness_in_process, compose_config,
                                                                                     tmp_path):
    """A profile measured here (task=profile, batch 1, up to 4 drafts), then task=predict at γ 2 and 4: each request's
    replayed cycles are the live engine's with prompt lookup at that γ, and the overall row is the categories' sum."""
    from spectune.engine.policy import FixedGamma
    from spectune.measure.point import requests_of
    from spectune.run import rundir
    from workloads.setup import open_setup

    profiled = tmp_path / "profile"
    assert harness_in_process(profiled, "task=profile", "+workload=en", "workload.categories=[rewrite,code]",
                              "workload.num_prompts=2", "task.batch_sizes=[1]", "task.max_gamma=4",
                              "task.repeats=1", "task.warmup=0") == 0
    run_dir = tmp_path / "predict"
    assert harness_in_process(run_dir, *PREDICT, "task.gammas=[2,4]",
                              f"task.profile={rundir.PROFILE.path(profiled)}") == 0
    frame, summary = rundir.PREDICTION.read(run_dir), rundir.PREDICTION_SUMMARY.read(run_dir)
    table = pd.DataFrame(summary["by_category"])
    assert sorted(set(table["category"])) == ["all", "code", "rewrite"] and (table["predicted_speedup"] > 0).all()
    for gamma, rows in table.groupby("gamma"):
        parts, overall = rows[rows["category"] != "all"], rows[rows["category"] == "all"].iloc[0]
        for column in ("output_tokens", "cycles", "no_proposal", "ar_s", "spec_s"):
            assert overall[column] == pytest.approx(parts[column].sum()), (gamma, column)
        assert overall["predicted_speedup"] == pytest.approx(overall["ar_s"] / overall["spec_s"])

    setup = open_setup(compose_config(*PREDICT), "predict")
    requests = requests_of(setup.workload.prompts, setup.workload.max_new_tokens)
    for gamma in (2, 4):
        live = setup.engine.run(requests, FixedGamma(gamma), 1).cycles
        for request in requests:
            ran = [c for c in live if c.request_id == request.request_id]
            row = frame[(frame["request_id"] == request.request_id) & (frame["gamma"] == gamma)].iloc[0]
            assert (row.cycles, row.drafted, row.accepted) == (
                len(ran), sum(c.num_drafts for c in ran), sum(c.accepted for c in ran)), (gamma, request.request_id)


@pytest.mark.parametrize(("overrides", "message"), [
    (["task=predict", "+workload=en", "workload.sampling.temperature=0"], "proposer=model cannot be predicted"),
    (["task=predict", "proposer=lookup", "+workload=en"], "workload.sampling.temperature=1.0 is out of range"),
    (["task=predict", "proposer=lookup", "+workload=en", "workload.sampling.temperature=0", "task.gammas=[0]"],
     "task.gammas"),
    (["task=predict", "proposer=lookup", "+workload=en", "workload.sampling.temperature=0", "task.profile=nope"],
     "profile='nope' is not found"),
])
def test_task_predict_refuses_what_it_cannot_replay_in_one_line(harness_in_process, tmp_path, overrides, message):
    """Each is the front door's one line (a SpectuneError), raised before the models load."""
    from spectune.errors import SpectuneError

    with pytest.raises(SpectuneError, match=re.escape(message)) as raised:
        harness_in_process(tmp_path, *overrides)
    assert "\n" not in str(raised.value)
