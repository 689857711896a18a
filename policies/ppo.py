"""A stable-baselines3 PPO γ policy run inside the engine: after each draft step, stop or continue, per row.

The policy file is data (:mod:`policies.sb3_files`): the actor network is rebuilt from its weights and called
directly, once per draft step for all rows (SB3's ``predict`` costs ~100 µs a call: too slow per step and row).
Deterministic by default (argmax of the logits), so two runs on the same requests are paired.

The observation is the γ environment's (``policies/envs/observation.py``, one definition): draft signals,
position, context, batch, recent acceptance and the profile's c and g, scaled as there. The decision the
environment makes at step 0 ("don't speculate this cycle") is taken in :meth:`PPOGamma.begin_cycle` for the
rows the policy already knows (a cycle speculates unless every known row says stop; a new request's first
cycle always drafts), since the protocol chooses one ceiling per cycle.

With ``size_path`` (a ``size.zip`` of ``policies.train`` at concurrency > 1) the policy also chooses the
verification budget after drafting, as ``spectune/VerifySize-v0`` does (:class:`policies.ppo_size.PPOSize`):
through the protocol's ``end_drafting`` it keeps the batch's drafted tokens of highest cumulative draft
probability, a prefix of each row's chain. The cut reads the draft only, so the sampler stays exact.

A file written by ``policies.train`` carries ``spectune.json``: its feature names, actions and the profile it
was trained for (whole, so ``policy.profile`` may stay unset). A policy trained for another profile than the
run's ``policy.profile`` (other models or hardware, :data:`spectune.costmodel.profile.MATCH_FIELDS`) is refused unless
``policy.allow_profile_mismatch=true``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from policies.envs.observation import BEFORE_DRAFTING, GAMMA, OBS_FIELDS, OBS_HIGH, read_schema, scales
from policies.numpy_actor import NumpyActor, SplitActor
from policies.ppo_size import PPOSize
from policies.rows import RowTracker
from policies.sb3_files import PolicyFile, read_policy_file
from spectune.costmodel.profile import CycleCosts, Profile, load_profile, profile_mismatch
from spectune.engine.policy import (
    AcceptanceHistory,
    CycleFeedback,
    DraftLengthPolicy,
    DraftStep,
)
from spectune.errors import SpectuneError
from spectune.options import check_gamma

log = logging.getLogger(__name__)

ACTIONS = ("stop", "continue")  # Discrete(2) as spectune/DraftGamma-v0: 0 = stop and verify, 1 = draft one more
DEFAULT_OBSERVATION = OBS_FIELDS


def check_flags(**flags: object) -> None:
    """The PPO policies' true/false parameters: anything else fails in one line naming it."""
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise SpectuneError(f"policy.{key}={value!r} is invalid: must be true or false")

class PPOGamma(DraftLengthPolicy):
    """PPO γ policy from ``gamma_path`` (an SB3 ``.zip``); γ (the grid's value) is the ceiling.

    Args:
        gamma: the most drafts per cycle (the environment's max_gamma).
        gamma_path: the γ policy file.
        trust_pickle: load the file with SB3 itself (its pickles run); only for files you trust.
        profile: the cost profile of this run's models and hardware (path or shipped name); ``None`` uses the
            profile the file was trained for.
        allow_profile_mismatch: use a file trained for another profile than ``profile`` (a transfer
            experiment, labelled so in ``describe``).
        deterministic: act on the argmax of the logits (else sample, seeded by ``seed``).
        seed: seed of the sampled actions when not deterministic.
        size_path: the verification-size policy file (``size.zip``); ``None``: verify every draft.
        shadow_trials: under a model-free draft, a cycle that verified nothing still counts in recent acceptance
            (its first draft against the emitted token: :attr:`CycleFeedback.shadow_accepted`); the training
            environment's recent acceptance comes from traces where every cycle drafted, and without this a
            request whose acceptance fell to 0 would never draft, nor measure, again.
        policy_file: ``gamma_path`` already read (``policies.ppo_distilled.distill`` reads it once for two rules);
            keyword-only, so no config can set it.
    """

    name = "ppo"
    reads_context = True  # the step-0 decision covers new requests too, before anything is drafted

    def __init__(self, gamma: int, gamma_path: str | None, trust_pickle: bool, profile: str | None,
                 allow_profile_mismatch: bool, deterministic: bool, seed: int, size_path: str | None = None,
                 shadow_trials: bool = True, *, policy_file: PolicyFile | None = None) -> None:
        check_gamma(gamma, "the ppo γ ceiling")
        check_flags(trust_pickle=trust_pickle, allow_profile_mismatch=allow_profile_mismatch,
                    deterministic=deterministic, shadow_trials=shadow_trials)
        if not gamma_path:
            raise SpectuneError("policy.gamma_path is unset: policy=ppo needs a policy file "
                                "(policy.gamma_path=RUN_DIR/gamma.zip, from python -m policies.train)")
        self.max_gamma, self.deterministic, self.seed = gamma, deterministic, int(seed)
        self.file: PolicyFile = policy_file or read_policy_file(gamma_path, "policy.gamma_path", trust_pickle)
        extra = self.file.extra
        self.obs = read_schema(extra, GAMMA, f"policy.gamma_path={gamma_path!r}")  # the file's features' builder
        self.features = self.obs.features
        if self.file.observation_space.shape != (len(self.features),):
            raise SpectuneError(f"policy.gamma_path={gamma_path!r} is invalid: observation shape "
                                f"{self.file.observation_space.shape} does not match its {len(self.features)} "
                                f"features ({', '.join(self.features)})")
        actions = tuple(extra.get("actions", ACTIONS))
        if self.file.action_space.n != 2 or self.file.action_space.start != 0 or set(actions) != set(ACTIONS):
            raise SpectuneError(f"policy.gamma_path={gamma_path!r} is invalid: action space Discrete("
                                f"{self.file.action_space.n}) {list(actions)} is not the γ policy's Discrete(2) "
                                f"{list(ACTIONS)}")
        self.continue_action = actions.index("continue")
        self.actor = NumpyActor(self.file.actor)
        self.mismatch, self.profile = resolve_profile(self.file, "policy.gamma_path", gamma_path, profile,
                                                      allow_profile_mismatch)
        needs_costs = {"c", "g"} & set(self.features)
        if needs_costs and self.profile is None:
            raise SpectuneError(f"policy.gamma_path={gamma_path!r} reads the cost features {sorted(needs_costs)}: "
                                "give policy.profile=PROFILE (the file names no profile of its own)")
        self.profile_arg = profile
        self.network_signals = self.obs.signals  # the draft and match signals it reads (policy.SIGNALS)
        self.signals = self.network_signals  # what the engine computes for continue_drafting
        # deterministic steps decide through the split first layer (sampled ones need every logit)
        self.split = SplitActor(self.actor.layers, self.features, scales(self.features), self.network_signals,
                                self.obs.step_fields, self.continue_action) if deterministic else None
        self.size = PPOSize(size_path, trust_pickle, self.profile, deterministic) if size_path else None
        if self.size is not None:
            self.signals = self.signals | {"cum_prob"}
        self.shadow_trials = shadow_trials and "recent_acceptance" in self.obs.row_fields
        self.rows = RowTracker()
        self.reset()

    def reset(self) -> None:
        self.rows.reset()
        self.history = AcceptanceHistory()  # per slot, over its request's cycles
        self.generator = torch.Generator().manual_seed(self.seed)
        self._constant: dict[tuple[int, int, int], dict[str, float]] = {}  # (batch, drafted, slots) -> constants
        self._costs: dict[int, CycleCosts] = {}  # rows in flight -> the profile's costs
        self._step_share: dict[tuple[int, int, int], np.ndarray] = {}  # SplitActor.step_share per step shape
        self._row_share: np.ndarray | None = None  # SplitActor.row_share of this cycle, from its step 0
        self._recent: list[float] | None = None
        self._in_flight = 0
        self._new_request = False  # a slot of the coming cycle took a new request (before_cycle)
        self._cum: list[tuple[torch.Tensor, torch.Tensor]] = []  # this cycle's (cum_prob, drafting) per step
        self.start: dict[int, bool] | None = None  # this cycle's step-0 decision per known row (None: undecided)
        if getattr(self, "size", None) is not None:
            self.size.generator.manual_seed(self.seed)

    # -- the observation (built by policies.envs.observation.GAMMA; this policy only hands it the engine's values) --
    def recent_acceptance(self, batch: int) -> np.ndarray:
        """Accepted / acceptance trials over each row's previous cycles of its request (0.5 before any; see
        :func:`spectune.engine.policy.acceptance_trials`), as the traces record it."""
        return np.asarray([self.history.rate(row) for row in range(batch)], dtype=np.float64)

    def _recent_of(self, slots: int) -> list[float]:
        """Each slot's recent acceptance as floats, once per cycle (empty when the file does not read it)."""
        if "recent_acceptance" not in self.obs.row_fields:
            return []
        if self._recent is None or len(self._recent) != slots:
            self._recent = self.recent_acceptance(slots).tolist()
        return self._recent

    def _constants(self, drafted: int, batch: int, busy: int, slots: int) -> dict[str, float]:
        """The builder's per-step fields after ``drafted`` drafts, cached per (batch, drafted, slots); their values
        are taken at the ``busy`` rows with a sequence (the environment's rows in flight)."""
        key = (batch, drafted, slots)
        constant = self._constant.get(key)
        if constant is None:
            costs = self._costs.get(busy)
            if costs is None and self.profile is not None:
                costs = self._costs[busy] = self.profile.costs(busy)
            constant = self._constant[key] = self.obs.constants(drafted, busy, costs)
        return constant

    def observation(self, step: DraftStep) -> np.ndarray:
        """[B, F] float32: every row's features after draft step ``step`` (``step.step + 1`` drafts), built by
        :data:`~policies.envs.observation.GAMMA`, bit for bit the environment's.

        Built from Python floats with one array construction at the end: the decision runs between forwards, on
        caches the models have just evicted, where each numpy or torch call costs tens of µs (measured: 241 µs for
        a cycle observation of a dozen numpy calls inside the engine, 19 µs in a tight loop). Features that are
        the same for every row of a step (position, batch, c, g) are computed once per (rows in flight, step,
        slots) and cached; recent acceptance once per cycle."""
        slots = step.active.shape[0]
        constant = self._constants(step.step + 1, self._in_flight or _busy(step), _busy(step), slots)
        return self.obs.build(constant, slots, self._column(step, slots))

    def start_observation(self, context: list[int], batch_size: int) -> np.ndarray:
        """[slots, F] float32: the step-0 observation, before anything is drafted (the signals' values then), of
        the slots at ``context`` (0: not decided)."""
        slots = len(context)
        constant = self._constants(0, batch_size, max(1, sum(1 for n in context if n > 0)), slots)
        return self.obs.build(constant, slots, self.obs.step_column(None, context, self._recent_of(slots)))

    def _column(self, step: DraftStep, slots: int):
        """The per-row columns of ``step``: its signals, the cycle's contexts (read once at its step 0) and recent
        acceptance."""
        context = self.rows.lengths or step.context_length.tolist()
        return self.obs.step_column(step, context, self._recent_of(slots))

    def act(self, obs: np.ndarray) -> torch.Tensor:
        """[B] bool: rows whose action is "continue" (one actor call for all rows, in numpy)."""
        return torch.from_numpy(self.actor.actions(obs, self.deterministic, self.generator) == self.continue_action)

    # -- the protocol ------------------------------------------------------------------------------------
    def before_cycle(self, rows: list[int], request_ids: list[int], context_lengths: list[int] | None = None) -> None:
        new = self.rows.see_cycle(rows, request_ids, context_lengths)
        self._new_request = bool(new)
        if self.rows.announced:  # a new request's history starts now (the environment's recent acceptance: the prior)
            for row in new:
                self.history.forget(row)
            if new:
                self._recent = None

    def begin_cycle(self, batch_size: int) -> int:
        """The step-0 decision, before anything is drafted: γ = 0 when every row says stop. Each row's context comes
        from ``before_cycle``; without it (a caller that does not pass it) only rows known from the last cycle can
        be decided, and a cycle with a new request speculates (its rows stop after one draft if told)."""
        start = self.start_rows(batch_size)
        if start is None:
            self.start = None
            return self.max_gamma
        self.start = self.start_decisions(*start, batch_size)
        return self.max_gamma if any(self.start.values()) else 0

    def start_rows(self, batch_size: int) -> tuple[list[int], dict[int, int]] | None:
        """The cycle's bookkeeping, then the rows the step-0 decision can be taken for (sorted) with their context
        lengths, or None when a row is not known (the cycle speculates)."""
        self.rows.begin_cycle()
        self._cum = []
        self._in_flight = batch_size  # rows in flight this cycle: the environment's batch_size
        announced = self.rows.announced
        lengths = announced if len(announced) == batch_size else self.rows.expected
        known = sorted(lengths)
        if not known or len(known) != batch_size or (self._new_request and lengths is self.rows.expected):
            return None
        return known, lengths

    def start_decisions(self, known: list[int], lengths: dict[int, int], batch_size: int) -> dict[int, bool]:
        """The network's step-0 action per known row (True: speculate), one actor call for the cycle."""
        width = max(known) + 1
        context = [0] * width
        for row in known:
            context[row] = lengths[row]
        obs = self.start_observation(context, batch_size)
        actions = self.actor.actions(obs, self.deterministic, self.generator).tolist()  # no torch op between forwards
        return {row: actions[row] == self.continue_action for row in known}

    def see_first_step(self, step: DraftStep) -> None:
        """Step 0's bookkeeping: the cycle's rows (and, without before_cycle's context, its new requests)."""
        self.rows.on_step(step)
        if not self.rows.announced:  # without before_cycle's context, new requests are found here
            for row in self.rows.new_rows:
                self.history.forget(row)
                self._recent = None

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        if step.step == 0:
            self.see_first_step(step)
        if self.size is not None:
            self._cum.append((step.cum_prob.detach().to("cpu", torch.float64), step.active.detach().cpu()))
        keep = self.act(self.observation(step)) if self.split is None else self.decide(step)
        return keep if step.active.is_cpu else keep.to(step.active.device)

    def decide(self, step: DraftStep) -> torch.Tensor:
        """:meth:`act` on :meth:`observation` through the split first layer (deterministic only): the signals in
        one host read, the step's constants' share cached per step shape, the rows' share once per cycle. The same
        actions wherever the top two logits are not within float32 rounding (the signals' scales are folded into
        the weights)."""
        split = self.split
        slots = step.active.shape[0]
        if step.step == 0 or self._row_share is None or self._row_share.shape[0] != slots:
            column = self._column(step, slots)
            self._row_share = split.row_share({name: column(name) for name in split.row_fields}, slots)
        key = (self._in_flight or _busy(step), step.step, slots)
        share = self._step_share.get(key)
        if share is None:
            share = self._step_share[key] = split.step_share(
                self._constants(step.step + 1, self._in_flight or _busy(step), _busy(step), slots))
        if split.signals:
            signals = torch.stack(_columns(step, split.signals, slots), 1)
            signals = (signals if signals.is_cpu else signals.cpu()).numpy()
        else:
            signals = np.zeros((slots, 0), dtype=np.float32)
        return torch.from_numpy(split.decide(signals, self._row_share + share))

    def end_drafting(self, step: DraftStep) -> list[int] | None:
        """With a size policy: the verification budget's per-slot kept lengths (see :class:`PPOSize`)."""
        if self.size is None:
            return None
        if step.step == len(self._cum):  # the ceiling step: continue_drafting did not see it
            self._cum.append((step.cum_prob.detach().to("cpu", torch.float64), step.active.detach().cpu()))
        busy = (step.context_length > 0).cpu()
        cum = torch.stack([c for c, _ in self._cum], 1)  # [slots, D]
        drafted = torch.stack([a for _, a in self._cum], 1) & busy[:, None]
        rows = torch.nonzero(busy).flatten().tolist()
        kept = self.size.cut(cum[rows].numpy(), drafted[rows].sum(1).numpy())
        out = [0] * busy.shape[0]
        for row, k in zip(rows, kept.tolist(), strict=True):
            out[row] = int(k)
        return out

    def observe(self, feedback: CycleFeedback) -> None:
        self._recent = self._row_share = None
        for outcome in self.rows.outcomes(feedback):
            self.history.add(outcome.slot, outcome.accepted, outcome.drafts, outcome.shadow)

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "file": self.file.describe(),
                "features": list(self.features), "deterministic": self.deterministic,
                "shadow_trials": self.shadow_trials,
                "profile": self.profile.label if self.profile else None, "profile_arg": self.profile_arg,
                "profile_mismatch": self.mismatch, "size": self.size.describe() if self.size else None}


def resolve_profile(file: PolicyFile, key: str, path: str, profile: str | None,
                    allow: bool) -> tuple[bool, Profile | None]:
    """The run's profile (or the one the file was trained for) and whether the file was trained for other
    models/hardware than ``profile`` (refused unless ``allow``); ``key`` names the file's config value."""
    trained = file.extra.get("profile")
    try:
        trained = Profile.from_json(trained, f"{path}:spectune.json") if trained else None
    except SpectuneError as err:
        raise SpectuneError(f"{key}={path!r} is invalid: its profile: {err}") from None
    run = load_profile(profile) if profile else None
    if trained is None or run is None:
        return False, run or trained
    diff = profile_mismatch(trained, {"models": run.models, "hardware": run.hardware})
    if diff and not allow:
        fields = ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in diff.items())
        raise SpectuneError(f"policy.profile={profile!r} is invalid for {key}={path!r}: the "
                            f"policy was trained for profile {trained.label!r} ({fields}); set "
                            "policy.allow_profile_mismatch=true to use it anyway (a transfer experiment)")
    return bool(diff), run


def _columns(step: DraftStep, names: tuple[str, ...], slots: int) -> list[torch.Tensor]:
    """The step's signals ``names``; a match signal a draft model leaves None reads as its value before drafting
    (0), as the observation builder reads it (:meth:`~policies.envs.observation.Observation.step_column`)."""
    values = [getattr(step, name) for name in names]
    if all(value is not None for value in values):
        return values
    known = next((value for value in values if value is not None), None)
    dtype = known.dtype if known is not None else torch.float32
    return [value if value is not None else torch.full((slots,), BEFORE_DRAFTING[name], dtype=dtype)
            for name, value in zip(names, values, strict=True)]


def _busy(step: DraftStep) -> int:
    """Rows in flight (the environment's batch_size): the slots with a sequence (context > 0)."""
    return max(1, int((step.context_length > 0).sum()))


FEATURES = OBS_FIELDS  # what a γ policy file observes by default (GAMMA_FIELDS: what it may name)


def observation_low_high(features: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of the observation Box, as the γ environment's: [0, OBS_HIGH] for every field."""
    return np.zeros(len(features), dtype=np.float32), np.full(len(features), OBS_HIGH, dtype=np.float32)
