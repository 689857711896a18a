"""workloads.build.draft_curve: the committed draft's α curve as a table and a figure, and its bad input."""

import json
import subprocess
import sys
from pathlib import Path

from workloads.build.draft_curve import figure, table
from workloads.build.train_draft import LANGS, OUT

REPO = Path(__file__).resolve().parents[1]


def test_the_table_has_a_row_per_curve_point_with_every_language(tmp_path):
    curve = json.loads((OUT / "TRAINING.json").read_text())["curve"]
    lines = table(curve).splitlines()
    assert len(lines) == 2 + len(curve)
    last = lines[-1].strip("|").split("|")
    assert int(last[0]) == curve[-1]["step"]
    assert [float(v) for v in last[2:2 + len(LANGS)]] == [round(curve[-1]["alpha_lb"][lang], 3) for lang in LANGS]
    figure(curve, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_a_folder_without_training_json_is_one_line_and_exit_code_not_zero(tmp_path):
    done = subprocess.run([sys.executable, "-m", "workloads.build.draft_curve", "--draft", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("error: --draft=")
