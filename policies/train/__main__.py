"""`python -m policies.train +workload=it`: train the PPO γ policy (and, at concurrency > 1, the
verification-size policy) in replay, into the Hydra run directory.

The stages (traces → profile → γ policy → size rounds → live fine-tuning) and what each writes are
:mod:`policies.train.pipeline`'s; this module is their command line (``conf/train.yaml``).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from policies.train import schema
from policies.train.pipeline import train_policies
from spectune import cli
from spectune.engine import proposers

schema.register()  # conf/train.yaml's schemas, before Hydra composes (spectune/config.py)


def checked_training(cfg: DictConfig, run_dir: Path) -> int:
    """``train_policies`` once the proposer's settings are valid: one error line before any model loads."""
    proposers.check(cfg.get("proposer"))
    return train_policies(cfg, run_dir)


@hydra.main(config_path="../../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> int:
    return cli.run_job(checked_training, cfg)


if __name__ == "__main__":
    cli.hydra_entry(main, "train")
