"""Stop drafting when the draft doubts itself (transformers' `assistant_confidence_threshold`, DISCO-style)."""

from __future__ import annotations

import torch

from harness.errors import SpectuneError
from policies.base import DraftLengthPolicy, DraftStep


class ConfidenceStop(DraftLengthPolicy):
    """Draft up to ``max_gamma`` tokens; a row stops after a token whose draft probability q(x) is below
    ``threshold`` (HF's default 0.4). Per row: in a batch, each sequence stops on its own evidence.

    Static threshold; HF additionally re-fits it online from accept/reject labels — a later policy.
    """

    name = "confidence"

    def __init__(self, max_gamma: int, threshold: float = 0.4) -> None:
        if not (isinstance(max_gamma, int) and max_gamma >= 1):
            raise SpectuneError(f"gamma={max_gamma!r} is invalid: the confidence policy's ceiling must be >= 1")
        if not 0.0 <= threshold <= 1.0:
            raise SpectuneError(f"threshold={threshold!r} is invalid: must be in [0, 1]")
        self.max_gamma, self.threshold = max_gamma, threshold

    def begin_cycle(self, batch_size: int) -> int:
        return self.max_gamma

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        return step.token_prob >= self.threshold

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "threshold": self.threshold}
