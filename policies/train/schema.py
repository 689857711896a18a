"""The schema of conf/train.yaml: the types of its own keys (``seed``, ``sampler``, the ``train`` node with its
``ppo`` settings), as spectune/config.py describes. Stored as an open root (the file is the primary config: the
models, hardware and workload groups add their keys beside these). ``python -m policies.train`` registers it at
import, before Hydra composes; values and ranges stay in the YAML file and in :mod:`policies.train.pipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from spectune import config
from spectune.engine import proposers


@dataclass
class PpoConfig:
    n_steps: int = MISSING
    batch_size: int = MISSING
    n_epochs: int = MISSING
    gamma: float = MISSING
    learning_rate: float = MISSING
    warmup: float = MISSING
    net_arch: list[int] = MISSING


@dataclass
class TrainConfig:
    """``train``: in conf/train.yaml's order."""

    traces: str | None = MISSING
    profile: str | None = MISSING
    allow_profile_mismatch: bool = MISSING
    calibrate_to: str | None = MISSING
    calibrate_per_gamma: bool = MISSING
    train_prompts: int = MISSING
    heldout_prompts: int = MISSING
    validation: float = MISSING
    max_gamma: int = MISSING
    concurrency: int = MISSING
    profile_repeats: int = MISSING
    reward: str = MISSING
    outcome: str = MISSING
    profile_jitter: float = MISSING
    features: list[str] | None = MISSING
    timesteps: int = MISSING
    eval_every: int = MISSING
    rounds: int = MISSING
    size_timesteps: int = MISSING
    cycle_timesteps: int = MISSING
    live_steps: int = MISSING
    live_time: str = MISSING
    ppo: PpoConfig = field(default_factory=PpoConfig)


@dataclass
class TrainFile:
    """conf/train.yaml's own keys."""

    seed: int = MISSING
    sampler: str = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)


def register() -> None:
    """Store /schema/train (and the library's and the proposers' schemas), where conf/train.yaml names it."""
    config.register()
    proposers.register_schemas()
    config.store("train", TrainFile, root=True)
