"""What the output pins compare: the shape of every output a user sees, recorded before modules move.

The refactor ahead moves modules (the core below the applications, ``policies/`` split by role, one observation
builder, typed structured configs) and finally renames the draft-length columns. Each move must be shown to keep
what users read: this module computes it, ``tests/test_pinned_outputs.py`` compares it with what was recorded.

- ``configs/<name>.yaml``: the composed job config (``--cfg job``'s text, unresolved, as the application would
  print it) of every task of conf/task/ (``task=train`` and ``task=evaluate`` among them) with ``models=tiny`` and
  ``+workload=en``;
- ``outputs.json`` ``runs``: for small real runs of every task on the embedded tiny pair, the file names each
  writes, the sorted key paths of every JSON file (``/a/b``, ``[]`` for a list's items, ``*`` where the keys are
  data such as a host or a method name) and the column names and dtypes of every Parquet and CSV file. Values are
  not pinned: most read the clock;
- ``tables/<name>.txt``: the exact text of the printed tables (bench's table and ranking lines, tune's
  recommendation, ``task=evaluate``'s comparison, ``analysis.comparison``'s report, ``analysis.acceptance``'s
  line) computed from committed inputs (``inputs/`` here: two bench summaries of ``tests/data/tiny_sweep``;
  ``bench/results/...``);
- ``outputs.json`` ``policies``: every committed SB3 policy file read by the product's loader (its spaces, network,
  features) and its decisions: argmax actions on a seeded batch of observations, the γ its environment's
  observations lead to (``policies.train.ppo.policy_gammas`` on the committed traces), and the γ the
  registry's ``ppo``, ``ppo-distilled`` and ``ppo-cycle`` choose in replay on those traces, so that a move that
  changes how observations are built is caught.

Record with ``python -m tests.pin_outputs --record`` (about three minutes on 2 cores; ``--fast`` leaves out the
runs marked slow in the test). A re-record during the refactor must be shown, in its diff, to change names only
(a renamed column or key, a moved module in a config's ``_target_``), never a value, a dtype or a table's numbers.
``tests/data/pinning/golden.json`` (``tests/pinning.py``) is separate and is not rewritten here.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
PINS = REPO / "tests" / "data" / "pinning"
OUTPUTS = PINS / "outputs.json"
CONFIGS = PINS / "configs"
TABLES = PINS / "tables"
WORKLOAD = "+workload=en"
TASKS = tuple(sorted(p.stem for p in (REPO / "conf" / "task").glob("*.yaml")))

# Small real runs, one per task, each a few seconds on the tiny pair: (config, overrides, slow).
SMALL = ("+workload=en", "workload.categories=[chat-lines]", "workload.num_prompts=2", "workload.max_new_tokens=4")
PROFILE = "tiny-cpu-2core-vm"  # a shipped profile: training reads it instead of measuring one
TRAIN = ("train.train_prompts=2", "train.heldout_prompts=2", "train.max_gamma=2", "train.validation=0.5",
         "train.timesteps=64", "train.eval_every=64", "train.ppo.n_steps=32", "train.ppo.batch_size=32",
         "train.ppo.n_epochs=1", "train.profile_repeats=1")
RUNS: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "bench": ("config", ("task=bench", *SMALL, "task.warmup=0", "task.repeats=2", "gamma=[1]"), False),
    "tune": ("config", ("task=tune", *SMALL, "task.warmup=0", "task.repeats=2", "task.concurrency=[1]", "gamma=[1]"),
             False),
    "acceptance": ("config", ("task=acceptance", *SMALL), False),
    "costmodel": ("config", ("task=costmodel", "task.gamma_max=4"), False),
    "profile": ("config", ("task=profile", WORKLOAD, "task.batch_sizes=[1]", "task.max_gamma=1", "task.repeats=1",
                           "task.warmup=0"), False),
    "trace": ("config", ("task=trace", *SMALL, "task.warmup=0", "task.max_gamma=2"), False),
    "verify": ("config", ("task=verify", "task.trials=2000"), False),
    "predict": ("config", ("task=predict", "proposer=lookup", *SMALL, "workload.sampling.temperature=0",
                           "task.gammas=[1,2]", f"task.profile={PROFILE}", "task.allow_profile_mismatch=true"), False),
    "coverage": ("config", ("task=coverage", *SMALL, "task.warmup=0", "task.repeats=2", "task.comparisons=2",
                            "task.pairs=[ar]"), True),
    "train": ("config", ("task=train", WORKLOAD, "workload.max_new_tokens=4", *TRAIN, f"train.profile={PROFILE}",
                         "train.allow_profile_mismatch=true"), True),
    "evaluate": ("config", ("task=evaluate", WORKLOAD, "workload.max_new_tokens=4", *TRAIN, "evaluate.repeats=2",
                            "evaluate.warmup=0", "evaluate.concurrency=[1]", "evaluate.policies=[confidence,ppo]"),
                 True),
}
# Key paths whose keys are data (a host, a CPU model, a package, a method, a language), not names of the format.
DATA_KEYED = ("/nodes", "/cpu_models", "/packages", "/speedup_per_repeat", "/alpha_by_language",
              "/alpha_by_draft_step", "/alpha_by_position_index", "/environment", "/env")
# Files whose names or contents are the run's log, not an output.
SKIPPED = (".log",)
TFEVENTS = "events.out.tfevents."

# The committed inputs of the printed tables.
# bench's: copies of tests/data/tiny_sweep/{0,1}/summary.json as committed at 303c973, kept here so that a
# regeneration of tiny_sweep (a new run, other timings) does not move these pins
BENCH_SUMMARIES = PINS / "inputs"
POLICIES_RUN = REPO / "bench" / "results" / "smollm2-eagle-policies-interleaved-cpu-20261202"
RECOMMENDATION = REPO / "bench" / "results" / "smollm2-eagle-load-cpu-20261202" / "recommendation.json"
ACCEPTANCE = REPO / "bench" / "results" / "smollm2-eagle-acc96-cpu-20261204" / "en-t1" / "acceptance.json"
OBSERVATIONS = 64  # seeded observations per policy file
DISTILLED = {"thresholds": [0.3, 0.5, 0.7], "start_threshold": None}  # the committed files hold no thresholds


def compose(config: str, *overrides: str) -> Any:
    """Hydra's composition, as ``python -m harness`` (and its aliases) does it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from tests.conftest import register_schemas

    register_schemas()  # as the entry modules do (this module also runs outside pytest)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose(config_name=config, overrides=list(overrides))


# ---- 1. composed configs ------------------------------------------------------------------------------------

def config_overrides() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Name -> (config name, overrides) of every pinned composition: each task's."""
    return {f"task-{task}": ("config", (f"task={task}", WORKLOAD)) for task in TASKS}


def job_yaml(config: str, *overrides: str) -> str:
    """``--cfg job``'s text: the job config without the ``hydra`` node, unresolved (tests check it against the CLI)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(compose(config, *overrides))


def configs() -> dict[str, str]:
    return {name: job_yaml(config, *overrides) for name, (config, overrides) in config_overrides().items()}


# ---- 2. what each run writes ----------------------------------------------------------------------------------

def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value: ``/a/b`` for nested keys, ``[]`` for any item of a list (their union), ``*``
    for the keys of a :data:`DATA_KEYED` mapping (their names are data: hosts, packages, methods)."""
    paths: set[str] = set()
    if isinstance(value, dict):
        data_keyed = prefix.endswith(DATA_KEYED)
        for key, item in value.items():
            path = f"{prefix}/{'*' if data_keyed else key}"
            paths.add(path)
            paths |= key_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, f"{prefix}[]")
    return paths


def schema(frame: pd.DataFrame) -> list[list[str]]:
    """[[column, dtype], ...] in the file's order."""
    return [[str(name), str(dtype)] for name, dtype in frame.dtypes.items()]


def file_name(name: str) -> str:
    """A written file's name with the parts that are the clock's or the host's replaced (TensorBoard's events)."""
    folder, _, base = name.rpartition("/")
    if base.startswith(TFEVENTS):
        base = TFEVENTS + "<time>.<host>.<pid>.<n>"
    return f"{folder}/{base}" if folder else base


def describe_run_dir(run_dir: Path) -> dict[str, Any]:
    """The files a run wrote and, per JSON file, its key paths, per Parquet/CSV file its columns and dtypes."""
    found = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
                   if p.is_file() and not p.name.endswith(SKIPPED) and ".hydra" not in p.parts)
    out: dict[str, Any] = {"files": sorted({file_name(name) for name in found}), "json": {}, "tables": {}}
    for name in found:
        path = run_dir / name
        if name.endswith(".json"):
            out["json"][name] = sorted(key_paths(json.loads(path.read_text(encoding="utf-8"))))
        elif name.endswith(".parquet"):
            out["tables"][name] = schema(pd.read_parquet(path))
        elif name.endswith(".csv"):
            out["tables"][name] = schema(pd.read_csv(path))
    return out


def run(name: str, run_dir: Path) -> dict[str, Any]:
    """Run ``name`` of :data:`RUNS` in this process (as its front door does after composing) and describe it."""
    config, overrides, _ = RUNS[name]
    if name == "coverage":  # its parent starts worker processes with the overrides Hydra recorded: the real CLI
        from tests.conftest import run_cli

        done = run_cli(*overrides, run_dir=run_dir)
        assert done.returncode == 0, f"{name} exited {done.returncode}: {done.stderr[-2000:]}"
        return describe_run_dir(run_dir)
    from harness.tasks import run_task

    code = run_task(compose(config, *overrides), run_dir)
    assert code == 0, f"{name} exited {code}"
    return describe_run_dir(run_dir)


def runs(work: Path, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: run(name, work / name) for name in names}


# ---- 3. printed tables from committed inputs ------------------------------------------------------------------

def bench_text(summary: dict[str, Any]) -> str:
    """What task=bench logs at its end: the table, then the ranking lines."""
    from analysis.bench_table import bench_table, format_ranking, format_table

    methods, ranking = summary["methods"], summary["ranking"]
    return "\n".join([format_table(bench_table(methods, ranking)), *format_ranking(ranking, methods)]) + "\n"


@contextlib.contextmanager
def captured(logger: str) -> Iterator[io.StringIO]:
    """The messages ``logger`` logs meanwhile, one a line (as the argparse front doors print them)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger(logger)
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def acceptance_text(work: Path) -> str:
    """``python -m analysis.acceptance A B`` on a committed result and a copy of it whose per-prompt α are scaled by
    0.9 (the same prompts and positions: a paired comparison with a known difference)."""
    from analysis import acceptance

    a = json.loads(ACCEPTANCE.read_text(encoding="utf-8"))
    b = {**a, "alpha_per_prompt": [{**row, "alpha": 0.9 * row["alpha"]} for row in a["alpha_per_prompt"]]}
    path_b = work / "acceptance-b.json"
    path_b.write_text(json.dumps(b), encoding="utf-8")
    with captured(acceptance.__name__) as stream:
        assert acceptance.main([str(ACCEPTANCE), str(path_b)]) == 0
    return stream.getvalue()


def tables(work: Path) -> dict[str, str]:
    """Every printed table's text, from committed inputs only (deterministic)."""
    from analysis.comparison import load_comparisons, report
    from analysis.policy_table import comparison_frame, format_comparison
    from harness.tasks.tune import format_recommendation

    out = {path.name.removesuffix(".summary.json"): bench_text(json.loads(path.read_text(encoding="utf-8")))
           for path in sorted(BENCH_SUMMARIES.glob("bench-*.summary.json"))}
    out["tune-recommendation"] = format_recommendation(json.loads(RECOMMENDATION.read_text(encoding="utf-8"))) + "\n"
    for language in ("en", "zh"):
        frame = pd.read_parquet(POLICIES_RUN / language / "comparison.parquet")
        rows = frame.to_dict("records")
        out[f"policies-comparison-{language}"] = format_comparison(comparison_frame(rows)) + "\n"
    for metric in ("decode", "e2e"):
        out[f"analysis-comparison-{metric}"] = report(load_comparisons([POLICIES_RUN]), metric)
    out["analysis-acceptance"] = acceptance_text(work)
    return out


# ---- 4. the committed policy files ---------------------------------------------------------------------------

def committed_policy_files() -> list[str]:
    """Every policy file git tracks (``*.zip``), relative to the repository."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "*.zip"], cwd=REPO, capture_output=True, text=True, check=True)
    return sorted(line for line in listed.stdout.splitlines() if line)


class FileActor:
    """The file's actor behind SB3's ``predict`` (argmax of its logits), for :func:`policies.train.ppo.policy_gammas`:
    the file read as data, as the engine reads it, never unpickled."""

    def __init__(self, file: Any) -> None:
        self.file = file

    def predict(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, None]:
        import torch

        assert deterministic
        logits = self.file.logits(torch.as_tensor(np.atleast_2d(obs)))
        return logits.argmax(-1).numpy().reshape(np.shape(obs)[:-1]), None


def seeded_observations(file: Any, count: int = OBSERVATIONS) -> np.ndarray:
    """[count, F] float32 observations in the ranges the features take once scaled (seeded, the same each time)."""
    rng = np.random.default_rng(20261205)
    return rng.uniform(0.0, 1.0, (count, file.observation_space.shape[0])).astype(np.float32)


def actor_decisions(file: Any) -> dict[str, Any]:
    """Argmax actions on the seeded observations, and the gap between the top two logits (a decision whose gap is
    within float32 rounding may flip on another CPU's floating-point path; the test skips those), and the logits'
    sha256, which identifies the floating-point path the pins were recorded on."""
    import torch

    raw = file.logits(torch.from_numpy(seeded_observations(file))).numpy()
    logits = raw.astype(np.float64)
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return {"actions": logits.argmax(-1).tolist(), "gaps": (top2[:, 1] - top2[:, 0]).tolist(),
            "logits_sha256": hashlib.sha256(np.ascontiguousarray(raw).tobytes()).hexdigest()}


def env_gammas(path: Path, file: Any, traces: Any, profile: Any) -> list[int]:
    """The file's actor on its environment's observations (``DraftGammaEnv`` / ``CycleGammaEnv`` on the committed
    traces and profile): the γ of every recorded entry."""
    from policies.envs.cycle_gamma import CycleGammaEnv
    from policies.envs.gamma import DraftGammaEnv
    from policies.envs.observation import GAMMA, read_schema
    from policies.train.ppo import policy_gammas

    cycle = file.extra.get("actions") == "gamma"
    env_type = CycleGammaEnv if cycle else DraftGammaEnv
    features = {} if cycle else {"features": tuple(read_schema(file.extra, GAMMA, "file").features)}
    env = env_type("replay", traces, profile, max_gamma=int(file.extra["max_gamma"]), **features)
    env.reset(seed=0)
    return policy_gammas(FileActor(file), env, traces.count).tolist()


def registry_nodes(path: Path, file: Any) -> dict[str, dict[str, Any]]:
    """The registry's config nodes (conf/policy/ defaults) that read this file."""
    defaults = {name: dict(compose("config", f"policy={name}").policy) for name in ("ppo", "ppo-distilled",
                                                                                    "ppo-cycle")}
    if file.extra.get("actions") == "gamma":
        return {"ppo-cycle": {**defaults["ppo-cycle"], "path": str(path)}}
    return {"ppo": {**defaults["ppo"], "gamma_path": str(path)},
            "ppo-distilled": {**defaults["ppo-distilled"], "gamma_path": str(path), **DISTILLED}}


def policy_file_pins(relative: str) -> dict[str, Any]:
    """What the product's loader yields for one committed file, and the decisions it leads to."""
    from policies.envs.data import TraceSet, read_traces
    from policies.envs.replay import replay_gammas
    from policies.registry import make_policy
    from policies.sb3_files import read_policy_file
    from spectune.costmodel.profile import Profile

    path = REPO / relative
    file = read_policy_file(path)
    # the path is this checkout's; spectune.json is pinned by its keys and the fields below
    description = {k: v for k, v in file.describe().items() if k not in ("path", "spectune")}
    frame, metadata = read_traces(path.parent / "traces.parquet")
    traces = TraceSet(frame, metadata, str(path.parent / "traces.parquet"))
    profile = Profile.from_json(file.extra["profile"], f"{relative}:spectune.json")
    max_gamma = int(file.extra["max_gamma"])
    replay = {}
    for name, node in registry_nodes(path, file).items():
        policy = make_policy(node, max_gamma)
        described = {k: v for k, v in policy.describe().items() if k != "file"}  # the file: above
        replay[name] = {"describe": jsonable(described),
                        "gammas": replay_gammas(policy, traces, max_gamma, profile).tolist()}
    return {"file": jsonable(description), "spectune_keys": sorted(key_paths(file.extra)),
            "observation": _feature_names(file.extra.get("observation", [])),
            "actions": file.extra.get("actions"), "max_gamma": max_gamma,
            "hidden": list(file.hidden), "activation": file.activation,
            "observation_space": {"shape": list(file.observation_space.shape),
                                  "low": file.observation_space.low.tolist(),
                                  "high": file.observation_space.high.tolist()},
            "action_space": {"n": file.action_space.n, "start": file.action_space.start},
            "actor": actor_decisions(file), "env_gammas": env_gammas(path, file, traces, profile), "replay": replay}


def policies() -> dict[str, Any]:
    return {relative: policy_file_pins(relative) for relative in committed_policy_files()}


# ---- all of it -----------------------------------------------------------------------------------------------

def _feature_names(entry: Any) -> list[str]:
    """A file's observation names: a bare list (files before the schema) or the schema's ``features``."""
    return list(entry.get("features", [])) if isinstance(entry, dict) else list(entry)


def jsonable(value: Any) -> Any:
    """Plain JSON types (numpy scalars → Python)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def compute(work: Path, slow: bool = True) -> dict[str, Any]:
    """Every pin: {"configs": {name: yaml}, "tables": {name: text}, "runs": {...}, "policies": {...}}."""
    names = tuple(name for name, (_, _, is_slow) in RUNS.items() if slow or not is_slow)
    return {"configs": configs(), "tables": tables(work), "runs": jsonable(runs(work, names)),
            "policies": jsonable(policies())}


def read_recorded() -> dict[str, Any]:
    """What was recorded, in the shape :func:`compute` returns."""
    recorded = json.loads(OUTPUTS.read_text(encoding="utf-8"))
    return {"configs": {p.stem: p.read_text(encoding="utf-8") for p in sorted(CONFIGS.glob("*.yaml"))},
            "tables": {p.stem: p.read_text(encoding="utf-8") for p in sorted(TABLES.glob("*.txt"))}, **recorded}


def write(values: dict[str, Any], merge: bool) -> None:
    """The configs and tables as text files (readable diffs), the rest in outputs.json. ``merge`` keeps recorded runs
    that were not computed this time (``--fast``)."""
    for folder, suffix, texts in ((CONFIGS, ".yaml", values["configs"]), (TABLES, ".txt", values["tables"])):
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(f"*{suffix}"):
            if stale.stem not in texts:
                stale.unlink()
        for name, text in texts.items():
            (folder / f"{name}{suffix}").write_text(text, encoding="utf-8")
    runs_recorded = json.loads(OUTPUTS.read_text(encoding="utf-8"))["runs"] if merge and OUTPUTS.exists() else {}
    body = {"runs": {**runs_recorded, **values["runs"]}, "policies": values["policies"]}
    OUTPUTS.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None, compute_values: Callable[[Path, bool], dict[str, Any]] = compute) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help=f"write {PINS.relative_to(REPO)}/outputs.json, "
                        "configs/ and tables/")
    parser.add_argument("--fast", action="store_true", help="leave out the slow runs (coverage, train, evaluate); "
                        "with --record their recorded entries are kept")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        values = compute_values(Path(work), not args.fast)
    if args.record:
        write(values, merge=args.fast)
    else:
        print(json.dumps({k: values[k] for k in ("runs",)}, indent=1, sort_keys=True)[:4000])


if __name__ == "__main__":
    main()
