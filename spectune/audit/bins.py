"""Binning a large-vocabulary law for the audit's rule, and the power the binned rule has.

With a real vocabulary (thousands of tokens) most tokens have an expected count far below 5 at any
feasible n, where the chi-square approximation breaks down. The audit therefore judges *cells*: every
token whose expected count n·p is at least ``min_expected`` is its own cell, the other p > 0 tokens share
one "rest" cell, and the p = 0 tokens share one "p=0" cell (any hit there fails the rule, as for single
tokens). The cells depend only on (p, n), never on the observed counts, so the test stays valid.

Torch-free, like :mod:`spectune.audit.fit`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from spectune.audit.fit import FitResult, FitRule, fit

REST, ZERO = "rest", "p=0"


@dataclass(frozen=True)
class Bins:
    """A token → cell map: ``cell_of[token]`` indexes ``labels``; built from the law and n only."""

    cell_of: np.ndarray  # [V] int64
    labels: list[str]

    @property
    def size(self) -> int:
        return len(self.labels)

    def law(self, per_token: np.ndarray) -> np.ndarray:
        """Sum a per-token law (or count vector) into the cells."""
        return np.bincount(self.cell_of, weights=np.asarray(per_token, dtype=np.float64), minlength=self.size)

    def counts(self, per_token: np.ndarray) -> np.ndarray:
        return np.rint(self.law(per_token)).astype(np.int64)

    def describe(self, min_expected: float) -> str:
        own = sum(1 for label in self.labels if label not in (REST, ZERO))
        extra = [label for label in (REST, ZERO) if label in self.labels]
        return (f"{own} tokens with n*p >= {min_expected:g} as their own cells"
                + (f" + {' + '.join(repr(e) for e in extra)}" if extra else ""))


def make_bins(p: np.ndarray, n: int, min_expected: float) -> Bins:
    """Cells for judging n draws against law ``p`` (tokens by decreasing p, then rest, then p=0)."""
    p = np.asarray(p, dtype=np.float64)
    own = np.flatnonzero(n * p >= min_expected)
    own = own[np.argsort(-p[own], kind="stable")]
    cell_of = np.empty(len(p), dtype=np.int64)
    labels = [str(int(t)) for t in own]
    cell_of[own] = np.arange(len(own))
    is_own = np.zeros(len(p), dtype=bool)
    is_own[own] = True
    rest, zero = ~is_own & (p > 0), p == 0
    for mask, label in ((rest, REST), (zero, ZERO)):
        if mask.any():
            cell_of[mask] = len(labels)
            labels.append(label)
    return Bins(cell_of=cell_of, labels=labels)


def binned_fit(token_counts: np.ndarray, p: np.ndarray, min_expected: float,
               rule: FitRule) -> tuple[FitResult, Bins]:
    """Judge per-token counts against ``p`` with the audit's rule on the cells of :func:`make_bins`."""
    n = int(np.asarray(token_counts).sum())
    bins = make_bins(p, n, min_expected)
    law = bins.law(p)
    # Renormalised so that a lone cell has law exactly 1 (SE 0), not 1 ± 1e-16 (SE NaN or |Δ|/SE = inf).
    return fit(bins.counts(token_counts), law / law.sum(), rule), bins


def chi2_power(p_cells: np.ndarray, alt_cells: np.ndarray, n: int, min_pvalue: float) -> float | None:
    """P(chi-square p-value ≤ ``min_pvalue``) when the draws follow ``alt`` instead of ``p``.

    Noncentral chi-square approximation, λ = n·Σ (alt − p)²/p over the p > 0 cells, dof = cells − 1.
    It covers the chi-square part of the rule only, so the rule's power is at least this. None when
    there is no chi-square (fewer than two p > 0 cells).
    """
    positive = p_cells > 0
    dof = int(positive.sum()) - 1
    if dof < 1:
        return None
    lam = n * float((((alt_cells - p_cells)[positive]) ** 2 / p_cells[positive]).sum())
    return float(stats.ncx2.sf(stats.chi2.isf(min_pvalue, dof), dof, lam))


@dataclass(frozen=True)
class EventTest:
    """Pooled test of one event per draw: observed hits vs Σ P(event), normal approximation."""

    hits: int
    expected: float
    variance: float
    z: float
    pvalue: float
    alt_expected: float | None = None
    alt_z: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return dict(self.__dict__)

    def alt_power(self, max_pvalue: float) -> float | None:
        """P(two-sided p-value ≤ ``max_pvalue``) under the alternative: normal, null variance (approximate)."""
        if self.alt_z is None or not np.isfinite(self.alt_z):
            return None
        c = float(stats.norm.isf(max_pvalue / 2))
        return float(stats.norm.sf(c - self.alt_z) + stats.norm.cdf(-c - self.alt_z))


def event_test(hit: np.ndarray, prob: np.ndarray, alt_prob: np.ndarray | None = None) -> EventTest:
    """Each draw i hits its event with probability ``prob[i]`` under the null (independent draws).

    z = (hits − Σ prob) / √Σ prob(1 − prob), two-sided normal p-value. ``alt_prob`` gives the expected
    z if the draws followed an alternative law instead (how far a known bug would push the statistic).
    """
    prob = np.asarray(prob, dtype=np.float64)
    hits, expected = int(np.asarray(hit).sum()), float(prob.sum())
    variance = float((prob * (1 - prob)).sum())
    sd = np.sqrt(variance) if variance > 0 else np.inf
    z = (hits - expected) / sd
    alt_expected = alt_z = None
    if alt_prob is not None:
        alt_expected = float(np.asarray(alt_prob, dtype=np.float64).sum())
        alt_z = (alt_expected - expected) / sd
    return EventTest(hits=hits, expected=expected, variance=variance, z=float(z),
                     pvalue=float(2 * stats.norm.sf(abs(z))), alt_expected=alt_expected, alt_z=alt_z)
