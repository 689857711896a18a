"""`python -m harness task=verify|costmodel` end to end, as a user runs them, in a temporary run dir.

Each run is a subprocess (about 2–4 s on a small CPU). The Monte Carlo uses task.trials=20000:
per-token SE ≤ √(0.25/20000) ≈ 0.0035, and the audit's own rule (4.5 SE, chi-square p > 1e-3) decides.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow(reason="each test is a python -m harness subprocess (Hydra start-up, 20k-trial "
                                     "Monte Carlo)")


@pytest.fixture
def harness(cli):
    """The CLI with the run directory first: ``harness(run_dir, *overrides)``."""
    return lambda run_dir, *overrides: cli(*overrides, run_dir=run_dir, timeout=300)


def test_verify_exact_passes_and_writes_json(harness, tmp_path: Path) -> None:
    res = harness(tmp_path, "task=verify", "task.trials=20000")
    assert res.returncode == 0, res.stderr
    assert "Verdict: exact PASS (configured), naive FAIL" in res.stdout
    out = json.loads((tmp_path / "verify.json").read_text())
    assert out["verdict"] == {"exact": "PASS", "naive": "FAIL", "argmax-match": "FAIL"}
    assert out["n"] == 20000 and out["seed"] == 20260923 and out["configured_sampler"] == "exact"
    assert out["laws"]["naive_law"] == pytest.approx([0.35, 0.39, 0.26])
    assert out["laws"]["tv_naive_vs_p"] == pytest.approx(0.15)
    assert out["laws"]["Z"] == pytest.approx(0.3) and out["laws"]["residual"] == pytest.approx([1, 0, 0])
    exact = out["monte_carlo"]["variants"]["exact"]
    assert sum(exact["counts"]) == 20000 and exact["tv_vs_expected"] < 0.02
    assert out["monte_carlo"]["variants"]["naive"]["tv_vs_expected"] == pytest.approx(0.15, abs=0.02)
    assert out["block_check"]["variants"]["exact"]["verdict"] == "PASS"
    assert "packages" in out["metadata"] and out["rule"].startswith("PASS iff")


def test_verify_naive_reports_fail_and_exits_nonzero(harness, tmp_path: Path) -> None:
    res = harness(tmp_path, "task=verify", "sampler=naive", "task.trials=20000", "task.block_check=false")
    assert res.returncode not in (0, 2), res.stderr
    assert "naive FAIL (configured)" in res.stdout
    out = json.loads((tmp_path / "verify.json").read_text())
    assert out["verdict"]["naive"] == "FAIL" and out["exit_code"] == res.returncode
    assert out["block_check"] == {"skipped": "task.block_check=false"}


def test_verify_user_pair_with_zeros(harness, tmp_path: Path) -> None:
    """p has a zero (must never appear) and q has a zero (reachable only through the residual)."""
    res = harness(tmp_path, "task=verify", "task.p=[0.0,0.5,0.5]", "task.q=[0.5,0.5,0.0]",
                  "task.trials=20000", "task.block_check=false")
    assert res.returncode == 0, res.stderr
    exact = json.loads((tmp_path / "verify.json").read_text())["monte_carlo"]["variants"]["exact"]
    assert exact["counts"][0] == 0 and exact["counts"][2] > 9000


def test_costmodel_default_sweep(harness, tmp_path: Path) -> None:
    res = harness(tmp_path, "task=costmodel")
    assert res.returncode == 0, res.stderr
    grid = pd.read_csv(tmp_path / "costmodel.csv")
    assert len(grid) == 16 * 3 * 2
    best = {(o["alpha"], o["c"]): o for o in json.loads((tmp_path / "costmodel.json").read_text())["optima"]}
    assert best[(0.7, 0.05)]["gamma"] == 6 and best[(0.7, 0.05)]["E"] == pytest.approx(3.058819, abs=5e-7)
    assert best[(0.7, 0.05)]["S"] == pytest.approx(2.353, abs=5e-4)
    assert best[(0.7, 0.2)]["gamma"] == 3 and best[(0.7, 0.2)]["S"] == pytest.approx(1.583, abs=5e-4)
    assert (tmp_path / "costmodel.png").read_bytes()[:4] == b"\x89PNG"


def test_costmodel_overrides(harness, tmp_path: Path) -> None:
    res = harness(tmp_path, "task=costmodel", "task.alphas=[0.7]", "task.cs=[0.05]", "task.g=3",
                  "task.gamma_min=6", "task.gamma_max=6", "task.plot=false")
    assert res.returncode == 0, res.stderr
    grid = pd.read_csv(tmp_path / "costmodel.csv")
    assert len(grid) == 1 and grid["S"].item() == pytest.approx(0.927, abs=5e-4)
    assert not (tmp_path / "costmodel.png").exists()


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["task=verify", "task.p=[0.5,-0.1,0.6]"], "task.p[1]=-0.1"),
    (["task=verify", "task.q=[0.5,0.6,0.2]"], "task.q=[0.5, 0.6, 0.2] sums to 1.3"),
    (["task=verify", "task.q=[0.5,0.5]"], "task.p has 3 entries and task.q has 2"),
    (["task=costmodel", "task.alphas=[0.7,1.5]"], "task.alphas[1]=1.5"),
    (["task=costmodel", "task.gamma_min=0"], "task.gamma_min=0"),
    (["task=costmodel", "task.cs=[-0.1]"], "task.cs[0]=-0.1"),
])
def test_bad_input_is_one_line_exit_2(harness, tmp_path: Path, overrides: list[str], fragment: str) -> None:
    res = harness(tmp_path, *overrides)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], res.stderr
    assert "Traceback" not in res.stderr
