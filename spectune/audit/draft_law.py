"""The T = 1 law of a token decided by verifying a deterministic draft, and the power to catch a wrong rule.

A model-free draft (n-gram lookup) proposes one token d with certainty: q = δ_d. Exact verification then emits
d with probability p(d) and, on rejection, a token from the residual max(p − δ_d, 0)/Z, which is p without d
renormalised: the emitted token follows p. The wrong rule "on rejection, resample from p" emits
P(d) = p(d) + (1 − p(d))·p(d) and P(x) = (1 − p(d))·p(x) elsewhere; that is :func:`spectune.audit.laws.naive_law`
with q = δ_d, reused here, not rewritten.

p comes from a server's top-N probabilities, so the law here is over N named tokens plus one *remainder* bin
(every other token, 1 − Σ top-N). Draws are judged with the audit's binned rule
(:func:`spectune.audit.bins.binned_fit`) and the sample size is the one whose chi-square power against the wrong
rule reaches the target (:func:`spectune.audit.bins.chi2_power`). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectune.audit.bins import Bins, binned_fit, chi2_power, make_bins
from spectune.audit.fit import FitResult, FitRule
from spectune.audit.laws import naive_law

REMAINDER = -1  # the remainder bin's token id in :class:`TopLaw`


@dataclass(frozen=True)
class TopLaw:
    """p over ``ids`` (a server's top-N tokens) and, last, the remainder bin (id :data:`REMAINDER`)."""

    ids: tuple[int, ...]
    p: np.ndarray  # [N + 1], sums to 1

    @classmethod
    def of(cls, ids: Sequence[int], probs: Sequence[float]) -> TopLaw:
        """From a server's top-N (ids, probabilities); the remainder is what they leave (clipped at 0: a top-N that
        sums past 1 by rounding leaves nothing)."""
        top = np.asarray(probs, dtype=np.float64)
        if len(set(ids)) != len(ids) or len(ids) != len(top) or (top < 0).any():
            raise ValueError(f"top-N ids {list(ids)} and probabilities {top.tolist()} do not form a law")
        rest = max(0.0, 1.0 - float(top.sum()))
        p = np.append(top, rest)
        return cls((*(int(i) for i in ids), REMAINDER), p / p.sum())

    def index(self, token: int) -> int:
        """The bin of ``token``: its own where it is in the top N, the remainder's otherwise."""
        try:
            return self.ids.index(int(token))
        except ValueError:
            return len(self.ids) - 1

    def counts(self, tokens: Sequence[int]) -> np.ndarray:
        return np.bincount([self.index(t) for t in tokens], minlength=len(self.ids)).astype(np.int64)

    def wrong_rule(self, draft: int) -> np.ndarray:
        """The law "on rejection, resample from p" gives when the draft is ``draft`` (a top-N token)."""
        q = np.zeros_like(self.p)
        q[self.index(draft)] = 1.0
        return naive_law(self.p, q)


def power_at(p: np.ndarray, alt: np.ndarray, n: int, min_expected: float, min_pvalue: float) -> float:
    """The chi-square part's power at ``n`` draws on the cells the rule would use at that n (0 when untestable)."""
    bins: Bins = make_bins(p, n, min_expected)
    return chi2_power(bins.law(p), bins.law(alt), n, min_pvalue) or 0.0


def draws_for_power(p: np.ndarray, alt: np.ndarray, *, target: float, min_expected: float, min_pvalue: float,
                    max_draws: int) -> int | None:
    """The fewest draws whose chi-square power against ``alt`` reaches ``target`` (noncentral chi-square on the
    rule's cells at that n); None when even ``max_draws`` fall short. Power grows with n here (the cells only split
    as n grows), so a doubling then a bisection finds it."""
    if power_at(p, alt, max_draws, min_expected, min_pvalue) < target:
        return None
    hi = 1
    while power_at(p, alt, hi, min_expected, min_pvalue) < target:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if power_at(p, alt, mid, min_expected, min_pvalue) >= target:
            hi = mid
        else:
            lo = mid
    return min(hi, max_draws)


def judge(counts: np.ndarray, law: TopLaw, min_expected: float, rule: FitRule) -> tuple[FitResult, list[str]]:
    """The audit's binned rule on ``counts`` (per bin of ``law``); the cells' labels as token ids ('rest', 'p=0'
    keep their names; the remainder bin is 'other')."""
    result, bins = binned_fit(counts, law.p, min_expected, rule)
    labels = [label if not label.isdigit() else
              ("other" if law.ids[int(label)] == REMAINDER else str(law.ids[int(label)])) for label in bins.labels]
    return result, labels


def simulated_counts(law: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` draws from ``law`` (seeded), counted per bin: what a server following that law would have given."""
    return np.random.default_rng(seed).multinomial(n, law / law.sum()).astype(np.int64)
