"""A draft that needs no model: suffix decoding (SuffixDecoding, Oliaro et al.; vLLM's ``suffix`` method through
Arctic Inference's ``SuffixDecodingCache``).

Two suffix tries of bounded depth (``max_tree_depth``) count every substring of what they hold, up to that many
tokens, with its number of occurrences:

- one **per request**, over its prompt and every token emitted so far (it catches up with the row's sequence at each
  cycle, so it always holds the context itself);
- one **global**, built once from the token sequences given to :class:`SuffixDrafting` (``corpus``: a workload's
  training split, prompts and reference outputs, where there is one) and then **frozen**: nothing an evaluation
  emits enters it, so no repeat of a run can draft an earlier repeat's answer. (vLLM's global tree instead keeps
  growing with every response it serves.)

A proposal (:func:`speculate`, Arctic's ``_speculate_path`` rule): for every match length m = 1, 2, … (the last m
tokens of the context, at most ``max_tree_depth − 1``) while the trie holds them, grow a single chain from the
matched node greedily by its most frequent child, each token scored count(child)/count(node); the chain stops when
the running product of those scores falls below ``min_token_prob`` or at its length cap. The chain kept is the one
with the highest score (the sum of the running products: the expected number of accepted tokens if the scores were
the acceptance probabilities), the longest match among equal scores. The pure longest match would be the context's
own occurrence in the per-request trie, which has no continuation. The length cap is ``max_gamma`` (vLLM's
``num_speculative_tokens``), and with ``adaptive`` (SuffixDecoding's own rule) also ⌊``max_spec_factor`` · m⌋, as
arctic-inference's ``SuffixDecodingCache`` rounds it (its ``int(m · factor + 1e-6)``):
a short match drafts little. With ``adaptive: false`` every match length may draft up to ``max_gamma``, a baseline
for a γ policy. Per row and cycle the per-request and the global proposal compete on that score (ties: the
per-request one); :class:`Draft` records which won.

Exactness is the prompt lookup's (``lookup.py``): the chain is proposed as a point mass q = δ_x, never through the
sampling warp, so the engine's exact rejection sampler keeps the target's law at any temperature; chains stop
before EOS and template ids and at the request's length limit. The proposer is :class:`~spectune.engine.lookup.
LookupProposer` with its :meth:`~spectune.engine.lookup.LookupProposer.chain` replaced. Besides the q-derived
signals it returns, when asked, the match signals (:data:`~spectune.engine.policy.MATCH_SIGNALS`: the match length,
the matched node's occurrences followed by a token, each drafted token's frequency score and their running
product), and keeps each row's :class:`Draft` of the cycle in ``drafts``.

The tries are plain dicts of children with counts: O(tokens · max_tree_depth) nodes, fine for a training split of
some 10⁵ tokens; Arctic's path-compressed suffix tree is O(tokens). Among children of equal count the one created
first is taken (Arctic keeps its own order among ties, which can differ after later increments).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import InitVar, dataclass, field, replace

import torch

from spectune.engine.lookup import Chain, LookupProposer
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


@dataclass(frozen=True)
class SuffixDrafting:
    """What a suffix-decoding draft is: its tries' depth, its chains' rule, the ids it never proposes, and the
    sequences of its frozen global trie (``corpus``: token-id sequences, e.g. a training split's prompts and
    reference outputs; none: the per-request tries alone).

    It stands where a draft model would (``Engine(target, SuffixDrafting(...))``); the engine builds its proposer.
    """

    max_tree_depth: int = 24  # vLLM's suffix_decoding_max_tree_depth
    max_gamma: int | None = None  # a chain's ceiling (vLLM's num_speculative_tokens); None: max_tree_depth
    max_spec_factor: float = 1.0  # adaptive: a match of m tokens drafts at most ⌊max_spec_factor · m⌋
    min_token_prob: float = 0.1  # a chain stops where the running product of its scores falls below this
    adaptive: bool = True  # false: every match may draft up to max_gamma (a baseline rule)
    stop_ids: tuple[int, ...] = ()  # besides the engine's EOS ids: e.g. the tokenizer's special (template) ids
    corpus: InitVar[Iterable[Sequence[int]]] = ()
    global_tree: SuffixTrie | None = field(init=False, repr=False, compare=False, default=None)

    name = "suffix"

    def __post_init__(self, corpus: Iterable[Sequence[int]]) -> None:
        if self.max_tree_depth < 2:
            raise SpectuneError(f"suffix decoding needs max_tree_depth >= 2, got {self.max_tree_depth}")
        if self.max_gamma is not None and self.max_gamma < 1:
            raise SpectuneError(f"suffix decoding needs max_gamma >= 1 (or null), got {self.max_gamma}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise SpectuneError(f"suffix decoding needs 0 <= min_token_prob <= 1, got {self.min_token_prob}")
        if not self.max_spec_factor > 0:
            raise SpectuneError(f"suffix decoding needs max_spec_factor > 0, got {self.max_spec_factor}")
        sequences = [list(s) for s in corpus]
        object.__setattr__(self, "global_tree", SuffixTrie.of(sequences, self.max_tree_depth) if sequences else None)

    @property
    def ceiling(self) -> int:
        return self.max_gamma if self.max_gamma is not None else self.max_tree_depth

    def propose(self, request_tree: SuffixTrie, context: Sequence[int]) -> Draft:
        """The per-request trie's proposal or the global trie's, whichever scores higher (ties: per-request)."""
        rule = (self.ceiling, self.min_token_prob, self.max_spec_factor, self.adaptive)
        draft = speculate(request_tree, context, *rule, source="request")
        if self.global_tree is not None:
            other = speculate(self.global_tree, context, *rule, source="global")
            if other.score > draft.score + TIE:
                draft = other
        return draft


NO_DRAFT = Draft()


class SuffixProposer(LookupProposer):
    """Proposes, per row, the suffix-decoding chain (:meth:`SuffixDrafting.propose`), through the prompt lookup's
    cycle machinery (point-mass q, clipping, per-row counts). ``drafts``: each row's :class:`Draft` this cycle
    (before clipping); ``sources``: how many row-cycles each trie won, and how many had no chain ("none")."""

    def __init__(self, spec: SuffixDrafting, batch: int, vocab_size: int, device: torch.device,
                 eos: Iterable[int] = ()) -> None:
        super().__init__(spec, batch, vocab_size, device, eos)  # of the spec, it reads stop_ids; chain() the rest
        self.trees = [SuffixTrie(spec.max_tree_depth) for _ in range(batch)]
        self.drafts: list[Draft] = [NO_DRAFT] * batch
        self.sources: Counter[str] = Counter()

    def prefill(self, rows: list[int], prompts: list[list[int]], features: torch.Tensor | None = None,
                limits: list[int] | None = None) -> None:
        super().prefill(rows, prompts, features, limits)
        for row in rows:
            self.trees[row] = SuffixTrie(self.spec.max_tree_depth)

    def clear(self, row: int) -> None:
        super().clear(row)
        self.trees[row] = SuffixTrie(self.spec.max_tree_depth)

    def begin(self, last: torch.Tensor) -> None:
        self.drafts = [NO_DRAFT] * self.batch
        super().begin(last)
        for row, chain in enumerate(self._chains):
            if self.history[row]:
                self.sources[self.drafts[row].source if chain else "none"] += 1

    def chain(self, row: int, context: list[int], width: int) -> Chain:
        """The row's trie catches up with its sequence (the context extends what it held), then proposes."""
        tree = self.trees[row]
        tree.extend(context[tree.size:])
        draft = self.spec.propose(tree, context)
        self.drafts[row] = draft
        return Chain(draft.tokens[:width], draft.match_length, draft.matches, draft.scores[:width],
                     draft.probs[:width])


def request_chains(spec: SuffixDrafting) -> Callable[[list[int], int], list[int]]:
    """One request's chains as :class:`SuffixProposer` finds them, for a replay of a growing context
    (:func:`spectune.engine.lookup.replay_greedy`): its own trie catches up with the context, then ``spec`` proposes
    (against its frozen global trie too); at most ``length`` tokens."""
    tree = SuffixTrie(spec.max_tree_depth)

    def chain_of(context: list[int], length: int) -> list[int]:
        tree.extend(context[tree.size:])
        return list(spec.propose(tree, context).tokens[:length])

    return chain_of
