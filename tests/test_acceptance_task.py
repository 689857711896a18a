"""`python -m harness task=acceptance` end to end through the CLI, as a user runs it."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow(reason="each test runs python -m harness task=acceptance in a subprocess "
                                     "(model load + measurement)")




def test_acceptance_writes_alpha_and_c(cli, tmp_path):
    out = cli("task=acceptance", "+workload=en", "workload.num_prompts=3", "workload.max_new_tokens=8",
              f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "acceptance.json").read_text())
    assert 0 < result["alpha"] <= 1 and result["c"] > 0
    assert result["alpha_spread_over_positions"]["count"] == len(result["alpha_by_position_index"]) * 3 or \
        result["alpha_spread_over_positions"]["count"] <= 24
    assert result["workload"]["num_prompts"] == 3 and result["workload"]["sampling"]["temperature"] == 1.0
    assert result["models"]["target"]["weights_sha256"] and result["metadata"]["git"]
    assert "alpha =" in out.stdout and "c =" in out.stdout
    rows = result["alpha_per_prompt"]
    assert len(rows) == 3 and all(r["positions"] >= 1 for r in rows)
    pooled = sum(r["alpha"] * r["positions"] for r in rows) / sum(r["positions"] for r in rows)
    assert pooled == pytest.approx(result["alpha"], rel=1e-6)
    ci = result["alpha_ci95_over_prompts"]
    assert ci["n"] == 3 and ci["lo"] <= result["alpha"] <= ci["hi"]
    assert ci["estimate"] == pytest.approx(result["alpha"], rel=1e-6)


def test_hub_pair_offline_fails_in_one_line(cli, tmp_path):
    out = cli("task=acceptance", "+workload=en", "models=vicuna-7b-68m", f"hydra.run.dir={tmp_path}",
              env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("error: cannot load model 'lmsys/vicuna-7b-v1.3': "
                                                          "not in the local cache and the hub is unreachable")
    assert "Traceback" not in out.stderr


def test_missing_workload_is_one_line(cli, tmp_path):
    out = cli("task=acceptance", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 2 and "error: task=acceptance needs a workload" in out.stderr
