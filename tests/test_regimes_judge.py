"""The adaptive-regimes readings are recomputed from the committed run directories: each folder's TABLES.md is what
:func:`analysis.regimes.judge_folder` writes from its held-out run and static answers, and the front page's
per-regime row is what the runs and maps say."""

import json
from pathlib import Path

import pytest

from analysis.headlines import QUESTIONS, regime_map, runs_of
from analysis.regimes import judge_folder

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
FOLDERS = sorted(p.parent.name for p in RESULTS.glob("adaptive-regimes-*/TABLES.md"))


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_committed_tables_recompute_from_the_runs(folder: str) -> None:
    assert judge_folder(RESULTS / folder) == (RESULTS / folder / "TABLES.md").read_text()


def test_the_current_runs_tables_are_committed() -> None:
    assert FOLDERS == ["adaptive-regimes-batch-edge-it-smollm2-cpu-20261207",
                       "adaptive-regimes-fresh-smollm2-cpu-20261207",
                       "adaptive-regimes-no-probe-en-smollm2-cpu-20261207"]


def test_the_front_pages_regime_row_reads_each_phases_map_entry_and_its_held_out_speedup() -> None:
    """The headline's per-regime answer joins three files: the phases (metadata), the map's γ for each phase's
    temperature and concurrency (map-<language>.json) and the map's held-out speed-up in that phase (summary)."""
    runs = runs_of(next(q for q in QUESTIONS if q.answer is regime_map), RESULTS)
    assert runs
    _, text, _ = regime_map(runs, RESULTS)
    for run in runs:
        language = run.name.removeprefix("held-out-")
        regimes = json.loads((run.parent / f"map-{language}.json").read_text())["regimes"]
        gamma = {(r["temperature"], r["concurrency"]): r["gamma"] for r in regimes}
        summary = json.loads((run / "summary.json").read_text())
        rows = {r["phase"]: r for r in summary["by_phase"] if r["method"].startswith("regime-map")}
        phases = json.loads((run / "metadata.json").read_text())["workload"]["phases"]
        cells = []
        for phase in phases:
            t, c = phase["sampling_mix"][0]["temperature"], phase["concurrency"]
            row = rows[phase["name"]]
            chosen = "off" if gamma[(t, c)] == 0 else f"γ {gamma[(t, c)]}"
            lo, hi = row["speedup_ci"]
            mode = "greedy" if t == 0 else f"T = {t:g}"
            cells.append(f"{mode} c{c} {chosen} {row['speedup']:.2f}× [{lo:.2f}, {hi:.2f}]")
        assert f"{language}: " + "; ".join(cells) in text
