"""Shared fixtures: the repository, the embedded tokenizer, Hydra composition, and the CLI as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The smallest real bench: three English prompts, eight new tokens, one warm-up request.
SMALL_BENCH = ["+workload=en", "workload.num_prompts=3", "workload.max_new_tokens=8", "task.warmup=1", "task.repeats=1"]

CLI = Callable[..., subprocess.CompletedProcess]


def run_cli(*args: str, run_dir: Path | None = None, module: str = "harness", cwd: Path = REPO, timeout: int = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in a subprocess, as a user types it (``hydra.run.dir`` when ``run_dir`` is given)."""
    extra = [f"hydra.run.dir={run_dir}"] if run_dir is not None else []
    return subprocess.run([sys.executable, "-m", module, *args, *extra], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def cli() -> CLI:
    """The harness CLI runner (see :func:`run_cli`)."""
    return run_cli


@pytest.fixture(scope="module")
def pair():
    """A tiny random target and a partly agreeing draft (tests/tiny_models.py), built once per test module."""
    from tests.tiny_models import tiny_pair

    return tiny_pair()


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(REPO / "harness/models/tiny/target"))


@pytest.fixture
def compose_config():
    """Compose conf/config.yaml with overrides, as Hydra does for the CLI."""
    from hydra import compose, initialize_config_dir

    def compose_with(*overrides: str):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))

    return compose_with


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory) -> Path:
    """One real tiny sweep per test session, made by the CLI as a user would (for the analysis tests):
    two jobs (concurrency 1 and 2), each with the AR baseline and γ = 1, 2 on SMALL_BENCH."""
    sweep = tmp_path_factory.mktemp("analysis") / "sweep"
    done = run_cli("-m", *SMALL_BENCH, "gamma=[1,2]", "concurrency=1,2", f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr[-2000:]
    return sweep


@pytest.fixture(scope="session")
def tiny_cost_inputs(tmp_path_factory) -> tuple[Path, Path]:
    """A real profile (batch 1 and 2, up to 3 positions) and real traces (depth 2) of the embedded pair, made
    once per session by the CLI, for the cost-model fit against ``tiny_sweep`` (γ = 1, 2)."""
    root = tmp_path_factory.mktemp("cost_inputs")
    profile = run_cli("task=profile", "+workload=en", "task.batch_sizes=[1,2]", "task.max_depth=2", "task.repeats=2",
                      "task.warmup=1", run_dir=root / "profile")
    assert profile.returncode == 0, profile.stderr[-2000:]
    workload = [a for a in SMALL_BENCH if not a.startswith("task.")]  # the same prompts; trace has its own task keys
    traces = run_cli("task=trace", *workload, "task.warmup=1", "task.max_depth=2", run_dir=root / "trace")
    assert traces.returncode == 0, traces.stderr[-2000:]
    return root / "profile" / "profile.json", root / "trace" / "traces.parquet"


def slurm_cluster_state() -> str | None:
    """Why the SLURM tests cannot run here (None when a node answers): they need a running cluster."""
    import shutil

    if shutil.which("sinfo") is None:
        return "no SLURM commands on PATH (start a local cluster: scripts/slurm-local up, as root)"
    try:
        done = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%T"], capture_output=True, text=True,
                              timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    states = done.stdout.split()
    if done.returncode != 0 or not states:
        why = (done.stderr.strip().splitlines() or ["no node listed"])[-1]
        return f"no SLURM cluster answers ({why}); start one with scripts/slurm-local up"
    if not any(s.rstrip("*~#") in ("idle", "mixed", "allocated", "completing") for s in states):
        return f"the SLURM node is {states[0]} (not idle): scripts/slurm-local status"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The running cluster's default partition; the test is skipped, with the reason, when no cluster answers."""
    why = slurm_cluster_state()
    if why is not None:
        pytest.skip(why)
    done = subprocess.run(["sinfo", "--noheader", "--format=%P"], capture_output=True, text=True, timeout=30)
    names = done.stdout.split()
    return next((n.rstrip("*") for n in names if n.endswith("*")), names[0].rstrip("*"))
