"""A held-out run's check that its prompts are unseen: the prompt ids each other committed run drew, counted per
``requests.parquet``, the run's own folder left out."""

import pandas as pd

from harness.unseen_prompts import drawn_by_others


def _requests(path, ids):
    path.mkdir(parents=True)
    pd.DataFrame({"prompt_id": ids, "method": "ar"}).to_parquet(path / "requests.parquet")


def test_other_runs_drawn_prompts_are_counted_and_the_runs_own_folder_is_not(tmp_path):
    results = tmp_path / "bench" / "results"
    _requests(results / "mine" / "held-out", ["a", "b", "c"])
    _requests(results / "older" / "run", ["b", "c", "b", "x"])
    _requests(results / "archive" / "oldest" / "run", ["c"])
    _requests(results / "unrelated" / "run", ["y"])
    drawn = drawn_by_others({"a", "b", "c"}, results / "mine", results)
    assert drawn == {"bench/results/older/run/requests.parquet": 2,
                     "bench/results/archive/oldest/run/requests.parquet": 1}
