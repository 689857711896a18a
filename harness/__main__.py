"""`python -m harness`: the Hydra application, the front door of every task. Composes conf/config.yaml and runs
``task`` (bench by default; ``task=train`` and ``task=evaluate`` too, which ``python -m policies.train`` and
``python -m policies.evaluate`` alias). :func:`entry` is the console script ``spectune`` (pyproject.toml).

Bad input, logging and signals are the front door's (:mod:`spectune.run.cli`); a rerun with ``resume=true`` finishes
an interrupted run of a task that resumes (:func:`harness.tasks.resumes`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from harness.tasks import resumes, run_task, schemas
from spectune.engine import proposers
from spectune.run import cli
from workloads.categories import check_workload

schemas.register()  # the YAML files' schemas, before Hydra composes (spectune/config.py)


def checked_task(cfg: DictConfig, run_dir: Path) -> int:
    """``run_task`` once the workload's task selection and the proposer's settings are valid: an unknown task or
    language, a task with no prompt in its token band, or a proposer setting out of range is one error line before
    any model loads."""
    if cfg.get("workload"):
        check_workload(cfg.workload)
    proposers.check(cfg.get("proposer"))
    return run_task(cfg, run_dir)


# conf/ by its absolute path: Hydra would look for a package "conf" when this module is not __main__ (the console
# script imports it)
@hydra.main(config_path=str(cli.CONF), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    return cli.run_job(checked_task, cfg, resumable=resumes(str(cfg.task.name)))


def chosen_tasks(argv: list[str]) -> list[str]:
    """The tasks a command line runs (``task=a,b`` sweeps two); none named: the default."""
    values = [arg.partition("=")[2] for arg in argv if arg.startswith("task=")]
    text = values[-1] if values else ""
    text = text[len("choice("):-1] if text.startswith("choice(") else text
    return [name.strip() for name in text.split(",") if name.strip()]


def entry() -> None:
    """``spectune OVERRIDES`` (the console script) and ``python -m harness OVERRIDES``: the command line checked, then
    the job; SIGTERM/SIGINT stop a task that resumes cleanly, between and inside jobs."""
    cli.hydra_entry(main, "config", resumable=all(resumes(name) for name in chosen_tasks(sys.argv[1:])))


if __name__ == "__main__":
    entry()
