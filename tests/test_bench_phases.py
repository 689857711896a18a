"""task=bench on a workload in phases (workload.phases), on the embedded tiny pair: each phase runs at its own
concurrency with its own sampling, its requests carry it into the records, and the summary reads each phase."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from spectune.errors import SpectuneError

PHASES = ("workload.phases=[{name:greedy-c1,concurrency:1,token_budget:8,sampling_mix:[{temperature:0,share:1.0}]},"
          "{name:mixed-c2,concurrency:2,token_budget:8,"
          "sampling_mix:[{temperature:0,share:0.5},{temperature:1.0,share:0.5}]}]")
RUN = ("+workload=en", "workload.num_prompts=null", "workload.max_new_tokens=4", PHASES, "task.warmup=1",
       "task.repeats=1", "gamma=[2]", "workload.categories=[chat-lines]")


@pytest.mark.slow(reason="two real bench runs in phases (interleaved and blocked designs)")
@pytest.mark.parametrize("design", ["interleaved", "blocked"])
def test_a_phased_bench_runs_each_phase_at_its_concurrency_and_reports_it(harness_in_process, tmp_path: Path,
                                                                           design: str) -> None:
    """Two phases of 2 requests (8 tokens at 4 each): greedy alone, then half greedy, half T = 1 in a batch of two.
    Both methods run the phases in order; every cycle of the first has one busy row, the second's have up to two
    (and some two); each request is recorded with its phase and settings; greedy requests emit the same tokens under
    AR and γ = 2 (exactness, row by row, in a mixed batch); the summary has one row per (method, phase)."""
    code = harness_in_process(tmp_path, *RUN, f"task.design={design}")
    assert code == 0
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert {"phase", "temperature", "top_k", "top_p"} <= set(requests.columns)
    for method in ("ar", "fixed:gamma=2"):
        mine = requests[requests["method"] == method].sort_values("request_id")
        assert mine["phase"].tolist() == ["greedy-c1"] * 2 + ["mixed-c2"] * 2
        assert mine["temperature"].tolist()[:2] == [0.0, 0.0] and sorted(mine["temperature"].tolist()[2:]) == [0, 1]
    greedy = requests[requests["temperature"] == 0].pivot_table(index="request_id", columns="method",
                                                                values="output_ids", aggfunc="first")
    assert all(list(a) == list(b) for a, b in zip(greedy["ar"], greedy["fixed:gamma=2"], strict=True))
    cycles = pd.read_parquet(tmp_path / "cycles.parquet").merge(
        requests[["method", "request_id", "phase"]], on=["method", "request_id"])
    assert (cycles[cycles["phase"] == "greedy-c1"]["batch_size"] == 1).all()
    second = cycles[cycles["phase"] == "mixed-c2"]["batch_size"]
    assert second.max() == 2 and second.between(1, 2).all()
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = {(r["method"], r["phase"]): r for r in summary["by_phase"]}
    assert set(rows) == {(m, p) for m in ("ar", "fixed:gamma=2") for p in ("greedy-c1", "mixed-c2")}
    assert all(r["requests"] == 2 and r["seconds"] > 0 for r in rows.values())
    assert rows["ar", "mixed-c2"]["speedup"] == 1.0
    # the interval on the phase's own units: two prompts at concurrency 1 are two units; two at concurrency 2, one
    lo, hi = rows["fixed:gamma=2", "greedy-c1"]["speedup_ci"]
    assert lo <= rows["fixed:gamma=2", "greedy-c1"]["speedup"] <= hi
    assert "speedup_ci" not in rows["fixed:gamma=2", "mixed-c2"] and "speedup_ci" not in rows["ar", "greedy-c1"]
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    assert metadata["settings"]["phases"] == {"greedy-c1": 1, "mixed-c2": 2}
    assert [p["name"] for p in metadata["workload"]["phases"]] == ["greedy-c1", "mixed-c2"]


@pytest.mark.parametrize("overrides, message", [
    (("request_rate=2",), "request_rate=2.0 is invalid with workload.phases: phases run in a closed loop"),
    (("task.block_prompts=3",), "task.block_prompts=3 is invalid with workload.phases' concurrencies"),
    (("task.confirm_prompts=4",), "task.target_mde and task.confirm_prompts are invalid with workload.phases"),
])
def test_bench_refuses_what_phases_cannot_do_before_any_model(harness_in_process, tmp_path: Path, overrides,
                                                              message: str) -> None:
    with pytest.raises(SpectuneError, match=re.escape(message)) as err:
        harness_in_process(tmp_path, *RUN, *overrides)
    assert "\n" not in str(err.value) and not list(tmp_path.iterdir())


def test_a_phase_that_splits_a_unit_is_a_one_line_error(harness_in_process, tmp_path: Path) -> None:
    """At concurrency 2 a unit of the intervals is 2 prompts: a phase of 3 requests would split one."""
    odd = PHASES.replace("name:greedy-c1,concurrency:1,token_budget:8", "name:greedy-c1,concurrency:1,token_budget:12")
    with pytest.raises(SpectuneError, match=re.escape("phase 'greedy-c1' has 3 requests, not a multiple of the unit "
                                                      "(2 prompts)")) as err:
        harness_in_process(tmp_path, *RUN[:3], odd, *RUN[4:])
    assert "\n" not in str(err.value)
