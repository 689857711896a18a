"""``proposer=suffix``: suffix decoding, a draft that needs no model (SuffixDecoding, Oliaro et al.; vLLM's ``suffix``
method through Arctic Inference's ``SuffixDecodingCache``; the tries and the rule are
:mod:`~spectune.engine.proposers.suffix_tree`'s).

Two suffix tries of bounded depth (``max_tree_depth``):

- one **per request**, over its prompt and every token emitted so far (it catches up with the row's sequence at each
  cycle, so it always holds the context itself);
- one **global**, built once from the token sequences given to :class:`SuffixDrafting` (``corpus``: the workload's
  training-split prompts, ``proposer.corpus=train``, which the entry asks the workload for) and then **frozen**:
  nothing an evaluation emits enters it, so no repeat of a run can draft an earlier repeat's answer. (vLLM's global
  tree instead keeps growing with every response it serves.)

Per row and cycle the per-request and the global proposal compete on their score (ties: the per-request one); the
session's chain finder (:class:`SuffixChains`) records which won. Exactness is every model-free draft's: the chain is
proposed as a point mass by :class:`~spectune.engine.proposers.chain.ChainProposer`. Besides the q-derived signals it
reports, when asked, the match signals: the match length, the matched node's occurrences followed by a token, each
drafted token's frequency score and their running product.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

from spectune.engine.proposers.base import DraftSources, ProposerEntry
from spectune.engine.proposers.ngram import Chain
from spectune.engine.proposers.suffix_tree import TIE, Draft, SuffixTrie, speculate
from spectune.errors import SpectuneError
from spectune.vllm_export import VLLM_CHECKED, VllmMethod

if TYPE_CHECKING:
    from spectune.engine.proposer import EngineParts, Proposer


def check_rule(max_tree_depth: int, max_gamma: int | None, min_token_prob: float, max_spec_factor: float,
               prefix: str = "") -> None:
    """Suffix decoding's ranges, in one line naming the key, the value and what is allowed (``prefix``: where the
    keys sit, ``proposer.`` in a config)."""
    if max_tree_depth < 2:
        raise SpectuneError(f"{prefix}max_tree_depth={max_tree_depth!r} is out of range: must be an integer >= 2 "
                            "(a match of one token and a chain of one)")
    if max_gamma is not None and max_gamma < 1:
        raise SpectuneError(f"{prefix}max_gamma={max_gamma!r} is out of range: must be an integer >= 1 or null")
    if not 0.0 <= min_token_prob <= 1.0:
        raise SpectuneError(f"{prefix}min_token_prob={min_token_prob!r} is out of range: must be in [0, 1]")
    if not max_spec_factor > 0:
        raise SpectuneError(f"{prefix}max_spec_factor={max_spec_factor!r} is out of range: must be > 0")


class Corpus(enum.Enum):
    """``proposer.corpus``: the frozen global trie from the workload's training-split prompts, or none (per-request
    tries only)."""

    train = "train"
    none = "none"


@dataclass
class SuffixSettings:
    """conf/proposer/suffix.yaml's keys: the tries' depth, the chains' rule, and the global trie's corpus."""

    name: str
    max_tree_depth: int
    max_gamma: int | None
    max_spec_factor: float
    min_token_prob: float
    adaptive: bool
    corpus: Corpus  # checked while composing: before any model loads

    def check(self) -> None:
        check_rule(self.max_tree_depth, self.max_gamma, self.min_token_prob, self.max_spec_factor, "proposer.")


@dataclass(frozen=True)
class SuffixDrafting:
    """What a suffix-decoding draft is: its tries' depth, its chains' rule, the ids it never proposes, and the
    sequences of its frozen global trie (``corpus``: token-id sequences, e.g. a training split's prompts and
    reference outputs; none: the per-request tries alone).

    It stands where a draft model would (``Engine(target, SuffixDrafting(...))``) and builds its own proposer.
    """

    max_tree_depth: int = 24  # vLLM's suffix_decoding_max_tree_depth
    max_gamma: int | None = None  # a chain's ceiling (vLLM's num_speculative_tokens); None: max_tree_depth
    max_spec_factor: float = 1.0  # adaptive: a match of m tokens drafts at most ⌊max_spec_factor · m⌋
    min_token_prob: float = 0.1  # a chain stops where the running product of its scores falls below this
    adaptive: bool = True  # false: every match may draft up to max_gamma (a baseline rule)
    stop_ids: tuple[int, ...] = ()  # besides the engine's EOS ids: e.g. the tokenizer's special (template) ids
    corpus: InitVar[Iterable[Sequence[int]]] = ()
    global_tree: SuffixTrie | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self, corpus: Iterable[Sequence[int]]) -> None:
        check_rule(self.max_tree_depth, self.max_gamma, self.min_token_prob, self.max_spec_factor)
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

    def proposer(self, parts: EngineParts, batch: int) -> Proposer:
        from spectune.engine.proposers.chain import ChainProposer  # torch: only when a session asks

        return ChainProposer.on(self, parts, batch)

    def chains(self, batch: int) -> SuffixChains:
        return SuffixChains(self, batch)

    def request_chains(self) -> Callable[[list[int], int], list[int]]:
        return request_chains(self)


NO_DRAFT = Draft()


class SuffixChains:
    """One session's suffix-decoding chains (:meth:`SuffixDrafting.propose`), a trie per row. ``drafts``: each row's
    :class:`~spectune.engine.proposers.suffix_tree.Draft` this cycle (before clipping); ``sources``: how many
    row-cycles each trie won, and how many had no chain ("none")."""

    def __init__(self, spec: SuffixDrafting, batch: int) -> None:
        self.spec = spec
        self.trees = [SuffixTrie(spec.max_tree_depth) for _ in range(batch)]
        self.drafts: list[Draft] = [NO_DRAFT] * batch
        self.sources: Counter[str] = Counter()

    def reset(self, row: int) -> None:
        self.trees[row] = SuffixTrie(self.spec.max_tree_depth)

    def chain(self, row: int, context: list[int], width: int) -> Chain:
        """The row's trie catches up with its sequence (the context extends what it held), then proposes."""
        tree = self.trees[row]
        tree.extend(context[tree.size:])
        draft = self.spec.propose(tree, context)
        self.drafts[row] = draft
        return Chain(draft.tokens[:width], draft.match_length, draft.matches, draft.scores[:width],
                     draft.probs[:width])

    def found(self, chains: list[list[int] | None]) -> None:
        """Count which trie proposed each busy row's chain (clipped to nothing: "none")."""
        for row, chain in enumerate(chains):
            if chain is None:
                self.drafts[row] = NO_DRAFT
            else:
                self.sources[self.drafts[row].source if chain else "none"] += 1


def request_chains(spec: SuffixDrafting) -> Callable[[list[int], int], list[int]]:
    """One request's chains as :class:`SuffixChains` finds them, for a replay of a growing context
    (:func:`spectune.engine.proposers.replay.replay_greedy`): its own trie catches up with the context, then ``spec``
    proposes (against its frozen global trie too); at most ``length`` tokens."""
    tree = SuffixTrie(spec.max_tree_depth)

    def chain_of(context: list[int], length: int) -> list[int]:
        tree.extend(context[tree.size:])
        return list(spec.propose(tree, context).tokens[:length])

    return chain_of


def draft(settings: SuffixSettings, sources: DraftSources) -> SuffixDrafting:
    return SuffixDrafting(max_tree_depth=settings.max_tree_depth, max_gamma=settings.max_gamma,
                          max_spec_factor=settings.max_spec_factor, min_token_prob=settings.min_token_prob,
                          adaptive=settings.adaptive, stop_ids=sources.special_ids, corpus=sources.training_prompts)


def wants_corpus(settings: SuffixSettings) -> bool:
    return getattr(settings.corpus, "name", settings.corpus) == "train"


def label(node: Mapping[str, Any], models: Mapping[str, Any]) -> str:
    return f"suffix decoding (depth {node.get('max_tree_depth')}, corpus {node.get('corpus')})"


def vllm(node: Mapping[str, Any], draft_name: str | None) -> VllmMethod:
    """vLLM's suffix method; ``adaptive: false`` (no cap by match length) is a factor of the tree's depth, so that
    vLLM's floor(factor * m) reaches the ceiling for every match length m >= 1."""
    depth = int(node["max_tree_depth"])
    adaptive = bool(node["adaptive"])
    factor = float(node["max_spec_factor"]) if adaptive else float(depth)
    notes = ["vLLM's global suffix tree grows with every response it serves "
             "(suffix_decoding_max_cached_requests); the one measured here was frozen: "
             f"proposer.corpus={getattr(node.get('corpus'), 'name', node.get('corpus'))} (train: the workload's "
             "training-split prompts; none: per-request trees only)"]
    if not adaptive:
        notes.append("measured with proposer.adaptive=false: suffix_decoding_max_spec_factor is the tree's "
                     "depth so that no match length caps a chain below num_speculative_tokens")
    notes.append(f"vLLM v{VLLM_CHECKED} accepts suffix_decoding_max_spec_factor and suffix_decoding_min_token_prob "
                 "but ignores them (deprecated: its GPU suffix speculator always drafts num_speculative_tokens, "
                 "vllm/config/speculative.py), so there it does not cut chains as the suffix decoding measured "
                 "here did")
    # the longest chain it could draft whatever γ allowed: SuffixDrafting.ceiling's rule, on the recorded node
    ceiling = int(node["max_gamma"]) if node.get("max_gamma") is not None else depth
    return VllmMethod({"method": "suffix", "suffix_decoding_max_tree_depth": depth,
                       "suffix_decoding_max_spec_factor": factor,
                       "suffix_decoding_min_token_prob": float(node["min_token_prob"])}, tuple(notes), ceiling)


PROPOSER = ProposerEntry(name="suffix", settings=SuffixSettings, draft=draft, label=label, vllm=vllm,
                         training_prompts=wants_corpus, replayable=True)
