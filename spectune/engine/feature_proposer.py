"""The proposer for a draft that reads the target's features (EAGLE-style drafts).

The draft's cache holds *entries*: entry j pairs token x_j with the feature f_{j-1} of the position before it,
and its output predicts f_j, hence the law of x_{j+1}. At a cycle's first draft step every feature fed is the
target's; each later step feeds the drafted token with the draft's own predicted feature.

Invariant between cycles: a row's cache holds the entries of every token before ``last`` whose feature is the
target's, except ``pending`` ones: the accepted drafts of the last cycle (fed during it with predicted features,
so rolled back and fed again with the target's, which the verification has just computed), and every token of
cycles that did not speculate. ``pending_features`` has one column more than ``pending``: its last column is
the feature that goes with ``last``. The next first step feeds them all, left-padded, with ``last``.
"""

from __future__ import annotations

import torch

from spectune.engine.features import HiddenTap
from spectune.engine.kv import SlotKV, prefill_slots
from spectune.engine.model_proposer import DraftProposer
from spectune.sampling import SamplingParams


class FeatureProposer(DraftProposer):
    """Proposes up to γ tokens per cycle from the target's features (same cycle interface as the plain proposer)."""

    def __init__(self, model: torch.nn.Module, kv: SlotKV, sampling: SamplingParams, vocab_size: int | None = None):
        super().__init__(model, kv, sampling, vocab_size)
        assert not self.fixed_shapes, "a draft that reads features runs on dynamic caches only"
        self.tap = HiddenTap.on(model)  # the draft's own predicted feature f̂, fed at its next step
        hidden = model.config.hidden_size
        self.pending = torch.zeros(kv.batch, 0, dtype=torch.long, device=self.device)
        self.pending_valid = torch.zeros(kv.batch, 0, dtype=torch.bool, device=self.device)
        self.pending_features = torch.zeros(kv.batch, 1, hidden, dtype=model.dtype, device=self.device)

    def prefill(self, rows: list[int], prompts: list[list[int]], features: torch.Tensor | None = None,
                limits: list[int] | None = None) -> None:
        """Load prompts: entries x_1..x_{P-1} with the target's f_0..f_{P-2}; f_{P-1} goes with the first token.

        ``features``: the target's prefill features, [len(rows), longest prompt, H], left-padded."""
        assert features is not None, "the target's prefill features are needed"
        assert min(map(len, prompts)) >= 2, "a prompt of one token has no entry to feed"
        width = features.shape[1]
        feats = [features[i, width - len(p): width - 1].to(self.pending_features.dtype) for i, p in enumerate(prompts)]
        prefill_slots(self.model, self.kv, rows, [p[1:] for p in prompts], feats)
        self.pending_valid[rows] = False
        self.pending_features[rows, -1] = features[:, -1].to(self.pending_features.dtype)

    def begin(self, last: torch.Tensor) -> None:
        self._open(last)
        tokens = torch.cat([self.pending, last.unsqueeze(1)], dim=1)
        valid = torch.cat([self.pending_valid, torch.ones_like(last, dtype=torch.bool).unsqueeze(1)], dim=1) \
            if self.any_pending else None
        self._feed = {"tokens": tokens, "new_valid": valid, "features": self.pending_features}
        self._after_first: torch.Tensor | None = None

    def _next_feed(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """This step's drafts with the draft's own predicted feature f̂ (the step just run computed it)."""
        if self._after_first is None:  # the entries up to ``last`` carry the target's features: kept at rollback
            self._after_first = self.kv.next_pos.clone()
        return {"tokens": x.unsqueeze(1), "features": self.tap.last[:, -1:]}

    def rollback(self, context_length: torch.Tensor, accepted: torch.Tensor, proposal, active: torch.Tensor,
                 accepted_host: list[int], features: torch.Tensor | None = None) -> None:
        """Keep the entries fed at the first step (the target's features); the accepted drafts and the new ``last``
        become pending, each with the feature the verification computed for the position before it.

        ``features``: the verification's target features [B, γ + 1, H] (at ``last`` and each draft)."""
        assert features is not None, "the verification's target features are needed"
        self.kv.rollback(torch.where(active, self._after_first, 0))
        deepest = max(accepted_host, default=0)
        # column k of the new pending block holds the cycle's entry i = k - (deepest - accepted): left-padded
        index = torch.arange(deepest + 1, device=self.device).unsqueeze(0) - (deepest - accepted).unsqueeze(1)
        gather = index.clamp(min=0)
        self.pending_features = features.gather(1, gather.unsqueeze(-1).expand(-1, -1, features.shape[-1])) \
            .to(self.pending_features.dtype)
        self.pending = proposal.tokens.gather(1, gather[:, :deepest].clamp(max=proposal.tokens.shape[1] - 1))
        self.pending_valid = (index[:, :deepest] >= 0) & active.unsqueeze(1)
        self.any_pending = deepest > 0

    def skip(self, last: torch.Tensor, active: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """A cycle without speculation: ``last`` joins the pending with its feature; the target's feature at
        ``last`` (``features`` [B, 1, H]) goes with the new last token."""
        assert features is not None, "the target step's features are needed"
        self.pending = torch.cat([self.pending, last.unsqueeze(1)], dim=1)
        self.pending_valid = torch.cat([self.pending_valid, active.unsqueeze(1)], dim=1)
        self.pending_features = torch.cat([self.pending_features, features[:, -1:].to(self.pending_features.dtype)],
                                          dim=1)
        self.any_pending = True

