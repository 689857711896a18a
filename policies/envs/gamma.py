"""``spectune/DraftGamma-v0``: the draft-length decision after every draft step, as LTD's γ policy.

One episode is one draft-and-verify cycle of one row. Actions (Discrete(2)): 0 = stop and verify now,
1 = draft one more. At step 0 (nothing drafted) stop means "don't speculate this cycle": a plain target
step, one token. At ``max_gamma`` the cycle is verified whatever the action, and so it is where a model-free
draft's recorded chain ends (prompt lookup, suffix decoding: the live engine drafts no further there).
Observation: built by ``observation.py``'s :data:`~policies.envs.observation.GAMMA` from the recorded row (draft
signals, position, context, batch, recent acceptance, the profile's c and g; a model-free draft's match signals
when the features name them), the builder ``policy=ppo`` calls in the engine.

Reward, at verification only (0 after a draft step): ``tokens − ρ·time`` where ρ is the running tokens/s
of this environment over about its last 2000 cycles (per profile and batch size, started at the autoregressive
rate: a cycle earns reward when it beats the recent rate; ``rate.py`` says why recent). Summed over cycles
this ranks policies by throughput, which the mean of per-cycle ratios does not (it favours short cycles).
``reward="ratio"`` gives LTD's tokens per cycle time instead (time in units of the AR step), for comparison.

At batch b > 1 the agent is one row and the other rows act alike (one shared policy): the row is charged
its share, 1/b, of each batched draft step it takes and of the padded verification at its γ.

Backends. ``replay``: a recorded cycle (``task=trace``) scored at the chosen γ (exactly that cycle's
realised outcome, or ``outcome="expected"``: Σ_{i≤k} Π_{j≤i} a_j), time from a profile sampled per episode
(``profile`` may be a list; ``profile_jitter`` scales it at random). Across cycles the replay is an
approximation: the next cycle's context comes from the recording, not from the agent's stop.
``live``: the engine's session on real models, real synchronised time; the other rows follow the agent's
actions; ``reset(seed=...)`` restarts the requests from the beginning (deterministic observations).
``reset(options={"entry": i})`` (replay) replays recorded entry i (the i-th (cycle, row) in trace order).
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from policies.envs.data import attach_source, check_backend
from policies.envs.observation import GAMMA, OBS_HIGH
from policies.envs.rate import RunningRate
from spectune.engine.policy import MATCH_SIGNALS, SIGNALS, AcceptanceHistory
from spectune.errors import SpectuneError

REWARDS = ("throughput", "ratio")
OUTCOMES = ("realised", "expected")
STOP, DRAFT = 0, 1


class DraftGammaEnv(gym.Env):
    """Stop or draft one more, one row at a time (see the module docstring).

    Args:
        backend: ``"replay"`` or ``"live"``.
        traces: ``traces.parquet`` of ``task=trace`` (replay).
        profile: a profile path, a shipped profile name, a :class:`~spectune.costmodel.profile.Profile`, or a list of
        them. max_gamma: deepest draft (default: the traces' max_gamma; live: 12).
        reward: ``"throughput"`` (tokens − ρ·time) or ``"ratio"`` (LTD's tokens / time).
        outcome: ``"realised"`` (that cycle's outcome) or ``"expected"`` (over the acceptance uniforms; replay).
        profile_jitter: log-scale half-width of the random scaling of draft and verification costs per episode.
        allow_profile_mismatch: accept a profile of other models/hardware than the traces' (labels results synthetic).
        engine, requests, concurrency: the live backend's engine, requests and batch.
        live_time: ``"measured"`` (the cycle's synchronised time) or ``"profile"`` (the profile's cost of the same
            cycle: deterministic rewards and info, e.g. for gymnasium's checker).
    """

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, backend: str = "replay", traces: Any = None, profile: Any = None, max_gamma: int | None = None,
                 reward: str = "throughput", outcome: str = "realised", profile_jitter: float = 0.0,
                 allow_profile_mismatch: bool = False, engine: Any = None, requests: list | None = None,
                 concurrency: int = 1, live_time: str = "measured", features: tuple[str, ...] | None = None) -> None:
        self.backend = check_backend(backend)
        if reward not in REWARDS:
            raise SpectuneError(f"reward={reward!r} is unknown: choose one of {', '.join(REWARDS)}")
        if outcome not in OUTCOMES:
            raise SpectuneError(f"outcome={outcome!r} is unknown: choose one of {', '.join(OUTCOMES)}")
        self.reward_kind, self.expected = reward, outcome == "expected"
        limit, ceiling = attach_source(self, backend, traces, profile, profile_jitter, allow_profile_mismatch,
                                       engine, requests, concurrency, live_time)
        self.max_gamma = limit if max_gamma is None else int(max_gamma)
        if not 1 <= self.max_gamma <= ceiling:
            raise SpectuneError(f"max_gamma={max_gamma!r} is out of range: must be in 1..{ceiling} "
                                "(the traces' max_gamma and the profile's max_positions - 1)")
        self.action_space = gym.spaces.Discrete(2)
        # a policy file's features (a subset of the fields, in its order; None: all of them)
        self.builder = GAMMA if features is None else GAMMA.of(features)
        wanted = sorted(set(self.builder.features) & set(MATCH_SIGNALS))
        if wanted and self.traces is not None and not self.traces.match_signals:
            raise SpectuneError(f"features {wanted} are invalid for traces={self.traces.source}: they are a model-free "
                                "draft's match signals, and these traces hold none (trace with proposer=lookup or "
                                "proposer=suffix)")
        self.observation_space = gym.spaces.Box(0.0, OBS_HIGH, shape=(len(self.builder.features),), dtype=np.float32)
        self._obs = np.zeros(len(self.builder.features), dtype=np.float32)
        self._given = (0.0, 0.0)  # the episode row's (context length, recent acceptance)
        self._rate = RunningRate()

    # -- shared ------------------------------------------------------------------------------------------
    def _start(self, batch: int, context: float, recent: float) -> None:
        """A new episode: the row's observation before any draft (the builder's step-0 signal values)."""
        self._index, self._costs = self.profiles.sample(self.np_random, batch)
        self._batch, self._gamma = batch, 0
        self._ceiling = self.max_gamma  # the deepest draft of this episode (replay: where the recorded chain ends)
        self._given = (context, recent)
        self._obs[:] = self.builder.from_trace(0, batch, self._costs, context, recent)

    def _signals(self, values) -> None:
        """After draft step ``self._gamma`` (the drafts so far): that step's signals (SIGNALS order)."""
        self._obs[:] = self.builder.from_trace(self._gamma, self._batch, self._costs, *self._given, values)

    def _recorded(self, gamma: int) -> tuple[float, float]:
        """The recorded row verified at ``gamma``: the tokens it emits (accepted prefix + the target's one) and its
        1/b share of the batch cycle's cost (:meth:`spectune.costmodel.profile.CycleCosts.cycle_s`). A model-free
        draft's chain may end before ``gamma``: the engine verifies no further, so that depth is charged (the replay's
        rule,
        :func:`policies.envs.replay.replay_costs`); a draft model's chain always reaches the ceiling."""
        gamma = min(gamma, self._ceiling)
        tokens = self.traces.accepted_at(self._entry, gamma, self.expected) + 1.0
        return tokens, self._costs.cycle_s(gamma) / self._batch

    def _reward(self, tokens: float, time_s: float) -> float:
        key = (self._index, self._batch)
        share_ar = self._costs.ar_s / self._batch
        reward = self._rate.charge(key, 1.0, share_ar, tokens, time_s)  # prior: one AR step at the profile's rate
        if self.reward_kind == "ratio":
            return tokens * share_ar / time_s
        return reward

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rate.clear()
        if self.backend == "replay":
            options = options or {}
            entry = options.get("entry")
            self._entry = int(entry) if entry is not None else int(self.np_random.integers(self.traces.count))
            t = self.traces
            self._start(int(t.batch_size[self._entry]), float(t.context_length[self._entry]),
                        float(t.recent_acceptance[self._entry]))
            self._ceiling = min(self.max_gamma, int(t.chain[self._entry]))
        else:
            self._live_reset(seed is not None)
        return self._obs.copy(), {}

    def step(self, action):
        if action == DRAFT and self._gamma < self._ceiling:
            self._gamma += 1
            if self.backend == "replay":
                self._signals(self.traces.signals[self._entry, self._gamma - 1])
            else:
                self._live_draft()
            if self._gamma < self._ceiling:
                return self._obs.copy(), 0.0, False, False, {}
        if self.backend == "replay":
            tokens, time_s = self._recorded(self._gamma)
            info = {}
        else:
            tokens, measured_s = self._live_verify()
            modelled_s = self._costs.cycle_s(self._gamma) / self._batch
            time_s = measured_s if self.live_time == "measured" else modelled_s
            info = {"measured_s": measured_s} if self.live_time == "measured" else {}  # profile: deterministic info
        reward = self._reward(tokens, time_s)
        return self._obs.copy(), float(reward), True, False, {"gamma": self._gamma, "tokens": tokens,
                                                              "time_s": time_s, "synthetic": self.synthetic, **info}

    # -- live backend ------------------------------------------------------------------------------------
    def _live_reset(self, restart: bool) -> None:
        if self._session is not None and self._session.cycle is not None:
            self._session.verify()  # an abandoned episode: finish its cycle
        if restart or self._session is None:
            self._session = self.engine.session(self.requests, None, self.concurrency)
            self._recent = AcceptanceHistory()  # per request
        while True:
            if self._session.done:
                self._session = self.engine.session(self.requests, None, self.concurrency)
            if self._session.begin_cycle():
                break
        cycle = self._session.cycle
        self._row = cycle.rows[0]
        self._start(len(cycle.rows), float(cycle.context_length[self._row]),
                    self._recent.rate(cycle.request_ids[self._row]))

    def _live_draft(self) -> None:
        step = self._session.draft_step(frozenset(SIGNALS))  # a draft model computes no match signals: 0 here
        self._signals([float(step[name][self._row]) if name in step else 0.0 for name in SIGNALS])

    @torch.inference_mode()
    def _live_verify(self) -> tuple[float, float]:
        session, row = self._session, self._row
        rid = session.cycle.request_ids[row]
        outcome = session.verify(self._gamma)
        for r in outcome.rows:
            self._recent.add(outcome.request_ids[r], outcome.accepted[r], outcome.num_drafts[r])
        self._rid = rid
        return float(outcome.emitted[row]), outcome.cycle_s / len(outcome.rows)
