"""analysis.report and analysis.plots: known answers for the tables behind the figures, and the report of a
real tiny sweep (sections present, figures written, absent data said, bad input in one line)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis import plots
from analysis.report import build, markdown_table

PNG = b"\x89PNG\r\n\x1a\n"


def _requests(ar: list[float], method: list[float]) -> pd.DataFrame:
    rows = [{"run": "r", "method": m, "gamma": g, "prompt_id": f"p{i}", "status": "ok", "tpot_ms": t,
             "language": "en", "concurrency": 1}
            for m, g, times in (("ar", 0, ar), ("fixed:gamma=2", 2, method)) for i, t in enumerate(times)]
    return pd.DataFrame(rows)


def test_speedup_is_the_ratio_of_mean_tpots_with_a_paired_interval():
    table = plots.speedup_table(_requests([10.0, 20.0, 30.0], [5.0, 10.0, 15.0]))
    row = table.iloc[0]
    assert row["tpot_speedup"] == pytest.approx(2.0) and row["n_prompts"] == 3
    # every prompt is exactly twice as fast, so every paired resample gives 2: the interval has width 0
    assert row["ci95_lo"] == pytest.approx(2.0) and row["ci95_hi"] == pytest.approx(2.0)
    noisy = plots.speedup_table(_requests([10.0, 20.0, 30.0, 40.0], [5.0, 12.0, 14.0, 25.0])).iloc[0]
    assert noisy["ci95_lo"] < noisy["tpot_speedup"] < noisy["ci95_hi"]


def test_per_position_acceptance_counts_only_cycles_that_drafted_that_far():
    cycles = pd.DataFrame({"language": "en", "method": "fixed:gamma=2", "gamma": 2,
                           "num_drafts": [2, 2, 2, 1, 0], "accepted": [2, 1, 0, 1, 0]})
    table = plots.per_position_acceptance(cycles).set_index("position")
    assert table.loc[1, "joint_acceptance"] == pytest.approx(3 / 4) and table.loc[1, "cycles"] == 4
    assert table.loc[2, "joint_acceptance"] == pytest.approx(1 / 3) and table.loc[2, "cycles"] == 3


def test_markdown_table_escapes_pipes_and_shows_missing_values():
    text = markdown_table(pd.DataFrame({"a": ["x|y", None], "b": [1.5, float("nan")]}))
    assert text.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | 1.50 |", "| - | - |"]


@pytest.fixture
def sweep_copy(tiny_sweep, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_sweep, tmp_path / "sweep"))


def test_report_of_a_sweep_has_every_section_and_its_figures(sweep_copy):
    report = build(sweep_copy)
    text = report.read_text()
    for name in ("speedup_vs_gamma", "ttft", "tpot", "accepted_length", "per_position_acceptance",
                 "throughput_vs_concurrency", "p99_tpot_vs_concurrency"):
        assert f"]({name}.png)" in text, name
        assert (sweep_copy / f"{name}.png").read_bytes()[:8] == PNG, name
    assert "Swept: concurrency" in text and "| fixed:gamma=2 |" in text
    assert text.count("Best by output_throughput: **") == 2  # the recorded ranking of each job
    assert "_Skipped: no costmodel_fit.csv here" in text  # absent data is said, not an error
    assert "_Skipped: no adaptive policy" in text
    assert not (sweep_copy / "costmodel_fit.png").exists()


def test_report_draws_the_cost_model_when_a_fit_is_there(sweep_copy):
    fit = pd.DataFrame({"gamma": [1, 2], "batch_size": 1, "predicted_speedup": [1.1, 1.2],
                        "measured_speedup": [1.0, 1.3], "error": [0.1, -0.077], "constant_alpha_speedup": [1.2, 1.4],
                        "constant_alpha_error": [0.2, 0.077]})
    fit.to_csv(sweep_copy / "costmodel_fit.csv", index=False)
    text = build(sweep_copy).read_text()
    assert "](costmodel_fit.png)" in text and (sweep_copy / "costmodel_fit.png").read_bytes()[:8] == PNG


def test_report_of_one_run_skips_the_concurrency_figures(sweep_copy):
    job = sweep_copy / "0"
    text = build(job).read_text()
    assert text.count("_Skipped: one concurrency only") == 2
    assert "](speedup_vs_gamma.png)" in text and (job / "report.md").exists()


@pytest.mark.slow(reason="python -m analysis.report in a subprocess (plots every figure)")
def test_cli_writes_the_report_and_fails_in_one_line_on_an_empty_dir(sweep_copy, tmp_path, cli):
    done = cli(str(sweep_copy / "1"), module="analysis.report")
    assert done.returncode == 0, done.stderr
    assert (sweep_copy / "1" / "report.md").exists() and "wrote" in done.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = cli(str(empty), module="analysis.report")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert f"{empty} holds no spectune results" in bad.stderr


def test_policies_figure_only_when_a_policy_ran():
    fixed = pd.DataFrame({"method": ["fixed:gamma=1", "fixed:gamma=2"], "tpot_speedup": [1.1, 1.3],
                          "language": "en", "concurrency": 1})
    assert plots.policies_vs_grid(fixed) is None
    both = pd.concat([fixed, pd.DataFrame({"method": ["confidence:gamma=8"], "tpot_speedup": [1.4],
                                           "language": "en", "concurrency": 1})], ignore_index=True)
    figure = plots.policies_vs_grid(both)
    assert figure is not None and plots.png(figure)[:8] == PNG
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == list(both["method"])
