"""The proposer: the draft model, its per-slot KV cache, and the γ tokens it proposes per cycle.

Invariant between cycles: a row's cache holds every token of its sequence *before* ``last`` (the
newest emitted token, not yet fed to anyone). The draft may additionally lag by one token
(``extra``) after a cycle that accepted all of its drafts: gpt-fast's observation that the draft
never fed its own last proposal; it is fed together with ``last`` in the next first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.engine.kv import SlotKV, prefill_slots
from harness.engine.policy import DraftLengthPolicy, DraftStep, draft_signals
from harness.sampling import SamplingParams, draw, warp


@dataclass
class Proposal:
    tokens: torch.Tensor  # [B, γ] drafted tokens
    probs: torch.Tensor  # [B, γ, V] the draft laws they were sampled from
    num_drafts: torch.Tensor | None  # [B] per-row count when a policy stopped rows early, else None


class DraftProposer:
    """The draft model: proposes up to γ tokens per cycle, asking the policy after every step."""

    def __init__(self, model: torch.nn.Module, kv: SlotKV, sampling: SamplingParams, vocab_size: int | None = None):
        self.model, self.kv, self.sampling, self.device = model, kv, sampling, kv.device
        self.vocab_size = vocab_size
        self.extra = torch.zeros(kv.batch, dtype=torch.long, device=self.device)
        self.has_extra = torch.zeros(kv.batch, dtype=torch.bool, device=self.device)
        # Static (compiled) caches want one first-step shape: always feed [extra or dummy, last].
        self.fixed_shapes = getattr(kv, "fixed_shapes", False)

    def prefill(self, rows: list[int], prompts: list[list[int]]) -> None:
        prefill_slots(self.model, self.kv, rows, prompts)
        self.has_extra[rows] = False

    def propose(self, last: torch.Tensor, gamma: int, policy: DraftLengthPolicy, context_length: torch.Tensor,
                generator: torch.Generator | None) -> Proposal:
        batch = last.shape[0]
        if self.fixed_shapes or bool(self.has_extra.any()):
            tokens = torch.stack([self.extra, last], dim=1)
            valid = torch.stack([self.has_extra, torch.ones_like(self.has_extra)], dim=1)
        else:
            tokens, valid = last.unsqueeze(1), torch.ones(batch, 1, dtype=torch.bool, device=self.device)
        drafted, laws = [], []
        running = torch.ones(batch, dtype=torch.bool, device=self.device)
        num_drafts = torch.zeros(batch, dtype=torch.long, device=self.device)
        wanted = frozenset(policy.signals)
        cum_prob = None
        early_stop = False
        for step in range(gamma):
            logits = self.kv.forward(self.model, tokens, valid, last_only=True)[:, -1, : self.vocab_size]
            q = warp(logits, self.sampling)
            x = draw(q, self.sampling, generator)
            drafted.append(x)
            laws.append(q)
            num_drafts += running.long()
            if step == gamma - 1:
                break
            signals = draft_signals(q, x, wanted, cum_prob)
            cum_prob = signals.get("cum_prob")
            keep = policy.continue_drafting(DraftStep(step=step, active=running, context_length=context_length,
                                                      batch_size=batch, **signals))
            if keep is not None:
                early_stop = True
                running = running & keep
                if not bool(running.any()):  # host sync, paid only by policies that stop early
                    break
            tokens, valid = x.unsqueeze(1), torch.ones(batch, 1, dtype=torch.bool, device=self.device)
        return Proposal(torch.stack(drafted, 1), torch.stack(laws, 1), num_drafts if early_stop else None)

    def rollback(self, context_length: torch.Tensor, accepted: torch.Tensor, proposal: Proposal,
             active: torch.Tensor) -> None:
        """Roll back to ``last`` + the accepted drafts it has fed; remember an unfed last draft."""
        gamma_run = proposal.tokens.shape[1]
        fed = gamma_run - 1  # the final draft is sampled but never fed to the draft model
        next_pos = torch.where(active, context_length + 1 + accepted.clamp(max=fed), 0)
        self.kv.rollback(next_pos)
        self.has_extra = active & (accepted == gamma_run)
        rows = torch.arange(accepted.shape[0], device=self.device)
        self.extra = proposal.tokens[rows, (accepted - 1).clamp(min=0)]

    def clear(self, row: int) -> None:
        self.kv.clear(row)
        self.has_extra[row] = False
