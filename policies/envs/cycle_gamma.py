"""``spectune/CycleGamma-v0``: the draft length chosen once per cycle, before drafting.

The comparison piece for ``spectune/DraftGamma-v0``: there the agent decides after every draft step (a host
sync per step in the engine), here it picks the whole cycle's γ = d up front from what is known before
drafting, so the difference between the two policies is what per-step stopping buys.

One episode is one recorded cycle of one row (replay only). Action: Discrete(max_gamma + 1), the γ = d to
draft (0 = a plain target step, one token). Observation: :data:`~policies.envs.observation.CYCLE_FIELDS`
(context, batch, recent acceptance, the profile's c and g(1)), built by
:data:`~policies.envs.observation.CYCLE`, the builder :class:`policies.ppo_cycle.PPOCycle` calls in the engine.

Reward and costs are :class:`~policies.envs.gamma.DraftGammaEnv`'s, inherited rather than copied: the same
profile sampling (list, jitter), the same running rate ρ and ``tokens − ρ·time`` (or ``"ratio"``), the same 1/b
share of a batch-b cycle, the same outcomes (``"realised"``: min(leading accepted, d) + 1 tokens; ``"expected"``).
A fixed action d therefore scores, entry by entry, what :func:`policies.envs.replay.replay_scores` gives fixed γ = d;
on a model-free draft's traces a row whose recorded chain ends before d is charged that depth, as the engine
verifies no further.
``reset(options={"entry": i})`` replays recorded entry i.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from policies.envs.gamma import DraftGammaEnv
from policies.envs.observation import CYCLE, CYCLE_FIELDS, OBS_HIGH
from spectune.errors import SpectuneError


class CycleGammaEnv(DraftGammaEnv):
    """Pick the cycle's γ, one row at a time (see the module docstring). Arguments as
    :class:`~policies.envs.gamma.DraftGammaEnv`'s replay backend."""

    def __init__(self, backend: str = "replay", traces: Any = None, profile: Any = None, max_gamma: int | None = None,
                 reward: str = "throughput", outcome: str = "realised", profile_jitter: float = 0.0,
                 allow_profile_mismatch: bool = False) -> None:
        if backend != "replay":  # a live cycle-level environment would need the session to draft d at once
            raise SpectuneError(f"backend={backend!r} is not supported by spectune/CycleGamma-v0: only replay")
        super().__init__(backend, traces, profile, max_gamma, reward, outcome, profile_jitter,
                         allow_profile_mismatch)
        self.action_space = gym.spaces.Discrete(self.max_gamma + 1)
        self.observation_space = gym.spaces.Box(0.0, OBS_HIGH, shape=(len(CYCLE_FIELDS),), dtype=np.float32)
        self._obs = np.zeros(len(CYCLE_FIELDS), dtype=np.float32)

    def _start(self, batch: int, context: float, recent: float) -> None:
        """A new episode: the profile of this episode and the row's observation before drafting."""
        self._index, self._costs = self.profiles.sample(self.np_random, batch)
        self._batch, self._gamma = batch, 0
        self._obs[:] = CYCLE.from_trace(0, batch, self._costs, context, recent)

    def step(self, action):
        gamma = int(action)
        if not 0 <= gamma <= self.max_gamma:
            raise SpectuneError(f"action={action!r} is out of range: a γ in 0..{self.max_gamma}")
        self._gamma = gamma
        tokens, time_s = self._recorded(gamma)  # no deeper than the row's recorded chain
        reward = self._reward(tokens, time_s)
        return self._obs.copy(), float(reward), True, False, {"gamma": gamma, "tokens": tokens, "time_s": time_s,
                                                              "synthetic": self.synthetic}
