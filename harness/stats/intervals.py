"""Bootstrap confidence intervals over (repeat, prompt) clusters, paired across methods.

Why clusters: the requests of one grid point are not independent draws (they share a repeat's machine
state, and a prompt's length and difficulty carry over to every method). Resampling whole (repeat,
prompt) clusters, and the *same* clusters for every method compared, keeps both dependencies in the
interval: a speedup's CI reflects how much the ranking depends on which prompts and which repeats
happened to be drawn, and the prompt-to-prompt variation common to two methods cancels in their ratio.

Everything here is a pure function of numpy arrays (one value per cluster), torch-free, seeded.
The resampling is ``scipy.stats.bootstrap`` (BCa by default; the percentile method where BCa is
undefined, e.g. when every resample gives the same value).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

log = logging.getLogger(__name__)

N_RESAMPLES = 2000
CONFIDENCE = 0.95
CI_METHOD = "scipy.stats.bootstrap (BCa; percentile where BCa is undefined)"
RESAMPLING_UNIT = "(repeat, prompt) cluster, the same clusters for every method (paired)"


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap CI; ``n`` is the number of clusters resampled."""

    estimate: float
    lo: float
    hi: float
    n: int
    method: str

    def contains(self, value: float) -> bool:
        return bool(self.lo <= value <= self.hi)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bootstrap(samples: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], *, seed: int,
              n_resamples: int = N_RESAMPLES, confidence: float = CONFIDENCE) -> Interval:
    """CI of ``statistic(*samples, axis=-1)`` resampling the clusters jointly (paired) across ``samples``.

    ``samples`` are equal-length 1-D arrays, one value per cluster. ``statistic`` must be vectorised
    (take ``axis``). With fewer than 2 clusters there is nothing to resample: the CI is the point.
    """
    arrays = tuple(np.asarray(s, dtype=float) for s in samples)
    n = len(arrays[0])
    assert all(len(a) == n for a in arrays), "paired samples need one value per cluster each"
    estimate = float(statistic(*arrays, axis=-1))
    if n < 2:
        return Interval(estimate, estimate, estimate, n, "none (fewer than 2 clusters)")
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


def ratio_interval(num: np.ndarray, den: np.ndarray, *, seed: int, **kw: Any) -> Interval:
    """CI of Σnum / Σden (e.g. tokens / seconds = throughput) over clusters."""
    return bootstrap((num, den), _ratio, seed=seed, **kw)


def paired_ratio_interval(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray, *,
                          seed: int, **kw: Any) -> Interval:
    """CI of (Σnum_a/Σden_a) / (Σnum_b/Σden_b) on the same clusters: the speedup of a over b."""

    def speedup(na: np.ndarray, da: np.ndarray, nb: np.ndarray, db: np.ndarray, axis: int = -1) -> np.ndarray:
        return _ratio(na, da, axis) / _ratio(nb, db, axis)

    return bootstrap((num_a, den_a, num_b, den_b), speedup, seed=seed, **kw)


def paired_difference_interval(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray, *,
                               seed: int, **kw: Any) -> Interval:
    """CI of Σnum_a/Σden_a − Σnum_b/Σden_b on the same clusters (a throughput difference, tok/s)."""

    def difference(na: np.ndarray, da: np.ndarray, nb: np.ndarray, db: np.ndarray, axis: int = -1) -> np.ndarray:
        return _ratio(na, da, axis) - _ratio(nb, db, axis)

    return bootstrap((num_a, den_a, num_b, den_b), difference, seed=seed, **kw)


def quantile_interval(values: np.ndarray, q: float, *, seed: int, **kw: Any) -> Interval:
    """CI of the q-th percentile (numpy 'linear', as in the summaries) of per-cluster values."""

    def percentile(v: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.percentile(v, q, axis=axis, method="linear")

    return bootstrap((np.asarray(values, dtype=float),), percentile, seed=seed, **kw)
