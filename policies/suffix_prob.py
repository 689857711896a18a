"""Verify a suffix-decoding chain only as far as its scores stay high: the threshold rule a learned policy on
suffix-decoding traces must beat.

A suffix-decoding chain (:mod:`spectune.engine.proposers.suffix`) is found whole at its first draft step and comes
with a score per token, count(child)/count(node), and their running product (``MATCH_SIGNALS``' ``suffix_score`` and
``suffix_prob``). SuffixDecoding (Oliaro et al.) grows the chain while that product stays at or above
``min_token_prob`` (0.1 by default, ``proposer.min_token_prob``) and caps it at ⌊``max_spec_factor`` · match length⌋
(``proposer.adaptive``); both happen inside the proposer, before it picks the best-scoring chain. This policy raises
the first threshold after the pick: it verifies the chain's prefix whose running product is at least ``min_prob``, a
value tuned in replay on the training traces like the other thresholds (:mod:`policies.train.tuning`). It cuts what
the draft proposed, reading the draft alone (never the target), so the sampler stays exact. Under a draft of another
kind the signal is missing: every row reads 0, so nothing is verified (said once in the log).
"""

from __future__ import annotations

import logging

import torch

from spectune.engine.policy import DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError
from spectune.options import check_gamma

log = logging.getLogger(__name__)

# The values tried in replay before an evaluation; 0.1 is the proposer's default min_token_prob (it cuts nothing the
# proposer grew).
MIN_PROBS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


class SuffixProb(DraftLengthPolicy):
    """Verify, up to the ceiling γ, the prefix of each row's chain whose running score product (``suffix_prob``) is
    at least ``min_prob``; a row stops drafting at the first token below it, and that token is cut at the end of
    drafting. Per row, stateless across cycles."""

    name = "suffix-prob"
    signals = frozenset({"suffix_prob"})
    tuning = ("min_prob", MIN_PROBS)  # (parameter, values) tuned in replay before an evaluation

    def __init__(self, gamma: int, min_prob: float) -> None:
        check_gamma(gamma, "the suffix-prob ceiling")
        if isinstance(min_prob, bool) or not isinstance(min_prob, int | float) or not 0.0 <= min_prob <= 1.0:
            raise SpectuneError(f"policy.min_prob={min_prob!r} is invalid: must be a number in [0, 1] (the lowest "
                                "running product of a chain's scores that is still verified)")
        self.max_gamma, self.min_prob = gamma, float(min_prob)
        self._kept: torch.Tensor | None = None  # [B] tokens kept so far this cycle
        self._counted = -1  # the last draft step already counted
        self._warned = False

    def begin_cycle(self, batch_size: int) -> int:
        self._kept, self._counted = None, -1
        return self.max_gamma

    def _count(self, step: DraftStep) -> torch.Tensor:
        """[B] bool: rows whose token at ``step`` is kept; added to the cycle's counts once per step."""
        if step.suffix_prob is None:
            if not self._warned:
                log.warning("policy=suffix-prob: this draft reports no suffix_prob (it is not suffix decoding): "
                            "every row reads 0, so no chain is verified; use proposer=suffix")
                self._warned = True
            ok = torch.zeros_like(step.active)
        else:
            ok = step.active & (step.suffix_prob >= self.min_prob)
        if step.step != self._counted:
            self._kept = ok.long() if self._kept is None else self._kept + ok.long()
            self._counted = step.step
        return ok

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        return self._count(step)

    def end_drafting(self, step: DraftStep) -> list[int]:
        self._count(step)
        return self._kept.tolist()

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "min_prob": self.min_prob}
