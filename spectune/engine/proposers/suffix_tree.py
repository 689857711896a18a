"""Suffix tries and the suffix-decoding rule (SuffixDecoding, Oliaro et al.; Arctic Inference's
``SuffixDecodingCache``, through which vLLM's ``suffix`` method runs).

A suffix trie of bounded depth counts every substring of what it holds, up to ``depth`` tokens, with its number of
occurrences (:class:`SuffixTrie`). A proposal (:func:`speculate`, Arctic's ``_speculate_path`` rule): for every
match length m = 1, 2, … (the last m tokens of the context, at most ``depth − 1``) while the trie holds them, grow a
single chain from the matched node greedily by its most frequent child, each token scored count(child)/count(node);
the chain stops when the running product of those scores falls below ``min_token_prob`` or at its length cap. The
chain kept is the one with the highest score (the sum of the running products: the expected number of accepted
tokens if the scores were the acceptance probabilities), the longest match among equal scores. The pure longest
match would be the context's own occurrence in a per-request trie, which has no continuation. The length cap is
``max_gamma``, and with ``adaptive`` (SuffixDecoding's own rule) also ⌊``max_spec_factor`` · m⌋, as
arctic-inference's ``SuffixDecodingCache`` rounds it (its ``int(m · factor + 1e-6)``): a short match drafts little.

The tries are plain dicts of children with counts: O(tokens · depth) nodes, fine for a training split of some 10⁵
tokens; Arctic's path-compressed suffix tree is O(tokens). Among children of equal count the one created first is
taken (Arctic keeps its own order among ties, which can differ after later increments). Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from spectune.errors import SpectuneError


class Node:
    """A trie node: how many times its substring occurs, and its children by next token (in order of creation)."""

    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, Node] = {}


class SuffixTrie:
    """Every substring of the sequences added, up to ``depth`` tokens, with its number of occurrences.

    :meth:`extend` appends tokens to the open sequence (each new token ends one substring of each length 1..depth);
    :meth:`start` opens a new sequence (no substring spans two); :meth:`freeze` makes it read-only.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = Node()
        self.size = 0  # tokens of the open sequence
        self.frozen = False
        self._tails = [self.root]  # the nodes of the open sequence's suffixes of length 0 .. depth − 1

    @classmethod
    def of(cls, sequences: Iterable[Sequence[int]], depth: int) -> SuffixTrie:
        """A frozen trie of ``sequences``, each its own sequence."""
        trie = cls(depth)
        for sequence in sequences:
            trie.start()
            trie.extend(sequence)
        trie.freeze()
        return trie

    def start(self) -> None:
        self._check_open()
        self.size, self._tails = 0, [self.root]

    def freeze(self) -> None:
        self.frozen, self._tails = True, []

    def extend(self, tokens: Iterable[int]) -> None:
        self._check_open()
        for token in tokens:
            token = int(token)
            self.root.count += 1
            tails = [self.root]
            for node in self._tails:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                child.count += 1
                tails.append(child)
            self._tails = tails[: self.depth]
            self.size += 1

    def find(self, tokens: Sequence[int]) -> Node | None:
        """The node of ``tokens`` (None when they never occur)."""
        node = self.root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def _check_open(self) -> None:
        if self.frozen:
            raise SpectuneError("the global suffix tree is frozen: evaluation outputs never enter it")


@dataclass(frozen=True)
class Draft:
    """One chain: its tokens, each token's frequency score count(child)/count(node), the running products of those
    scores (Arctic's ``probs``), the match length it grew from and the trie that proposed it."""

    tokens: tuple[int, ...] = ()
    scores: tuple[float, ...] = ()
    probs: tuple[float, ...] = ()
    match_length: int = 0
    source: str = "none"  # "request", "global", or "none" (no chain)
    matches: int = 0  # occurrences of the matched suffix followed by a token: the sum of its node's children's counts

    @property
    def score(self) -> float:
        """The sum of the running products: what the chains compete on."""
        return sum(self.probs)


TIE = 1e-9  # scores this close are equal: sums of running products round (6 × 1/3 is not 2 in binary floating point)


def grow(node: Node, length: int, min_token_prob: float) -> tuple[list[int], list[float], list[float]]:
    """The chain from ``node`` by most frequent child, at most ``length`` tokens, while the running product of the
    scores count(child)/count(node) stays at least ``min_token_prob``: (tokens, scores, running products)."""
    tokens: list[int] = []
    scores: list[float] = []
    probs: list[float] = []
    prob = 1.0
    while len(tokens) < length and node.children:
        token, child = max(node.children.items(), key=lambda item: item[1].count)  # the first among equals
        score = child.count / node.count
        prob *= score
        if prob < min_token_prob:
            break
        tokens.append(token)
        scores.append(score)
        probs.append(prob)
        node = child
    return tokens, scores, probs


def speculate(trie: SuffixTrie, context: Sequence[int], max_gamma: int, min_token_prob: float = 0.1,
              max_spec_factor: float = 1.0, adaptive: bool = True, source: str = "request") -> Draft:
    """The best chain ``trie`` proposes after ``context`` (the module's rule): over match lengths m from 1 to
    min(len(context), depth) − 1 while the trie holds the context's last m tokens, the chain of highest score, the
    longest match among equal ones; capped at ``max_gamma`` tokens and, when ``adaptive``, at
    ⌊max_spec_factor · m⌋. A Draft with no tokens when no match grows any."""
    context = list(context[-trie.depth:])
    best, matched = Draft(), None
    for m in range(1, len(context)):
        node = trie.find(context[len(context) - m:])
        if node is None:
            break
        cap = min(max_gamma, int(max_spec_factor * m + 1e-6)) if adaptive else max_gamma
        tokens, scores, probs = grow(node, max(cap, 0), min_token_prob)
        draft = Draft(tuple(tokens), tuple(scores), tuple(probs), m, source if tokens else "none")
        if draft.score >= best.score - TIE:
            best, matched = draft, node
    if matched is None:
        return best
    return replace(best, matches=sum(child.count for child in matched.children.values()))
