"""The model draft's proposer: the draft model, its per-slot KV cache, and the γ tokens it proposes per cycle.

Invariant between cycles (the protocol's, ``proposer.py``): a row's cache holds every token of its sequence
*before* ``last`` (the newest emitted token, not yet fed to anyone), except for ``pending`` tokens it has not seen
yet: the final draft of a cycle that accepted all of its drafts (gpt-fast's observation that the draft never fed its
own last proposal), and every token of cycles that did not speculate (γ = 0: a plain target step). Pending tokens
are fed together with ``last`` in the next first step (left-padded).

A cycle is driven step by step (:meth:`DraftProposer.begin`, :meth:`~DraftProposer.step`,
:meth:`~DraftProposer.stop_rows`, :meth:`~DraftProposer.finish`) so a session or an environment can
decide after every draft step (the loop with a policy object is ``Session.step``).
"""

from __future__ import annotations

import torch

from spectune.engine.kv import SlotKV, prefill_slots
from spectune.engine.policy import DRAFT_SIGNALS, draft_signals
from spectune.engine.proposer import Proposal
from spectune.sampling import RowSampling, SamplingParams, draw, warp


class DraftProposer:
    """The draft model: proposes up to γ tokens per cycle, one :meth:`step` at a time."""

    reports = frozenset(DRAFT_SIGNALS)  # the signals its step computes when asked (a model draft has no match)
    first_draft = None  # no shadow acceptance test: a model draft has no chain to test without drafting

    def __init__(self, model: torch.nn.Module, kv: SlotKV, sampling: SamplingParams, vocab_size: int | None = None):
        # ``sampling``: the batch's law, one setting or one per slot (RowSampling); the session replaces it
        self.model, self.kv, self.sampling, self.device = model, kv, sampling, kv.device
        self.vocab_size = vocab_size
        # A head that declares its support (spectune.models.draft_vocab.ScatterHead): q is 0 outside those ids, so
        # the draft's signals need only those columns.
        self.support = getattr(getattr(model, "lm_head", None), "draft_to_target", None)
        self.pending = torch.zeros(kv.batch, 1, dtype=torch.long, device=self.device)
        self.pending_valid = torch.zeros(kv.batch, 1, dtype=torch.bool, device=self.device)
        self.any_pending = False  # host-side, so the first step's shape costs no device sync
        # Static (compiled) caches want one first-step shape: always feed [pending or dummy, last].
        self.fixed_shapes = getattr(kv, "fixed_shapes", False)

    def prefill(self, rows: list[int], prompts: list[list[int]], features: torch.Tensor | None = None,
                limits: list[int] | None = None) -> None:
        """Load prompts into slots ``rows`` (``features``: the target's, read only by a proposer that uses them;
        ``limits``: the requests' max_new_tokens, read only by a proposer that clips its chains)."""
        prefill_slots(self.model, self.kv, rows, prompts)
        self.pending_valid[rows] = False

    def begin(self, last: torch.Tensor) -> None:
        """Start a cycle after ``last`` [B] (the newest emitted tokens)."""
        self._open(last)
        if self.fixed_shapes or self.any_pending:
            self._feed = {"tokens": torch.cat([self.pending, last.unsqueeze(1)], dim=1),
                          "new_valid": torch.cat([self.pending_valid, torch.ones_like(self.pending_valid[:, :1])], 1)}
        else:
            self._feed = {"tokens": last.unsqueeze(1)}

    def _open(self, last: torch.Tensor) -> None:
        """A cycle's bookkeeping: where the cache stood, no drafts yet, every row drafting."""
        batch = last.shape[0]
        self._start_pos = self.kv.next_pos.clone()
        self._drafted: list[torch.Tensor] = []
        self._laws: list[torch.Tensor] = []
        self.running = torch.ones(batch, dtype=torch.bool, device=self.device)
        self._counted = torch.zeros(batch, dtype=torch.long, device=self.device)
        self._uncounted = 0  # steps since ``running`` last changed, not yet in ``_counted`` (no tensor op per step)
        self._cum_prob: torch.Tensor | None = None
        self._early_stop = False

    def step(self, uniforms: torch.Tensor | None, signals: frozenset[str] = frozenset()
             ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One draft step for every row: (drafted tokens [B], their law q [B, V], the requested signals)."""
        logits = self.kv.forward(self.model, **self._feed, last_only=True)[:, -1, : self.vocab_size]
        q = warp(logits, self.sampling)
        x = draw(q, self.sampling, uniforms=uniforms)
        self._drafted.append(x)
        self._laws.append(q)
        self._uncounted += 1
        out: dict[str, torch.Tensor] = {}
        if signals:  # most policies read none: no call, no lookups on the step's path
            out = draft_signals(q, x, signals, self._cum_prob, self.support)
            self._cum_prob = out.get("cum_prob", self._cum_prob)
        self._feed = self._next_feed(x)
        return x, q, out

    def _next_feed(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """What the next draft step feeds: this step's drafts (every row's is real: kv.forward's fast path)."""
        return {"tokens": x.unsqueeze(1)}

    def stop_rows(self, keep: torch.Tensor) -> torch.Tensor:
        """Rows where ``keep`` is False draft no further this cycle; returns the rows still drafting."""
        self._early_stop = True
        self._count()
        self.running = self.running & keep
        return self.running

    def _count(self) -> None:
        """Credit the steps taken since ``running`` last changed to the rows that were running."""
        if self._uncounted:
            self._counted = self._counted + self.running.long() * self._uncounted
            self._uncounted = 0

    @property
    def num_drafts(self) -> torch.Tensor:
        """[B] drafts each row took this cycle."""
        self._count()
        return self._counted

    def cut(self, kept: torch.Tensor) -> None:
        """Keep only the first ``kept[b]`` drafts of row b (a verification budget chosen after drafting).

        Drafts past a row's cut are never verified; if no row keeps any, the cycle becomes one without
        speculation: the cache returns to where the cycle began, so ``skip`` sees the same state as if
        nothing had been drafted.
        """
        deepest = int(kept.max())
        self._drafted, self._laws = self._drafted[:deepest], self._laws[:deepest]
        self._counted, self._uncounted = kept.to(self._counted), 0
        self.running = self.running & (kept > 0)
        self._early_stop = True
        if deepest == 0:
            self.kv.rollback(self._start_pos)

    @property
    def gamma(self) -> int:
        return len(self._drafted)

    def finish(self) -> Proposal:
        return Proposal(torch.stack(self._drafted, 1), torch.stack(self._laws, 1),
                        self.num_drafts if self._early_stop else None)

    def rollback(self, context_length: torch.Tensor, accepted: torch.Tensor, proposal: Proposal,
                 active: torch.Tensor, accepted_host: list[int], features: torch.Tensor | None = None) -> None:
        """Roll back to ``last`` + the accepted drafts it has fed; remember an unfed last draft as pending."""
        gamma_run = proposal.tokens.shape[1]
        fed = gamma_run - 1  # the final draft is sampled but never fed to the draft model
        next_pos = torch.where(active, context_length + 1 + accepted.clamp(max=fed), 0)
        self.kv.rollback(next_pos)
        rows = torch.arange(accepted.shape[0], device=self.device)
        self.pending = proposal.tokens[rows, (accepted - 1).clamp(min=0)].unsqueeze(1)
        self.pending_valid = (active & (accepted == gamma_run)).unsqueeze(1)
        self.any_pending = any(n == gamma_run for n in accepted_host)

    def skip(self, last: torch.Tensor, active: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """A cycle without speculation (γ = 0): the draft has not seen ``last`` either; it joins the pending."""
        self.pending = torch.cat([self.pending, last.unsqueeze(1)], dim=1)
        self.pending_valid = torch.cat([self.pending_valid, active.unsqueeze(1)], dim=1)
        self.any_pending = True

    def use_sampling(self, sampling: SamplingParams | RowSampling) -> None:
        """Warp the next steps' laws with ``sampling`` (one setting, or one per slot)."""
        self.sampling = sampling

    def clear(self, row: int) -> None:
        self.kv.clear(row)
        self.pending_valid[row] = False
