"""Gymnasium environments for draft-length policies, registered explicitly (:func:`register_envs`, :func:`make_env`).

- ``spectune/DraftGamma-v0``: after each draft step, stop (verify now) or draft one more; at step 0, stop
  means "don't speculate this cycle". One episode is one cycle of one row (``gamma.py``).
- ``spectune/VerifySize-v0``: after drafting, how many of the batch's drafted tokens go to the target,
  taken across rows by cumulative draft probability (``verify_size.py``).
- ``spectune/CycleGamma-v0``: the cycle's γ chosen once, before drafting, from what is known then
  (``cycle_gamma.py``; replay only): the per-step γ environment's comparison piece.

``backend="replay"`` replays ``task=trace`` traces with the costs of a hardware profile (fast, for training);
``backend="live"`` drives the engine's session on real models with real synchronised time (slow; to
fine-tune and to validate the replay). The observation layout is defined once, in ``observation.py``.
"""

from __future__ import annotations

from typing import Any

from spectune.errors import SpectuneError

ENV_IDS: dict[str, str] = {
    "spectune/DraftGamma-v0": "policies.envs.gamma:DraftGammaEnv",
    "spectune/VerifySize-v0": "policies.envs.verify_size:VerifySizeEnv",
    "spectune/CycleGamma-v0": "policies.envs.cycle_gamma:CycleGammaEnv",
}


def register_envs() -> None:
    """Register the environments with gymnasium (a no-op without gymnasium, which the engine does not need)."""
    try:
        import gymnasium
    except ImportError:
        return
    for env_id, entry_point in ENV_IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point)


def make_env(env_id: str, **kwargs: Any):
    """``gymnasium.make`` with a one-line error naming the allowed ids for an unknown one."""
    import gymnasium

    if env_id not in ENV_IDS:
        raise SpectuneError(f"env={env_id!r} is unknown: choose one of {', '.join(ENV_IDS)}")
    register_envs()
    return gymnasium.make(env_id, **kwargs)
