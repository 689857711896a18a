"""The independent units of a comparison, and where the variance of a speedup comes from.

A run measures every method on the same prompts, ``repeats`` times. The unit is what a new run would draw
afresh: a prompt at concurrency 1 — all of its repeats together, since a repeat re-runs identical work — and
at concurrency > 1 a block of consecutive prompts (``unit_size`` of them, the interleaved block or one batch's
worth), since requests batched together share every step's time. Per method and unit, tokens and seconds are
summed over the repeats: ``Σ num / Σ den`` over the units is still the pooled rate.

:func:`components` splits the variance of the log speedup of two methods into the parts a user can act on:
between units (more prompts narrow it), between repeats of a unit (more repeats narrow it), and drift over the
run (interleaving cancels it; a trend in the *ratio* means the methods met different conditions). A fourth part,
between processes (a method that runs faster in one process than in another), is invisible from inside one
process: ``task=coverage`` measures it across fresh processes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from spectune.stats.intervals import CONFIDENCE, POWER, Interval, paired_ratio_interval, t_quantile

log = logging.getLogger(__name__)


@dataclass
class Units:
    """Per method, one value per unit: ``num`` (tokens, good requests) and ``den`` (seconds), every repeat summed,
    aligned on ``keys`` (the units every method completed in every repeat it ran); ``cells`` keeps the per-(method,
    unit, repeat) sums behind them, for the variance components."""

    keys: list[int]
    num: dict[str, np.ndarray]
    den: dict[str, np.ndarray]
    cells: pd.DataFrame  # columns method, unit, repeat, num, den
    unit: str = "prompt"

    @property
    def n(self) -> int:
        return len(self.keys)

    def rate(self, method: str) -> float:
        """Σ num / Σ den of ``method`` over every unit (its pooled rate)."""
        return float(self.num[method].sum() / self.den[method].sum())

    def aligned(self, method: str) -> pd.DataFrame:
        """``method``'s per-(unit, repeat) cells over the aligned units (``keys``)."""
        return self.cells[(self.cells["method"] == method) & self.cells["unit"].isin(self.keys)]

    def matrix(self, method: str) -> tuple[np.ndarray, np.ndarray]:
        """(num, den) of ``method`` as (units × repeats) arrays over the aligned units, repeats in order."""
        mine = self.aligned(method)
        num = mine.pivot_table(index="unit", columns="repeat", values="num", aggfunc="sum").reindex(self.keys)
        den = mine.pivot_table(index="unit", columns="repeat", values="den", aggfunc="sum").reindex(self.keys)
        return num.to_numpy(dtype=float), den.to_numpy(dtype=float)

    def per_repeat(self, method: str) -> list[float]:
        """The method's pooled rate in each repeat, over the aligned units."""
        sums = self.aligned(method).groupby("repeat")[["num", "den"]].sum()
        return [float(row.num / row.den) for row in sums.itertuples() if row.den > 0]


def unit_size_of(concurrency: int, block_prompts: int | None) -> int:
    """The prompts in one independent unit: 1 at concurrency 1 (a request runs alone); at concurrency > 1 the
    interleaved block (every method ran it whole, apart from other blocks) or, in the blocked design, one batch's
    worth of consecutive prompts (requests batched together share every step's time)."""
    if concurrency <= 1:
        return 1
    return int(block_prompts) if block_prompts else int(concurrency)


def speedup_interval(units: Units, a: str, b: str) -> Interval:
    """The paired interval of ``a``'s rate over ``b``'s: units as the independent draws, each with its repeats,
    and the method × repeat component beside them (:func:`spectune.stats.intervals.paired_ratio_interval`)."""
    (na, da), (nb, db) = units.matrix(a), units.matrix(b)
    if na.shape != nb.shape or na.shape[1] < 2 or not (np.isfinite(na).all() and np.isfinite(nb).all()):
        return paired_ratio_interval(units.num[a], units.den[a], units.num[b], units.den[b])
    return paired_ratio_interval(na, da, nb, db)


def describe_unit(unit_size: int) -> str:
    """The unit's name as summaries and tables print it."""
    if unit_size <= 1:
        return "prompt (its repeats together)"
    return f"block of {unit_size} consecutive prompts (its repeats together)"


def units_of(frame: pd.DataFrame, unit_size: int = 1) -> Units:
    """Long rows (method, repeat, request_id, num, den) → :class:`Units`. The unit of a request is
    ``request_id // unit_size`` (request ids count prompts in workload order). A unit is kept when every method
    has it in every repeat that method ran, so that no method's rate is pooled over a different set of prompts."""
    frame = frame.assign(unit=frame["request_id"].astype(int) // max(1, int(unit_size)))
    cells = frame.groupby(["method", "unit", "repeat"], as_index=False)[["num", "den"]].sum()
    repeats = cells.groupby("method")["repeat"].nunique()
    per_unit = cells.groupby(["unit", "method"])["repeat"].nunique().unstack("method")
    keep = per_unit.notna().all(axis=1) & (per_unit == repeats.reindex(per_unit.columns)).all(axis=1)
    keys = [int(u) for u in per_unit.index[keep]]
    kept = cells[cells["unit"].isin(keys)]
    wide_num = kept.pivot_table(index="unit", columns="method", values="num", aggfunc="sum").reindex(keys)
    wide_den = kept.pivot_table(index="unit", columns="method", values="den", aggfunc="sum").reindex(keys)
    return Units(keys, {m: wide_num[m].to_numpy(dtype=float) for m in wide_num.columns},
                 {m: wide_den[m].to_numpy(dtype=float) for m in wide_den.columns},
                 cells, describe_unit(unit_size))


def _log_rates(units: Units, method: str) -> pd.DataFrame:
    """log(num/den) per (unit, repeat) of ``method`` over the aligned units (rows with no time dropped)."""
    mine = units.aligned(method)
    mine = mine[(mine["den"] > 0) & (mine["num"] > 0)]
    return mine.assign(y=np.log(mine["num"] / mine["den"]))[["unit", "repeat", "y"]]


def _one_way(values: pd.DataFrame) -> tuple[float, float, int, int]:
    """Random-effects ANOVA of y over units with repeats inside: (between-unit variance, within-unit variance,
    units, repeats per unit — the smallest)."""
    groups = values.groupby("unit")["y"]
    counts = groups.size()
    n, r = int(counts.size), int(counts.min()) if counts.size else 0
    if n < 2:
        return float("nan"), float("nan"), n, r
    means = groups.transform("mean")
    within = float(((values["y"] - means) ** 2).sum() / max(1, len(values) - n)) if r > 1 else float("nan")
    between_ms = float(counts.mean() * groups.mean().var(ddof=1))
    between = max(0.0, between_ms - (within if r > 1 else 0.0)) / counts.mean()
    return between, within, n, r


def _trend_pct(values: pd.DataFrame) -> float | None:
    """The linear trend of y (after removing each unit's mean) over the run's order — repeat by repeat, unit by
    unit, as the interleaved design runs them — as the % change from the run's start to its end."""
    if len(values) < 3:
        return None
    order = values["repeat"].to_numpy(float) * (values["unit"].max() + 1) + values["unit"].to_numpy(float)
    resid = (values["y"] - values.groupby("unit")["y"].transform("mean")).to_numpy(float)
    span = order.max() - order.min()
    if span <= 0 or values["repeat"].nunique() < 2:
        return None
    x = (order - order.mean()) / span
    slope = float(np.dot(x, resid) / np.dot(x, x))
    return 100.0 * (math.exp(slope) - 1.0)


def _sd_pct(variance: float) -> float | None:
    return None if not np.isfinite(variance) else 100.0 * math.sqrt(variance)


def components(units: Units, a: str, b: str) -> dict[str, Any]:
    """Where the variance of log(rate_a / rate_b) comes from, as standard deviations in % of the rate: between
    units, between repeats of one unit, and the drift of the ratio over the run; with the machine's own drift (the
    trend of ``b``'s rate). A unit's SD enters an interval divided by √units, a repeat's by √(units·repeats)."""
    ya, yb = _log_rates(units, a), _log_rates(units, b)
    pair = ya.merge(yb, on=["unit", "repeat"], suffixes=("_a", "_b"))
    ratio = pair.assign(y=pair["y_a"] - pair["y_b"])[["unit", "repeat", "y"]]
    between, within, n, r = _one_way(ratio)
    return {"units": n, "repeats": r, "between_units_sd_pct": _sd_pct(between),
            "between_repeats_sd_pct": _sd_pct(within), "drift_pct": _trend_pct(ratio),
            "machine_drift_pct": _trend_pct(yb)}


def units_needed(sd: float, pilot_units: int, target: float, *, bound: float = 0.8, power: float = POWER,
                 confidence: float = CONFIDENCE, most: int = 100_000) -> int:
    """The units a run needs so that the minimum detectable effect of a speedup is at most ``target`` (0.03: 3%),
    planned from a pilot: ``sd`` is the pilot's SD of a unit's log speedup over ``pilot_units`` units, raised to
    its one-sided ``bound`` upper confidence limit (chi-square with pilot_units − 1 df: a pilot's SD is itself a
    noisy estimate, and planning on it as if exact under-powers half of all runs); then the smallest n with
    (t_{1−a/2} + t_power)·SD_upper/√n ≤ log(1 + target). The plan is fixed before the run: it plans, it never
    decides."""
    if not (sd >= 0 and pilot_units >= 2 and target > 0):
        raise ValueError(f"units_needed: sd={sd}, pilot_units={pilot_units}, target={target}")
    upper = sd * math.sqrt((pilot_units - 1) / stats.chi2.ppf(1 - bound, pilot_units - 1))
    goal = math.log1p(target)
    for n in range(2, most + 1):
        if (t_quantile(n - 1, 0.5 + confidence / 2) + t_quantile(n - 1, power)) * upper / math.sqrt(n) <= goal:
            return n
    return most
