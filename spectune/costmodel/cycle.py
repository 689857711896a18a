"""A speculative cycle's two sides, each defined once: what it costs and how many tokens it is expected to emit.

A cycle drafts γ tokens, verifies them with one target forward over γ + 1 positions and pays its own overhead;
it emits the accepted prefix plus the target's one token. Its speed is E(γ) / cost(γ). Three places need both
sides: the replay and the environments (a profile's seconds, :class:`spectune.costmodel.profile.CycleCosts`), the
model-based policy (seconds it measures from its own cycles, as the same class) and the cost model
(:mod:`analysis.costmodel`, in units of one target step). Each says what drafting and verifying cost in its own
terms; :class:`CycleCost` adds them up, once, so that "a cycle" means the same sum everywhere.

Expected tokens: with P(first i drafts all accepted) = joint_i,

    E(γ) = 1 + Σ_{i=1..γ} joint_i                              (:func:`expected_tokens`, the definition)
         = 1 + Σ_{i=1..γ} Π_{j≤i} r_j                          (:func:`expected_tokens_from_rates`: r_j, the
                                                                 acceptance at position j given every earlier one)
         = Σ_{i=0..γ} α^i = (1 − α^(γ+1)) / (1 − α)            (:func:`expected_tokens_constant`: r_j = α)

The closed form is the special case of constant, independent acceptances; it is kept as a formula because α
just below 1 loses digits to cancellation in the sum's other spelling, and a sweep over α needs no array.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np


class CycleCost(ABC):
    """What one cycle costs, in one unit throughout (seconds for a profile or a measurement, target steps for the
    cost model): ``draft`` steps, the verification of the drafts plus one position, and the cycle's ``overhead``
    (what a cycle pays outside drafting and verification). Implementations say what the first two cost;
    :meth:`cycle` is their sum, the one definition of a cycle's cost. γ may be ints or arrays of them."""

    overhead: float

    @abstractmethod
    def draft(self, drafted: Any) -> Any:
        """The cost of ``drafted`` draft steps in one cycle (0 for none)."""

    @abstractmethod
    def verify(self, drafts: Any) -> Any:
        """The cost of verifying ``drafts`` drafts: a target forward over ``drafts`` + 1 positions."""

    def cycle(self, drafted: Any, verified: Any = None) -> Any:
        """A whole cycle: ``drafted`` draft steps, the verification of ``verified`` drafts (default: all drafted;
        a verification budget keeps fewer, a batch pads to its longest row) plus one position, and the overhead.
        Summed in this order everywhere, so that two callers of the same costs get the same bits."""
        return self.draft(drafted) + self.verify(drafted if verified is None else verified) + self.overhead

    @property
    def ar(self) -> Any:
        """One autoregressive step, what speculation is compared with: a target forward over one position (the
        verification of no drafts) and the overhead."""
        return self.verify(0) + self.overhead


def expected_tokens(joint: Any) -> np.ndarray:
    """E(γ) for γ = 0..len(joint): 1 + Σ_{i ≤ γ} joint_i, where joint_i = P(the first i drafts all accepted)
    (non-increasing, in [0, 1]). Summed left to right (a cumulative sum), so a prefix of the joint gives the same
    E as the whole."""
    return np.concatenate([[1.0], 1.0 + np.cumsum(joint)])


def expected_tokens_from_rates(rates: Any) -> np.ndarray:
    """E(γ) for γ = 0..len(rates) from per-position rates (rates_j: acceptance at position j given every earlier
    draft accepted): :func:`expected_tokens` of their running product, the joint."""
    return expected_tokens(np.cumprod(rates))


def expected_tokens_constant(alpha: float, gamma: int) -> float:
    """E(γ) = (1 − α^(γ+1)) / (1 − α) for a constant, independent acceptance α in [0, 1] (γ + 1 at α = 1): the
    special case of :func:`expected_tokens_from_rates` with every rate α. Written with expm1/log1p so that α just
    below 1 does not lose digits to cancellation. The caller validates α and γ (the cost model does, with its
    names)."""
    alpha, gamma = float(alpha), int(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    if alpha == 0.0:
        return 1.0
    return -math.expm1((gamma + 1) * math.log1p(alpha - 1)) / (1 - alpha)
