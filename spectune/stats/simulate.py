"""Simulated benchmarks with a known truth, for checking that intervals keep their promise.

A run times two methods, A and B, on ``prompts`` prompts, ``repeats`` times, on one simulated machine. What
real runs show, each switchable:

- prompts differ (length and difficulty: ``prompt_sd``), and the speedup differs by prompt (``interaction_sd``:
  acceptance varies by prompt), centred so that the pooled speedup over the prompt population is ``speedup``;
- repeats of a prompt are nearly identical work (``repeat_sd``, small);
- the machine drifts: an AR(1) process over execution order (``drift_phi``, ``drift_sd``) and episodes that shift
  its speed for ``episode`` consecutive requests (``episode_sd``);
- a method × repeat shift (``method_repeat_sd``: one label's buffers placed badly for a whole repeat, shared by
  every prompt of that repeat);
- a process shift common to both methods (``process_sd``: cancels in a paired ratio), and a method × process
  shift (``method_process_sd``: a method faster in this process than in another, invisible from inside one).

The design decides which of these an interval sees: "interleaved" runs A and B on each prompt back to back
(the order alternating, as a Williams design does for two methods); "blocked" runs all prompts with one method,
then all with the other. Everything is vectorised over ``runs`` simulated runs and seeded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from spectune.stats.intervals import Interval, paired_ratio_interval


@dataclass(frozen=True)
class Scenario:
    """The generating process (log-scale standard deviations; 0.01 ≈ 1%)."""

    prompts: int = 16
    repeats: int = 3
    speedup: float = 1.0
    prompt_sd: float = 0.3
    interaction_sd: float = 0.0
    repeat_sd: float = 0.005
    drift_phi: float = 0.98
    drift_sd: float = 0.01
    episode: int = 20
    episode_sd: float = 0.03
    method_repeat_sd: float = 0.0
    process_sd: float = 0.1
    method_process_sd: float = 0.0
    design: str = "interleaved"


@dataclass
class SimulatedRuns:
    """Per run, method, repeat and prompt: tokens and seconds (arrays shaped (runs, repeats, prompts))."""

    tokens: np.ndarray
    seconds_a: np.ndarray
    seconds_b: np.ndarray
    truth: float  # the pooled speedup of B over A over the prompt population


def _order(s: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """Execution position of each (repeat, prompt) request of A and of B under the design."""
    r, u = np.meshgrid(np.arange(s.repeats), np.arange(s.prompts), indexing="ij")
    if s.design == "interleaved":
        block = r * s.prompts + u
        a_first = (block % 2) == 0
        return 2 * block + np.where(a_first, 0, 1), 2 * block + np.where(a_first, 1, 0)
    if s.design == "blocked":
        a_first = (r % 2) == 0  # the methods' order rotates per repeat
        base = r * 2 * s.prompts + u
        return base + np.where(a_first, 0, s.prompts), base + np.where(a_first, s.prompts, 0)
    raise ValueError(f"design={s.design!r}: must be interleaved or blocked")


def _machine(s: Scenario, runs: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """log speed factor of the machine at each execution position: stationary AR(1) drift + episode shifts."""
    drift = np.empty((runs, length))
    scale = s.drift_sd / np.sqrt(max(1e-12, 1 - s.drift_phi ** 2))
    drift[:, 0] = rng.normal(0, scale, runs)
    shocks = rng.normal(0, s.drift_sd, (runs, length))
    for t in range(1, length):
        drift[:, t] = s.drift_phi * drift[:, t - 1] + shocks[:, t]
    episodes = rng.normal(0, s.episode_sd, (runs, length // max(1, s.episode) + 2))
    offset = rng.integers(0, max(1, s.episode), runs)[:, None]
    index = (np.arange(length)[None, :] + offset) // max(1, s.episode)
    return drift + np.take_along_axis(episodes, index, axis=1)


def simulate(s: Scenario, runs: int, seed: int) -> SimulatedRuns:
    """``runs`` independent simulated runs of scenario ``s`` (new prompts, machine and process each time)."""
    rng = np.random.default_rng(seed)
    shape = (runs, s.repeats, s.prompts)
    tokens = np.broadcast_to(rng.integers(24, 257, (runs, 1, s.prompts)).astype(float), shape)
    per_token = rng.lognormal(0, s.prompt_sd, (runs, 1, s.prompts))
    # B's per-prompt speedup, centred so that E[time_b] / E[time_a] over prompts is exactly 1 / speedup
    inter = rng.normal(0, s.interaction_sd, (runs, 1, s.prompts)) - s.interaction_sd ** 2 / 2
    order_a, order_b = _order(s)
    machine = _machine(s, runs, 2 * s.repeats * s.prompts, rng)
    process = rng.normal(0, s.process_sd, (runs, 1, 1))
    method_process = rng.normal(0, s.method_process_sd, (runs, 1, 1))
    method_repeat = rng.normal(0, s.method_repeat_sd, (runs, s.repeats, 1))
    base = tokens * per_token * np.exp(process)
    seconds_a = base * np.exp(machine[:, order_a] + rng.normal(0, s.repeat_sd, shape))
    seconds_b = (base / s.speedup * np.exp(inter + method_process + method_repeat) *
                 np.exp(machine[:, order_b] + rng.normal(0, s.repeat_sd, shape)))
    return SimulatedRuns(tokens, seconds_a, seconds_b, s.speedup)


def coverage(runs: SimulatedRuns, unit: str = "prompt", interval: Callable[..., Interval] | None = None
             ) -> tuple[float, float]:
    """Share of runs whose interval of B's speedup over A contains the truth, and the intervals' median width.
    ``unit`` "prompt": the product's interval (prompts as units, each with its repeats, plus the method × repeat
    component); "prompt-sums": prompts as units, the repeats only summed (no repeat component); "repeat-prompt":
    every (repeat, prompt) cell as independent (the old unit). ``interval`` is the product's paired t-interval
    unless another function of the same signature is given (the bootstrap, for comparison)."""
    interval = interval or paired_ratio_interval
    hits, widths = [], []
    for tokens, a, b in zip(runs.tokens, runs.seconds_a, runs.seconds_b, strict=True):
        if unit == "prompt":
            tokens, a, b = tokens.T, a.T, b.T  # (prompts × repeats)
        elif unit == "prompt-sums":
            tokens, a, b = tokens.sum(axis=0), a.sum(axis=0), b.sum(axis=0)
        elif unit == "repeat-prompt":
            tokens, a, b = tokens.ravel(), a.ravel(), b.ravel()
        else:
            raise ValueError(f"unit={unit!r}: must be prompt, prompt-sums or repeat-prompt")
        iv = interval(tokens, b, tokens, a)
        hits.append(iv.contains(runs.truth))
        widths.append(iv.hi - iv.lo)
    return float(np.mean(hits)), float(np.median(widths))
