"""Speculative (rejection) sampling of a block of γ draft tokens — Leviathan, Kalman, Matias (2023).

Draft x ~ q; accept with min(1, p(x)/q(x)); at the first rejection draw from the normalised residual
max(p − q, 0) / Z, Z = 1 − Σ min(p, q); if all γ are accepted draw a bonus token from p[γ].
The output law is m + Z·r = p exactly, where m = min(p, q).

:class:`NaiveResampleFromTarget` ("on rejection, resample from p") is deliberately WRONG. It exists
only so the exactness audit can demonstrate that it catches it; it is never a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from spectune.errors import SpectuneError
from spectune.sampling.warp import inverse_cdf, sample


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification, per sequence.

    ``num_accepted[b]`` ∈ 0..γ drafts kept; ``next_token[b]`` is the corrected token (from the residual)
    or the bonus token (from p[γ]); the sequence emits ``draft_tokens[b, :n] + [next_token[b]]``.
    """

    num_accepted: torch.Tensor  # [B] int64
    next_token: torch.Tensor  # [B] int64

    def emitted(self, draft_tokens: torch.Tensor, pad: int = -1) -> torch.Tensor:
        """``[B, γ+1]`` emitted tokens, ``pad`` after the last one (host sync-free)."""
        batch, gamma = draft_tokens.shape
        out = torch.cat([draft_tokens, torch.full((batch, 1), pad, dtype=draft_tokens.dtype,
                                                  device=draft_tokens.device)], dim=1)
        pos = torch.arange(gamma + 1, device=draft_tokens.device).expand(batch, -1)
        n = self.num_accepted.unsqueeze(1)
        out = torch.where(pos == n, self.next_token.unsqueeze(1).to(out.dtype), out)
        return out.masked_fill(pos > n, pad)


class RejectionSampler(Protocol):
    """Decides, from target and draft laws, how many drafts to keep and which token comes next."""

    name: str

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_tokens: torch.Tensor,
        generator: torch.Generator | None = None,
        uniforms: torch.Tensor | None = None,
        num_drafts: torch.Tensor | None = None,
        recovery_uniforms: torch.Tensor | None = None,
    ) -> Verdict: ...


def _accept_count(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                  generator: torch.Generator | None, uniforms: torch.Tensor | None,
                  num_drafts: torch.Tensor | None) -> torch.Tensor:
    """Number of leading drafts accepted, with u·q(x) < p(x) ⇔ u < p(x)/q(x) (no division).

    ``num_drafts[b]`` ≤ γ caps row b (a row whose policy stopped drafting early): drafts past it are
    never accepted, and a row that keeps all of its drafts gets its bonus token from p[num_drafts].
    """
    gamma = draft_tokens.shape[1]
    idx = draft_tokens.unsqueeze(-1)
    p_x = target_probs[:, :gamma].gather(-1, idx).squeeze(-1)
    q_x = draft_probs.gather(-1, idx).squeeze(-1)
    if uniforms is None:
        uniforms = torch.rand(q_x.shape, generator=generator, device=q_x.device)
    accept = uniforms * q_x < p_x
    if num_drafts is not None:
        accept &= torch.arange(gamma, device=accept.device) < num_drafts.unsqueeze(1)
    return accept.long().cumprod(dim=1).sum(dim=1)


def _recovery_law(target_probs: torch.Tensor, n: torch.Tensor, residual_from: torch.Tensor | None,
                  num_drafts: torch.Tensor | None) -> torch.Tensor:
    """Law of the token after ``n`` accepted drafts: residual at a rejection, p[n] after a full accept.

    ``residual_from`` is q (exact sampler) or None (naive sampler: p itself at a rejection).
    """
    gamma = target_probs.shape[1] - 1
    rows = torch.arange(target_probs.shape[0], device=target_probs.device)
    p_n = target_probs[rows, n]  # [B, V]; n == γ selects the bonus position
    if residual_from is None:
        return p_n
    limit = num_drafts if num_drafts is not None else torch.full_like(n, gamma)
    q_n = residual_from[rows, n.clamp(max=gamma - 1)]
    residual = (p_n - q_n).clamp(min=0)
    z = residual.sum(-1, keepdim=True)
    # Z == 0 means p == q at this position: a rejection there has probability 0 in exact arithmetic
    # (it can only come from float rounding) and p is then the right law. Never divide 0/0.
    residual = torch.where(z > 0, residual / z.clamp(min=torch.finfo(z.dtype).tiny), p_n)
    return torch.where((n < limit).unsqueeze(1), residual, p_n)


class _BlockSampler:
    """Shared acceptance step; subclasses differ only in the law drawn from after a rejection."""

    name: str
    resample_from_residual: bool

    def __call__(self, target_probs, draft_probs, draft_tokens, generator=None, uniforms=None,
                 num_drafts=None, recovery_uniforms=None) -> Verdict:
        """``recovery_uniforms [B, γ+1]`` (keyed, one per position the next token may take) make the
        corrected/bonus draw an inverse-CDF draw of column ``num_accepted``; without them it uses ``generator``."""
        n = _accept_count(target_probs, draft_probs, draft_tokens, generator, uniforms, num_drafts)
        law = _recovery_law(target_probs, n, draft_probs if self.resample_from_residual else None, num_drafts)
        if recovery_uniforms is None:
            return Verdict(num_accepted=n, next_token=sample(law, generator))
        u = recovery_uniforms.gather(1, n.unsqueeze(1)).squeeze(1)
        return Verdict(num_accepted=n, next_token=inverse_cdf(law, u))


class ExactRejectionSampler(_BlockSampler):
    """The exact rule: the law of every emitted token is the target's."""

    name = "exact"
    resample_from_residual = True


class NaiveResampleFromTarget(_BlockSampler):
    """WRONG on purpose: at a rejection it samples from p instead of the residual.

    The accepted branch already supplied min(p, q); adding Z·p over-weights tokens the draft likes.
    With p = (0.5, 0.3, 0.2), q = (0.2, 0.5, 0.3) its law is (0.35, 0.39, 0.26), TV 0.15.
    """

    name = "naive"
    resample_from_residual = False


class AcceptArgmaxMatch:
    """WRONG on purpose at T > 0: keeps a draft iff it is the target's most likely token (greedy verification),
    then draws the next token from p. Right only where p is one-hot (T = 0); with a deterministic proposal
    (prompt lookup, q = δ_x) it turns every x that is the argmax into a certain token: with p = (0.5, 0.3, 0.2)
    and x = 0 its law is δ_0. Here so the exactness audit can show it catches it; never a default."""

    name = "argmax-match"

    def __call__(self, target_probs, draft_probs, draft_tokens, generator=None, uniforms=None,
                 num_drafts=None, recovery_uniforms=None) -> Verdict:
        gamma = draft_tokens.shape[1]
        accept = target_probs[:, :gamma].argmax(-1) == draft_tokens
        if num_drafts is not None:
            accept &= torch.arange(gamma, device=accept.device) < num_drafts.unsqueeze(1)
        n = accept.long().cumprod(dim=1).sum(dim=1)
        law = _recovery_law(target_probs, n, None, num_drafts)
        if recovery_uniforms is None:
            return Verdict(num_accepted=n, next_token=sample(law, generator))
        return Verdict(num_accepted=n, next_token=inverse_cdf(law, recovery_uniforms.gather(1, n.unsqueeze(1))
                                                              .squeeze(1)))


SAMPLERS: dict[str, type] = {"exact": ExactRejectionSampler, "naive": NaiveResampleFromTarget,
                             "argmax-match": AcceptArgmaxMatch}


def get_sampler(name: str) -> RejectionSampler:
    if name not in SAMPLERS:
        raise SpectuneError(f"sampler={name!r} is unknown: choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[name]()
