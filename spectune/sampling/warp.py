"""The distributions actually sampled: one shared warp for target and draft, and a sync-free sampler.

Exactness needs p and q to be the laws the tokens are really drawn from, *after* temperature,
top-k, top-p and masks. Both models go through :func:`warp` with the same settings so the
rejection rule compares like with like (a mask applied after correction would break the contract).

The settings may differ from row to row of a batch (each request brings its own): :func:`batch_sampling` gives
one :class:`SamplingParams` when every row shares it (the path every uniform batch takes, with no per-row
tensor) and a :class:`RowSampling` otherwise; :func:`warp` and :func:`draw` take either. Row by row the laws
are those :func:`warp` gives each row's own settings, so the rejection rule, which works row by row on the laws
it is handed, stays exact for every row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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

    def describe(self) -> dict[str, float | int]:
        """The three settings by name (a result's metadata, a request's record)."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


@dataclass(frozen=True, eq=False)
class RowSampling:
    """Settings that differ between the rows of a batch: ``rows[b]`` is row b's, and the tensors ([B], on the
    batch's device) are what :func:`warp` reads. Built by :func:`batch_sampling` only when the rows disagree."""

    rows: tuple[SamplingParams, ...]
    greedy: torch.Tensor  # [B] bool
    divisor: torch.Tensor  # [B] float32: the temperature, 1 on greedy rows (their law is the one-hot argmax)
    top_k: torch.Tensor  # [B] int64, 0 = off
    top_p: torch.Tensor  # [B] float32, 1 = off
    any_greedy: bool
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool

    @classmethod
    def of(cls, rows: Sequence[SamplingParams], device: torch.device | str = "cpu") -> RowSampling:
        rows = tuple(rows)
        greedy = [r.greedy for r in rows]
        return cls(rows, torch.tensor(greedy, device=device),
                   torch.tensor([1.0 if r.greedy else float(r.temperature) for r in rows], device=device),
                   torch.tensor([r.top_k for r in rows], dtype=torch.long, device=device),
                   torch.tensor([float(r.top_p) for r in rows], device=device),
                   any(greedy), all(greedy), any(r.top_k > 0 for r in rows), any(r.top_p < 1 for r in rows))


def batch_sampling(rows: Sequence[SamplingParams], device: torch.device | str = "cpu") -> SamplingParams | RowSampling:
    """The law of a batch whose row b samples with ``rows[b]``: the shared :class:`SamplingParams` itself when every
    row has the same settings (today's path: no per-row tensor, no extra op per step), else a :class:`RowSampling`."""
    first = _law(rows[0])
    if all(_law(r) == first for r in rows[1:]):
        return rows[0]
    return RowSampling.of(rows, device)


def _law(params: SamplingParams) -> tuple:
    """What decides the law: greedy ignores top-k and top-p (its law is the argmax's point mass)."""
    return (0,) if params.greedy else (params.temperature, params.top_k, params.top_p)


def select_rows(params: SamplingParams | RowSampling, rows: Sequence[int]) -> SamplingParams | RowSampling:
    """The settings of ``rows`` of a batch, in that order (one law stays one law)."""
    if isinstance(params, SamplingParams):
        return params
    return batch_sampling([params.rows[r] for r in rows], params.greedy.device)


def warp(logits: torch.Tensor, params: SamplingParams | RowSampling,
         allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Map logits ``[..., V]`` to the probabilities actually sampled (float32).

    Greedy is the one-hot law on the argmax: then the rejection rule reduces to exact-match
    acceptance and the residual to the target's argmax, with no special case anywhere else.
    ``allowed`` (bool, broadcastable to ``logits``) masks tokens out *before* normalisation.
    ``params`` may be a :class:`RowSampling`: the rows of ``logits [B, ..., V]`` then take their own settings.
    """
    if logits.dtype != torch.float32:  # a float32 input is used as it is (.float() would return it, after a dispatch)
        logits = logits.float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    if isinstance(params, RowSampling):
        return _warp_rows(logits, params)
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


def _warp_rows(logits: torch.Tensor, params: RowSampling) -> torch.Tensor:
    """:func:`warp` with per-row settings: the same operations as one row's own path, each filter applied only where
    the row sets it (a row with top_p = 1 keeps every token even where rounding brings the mass before it to 1), so
    every row's law is the one :func:`warp` gives it alone."""
    shape = (-1,) + (1,) * (logits.dim() - 1)  # a row's setting broadcast over its positions and vocabulary
    vocab = logits.shape[-1]
    hot = torch.nn.functional.one_hot(logits.argmax(-1), vocab).float() if params.any_greedy else None
    if params.all_greedy:
        return hot
    logits = logits / params.divisor.view(shape)  # x / 1 == x: rows at T = 1 (and greedy rows) are unchanged
    if params.any_top_k or params.any_top_p:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    if params.any_top_k:
        k = params.top_k.view(shape)
        on = (k > 0) & (k < vocab)
        kth = sorted_logits.gather(-1, (k.clamp(1, vocab) - 1).expand(*logits.shape[:-1], 1))
        logits = logits.masked_fill(on & (logits < kth), float("-inf"))
        if params.any_top_p:  # top-p reads the law after top-k, as on the one-law path
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    if params.any_top_p:
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = (mass_before >= params.top_p.view(shape)) & (params.top_p < 1).view(shape)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(-1)
    return probs if hot is None else torch.where(params.greedy.view(shape), hot, probs)


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
    if uniforms.dtype != torch.float64:  # the keyed tables are float64 already
        uniforms = uniforms.double()
    point = (uniforms * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, point, right=True).squeeze(-1)
    return index.clamp(max=probs.shape[-1] - 1)


def draw(probs: torch.Tensor, params: SamplingParams | RowSampling, generator: torch.Generator | None = None,
         uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """A draw from a law made by :func:`warp` with ``params``: :func:`inverse_cdf` when keyed ``uniforms`` are
    given, else :func:`sample`. Greedy laws are one-hot, so their draw is the argmax and needs no random
    numbers (a measurable saving per step on small models). Per-row settings draw every row alike: a greedy
    row's one-hot law gives its argmax for any uniform in [0, 1) and any exponential noise."""
    if isinstance(params, RowSampling):
        if params.all_greedy:
            return probs.argmax(-1)
        return inverse_cdf(probs, uniforms) if uniforms is not None else sample(probs, generator)
    if params.greedy:
        return probs.argmax(-1)
    return inverse_cdf(probs, uniforms) if uniforms is not None else sample(probs, generator)
