"""The distributions actually sampled: one shared warp for target and draft, and a sync-free sampler.

Exactness needs p and q to be the laws the tokens are really drawn from, *after* temperature,
top-k, top-p and masks. Both models go through :func:`warp` with the same settings so the
rejection rule compares like with like (a mask applied after correction would break the contract).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spectune.errors import SpectuneError


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by target and draft. ``temperature == 0`` means greedy.

    ``top_k == 0`` and ``top_p == 1`` switch those filters off.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t, k, tp = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not (isinstance(t, int | float) and math.isfinite(t) and t >= 0):
            raise SpectuneError(f"temperature={t!r} is invalid: must be a finite number >= 0 (0 = greedy)")
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 0):
            raise SpectuneError(f"top_k={k!r} is invalid: must be an integer >= 0 (0 = off)")
        if isinstance(tp, bool) or not (isinstance(tp, int | float) and 0 < tp <= 1):
            raise SpectuneError(f"top_p={tp!r} is invalid: must be in (0, 1] (1 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp(logits: torch.Tensor, params: SamplingParams, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Map logits ``[..., V]`` to the probabilities actually sampled (float32).

    Greedy is the one-hot law on the argmax: then the rejection rule reduces to exact-match
    acceptance and the residual to the target's argmax, with no special case anywhere else.
    ``allowed`` (bool, broadcastable to ``logits``) masks tokens out *before* normalisation.
    """
    logits = logits.float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if params.temperature != 1:
        logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the mass strictly before it already reaches top_p; the first always stays.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one index per row of ``probs [..., V]`` without a host sync.

    argmax(probs / E) with E ~ Exponential(1) i.i.d. is an exact draw from ``probs``
    (the exponential-race / Gumbel-max trick); ``torch.multinomial`` would synchronise.
    Zero-probability entries score 0 and are never chosen while any positive entry exists.
    """
    noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return (probs.float() / noise).argmax(-1)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one index per row of ``probs [..., V]`` from one given uniform per row (``uniforms [...]``).

    The inverse-CDF method: the first index whose cumulative mass exceeds u·total. Exact (in float64),
    sync-free, and on a CPU the cheapest draw there is: one cumulative sum instead of V exponentials,
    so it costs less than the softmax before it. It also makes a draw a function of one *keyed* uniform
    (spectune.engine.randomness), which is what pairs policies and γ on common random numbers.
    A zero-probability index never has its cumulative mass exceed the one before it, so it is never drawn.
    """
    cdf = torch.cumsum(probs, -1, dtype=torch.float64)
    point = (uniforms.double() * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, point, right=True).squeeze(-1)
    return index.clamp(max=probs.shape[-1] - 1)


def draw(probs: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
         uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """A draw from a law made by :func:`warp` with ``params``: :func:`inverse_cdf` when keyed ``uniforms`` are
    given, else :func:`sample`. Greedy laws are one-hot, so their draw is the argmax and needs no random
    numbers (a measurable saving per step on small models)."""
    if params.greedy:
        return probs.argmax(-1)
    return inverse_cdf(probs, uniforms) if uniforms is not None else sample(probs, generator)
