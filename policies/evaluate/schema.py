"""The schema of conf/task/evaluate.yaml's ``evaluate`` node (conf/task/train.yaml, which it composes, has its own:
:mod:`policies.train.schema`), as spectune/config.py describes. ``python -m harness`` registers both with the other
tasks' (harness/tasks/schemas.py), and so does the alias ``python -m policies.evaluate``, before Hydra composes;
values, ranges and the rules across keys stay in the YAML file and in
:class:`policies.evaluate.pipeline.EvaluateSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from policies.train import schema as train_schema
from spectune import config


@dataclass
class EvaluateConfig:
    """``evaluate``: in conf/task/evaluate.yaml's order."""

    policies: Any = MISSING  # a policy name or a list of them
    params: Any = MISSING  # null or {policy: {parameter: value}} (OmegaConf 2.3 cannot merge a mapping into a
    # typed mapping that is null: the command line's evaluate.params={...} would fail)
    concurrency: Any = MISSING  # a concurrency or a list of them
    repeats: int = MISSING
    grid: Any = MISSING  # null or a list of γ values
    grid_repeats: int = MISSING
    warmup: int = MISSING
    policies_from: str | None = MISSING
    calibrate: bool = MISSING
    tune: bool = MISSING
    hindsight: bool = MISSING
    design: str | None = MISSING
    block_prompts: int | None = MISSING
    noise_floor: bool = MISSING


@dataclass
class EvaluateFile:
    """conf/task/evaluate.yaml's own node (its ``task`` and ``train`` values are typed by train.yaml's schema)."""

    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)


def register() -> None:
    """Store /schema/task/evaluate and what conf/task/train.yaml names (the library's schemas with it)."""
    train_schema.register()
    config.store("task/evaluate", EvaluateFile, root=True)
