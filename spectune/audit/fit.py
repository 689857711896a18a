"""Judging Monte Carlo counts against the law they should follow (the audit's stated rule).

Torch-free on purpose: the simulation is in :mod:`spectune.audit.montecarlo`, so the verify task can validate
its inputs and fail on bad ones before loading torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats


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


def token_labels(vocab: int) -> list[str]:
    """A, B, C… for small vocabularies (as in the three-symbol example), indices otherwise."""
    return [chr(ord("A") + i) for i in range(vocab)] if vocab <= 26 else [str(i) for i in range(vocab)]


def fmt(x: float | None, width: int = 9, digits: int = 6) -> str:
    if x is None:
        return "-".rjust(width)
    if math.isinf(x):
        return "inf".rjust(width)
    return f"{x:{width}.{digits}f}"
