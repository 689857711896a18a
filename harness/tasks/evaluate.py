"""``task=evaluate``: every draft-length policy against the best fixed γ, live, on held-out prompts. The steps and what
each writes are :mod:`policies.evaluate.pipeline`'s; the keys are conf/task/evaluate.yaml's (``python -m
policies.evaluate`` is an alias of this task)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from policies.evaluate.pipeline import run as evaluate_policies


def run(cfg: DictConfig, run_dir: Path) -> int:
    return evaluate_policies(cfg, run_dir)
