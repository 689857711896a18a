"""Result writers are atomic: a failure (or a kill) mid-write never leaves a truncated file behind."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from harness.io import write_json, write_parquet


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
