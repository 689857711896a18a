"""The proposer of every model-free draft: a chain per row, found once per cycle and handed out a token per step.

What a draft proposes differs (prompt lookup's n-gram match, suffix decoding's tries, ...): that is its
:class:`ChainSource`, which a :class:`ChainSpec` (what stands in the engine's draft slot) makes per session. What
they share is here: the rows' histories and length budgets, the chains clipped before the stop ids and at the
request's length limit (the target never has to verify what it could not emit), a point-mass law per draft, the
per-row counts, the match signals, the shadow acceptance test, and the bookkeeping of the cycle contract
(``spectune/engine/proposer.py``).

Exact at any temperature: a proposal that is not sampled is a point mass, q = δ_x. Acceptance with
min(1, p(x)/q(x)) is then p(x), and the residual max(p − q, 0) normalised is (p − p(x)·δ_x)/(1 − p(x)), p being
the target's law after temperature, top-k and top-p. So the proposer hands the sampler an exactly one-hot q that
never goes through the sampling warp (a softmax of a one-hot at temperature T is no point mass), and the engine's
exact rejection sampler does the rest.

A point mass makes the q-derived signals degenerate (token_prob 1, entropy 0), so the proposer reports, when asked,
what its match was instead (:data:`~spectune.engine.policy.MATCH_SIGNALS`: the :class:`~.ngram.Chain` its source
found); a γ policy reads them to decide how much of a chain to verify.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Protocol

import torch

from spectune.engine.policy import MATCH_SIGNALS, SIGNALS, draft_signals
from spectune.engine.proposer import EngineParts, Proposal
from spectune.engine.proposers.ngram import Chain, clip, occurrences


class ChainSource(Protocol):
    """One session's chain finder: what a model-free draft proposes after a row's context."""

    def chain(self, row: int, context: list[int], width: int) -> Chain:
        """Row ``row``'s chain after ``context`` (its prompt, emitted tokens and ``last``), at most ``width`` tokens,
        with its match (before the stop ids and the length limit cut it)."""

    def reset(self, row: int) -> None:
        """Slot ``row`` takes a new request, or none: forget what was kept for the old one."""

    def found(self, chains: list[list[int] | None]) -> None:
        """The open cycle's chains as clipped, per row (None: an idle row, which looked for none)."""


class ChainSpec(Protocol):
    """What a model-free draft is, as its proposer reads it: the ids it never proposes, and its chain finder."""

    stop_ids: tuple[int, ...]

    def chains(self, batch: int) -> ChainSource:
        """A chain finder for one session over ``batch`` slots."""


class ChainProposer:
    """Proposes, per row, the chain its :class:`ChainSource` finds after the row's context; the session's
    :class:`~spectune.engine.proposer.Proposer`, with no model and no cache.

    The chain is found once per cycle (at :meth:`begin`) and handed out a token per :meth:`step`, so a policy still
    decides after every step. Rows whose chain ran out stop drafting; :meth:`finish` cuts the proposal to the
    longest chain, so the target verifies no position that no row proposed (0: a plain target step).
    """

    kv = None  # no draft cache: nothing to compact or roll back
    reports = frozenset(SIGNALS)  # the signals its step computes when asked: the q-derived and the match signals

    def __init__(self, spec: ChainSpec, batch: int, vocab_size: int, device: torch.device | str,
                 eos: Iterable[int] = ()) -> None:
        self.spec, self.batch, self.vocab_size, self.device = spec, batch, vocab_size, torch.device(device)
        self.source = spec.chains(batch)  # this session's chain finder (and whatever state it keeps per row)
        self.stop_ids = frozenset(eos) | frozenset(spec.stop_ids)
        self.history: list[list[int]] = [[] for _ in range(batch)]  # prompt + emitted tokens before ``last``
        self.budget: list[int] = [0] * batch  # tokens each row may still emit after ``last``
        self.support = None
        self.running = torch.zeros(batch, dtype=torch.bool, device=self.device)
        self.steps = 0

    @classmethod
    def on(cls, spec: ChainSpec, parts: EngineParts, batch: int) -> ChainProposer:
        """The proposer of ``spec`` for a session on ``parts``: q over the sampled vocabulary (the tokenizer's where
        the engine was told it, else the target's output width), the engine's EOS ids as stops."""
        width = parts.vocab_size or parts.target.get_output_embeddings().weight.shape[0]
        return cls(spec, batch, width, parts.device, parts.eos)

    # -- slots ---------------------------------------------------------------------------------------------
    def prefill(self, rows: list[int], prompts: list[list[int]], features: torch.Tensor | None = None,
                limits: list[int] | None = None) -> None:
        """Take the prompts of rows ``rows``; ``limits``: each request's max_new_tokens (none: no limit)."""
        for i, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
            self.history[row] = list(prompt)
            # the first token is emitted at admission: after it, limit − 1 remain (it becomes ``last``)
            self.budget[row] = (limits[i] - 1) if limits is not None else 1 << 30
        for row in rows:
            self.source.reset(row)

    def use_sampling(self, sampling: Any) -> None:
        """A point mass is the same law at any setting: nothing to warp."""

    def clear(self, row: int) -> None:
        self.history[row] = []
        self.budget[row] = 0
        self.source.reset(row)

    # -- one cycle -------------------------------------------------------------------------------------------
    def begin(self, last: torch.Tensor) -> None:
        """Find each row's chain after ``last`` (its newest emitted token) for at most the remaining budget."""
        width = 1 << 16  # a cycle's draft length is the policy's to choose; the chain is cut when it stops
        self._chains: list[list[int]] = []
        self._found: list[Chain] = []  # each row's clipped chain with its match: what the match signals report
        self._contexts: list[list[int]] = []  # each row's context, where its matches are counted if asked for
        self._last = last.tolist()  # joins the history at rollback, with the accepted drafts
        for row, token in enumerate(self._last):
            if not self.history[row]:
                self._chains.append([])
                self._found.append(Chain())
                self._contexts.append([])
                continue
            context = [*self.history[row], token]
            self._contexts.append(context)
            found = self.chain(row, context, width)
            chain = clip(list(found.tokens), self.stop_ids, self.budget[row] - 1)
            self._chains.append(chain)
            self._found.append(found.clipped(chain))
        self._tokens: list[torch.Tensor] = []
        self._laws: list[torch.Tensor] = []
        self._counts = [0] * self.batch
        self._host_running = [bool(chain) for chain in self._chains]
        self.running = torch.tensor(self._host_running, dtype=torch.bool, device=self.device)
        self.steps = 0
        self._cum_prob: torch.Tensor | None = None
        self.source.found([chain if self.history[row] else None for row, chain in enumerate(self._chains)])

    def chain(self, row: int, context: list[int], width: int) -> Chain:
        """Row ``row``'s chain after ``context`` (its prompt, emitted tokens and ``last``), at most ``width`` tokens,
        with its match, before the stop ids and the length limit cut it: the one place the draft is found (its
        source's)."""
        return self.source.chain(row, context, width)

    def first_draft(self, row: int, last: int) -> int | None:
        """The first token row ``row`` would draft after ``last`` had its cycle drafted (None: no chain), from the
        state before the cycle's rollback or skip: what a shadow acceptance test compares with the emitted token
        (:attr:`~spectune.engine.policy.CycleFeedback.shadow_accepted`)."""
        if not self.history[row]:
            return None
        chain = clip(list(self.chain(row, [*self.history[row], last], 1).tokens), self.stop_ids, self.budget[row] - 1)
        return chain[0] if chain else None

    def step(self, uniforms: torch.Tensor | None, signals: frozenset[str] = frozenset()
             ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The next token of every row's chain (a placeholder where it ran out: never verified), q = δ_x; the
        ``signals`` asked for by name, q-derived (degenerate for a point mass) and :data:`MATCH_SIGNALS`."""
        gamma = self.steps
        tokens = []
        for row, chain in enumerate(self._chains):
            has = self._host_running[row] and gamma < len(chain)
            self._host_running[row] = has
            if has:
                self._counts[row] += 1
            tokens.append(chain[gamma] if gamma < len(chain) else 0)
        x = torch.tensor(tokens, dtype=torch.long, device=self.device)
        q = torch.zeros(self.batch, self.vocab_size, device=self.device)
        q[torch.arange(self.batch, device=self.device), x] = 1.0
        self.running = torch.tensor(self._host_running, dtype=torch.bool, device=self.device)
        self._tokens.append(x)
        self._laws.append(q)
        self.steps += 1
        out = draft_signals(q, x, signals, self._cum_prob)
        self._cum_prob = out.get("cum_prob", self._cum_prob)
        wanted = signals & MATCH_SIGNALS.keys()
        if wanted:
            out.update(self.match_signals(gamma, wanted))
        return x, q, out

    def match_signals(self, index: int, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """The :data:`MATCH_SIGNALS` ``names`` of every row after draft step ``index`` (0-based) of the open cycle,
        [B] float32 each: the match's length and count at every step (0 on a row without a chain), the drafted
        token's score and the running product (0 where the row drafted nothing at this step)."""
        values: dict[str, list[float]] = {name: [] for name in names}
        if "matches" in values:  # counted once per cycle, and only when a policy reads them
            self._found = [replace(found, matches=occurrences(context, found.match_length)) if found.matches is None
                           else found for found, context in zip(self._found, self._contexts, strict=True)]
        for found, drafting in zip(self._found, self._host_running, strict=True):
            drafted = drafting and index < len(found.tokens)
            row = {"match_length": float(found.match_length), "matches": float(found.matches or 0),  # counted above
                   "suffix_score": (1.0 if found.scores is None else found.scores[index]) if drafted else 0.0,
                   "suffix_prob": (1.0 if found.probs is None else found.probs[index]) if drafted else 0.0}
            for name, column in values.items():
                column.append(row[name])
        return {name: torch.tensor(column, dtype=torch.float32, device=self.device) for name, column in values.items()}

    def stop_rows(self, keep: torch.Tensor) -> torch.Tensor:
        """Rows where ``keep`` is False draft no further this cycle; returns the rows still drafting."""
        flags = keep.tolist()
        self._host_running = [run and bool(k) for run, k in zip(self._host_running, flags, strict=True)]
        self.running = torch.tensor(self._host_running, dtype=torch.bool, device=self.device)
        return self.running

    def cut(self, kept: torch.Tensor) -> None:
        """Keep only the first ``kept[b]`` drafts of row b."""
        self._counts = [min(c, k) for c, k in zip(self._counts, kept.tolist(), strict=True)]
        self._host_running = [run and c > 0 for run, c in zip(self._host_running, self._counts, strict=True)]
        deepest = max(self._counts, default=0)
        self._tokens, self._laws = self._tokens[:deepest], self._laws[:deepest]
        self.steps = deepest

    @property
    def gamma(self) -> int:
        """Draft steps taken this cycle (rows may hold fewer drafts: :attr:`num_drafts`)."""
        return self.steps

    @property
    def num_drafts(self) -> torch.Tensor:
        return torch.tensor(self._counts, dtype=torch.long, device=self.device)

    def finish(self) -> Proposal:
        """The drafts up to the longest chain; a cycle where no row had one proposes nothing (γ = 0)."""
        deepest = max(self._counts, default=0)
        batch = self.batch
        if deepest == 0:
            return Proposal(torch.zeros(batch, 0, dtype=torch.long, device=self.device),
                            torch.zeros(batch, 0, self.vocab_size, device=self.device), self.num_drafts)
        return Proposal(torch.stack(self._tokens[:deepest], 1), torch.stack(self._laws[:deepest], 1),
                        self.num_drafts)

    def rollback(self, context_length: torch.Tensor, accepted: torch.Tensor, proposal: Proposal,
                 active: torch.Tensor, accepted_host: list[int], features: torch.Tensor | None = None) -> None:
        """``last`` and the accepted drafts join each active row's history."""
        tokens = proposal.tokens.tolist()
        counts = accepted.tolist()
        for row, on in enumerate(active.tolist()):
            if on:
                self._extend(row, [self._last[row], *tokens[row][: counts[row]]])

    def skip(self, last: torch.Tensor, active: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """A cycle without speculation: ``last`` joins each active row's history."""
        for row, (token, on) in enumerate(zip(last.tolist(), active.tolist(), strict=True)):
            if on:
                self._extend(row, [token])

    def _extend(self, row: int, tokens: list[int]) -> None:
        self.history[row].extend(tokens)
        self.budget[row] -= len(tokens)
