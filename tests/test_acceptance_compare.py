"""`python -m analysis.acceptance`: two drafts' α compared paired over the same prompts."""

from __future__ import annotations

import json

import pytest

from analysis.acceptance import main, paired_alpha, read_acceptance
from spectune.errors import SpectuneError


def _result(alphas: list[float], positions: list[int]) -> dict:
    rows = [{"id": f"p{i}", "language": "en", "positions": n, "alpha": a}
            for i, (a, n) in enumerate(zip(alphas, positions, strict=True))]
    return {"task": "acceptance", "alpha_per_prompt": rows}


def test_the_difference_pools_positions_and_its_interval_is_paired():
    # A is B plus 0.05 on every prompt: pooled 0.575 vs 0.525, and leaving out any prompt gives exactly 0.05,
    # so the paired interval is the point (two separate intervals would each span the prompts' spread)
    a = _result([0.45, 0.55, 0.60, 0.65], [10, 30, 20, 20])
    b = _result([0.40, 0.50, 0.55, 0.60], [10, 30, 20, 20])
    r = paired_alpha(a, b)
    assert r["alpha_a"] == pytest.approx((4.5 + 16.5 + 12 + 13) / 80)
    assert r["alpha_b"] == pytest.approx((4 + 15 + 11 + 12) / 80)
    assert r["difference"]["estimate"] == pytest.approx(0.05)
    assert r["difference"]["lo"] == pytest.approx(0.05) and r["difference"]["hi"] == pytest.approx(0.05)
    assert (r["prompts"], r["positions"], r["prompts_a_higher"], r["prompts_b_higher"]) == (4, 80, 4, 0)


def test_a_mixed_difference_has_an_interval_around_it():
    a = _result([0.50, 0.70, 0.40, 0.65, 0.55, 0.60], [20] * 6)
    b = _result([0.45, 0.60, 0.45, 0.60, 0.50, 0.58], [20] * 6)
    d = paired_alpha(a, b)["difference"]
    assert d["estimate"] == pytest.approx((0.05 + 0.10 - 0.05 + 0.05 + 0.05 + 0.02) / 6)
    assert d["lo"] < d["estimate"] < d["hi"] and d["n"] == 6


def test_unpaired_runs_are_refused_in_one_line(tmp_path):
    a = _result([0.5, 0.6], [10, 12])
    b = _result([0.5, 0.6], [10, 13])  # another continuation length: not the same positions
    with pytest.raises(SpectuneError, match="not paired: 2 and 2 prompts, 1 differing"):
        paired_alpha(a, b)
    (tmp_path / "old.json").write_text(json.dumps({"task": "acceptance", "alpha": 0.5}))
    with pytest.raises(SpectuneError, match="not a task=acceptance result with per-prompt rows"):
        read_acceptance(tmp_path / "old.json")


def test_the_command_reads_run_directories(tmp_path, caplog):
    for name, alphas in (("a", [0.6, 0.7]), ("b", [0.5, 0.7])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "acceptance.json").write_text(json.dumps(_result(alphas, [10, 10])))
    caplog.set_level("INFO")
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "alpha A 0.6500, B 0.6000; A - B +0.0500" in caplog.text
    assert main([str(tmp_path / "a"), str(tmp_path / "missing")]) == 2
