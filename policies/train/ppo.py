"""What the training stages share: the PPO model and its file, the learning-rate schedule, the split of a
workload, the periodic evaluation callback, and :class:`GammaTraining` (the γ policy with its replay
validation). ``policies.train.pipeline`` runs the stages in order; the size rounds (``policies.train.size``) and live
fine-tuning (``policies.train.live``) use these pieces. The replay's accounting (costs, scores, the hindsight
oracle) is ``policies.envs.replay``'s.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from spectune.errors import SpectuneError

log = logging.getLogger(__name__)


class WarmupLinear:
    """Learning rate with a linear warm-up over the first ``warmup`` of training, then linear decay to 0 (LTD).
    SB3 calls it with the progress remaining (1 → 0)."""

    def __init__(self, lr: float, warmup: float) -> None:
        self.lr, self.warmup = float(lr), float(warmup)

    def __call__(self, progress_remaining: float) -> float:
        done = 1.0 - progress_remaining
        if done < self.warmup:
            return self.lr * max(done / self.warmup, 0.01)
        return self.lr * max(1.0 - (done - self.warmup) / (1.0 - self.warmup), 0.0)


def split_requests(requests: list, train: int, heldout: int) -> tuple[list, list]:
    """The first ``train`` requests (of the workload's seeded shuffle) and the next ``heldout``."""
    if len(requests) < train + heldout:
        raise SpectuneError(f"train.train_prompts={train} + train.heldout_prompts={heldout} is invalid: the workload "
                            f"has {len(requests)} prompts in its length band")
    return requests[:train], requests[train:train + heldout]


def policy_gammas(model: Any, env: Any, count: int) -> np.ndarray:
    """The deterministic policy's γ on each recorded entry (one episode per entry)."""
    gammas = np.zeros(count, dtype=int)
    for entry in range(count):
        obs, _ = env.reset(options={"entry": entry})
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, _, done, _, info = env.step(int(action))
        gammas[entry] = info["gamma"]
    return gammas


def ppo_model(ppo: dict[str, Any], env: Any, seed: int, run_dir: Path) -> Any:
    """SB3's PPO (MlpPolicy) with the ``train.ppo`` settings, a warm-up-then-linear learning rate, on the CPU."""
    from stable_baselines3 import PPO

    return PPO("MlpPolicy", env, n_steps=int(ppo["n_steps"]), batch_size=int(ppo["batch_size"]),
               n_epochs=int(ppo["n_epochs"]), gamma=float(ppo["gamma"]),
               learning_rate=WarmupLinear(float(ppo["learning_rate"]), float(ppo["warmup"])),
               policy_kwargs={"net_arch": list(ppo["net_arch"])}, seed=seed, device="cpu",
               tensorboard_log=str(run_dir / "tensorboard"), verbose=0)


def save_policy(model: Any, ppo: dict[str, Any], path: Path, extra: dict[str, Any]) -> None:
    """Save with a plain-number learning rate (no pickled schedule code in the file), then annotate."""
    from policies.sb3_files import annotate_policy_file

    model.learning_rate = float(ppo["learning_rate"])
    model._setup_lr_schedule()
    model.save(path)
    annotate_policy_file(path, extra)




class EvalCallback(BaseCallback):
    """Calls ``evaluate(num_timesteps)`` every ``steps`` environment steps: the replay curves of the γ and size
    policies. ``evaluate`` returns its scores; every number among them is also logged to TensorBoard under
    ``<prefix>/<name>``, so the curves sit beside SB3's own losses."""

    def __init__(self, steps: int, evaluate: Callable[[int], dict[str, Any]], prefix: str = "replay") -> None:
        super().__init__()
        self.steps, self.evaluate, self.prefix = int(steps), evaluate, prefix

    def _on_step(self) -> bool:
        if self.num_timesteps % self.steps < self.model.n_envs:
            scores = self.evaluate(self.num_timesteps)
            for name, value in scores.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self.logger.record(f"{self.prefix}/{name}", float(value))
        return True


class GammaTraining:
    """The γ policy being trained: its PPO model on ``spectune/DraftGamma-v0`` over the training cycles, and
    its replay score on the validation cycles (tokens/s beside the best fixed γ and the oracle).
    :class:`CycleTraining` is the same on ``spectune/CycleGamma-v0``.

    Args:
        fit, val: training and validation cycles.
        profile: the costs the replay charges.
        max_gamma, reward, outcome, profile_jitter, allow_profile_mismatch: the environment's (validation always
            scores realised outcomes, without jitter).
        ppo: the ``train.ppo`` settings.
        seed: seeds the environment and PPO.
        run_dir: TensorBoard logs go to ``run_dir/tensorboard``.
        curves: where every evaluation appends its row (``policy`` = :attr:`name`, the round, the step, the scores).
        features: the γ policy's observation (``train.features``; None: the default); the cycle policy has its own.
    """

    name = "gamma"  # the curves' policy column and TensorBoard's run name

    @staticmethod
    def make_env(*args: Any, **options: Any) -> Any:
        from policies.envs.gamma import DraftGammaEnv

        return DraftGammaEnv("replay", *args, **options)

    def __init__(self, fit: Any, val: Any, profile: Any, max_gamma: int, reward: str, outcome: str,
                 profile_jitter: float, allow_profile_mismatch: bool, ppo: dict[str, Any], seed: int, run_dir: Path,
                 curves: list[dict[str, Any]], features: tuple[str, ...] | None = None) -> None:
        self.val, self.profile, self.max_gamma, self.curves = val, profile, max_gamma, curves
        options = {"features": features} if features is not None else {}  # the γ environment's observation
        self.env = self.make_env(fit, profile, max_gamma, reward, outcome, profile_jitter, allow_profile_mismatch,
                                 **options)
        self.val_env = self.make_env(val, profile, max_gamma, reward, "realised", 0.0, allow_profile_mismatch,
                                     **options)
        self.env.reset(seed=seed)
        self.model = ppo_model(ppo, self.env, seed, run_dir)
        self.latest: dict[str, Any] = {}

    def evaluate(self, step: int, round_index: int | str) -> dict[str, Any]:
        """The deterministic policy's replay score on the validation cycles, appended to the curves."""
        from policies.envs.replay import replay_scores

        scores = replay_scores(self.val, self.profile, self.max_gamma,
                               policy_gammas(self.model, self.val_env, self.val.count))
        self.curves.append({"policy": self.name, "round": round_index, "timesteps": step,
                            **{k: v for k, v in scores.items() if k != "fixed_tok_s"}})
        self.latest = scores
        log.info("%s step %6d: replay %.1f tok/s, best fixed γ %d %.1f tok/s (%+.1f%%), oracle %.1f tok/s, "
                 "mean γ %.2f", self.name, step, scores["policy_tok_s"], scores["best_fixed_gamma"],
                 scores["best_fixed_tok_s"], scores["vs_best_fixed_pct"], scores["oracle_tok_s"],
                 scores["mean_gamma"])
        return scores

    def train(self, timesteps: int, eval_every: int, round_index: int) -> dict[str, Any]:
        """``timesteps`` PPO steps (round 1 starts the step count, later rounds go on), evaluated every
        ``eval_every`` steps and at the end; returns the last scores."""
        callback = EvalCallback(eval_every, functools.partial(self.evaluate, round_index=round_index))
        self.model.learn(timesteps, callback=callback, progress_bar=True, tb_log_name=self.name,
                         reset_num_timesteps=round_index == 1)
        last = self.curves[-1]
        if last["timesteps"] != self.model.num_timesteps or last["policy"] != self.name:
            return self.evaluate(self.model.num_timesteps, round_index)
        return self.latest


class CycleTraining(GammaTraining):
    """The cycle policy being trained: PPO on ``spectune/CycleGamma-v0`` (one step = one cycle's γ) with the
    same settings, traces and profile as the γ policy, scored alike (curves' ``policy="cycle"``)."""

    name = "cycle"

    @staticmethod
    def make_env(*args: Any) -> Any:
        from policies.envs.cycle_gamma import CycleGammaEnv

        return CycleGammaEnv("replay", *args)
