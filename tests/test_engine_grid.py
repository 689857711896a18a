"""``python -m analysis.engine_grid``: tables and recommendations recomputed from committed bench runs."""

from __future__ import annotations

import json
import shutil

import pytest

from analysis import engine_grid
from spectune.stats.by_category import ALL
from tests.conftest import REPO

RESULTS = REPO / "bench" / "results"
CLIENT_COST = RESULTS / "llamacpp-client-cost-smollm2-quiet-cpu-20261207"
LOOKUP = RESULTS / "lookup-timed-smollm2-cpu-20261205"
GRID = RESULTS / "llamacpp-grid-smollm2-quiet-cpu-20261207"


@pytest.mark.parametrize(("lo", "hi", "verdict"), [(1.01, 1.2, "pays"), (0.8, 0.99, "loses"), (0.97, 1.05,
                                                                                              "not resolved"),
                                                   (1.0, 1.1, "not resolved"), (None, None, "not resolved")])
def test_the_registered_rule(lo, hi, verdict):
    assert engine_grid.judged(lo, hi) == verdict


def test_a_cell_recomputes_what_its_run_summarised():
    """The grid reads a run's rows through the same function as its summary: the same speed-ups and intervals."""
    cell = engine_grid.read_cell(CLIENT_COST)
    summary = json.loads((CLIENT_COST / "summary.json").read_text())
    for row in summary["by_category"]:
        mine = cell.rows[(cell.rows["method"] == row["method"]) & (cell.rows["category"] == row["category"])].iloc[0]
        for key in ("speedup", "speedup_ci95_lo", "speedup_ci95_hi", "decode_speedup"):
            if row[key] is not None:
                assert mine[key] == pytest.approx(row[key], rel=1e-9), (row["method"], row["category"], key)
    assert cell.engine == "llama.cpp Q4_1" and cell.language == "en" and cell.concurrency == 1
    requests = cell.rows[(cell.rows["method"] == "ngram-mod:gamma=8") & (cell.rows["category"] == ALL)].iloc[0]
    assert 0 < requests["acceptance"] <= 1  # the server's accepted / drafted tokens


def test_a_reference_is_read_on_the_grids_prompts_only(tmp_path):
    """A reference run restricted to the prompts the grid's cell of its language and temperature measured: its
    requests are those prompts' only, and its numbers differ from the whole run's."""
    whole = engine_grid.read_cell(LOOKUP / "t1-en")
    ids = whole.prompts[:12]
    part = engine_grid.read_cell(LOOKUP / "t1-en", only=ids, source="ref")
    assert part.prompts == ids and part.engine.startswith("spectune")
    rows = part.rows[part.rows["category"] == ALL].set_index("method")
    assert rows.loc["ar", "requests"] == 12
    assert rows.loc["fixed:gamma=8", "speedup"] != whole.rows[whole.rows["category"] == ALL].set_index(
        "method").loc["fixed:gamma=8", "speedup"]
    assert engine_grid.method_label("fixed:gamma=8", part.drafter) == "lookup γ 8"


def test_the_tables_are_written_and_checked(tmp_path):
    grid = tmp_path / "grid"
    shutil.copytree(CLIENT_COST, grid / "run", ignore=shutil.ignore_patterns("servers"))
    assert engine_grid.main([str(grid)]) == 0
    text = (grid / engine_grid.TABLES).read_text()
    assert "ngram-mod γ 8" in text and "## Recommendation per cell" in text
    assert engine_grid.main([str(grid), "--check"]) == 0
    (grid / engine_grid.TABLES).write_text(text.replace("ngram-mod γ 8", "ngram-mod γ 9"))
    assert engine_grid.main([str(grid), "--check"]) == 1
    assert engine_grid.main([str(tmp_path / "nothing")]) == 2


@pytest.mark.skipif(not (GRID / engine_grid.TABLES).exists(), reason="the grid's tables are not committed yet")
def test_the_committed_grid_tables_are_what_the_runs_give():
    assert engine_grid.main([str(GRID), "--reference", str(LOOKUP), "--check"]) == 0
