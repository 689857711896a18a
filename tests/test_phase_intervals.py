"""Per-phase speed-up intervals (spectune/stats/by_phase.py): the overall table's interval on one phase's requests,
the phase's span as each run's duration, units of the phase's concurrency that never span phases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectune.stats.by_phase import by_phase, format_phase_table, phase_spans, workload_units
from spectune.stats.units import speedup_interval


def _requests(speed: dict[str, float], seed: int, noise: float) -> pd.DataFrame:
    """2 methods x 2 repeats; phase p1 at concurrency 1 (prompts 0-3, one after another), p2 at concurrency 2
    (prompts 4-7, two at a time). A request of 10 tokens takes 1 / speed[method] s, times lognormal noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for repeat in range(2):
        for method, rate in speed.items():
            clock = 0.0
            for phase, ids, width in (("p1", range(4), 1), ("p2", range(4, 8), 2)):
                for start in range(0, len(ids), width):
                    batch = list(ids)[start:start + width]
                    spans = [float(np.exp(rng.normal(0, noise))) / rate for _ in batch]
                    for request_id, span in zip(batch, spans, strict=True):
                        rows.append({"method": method, "repeat": repeat, "request_id": request_id, "phase": phase,
                                     "status": "ok", "output_tokens": 10, "arrival_s": clock,
                                     "finish_s": clock + span, "e2el_ms": 1e3 * span})
                    clock += max(spans)
    return pd.DataFrame(rows)


def test_an_exact_twofold_speedup_has_an_interval_of_width_zero_in_each_phase():
    """No noise: every unit of every phase is exactly twice as fast, so each phase's interval is [2, 2]."""
    rows = by_phase(_requests({"ar": 1.0, "fixed:gamma=4": 2.0}, seed=0, noise=0.0),
                    concurrency={"p1": 1, "p2": 2})
    spec = {r["phase"]: r for r in rows if r["method"] == "fixed:gamma=4"}
    for phase in ("p1", "p2"):
        assert spec[phase]["speedup"] == pytest.approx(2.0)
        assert spec[phase]["speedup_ci"] == pytest.approx([2.0, 2.0])
    assert all("speedup_ci" not in r for r in rows if r["method"] == "ar")


def test_with_noise_the_interval_holds_the_estimate_and_needs_the_concurrency():
    """Seeded noise (SD 0.2 on the log scale): each interval holds its phase's pooled estimate; p2's rests on two
    units (blocks of two of its four prompts, renumbered from the phase's first); without ``concurrency`` there is
    no interval and the table prints '-'."""
    frame = _requests({"ar": 1.0, "fixed:gamma=4": 1.5}, seed=11, noise=0.2)
    rows = by_phase(frame, concurrency={"p1": 1, "p2": 2})
    for row in (r for r in rows if r["method"] == "fixed:gamma=4"):
        lo, hi = row["speedup_ci"]
        assert lo < row["speedup"] < hi
    assert "[" in format_phase_table(rows)
    bare = by_phase(frame)
    assert all("speedup_ci" not in r for r in bare) and "[" not in format_phase_table(bare)


def test_the_workload_units_keep_each_phase_s_own_units_and_weigh_phases_by_their_spans():
    """Over both phases: p1's four prompts and p2's two blocks of two are six units; a method's rate is its tokens
    over its phases' summed spans; an exact twofold speed-up everywhere has the interval [2, 2]; with seeded noise
    the paired interval holds the pooled ratio."""
    exact = _requests({"ar": 1.0, "fixed:gamma=4": 2.0}, seed=0, noise=0.0)
    units = workload_units(exact, {"p1": 1, "p2": 2})
    assert units.n == 6
    interval = speedup_interval(units, "fixed:gamma=4", "ar")
    assert (interval.lo, interval.hi) == pytest.approx((2.0, 2.0))
    noisy = _requests({"ar": 1.0, "fixed:gamma=4": 1.5}, seed=11, noise=0.2)
    units = workload_units(noisy, {"p1": 1, "p2": 2})
    spans = phase_spans(noisy).groupby("method")[["output_tokens", "seconds"]].sum()
    for method in ("ar", "fixed:gamma=4"):
        assert units.rate(method) == pytest.approx(spans.loc[method, "output_tokens"] / spans.loc[method, "seconds"])
    ratio = units.rate("fixed:gamma=4") / units.rate("ar")
    interval = speedup_interval(units, "fixed:gamma=4", "ar")
    assert interval.lo < ratio < interval.hi
