"""The speculative-decoding cost model (Leviathan et al. 2023): expected tokens per cycle against the cycle's price.

A cycle drafts γ tokens (each costs c target steps) and verifies them (g(γ) target steps), plus fixed
overheads, and emits 1..γ+1 tokens. Its speed-up over plain decoding is

    S(γ) = E(γ) / (c·γ + g(γ) + overhead),   E(γ) = 1 + Σ_{i=1..γ} P(first i drafts all accepted).

With independent acceptances of constant probability α, E = Σ_{i=0..γ} α^i = (1 − α^(γ+1))/(1 − α).
This is a model for choosing where to measure, not a measurement: a constant α hides the accepted-length
distribution, so :func:`expected_tokens_from_joint` takes measured joint probabilities instead.

Both sides are the library's (:mod:`spectune.costmodel.cycle`): E is :func:`spectune.costmodel.cycle.expected_tokens`
(the joint form) or its constant-α closed form, and the cycle's cost is :class:`StepCosts`, the library's
:class:`~spectune.costmodel.cycle.CycleCost` in units of one target step. This module validates the inputs with its
own names and sweeps; :mod:`analysis.costmodel.fit` fits it to measurements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pandas as pd

from spectune.costmodel.cycle import CycleCost, expected_tokens, expected_tokens_constant
from spectune.errors import SpectuneError
from spectune.options import check_gamma

VerifyCost: TypeAlias = float | int | Mapping[int, float] | Sequence[float] | Callable[[int], float]

_JOINT_TOL = 1e-9
DRAFTS = "γ (drafts per cycle)"  # what a γ is here, in its one-line error


def check_alpha(alpha: float, name: str = "alpha") -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
        raise SpectuneError(f"{name}={alpha!r} is out of range: must be a number in [0, 1]")
    return float(alpha)


def check_cost(value: float, name: str, *, positive: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise SpectuneError(f"{name}={value!r} is out of range: must be a finite number "
                            f"{'> 0' if positive else '>= 0'} (in units of one target step)")
    return float(value)


def expected_tokens_from_joint(joint: Sequence[float], name: str = "joint") -> float:
    """E = 1 + Σ_i P(first i drafts all accepted), ``joint[i-1]`` = P(first i accepted), i = 1..γ, once the joint
    is checked (:func:`spectune.costmodel.cycle.expected_tokens` at the joint's γ).

    The probabilities must lie in [0, 1] and be non-increasing (keeping i+1 drafts implies keeping i).
    """
    values = list(joint)
    if not values:
        raise SpectuneError(f"{name}=[] is invalid: give P(first i drafts accepted) for i = 1..γ (γ >= 1)")
    for i, v in enumerate(values, start=1):
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
            raise SpectuneError(f"{name}[{i - 1}]={v!r} is out of range: it is P(first {i} accepted), "
                                "must be in [0, 1]")
        if i > 1 and v > values[i - 2] + _JOINT_TOL:
            raise SpectuneError(f"{name}[{i - 1}]={v!r} exceeds {name}[{i - 2}]={values[i - 2]!r}: "
                                "P(first i accepted) must be non-increasing in i")
    return float(expected_tokens(values)[-1])


def joint_from_accepted_lengths(histogram: Sequence[float]) -> list[float]:
    """P(first i accepted) = P(N ≥ i), i = 1..γ, from a histogram of accepted drafts N ∈ 0..γ per cycle.

    Counts or probabilities both work (they are normalised). This is how a measured accepted-length
    distribution enters the cost model without assuming independent, identical acceptances.
    """
    h = np.asarray(list(histogram), dtype=np.float64)
    if h.ndim != 1 or h.size < 2 or not np.all(np.isfinite(h)) or np.any(h < 0) or h.sum() <= 0:
        raise SpectuneError(f"histogram={list(histogram)!r} is invalid: need counts >= 0 for N = 0..γ "
                            "(γ >= 1) with a positive total")
    tail = np.cumsum(h[::-1])[::-1] / h.sum()  # tail[k] = P(N >= k)
    return [float(x) for x in tail[1:]]


def verify_cost(g: VerifyCost, gamma: int, name: str = "g") -> float:
    """g(γ) in target steps: a constant, a mapping γ → cost, a sequence (entry i is g(i+1)) or a callable."""
    gamma = check_gamma(gamma, DRAFTS)
    if callable(g):
        value = g(gamma)
    elif isinstance(g, Mapping):
        lookup = {int(k): v for k, v in g.items()}
        if gamma not in lookup:
            raise SpectuneError(f"{name} has no entry for gamma={gamma}: the table covers {sorted(lookup)}")
        value = lookup[gamma]
    elif isinstance(g, Sequence) and not isinstance(g, str):
        if gamma > len(g):
            raise SpectuneError(f"{name} lists {len(g)} values (g(1)..g({len(g)})) but gamma={gamma} is "
                                "needed: give one value per γ of the sweep")
        value = g[gamma - 1]
    else:
        value = g
    return check_cost(value, f"{name}(gamma={gamma})", positive=True)


@dataclass(frozen=True)
class StepCosts(CycleCost):
    """A cycle's cost in units of one target step (the cost model's): a draft step costs ``c``, the verification of
    γ drafts ``g(γ)``, and the cycle ``overhead``. ``c_first``: a cycle's first draft step apart from the later
    ones (a fitted profile's c₁), None when every step costs ``c``.

    A profile's :class:`~spectune.costmodel.profile.CycleCosts` scaled to one target step is the same cost; the draft
    term is written here as c₁ + c (γ − 1) and there as γ c + (c₁ − c), equal in exact arithmetic and apart by at most
    an ulp in floating point, each kept so that the cost model's tables and the replays stay the numbers they were
    (``tests/test_cycle.py`` checks the two agree)."""

    c: float
    g: Callable[[int], float]
    overhead: float = 0.0
    c_first: float | None = None

    def draft(self, drafted: int) -> float:
        if self.c_first is None:
            return self.c * drafted
        return self.c_first + self.c * (drafted - 1) if drafted else 0.0

    def verify(self, drafts: int) -> float:
        return self.g(drafts)


def speedup(expected: float, gamma: int, c: float, g: VerifyCost = 1.0, overhead: float = 0.0) -> float:
    """S = E / (c·γ + g(γ) + overhead): tokens per target-step-equivalent of work."""
    gamma = check_gamma(gamma, DRAFTS)
    costs = StepCosts(check_cost(c, "c"), lambda drafts: verify_cost(g, drafts), check_cost(overhead, "overhead"))
    return expected / costs.cycle(gamma)


def sweep(alphas: Iterable[float], cs: Iterable[float], gammas: Iterable[int], g: VerifyCost = 1.0,
          overhead: float = 0.0, joint: Sequence[float] | None = None, g_name: str = "g") -> pd.DataFrame:
    """Every grid point (α, c, γ) with E, cycle cost and S.

    ``joint`` adds a "measured" series (alpha = NaN) whose E(γ) = 1 + Σ_{i≤γ} joint[i-1], for the γ it covers.
    """
    alphas = [check_alpha(a, "alpha") for a in alphas]
    cs = [check_cost(c, "c") for c in cs]
    gammas = sorted({check_gamma(x, DRAFTS) for x in gammas})
    overhead = check_cost(overhead, "overhead")
    series: list[tuple[str, float, Callable[[int], float], list[int]]] = [
        (f"alpha={a:g}", a, lambda gamma, a=a: expected_tokens_constant(a, gamma), gammas) for a in alphas]
    if joint is not None:
        expected_tokens_from_joint(joint)  # validates
        measured = expected_tokens(joint)
        series.append(("joint", math.nan, lambda gamma: float(measured[gamma]), [x for x in gammas if x <= len(joint)]))
    rows = []
    for label, a, expected, covered in series:
        for c in cs:
            costs = StepCosts(c, lambda gamma: verify_cost(g, gamma, g_name), overhead)
            for gamma in covered:
                g_value, cost = costs.verify(gamma), costs.cycle(gamma)
                e = expected(gamma)
                rows.append({"series": label, "alpha": a, "c": c, "gamma": gamma, "g": g_value,
                             "overhead": overhead, "E": e, "cost": cost, "S": e / cost})
    return pd.DataFrame(rows)


def optima(grid: pd.DataFrame) -> pd.DataFrame:
    """The best γ per (series, c): largest S, ties broken towards the smaller γ (less draft work).

    Rows of :func:`sweep` are ordered by γ within each (series, c), and idxmax returns the first maximum.
    """
    best = grid.groupby(["series", "c"], sort=False)["S"].idxmax()
    return grid.loc[best.to_numpy()].reset_index(drop=True)


def plot(grid: pd.DataFrame, best: pd.DataFrame):
    """S against γ, one line per (series, c), optima marked. Uses the Figure API (Agg, no pyplot state)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for (series, c), part in grid.groupby(["series", "c"], sort=False):
        line, = ax.plot(part["gamma"], part["S"], marker=".", label=f"{series}, c={c:g}")
        top = best[(best["series"] == series) & (best["c"] == c)]
        ax.plot(top["gamma"], top["S"], marker="*", markersize=14, color=line.get_color(), linestyle="none")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("draft length γ")
    ax.set_ylabel("speed-up S = E / (cγ + g(γ) + overhead)")
    ax.set_title("Cost model: speed-up against γ (★ = best γ)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    return fig

