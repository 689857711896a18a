"""``task.compare``: several draft-length policies in one interleaved grid, each paired with the others."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.tasks.bench import BenchSettings
from spectune.errors import SpectuneError

SMALL = ("+workload=en", "workload.categories=[chat-lines]", "workload.num_prompts=4", "workload.max_new_tokens=6")


def test_compared_policies_join_the_grid_after_its_own(compose_config):
    cfg = compose_config("+workload=en", "gamma=[2]",
                         "task.compare=[{name: match-length, gamma: 4}, {name: fixed, gamma: [3, 4]}]")
    methods = BenchSettings.from_cfg(cfg).methods()
    assert [m.label for m in methods] == ["ar", "fixed:gamma=2", "match-length:gamma=4", "fixed:gamma=3",
                                          "fixed:gamma=4"]
    # each method carries its own policy node: conf/policy/<name>.yaml under the entry's parameters
    assert methods[2].settings["name"] == "match-length" and "min_match" in methods[2].settings
    assert dict(methods[3].settings) == {"name": "fixed"}


def test_an_entry_without_gamma_runs_at_every_gamma_of_the_grid(compose_config):
    cfg = compose_config("+workload=en", "policy=match-length", "gamma=[4,8]", "task.compare=[{name: fixed}]")
    labels = [m.label for m in BenchSettings.from_cfg(cfg).methods()]
    assert labels == ["ar", "match-length:gamma=4", "match-length:gamma=8", "fixed:gamma=4", "fixed:gamma=8"]


@pytest.mark.parametrize(("compare", "phrase"), [
    ("[{name: no-such-policy}]", "task.compare[0].name='no-such-policy' is invalid: choose one of"),
    ("[{gamma: 4}]", "task.compare[0]={'gamma': 4} is invalid: a mapping with a policy name"),
    ("[{name: fixed, gamma: 2}]", "task.compare[0] is invalid: fixed:gamma=2 is already in the grid"),
    ("[{name: fixed, gamma: 0}]", "task.compare[0].gamma=0 is invalid"),
    ("[{name: fixed, gamma: []}]", "task.compare[0].gamma=[] is invalid"),
    ("[{name: match-length, min_match: -1}]", "min_match"),
    ("[{name: match-length, no_such_parameter: 1}]", "no_such_parameter"),
])
def test_a_bad_entry_is_one_line_before_any_model_loads(compose_config, compare, phrase):
    cfg = compose_config("+workload=en", "gamma=[2]", f"task.compare={compare}")
    with pytest.raises(SpectuneError) as err:
        BenchSettings.from_cfg(cfg)
    assert phrase in str(err.value) and "\n" not in str(err.value)


def test_compared_policies_are_refused_on_a_server_engine(compose_config):
    cfg = compose_config("+workload=en", "engine=llamacpp", "models=smollm2", "task.compare=[{name: match-length}]")
    with pytest.raises(SpectuneError, match=r"task\.compare is invalid with engine=llamacpp"):
        BenchSettings.from_cfg(cfg)


def test_compared_policies_run_in_the_grid_on_the_same_prompts(harness_in_process, tmp_path):
    """A real tiny run: the compared policy runs in the grid's schedule (the interleaved design's own tests cover the
    order) on the same prompts as AR and the grid's policy, and gets its speed-up over that AR with an interval."""
    assert harness_in_process(tmp_path, *SMALL, "gamma=[2]", "task.repeats=1", "task.warmup=0",
                              "task.compare=[{name: match-length, gamma: 4}]") == 0
    req = pd.read_parquet(tmp_path / "requests.parquet")
    assert set(req["method"]) == {"ar", "fixed:gamma=2", "match-length:gamma=4"}
    assert req.groupby("method")["prompt_id"].apply(set).map(frozenset).nunique() == 1  # the same prompts for all
    from spectune.run import rundir

    summary = rundir.SUMMARY.read(tmp_path)
    row = next(m for m in summary["methods"] if m["method"] == "match-length:gamma=4")
    assert row["speedup"] is not None and row["speedup_ci95_lo"] is not None
