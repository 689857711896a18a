"""Live fine-tuning of the γ policy (``train.live_steps``): after replay, PPO goes on on the real engine.

The environment is ``spectune/DraftGamma-v0`` with ``backend="live"``: the engine's session over the training split
at ``train.concurrency``, rewards from real synchronised time (the replay's approximation, that the next cycle's
context comes from the recording, is gone), or with ``train.live_time=profile`` from the profile's cost of each
cycle (deterministic). The observation and action spaces are the replay's, so the same model
goes on learning (``reset_num_timesteps=False``: the learning-rate schedule continues from where it was).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("policies.train")


def live_finetune(model: Any, engine: Any, requests: list, settings: Any, profile: Any, seed: int) -> None:
    """``settings.live_steps`` PPO steps of ``model`` on the live γ environment over ``requests`` (the training
    split) at ``settings.concurrency``; rewards from ``settings.live_time`` (measured, or the profile's costs)."""
    from policies.envs.gamma import DraftGammaEnv

    env = DraftGammaEnv("live", profile=profile, max_gamma=settings.max_gamma, reward=settings.reward,
                        allow_profile_mismatch=settings.allow_profile_mismatch, engine=engine, requests=requests,
                        concurrency=settings.concurrency, live_time=settings.live_time,
                        features=settings.features)
    env.reset(seed=seed)
    model.set_env(env)
    log.info("live fine-tuning: %d steps on %d training prompts at concurrency %d", settings.live_steps, len(requests),
             settings.concurrency)
    model.learn(settings.live_steps, progress_bar=True, tb_log_name="gamma-live", reset_num_timesteps=False)
