"""A draft that needs no model: prompt lookup (n-gram matching over the prompt and the text generated so far).

The suffix of a row's context (its last n tokens, n from ``max_n`` down to ``min_n``) is looked up in the context
itself; the tokens that followed its earliest match with a non-empty continuation are proposed, up to the cycle's
length. This is transformers' ``PromptLookupCandidateGenerator`` (``prompt_lookup_num_tokens``,
``max_matching_ngram_size``; it fixes ``min_n`` at 1) and vLLM's ``ngram`` method (``prompt_lookup_min``/``max``).

Exact at any temperature: a proposal that is not sampled is a point mass, q = δ_x. Acceptance with
min(1, p(x)/q(x)) is then p(x), and the residual max(p − q, 0) normalised is (p − p(x)·δ_x)/(1 − p(x)), p being
the target's law after temperature, top-k and top-p. So the proposer hands the sampler an exactly one-hot q that
never goes through the sampling warp (a softmax of a one-hot at temperature T is no point mass), and the engine's
exact rejection sampler does the rest.

A chain stops before the first stop token (end of sequence, chat-template tokens) and at the request's length
limit: the target never has to verify what it could not emit.

A point mass makes the q-derived signals degenerate (token_prob 1, entropy 0), so the proposer reports, when asked,
what its match was instead (:data:`~spectune.engine.policy.MATCH_SIGNALS`): the n that matched and how many earlier
occurrences of those n tokens the context holds (:func:`lookup_chain`, :class:`Chain`); a γ policy reads them to
decide how much of a chain to verify.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from spectune.engine.policy import MATCH_SIGNALS, SIGNALS, draft_signals
from spectune.engine.proposer import Proposal
from spectune.errors import SpectuneError


@dataclass(frozen=True)
class PromptLookup:
    """What a prompt-lookup draft is: the n-gram sizes it matches and the ids it never proposes.

    It stands where a draft model would (``Engine(target, PromptLookup(...))``); the engine builds its proposer.
    """

    max_n: int = 3
    min_n: int = 1
    stop_ids: tuple[int, ...] = ()  # besides the engine's EOS ids: e.g. the tokenizer's special (template) ids

    name = "prompt-lookup"

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise SpectuneError(f"prompt lookup needs 1 <= min_n <= max_n, got min_n={self.min_n}, "
                                f"max_n={self.max_n}")


@dataclass(frozen=True)
class Chain:
    """A model-free draft's chain after a context, with what its match was (the sources of
    :data:`~spectune.engine.policy.MATCH_SIGNALS`): the length of the context's end it matched, how many earlier
    occurrences of that end are followed by a token, and each token's frequency score (``None``: prompt lookup, which
    copies one occurrence, scores 1 each). A chain without tokens reports no match (0, 0)."""

    tokens: tuple[int, ...] = ()
    match_length: int = 0
    matches: int | None = 0  # None: not counted yet (:func:`occurrences` counts them)
    scores: tuple[float, ...] | None = None
    probs: tuple[float, ...] | None = None  # the running products of the scores (None: 1 each)

    def clipped(self, tokens: Sequence[int]) -> Chain:
        """This match with its chain cut to ``tokens`` (a prefix: :func:`clip`); no tokens left: no match."""
        if not tokens:
            return Chain()
        cut = len(tokens)
        scores = None if self.scores is None else self.scores[:cut]
        probs = None if self.probs is None else self.probs[:cut]
        return Chain(tuple(tokens), self.match_length, self.matches, scores, probs)


def occurrences(context: Sequence[int], n: int, start: int = 0) -> int:
    """Occurrences of the context's last ``n`` tokens that begin at ``start`` or later and are followed by a token
    (the suffix itself is not one): prompt lookup's ``matches``."""
    size = len(context)
    suffix = list(context[size - n:])
    first = suffix[0]
    return sum(1 for at in range(start, size - n) if context[at] == first and list(context[at:at + n]) == suffix)


def lookup_chain(context: Sequence[int], max_n: int, min_n: int, length: int, count: bool = True) -> Chain:
    """:func:`lookup`'s chain with its match: the n that matched (``match_length``) and the number of earlier
    occurrences of the context's last n tokens (``matches``; each is followed by a token, the suffix itself is not
    counted). The chain is the earliest occurrence's continuation, as :func:`lookup` returns it. No match (or
    ``length`` <= 0): the empty :class:`Chain`. ``count=False`` stops at the earliest occurrence, as :func:`lookup`
    does, and leaves ``matches`` None (:func:`occurrences` counts them when they are wanted)."""
    size = len(context)
    if length <= 0:
        return Chain()
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = list(context[size - n:])
        first = suffix[0]
        for start in range(size - n):  # the suffix itself (start = size - n) has no continuation
            if context[start] == first and list(context[start:start + n]) == suffix:
                tokens = tuple(context[start + n: min(start + n + length, size)])
                return Chain(tokens, n, 1 + occurrences(context, n, start + 1) if count else None)
    return Chain()


def lookup(context: Sequence[int], max_n: int, min_n: int, length: int) -> list[int]:
    """Up to ``length`` tokens that followed the earliest earlier occurrence of the context's last n tokens.

    n runs from ``max_n`` (at most ``len(context) - 1``) down to ``min_n``; the first n with a match whose
    continuation is non-empty wins (transformers' rule: left to right, longest n first). [] when nothing matches.
    :func:`lookup_chain` gives the same chain with its match.
    """
    return list(lookup_chain(context, max_n, min_n, length, count=False).tokens)


def clip(chain: list[int], stop_ids: Iterable[int], limit: int) -> list[int]:
    """The chain before its first stop token, at most ``limit`` tokens long."""
    stops = set(stop_ids)
    for i, token in enumerate(chain):
        if token in stops:
            chain = chain[:i]
            break
    return chain[:max(limit, 0)]


class LookupProposer:
    """Proposes, per row, the continuation of the longest earlier n-gram match; same cycle interface as the
    model proposers (:class:`~spectune.engine.proposer.DraftProposer`), with no model and no cache.

    The chain is found once per cycle (at :meth:`begin`) and handed out a token per :meth:`step`, so a policy still
    decides after every step. Rows whose chain ran out stop drafting; :meth:`finish` cuts the proposal to the
    longest chain, so the target verifies no position that no row proposed (0: a plain target step).
    """

    kv = None  # no draft cache: nothing to compact or roll back
    reports = frozenset(SIGNALS)  # the signals its step computes when asked: the q-derived and the match signals

    def __init__(self, spec: PromptLookup, batch: int, vocab_size: int, device: torch.device,
                 eos: Iterable[int] = ()) -> None:
        self.spec, self.batch, self.vocab_size, self.device = spec, batch, vocab_size, torch.device(device)
        self.stop_ids = frozenset(eos) | frozenset(spec.stop_ids)
        self.history: list[list[int]] = [[] for _ in range(batch)]  # prompt + emitted tokens before ``last``
        self.budget: list[int] = [0] * batch  # tokens each row may still emit after ``last``
        self.support = None
        self.running = torch.zeros(batch, dtype=torch.bool, device=self.device)
        self.steps = 0

    # -- slots ---------------------------------------------------------------------------------------------
    def prefill(self, rows: list[int], prompts: list[list[int]], features: torch.Tensor | None = None,
                limits: list[int] | None = None) -> None:
        """Take the prompts of rows ``rows``; ``limits``: each request's max_new_tokens (none: no limit)."""
        for i, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
            self.history[row] = list(prompt)
            # the first token is emitted at admission: after it, limit − 1 remain (it becomes ``last``)
            self.budget[row] = (limits[i] - 1) if limits is not None else 1 << 30

    def clear(self, row: int) -> None:
        self.history[row] = []
        self.budget[row] = 0

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

    def chain(self, row: int, context: list[int], width: int) -> Chain:
        """Row ``row``'s chain after ``context`` (its prompt, emitted tokens and ``last``), at most ``width`` tokens,
        with its match, before the stop ids and the length limit cut it: the one place the draft is found, so another
        model-free draft is this proposer with this method replaced (``suffix.py``)."""
        return lookup_chain(context, self.spec.max_n, self.spec.min_n, width, count=False)  # counted if asked for

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


def copyable_fraction(prompt: Sequence[int], output: Sequence[int], n: int = 3) -> float:
    """Share of ``output``'s tokens that lie inside an n-gram of the output that occurred earlier, in the prompt or
    in the output before it: the tokens prompt lookup with matches of at least n could have copied (0.0 for an
    output shorter than n)."""
    text = [*prompt, *output]
    start = len(prompt)
    seen = {tuple(text[i:i + n]) for i in range(start - n + 1)}
    covered = [False] * len(output)
    for i in range(start, len(text) - n + 1):
        gram = tuple(text[i:i + n])
        if gram in seen:
            for j in range(i - start, i - start + n):
                covered[j] = True
        seen.add(gram)
    return sum(covered) / len(output) if output else 0.0


def replay_greedy(prompt: Sequence[int], output: Sequence[int], gamma: int, spec: Any,
                  max_new_tokens: int, eos: Iterable[int] = (),
                  chain_of: Callable[[list[int], int], list[int]] | None = None) -> list[tuple[int, int]]:
    """(drafted, accepted) per cycle of greedy decoding with a model-free draft at a fixed ``gamma``, from the
    target's own greedy ``output`` (what autoregressive decoding emits; its first token comes at admission).

    Greedy verification accepts a draft iff it is the token the target would emit, so the cycles are known without
    running the target: this is what the engine does (tests compare them cycle by cycle), and with a cost per
    verified length it predicts the speed-up before any timing. ``chain_of(context, length)`` is the draft's chain
    after ``context`` (default: prompt lookup's with ``spec``); a draft with state of its own, suffix decoding's
    per-request trie, passes its own (:func:`spectune.engine.suffix.request_chains`).
    """
    if chain_of is None:
        def chain_of(context: list[int], length: int) -> list[int]:
            return lookup(context, spec.max_n, spec.min_n, length)
    stops = frozenset(eos) | frozenset(spec.stop_ids)
    cycles: list[tuple[int, int]] = []
    position = 1
    while position < len(output):
        context = [*prompt, *output[:position]]
        chain = clip(chain_of(context, gamma), stops, max_new_tokens - position - 1)
        accepted = 0
        while accepted < len(chain) and position + accepted < len(output) \
                and chain[accepted] == output[position + accepted]:
            accepted += 1
        cycles.append((len(chain), accepted))
        position += accepted + 1
    return cycles
