"""AdaEDL (Agrawal, Jeon, Lee; arXiv 2410.18351): early draft stopping from an entropy-based lower bound on
the acceptance probability of the token just drafted, with the stopping threshold adapted online.

The bound: P(accept) ≥ 1 − √(c_e·H(q)) (H in nats). A row stops drafting once the bound falls below λ. λ moves
with the observed acceptance: the rate of each cycle (accepted / drafted over its rows) is compared with its
exponential moving average (weight ``beta``); a cycle below the average raises λ by ``epsilon`` (stop earlier),
one above lowers it (draft longer); λ stays in [``lam_min``, ``lam_max``]. That is the paper's idea; the
constants are this project's parameters (conf/policy/adaedl.yaml), not values taken from the paper.
"""

from __future__ import annotations

import torch

from spectune.engine.policy import CycleFeedback, DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError
from spectune.options import check_gamma


def _number(key: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise SpectuneError(f"policy.{key}={value!r} is invalid: must be a number in [{low}, {high}]")
    return float(value)


class AdaEDL(DraftLengthPolicy):
    """Per-row stop when 1 − √(c_e·H(q)) < λ; λ adapted from the acceptance of each cycle (see the module)."""

    name = "adaedl"
    tuning = ("c_e", (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0))  # tuned in replay before an evaluation
    signals = frozenset({"entropy"})

    def __init__(self, gamma: int, c_e: float, lam: float, epsilon: float, beta: float, lam_min: float,
                 lam_max: float) -> None:
        check_gamma(gamma, "the adaedl ceiling")
        self.c_e = _number("c_e", c_e, 1e-9, 1e9)
        self.lam_min = _number("lam_min", lam_min, 0.0, 1.0)
        self.lam_max = _number("lam_max", lam_max, self.lam_min, 1.0)
        self.start = _number("lam", lam, self.lam_min, self.lam_max)
        self.epsilon = _number("epsilon", epsilon, 0.0, 1.0)
        self.beta = _number("beta", beta, 0.0, 1.0)
        self.max_gamma = gamma
        self.reset()

    def reset(self) -> None:
        self.lam = self.start
        self.rate_avg: float | None = None

    def bound(self, entropy: torch.Tensor) -> torch.Tensor:
        """The entropy-based lower bound on the acceptance probability of the token just drafted."""
        return 1.0 - (self.c_e * entropy.clamp(min=0)).sqrt()

    def begin_cycle(self, batch_size: int) -> int:
        return self.max_gamma

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        return self.bound(step.entropy) >= self.lam

    def observe(self, feedback: CycleFeedback) -> None:
        drafted = sum(feedback.num_drafts)
        if drafted == 0:
            return
        rate = sum(feedback.num_accepted) / drafted
        if self.rate_avg is not None:
            step = self.epsilon if rate < self.rate_avg else -self.epsilon
            self.lam = min(self.lam_max, max(self.lam_min, self.lam + step))
        self.rate_avg = rate if self.rate_avg is None else self.beta * self.rate_avg + (1 - self.beta) * rate

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "c_e": self.c_e, "lam": self.start,
                "epsilon": self.epsilon, "beta": self.beta, "lam_min": self.lam_min, "lam_max": self.lam_max}
