"""The schemas of conf/task/*.yaml: one dataclass per task file, the types of its keys (spectune/config.py says how
they are used). A task file in the ``_global_`` package (bench, tune, coverage, train, evaluate) also sets top-level
keys (``gamma``, ``concurrency``, ``train``...): its ``*File`` schema holds them beside the ``task`` node and is
stored as an open root. train's and evaluate's live beside the code that reads them (policies/train/schema.py,
policies/evaluate/schema.py), which their aliases ``python -m policies.train|evaluate`` register too.

Light on purpose (no task module is imported): ``python -m harness`` registers these at import, before Hydra
composes, whatever task runs. The fields follow each YAML file's keys in its order; values, ranges and the rules
across keys stay in the YAML files and in the task modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from policies.evaluate.schema import EvaluateFile
from policies.train.schema import TrainFile
from spectune import config, engines
from spectune.engine import proposers


@dataclass
class WorkloadDefaults:
    """``task.workload_defaults``: the workload keys a task measures by default (conf/workload/_bundled.yaml reads
    them; a ``workload.*`` override wins)."""

    categories: Any = MISSING  # a prompt category or a list of them (workloads/categories.py)
    num_prompts: int | None = MISSING


@dataclass
class BenchTask:
    name: str = MISSING
    warmup: int = MISSING
    baseline: bool = MISSING
    repeats: int = MISSING
    noise_floor: bool = MISSING
    design: str | None = MISSING
    block_prompts: int | None = MISSING
    target_mde: float | None = MISSING
    pilot_prompts: int | None = MISSING
    confirm_prompts: int | None = MISSING
    compare: Any = None  # more policies in the grid: a list of {name, gamma, parameters} (harness/tasks/compared.py)
    workload_defaults: WorkloadDefaults = field(default_factory=WorkloadDefaults)


@dataclass
class BenchFile:
    """conf/task/bench.yaml: the ``task`` node and the top-level keys of the grid and the load."""

    task: BenchTask = field(default_factory=BenchTask)
    gamma: Any = MISSING  # a γ or a list of them
    concurrency: int = MISSING
    request_rate: float | None = MISSING
    burstiness: float = MISSING


@dataclass
class TuneTask:
    name: str = MISSING
    concurrency: Any = MISSING  # a concurrency or a list of them
    repeats: int = MISSING
    warmup: int = MISSING
    languages: Any = MISSING  # null, a bundled language or a list of them
    request_rate: float | None = MISSING
    burstiness: float = MISSING
    noise_floor: bool = MISSING
    design: str | None = MISSING
    block_prompts: int | None = MISSING
    validate_prompts: int | None = MISSING


@dataclass
class TuneFile:
    task: TuneTask = field(default_factory=TuneTask)
    gamma: Any = MISSING


@dataclass
class CoverageTask:
    name: str = MISSING
    comparisons: int = MISSING
    pairs: Any = MISSING  # a pair or a list of them
    gamma: int = MISSING
    repeats: int = MISSING
    warmup: int = MISSING
    design: str | None = MISSING
    block_prompts: int | None = MISSING
    worker: int | None = MISSING


@dataclass
class CoverageFile:
    task: CoverageTask = field(default_factory=CoverageTask)
    concurrency: int = MISSING


@dataclass
class TraceTask:
    name: str = MISSING
    max_gamma: int = MISSING
    concurrency: int = MISSING
    warmup: int = MISSING


@dataclass
class ProfileTask:
    name: str = MISSING
    batch_sizes: Any = MISSING  # a batch size or a list of them
    max_gamma: int = MISSING
    repeats: int = MISSING
    warmup: int = MISSING
    label: str | None = MISSING


@dataclass
class AcceptanceTask:
    name: str = MISSING
    feature_max_gamma: int = MISSING


@dataclass
class CostmodelTask:
    name: str = MISSING
    alphas: Any = MISSING  # an α or a list of them
    cs: Any = MISSING  # a c or a list of them
    gamma_min: int = MISSING
    gamma_max: int = MISSING
    g: Any = MISSING  # a number, a list g(1)..g(n) or a table {γ: cost}
    overhead: float = MISSING
    joint: Any = MISSING  # null or a list of probabilities
    plot: bool = MISSING


@dataclass
class VerifyReal:
    prompts: int = MISSING
    trials: int = MISSING
    min_expected: int | float = MISSING
    engine_requests: int = MISSING
    engine_concurrency: int = MISSING
    engine_gamma: int = MISSING
    engine_conditions: int = MISSING
    engine_mix: Any = MISSING  # null or a list of {temperature[, top_k, top_p]}: the engine level on a mixed batch


@dataclass
class VerifyServer:
    spec_types: list[str] = MISSING
    gamma: int = MISSING
    max_new_tokens: int = MISSING
    gap_bound: float = MISSING
    distribution: bool = MISSING
    draw_spec_type: str = MISSING
    draw_category: str = MISSING
    prefix_tokens: int = MISSING
    pilot: int = MISSING
    n_probs: int = MISSING
    power: float = MISSING
    max_requests: int = MISSING
    min_expected: int | float = MISSING


@dataclass
class VerifyTask:
    name: str = MISSING
    source: str = MISSING
    p: list[float] = MISSING
    q: list[float] = MISSING
    trials: int = MISSING
    z_max: float = MISSING
    chi2_min_pvalue: float = MISSING
    block_check: bool = MISSING
    real: VerifyReal = field(default_factory=VerifyReal)
    server: VerifyServer = field(default_factory=VerifyServer)


@dataclass
class PredictTask:
    name: str = MISSING
    gammas: Any = MISSING  # a γ or a list of them
    profile: str | None = MISSING
    allow_profile_mismatch: bool = MISSING


# task name -> (schema, whether it is an open root: the file is in the _global_ package)
SCHEMAS: dict[str, tuple[type, bool]] = {
    "bench": (BenchFile, True), "tune": (TuneFile, True), "coverage": (CoverageFile, True),
    "trace": (TraceTask, False), "profile": (ProfileTask, False), "acceptance": (AcceptanceTask, False),
    "costmodel": (CostmodelTask, False), "verify": (VerifyTask, False), "predict": (PredictTask, False),
    "train": (TrainFile, True), "evaluate": (EvaluateFile, True),
}


def register() -> None:
    """Store every task's schema as /schema/task/<task> (and the library's, the proposers' and the server engines'
    schemas: /schema/engine/<name>), where conf/task/<task>.yaml names it."""
    config.register()
    proposers.register_schemas()
    engines.register_schemas()
    for name, (schema, root) in SCHEMAS.items():
        config.store(f"task/{name}", schema, root=root)
