"""The scorer: the target model, its per-slot KV cache, and the laws p it assigns.

Between cycles a row's cache holds every token of its sequence *before* ``last`` (the newest
emitted token, not yet fed to anyone); :meth:`TargetScorer.score` feeds ``last`` and the drafts in
one causal forward.
"""

from __future__ import annotations

import torch

from spectune.engine.features import HiddenTap
from spectune.engine.kv import SlotKV, prefill_slots
from spectune.sampling import RowSampling, SamplingParams, select_rows, warp


class TargetScorer:
    """The target model: prefill, one autoregressive step, or scoring γ drafts in one forward.

    ``vocab_size`` keeps the first ids only (the tokenizer's): padding rows of the LM head are no token.
    """

    def __init__(self, model: torch.nn.Module, kv: SlotKV, sampling: SamplingParams | RowSampling,
                 vocab_size: int | None = None, keep_features: bool = False):
        # ``sampling``: the batch's law, one setting or one per slot; the session replaces it as requests come and go
        self.model, self.kv, self.sampling, self.device = model, kv, sampling, kv.device
        self.vocab_size = vocab_size
        # A draft that reads the target's features needs the last hidden state of every position fed: kept by a
        # hook on the final norm (computed anyway; no extra work).
        self._tap = HiddenTap.on(model) if keep_features else None

    @property
    def features(self) -> torch.Tensor | None:
        """The target's last hidden state at every position of the latest prefill or scoring forward, [B, n, H]
        (None unless the scorer keeps features)."""
        return self._tap.last if self._tap is not None else None

    def prefill(self, rows: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Load prompts into slots ``rows``; returns the laws of their first new tokens, [k, V]."""
        return warp(prefill_slots(self.model, self.kv, rows, prompts)[..., : self.vocab_size],
                    select_rows(self.sampling, rows))

    def score(self, last: torch.Tensor, drafts: torch.Tensor | None) -> torch.Tensor:
        """Laws p[b, 0..γ] after ``last`` and after each draft: one causal forward of γ+1 tokens."""
        tokens = last.unsqueeze(1) if drafts is None else torch.cat([last.unsqueeze(1), drafts], dim=1)
        logits = self.kv.forward(self.model, tokens)
        return warp(logits[..., : self.vocab_size], self.sampling)

    def rollback(self, next_pos: torch.Tensor) -> None:
        """Forget every column at or past ``next_pos`` (rejected drafts) in each row."""
        self.kv.rollback(next_pos)
