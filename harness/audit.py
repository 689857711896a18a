"""Monte Carlo exactness audit: drive the real batched sampler and test its output law against p.

The proof says the corrected law is p; the audit exists to catch *coding* errors (seed §4), so it
calls :func:`harness.rejection.get_sampler` and :func:`harness.sampling.sample` themselves, never a
re-implementation. Variants share the proposals and the acceptance uniforms (a controlled comparison:
only the recovery distribution differs), and each has its own generator for what it draws on rejection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats

from harness.rejection import RejectionSampler
from harness.sampling import sample

# Rows × vocabulary per sampler call: bounds memory for large user-given vocabularies.
_CHUNK_ELEMENTS = 2_000_000


@dataclass(frozen=True)
class FitRule:
    """PASS iff no p=0 category appears, every |freq − p| < z_max·SE with SE = √(p(1−p)/n),
    and the chi-square goodness-of-fit p-value over the p > 0 categories exceeds ``min_pvalue``."""

    z_max: float = 4.5
    min_pvalue: float = 1e-3

    def describe(self) -> str:
        return (f"PASS iff no token with p=0 is ever emitted, every |freq-p| < {self.z_max:g}*SE "
                f"(SE = sqrt(p(1-p)/n); when SE = 0, freq must equal p exactly), and the chi-square "
                f"goodness-of-fit p-value over the p>0 tokens is > {self.min_pvalue:g}")


@dataclass
class FitResult:
    """How one observed count vector compares with the law it should follow."""

    counts: np.ndarray
    law: np.ndarray
    n: int
    frequencies: np.ndarray = field(init=False)
    abs_error: np.ndarray = field(init=False)
    se: np.ndarray = field(init=False)
    z: np.ndarray = field(init=False)
    tv: float = field(init=False)
    zero_prob_hits: list[int] = field(init=False)
    chi2_statistic: float | None = field(init=False)
    chi2_pvalue: float | None = field(init=False)
    chi2_dof: int = field(init=False)
    passed: bool = field(init=False)
    reasons: list[str] = field(init=False)

    def evaluate(self, rule: FitRule) -> FitResult:
        n, law = self.n, self.law
        self.frequencies = self.counts / n
        self.abs_error = np.abs(self.frequencies - law)
        self.se = np.sqrt(law * (1 - law) / n)
        safe_se = np.where(self.se > 0, self.se, 1.0)  # SE = 0 when p is 0 or 1: any error is infinite
        self.z = np.where(self.se > 0, self.abs_error / safe_se, np.where(self.abs_error > 0, np.inf, 0.0))
        self.tv = 0.5 * float(self.abs_error.sum())
        self.zero_prob_hits = [int(i) for i in np.flatnonzero((law == 0) & (self.counts > 0))]
        positive = law > 0
        self.chi2_dof = int(positive.sum()) - 1
        self.chi2_statistic = self.chi2_pvalue = None
        if self.chi2_dof >= 1 and not self.zero_prob_hits:
            expected = n * law[positive] / law[positive].sum()
            res = stats.chisquare(self.counts[positive], expected)
            self.chi2_statistic, self.chi2_pvalue = float(res.statistic), float(res.pvalue)
        self.reasons = []
        if self.zero_prob_hits:
            self.reasons.append(f"token indices with p=0 emitted: {self.zero_prob_hits}")
        bad = [int(i) for i in np.flatnonzero(law > 0) if not self.z[i] < rule.z_max]
        if bad:
            self.reasons.append(f"|freq-p| >= {rule.z_max:g} SE at token indices {bad}")
        if self.chi2_pvalue is not None and not self.chi2_pvalue > rule.min_pvalue:
            self.reasons.append(f"chi-square p-value {self.chi2_pvalue:.3g} <= {rule.min_pvalue:g}")
        self.passed = not self.reasons
        return self

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    @property
    def max_z(self) -> float:
        return float(self.z.max())

    def as_dict(self) -> dict[str, object]:
        return {
            "n": self.n, "counts": self.counts.tolist(), "expected_law": self.law.tolist(),
            "frequencies": self.frequencies.tolist(), "abs_error": self.abs_error.tolist(),
            "se": self.se.tolist(), "abs_error_over_se": self.z.tolist(), "max_abs_error_over_se": self.max_z,
            "tv_vs_expected": self.tv, "zero_prob_hits": self.zero_prob_hits,
            "chi2": {"statistic": self.chi2_statistic, "pvalue": self.chi2_pvalue, "dof": self.chi2_dof},
            "verdict": self.verdict, "reasons": self.reasons,
        }


def fit(counts: np.ndarray, law: np.ndarray, rule: FitRule) -> FitResult:
    counts = np.asarray(counts, dtype=np.int64)
    return FitResult(counts=counts, law=np.asarray(law, dtype=np.float64), n=int(counts.sum())).evaluate(rule)


def _chunks(n: int, vocab: int) -> list[int]:
    size = max(1, min(n, _CHUNK_ELEMENTS // max(vocab, 1)))
    return [min(size, n - start) for start in range(0, n, size)]


def first_token_counts(samplers: dict[str, RejectionSampler], p: np.ndarray, q: np.ndarray, n: int,
                       seed: int) -> dict[str, np.ndarray]:
    """γ = 1 blocks: count the first emitted token (the draft if accepted, else ``next_token``).

    target_probs is [n, 2, V] (position 0 and the bonus position, both p), draft_probs [n, 1, V].
    """
    vocab = len(p)
    p_t, q_t = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    shared = torch.Generator().manual_seed(seed)
    own = {name: torch.Generator().manual_seed(seed + 1 + i) for i, name in enumerate(samplers)}
    counts = {name: np.zeros(vocab, dtype=np.int64) for name in samplers}
    for rows in _chunks(n, vocab):
        target = p_t.expand(rows, 2, vocab)
        draft = q_t.expand(rows, 1, vocab)
        draft_tokens = sample(draft[:, 0], shared).unsqueeze(1)  # x ~ q, shared by the variants
        uniforms = torch.rand((rows, 1), generator=shared, dtype=torch.float64)
        for name, sampler in samplers.items():
            verdict = sampler(target, draft, draft_tokens, generator=own[name], uniforms=uniforms)
            first = verdict.emitted(draft_tokens)[:, 0]
            counts[name] += torch.bincount(first, minlength=vocab).numpy()
    return counts


def conditional_tables(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Second-position laws that depend on the first token: p1(·|x) = roll(p, x+1), q1(·|x) = roll(q, x).

    Any valid conditional laws would do; these differ from p and q and between prefixes, so a sampler
    that reads the wrong position or the wrong prefix's row gives a visibly wrong pair law.
    """
    vocab = len(p)
    return (np.stack([np.roll(p, x + 1) for x in range(vocab)]),
            np.stack([np.roll(q, x) for x in range(vocab)]))


def pair_law(p: np.ndarray, p1: np.ndarray) -> np.ndarray:
    """Target law of the first two emitted tokens, flattened: P(x0, x1) = p(x0)·p1(x1|x0)."""
    return (p[:, None] * p1).reshape(-1)


def first_pair_counts(samplers: dict[str, RejectionSampler], p: np.ndarray, q: np.ndarray, n: int,
                      seed: int) -> dict[str, np.ndarray]:
    """γ = 2 blocks: count the first two emitted tokens (index x0·V + x1).

    When the block's first draft is rejected the cycle emits one token y0; the second then comes from
    a following γ = 1 cycle from prefix y0, exactly as generation would continue.
    """
    vocab = len(p)
    p1_tab, q1_tab = (torch.as_tensor(t, dtype=torch.float64) for t in conditional_tables(p, q))
    p_t, q_t = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    shared = torch.Generator().manual_seed(seed)
    own = {name: torch.Generator().manual_seed(seed + 101 + i) for i, name in enumerate(samplers)}
    counts = {name: np.zeros(vocab * vocab, dtype=np.int64) for name in samplers}
    for rows in _chunks(n, vocab * vocab):
        x0 = sample(q_t.expand(rows, vocab), shared)
        x1 = sample(q1_tab[x0], shared)
        draft_tokens = torch.stack([x0, x1], dim=1)
        target = torch.stack([p_t.expand(rows, vocab), p1_tab[x0], p_t.expand(rows, vocab)], dim=1)
        draft = torch.stack([q_t.expand(rows, vocab), q1_tab[x0]], dim=1)
        uniforms = torch.rand((rows, 2), generator=shared, dtype=torch.float64)
        for name, sampler in samplers.items():
            gen = own[name]
            verdict = sampler(target, draft, draft_tokens, generator=gen, uniforms=uniforms)
            emitted = verdict.emitted(draft_tokens)
            first, second = emitted[:, 0], emitted[:, 1].clone()
            again = verdict.num_accepted == 0  # only one token emitted: run the next cycle from y0
            if bool(again.any()):
                y0 = first[again]
                m = y0.shape[0]
                t2 = torch.stack([p1_tab[y0], p_t.expand(m, vocab)], dim=1)
                d2 = q1_tab[y0].unsqueeze(1)
                tok2 = sample(d2[:, 0], gen).unsqueeze(1)
                second[again] = sampler(t2, d2, tok2, generator=gen).emitted(tok2)[:, 0]
            counts[name] += torch.bincount(first * vocab + second, minlength=vocab * vocab).numpy()
    return counts


def token_labels(vocab: int) -> list[str]:
    """A, B, C… for small vocabularies (as in the seed), indices otherwise."""
    return [chr(ord("A") + i) for i in range(vocab)] if vocab <= 26 else [str(i) for i in range(vocab)]


def fmt(x: float | None, width: int = 9, digits: int = 6) -> str:
    if x is None:
        return "-".rjust(width)
    if math.isinf(x):
        return "inf".rjust(width)
    return f"{x:{width}.{digits}f}"
