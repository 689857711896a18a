"""The adaptive-γ results pages hold what their ``judge.py`` prints from their committed run directories (through
``analysis.adaptive_readings``): a page's tables and verdicts can be recomputed, and a change to the shared readings
that altered a committed page's figures fails here."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from analysis.adaptive_readings import abstention

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
PAGES = {"adaptive-lookup-smollm2-cpu-20261206": "language", "adaptive-suffix-smollm2-cpu-20261206": "language",
         "shadow-trials-suffix-smollm2-cpu-20261206": "main"}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_page_holds_every_line_its_judge_prints(page):
    judge = runpy.run_path(str(RESULTS / page / "judge.py"))
    entry = judge[PAGES[page]]
    lines = [line for lang in judge["LANGUAGES"] for line in entry(lang)] if "LANGUAGES" in judge else entry()
    text = (RESULTS / page / "README.md").read_text(encoding="utf-8")
    printed = [line.strip() for line in lines if line.strip()]
    assert len(printed) > 20
    missing = [line for line in printed if line not in text]
    assert not missing, missing[:3]


def test_abstention_counts_what_each_request_verified():
    """Two requests of one method: one verifies its first cycle only, then 60 cycles nothing (stuck, one chain);
    the other alternates. Shares over all 64 cycles; trailing share over the no-draft ones."""
    import pandas as pd

    rows = [(0, c, 3 if c == 0 else 0) for c in range(61)] + [(1, 100 + c, 2 if c % 2 == 0 else 0) for c in range(3)]
    cycles = pd.DataFrame([{"method": "ppo", "repeat": 0, "request_id": r, "cycle": c, "num_drafts": d}
                           for r, c, d in rows])
    got = abstention(cycles).iloc[0]
    assert got["no_draft_pct"] == pytest.approx(100 * 61 / 64)
    assert got["after_last_draft_pct"] == pytest.approx(100 * 60 / 61)
    assert (got["stuck"], got["one_chain"], got["requests"]) == (1, 1, 2)
