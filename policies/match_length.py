"""Verify a model-free draft's chain only where its match is long: the baseline rule for prompt lookup and suffix
decoding.

A model-free draft copies what followed an earlier occurrence of the context's end; its proposal is a point mass, so
the draft-probability signals a policy such as ``confidence`` or ``svip`` reads say nothing (q(x) = 1, entropy 0).
What does vary is the match: a chain grown from a 1-token match copies a continuation that often is wrong, one grown
from a long match (a repeated phrase, an edited copy of the prompt) is usually right. The rule drafts to the ceiling γ
where the match length (:data:`spectune.engine.policy.MATCH_SIGNALS`'s ``match_length``) is at least k, and verifies
nothing elsewhere. It is what a learned policy reading the match signals (``policy=ppo`` with a file that names
them) must beat, and k is tuned in replay like the other thresholds (:mod:`policies.train.tuning`).
"""

from __future__ import annotations

import logging

import torch

from spectune.engine.policy import DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError
from spectune.options import check_gamma

log = logging.getLogger(__name__)

# The k tried in replay before an evaluation: 0 verifies every chain (the fixed γ), prompt lookup's matches reach its
# max_n (3 by default), suffix decoding's up to its tries' depth − 1 (23 by default).
MIN_MATCHES = (0, 1, 2, 3, 4, 5, 6, 8, 12, 16)


class MatchLength(DraftLengthPolicy):
    """Draft up to γ tokens (the grid's value is the ceiling) on rows whose chain matched at least ``min_match``
    tokens of the context's end; verify nothing on the others. Per row, stateless.

    A row with a short match is stopped after its first draft step and cut to no draft at the end of drafting
    (:meth:`end_drafting`): the chain is found at the first step, so nothing is known before it. The cut reads the
    draft only, never the target, so the sampler stays exact. Under a draft model there is no match (the
    signal is None): every row reads 0, so any ``min_match`` > 0 verifies nothing there (said once in the log).
    """

    name = "match-length"
    signals = frozenset({"match_length"})
    tuning = ("min_match", MIN_MATCHES)  # (parameter, values) tuned in replay before an evaluation

    def __init__(self, gamma: int, min_match: int) -> None:
        check_gamma(gamma, "the match-length ceiling")
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 0:
            raise SpectuneError(f"policy.min_match={min_match!r} is invalid: must be an integer >= 0 (the shortest "
                                "match, in tokens, whose chain is verified; 0: every chain)")
        self.max_gamma, self.min_match = gamma, min_match
        self._warned = False

    def begin_cycle(self, batch_size: int) -> int:
        return self.max_gamma

    def long_enough(self, step: DraftStep) -> torch.Tensor:
        """[B] bool: rows whose match covers at least ``min_match`` tokens (none under a draft model)."""
        if step.match_length is None:
            if not self._warned:
                log.warning("policy=match-length: this draft reports no match (a draft model): every row reads "
                            "match_length 0, so with min_match %d no chain is verified; use proposer=lookup or "
                            "proposer=suffix", self.min_match)
                self._warned = True
            return torch.full_like(step.active, self.min_match == 0)
        return step.match_length >= self.min_match

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        return self.long_enough(step)

    def end_drafting(self, step: DraftStep) -> list[int]:
        return [self.max_gamma if keep else 0 for keep in self.long_enough(step).tolist()]

    def describe(self) -> dict:
        return {"name": self.name, "max_gamma": self.max_gamma, "min_match": self.min_match}
