"""Proposer (draft) and scorer (target): each owns one model and its per-slot KV cache.

Invariant kept by both between cycles: a row's cache holds every token of its sequence *before*
``last`` (the newest emitted token, not yet fed to anyone). The draft may additionally lag by one
token (``extra``) after a cycle that accepted all of its drafts: gpt-fast's observation that the
draft never fed its own last proposal; it is fed together with ``last`` in the next first step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.engine.kv import SlotKV
from harness.sampling import SamplingParams, draw, warp
from policies.base import DraftLengthPolicy, DraftStep


def _prefill(model: torch.nn.Module, kv: SlotKV, rows: list[int], prompts: list[list[int]]) -> torch.Tensor:
    """Run newly admitted prompts through ``model`` as one batch and load them into slots ``rows``.

    Shorter prompts are left-padded with masked dummy columns (never attended), so every row's last
    token is in the last column and only that column's logits are computed. Returns them, [k, V].
    """
    longest = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), longest, dtype=torch.long)
    valid = torch.zeros(len(prompts), longest, dtype=torch.bool)
    for i, prompt in enumerate(prompts):
        tokens[i, longest - len(prompt):] = torch.tensor(prompt)
        valid[i, longest - len(prompt):] = True
    fresh = SlotKV(len(prompts), kv.device)
    logits = fresh.forward(model, tokens.to(kv.device), valid.to(kv.device), last_only=True)
    for i, row in enumerate(rows):
        kv.load_row(row, fresh, other_row=i)
    return logits[:, -1]


@dataclass
class Proposal:
    tokens: torch.Tensor  # [B, γ] drafted tokens
    probs: torch.Tensor  # [B, γ, V] the draft laws they were sampled from
    num_drafts: torch.Tensor | None  # [B] per-row count when a policy stopped rows early, else None


class TargetScorer:
    """The target model: prefill, one autoregressive step, or scoring γ drafts in one forward.

    ``vocab_size`` keeps the first ids only (the tokenizer's): padding rows of the LM head are no token.
    """

    def __init__(self, model: torch.nn.Module, kv: SlotKV, sampling: SamplingParams, vocab_size: int | None = None):
        self.model, self.kv, self.sampling, self.device = model, kv, sampling, kv.device
        self.vocab_size = vocab_size

    def prefill(self, rows: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Load prompts into slots ``rows``; returns the laws of their first new tokens, [k, V]."""
        return warp(_prefill(self.model, self.kv, rows, prompts)[..., : self.vocab_size],
                    self.sampling)

    def score(self, last: torch.Tensor, drafts: torch.Tensor | None) -> torch.Tensor:
        """Laws p[b, 0..γ] after ``last`` and after each draft: one causal forward of γ+1 tokens."""
        tokens = last.unsqueeze(1) if drafts is None else torch.cat([last.unsqueeze(1), drafts], dim=1)
        logits = self.kv.forward(self.model, tokens, torch.ones_like(tokens, dtype=torch.bool))
        return warp(logits[..., : self.vocab_size], self.sampling)

    def keep(self, next_pos: torch.Tensor) -> None:
        self.kv.rollback(next_pos)


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
        _prefill(self.model, self.kv, rows, prompts)
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
            keep = policy.continue_drafting(DraftStep(
                step=step, token_prob=q.gather(1, x.unsqueeze(1)).squeeze(1),
                entropy=-(q * q.clamp(min=1e-30).log()).sum(-1), active=running, context_length=context_length))
            if keep is not None:
                early_stop = True
                running = running & keep
                if not bool(running.any()):  # host sync, paid only by policies that stop early
                    break
            tokens, valid = x.unsqueeze(1), torch.ones(batch, 1, dtype=torch.bool, device=self.device)
        return Proposal(torch.stack(drafted, 1), torch.stack(laws, 1), num_drafts if early_stop else None)

    def keep(self, context_length: torch.Tensor, accepted: torch.Tensor, proposal: Proposal,
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
