"""``task=coverage``: K no-difference comparisons, each in a fresh process, and the share of their intervals that
contain no difference — on the embedded pair, end to end through the CLI, with every figure recomputed from the
workers' own records."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from spectune.errors import SpectuneError
from spectune.run import rundir
from spectune.stats.compare import throughput_units
from spectune.stats.units import speedup_interval

SMALL = ("+workload=en", "workload.num_prompts=3", "workload.max_new_tokens=6", "task.repeats=2", "task.warmup=0",
         "task.comparisons=2")


@pytest.mark.slow(reason="two worker processes of the real CLI")
def test_coverage_runs_each_comparison_in_its_own_process_and_every_figure_recomputes(cli, tmp_path):
    proc = cli("task=coverage", *SMALL, "task.pairs=[ar,fixed]", run_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "coverage [95% CI]" in proc.stdout and "no difference (ar, fixed)" in proc.stdout
    result = json.loads((tmp_path / "coverage.json").read_text())
    rows = result["rows"]
    assert [(r["comparison"], r["pair"]) for r in rows] == [(0, "ar"), (0, "fixed"), (1, "ar"), (1, "fixed")]
    seeds = set()
    records = rundir.COVERAGE_RECORDS.read(tmp_path)
    for row in rows:  # each row's interval is the product's, recomputed from the run's records
        worker = tmp_path / "comparisons" / f"{row['comparison']:03d}"
        seeds.add(rundir.METADATA.read(worker)["config"]["workload"]["seed"])
        mine = records[records["comparison"] == row["comparison"]]
        assert len(mine) == len(rundir.REQUESTS.read(worker))  # every request of the worker, gathered
        durations = {(m, int(r)): d for m, r, d in zip(mine["method"], mine["repeat"], mine["duration_s"], strict=True)}
        units = throughput_units(mine, durations)
        iv = speedup_interval(units, row["a"], row["b"])
        assert (row["estimate"], row["lo"], row["hi"]) == pytest.approx((iv.estimate, iv.lo, iv.hi))
        assert row["contains"] == iv.contains(1.0) and row["units"] == 3 and row["old_cells"] == 6
    assert len(seeds) == 2  # each worker drew its own prompts
    pooled = result["summary"]["no difference (ar, fixed)"]
    assert pooled["comparisons"] == 4 and pooled["contain_no_difference"] == sum(r["contains"] for r in rows)
    lo, hi = pooled["coverage_ci95"]
    assert 0 <= lo <= pooled["coverage"] <= hi <= 1
    assert np.isfinite(pooled["median_mde_pct"]) and pooled["median_width_pct"] > 0


@pytest.mark.parametrize(("override", "names"), [
    ("task.pairs=[ar,nope]", "task.pairs=['ar', 'nope'] is invalid"),
    ("task.comparisons=0", "task.comparisons=0"),
    ("task.design=shuffled", "task.design='shuffled' is invalid"),
])
def test_bad_coverage_settings_fail_in_one_line_before_any_model(harness_in_process, tmp_path, override, names):
    with pytest.raises(SpectuneError, match=re.escape(names)) as err:
        harness_in_process(tmp_path, "task=coverage", *SMALL, override)
    assert "\n" not in str(err.value) and not list(tmp_path.iterdir())


@pytest.mark.slow(reason="a pilot and a planned bench run through the CLI")
def test_a_planned_run_measures_a_pilot_then_the_prompts_its_target_needs(cli, tmp_path):
    proc = cli("+workload=en", "workload.categories=[chat-lines]", "workload.max_new_tokens=6", "task.repeats=2",
               "task.warmup=0", "gamma=[2]",
               "task.target_mde=0.5", "task.pilot_prompts=4", run_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = rundir.METADATA.read(tmp_path)["plan"]
    assert rundir.SUMMARY.read(tmp_path / "pilot")["plan"] == plan and plan["pilot_units"] == 4
    pilot_ids = set(rundir.REQUESTS.read(tmp_path / "pilot")["prompt_id"])
    measured = rundir.REQUESTS.read(tmp_path)
    assert measured["request_id"].nunique() == plan["prompts"] >= 2
    assert not pilot_ids & set(measured["prompt_id"])  # the planned run never reuses the pilot's prompts


@pytest.mark.slow(reason="a bench run and its confirmation on fresh prompts through the CLI")
def test_the_top_estimate_is_confirmed_on_prompts_the_grid_never_saw(cli, tmp_path):
    proc = cli("+workload=en", "workload.categories=[chat-lines]", "workload.num_prompts=3",
               "workload.max_new_tokens=6", "task.repeats=2", "task.warmup=0", "gamma=[2,4]", "task.confirm_prompts=2",
               run_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = rundir.SUMMARY.read(tmp_path)
    top = summary["ranking"]["output_throughput"]["best"]
    confirmation = summary["confirmation"]
    assert confirmation["method"] == top
    if top == "ar":
        assert confirmation["status"] == "nothing to confirm"
        return
    assert confirmation["status"] == "ok" and confirmation["prompts"] == 2 and confirmation["speedup_verdict"]
    again = rundir.REQUESTS.read(tmp_path / "confirm")
    assert set(again["method"]) == {"ar", top} and again["prompt_id"].nunique() == 2
    assert not set(again["prompt_id"]) & set(rundir.REQUESTS.read(tmp_path)["prompt_id"])
    assert "confirmation on 2 fresh prompts" in proc.stdout


@pytest.mark.parametrize(("override", "names"), [
    ("task.target_mde=1.5", "task.target_mde=1.5 is invalid"),
    ("task.pilot_prompts=1", "task.pilot_prompts=1"),
])
def test_bad_plans_fail_in_one_line_before_any_model(harness_in_process, tmp_path, override, names):
    with pytest.raises(SpectuneError, match=re.escape(names)):
        harness_in_process(tmp_path, "+workload=en", "task.target_mde=0.05", override)
    assert not list(tmp_path.iterdir())
