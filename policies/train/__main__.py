"""`python -m policies.train +workload=it`: an alias of ``python -m harness task=train +workload=it``, the front door
(the same keys, conf/task/train.yaml, and the same outputs; ``--help`` says so). It trains the PPO γ policy (and, at
concurrency > 1, the verification-size policy) in replay, into the Hydra run directory: the stages and what each
writes are :mod:`policies.train.pipeline`'s.

It composes conf/config.yaml with ``task=train`` as ``python -m harness`` does, and runs the pipeline itself: this
layer is below ``harness`` and imports nothing of it.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from policies.train import schema
from policies.train.pipeline import train_policies
from spectune.engine import proposers
from spectune.run import cli

schema.register()  # conf/task/train.yaml's schemas and conf/config.yaml's, before Hydra composes


def checked_training(cfg: DictConfig, run_dir: Path) -> int:
    """``train_policies`` once the proposer's settings are valid: one error line before any model loads."""
    proposers.check(cfg.get("proposer"))
    return train_policies(cfg, run_dir)


@hydra.main(config_path=str(cli.CONF), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    return cli.run_job(checked_training, cfg)


if __name__ == "__main__":
    cli.task_alias(main, "train", "python -m policies.train")
