"""``task=coverage``: K no-difference comparisons, each in a fresh process, and the share of their intervals that
contain no difference — on the embedded pair, end to end through the CLI, with every figure recomputed from the
workers' own records."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from harness import rundir
from harness.errors import SpectuneError
from harness.stats.compare import throughput_units
from harness.stats.intervals import paired_ratio_interval

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
    for row in rows:  # each row's interval is the product's, recomputed from its worker's records
        worker = tmp_path / "comparisons" / f"{row['comparison']:03d}"
        meta = rundir.METADATA.read(worker)
        seeds.add(meta["config"]["workload"]["seed"])
        points = rundir.SUMMARY.read(worker)["points"]
        durations = {(p["method"], int(p["repeat"])): p["duration_s"] for p in points}
        units = throughput_units(rundir.REQUESTS.read(worker), durations)
        iv = paired_ratio_interval(units.num[row["a"]], units.den[row["a"]], units.num[row["b"]], units.den[row["b"]])
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
