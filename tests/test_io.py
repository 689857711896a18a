"""Result writers are atomic: a failure (or a kill) mid-write never leaves a truncated file behind."""

from __future__ import annotations

import json
import math
import os
import stat

import pandas as pd
import pytest

from spectune.io import write_csv, write_json, write_parquet


def test_failed_parquet_write_keeps_the_previous_file_and_no_temporaries(tmp_path):
    path = tmp_path / "requests.parquet"
    good = pd.DataFrame({"a": [1, 2, 3]})
    write_parquet(path, good)
    unserialisable = pd.DataFrame({"a": [object(), object()]})  # pyarrow cannot write these
    with pytest.raises(Exception):  # noqa: B017 - whichever error pyarrow raises, the file must survive
        write_parquet(path, unserialisable)
    assert pd.read_parquet(path).equals(good)
    assert [p.name for p in tmp_path.iterdir()] == ["requests.parquet"]


def test_json_writer_turns_non_finite_floats_into_null_and_rejects_unserialisable(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"x": math.nan, "y": [1.5, math.inf]})
    assert json.loads(path.read_text()) == {"x": None, "y": [1.5, None]}
    with pytest.raises(TypeError):
        write_json(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"x": None, "y": [1.5, None]}
    assert len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_results_get_the_mode_a_plain_write_would_under_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        written = write_json(tmp_path / "summary.json", {"a": 1})
        with open(tmp_path / "plain.txt", "w") as handle:  # what any other program's write gives
            handle.write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(written.stat().st_mode) == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode)


def test_writers_fsync_the_file_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_csv(tmp_path / "grid.csv", pd.DataFrame({"g": [1, 2]}))
    assert events == ["fsync file", "rename", "fsync dir"]
    assert pd.read_csv(tmp_path / "grid.csv")["g"].tolist() == [1, 2]
