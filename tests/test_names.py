"""One name per idea (spectune.names): files written while the draft length was also called "depth", or the prompt
category a "task", read with the new names, old policy files decide exactly as before, and the mapping is applied once
(new files pass unchanged)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectune import names
from spectune.run import rundir

REPO = Path(__file__).resolve().parent.parent
OLD_RUN = REPO / "bench" / "results" / "smollm2-eagle-policies-interleaved-cpu-20261202" / "en"  # written 2026-12-02
OLD_TRAIN = OLD_RUN / "train" / "c1"
OUTPUTS = REPO / "tests" / "data" / "pinning" / "outputs.json"


def _old_names(columns) -> list[str]:
    return [c for c in columns if c in names.KEYS or "depth" in str(c)]


def test_the_mapping_names_no_new_name_with_an_old_one():
    assert not set(names.KEYS.values()) & set(names.KEYS)
    assert all("depth" in old and "depth" not in new for old, new in names.GAMMA_KEYS.items())
    assert all("task" in old and "categor" in new for old, new in names.CATEGORY_KEYS.items())
    assert all("depth" in old and "depth" not in new for old, new in names.CONFIG_KEYS.items())
    assert all(not set(m.values()) & set(m) for m in names.VALUES.values())


def test_a_committed_old_run_directory_reads_with_the_new_names():
    from analysis.load import load_traces
    from policies.envs.data import TraceSet, read_traces

    traces = rundir.TRACES.read(OLD_TRAIN)
    assert "max_gamma" in traces and not _old_names(traces.columns)
    assert set(traces["max_gamma"]) == {4}
    frame, meta = read_traces(rundir.TRACES.path(OLD_TRAIN))
    assert "max_gamma" in frame and not _old_names(frame.columns)
    assert meta["max_gamma"] == 4 and "max_depth" not in meta
    assert TraceSet(frame, meta, "old traces").max_gamma == 4
    held_out = rundir.HELDOUT_TRACES.named(concurrency=1).read(OLD_RUN)
    assert "max_gamma" in held_out and not _old_names(held_out.columns)
    assert "max_gamma" in load_traces([OLD_TRAIN])

    curves = rundir.CURVES_CSV.read(OLD_TRAIN)
    assert {"best_fixed_gamma", "mean_gamma"} <= set(curves.columns) and not _old_names(curves.columns)
    assert set(curves["policy"]) == {"gamma", "cycle"}  # the per-step policy's rows were "depth"
    assert "mean_gamma" in rundir.TUNING.read(OLD_RUN)

    train = rundir.TRAIN.read(OLD_TRAIN)
    assert train["settings"]["max_gamma"] == 4 and "calibrate_per_gamma" in train["settings"]
    assert {"best_fixed_gamma", "mean_gamma"} <= set(train["final_validation"])
    meta = rundir.METADATA.read(OLD_RUN)
    assert meta["settings"]["max_gamma"] == 4 and meta["config"]["train"]["max_gamma"] == 4
    text = json.dumps([train, meta, rundir.TRACES_METADATA.read(OLD_TRAIN)])
    assert "max_depth" not in text and "mean_depth" not in text and "per_depth" not in text


def test_a_committed_old_calibrated_profile_reads_with_the_new_names():
    from spectune.costmodel.profile import load_profile

    profile = load_profile(rundir.PROFILE_CALIBRATED.path(OLD_TRAIN))
    calibration = profile.fit["calibration"]
    assert {"per_gamma", "per_gamma_shift_ms", "per_gamma_shift_pct", "beta_per_gamma_scale"} <= set(calibration)
    assert "depth" not in json.dumps(sorted(calibration))


def test_the_old_policy_file_name_is_found_in_an_old_training_run():
    assert not (OLD_TRAIN / "gamma.zip").exists()
    assert rundir.GAMMA_POLICY.exists(OLD_TRAIN)
    assert rundir.GAMMA_POLICY.found(OLD_TRAIN) == OLD_TRAIN / "depth.zip"
    assert rundir.GAMMA_POLICY.path(OLD_TRAIN) == OLD_TRAIN / "gamma.zip"  # what a new run writes


@pytest.mark.parametrize("name", ["depth.zip", "cycle.zip"])
def test_an_old_policy_file_loads_and_decides_exactly_as_before(name):
    """The committed policy files of 2026-12-02 (``max_depth``, ``actions: "depth"``, a bare observation list) read
    with the new names, and the registry's policies on them choose in replay the same γ per recorded entry as was
    pinned from them (tests/data/pinning/outputs.json, recorded from these files)."""
    from policies.envs.data import TraceSet, read_traces
    from policies.envs.replay import replay_gammas
    from policies.registry import make_policy
    from policies.sb3_files import read_policy_file
    from spectune.costmodel.profile import Profile

    path = OLD_TRAIN / name
    file = read_policy_file(path)
    assert file.extra["max_gamma"] == 4 and "max_depth" not in file.extra
    assert file.extra["actions"] == (["stop", "continue"] if name == "depth.zip" else "gamma")
    assert "mean_gamma" in file.extra["validation"]
    pinned = json.loads(OUTPUTS.read_text(encoding="utf-8"))["policies"][str(path.relative_to(REPO))]["replay"]
    frame, meta = read_traces(OLD_TRAIN / "traces.parquet")
    traces = TraceSet(frame, meta, "old traces")
    profile = Profile.from_json(file.extra["profile"], "old file")
    base = {"trust_pickle": False, "profile": None, "allow_profile_mismatch": False, "deterministic": True, "seed": 0}
    nodes = {"ppo-cycle": {"name": "ppo-cycle", "path": str(path), **base}} if name == "cycle.zip" else \
        {"ppo": {"name": "ppo", "gamma_path": str(path), **base}}
    for label, node in nodes.items():
        chosen = replay_gammas(make_policy(node, 4), traces, 4, profile)
        assert chosen.tolist() == pinned[label]["gammas"], label


def test_the_mapping_is_applied_once_and_new_files_pass_unchanged():
    old = {"max_depth": 4, "settings": {"calibrate_per_depth": False, "mean_depth": [1.0, 2.0]},
           "actions": "depth", "observation": {"kind": "depth", "features": ["position"]},
           "list": [{"best_fixed_depth": 2}], "other": "depth", "gamma": 3}
    new = names.upgrade(old)
    assert new == {"max_gamma": 4, "settings": {"calibrate_per_gamma": False, "mean_gamma": [1.0, 2.0]},
                   "actions": "gamma", "observation": {"kind": "gamma", "features": ["position"]},
                   "list": [{"best_fixed_gamma": 2}], "other": "depth", "gamma": 3}  # other values are data
    assert names.upgrade(new) is new  # applied once: nothing left to rename
    assert names.upgrade({"max_depth": 1, "max_gamma": 2}) == {"max_gamma": 2}  # both: the new name wins
    frame = pd.DataFrame({"policy": ["depth", "cycle"], "mean_depth": [1.0, 2.0], "position": [1, 2]})
    upgraded = names.upgrade_frame(frame)
    assert list(upgraded.columns) == ["policy", "mean_gamma", "position"]
    assert upgraded["policy"].tolist() == ["gamma", "cycle"] and frame["policy"].tolist() == ["depth", "cycle"]
    assert names.upgrade_frame(upgraded) is upgraded


def test_files_written_now_read_back_as_written(tmp_path):
    frame = pd.DataFrame({"cycle": [0], "row": [0], "position": [1], "accept_prob": [0.5], "accepted": [True],
                          "max_gamma": np.array([4])})
    rundir.TRACES.write(tmp_path, frame)
    assert rundir.TRACES.read(tmp_path).equals(frame)
    body = {"settings": {"max_gamma": 4}, "final_validation": {"mean_gamma": 1.5, "best_fixed_gamma": 2}}
    rundir.TRAIN.write(tmp_path, body)
    assert rundir.TRAIN.read(tmp_path) == body
    (tmp_path / "gamma.zip").write_bytes(b"")
    (tmp_path / "depth.zip").write_bytes(b"")
    assert rundir.GAMMA_POLICY.found(tmp_path) == tmp_path / "gamma.zip"  # the new name first


@pytest.mark.parametrize(("old", "new"), [("task.max_depth", "task.max_gamma"), ("train.max_depth", "train.max_gamma"),
                                          ("policy.depth_path", "policy.gamma_path"),
                                          ("task.feature_depth", "task.feature_max_gamma"),
                                          ("train.calibrate_per_depth", "train.calibrate_per_gamma"),
                                          ("task.max_gamma", None), ("task.depth", None)])
def test_an_old_config_key_names_its_new_name(old, new):
    assert names.renamed_config_key(old) == new


OLD_BENCH = REPO / "bench" / "results" / "lookup-timed-smollm2-cpu-20261205" / "greedy-en"  # written 2026-12-05
OLD_EVALUATE = REPO / "bench" / "results" / "adaptive-suffix-smollm2-cpu-20261206" / "evaluate-en"  # by_task.parquet


def test_a_committed_run_of_before_categories_reads_with_a_category_column(tmp_path):
    """A bench run written while the category was called a task (requests' ``task`` column, summary.json's
    ``by_task`` rows keyed ``task``, the workload's ``source.tasks``), copied as it is: every reader gives
    ``category``, and the per-category table recomputed from its records has the committed summary's numbers."""
    import pyarrow.parquet as pq

    from analysis.load import load_requests
    from spectune.stats.by_category import by_category, durations_of

    run = tmp_path / "old"
    shutil.copytree(OLD_BENCH, run)
    assert "task" in pq.read_schema(run / "requests.parquet").names  # as written: the old name
    raw = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert "by_task" in raw and "by_category" not in raw
    requests = rundir.REQUESTS.read(run)
    assert "category" in requests and "task" not in requests
    assert set(requests["category"]) == {"chat", "summarise", "qa", "translate", "rewrite", "code"}
    assert set(load_requests(run)["category"]) == set(requests["category"])
    summary = rundir.SUMMARY.read(run)
    assert "by_task" not in summary and all("task" not in r for r in summary["by_category"])
    assert rundir.METADATA.read(run)["workload"]["source"]["categories"] == raw_source_tasks(run)
    assert rundir.METADATA.read(run)["task"] == "bench"  # the job keeps its name
    table = by_category(requests, rundir.CYCLES.read(run), durations_of(summary["points"]),
                        unit_size=int(summary["statistics"]["unit_size"]))
    committed = pd.DataFrame(summary["by_category"])
    assert list(table["category"]) == list(committed["category"])
    for column in ("requests", "output_tokens", "decode_tokens", "speedup", "decode_speedup"):
        assert table[column].tolist() == pytest.approx(committed[column].tolist()), column


def raw_source_tasks(run: Path) -> list[str]:
    return json.loads((run / "metadata.json").read_text(encoding="utf-8"))["workload"]["source"]["tasks"]


def test_an_evaluate_run_of_before_categories_reads_its_by_task_file_as_by_category(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    shutil.copy(OLD_EVALUATE / "by_task.parquet", run / "by_task.parquet")
    table = rundir.BY_CATEGORY.read(run)
    assert rundir.BY_CATEGORY.exists(run) and "category" in table and "task" not in table
    assert "all" in set(table["category"])


def test_a_per_category_row_is_renamed_and_the_job_is_not():
    old = {"task": "bench", "by_task": [{"method": "ar", "task": "qa"}], "cells": [{"by_task": [{"task": "all"}]}],
           "alpha_per_prompt": [{"id": "p", "task": "code"}], "workload": {"source": {"tasks": ["qa"]}}}
    new = names.upgrade(old)
    assert new == {"task": "bench", "by_category": [{"method": "ar", "category": "qa"}],
                   "cells": [{"by_category": [{"category": "all"}]}],
                   "alpha_per_prompt": [{"id": "p", "category": "code"}],
                   "workload": {"source": {"categories": ["qa"]}}}
    assert names.upgrade(new) is new
    frame = pd.DataFrame({"method": ["ar"], "task": ["qa"]})
    assert list(names.upgrade_frame(frame).columns) == ["method", "category"]
    assert names.renamed_config_key("workload.tasks") == "workload.categories"
