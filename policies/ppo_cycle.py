"""A stable-baselines3 PPO policy that chooses each row's draft length once per cycle, before drafting.

The comparison piece for :class:`policies.ppo.PPOGamma`: that policy decides after every draft step (one host sync
per step); this one reads no draft signal and makes no per-step decision, so the difference between the two is
what per-step stopping buys. It is trained on ``spectune/CycleGamma-v0`` (``train.cycle_timesteps``), whose
observation it builds with that environment's builder, :data:`~policies.envs.observation.CYCLE` (one definition):
context length, rows in flight, the request's recent acceptance, the profile's c(b) and g(1, b).

Per cycle: :meth:`PPOCycle.begin_cycle` runs the actor (numpy, deterministic argmax by default) once for all rows
it knows (their context is the previous cycle's plus its emitted tokens) and returns the deepest choice, capped at
the grid's γ (0: a plain target step). Rows drafting in lockstep cannot stop apart without a per-step decision,
so the batch drafts to that γ and :meth:`PPOCycle.end_drafting`, called once after drafting, keeps each row's
own γ (a prefix of its chain; the cut reads no target value, so the sampler stays exact). A cycle with a row
whose request is new (its context is not known before drafting) drafts to γ and that row's γ is chosen in
``end_drafting`` from the same observation, then with the context the step shows.

Recent acceptance is :class:`~spectune.engine.policy.AcceptanceHistory` per request, the traces' definition;
:class:`~policies.rows.RowTracker` tracks each slot's context. The file's ``spectune.json`` names its
observation, ``max_gamma`` (the action space is Discrete(max_gamma + 1)) and the profile it was trained for,
checked as ``policy=ppo`` checks its file.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from policies.envs.observation import CYCLE, CYCLE_FIELDS, read_schema
from policies.numpy_actor import NumpyActor
from policies.ppo import check_flags, resolve_profile
from policies.rows import RowTracker
from policies.sb3_files import PolicyFile, read_policy_file
from spectune.costmodel.profile import CycleCosts
from spectune.engine.policy import AcceptanceHistory, CycleFeedback, DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError
from spectune.options import check_gamma

log = logging.getLogger(__name__)

KEY = "policy.path"


class PPOCycle(DraftLengthPolicy):
    """PPO cycle-γ policy from ``path`` (a ``cycle.zip`` of ``policies.train``); γ is the ceiling.

    Args:
        gamma: the most drafts per cycle (γ the actor picks above it are cut to it).
        path: the policy file.
        trust_pickle: load the file with SB3 itself (its pickles run); only for files you trust.
        profile: the cost profile of this run (path or shipped name); ``None`` uses the file's.
        allow_profile_mismatch: use a file trained for another profile (a transfer experiment).
        deterministic: act on the argmax of the logits (else sample, seeded by ``seed``).
        seed: seed of the sampled actions when not deterministic.
        shadow_trials: under a model-free draft, a cycle that verified nothing still counts in recent acceptance
            (as :class:`~policies.ppo.PPOGamma`'s).
    """

    name = "ppo-cycle"
    reads_context = True  # a new request's γ is chosen before drafting, from its context
    signals: frozenset[str] = frozenset()  # reads no draft signal: no per-step decision

    def __init__(self, gamma: int, path: str | None, trust_pickle: bool, profile: str | None,
                 allow_profile_mismatch: bool, deterministic: bool, seed: int, shadow_trials: bool = True) -> None:
        check_gamma(gamma, "the ppo-cycle γ ceiling")
        check_flags(trust_pickle=trust_pickle, allow_profile_mismatch=allow_profile_mismatch,
                    deterministic=deterministic, shadow_trials=shadow_trials)
        self.shadow_trials = shadow_trials  # its cycle observation always reads recent acceptance
        if not path:
            raise SpectuneError(f"{KEY} is unset: policy=ppo-cycle needs a policy file "
                                f"({KEY}=RUN_DIR/cycle.zip, from python -m policies.train train.cycle_timesteps=N)")
        self.max_gamma, self.deterministic, self.seed = gamma, deterministic, int(seed)
        self.file: PolicyFile = read_policy_file(path, KEY, trust_pickle)
        self.file_max_gamma = self._check(path)
        self.actor = NumpyActor(self.file.actor)
        self.mismatch, self.profile = resolve_profile(self.file, KEY, path, profile, allow_profile_mismatch)
        if self.profile is None:
            raise SpectuneError(f"{KEY}={path!r} reads the costs c and g: give policy.profile=PROFILE (the file "
                                "names no profile of its own)")
        self.profile_arg = profile
        self.rows = RowTracker()
        self.reset()

    def _check(self, path: str) -> int:
        """The file's max_gamma, after checking its observation and action space are the cycle environment's."""
        extra, n = self.file.extra, self.file.action_space.n
        if extra.get("actions") == ["stop", "continue"]:
            raise SpectuneError(f"{KEY}={path!r} is invalid: it is a per-step γ policy file (stop/continue); "
                                "load it with policy=ppo policy.gamma_path=...")
        self.obs = read_schema(extra, CYCLE, f"{KEY}={path!r}")
        if self.file.observation_space.shape != (len(self.obs.features),):
            raise SpectuneError(f"{KEY}={path!r} is invalid: observation shape {self.file.observation_space.shape} "
                                f"is not the cycle environment's {list(CYCLE_FIELDS)}")
        max_gamma = extra.get("max_gamma", n - 1)
        if isinstance(max_gamma, bool) or not isinstance(max_gamma, int) or max_gamma < 1 \
                or n != max_gamma + 1 or self.file.action_space.start != 0:
            raise SpectuneError(f"{KEY}={path!r} is invalid: max_gamma={max_gamma!r} does not match its action space "
                                f"Discrete({n}) (a γ 0..max_gamma: Discrete(max_gamma + 1), max_gamma >= 1)")
        return int(max_gamma)

    def reset(self) -> None:
        self.rows.reset()
        self.history = AcceptanceHistory()  # per request id
        self.generator = torch.Generator().manual_seed(self.seed)
        self._new: set[int] = set()  # slots whose request is new this cycle (before_cycle)
        self._gammas: dict[int, int] = {}  # slot -> γ chosen this cycle
        self._in_flight = 0
        self._constants: dict[int, dict[str, float]] = {}  # batch -> the builder's constants (batch, c, g(1))

    # -- the observation and the actor -------------------------------------------------------------------
    def observation(self, context: list[int], slots: list[int]) -> np.ndarray:
        """[R, 5] float32: the cycle observation of ``slots`` at the given context lengths (one per slot), built by
        :data:`~policies.envs.observation.CYCLE` as the environment's (cheap on cold caches: one array built). The
        constants (batch, c, g) are computed once per batch size."""
        batch = self._in_flight
        constants = self._constants.get(batch)
        if constants is None:
            costs: CycleCosts = self.profile.costs(batch)
            constants = self._constants[batch] = self.obs.constants(0, batch, costs)
        serving = self.rows.serving
        recent = [self.history.rate(serving.get(slot, -1 - slot)) for slot in slots]
        return self.obs.build(constants, len(slots),
                              self.obs.step_column(None, [float(length) for length in context], recent))

    def choose(self, context: list[int], slots: list[int]) -> None:
        """Each slot's γ (≤ γ) from the actor, one call for all of them."""
        actions = self.actor.actions(self.observation(context, slots), self.deterministic, self.generator)
        for slot, action in zip(slots, actions.tolist(), strict=True):
            self._gammas[slot] = min(int(action), self.max_gamma)

    # -- the protocol ------------------------------------------------------------------------------------
    def before_cycle(self, rows: list[int], request_ids: list[int], context_lengths: list[int] | None = None) -> None:
        self._new = self.rows.see_cycle(rows, request_ids, context_lengths)

    def begin_cycle(self, batch_size: int) -> int:
        """The deepest γ the rows choose, every row chosen before drafting from the context ``before_cycle``
        gave; without it (a caller that does not pass it), γ when a row's context is not known yet (a new request:
        its γ is chosen once the first draft step shows its context)."""
        self.rows.begin_cycle()
        self._gammas = {}
        self._in_flight = batch_size  # rows in flight: the environment's batch_size
        known = sorted(self.rows.serving)
        announced = self.rows.announced
        context = announced if len(announced) == len(known) else self.rows.expected
        if not known or len(known) != batch_size or any(r not in context for r in known) \
                or (self._new and context is self.rows.expected):
            return self.max_gamma
        self.choose([context[r] for r in known], known)
        return max(self._gammas.values())

    def end_drafting(self, step: DraftStep) -> list[int] | None:
        """Each slot's chosen γ (rows not chosen yet are chosen here, from the context the step shows); None
        when every row keeps all ``step.step + 1`` drafts (no cut to make: the rows chose alike)."""
        if len(self._gammas) != self._in_flight:
            self.rows.see_context(step.context_length)  # one host read per such cycle, never per step
            pending = [row for row in self.rows.busy_rows() if row not in self._gammas]
            if pending:
                self.choose(self.rows.context[pending].tolist(), pending)
        drafted = step.step + 1
        if len(self._gammas) == self._in_flight and all(gamma >= drafted for gamma in self._gammas.values()):
            return None
        return [self._gammas.get(slot, 0) for slot in range(step.active.shape[0])]

    def observe(self, feedback: CycleFeedback) -> None:
        for outcome in self.rows.outcomes(feedback):
            self.history.add(outcome.request_id, outcome.accepted, outcome.drafts, outcome.shadow)

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "file_max_gamma": self.file_max_gamma,
                "file": self.file.describe(), "features": list(CYCLE_FIELDS), "deterministic": self.deterministic,
                "shadow_trials": self.shadow_trials,
                "profile": self.profile.label, "profile_arg": self.profile_arg, "profile_mismatch": self.mismatch}
