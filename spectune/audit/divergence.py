"""Greedy exactness on an engine spectune did not write: where a speculative output parts from AR's, and why.

Greedy speculation must give AR's tokens. On quantised weights it may not, for a reason that is no fault of the
sampler: verification computes a batch of positions at once, and a quantised batched matmul rounds differently
from the one-row matmul AR decodes with (llama.cpp quantises the activations to 8 bits per block for its Q4/Q8
kernels, and the batched and one-row kernels accumulate in other orders). Where AR's two best tokens are nearly
tied, that rounding can swap them. A sampler fault (a wrong token kept, a draft accepted that the target did not
choose) shows no such tie.

So, at the first diverging token, the AR engine is asked for its top-2 log-probabilities given the prompt and the
common prefix: a gap below ``bound`` nats, with the speculative token AR's runner-up, counts as *numerics*;
anything else as a *possible sampler fault*. The bound is a setting (``task.server.gap_bound``), chosen before any
classification was looked at; see docs/llamacpp.md for the number and why. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

NUMERICS = "numerics"
FAULT = "possible sampler fault"


def first_divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where ``other`` differs from ``reference``; None when equal. A strict prefix (one
    stopped earlier, at EOS or its budget) diverges where the shorter one ends."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


@dataclass(frozen=True)
class TopTwo:
    """The AR engine's two most likely tokens at one position and their log-probabilities (nats)."""

    ids: tuple[int, int]
    logprobs: tuple[float, float]

    @property
    def gap(self) -> float:
        return float(self.logprobs[0] - self.logprobs[1])


def classify(top: TopTwo, speculative_token: int | None, bound: float) -> str:
    """NUMERICS when AR's top-2 gap is below ``bound`` and the speculative engine chose AR's runner-up (a swap of
    a near tie); FAULT otherwise (a clear winner lost, or a token outside AR's top 2). ``speculative_token`` None:
    the speculative output ended there (EOS or budget) while AR's went on, judged by the gap alone."""
    if not bound > 0:
        raise ValueError(f"bound={bound!r}: must be > 0 nats")
    near_tie = top.gap < bound
    swapped = speculative_token is None or speculative_token == top.ids[1]
    return NUMERICS if near_tie and swapped else FAULT


@dataclass(frozen=True)
class Divergence:
    """One prompt's comparison of a speculative output with AR's (``position`` None: equal)."""

    spec_type: str
    prompt_id: str
    category: str
    ar_tokens: int
    spec_tokens: int
    position: int | None = None
    ar_token: int | None = None
    spec_token: int | None = None
    top1: int | None = None
    top2: int | None = None
    gap_nats: float | None = None
    decode_gap_nats: float | None = None  # AR's gap when it generated that token (one-row decode), where reported
    verdict: str = "equal"
    drafted: int | None = None  # tokens the speculative engine drafted for this prompt (equal outputs prove little
    accepted: int | None = None  # where nothing was drafted), and accepted

    @property
    def equal(self) -> bool:
        return self.position is None

    def row(self) -> dict[str, object]:
        return {**asdict(self), "equal": self.equal}


def compare(spec_type: str, prompt_id: str, category: str, ar: Sequence[int], spec: Sequence[int],
            top_at: object, bound: float, decode_gaps: Sequence[float | None] = (), drafted: int | None = None,
            accepted: int | None = None) -> Divergence:
    """Compare one prompt's outputs; where they part, ``top_at(position)`` (the AR engine's :class:`TopTwo` given the
    prompt and ``ar[:position]``) classifies the divergence. ``decode_gaps``: AR's own top-2 gap per generated
    token where its generation reported one (recorded beside the re-queried gap: their difference is the rounding
    noise between a batched prompt pass and one-row decoding)."""
    at = first_divergence(ar, spec)
    base = Divergence(spec_type, prompt_id, category, len(ar), len(spec), drafted=drafted, accepted=accepted)
    if at is None:
        return base
    top: TopTwo = top_at(at)  # type: ignore[operator]
    spec_token = int(spec[at]) if at < len(spec) else None
    return Divergence(spec_type, prompt_id, category, len(ar), len(spec), position=at,
                      ar_token=int(ar[at]) if at < len(ar) else None, spec_token=spec_token,
                      top1=top.ids[0], top2=top.ids[1], gap_nats=top.gap,
                      decode_gap_nats=decode_gaps[at] if at < len(decode_gaps) else None,
                      verdict=classify(top, spec_token, bound), drafted=drafted, accepted=accepted)


def equality_by_type(rows: Sequence[Divergence]) -> list[dict[str, object]]:
    """Per speculative type: prompts, equal outputs, the equality rate, and the divergences by verdict."""
    out = []
    for spec_type in dict.fromkeys(r.spec_type for r in rows):
        mine = [r for r in rows if r.spec_type == spec_type]
        equal = sum(r.equal for r in mine)
        gaps = [r.gap_nats for r in mine if r.gap_nats is not None]
        out.append({"spec_type": spec_type, "prompts": len(mine), "equal": equal, "equality_rate": equal / len(mine),
                    NUMERICS: sum(r.verdict == NUMERICS for r in mine), FAULT: sum(r.verdict == FAULT for r in mine),
                    "max_gap_nats": max(gaps) if gaps else None,
                    "drafted": sum(r.drafted or 0 for r in mine), "accepted": sum(r.accepted or 0 for r in mine)})
    return out
