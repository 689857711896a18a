"""A model-free draft replayed offline: its cycles under greedy decoding, from the target's greedy outputs alone.

Greedy verification accepts a draft iff it is the target's own next greedy token, so at temperature 0 a model-free
draft's cycles follow from the target's autoregressive output: :func:`replay_greedy` gives them exactly (tests
compare them with the engine's, cycle by cycle), for any draft whose entry says it is ``replayable`` (its draft
gives ``request_chains``: prompt lookup, suffix decoding). :func:`replay` does it for every request and γ of a
workload; :mod:`spectune.measure.prediction` prices the rows with a cost profile, before any timing. The copyable
fraction (output tokens inside an n-gram that occurred earlier) says how much of the output any lookup could have
copied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pandas as pd

from spectune.engine.proposers.ngram import clip

COPY_N = 3  # the copyable fraction counts output tokens inside an earlier match of at least this many tokens


class Replayable(Protocol):
    """A model-free draft that can be replayed offline: the ids it never proposes and one request's chains."""

    stop_ids: tuple[int, ...]

    def request_chains(self) -> Callable[[list[int], int], list[int]]:
        """A fresh ``chain_of(context, length)`` for one request's growing context (its state, if any, its own)."""


@dataclass(frozen=True)
class GreedyOutput:
    """One request's greedy autoregressive output: what every replay starts from."""

    request_id: int
    prompt_id: str
    category: str  # what the prompt asks for (workloads.categories)
    prompt: Sequence[int]
    output: Sequence[int]
    max_new_tokens: int


def replay(outputs: Iterable[GreedyOutput], spec: Replayable, gammas: Sequence[int],
           eos: Iterable[int] = ()) -> pd.DataFrame:
    """One row per (request, γ): the replayed cycles of the model-free draft ``spec`` at a fixed γ (each request
    replayed with chains of its own, as the engine gives each request: suffix decoding's per-request trie).

    Columns: request_id, prompt_id, category, gamma, output_tokens, decode_tokens (the output after its first token),
    copyable_tokens (inside an earlier match of ``COPY_N`` tokens), cycles, no_proposal (cycles that proposed
    nothing: a plain target step), drafted, accepted, verified_positions (Σ drafted + 1 over cycles), a histogram
    of drafts per cycle (``drafts_per_cycle``: counts for 0..γ), and ``search_s`` (seconds the lookups took here, in
    this process: the proposer's own cost, paid every cycle whether it finds a match or not).
    """
    stops = list(eos)
    rows = []
    for out in outputs:
        copyable = round(copyable_fraction(out.prompt, out.output, COPY_N) * len(out.output))
        for gamma in gammas:
            start = time.perf_counter()
            cycles = replay_greedy(out.prompt, out.output, gamma, spec, out.max_new_tokens, stops)
            search_s = time.perf_counter() - start
            counts = [0] * (gamma + 1)
            for drafted, _ in cycles:
                counts[drafted] += 1
            rows.append({
                "request_id": out.request_id, "prompt_id": out.prompt_id, "category": out.category, "gamma": gamma,
                "output_tokens": len(out.output), "decode_tokens": max(len(out.output) - 1, 0),
                "copyable_tokens": copyable, "cycles": len(cycles), "no_proposal": counts[0],
                "drafted": sum(d for d, _ in cycles), "accepted": sum(a for _, a in cycles),
                "verified_positions": sum(d + 1 for d, _ in cycles), "drafts_per_cycle": counts,
                "search_s": search_s,
            })
    return pd.DataFrame(rows)


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


def replay_greedy(prompt: Sequence[int], output: Sequence[int], gamma: int, spec: Replayable,
                  max_new_tokens: int, eos: Iterable[int] = (),
                  chain_of: Callable[[list[int], int], list[int]] | None = None) -> list[tuple[int, int]]:
    """(drafted, accepted) per cycle of greedy decoding with a model-free draft at a fixed ``gamma``, from the
    target's own greedy ``output`` (what autoregressive decoding emits; its first token comes at admission).

    Greedy verification accepts a draft iff it is the token the target would emit, so the cycles are known without
    running the target: this is what the engine does (tests compare them cycle by cycle), and with a cost per
    verified length it predicts the speed-up before any timing. ``chain_of(context, length)`` is the draft's chain
    after ``context``, fresh for this request (default: ``spec.request_chains()``, the draft's own: prompt lookup's
    search, suffix decoding's per-request trie).
    """
    if chain_of is None:
        chain_of = spec.request_chains()
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
