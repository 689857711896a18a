"""Draft-length (γ) policies. They see per-step draft signals and per-cycle outcomes, never model internals."""

from harness.engine.policy import CycleFeedback, DraftLengthPolicy, DraftStep, FixedGamma
from policies.confidence import ConfidenceStop
from policies.envs import register_envs
from policies.heuristic import HFHeuristic
from policies.registry import POLICIES, make_policy

__all__ = ["POLICIES", "ConfidenceStop", "CycleFeedback", "DraftLengthPolicy", "DraftStep", "FixedGamma",
           "HFHeuristic", "make_policy"]

register_envs()  # spectune/DraftDepth-v0 and spectune/VerifySize-v0 (when gymnasium is installed)
