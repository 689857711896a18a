"""The run directory contract (spectune.run.rundir): names, readers, writers and the format version, read back from the
committed small sweep (tests/data/tiny_sweep) and from results written before the version existed
(bench/results/)."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spectune.errors import SpectuneError
from spectune.run import rundir
from tests.conftest import REPO

OLD_PROFILE = REPO / "bench/results/archive/costmodel-fit-profile-tiny-cpu-20261130.json"  # task=profile, 2026-11-30
OLD_TRAIN = REPO / "bench/results/archive/ppo-train-replay-en-x-h200-20261130.json"  # policies.train's train.json


def test_every_file_has_one_name_and_every_committed_file_is_named(tiny_sweep):
    names = [f.name for f in rundir.FILES]
    assert len(names) == len(set(names)), names
    written = {p.name for p in tiny_sweep.rglob("*") if p.is_file() and ".hydra" not in p.parts}
    assert written - {"multirun.yaml"} <= set(names), written - set(names)


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_no_module_spells_a_run_file_name_itself():
    """Every reader and writer names its files through spectune.run.rundir: a literal "summary.json" elsewhere is a
    second definition of the contract (docstrings and messages, which mention names inside longer text, pass)."""
    names = {f.name for f in rundir.FILES if "{" not in f.name}  # families (grid_c{concurrency}.csv) are patterns
    found = [f"{path.relative_to(REPO)}:{line} {value!r}"
             for package in ("spectune", "harness", "policies", "workloads", "analysis", "hydra_plugins", "bench")
             for path in sorted((REPO / package).rglob("*.py")) if path.name != "rundir.py"
             for line, value in _literals(path) if value in names]
    assert not found, found


def test_the_committed_sweep_reads_in_the_current_format(tiny_sweep):
    from analysis.load import load_requests, load_summaries

    jobs = sorted(p for p in tiny_sweep.iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0", "1"]
    for job in jobs:
        meta = rundir.METADATA.read(job)
        assert meta[rundir.VERSION_KEY] == rundir.FORMAT_VERSION == 2
        assert [m["method"] for m in rundir.SUMMARY.read(job)["methods"]] == ["ar", "fixed:gamma=1", "fixed:gamma=2"]
        assert set(rundir.REQUESTS.required) <= set(rundir.REQUESTS.read(job).columns)
        assert set(rundir.CYCLES.required) <= set(rundir.CYCLES.read(job).columns)
    frame = load_summaries(tiny_sweep)
    assert len(frame) == 6 and set(frame["format_version"]) == {2}
    assert len(load_requests(tiny_sweep)) == 2 * 3 * 3  # 2 jobs x 3 methods x 3 prompts


def test_metadata_without_a_version_reads_as_version_1(tiny_sweep, tmp_path):
    from analysis.load import load_summaries

    sweep = Path(shutil.copytree(tiny_sweep, tmp_path / "sweep"))
    for meta in sweep.rglob(rundir.METADATA.name):
        data = json.loads(meta.read_text())
        del data[rundir.VERSION_KEY]
        meta.write_text(json.dumps(data))
    assert rundir.METADATA.read(sweep / "0")[rundir.VERSION_KEY] == rundir.UNVERSIONED == 1
    assert set(load_summaries(sweep)["format_version"]) == {1}


@pytest.mark.parametrize(("version", "message"), [(3, "written in run format 3, newer than this spectune reads"),
                                                  ("2", "format_version='2' is invalid"),
                                                  (0, "format_version=0 is invalid")])
def test_a_version_this_spectune_cannot_read_is_one_line_naming_the_file(tiny_sweep, tmp_path, version, message):
    from analysis.load import load_summaries

    sweep = Path(shutil.copytree(tiny_sweep, tmp_path / "sweep"))
    meta = sweep / "1" / rundir.METADATA.name
    meta.write_text(json.dumps({**json.loads(meta.read_text()), rundir.VERSION_KEY: version}))
    with pytest.raises(SpectuneError, match=message) as err:
        load_summaries(sweep)
    assert str(meta) in str(err.value) and "\n" not in str(err.value)


def test_an_older_profile_and_training_run_still_read(tmp_path):
    """Files written on 2026-11-30, before the format version: a task=profile result and a policies.train
    summary whose traces metadata is older too. Both read, as version 1."""
    from spectune.costmodel.profile import load_profile

    run = tmp_path / "old"
    run.mkdir()
    shutil.copy(OLD_PROFILE, rundir.PROFILE.path(run))
    shutil.copy(OLD_TRAIN, rundir.TRAIN.path(run))
    profile_json = rundir.PROFILE.read(run)
    assert rundir.VERSION_KEY not in profile_json["metadata"]
    assert rundir.format_version(profile_json["metadata"]) == rundir.UNVERSIONED
    profile = load_profile(rundir.PROFILE.path(run))
    assert profile.batch_sizes == profile_json["batch_sizes"] and profile.label == profile_json["label"]
    train = rundir.TRAIN.read(run)
    assert {"settings", "final_validation", "traces_metadata"} <= set(train)
    assert rundir.format_version(train["metadata"]) == rundir.UNVERSIONED
    # Its traces metadata, as the training run wrote it beside traces.parquet: the version is filled in as 1.
    (run / rundir.TRACES_METADATA.name).write_text(json.dumps(train["traces_metadata"]))
    assert rundir.TRACES_METADATA.read(run)[rundir.VERSION_KEY] == 1


def test_writers_stamp_metadata_and_readers_refuse_foreign_tables(tmp_path):
    from spectune.run.metadata import base_metadata

    assert base_metadata()[rundir.VERSION_KEY] == rundir.FORMAT_VERSION
    path = rundir.METADATA.write(tmp_path, {"task": "bench", rundir.VERSION_KEY: 1})
    assert json.loads(path.read_text())[rundir.VERSION_KEY] == rundir.FORMAT_VERSION  # the writer's, not the caller's
    assert [p.name for p in tmp_path.iterdir()] == [rundir.METADATA.name]  # no temporary file left
    rundir.REQUESTS.write(tmp_path, pd.DataFrame({"method": ["ar"], "request_id": [0]}))
    with pytest.raises(SpectuneError, match="is not a spectune requests table: missing columns prompt_id"):
        rundir.REQUESTS.read(tmp_path)
    rundir.SUMMARY.path(tmp_path).write_text('{"methods": [')
    with pytest.raises(SpectuneError, match="is not valid JSON"):
        rundir.SUMMARY.read(tmp_path)
    assert rundir.ERROR.read_if_present(tmp_path, {}) == {}
    assert rundir.GRID_CSV.named(concurrency=4).name == "grid_c4.csv"
    assert rundir.HELDOUT_TRACES.named(concurrency=2).path(tmp_path) == tmp_path / "heldout_traces_c2.parquet"


def _shape(obj: Any) -> Any:
    """The structure of a JSON value: keys of objects (recursively), the merged shape of a list's items.

    Merged, not the first item's: which keys an item has may depend on measured values (the best method's
    row has no difference-to-the-best columns, and which method is best is wall-clock time's choice)."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        items = [_shape(item) for item in obj if isinstance(item, dict | list)]
        return [_merge(items)] if items else "list"
    return "value"


def _merge(shapes: list[Any]) -> Any:
    if all(isinstance(s, dict) for s in shapes):
        keys = sorted({k for s in shapes for k in s})
        return {k: _merge([s[k] for s in shapes if k in s]) for k in keys}
    return shapes[0]


# What differs between machines and is not a change of format: the host's and packages' details.
MACHINE_KEYS = ("host", "packages", "git")


@pytest.mark.slow(reason="runs the sweep that made tests/data/tiny_sweep through the CLI (two jobs, about a minute)")
def test_the_committed_sweep_has_the_structure_the_cli_writes_today(tiny_sweep, tmp_path):
    from tests.data.make_tiny_sweep import make

    fresh = make(tmp_path / "fresh")

    def files(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    assert files(fresh) == files(tiny_sweep), "regenerate it: python -m tests.data.make_tiny_sweep"
    for name in files(fresh):
        new, old = fresh / name, tiny_sweep / name
        if name.endswith(".parquet"):
            a, b = pd.read_parquet(new), pd.read_parquet(old)
            assert list(a.columns) == list(b.columns) and list(a.dtypes) == list(b.dtypes), name
            if name.endswith(rundir.REQUESTS.name):  # same prompts, methods and repeats: the same requests
                assert len(a) == len(b), name
        elif name.endswith(".json"):
            a, b = json.loads(new.read_text()), json.loads(old.read_text())
            for key in MACHINE_KEYS:
                a.pop(key, None), b.pop(key, None)
            assert _shape(a) == _shape(b), name


def test_a_finished_run_keeps_the_commit_it_started_on():
    from spectune.run.metadata import base_metadata, finished_metadata

    now = base_metadata()
    started = {**now, "git": {"commit": "0" * 40, "dirty": False}, "task": "evaluate"}
    final = finished_metadata(started, tuned={"c1": {}})
    assert final["git"] == started["git"] and final["git_at_finish"] == now["git"]  # the tree moved under the run
    assert final["task"] == "evaluate" and final["finished"] is True and final["tuned"] == {"c1": {}}
    assert final["finished_utc"] >= now["created_utc"]  # ISO 8601 strings, in UTC, order as times do
    assert "packages_at_finish" not in final  # nothing changed there
    assert "git_at_finish" not in finished_metadata(now)


def test_metadata_records_the_math_libraries_settings(monkeypatch):
    """MKL_CBWR=AVX512 changed verification times 1.4-1.8x on one CPU: a run must say what it ran under."""
    from spectune.run.metadata import base_metadata

    monkeypatch.setenv("MKL_CBWR", "AVX512")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("SPECTUNE_UNRELATED", "x")
    monkeypatch.delenv("KMP_AFFINITY", raising=False)
    words = base_metadata()["host"]["math_env"].split()
    assert {"MKL_CBWR=AVX512", "OMP_NUM_THREADS=2"} <= set(words) and words == sorted(words)
    assert not any(w.startswith(("SPECTUNE_UNRELATED=", "KMP_AFFINITY=")) for w in words)
