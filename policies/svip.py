"""SVIP: stop drafting when the draft's entropy says the next token is unlikely to be accepted.

SVIP (self-verification length policy) bounds the acceptance of a draft token by the entropy of the draft law and
stops a row's drafting once √H(q) exceeds a threshold h (≈ 0.3 in a public implementation). Training-free.
"""

from __future__ import annotations

import torch

from spectune.engine.policy import DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError
from spectune.options import check_gamma


class SVIP(DraftLengthPolicy):
    """Draft up to γ tokens (the grid's value is the ceiling); a row stops after a step with √H(q) > ``h``
    (entropy in nats). Per row, stateless."""

    name = "svip"
    tuning = ("h", (0.3, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0))  # bounds √entropy: √H ≈ 2.4 on a flat draft
    signals = frozenset({"entropy"})

    def __init__(self, gamma: int, h: float) -> None:
        check_gamma(gamma, "the svip ceiling")
        if isinstance(h, bool) or not isinstance(h, int | float) or not h > 0:
            raise SpectuneError(f"policy.h={h!r} is invalid: must be a number > 0 (a bound on sqrt(entropy in nats))")
        self.max_gamma, self.h = gamma, float(h)

    def begin_cycle(self, batch_size: int) -> int:
        return self.max_gamma

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        return step.entropy.clamp(min=0).sqrt() <= self.h

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "h": self.h}
