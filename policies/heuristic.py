"""Hugging Face's classic heuristic schedule for the number of assistant tokens (a published baseline)."""

from __future__ import annotations

from harness.engine.policy import CycleFeedback, DraftLengthPolicy
from harness.errors import SpectuneError


class HFHeuristic(DraftLengthPolicy):
    """transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 after a cycle in which every
    draft was accepted, else −1 (floor 1). Applied per batch: it grows only if all rows accepted all.
    The grid's γ is the start value; ``max_gamma`` caps growth.
    """

    name = "hf-heuristic"

    def __init__(self, gamma: int, max_gamma: int) -> None:
        if not (isinstance(gamma, int) and isinstance(max_gamma, int) and 1 <= gamma <= max_gamma):
            raise SpectuneError(f"hf-heuristic gamma={gamma!r}, policy.max_gamma={max_gamma!r} are invalid: "
                                "need integers with 1 <= gamma <= max_gamma")
        self.start, self.max_gamma, self.gamma = gamma, max_gamma, gamma

    def begin_cycle(self, batch_size: int) -> int:
        return self.gamma

    def observe(self, feedback: CycleFeedback) -> None:
        all_in = all(a == d for a, d in zip(feedback.num_accepted, feedback.num_drafts, strict=True))
        self.gamma = min(self.max_gamma, self.gamma + 2) if all_in else max(1, self.gamma - 1)

    def reset(self) -> None:
        self.gamma = self.start

    def describe(self) -> dict:
        return {"name": self.name, "start": self.start, "max_gamma": self.max_gamma}
