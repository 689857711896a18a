"""`python -m harness`: the Hydra application. Composes conf/config.yaml and runs ``task``.

Bad input, logging and signals are the front door's (:mod:`harness.cli`); a rerun with ``resume=true`` finishes
an interrupted run.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from harness import cli
from harness.tasks import run_task


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    return cli.run_job(run_task, cfg, resumable=True)


if __name__ == "__main__":
    cli.hydra_entry(main, "config", resumable=True)
