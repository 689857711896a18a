"""Analytic laws of one speculative position, in float64, with no sampling.

The audit compares the sampler's Monte Carlo frequencies against these closed forms:
accepted mass m = min(p, q), rejection probability Z = 1 − Σm, residual r = max(p − q, 0)/Z,
corrected law m + Z·r (= p) and the naive "restart from p" law m + Z·p (≠ p whenever Z > 0 and r ≠ p).
Keeping the arithmetic here, apart from the torch sampler, means a bug in one cannot hide in the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectune.errors import SpectuneError

SUM_TOLERANCE = 1e-6


def validate_distribution(values: Sequence[float] | np.ndarray, name: str,
                          tol: float = SUM_TOLERANCE) -> np.ndarray:
    """Return ``values`` as a float64 vector renormalised to sum 1, or raise a one-line error.

    Users type these lists on the command line, so the message names the offending entry. A sum off
    by at most ``tol`` is accepted (rounded decimals) and divided out so every law downstream is exact.
    """
    try:
        arr = np.asarray(list(values), dtype=np.float64)
    except (TypeError, ValueError):
        raise SpectuneError(f"{name}={list(values)!r} is invalid: must be a list of numbers") from None
    if arr.ndim != 1 or arr.size == 0:
        raise SpectuneError(f"{name}={arr.tolist()!r} is invalid: must be a non-empty list of probabilities")
    for i, v in enumerate(arr):
        if math.isnan(v) or math.isinf(v):
            raise SpectuneError(f"{name}[{i}]={v} is invalid: probabilities must be finite numbers in [0, 1]")
        if v < 0 or v > 1:
            raise SpectuneError(f"{name}[{i}]={v} is invalid: probabilities must be in [0, 1]")
    total = float(arr.sum())
    if abs(total - 1.0) > tol:
        raise SpectuneError(f"{name}={arr.tolist()} sums to {total:.9g}: must sum to 1 within {tol:g}")
    return arr / total


def validate_pair(p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray,
                  tol: float = SUM_TOLERANCE,
                  names: tuple[str, str] = ("p", "q")) -> tuple[np.ndarray, np.ndarray]:
    """Validate target ``p`` and draft ``q`` over the same vocabulary (same length)."""
    p_arr = validate_distribution(p, names[0], tol)
    q_arr = validate_distribution(q, names[1], tol)
    if p_arr.size != q_arr.size:
        raise SpectuneError(f"{names[0]} has {p_arr.size} entries and {names[1]} has {q_arr.size}: both must "
                            "cover the same vocabulary (same length)")
    return p_arr, q_arr


def accepted_mass(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """m(x) = q(x)·min(1, p(x)/q(x)) = min(p(x), q(x)): the mass emitted by accepting a proposal."""
    return np.minimum(p, q)


def rejection_probability(p: np.ndarray, q: np.ndarray) -> float:
    """Z = 1 − Σ min(p, q), computed as Σ max(p − q, 0) so that p = q gives exactly 0."""
    return float(np.clip(p - q, 0.0, None).sum())


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray | None:
    """r = max(p − q, 0)/Z, or ``None`` when Z = 0 (p = q: the branch is never taken, and 0/0 is avoided)."""
    positive = np.clip(p - q, 0.0, None)
    z = float(positive.sum())
    return positive / z if z > 0 else None


def corrected_law(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Law of the exact sampler's output: m + Z·r. Equals p (the theorem the audit checks)."""
    m = accepted_mass(p, q)
    r = residual(p, q)
    return m if r is None else m + rejection_probability(p, q) * r


def naive_law(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Law of "on rejection, resample from p": m + Z·p. Biased towards tokens the draft likes."""
    return accepted_mass(p, q) + rejection_probability(p, q) * p


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    """TV(a, b) = ½ Σ |a − b| = the largest disagreement over any event."""
    return 0.5 * float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).sum())


@dataclass(frozen=True)
class PositionLaws:
    """Every analytic quantity of one position, as the audit reports them."""

    p: np.ndarray
    q: np.ndarray
    accepted_mass: np.ndarray
    accepted_total: float
    z: float
    residual: np.ndarray | None
    corrected: np.ndarray
    naive: np.ndarray
    tv_corrected: float
    tv_naive: float

    @classmethod
    def of(cls, p: np.ndarray, q: np.ndarray) -> PositionLaws:
        m = accepted_mass(p, q)
        corrected, naive = corrected_law(p, q), naive_law(p, q)
        return cls(p=p, q=q, accepted_mass=m, accepted_total=float(m.sum()),
                   z=rejection_probability(p, q), residual=residual(p, q), corrected=corrected,
                   naive=naive, tv_corrected=total_variation(corrected, p),
                   tv_naive=total_variation(naive, p))

    def as_dict(self) -> dict[str, object]:
        return {
            "p": self.p.tolist(), "q": self.q.tolist(),
            "accepted_mass": self.accepted_mass.tolist(), "accepted_total": self.accepted_total,
            "Z": self.z, "residual": None if self.residual is None else self.residual.tolist(),
            "corrected_law": self.corrected.tolist(), "naive_law": self.naive.tolist(),
            "tv_corrected_vs_p": self.tv_corrected, "tv_naive_vs_p": self.tv_naive,
        }
