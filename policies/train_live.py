"""Live fine-tuning of the depth policy (``train.live_steps``): after replay, PPO goes on on the real engine.

The environment is ``spectune/DraftDepth-v0`` with ``backend="live"``: the engine's session over the training split
at ``train.concurrency``, rewards from real synchronised time (the replay's approximation, that the next cycle's
context comes from the recording, is gone). The observation and action spaces are the replay's, so the same model
goes on learning (``reset_num_timesteps=False``: the learning-rate schedule continues from where it was).
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, open_dict

log = logging.getLogger("policies.train")


def live_finetune(model: Any, cfg: DictConfig, settings: Any, profile: Any) -> None:
    """``settings.live_steps`` PPO steps of ``model`` on the live depth environment of this setup."""
    from harness.tasks.trace import build_setup, workload_requests
    from policies.envs.depth import DraftDepthEnv
    from policies.train import split_requests

    live_cfg = cfg.copy()
    with open_dict(live_cfg):
        live_cfg.workload.num_prompts = settings.train_prompts + settings.heldout_prompts
    setup = build_setup(live_cfg, "train")
    train, _ = split_requests(workload_requests(setup.workload), settings.train_prompts, settings.heldout_prompts)
    env = DraftDepthEnv("live", profile=profile, max_depth=settings.max_depth, reward=settings.reward,
                        allow_profile_mismatch=settings.allow_profile_mismatch, engine=setup.engine, requests=train,
                        concurrency=settings.concurrency, live_time=settings.live_time)
    env.reset(seed=int(cfg.seed))
    model.set_env(env)
    log.info("live fine-tuning: %d steps on %d training prompts at concurrency %d", settings.live_steps, len(train),
             settings.concurrency)
    model.learn(settings.live_steps, progress_bar=True, tb_log_name="depth-live", reset_num_timesteps=False)
