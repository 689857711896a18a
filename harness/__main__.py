"""`python -m harness`: the Hydra application. Composes conf/config.yaml and runs ``task``.

Bad input, logging and signals are the front door's (:mod:`spectune.cli`); a rerun with ``resume=true`` finishes
an interrupted run.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from harness.tasks import run_task, schemas
from spectune import cli
from spectune.engine import proposers
from workloads.task_sets import check_workload

schemas.register()  # the YAML files' schemas, before Hydra composes (spectune/config.py)


def checked_task(cfg: DictConfig, run_dir: Path) -> int:
    """``run_task`` once the workload's task selection and the proposer's settings are valid: an unknown task or
    language, a task with no prompt in its token band, or a proposer setting out of range is one error line before
    any model loads."""
    if cfg.get("workload"):
        check_workload(cfg.workload)
    proposers.check(cfg.get("proposer"))
    return run_task(cfg, run_dir)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    return cli.run_job(checked_task, cfg, resumable=True)


if __name__ == "__main__":
    cli.hydra_entry(main, "config", resumable=True)
