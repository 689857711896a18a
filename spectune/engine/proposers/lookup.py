"""``proposer=lookup``: prompt lookup, a draft that needs no model (n-gram matching over the prompt and the text
generated so far; the search is :mod:`~spectune.engine.proposers.ngram`'s).

The suffix of a row's context (its last n tokens, n from ``max_n`` down to ``min_n``) is looked up in the context
itself; the tokens that followed its earliest match with a non-empty continuation are proposed, up to the cycle's
length (transformers' ``prompt_lookup_num_tokens`` / ``max_matching_ngram_size``, vLLM's ``ngram`` method with
``prompt_lookup_min`` / ``_max``). Exact at any temperature: the proposal is a point mass, handed out by the
model-free drafts' :class:`~spectune.engine.proposers.chain.ChainProposer`. When a policy asks, it reports its match:
the n that matched and how many earlier occurrences of those n tokens the context holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spectune.engine.proposers.base import DraftSources, ProposerEntry
from spectune.engine.proposers.ngram import Chain, lookup, lookup_chain
from spectune.errors import SpectuneError
from spectune.vllm_export import VllmMethod

if TYPE_CHECKING:
    from spectune.engine.proposer import EngineParts, Proposer


def check_lengths(max_n: int, min_n: int, prefix: str = "") -> None:
    """Prompt lookup's rule across its two settings, 1 <= min_n <= max_n, in one line naming the key, the value and
    what is allowed (``prefix``: where the keys sit, ``proposer.`` in a config)."""
    if max_n < 1:
        raise SpectuneError(f"{prefix}max_n={max_n!r} is out of range: must be an integer >= 1 (prompt lookup needs "
                            "1 <= min_n <= max_n)")
    if not 1 <= min_n <= max_n:
        raise SpectuneError(f"{prefix}min_n={min_n!r} is out of range: must be an integer in [1, {max_n}] (prompt "
                            f"lookup needs 1 <= min_n <= max_n, and {prefix}max_n={max_n})")


@dataclass
class LookupSettings:
    """conf/proposer/lookup.yaml's keys: the n-gram lengths matched, max_n down to min_n."""

    name: str
    max_n: int
    min_n: int

    def check(self) -> None:
        check_lengths(self.max_n, self.min_n, "proposer.")


@dataclass(frozen=True)
class PromptLookup:
    """What a prompt-lookup draft is: the n-gram sizes it matches and the ids it never proposes.

    It stands where a draft model would (``Engine(target, PromptLookup(...))``) and builds its own proposer; it
    keeps no state, so it is its own chain finder (:class:`~spectune.engine.proposers.chain.ChainSource`).
    """

    max_n: int = 3
    min_n: int = 1
    stop_ids: tuple[int, ...] = ()  # besides the engine's EOS ids: e.g. the tokenizer's special (template) ids

    def __post_init__(self) -> None:
        check_lengths(self.max_n, self.min_n)

    def proposer(self, parts: EngineParts, batch: int) -> Proposer:
        from spectune.engine.proposers.chain import ChainProposer  # torch: only when a session asks

        return ChainProposer.on(self, parts, batch)

    def chains(self, batch: int) -> PromptLookup:
        return self

    def chain(self, row: int, context: list[int], width: int) -> Chain:
        """The earliest longest match's continuation; its matches are counted only when a policy asks for them."""
        return lookup_chain(context, self.max_n, self.min_n, width, count=False)

    def reset(self, row: int) -> None:
        """Nothing kept per request."""

    def found(self, chains: list[list[int] | None]) -> None:
        """Nothing counted per cycle."""

    def request_chains(self) -> Callable[[list[int], int], list[int]]:
        """One request's chains for an offline replay (:mod:`~spectune.engine.proposers.replay`): the same search."""
        def chain_of(context: list[int], length: int) -> list[int]:
            return lookup(context, self.max_n, self.min_n, length)

        return chain_of


def draft(settings: LookupSettings, sources: DraftSources) -> PromptLookup:
    return PromptLookup(max_n=int(settings.max_n), min_n=int(settings.min_n), stop_ids=sources.special_ids)


def label(node: Mapping[str, Any], models: Mapping[str, Any]) -> str:
    return f"prompt lookup (max_n {node.get('max_n')}, min_n {node.get('min_n')})"


def vllm(node: Mapping[str, Any], draft_name: str | None) -> VllmMethod:
    return VllmMethod({"method": "ngram", "prompt_lookup_max": int(node["max_n"]),
                       "prompt_lookup_min": int(node["min_n"])},
                      ("vLLM's ngram proposer matches the prompt and the output so far, longest n first, as prompt "
                       "lookup here",))


PROPOSER = ProposerEntry(name="lookup", settings=LookupSettings, draft=draft, label=label, vllm=vllm,
                         replayable=True)
