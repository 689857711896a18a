"""The adaptive-regimes readings are recomputed from the committed run directories: each folder's TABLES.md is what
:func:`analysis.regimes.judge` writes from its held-out run and static answers."""

from pathlib import Path

import pytest

from analysis.regimes import judge

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
FOLDERS = [(folder, language) for folder, language in (("adaptive-regimes-smollm2-cpu-20261207", "English"),
                                                      ("adaptive-regimes-it-smollm2-cpu-20261207", "Italian"))
           if (RESULTS / folder / "TABLES.md").is_file()]


@pytest.mark.parametrize(("folder", "language"), FOLDERS)
def test_the_committed_tables_recompute_from_the_runs(folder: str, language: str) -> None:
    here = RESULTS / folder
    code = language[:2].lower()
    assert judge(here / f"held-out-{code}", here / f"map-{code}.json", language) == (here / "TABLES.md").read_text()
