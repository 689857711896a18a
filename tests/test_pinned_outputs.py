"""What users see is pinned before modules move: composed configs, the files and keys each task writes, the printed
tables, and what the committed policy files decide.

``tests/pin_outputs.py`` computes each (its docstring lists what and why); ``tests/data/pinning/`` holds what it gave
when recorded (``configs/*.yaml``, ``tables/*.txt``, ``outputs.json``; ``inputs/`` the tables' fixed inputs). A
refactor that moves modules must leave every test here passing unchanged. Where a change is meant (the draft-length
rename), re-record with ``python -m tests.pin_outputs --record`` and show in the diff that only names changed.

Values that read the clock are not pinned: a run's numbers, and which γ wins (the tune recommendation's ``vllm``
part is written only when a γ wins, so its keys may be absent, never different). On another floating-point path
than the recording's (told by the sha256 of a policy file's logits on the seeded observations), the policy
decisions whose top two logits were within 1e-4 are not compared, nor the γ a trajectory of them gives.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests import pin_outputs

RECORDED = pin_outputs.read_recorded()
NEAR_TIE = 1e-4  # logits closer than this may swap on another CPU's float32 path
# Key paths that appear only when a clock-dependent outcome happens (task=tune: a γ wins and gets a vLLM form).
OPTIONAL = {("tune", "recommendation.json"): ("/vllm",)}


# ---- 1. composed configs ------------------------------------------------------------------------------------

def test_every_task_has_a_pinned_config():
    assert set(RECORDED["configs"]) == set(pin_outputs.config_overrides())


@pytest.mark.parametrize("name", sorted(pin_outputs.config_overrides()))
def test_the_composed_config_is_the_recorded_text(name):
    config, overrides = pin_outputs.config_overrides()[name]
    assert pin_outputs.job_yaml(config, *overrides) == RECORDED["configs"][name]


@pytest.mark.slow(reason="a python -m subprocess per front door (imports torch, transformers, SB3)")
@pytest.mark.parametrize(("module", "name"), [("harness", "task-bench"), ("harness", "task-evaluate"),
                                              ("policies.train", "task-train"), ("policies.evaluate", "task-evaluate")])
def test_the_cli_prints_the_pinned_config(module, name):
    """``--cfg job`` prints exactly what the in-process composition pinned (so the pins hold for the CLI), through the
    front door and through the aliases of task=train and task=evaluate (given ``task=...`` too, as it is pinned)."""
    _, overrides = pin_outputs.config_overrides()[name]
    done = subprocess.run([sys.executable, "-m", module, *overrides, "--cfg", "job"], cwd=pin_outputs.REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == RECORDED["configs"][name]


# ---- 2. what each run writes ----------------------------------------------------------------------------------

def _run_params() -> list[Any]:
    return [pytest.param(name, marks=pytest.mark.slow(reason="worker processes / PPO training: tens of seconds"))
            if slow else name for name, (_, _, slow) in pin_outputs.RUNS.items()]


@pytest.mark.parametrize("name", _run_params())
def test_a_run_writes_the_pinned_files_keys_and_columns(name, tmp_path):
    got = pin_outputs.jsonable(pin_outputs.run(name, tmp_path / name))
    want = RECORDED["runs"][name]
    assert got["files"] == want["files"]
    assert got["tables"] == want["tables"]
    assert set(got["json"]) == set(want["json"])
    for file, paths in want["json"].items():
        optional = OPTIONAL.get((name, file), ())
        missing = [p for p in paths if p not in got["json"][file] and not p.startswith(optional)]
        extra = [p for p in got["json"][file] if p not in paths]
        assert not missing and not extra, (file, missing[:10], extra[:10])


def test_the_key_paths_name_lists_and_data_keys():
    value = {"a": [{"b": 1}, {"c": {"d": 2}}], "nodes": {"host-1": {"cpu": 2}}}
    assert pin_outputs.key_paths(value) == {"/a", "/a[]/b", "/a[]/c", "/a[]/c/d", "/nodes", "/nodes/*",
                                            "/nodes/*/cpu"}


# ---- 3. printed tables ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, str]:
    return pin_outputs.tables(tmp_path_factory.mktemp("tables"))


def test_every_table_is_pinned(tables):
    assert set(tables) == set(RECORDED["tables"])


@pytest.mark.parametrize("name", sorted(RECORDED["tables"]))
def test_the_printed_table_is_the_recorded_text(tables, name):
    assert tables[name] == RECORDED["tables"][name]


# ---- 4. committed policy files --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def policies() -> dict[str, Any]:
    return pin_outputs.jsonable(pin_outputs.policies())


def test_every_committed_policy_file_is_pinned():
    assert pin_outputs.committed_policy_files() == sorted(RECORDED["policies"])
    assert RECORDED["policies"], "no committed policy file found"


@pytest.mark.parametrize("relative", sorted(RECORDED["policies"]))
def test_a_committed_policy_file_loads_and_decides_as_recorded(policies, relative):
    got, want = policies[relative], RECORDED["policies"][relative]
    for key in ("file", "spectune_keys", "observation", "actions", "max_gamma", "hidden", "activation",
                "observation_space", "action_space"):
        assert got[key] == want[key], key
    assert {name: r["describe"] for name, r in got["replay"].items()} == \
        {name: r["describe"] for name, r in want["replay"].items()}
    same_path = got["actor"]["logits_sha256"] == want["actor"]["logits_sha256"]
    clear = [i for i, gap in enumerate(want["actor"]["gaps"]) if same_path or gap > NEAR_TIE]
    assert [got["actor"]["actions"][i] for i in clear] == [want["actor"]["actions"][i] for i in clear]
    if not same_path:
        pytest.skip("another floating-point path than the recording's (the logits' sha256 differs): the γ of "
                    "whole trajectories are pinned only there; the clear decisions above were compared")
    assert got["env_gammas"] == want["env_gammas"]
    for name in want["replay"]:
        assert got["replay"][name]["gammas"] == want["replay"][name]["gammas"], name


def test_the_recorded_file_is_json():
    """outputs.json parses and holds every run of pin_outputs.RUNS."""
    body = json.loads(pin_outputs.OUTPUTS.read_text(encoding="utf-8"))
    assert set(body["runs"]) == set(pin_outputs.RUNS)
