"""A stable-baselines3 PPO depth policy run inside the engine: after each draft step, stop or continue, per row.

The policy file is data (:mod:`policies.sb3_files`): the actor network is rebuilt from its weights and called
directly, once per draft step for all rows (SB3's ``predict`` costs ~100 µs a call: too slow per step and row).
Deterministic by default (argmax of the logits), so two runs on the same requests are paired.

The observation is a vector of named features (:data:`FEATURES`). A file written by spectune carries a
``spectune.json`` member naming its features (and optional divisors), its actions and the cost profile it was
trained for; a file without it must match :data:`DEFAULT_OBSERVATION`. The profile's cost figures
(c = draft step / target step, g = verification of the positions so far / target step, at the busy batch size)
are features: a policy trained for another profile is refused unless ``allow_profile_mismatch``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.engine.policy import DRAFT_SIGNALS, CycleFeedback, DraftLengthPolicy, DraftStep
from harness.errors import SpectuneError
from policies.rows import RowTracker
from policies.sb3_files import PolicyFile, read_policy_file

log = logging.getLogger(__name__)

ACTIONS = ("stop", "continue")  # Discrete(2): action 1 drafts one more token
DEFAULT_OBSERVATION = ("token_prob", "entropy", "margin", "cum_prob", "position", "context_length",
                       "recent_acceptance", "batch_size", "c", "g")


class Costs:
    """The cost figures of a profile (profile.json's format): c(b) and g(n, b), at the nearest measured b."""

    def __init__(self, profile: dict[str, Any]) -> None:
        self.label = str(profile.get("label", "?"))
        self.t_draft = {int(b): float(v) for b, v in profile["t_draft_s"].items()}
        self.t_verify = {int(b): [float(x) for x in v] for b, v in profile["t_verify_s"].items()}
        if not self.t_draft or set(self.t_draft) != set(self.t_verify):
            raise ValueError("t_draft_s and t_verify_s must cover the same batch sizes")

    def _batch(self, b: int) -> int:
        return min(self.t_verify, key=lambda k: (abs(k - b), k))

    def c(self, b: int) -> float:
        key = self._batch(b)
        return self.t_draft[key] / self.t_verify[key][0]

    def g(self, positions: int, b: int) -> float:
        """Verification of ``positions`` drafts (positions + 1 target positions) over one target step."""
        row = self.t_verify[self._batch(b)]
        return row[min(positions, len(row) - 1)] / row[0]


def _load_profile(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SpectuneError(f"policy.profile={path!r} is invalid: not a readable profile.json ({err})") from None
    if data.get("kind") != "spectune-profile":
        raise SpectuneError(f"policy.profile={path!r} is invalid: kind is {data.get('kind')!r}, not 'spectune-profile'")
    return data


def _identity(profile: dict[str, Any]) -> dict[str, Any]:
    """What makes two profiles the same hardware and models (the label may differ)."""
    return {"models": profile.get("models"), "hardware": profile.get("hardware"),
            "synthetic": profile.get("synthetic", False)}


class PPODepth(DraftLengthPolicy):
    """PPO depth policy from ``depth_path`` (an SB3 ``.zip``); γ (the grid's value) is the ceiling on depth.

    Args:
        gamma: the most drafts per cycle (the env's max_depth).
        depth_path: the depth policy file.
        trust_pickle: load the file with SB3 itself (its pickles run); only for files you trust.
        profile: a ``profile.json`` with the costs of this run's models and hardware; ``None`` uses the profile
            the file was trained for.
        allow_profile_mismatch: use a file trained for another profile than ``profile`` (results are then a
            transfer experiment, and labelled so in ``describe``).
        deterministic: act on the argmax of the logits (else sample, seeded by ``seed``).
        seed: seed of the sampled actions when not deterministic.
    """

    name = "ppo"

    def __init__(self, gamma: int, depth_path: str, trust_pickle: bool, profile: str | None,
                 allow_profile_mismatch: bool, deterministic: bool, seed: int) -> None:
        if not (isinstance(gamma, int) and not isinstance(gamma, bool) and gamma >= 1):
            raise SpectuneError(f"gamma={gamma!r} is invalid: the ppo depth ceiling must be an integer >= 1")
        for key, value in (("trust_pickle", trust_pickle), ("allow_profile_mismatch", allow_profile_mismatch),
                           ("deterministic", deterministic)):
            if not isinstance(value, bool):
                raise SpectuneError(f"policy.{key}={value!r} is invalid: must be true or false")
        if not depth_path:
            raise SpectuneError("policy.depth_path is unset: policy=ppo needs a policy file "
                                "(policy.depth_path=RUN_DIR/depth.zip, from python -m policies.train)")
        self.max_gamma, self.deterministic, self.seed = gamma, deterministic, int(seed)
        self.file: PolicyFile = read_policy_file(depth_path, "policy.depth_path", trust_pickle)
        extra = self.file.extra
        self.features = tuple(extra.get("observation", DEFAULT_OBSERVATION))
        unknown = [f for f in self.features if f not in FEATURES]
        if unknown:
            raise SpectuneError(f"policy.depth_path={depth_path!r} is invalid: observation features {unknown} are "
                                f"not computed by the engine (known: {', '.join(FEATURES)})")
        if self.file.observation_space.shape != (len(self.features),):
            raise SpectuneError(f"policy.depth_path={depth_path!r} is invalid: observation shape "
                                f"{self.file.observation_space.shape} does not match its {len(self.features)} "
                                f"features ({', '.join(self.features)})")
        actions = tuple(extra.get("actions", ACTIONS))
        if self.file.action_space.n != 2 or self.file.action_space.start != 0 or set(actions) != set(ACTIONS):
            raise SpectuneError(f"policy.depth_path={depth_path!r} is invalid: action space Discrete("
                                f"{self.file.action_space.n}) {list(actions)} is not the depth policy's Discrete(2) "
                                f"{list(ACTIONS)}")
        self.continue_action = actions.index("continue")
        self.scale = torch.tensor(extra.get("scale", [1.0] * len(self.features)), dtype=torch.float32)
        if self.scale.shape != (len(self.features),) or not bool((self.scale > 0).all()):
            raise SpectuneError(f"policy.depth_path={depth_path!r} is invalid: 'scale' must be {len(self.features)} "
                                "positive numbers")
        trained_for = extra.get("profile")
        run_profile = _load_profile(profile) if profile else None
        self.mismatch = bool(trained_for and run_profile and _identity(trained_for) != _identity(run_profile))
        if self.mismatch and not allow_profile_mismatch:
            raise SpectuneError(f"policy.profile={profile!r} is invalid for policy.depth_path={depth_path!r}: the "
                                f"policy was trained for profile {trained_for.get('label')!r} (other models or "
                                "hardware); set policy.allow_profile_mismatch=true to use it anyway")
        chosen = run_profile or trained_for
        needs_costs = {"c", "g"} & set(self.features)
        if needs_costs and chosen is None:
            raise SpectuneError(f"policy.depth_path={depth_path!r} reads the cost features {sorted(needs_costs)}: "
                                "give policy.profile=PROFILE.json (the file names no profile of its own)")
        try:
            self.costs = Costs(chosen) if chosen is not None else None
        except (KeyError, ValueError, TypeError, AttributeError) as err:
            raise SpectuneError(f"the cost profile for policy=ppo is invalid: {err}") from None
        self.profile_path = profile
        self.signals = frozenset(f for f in self.features if f in DRAFT_SIGNALS)
        self.rows = RowTracker()
        self.reset()

    def reset(self) -> None:
        self.rows.reset()
        self.history: dict[int, tuple[int, int]] = {}  # slot -> (accepted, drafted) over its request's cycles
        self.generator = torch.Generator().manual_seed(self.seed)

    def begin_cycle(self, batch_size: int) -> int:
        self.rows.begin_cycle()
        return self.max_gamma

    def recent_acceptance(self, batch: int) -> torch.Tensor:
        """Accepted / drafted over each row's previous cycles of its request (0.5 before any)."""
        values = [0.5] * batch
        for row, (accepted, drafted) in self.history.items():
            if row < batch and drafted:
                values[row] = accepted / drafted
        return torch.tensor(values, dtype=torch.float64)

    def observation(self, step: DraftStep) -> torch.Tensor:
        """[B, F] float32: the features of every row after this draft step, divided by the file's scale."""
        if step.step == 0:
            self.rows.on_step(step)
            for row in self.rows.new_rows:
                self.history.pop(row, None)
        columns = [FEATURES[name](self, step).to("cpu", torch.float64) for name in self.features]
        return torch.stack(columns, dim=1).float() / self.scale

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        logits = self.file.logits(self.observation(step))
        if self.deterministic:
            action = logits.argmax(-1)
        else:
            action = torch.multinomial(torch.softmax(logits, -1), 1, generator=self.generator).squeeze(1)
        return (action == self.continue_action).to(step.active.device)

    def observe(self, feedback: CycleFeedback) -> None:
        rows = self.rows.observe(feedback)
        if rows is None:
            return
        for row, drafts, accepted in zip(rows, feedback.num_drafts, feedback.num_accepted, strict=True):
            old_accepted, old_drafted = self.history.get(row, (0, 0))
            self.history[row] = (old_accepted + accepted, old_drafted + drafts)

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "depth": self.file.describe(),
                "features": list(self.features), "deterministic": self.deterministic,
                "profile": self.costs.label if self.costs else None, "profile_path": self.profile_path,
                "profile_mismatch": self.mismatch}


def _signal(name: str, policy: PPODepth, step: DraftStep) -> torch.Tensor:
    return getattr(step, name)


def _busy(step: DraftStep) -> int:
    return max(1, int((step.context_length > 0).sum()))


def _full(step: DraftStep, value: float) -> torch.Tensor:
    return torch.full(step.active.shape, float(value), dtype=torch.float64)


# name -> how the engine-side policy computes it from a draft step (the envs must compute the same)
FEATURES: dict[str, Callable[[PPODepth, DraftStep], torch.Tensor]] = {
    **{name: functools.partial(_signal, name) for name in DRAFT_SIGNALS},
    "position": lambda policy, step: _full(step, step.step + 1),
    "context_length": lambda policy, step: step.context_length,
    "recent_acceptance": lambda policy, step: policy.recent_acceptance(step.active.shape[0]),
    "batch_size": lambda policy, step: _full(step, _busy(step)),
    "c": lambda policy, step: _full(step, policy.costs.c(_busy(step))),
    "g": lambda policy, step: _full(step, policy.costs.g(step.step + 1, _busy(step))),
    "g_next": lambda policy, step: _full(step, policy.costs.g(step.step + 2, _busy(step))),
}


def observation_low_high(features: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of the observation Box for these features (probabilities in [0, 1], the rest [0, inf))."""
    bounded = set(DRAFT_SIGNALS) - {"entropy"} | {"recent_acceptance"}
    high = np.array([1.0 if f in bounded else np.inf for f in features], dtype=np.float32)
    return np.zeros(len(features), dtype=np.float32), high
