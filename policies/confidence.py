"""Stop drafting when the draft doubts itself (transformers' `assistant_confidence_threshold`, DISCO-style)."""

from __future__ import annotations

import torch

from harness.engine.policy import DraftLengthPolicy, DraftStep
from harness.errors import SpectuneError


class ConfidenceStop(DraftLengthPolicy):
    """Draft up to γ tokens (the grid's value is the ceiling); a row stops after a token whose draft
    probability q(x) is below ``threshold``. Per row: in a batch, each sequence stops on its own evidence.

    Static threshold; HF additionally re-fits it online from accept/reject labels — a later policy.
    """

    name = "confidence"
    signals = frozenset({"token_prob"})

    def __init__(self, gamma: int, threshold: float) -> None:
        if not (isinstance(gamma, int) and not isinstance(gamma, bool) and gamma >= 1):
            raise SpectuneError(f"gamma={gamma!r} is invalid: the confidence policy's ceiling must be >= 1")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0.0 <= threshold <= 1.0:
            raise SpectuneError(f"policy.threshold={threshold!r} is invalid: must be a number in [0, 1]")
        self.max_gamma, self.threshold = gamma, float(threshold)

    def begin_cycle(self, batch_size: int) -> int:
        return self.max_gamma

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        return step.token_prob >= self.threshold

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "threshold": self.threshold}
