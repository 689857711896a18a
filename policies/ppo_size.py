"""The verification-size policy of a ``size.zip`` run inside the engine (``policy=ppo policy.size_path=...``).

After drafting, :class:`PPOSize` chooses how many of the batch's drafted tokens are verified, exactly as
``spectune/VerifySize-v0`` (with per-row γ, ``policies.train.size``) decides; :class:`policies.ppo.PPOGamma`
calls it through the protocol's ``end_drafting``. The cut keeps a prefix of each row's chain and reads the draft
only, so the sampler stays exact.
"""

from __future__ import annotations

import numpy as np
import torch

from policies.envs.observation import size_cut, size_observation
from policies.numpy_actor import NumpyActor
from policies.sb3_files import read_policy_file
from spectune.costmodel.profile import Profile
from spectune.errors import SpectuneError

SIZE_EXTRA = ("levels", "obs_tokens")  # spectune.json keys of a size policy file


class PPOSize:
    """The verification-size policy of a ``size.zip``: after drafting, how many of the batch's drafted tokens
    are verified, exactly as ``spectune/VerifySize-v0`` (with per-row γ, ``policies.train.size``) decides.

    Observation (:func:`~policies.envs.observation.size_observation`): the drafted tokens' cumulative draft
    probabilities in decreasing
    order (``obs_tokens``, zero padded), batch size / 32, c(B), g(D, B) with D the deepest row's drafts.
    Action a of ``levels``: keep the round(a / (levels − 1) · Σ drafts) most probable tokens (:func:`size_cut`).
    """

    def __init__(self, path: str, trust_pickle: bool, profile: Profile | None, deterministic: bool) -> None:
        self.file = read_policy_file(path, "policy.size_path", trust_pickle)
        extra = self.file.extra
        missing = [k for k in SIZE_EXTRA if not isinstance(extra.get(k), int) or isinstance(extra.get(k), bool)]
        if missing:
            raise SpectuneError(f"policy.size_path={path!r} is invalid: its spectune.json lacks {', '.join(missing)} "
                                "(write it with python -m policies.train at train.concurrency > 1)")
        self.levels, self.obs_tokens = int(extra["levels"]), int(extra["obs_tokens"])
        if self.file.observation_space.shape != (self.obs_tokens + 3,):
            raise SpectuneError(f"policy.size_path={path!r} is invalid: observation shape "
                                f"{self.file.observation_space.shape} is not the size environment's "
                                f"({self.obs_tokens + 3},) for obs_tokens={self.obs_tokens}")
        if self.file.action_space.n != self.levels or self.file.action_space.start != 0 or self.levels < 2:
            raise SpectuneError(f"policy.size_path={path!r} is invalid: action space Discrete("
                                f"{self.file.action_space.n}) is not the size environment's Discrete({self.levels}) "
                                "budget levels")
        if profile is None:
            raise SpectuneError(f"policy.size_path={path!r} reads the costs c and g: give policy.profile=PROFILE")
        self.profile, self.deterministic, self.path = profile, deterministic, path
        self.actor = NumpyActor(self.file.actor)
        self.generator = torch.Generator().manual_seed(0)

    def action(self, obs: np.ndarray) -> int:
        return int(self.actor.actions(obs[None], self.deterministic, self.generator)[0])

    def cut(self, cum: np.ndarray, gammas: np.ndarray) -> np.ndarray:
        """Kept lengths of the busy rows, given their cumulative draft probabilities [B, D] and drafts [B]."""
        batch, deepest = len(gammas), int(gammas.max(initial=0))
        obs, order = size_observation(cum, gammas, batch, self.profile.c(batch), self.profile.g(deepest, batch),
                                      self.obs_tokens)
        return size_cut(order, self.action(obs), self.levels, gammas, cum.shape[1])

    def describe(self) -> dict:
        return {"file": self.file.describe(), "levels": self.levels, "obs_tokens": self.obs_tokens}
