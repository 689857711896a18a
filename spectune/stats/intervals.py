"""Confidence intervals over independent units, and the smallest effect they can resolve.

The unit is what a re-run would draw afresh: a prompt (all of its repeats together), or at concurrency > 1 a
block of prompts batched together. Repeats of one prompt re-run identical work, so counting them as independent
draws (the old (repeat, prompt) unit) makes intervals too narrow: 15 of 20 A/A intervals of that design
excluded 0 on a quiet machine.

The statistics of a benchmark are ratios of sums over units (tokens / seconds; one method's rate over
another's). Their interval here is a t-interval with the jackknife's standard error: the statistic recomputed
with each unit left out, their spread, and a Student-t quantile whose degrees of freedom are the units' Kish
effective number less one (n_eff = (Σw)² / Σw², w the unit's seconds): a pooled ratio leans on its longest
units, and with 8 units of unequal length it has fewer than 7 degrees of freedom. It keeps the pooled estimate
(Σ tokens / Σ time) and holds its coverage at 8–36 units (``tests/test_coverage.py`` simulates it), where
the delta method's t-interval and BCa's bootstrap under-cover. A ratio's interval is computed on the log scale
and mapped back, so it is never negative.

A second source of variance no resampling of units can see: identical work run under two labels in one process
can differ by several percent for a whole repeat (measured on the embedded pair), and every unit of that repeat
shares the shift. Given (units × repeats) arrays, :func:`paired_ratio_interval` estimates that method × repeat
component from the two-way ANOVA of the log speedup and adds it, with R − 1 degrees of freedom (Welch–
Satterthwaite): with two or three repeats such a shift makes the interval honestly wide.

The BCa bootstrap (``scipy.stats.bootstrap``) remains for quantiles (latency percentiles) and, under
``bootstrap_*`` names, to report the old unit's intervals beside the new ones.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

log = logging.getLogger(__name__)

N_RESAMPLES = 2000
CONFIDENCE = 0.95
POWER = 0.80
T_METHOD = "t (jackknife over independent units, Kish effective df; with repeats, + the method x repeat component)"
BOOTSTRAP_METHOD = "scipy.stats.bootstrap (BCa; percentile where BCa is undefined)"


@dataclass(frozen=True)
class Interval:
    """A point estimate with its CI; ``n`` units behind it. ``se`` is the standard error on the scale the interval
    was built on (``log`` for ratios, else linear) and ``df`` its degrees of freedom (t-intervals only)."""

    estimate: float
    lo: float
    hi: float
    n: int
    method: str
    se: float | None = None
    df: float | None = None
    scale: str = "linear"

    def contains(self, value: float) -> bool:
        return bool(self.lo <= value <= self.hi)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def t_quantile(df: float, level: float) -> float:
    """Student-t quantile at ``level`` (one-sided) with ``df`` degrees of freedom."""
    return float(stats.t.ppf(level, df))


def _t_interval(estimate: float, leave_one_out: np.ndarray, weights: np.ndarray, *, log_scale: bool,
                confidence: float, extra: tuple[float, float] | None = None) -> Interval:
    """estimate ± t·se on the statistic's scale (log for a ratio, then mapped back), se the jackknife's over the
    leave-one-out values, t with the units' Kish effective number − 1 degrees of freedom. ``extra`` = (variance,
    df) adds a component the units cannot see (a method × repeat shift shared by every unit of a repeat); the
    degrees of freedom then combine by Welch–Satterthwaite."""
    n = int(leave_one_out.size)
    if n < 2 or not np.isfinite(estimate) or (log_scale and estimate <= 0):
        return Interval(estimate, estimate, estimate, n, "none (fewer than 2 units)" if n < 2 else "undefined")
    loo = np.log(leave_one_out) if log_scale else leave_one_out
    if not np.all(np.isfinite(loo)):
        return Interval(estimate, float("nan"), float("nan"), n, "undefined")
    se = float(np.sqrt((n - 1) / n * np.sum((loo - loo.mean()) ** 2)))
    scale = "log" if log_scale else "linear"
    df = max(1.0, float(weights.sum() ** 2 / np.sum(weights ** 2)) - 1) if weights.sum() > 0 else float(n - 1)
    if extra is not None and extra[0] > 0:
        var_units, (var_extra, df_extra) = se ** 2, extra
        se = math.sqrt(var_units + var_extra)
        df = se ** 4 / (var_units ** 2 / df + var_extra ** 2 / df_extra)
    if se <= 1e-12 * max(1.0, float(np.abs(loo).max())):  # every unit agrees (to rounding): the interval is the point
        return Interval(estimate, estimate, estimate, n, T_METHOD, 0.0, df, scale)
    half = t_quantile(df, 0.5 + confidence / 2) * se
    if log_scale:
        centre = math.log(estimate)
        return Interval(estimate, math.exp(centre - half), math.exp(centre + half), n, T_METHOD, se, df, scale)
    return Interval(estimate, estimate - half, estimate + half, n, T_METHOD, se, df, scale)


def _arrays(*samples: np.ndarray) -> tuple[np.ndarray, ...]:
    arrays = tuple(np.asarray(s, dtype=float) for s in samples)
    assert all(a.shape == arrays[0].shape for a in arrays), "paired samples need one value per unit each"
    return arrays


def _rates(num: np.ndarray, den: np.ndarray) -> tuple[float, np.ndarray]:
    """Σnum/Σden, and the same with each unit left out (NaN where nothing would be left)."""
    total_den = den.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        loo = (num.sum() - num) / (total_den - den)
    return (float(num.sum() / total_den) if total_den else float("nan")), np.where(total_den - den > 0, loo, np.nan)


def ratio_interval(num: np.ndarray, den: np.ndarray, *, confidence: float = CONFIDENCE) -> Interval:
    """CI of Σnum / Σden (e.g. tokens / seconds = throughput) over units."""
    num, den = _arrays(num, den)
    estimate, loo = _rates(num, den)
    return _t_interval(estimate, loo, den, log_scale=True, confidence=confidence)


def repeat_component(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray
                     ) -> tuple[float, float] | None:
    """The variance a method × repeat shift adds to a speedup averaged over R repeats, from (units × repeats)
    arrays: the two-way ANOVA of the per-(unit, repeat) log speedup, σ²_repeat = (MS_repeat − MS_residual) / n
    (0 when negative), divided by R; with R − 1 degrees of freedom. Identical work run under two labels can
    differ by 10% for a whole repeat (measured on the tiny pair: where the allocator put one label's buffers);
    every unit of that repeat shares the shift, so no resampling of units sees it. None with one repeat."""
    na, da, nb, db = (np.asarray(x, dtype=float) for x in (num_a, den_a, num_b, den_b))
    if na.ndim != 2 or na.shape[1] < 2 or na.shape[0] < 2:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log((na / da) / (nb / db))
    y = y[np.all(np.isfinite(y), axis=1)]
    n, r = y.shape
    if n < 2:
        return None
    rows, cols, grand = y.mean(axis=1, keepdims=True), y.mean(axis=0, keepdims=True), y.mean()
    ms_repeat = n * float(((cols - grand) ** 2).sum()) / (r - 1)
    ms_residual = float(((y - rows - cols + grand) ** 2).sum()) / ((n - 1) * (r - 1))
    return max(0.0, (ms_repeat - ms_residual) / n) / r, float(r - 1)


def paired_ratio_interval(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray, *,
                          confidence: float = CONFIDENCE) -> Interval:
    """CI of (Σnum_a/Σden_a) / (Σnum_b/Σden_b) on the same units: the speedup of a over b. Given (units ×
    repeats) arrays, the units are their rows summed and a method × repeat component
    (:func:`repeat_component`) joins the units' variance."""
    na, da, nb, db = _arrays(num_a, den_a, num_b, den_b)
    extra = None
    if na.ndim == 2:
        extra = repeat_component(na, da, nb, db)
        na, da, nb, db = (x.sum(axis=1) for x in (na, da, nb, db))
    (ra, loo_a), (rb, loo_b) = _rates(na, da), _rates(nb, db)
    if not (np.isfinite(ra) and np.isfinite(rb) and rb > 0):
        return Interval(float("nan"), float("nan"), float("nan"), int(na.size), "undefined")
    with np.errstate(divide="ignore", invalid="ignore"):
        loo = loo_a / loo_b
    return _t_interval(ra / rb, loo, da + db, log_scale=True, confidence=confidence, extra=extra)


def paired_difference_interval(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray, *,
                               confidence: float = CONFIDENCE) -> Interval:
    """CI of Σnum_a/Σden_a − Σnum_b/Σden_b on the same units (a throughput or acceptance difference)."""
    na, da, nb, db = _arrays(num_a, den_a, num_b, den_b)
    (ra, loo_a), (rb, loo_b) = _rates(na, da), _rates(nb, db)
    if not (np.isfinite(ra) and np.isfinite(rb)):
        return Interval(float("nan"), float("nan"), float("nan"), int(na.size), "undefined")
    return _t_interval(ra - rb, loo_a - loo_b, da + db, log_scale=False, confidence=confidence)


def mde(iv: Interval, *, power: float = POWER, confidence: float = CONFIDENCE) -> float | None:
    """The minimum detectable effect of ``iv``'s design: the true effect that a two-sided test at ``confidence``
    detects with probability ``power``, (t_{1-a/2} + t_power)·se. A relative change (0.03 = 3%) for a ratio, a
    difference on the estimate's own scale otherwise. It plans; it never decides."""
    if iv.se is None or iv.df is None:
        return None
    shift = (t_quantile(iv.df, 0.5 + confidence / 2) + t_quantile(iv.df, power)) * iv.se
    return math.exp(shift) - 1.0 if iv.scale == "log" else shift


def verdict(iv: Interval, margin: float, *, null: float = 1.0) -> str:
    """How an interval decides: "faster"/"slower" where it excludes ``null``, "equivalent" where it lies inside
    ``null`` ± margin (relative, for a ratio), otherwise "not resolved (MDE x%)". A difference (``null`` = 0) reads
    "higher"/"lower"."""
    if not (np.isfinite(iv.lo) and np.isfinite(iv.hi)):
        return "no interval"
    up, down = ("faster", "slower") if null else ("higher", "lower")
    if iv.lo > null:
        return up
    if iv.hi < null:
        return down
    lo, hi = (null / (1 + margin), null * (1 + margin)) if null else (-margin, margin)
    if lo <= iv.lo and iv.hi <= hi:
        return f"equivalent (±{100 * margin:g}%)"
    effect = mde(iv)
    return f"not resolved (MDE {100 * effect:.1f}%)" if effect is not None and null else "not resolved"


# -- bootstrap: quantiles, and the old (repeat, prompt) unit for comparison -----------------------------------
def bootstrap(samples: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], *, seed: int,
              n_resamples: int = N_RESAMPLES, confidence: float = CONFIDENCE) -> Interval:
    """CI of ``statistic(*samples, axis=-1)`` resampling the units jointly (paired) across ``samples``
    (BCa; the percentile method where BCa is undefined). With fewer than 2 units the CI is the point."""
    arrays = tuple(np.asarray(s, dtype=float) for s in samples)
    n = len(arrays[0])
    assert all(len(a) == n for a in arrays), "paired samples need one value per unit each"
    estimate = float(statistic(*arrays, axis=-1))
    if n < 2:
        return Interval(estimate, estimate, estimate, n, "none (fewer than 2 units)")
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degenerate resamples: handled by the fallback below
            res = stats.bootstrap(arrays, statistic, n_resamples=n_resamples, paired=True, vectorized=True,
                                  confidence_level=confidence, method=method, rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if np.isfinite(lo) and np.isfinite(hi):
            return Interval(estimate, lo, hi, n, method)
    if np.all(res.bootstrap_distribution == estimate):  # every resample equal: the CI is the point
        return Interval(estimate, estimate, estimate, n, "percentile")
    return Interval(estimate, float("nan"), float("nan"), n, "undefined")


def _ratio(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(num, axis=axis) / np.sum(den, axis=axis)


def bootstrap_paired_ratio_interval(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray, *,
                                    seed: int, **kw: Any) -> Interval:
    """The speedup's BCa interval over whatever units it is given: how intervals were made before units were
    prompts (given (repeat, prompt) cells, it reproduces the old unit for comparison)."""

    def speedup(na: np.ndarray, da: np.ndarray, nb: np.ndarray, db: np.ndarray, axis: int = -1) -> np.ndarray:
        return _ratio(na, da, axis) / _ratio(nb, db, axis)

    return bootstrap((num_a, den_a, num_b, den_b), speedup, seed=seed, **kw)


def quantile_interval(values: np.ndarray, q: float, *, seed: int, **kw: Any) -> Interval:
    """CI of the q-th percentile (numpy 'linear', as in the summaries) of per-request values (bootstrap)."""

    def percentile(v: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.percentile(v, q, axis=axis, method="linear")

    return bootstrap((np.asarray(values, dtype=float),), percentile, seed=seed, **kw)
