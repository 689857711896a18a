"""`python -m policies.evaluate` over several prompt categories: each method per category against the best fixed γ
(by_category.parquet), the category rows summing to the method's overall row (a real two-category run of the embedded
tiny pair, no training)."""

from __future__ import annotations

import pandas as pd
import pytest

pytestmark = pytest.mark.slow(reason="a policies.evaluate subprocess: grid search and held-out runs (~25 s)")

RUN = ["+workload=en", "workload.categories=[qa,code]", "workload.max_new_tokens=8", "train.train_prompts=4",
       "train.heldout_prompts=4", "train.max_gamma=2", "evaluate.repeats=2", "evaluate.warmup=0",
       "evaluate.concurrency=[1]", "evaluate.policies=[confidence]", "evaluate.tune=false"]


def test_evaluate_breaks_every_method_down_by_category(tmp_path):
    from tests.conftest import run_cli

    done = run_cli(*RUN, module="policies.evaluate", run_dir=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = pd.read_parquet(tmp_path / "by_category.parquet")
    comparison = pd.read_parquet(tmp_path / "comparison.parquet")
    assert set(table["method"]) == set(comparison["method"])
    for method, rows in table.groupby("method"):
        parts, total = rows[rows["category"] != "all"], rows[rows["category"] == "all"].iloc[0]
        assert set(parts["category"]) == {"qa", "code"}, method
        for column in ("requests", "output_tokens", "decode_tokens"):
            assert parts[column].sum() == total[column], (method, column)
        for column in ("decode_s", "wall_s"):
            assert parts[column].sum() == pytest.approx(total[column], rel=1e-12), (method, column)
    best = comparison.loc[comparison["policy"] == "best fixed γ", "method"].item()
    mine = table[(table["method"] == best)]  # the baseline against itself: exactly 1
    assert mine["decode_speedup"].tolist() == pytest.approx([1.0] * len(mine))
