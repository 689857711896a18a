"""Draft-length (γ) policies. They see per-step draft signals and per-cycle outcomes, never model internals."""

from policies.base import CycleFeedback, DraftLengthPolicy, DraftStep
from policies.confidence import ConfidenceStop
from policies.fixed import FixedGamma, HFHeuristic, make_policy

__all__ = ["ConfidenceStop", "CycleFeedback", "DraftLengthPolicy", "DraftStep", "FixedGamma", "HFHeuristic",
           "make_policy"]
