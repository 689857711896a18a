"""`python -m policies.evaluate +workload=it`: an alias of ``python -m harness task=evaluate +workload=it``, the front
door (the same keys, conf/task/evaluate.yaml, and the same outputs; ``--help`` says so): every policy against the
best fixed γ, live, on held-out prompts (:mod:`policies.evaluate.pipeline`).

It composes conf/config.yaml with ``task=evaluate`` as ``python -m harness`` does, and runs the pipeline itself:
this layer is below ``harness`` and imports nothing of it.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from policies.evaluate import schema
from policies.evaluate.pipeline import run
from spectune.engine import proposers
from spectune.run import cli

schema.register()  # conf/task/evaluate.yaml's schemas and conf/config.yaml's, before Hydra composes


def checked_evaluation(cfg: DictConfig, run_dir: Path) -> int:
    """``run`` once the proposer's settings are valid: one error line before any model loads."""
    proposers.check(cfg.get("proposer"))
    return run(cfg, run_dir)


@hydra.main(config_path=str(cli.CONF), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    return cli.run_job(checked_evaluation, cfg)


if __name__ == "__main__":
    cli.task_alias(main, "evaluate", "python -m policies.evaluate")
