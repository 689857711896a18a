"""``task=train``: the PPO γ policy (and, at ``train.concurrency`` > 1, the verification-size policy) trained in replay,
into the run directory. The stages and what each writes are :mod:`policies.train.pipeline`'s; the keys are
conf/task/train.yaml's (``python -m policies.train`` is an alias of this task)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from policies.train.pipeline import train_policies


def run(cfg: DictConfig, run_dir: Path) -> int:
    return train_policies(cfg, run_dir)
