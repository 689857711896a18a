"""``spectune/VerifySize-v0``: the verification budget of a batch (LTD's size policy, for a forest of chains).

One episode is one recorded batched cycle, drafted to ``draft_gamma`` on every row, and one decision
(a contextual bandit, as LTD's size environment): how many of the batch's B·D drafted tokens go to the
target. Action a ∈ 0..levels−1 means a budget of round(a / (levels−1) · B·D) tokens, taken across rows in
order of cumulative draft probability; since that probability never grows along a chain, each row keeps a
prefix of its chain (the cut depends on the draft alone, so exactness is untouched). Verification is
padded: it costs what the profile says for the longest kept prefix + 1 positions at batch B.

``backend="live"`` drafts ``draft_gamma`` tokens on every row of the engine's session, cuts each row's
chain to the same budget rule (``Session.cut``) and verifies for real; time is the cycle's synchronised time
(``live_time="profile"``: the profile's cost of that shape, deterministic).

Observation: the batch's cumulative draft probabilities in decreasing order (``obs_tokens`` of them, zero
padded), then batch size / 32, c(B), g(D, B). Reward: tokens − ρ·time for the whole batch (ρ: running
tokens/s), where time = D draft steps + padded verification + overhead.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from policies.envs.data import attach_source, check_backend
from policies.envs.observation import OBS_HIGH, size_cut, size_observation
from policies.envs.rate import RunningRate
from spectune.errors import SpectuneError


class VerifySizeEnv(gym.Env):
    """Choose the batch's verification budget (see the module docstring).

    Args:
        backend: ``"replay"`` or ``"live"``.
        traces, profile, profile_jitter, allow_profile_mismatch: as for ``spectune/DraftGamma-v0``.
        engine, requests, concurrency, live_time: the live backend's engine, requests, batch and time source.
        draft_gamma: drafts per row before the decision (default: the traces' max_gamma).
        levels: number of budget levels (actions), 0 .. B·D tokens.
        obs_tokens: how many of the sorted cumulative probabilities the observation carries.
    """

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, backend: str = "replay", traces: Any = None, profile: Any = None, draft_gamma: int | None = None,
                 levels: int = 17, obs_tokens: int = 64, profile_jitter: float = 0.0,
                 allow_profile_mismatch: bool = False, engine: Any = None, requests: list | None = None,
                 concurrency: int = 4, live_time: str = "measured") -> None:
        self.backend = check_backend(backend)
        limit, ceiling = attach_source(self, backend, traces, profile, profile_jitter, allow_profile_mismatch,
                                       engine, requests, concurrency, live_time)
        gamma = limit if draft_gamma is None else int(draft_gamma)
        if not 1 <= gamma <= ceiling:
            raise SpectuneError(f"draft_gamma={draft_gamma!r} is out of range: must be in 1..{ceiling}")
        if levels < 2:
            raise SpectuneError(f"levels={levels!r} is out of range: must be >= 2")
        self.gamma, self.levels, self.obs_tokens = gamma, int(levels), int(obs_tokens)
        self.action_space = gym.spaces.Discrete(self.levels)
        self.observation_space = gym.spaces.Box(0.0, OBS_HIGH, shape=(self.obs_tokens + 3,), dtype=np.float32)
        self._rate = RunningRate()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """A new episode: a random recorded cycle (replay; ``options={"cycle": i}`` replays cycle i), or the live
        session's next cycle, drafted to each row's γ (:meth:`drafted`)."""
        super().reset(seed=seed)
        if seed is not None:
            self._rate.clear()
        if self.backend == "replay":
            t = self.traces
            cycle = (options or {}).get("cycle")
            index = int(cycle) if cycle is not None else int(self.np_random.integers(len(t.cycle_slices)))
            self._slice = t.cycle_slices[index]
            self._gammas = self.drafted(self._slice)
            self._deepest = int(self._gammas.max(initial=0))
            cum = t.signals[self._slice, : self._deepest, 3]  # [B, D] cumulative draft probabilities
        else:
            cum = self._live_draft(seed is not None)
            self._gammas, self._deepest = np.full(cum.shape[0], self.gamma), self.gamma
        self._batch = cum.shape[0]
        self._index, self._costs = self.profiles.sample(self.np_random, self._batch)
        self._obs, self._order = size_observation(cum, self._gammas, self._batch, self._costs.c,
                                                  self._costs.g(self._deepest), self.obs_tokens)
        return self._obs.copy(), {}

    def drafted(self, rows: slice) -> np.ndarray:
        """The γ each row of the recorded cycle at ``rows`` drafts before the decision: ``draft_gamma`` on every
        row here; a subclass drafts each row to its own (policies.train.size.GammaFixedSizeEnv)."""
        return np.full(rows.stop - rows.start, self.gamma)

    def cut(self, action: int) -> np.ndarray:
        """Per-row kept prefix lengths for ``action``."""
        return size_cut(self._order, action, self.levels, self._gammas, self._deepest)

    def step(self, action):
        kept = self.cut(action)
        time_s = self._costs.cycle_s(self._deepest, int(kept.max(initial=0)))
        info = {}
        if self.backend == "replay":
            leading = self.traces.leading[self._slice]
            tokens = float(np.minimum(kept, leading).sum() + self._batch)
        else:
            full = [0] * self.concurrency
            for i, row in enumerate(self._rows):
                full[row] = int(kept[i])
            self._session.cut(full)
            outcome = self._session.verify(self.gamma)
            tokens = float(sum(outcome.emitted.values()))
            if self.live_time == "measured":
                time_s = outcome.cycle_s
                info = {"measured_s": outcome.cycle_s}
        key = (self._index, self._batch)
        reward = self._rate.charge(key, self._batch, self._costs.ar_s, tokens, time_s)  # prior: AR
        return self._obs.copy(), float(reward), True, False, {"kept": kept.tolist(), "tokens": tokens,
                                                              "time_s": time_s, "synthetic": self.synthetic, **info}

    def _live_draft(self, restart: bool) -> np.ndarray:
        """Open the next cycle of the live session and draft ``gamma`` tokens on every row; [B, D] cum_prob."""
        if self._session is not None and self._session.cycle is not None:
            self._session.verify()  # an abandoned episode: finish its cycle
        if restart or self._session is None:
            self._session = self.engine.session(self.requests, None, self.concurrency)
        while True:
            if self._session.done:
                self._session = self.engine.session(self.requests, None, self.concurrency)
            if self._session.begin_cycle():
                break
        self._rows = self._session.cycle.rows
        steps = [self._session.draft_step(frozenset({"cum_prob"}))["cum_prob"] for _ in range(self.gamma)]
        return torch.stack(steps, 1)[self._rows].double().numpy()
