"""workloads.build.draft_curve: the committed draft's α curve as a table and a figure, and its bad input."""

import json
import subprocess
import sys
from pathlib import Path

from workloads.build.distil import LANGS
from workloads.build.draft_curve import figure, table
from workloads.build.train_draft import OUT

REPO = Path(__file__).resolve().parents[1]


def test_the_table_has_a_row_per_curve_point_with_every_language(tmp_path):
    curve = json.loads((OUT / "TRAINING.json").read_text())["curve"]
    lines = table(curve).splitlines()
    assert len(lines) == 2 + len(curve)
    last = lines[-1].strip("|").split("|")
    assert int(last[0]) == curve[-1]["step"]
    assert [float(v) for v in last[2:2 + len(LANGS)]] == [round(curve[-1]["alpha_lb"][lang], 3) for lang in LANGS]
    figure([("training", curve)], tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_a_folder_without_training_json_is_one_line_and_exit_code_not_zero(tmp_path):
    done = subprocess.run([sys.executable, "-m", "workloads.build.draft_curve", "--draft", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("error: --draft=")


def test_a_fine_tuned_drafts_history_is_every_stage_first_run_first(tmp_path):
    """A fine-tune's record keeps its start's under ``init``: the table and figure cover every stage in order."""
    from workloads.build.draft_curve import history_table, stages

    point = {"step": 0, "train_minutes": 0.0, "alpha_lb": {lang: 0.1 for lang in LANGS}}
    first = {"recipe": {"rounds": 4, "layers": 1}, "curve": [point, {**point, "step": 10, "train_minutes": 5.0}]}
    tune = {"recipe": {"first_round": 4, "rounds": 6, "layers": 2}, "curve": [point], "init": first}
    history = stages(tune)
    assert [label for label, _ in history] == ["training (rounds 0-3, 1 layer)", "fine-tune 1 (rounds 4-5, 2 layers)"]
    lines = history_table(history).splitlines()
    assert len(lines) == 2 + 3 and lines[-1].startswith("| fine-tune 1 (rounds 4-5, 2 layers) | 0 |")
    figure(history, tmp_path / "history.png")
    assert (tmp_path / "history.png").read_bytes()[:4] == b"\x89PNG"
