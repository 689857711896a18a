"""The verification-size policy of ``policies.train`` (LTD's size policy): replay training, the γ policy fixed.

At concurrency > 1, after the γ policy, PPO learns the budget of ``spectune/VerifySize-v0`` on the training
cycles, where each row is drafted to the γ that the γ policy chooses for it in replay (its deterministic
decision on that recorded (cycle, row), :func:`policies.train.ppo.policy_gammas`), not to one fixed γ: that is
:class:`GammaFixedSizeEnv`. As in the engine, a cycle in which some row drafts gives every row at least one draft
(the engine stops a row after its first draft at the earliest); a cycle where every row stops at step 0 drafts
nothing and is a plain target step (no decision to learn, but it is still scored).

The observation and the cut are :func:`policies.envs.observation.size_observation` and ``size_cut``, the
functions the engine-side :class:`policies.ppo_size.PPOSize` calls: one definition for training and use.

Scores (replay, realised outcomes, validation cycles): tokens/s of the policy's budgets against the full budget
(verify every draft: what the γ policy alone does) and against the best static budget level.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from policies.envs.data import TraceSet
from policies.envs.verify_size import VerifySizeEnv
from policies.train.ppo import EvalCallback, GammaTraining, policy_gammas, ppo_model, save_policy
from spectune.errors import SpectuneError
from spectune.run import rundir

log = logging.getLogger("policies.train")

LEVELS, OBS_TOKENS = 17, 64


def engine_gammas(traces: TraceSet, gammas: np.ndarray) -> np.ndarray:
    """Per-entry γ as the engine drafts them: in a cycle where some row drafts, every row drafts >= 1."""
    out = np.asarray(gammas, dtype=int).copy()
    for part in traces.cycle_slices:
        if out[part].max() > 0:
            out[part] = np.maximum(out[part], 1)
    return out


class GammaFixedSizeEnv(VerifySizeEnv):
    """``spectune/VerifySize-v0`` (replay) with per-row drafted γ ``gammas`` (one per trace entry) instead of
    one ``draft_gamma``: the budget is a fraction of the drafts Σ d_r, draft time is the deepest row's steps,
    verification is padded to the longest kept prefix + 1. Its parent's ``reset``, ``cut`` and ``step`` read them
    through :meth:`drafted`; ``reset(options={"cycle": i})`` replays cycle i."""

    def __init__(self, traces: TraceSet, profile: Any, gammas: np.ndarray, levels: int = LEVELS,
                 obs_tokens: int = OBS_TOKENS, profile_jitter: float = 0.0,
                 allow_profile_mismatch: bool = False) -> None:
        super().__init__("replay", traces, profile, None, levels, obs_tokens, profile_jitter, allow_profile_mismatch)
        self.row_gammas = engine_gammas(self.traces, gammas)

    def drafted(self, rows: slice) -> np.ndarray:
        return self.row_gammas[rows]


def size_scores(model: Any, env: GammaFixedSizeEnv) -> dict[str, Any]:
    """Replay tokens/s over every cycle of ``env`` (no jitter): the deterministic policy's budgets, the full budget
    (every draft verified), and every static budget level."""
    cycles = len(env.traces.cycle_slices)
    totals = np.zeros((env.levels, 2))  # per static level: tokens, seconds
    policy = np.zeros(2)
    fractions = []
    for cycle in range(cycles):
        obs, _ = env.reset(options={"cycle": cycle})
        action = int(model.predict(obs, deterministic=True)[0]) if model is not None else env.levels - 1
        fractions.append(action / (env.levels - 1))
        for level in range(env.levels):
            env.reset(options={"cycle": cycle})
            _, _, _, _, info = env.step(level)
            totals[level] += (info["tokens"], info["time_s"])
            if level == action:
                policy += (info["tokens"], info["time_s"])
    rates = totals[:, 0] / totals[:, 1]
    best = int(np.argmax(rates))
    full = float(rates[-1])
    rate = float(policy[0] / policy[1])
    return {"policy_tok_s": rate, "full_budget_tok_s": full, "vs_full_budget_pct": 100 * (rate / full - 1),
            "best_level": best, "best_level_tok_s": float(rates[best]), "mean_budget": float(np.mean(fractions)),
            "cycles": cycles}


def train_size(model: Any, env: GammaFixedSizeEnv, val_env: GammaFixedSizeEnv, timesteps: int, eval_every: int,
               round_index: int, curves: list[dict[str, Any]]) -> dict[str, Any]:
    """Train (or go on training) the size PPO ``model`` on ``env`` (the model's own; its ``row_gammas`` set for
    this round); curve rows (``policy="size"``) into ``curves``; returns the final validation scores."""
    evaluate = functools.partial(evaluate_size, model, val_env, round_index, curves)
    if round_index == 1:
        evaluate(0)
    callback = EvalCallback(eval_every, evaluate, prefix="replay_size")
    model.learn(timesteps, callback=callback, progress_bar=False, tb_log_name="size",
                reset_num_timesteps=round_index == 1)
    last = curves[-1]
    if last["timesteps"] != model.num_timesteps or last.get("policy") != "size":
        return evaluate(model.num_timesteps)
    return {k: v for k, v in last.items() if k not in ("policy", "round", "timesteps")}  # the last evaluation


def evaluate_size(model: Any, val_env: GammaFixedSizeEnv, round_index: int, curves: list[dict[str, Any]],
                  step: int) -> dict[str, Any]:
    """The size policy's replay scores on the validation cycles, appended to the curves."""
    scores = size_scores(model, val_env)
    curves.append({"policy": "size", "round": round_index, "timesteps": step, **scores})
    log.info("size round %d step %6d: replay %.1f tok/s, full budget %.1f tok/s (%+.2f%%), best static level "
             "%d/%d %.1f tok/s, mean budget %.2f", round_index, step, scores["policy_tok_s"],
             scores["full_budget_tok_s"], scores["vs_full_budget_pct"], scores["best_level"], val_env.levels - 1,
             scores["best_level_tok_s"], scores["mean_budget"])
    return scores


def size_extra(profile: Any, max_gamma: int, final: dict[str, Any]) -> dict[str, Any]:
    """``spectune.json`` of ``size.zip``: what :class:`policies.ppo_size.PPOSize` validates and needs."""
    return {"kind": "verify-size", "levels": LEVELS, "obs_tokens": OBS_TOKENS,
            "observation": [f"cum_prob[{i}] (drafted tokens' cumulative draft probability, decreasing, 0-padded)"
                            for i in range(OBS_TOKENS)] + ["batch_size/32", "c(B)", "g(D, B)"],
            "actions": [f"budget {a}/{LEVELS - 1} of the drafted tokens" for a in range(LEVELS)],
            "profile": profile.to_json(), "max_gamma": max_gamma, "validation": final}


def size_rounds(settings: Any, seed: int, run_dir: Path, profile: Any, frame: pd.DataFrame, trace_meta: dict,
                training: GammaTraining) -> dict[str, Any]:
    """Size policy with the γ policy fixed, then ``rounds`` − 1 more γ/size rounds; writes size.zip.

    A budget is per batch, and the γ policy's split by prompt cuts batches, so the size policy validates on a
    seeded random ``train.validation`` fraction of whole recorded cycles and trains on the others. The γ
    decisions are the deterministic γ policy's on each recorded entry, at the profile's own costs. Rounds 2..
    train the γ policy again (``training.train``), then the size policy on its new decisions."""
    from policies.envs.gamma import DraftGammaEnv

    gamma_model, curves = training.model, training.curves
    cycles = np.unique(frame["cycle"])
    held = cycles[np.random.default_rng(seed).random(len(cycles)) < settings.validation]
    in_val = frame["cycle"].isin(set(held.tolist()))
    fit = TraceSet(frame[~in_val], trace_meta, "size training cycles")
    val = TraceSet(frame[in_val], trace_meta, "size validation cycles (raise train.validation)")
    gamma_env, gamma_val_env = (DraftGammaEnv("replay", t, profile, settings.max_gamma, settings.reward, "realised",
                                              0.0, settings.allow_profile_mismatch, features=settings.features)
                                 for t in (fit, val))

    if settings.size_timesteps < 1:
        raise SpectuneError(f"train.size_timesteps={settings.size_timesteps} is invalid: train.concurrency="
                            f"{settings.concurrency} > 1 trains the size policy, which needs >= 1 step")
    size_env = GammaFixedSizeEnv(fit, profile, policy_gammas(gamma_model, gamma_env, fit.count),
                                 profile_jitter=settings.profile_jitter,
                                 allow_profile_mismatch=settings.allow_profile_mismatch)
    size_val = GammaFixedSizeEnv(val, profile, policy_gammas(gamma_model, gamma_val_env, val.count),
                                 allow_profile_mismatch=settings.allow_profile_mismatch)
    size_env.reset(seed=seed + 1)
    model = ppo_model(settings.ppo, size_env, seed + 1, run_dir)
    final = train_size(model, size_env, size_val, settings.size_timesteps, settings.eval_every, 1, curves)
    for index in range(2, settings.rounds + 1):
        log.info("round %d of %d: γ policy, then the size policy on its new decisions", index, settings.rounds)
        training.train(settings.timesteps, settings.eval_every, index)
        size_env.row_gammas = engine_gammas(fit, policy_gammas(gamma_model, gamma_env, fit.count))
        size_val.row_gammas = engine_gammas(val, policy_gammas(gamma_model, gamma_val_env, val.count))
        final = train_size(model, size_env, size_val, settings.size_timesteps, settings.eval_every, index, curves)
    save_policy(model, settings.ppo, rundir.SIZE_POLICY.path(run_dir), size_extra(profile, settings.max_gamma, final))
    return final
