"""Task registry. Each task module exposes ``run(cfg, run_dir) -> int`` (the exit code).

Modules are imported lazily so that `task=costmodel` does not pay for loading transformers.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from omegaconf import DictConfig

from spectune.errors import SpectuneError

TASKS: dict[str, str] = {
    "bench": "harness.tasks.bench",
    "verify": "harness.tasks.verify",
    "costmodel": "harness.tasks.costmodel",
    "acceptance": "harness.tasks.acceptance",
    "trace": "harness.tasks.trace",
    "profile": "harness.tasks.profile",
    "tune": "harness.tasks.tune",
    "coverage": "harness.tasks.coverage",
    "predict": "harness.tasks.predict",
    "train": "harness.tasks.train",
    "evaluate": "harness.tasks.evaluate",
}
# Tasks whose rerun with resume=true starts over: a signal drops the run, and resume=true is refused
NOT_RESUMED = ("train", "evaluate")


def resumes(name: str) -> bool:
    """Whether ``task=name`` is stopped cleanly by a signal and finished by a rerun with ``resume=true``."""
    return name not in NOT_RESUMED


def run_task(cfg: DictConfig, run_dir: Path) -> int:
    name = cfg.task.name
    if name not in TASKS:
        raise SpectuneError(f"task={name!r} is unknown: choose one of {', '.join(TASKS)}")
    if cfg.get("resume") and not resumes(name):
        raise SpectuneError(f"resume=true is invalid with task={name}: it does not resume (rerun it without resume, "
                            "into a new directory)")
    module = importlib.import_module(TASKS[name])
    return int(module.run(cfg, run_dir) or 0)
