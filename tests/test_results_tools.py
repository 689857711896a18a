"""The scripts that keep the committed results usable: bench/results_paths.py rewrites a machine's absolute paths
without touching a number, and bench/results_compact.py drops only the unread per-token lists and rewrites the rest
losslessly."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import numpy as np
import pandas as pd
import pytest

from spectune.run import rundir
from tests.conftest import REPO

RESULTS = REPO / "bench" / "results"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_paths_become_repository_paths_and_numbers_stay(tmp_path):
    paths = _script("results_paths")
    run = tmp_path / "metadata.json"
    record = {"config": {"task": {"profile": "/work/runs/lookup-pred/profile-en/profile.json"}},
              "models": {"draft": {"resolved": "/tmp/wt-x/spectune/models/smollm2/draft"},
                         "target": {"resolved": "/root/.cache/spectune/SmolLM2/model.gguf"}},
              "cwd": "/tmp/wt-x", "elsewhere": "/work/runs/not-committed/x", "alpha": 0.7364, "n": [1, 2.5]}
    run.write_text(json.dumps(record, indent=1), encoding="utf-8")
    runs = {"/work/runs/lookup-pred/profile-en": "bench/results/lookup-prediction-smollm2-cpu-20261205/profile-en"}
    checkouts = paths.checkouts_of([run])
    assert checkouts == {"/tmp/wt-x"}
    assert paths.rewrite(run, runs, checkouts) == 5
    got = json.loads(run.read_text(encoding="utf-8"))
    assert got["config"]["task"]["profile"] == f"{runs['/work/runs/lookup-pred/profile-en']}/profile.json"
    assert got["models"]["draft"]["resolved"] == "spectune/models/smollm2/draft"
    assert got["models"]["target"]["resolved"] == "~/.cache/spectune/SmolLM2/model.gguf"
    assert (got["cwd"], got["elsewhere"]) == (".", "$WORK/runs/not-committed/x")
    assert (got["alpha"], got["n"]) == (0.7364, [1, 2.5])
    assert paths.main(["--check", str(tmp_path)]) == 0


def test_a_recorded_run_directory_maps_to_where_it_is_committed(tmp_path):
    """Hydra's output_dir of each committed run, and a folder whose recorded runs all sit in one committed folder."""
    paths = _script("results_paths")
    root = tmp_path / "bench" / "results"
    for lang in ("en", "it"):
        hydra = root / "timed-cpu-20261205" / f"greedy-{lang}" / ".hydra" / "hydra.yaml"
        hydra.parent.mkdir(parents=True)
        hydra.write_text(f"hydra:\n  runtime:\n    output_dir: /work/runs/timed/greedy-{lang}\n", encoding="utf-8")
    runs = paths.recorded_runs(root, tmp_path)
    assert runs == {"/work/runs/timed/greedy-en": "bench/results/timed-cpu-20261205/greedy-en",
                    "/work/runs/timed/greedy-it": "bench/results/timed-cpu-20261205/greedy-it",
                    "/work/runs/timed": "bench/results/timed-cpu-20261205"}
    assert paths.relative("/work/runs/timed/greedy-LANG/x.json", runs, set()) == (
        "bench/results/timed-cpu-20261205/greedy-LANG/x.json")


def test_compaction_drops_only_the_unread_lists_and_keeps_every_value(tmp_path):
    """A committed timed run's requests and cycles: after compaction they read equal, column for column and dtype for
    dtype, less the per-token times and latencies and the cycles' start times; the files are smaller."""
    compact = _script("results_compact")
    src = RESULTS / "model-drafts-tasks-smollm2-cpu-20261206" / "smollm2-en"
    run = tmp_path / "run"
    run.mkdir()
    for f in (rundir.REQUESTS, rundir.CYCLES):
        shutil.copy(src / f.name, run / f.name)
    before = {f.name: rundir.read_parquet(run / f.name) for f in (rundir.REQUESTS, rundir.CYCLES)}
    requests = before[rundir.REQUESTS.name].assign(token_times_s=[np.arange(3.0)] * len(before[rundir.REQUESTS.name]))
    requests.to_parquet(run / rundir.REQUESTS.name)  # as the product writes it: with the per-token lists
    sizes = {name: (run / name).stat().st_size for name in before}
    assert compact.main([str(run)]) == 0
    after = {name: rundir.read_parquet(run / name) for name in before}
    pd.testing.assert_frame_equal(after[rundir.REQUESTS.name], requests.drop(columns=["token_times_s"]),
                                  check_exact=True)
    pd.testing.assert_frame_equal(after[rundir.CYCLES.name], before[rundir.CYCLES.name].drop(
        columns=[c for c in compact.UNREAD_CYCLES if c in before[rundir.CYCLES.name]]), check_exact=True)
    assert "output_ids" in after[rundir.REQUESTS.name]  # the exactness readings read them
    assert all((run / name).stat().st_size <= sizes[name] for name in before)


def test_archiving_keeps_the_line_and_names_a_commit_that_holds_the_file():
    compact = _script("results_compact")
    with pytest.raises(SystemExit, match="does not hold"):
        compact.archive(["no-such-entry.json"], "2fb8ddaf075156a82cffe6139df6481343dc29b2")
    from analysis.results_archive import removed

    commit, entries = removed(RESULTS / "archive")
    assert commit and entries and all(not (RESULTS / "archive" / e["name"]).exists() for e in entries)
