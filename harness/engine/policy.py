"""The small interface between the engine and a draft-length policy (vLLM-style separation).

It lives with the engine so the engine never imports ``policies``: the adaptive policies there
implement this protocol from above. :class:`FixedGamma`, the grid's own policy, lives here too.

Per cycle the engine asks :meth:`DraftLengthPolicy.begin_cycle` for a ceiling γ, drafts step by step
and, after each step, offers the policy the draft's signals so it may stop some rows early; after
verification it reports what happened through :meth:`DraftLengthPolicy.observe`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from harness.errors import SpectuneError


@dataclass(frozen=True)
class DraftStep:
    """Signals after draft step ``step`` (0-based) for the rows of the batch."""

    step: int
    token_prob: torch.Tensor  # [B] q(x) of the token just drafted
    entropy: torch.Tensor  # [B] entropy of q at this step, nats
    active: torch.Tensor  # [B] bool: rows still drafting before this step's decision
    context_length: torch.Tensor  # [B] tokens in each row's sequence before this cycle


@dataclass(frozen=True)
class CycleFeedback:
    """What one draft-and-verify cycle did, per row, and what it cost (synchronised seconds)."""

    num_drafts: list[int]
    num_accepted: list[int]
    draft_s: float
    verify_s: float
    cycle_s: float


class DraftLengthPolicy(ABC):
    """Chooses how many tokens to draft. Stateless policies ignore :meth:`observe`."""

    name: str = "policy"

    @abstractmethod
    def begin_cycle(self, batch_size: int) -> int:
        """γ ceiling for this cycle (≥ 1); 0 would mean no drafting (the autoregressive baseline)."""

    def continue_drafting(self, step: DraftStep) -> torch.Tensor | None:
        """Rows that keep drafting after ``step``; ``None`` = all of them (costs no host sync)."""
        return None

    def observe(self, feedback: CycleFeedback) -> None:
        """Learn from a finished cycle."""

    def reset(self) -> None:
        """Forget per-run state (called before each run)."""

    def describe(self) -> dict:
        return {"name": self.name}


class FixedGamma(DraftLengthPolicy):
    """Draft exactly γ tokens every cycle: the grid-search baseline everything is compared to."""

    name = "fixed"

    def __init__(self, gamma: int) -> None:
        if not (isinstance(gamma, int) and not isinstance(gamma, bool) and gamma >= 1):
            raise SpectuneError(f"gamma={gamma!r} is invalid: must be an integer >= 1")
        self.gamma = gamma

    def begin_cycle(self, batch_size: int) -> int:
        return self.gamma

    def describe(self) -> dict:
        return {"name": self.name, "gamma": self.gamma}
