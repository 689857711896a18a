"""Static γ, and Hugging Face's classic heuristic schedule (a published adaptive baseline)."""

from __future__ import annotations

from harness.errors import SpectuneError
from policies.base import CycleFeedback, DraftLengthPolicy


class FixedGamma(DraftLengthPolicy):
    """Draft exactly γ tokens every cycle: the grid-search baseline everything is compared to."""

    name = "fixed"

    def __init__(self, gamma: int) -> None:
        if not (isinstance(gamma, int) and gamma >= 1):
            raise SpectuneError(f"gamma={gamma!r} is invalid: must be an integer >= 1")
        self.gamma = gamma

    def begin_cycle(self, batch_size: int) -> int:
        return self.gamma

    def describe(self) -> dict:
        return {"name": self.name, "gamma": self.gamma}


class HFHeuristic(DraftLengthPolicy):
    """transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 after a cycle in which every
    draft was accepted, else −1 (floor 1). Applied per batch: it grows only if all rows accepted all.
    """

    name = "hf-heuristic"

    def __init__(self, start: int = 5, max_gamma: int = 32) -> None:
        if start < 1 or max_gamma < start:
            raise SpectuneError(f"hf-heuristic start={start}, max_gamma={max_gamma}: need 1 <= start <= max_gamma")
        self.start, self.max_gamma, self.gamma = start, max_gamma, start

    def begin_cycle(self, batch_size: int) -> int:
        return self.gamma

    def observe(self, feedback: CycleFeedback) -> None:
        all_in = all(a == d for a, d in zip(feedback.num_accepted, feedback.num_drafts, strict=True))
        self.gamma = min(self.max_gamma, self.gamma + 2) if all_in else max(1, self.gamma - 1)

    def reset(self) -> None:
        self.gamma = self.start

    def describe(self) -> dict:
        return {"name": self.name, "start": self.start, "max_gamma": self.max_gamma}


def make_policy(name: str, gamma: int) -> DraftLengthPolicy:
    """Build a policy by config name; ``gamma`` is the fixed γ, the heuristic's start or the ceiling."""
    from policies.confidence import ConfidenceStop

    if name == "fixed":
        return FixedGamma(gamma)
    if name == "hf-heuristic":
        return HFHeuristic(start=gamma)
    if name == "confidence":
        return ConfidenceStop(max_gamma=gamma)
    raise SpectuneError(f"policy={name!r} is unknown: choose one of fixed, hf-heuristic, confidence")
