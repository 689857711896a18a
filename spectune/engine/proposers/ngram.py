"""The n-gram search of prompt lookup: the earliest earlier occurrence of the context's last n tokens, and what
follows it.

The suffix of a context (its last n tokens, n from ``max_n`` down to ``min_n``) is looked up in the context itself;
the tokens that followed its earliest match with a non-empty continuation are the chain. This is transformers'
``PromptLookupCandidateGenerator`` (``prompt_lookup_num_tokens``, ``max_matching_ngram_size``; it fixes ``min_n``
at 1) and vLLM's ``ngram`` method (``prompt_lookup_min``/``max``). :class:`Chain` is any model-free draft's chain
with what its match was (the sources of the match signals); :func:`clip` cuts a chain at the stop ids and the
request's length limit. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


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
