"""A method picked on some prompts, measured again against AR on prompts the pick never saw.

A grid's best γ is the maximum of several noisy estimates, so its estimate is biased upward (the winner's curse);
the same method against AR on fresh prompts is an unbiased check of the pick. ``task=bench``'s confirmation
(``task.confirm_prompts``) and ``task=tune``'s validation of its γ map (``task.validate_prompts``) both run it here:
the caller's ``measure`` runs the two methods in the run's design (repeats, interleaving) on any
:class:`~spectune.engines.base.MeasuringEngine` and writes them where its run keeps them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from spectune.engine.records import Request
from spectune.measure.repeats import Grid, aggregate
from spectune.methods import AR, Method

log = logging.getLogger(__name__)

FASTER, UNRESOLVED, SLOWER = "faster than AR", "not resolved", "slower than AR"
FIELDS = ("speedup", "speedup_ci95_lo", "speedup_ci95_hi", "speedup_mde_pct", "speedup_verdict")

Measure = Callable[[list[Request], list[Method]], Grid]


def held(lo: float | None, hi: float | None) -> str | None:
    """Whether a pick held on fresh prompts, read from its paired 95% interval of the speed-up over AR: faster
    (the interval above 1), slower (below 1), else not resolved; None without an interval."""
    if lo is None or hi is None:
        return None
    return FASTER if lo > 1 else SLOWER if hi < 1 else UNRESOLVED


def against_ar(measure: Measure, method: Method, fresh: list[Request], *, unit_size: int, seed: int = 0,
               what: str = "confirmation") -> dict[str, Any]:
    """``method`` and AR on ``fresh`` through ``measure``: the speed-up with its paired 95% interval over units of
    ``unit_size`` prompts, the interval's verdict and whether the pick held (:func:`held`). A run in which the
    method failed reports ``status: failed`` and no numbers. ``what`` begins the logged line."""
    assert method.speculative, "AR against itself confirms nothing"
    grid = measure(fresh, [AR, method])
    methods, _ = aggregate(grid, seed=seed, unit_size=unit_size)
    row = next((m for m in methods if m["method"] == method.label), {})
    out: dict[str, Any] = {"method": method.label, "gamma": method.gamma, "prompts": len(fresh)}
    if row.get("speedup") is None:
        log.warning("%s on %d fresh prompts: %s not measured (%s)", what, len(fresh), method.label,
                    row.get("error") or "no speed-up over ar")
        return {**out, "status": "failed", **dict.fromkeys(FIELDS), "held": None}
    out.update(status="ok", **{k: row.get(k) for k in FIELDS})
    out["held"] = held(out["speedup_ci95_lo"], out["speedup_ci95_hi"])
    log.info(f"{what} on {len(fresh)} fresh prompts: {method.label} {out['speedup']:.2f}x "
             f"[{out['speedup_ci95_lo']:.2f}, {out['speedup_ci95_hi']:.2f}] vs ar: {out['speedup_verdict']}")
    return out
