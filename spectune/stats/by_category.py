"""Per-category tables, as Spec-Bench reports them: one row per (method, category) and the method's overall row.

A workload that mixes prompt categories (``workload.categories=[qa,code,...]``) averages speed-ups that differ by
category: a draft that guesses code well and summaries badly shows one number for both. Spec-Bench therefore reports
every number per category. :func:`by_category` does it from a run's request and cycle rows, in one place for every
caller (``task=bench``, ``task=tune``, ``analysis.report``; ``policies.evaluate`` can pass its own frames).

Per (method, category): the requests behind it, output tokens, seconds (decode: Σ (E2EL − TTFT); wall: Σ time
shares, each request's E2EL scaled so that the shares of one (method, repeat) add up to that run's measured
duration, :func:`spectune.stats.compare.throughput_terms`), the acceptance length (1 + accepted drafts per
speculative cycle, as ``spec_decode_acceptance_length``), the share of cycles that asked for drafts and got no
proposal (a model-free proposer without a match), output and decode tok/s, the speed-up over the
baseline with its paired interval (prompt or block units, every repeat together, :mod:`spectune.stats.units`)
and the category's share of the method's tokens and seconds. The overall row (``category = "all"``) is the sum of
the category rows, its rates recomputed from those sums, so a table's rows always add up; its intervals are over
every unit of the run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from spectune.engine.records import DEFAULT_CATEGORY, asked_cycles
from spectune.stats.compare import BASELINE, EQUIVALENCE_MARGIN, decode_terms, throughput_terms
from spectune.stats.intervals import Interval, mde, ratio_interval, verdict
from spectune.stats.units import speedup_interval, units_of

log = logging.getLogger(__name__)

ALL = "all"  # the overall row's category
SUMS = ("requests", "output_tokens", "decode_tokens", "decode_s", "wall_s", "spec_cycles", "accepted_tokens",
        "no_proposal_cycles")


def with_category(frame: pd.DataFrame, default: str = DEFAULT_CATEGORY) -> pd.DataFrame:
    """``frame`` with a ``category`` column: rows recorded before requests carried their category are ``default``'s
    (a ``task`` column, the name it had before, is renamed on reading: :mod:`spectune.names`)."""
    if "category" in frame:
        return frame.assign(category=frame["category"].fillna(default).astype(str))
    return frame.assign(category=default)


def categories_of(requests: pd.DataFrame) -> list[str]:
    """The categories of a run's requests, in the order they first appear (the workload's interleaved order)."""
    if not len(requests):
        return []
    return list(dict.fromkeys(with_category(requests)["category"]))


def several_categories(requests: pd.DataFrame) -> bool:
    """Whether a per-category breakdown says more than the overall table: the run holds more than one category."""
    return len(categories_of(requests)) > 1


def durations_of(points: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], float]:
    """{(method, repeat): duration_s} of the points that completed."""
    return {(str(p["method"]), int(p.get("repeat", 0))): float(p["duration_s"]) for p in points
            if p.get("status") == "ok" and p.get("duration_s") is not None}


def by_category(requests: pd.DataFrame, cycles: pd.DataFrame | None, durations: Mapping[tuple[str, int], float], *,
                baseline: str = BASELINE, unit_size: int = 1, margin: float = EQUIVALENCE_MARGIN) -> pd.DataFrame:
    """One row per (method, category), then the method's ``all`` row, methods in their order of appearance.

    ``requests``: the run's request rows (method, repeat, request_id, status, output_tokens, ttft_ms, e2el_ms,
    category; a missing category column reads as :data:`DEFAULT_CATEGORY`); ``cycles``: its cycle rows (method, repeat,
    request_id, num_drafts, accepted; None: no acceptance columns); ``durations``: each completed (method,
    repeat) run's seconds (:func:`durations_of`). Rows of (method, repeat) runs without a duration (failed)
    are left out, as the overall comparison leaves them out. The speed-up columns compare with ``baseline``
    when the run has it; ``unit_size`` is the prompts per independent unit (:func:`units.unit_size_of`).
    """
    if not len(requests):
        return pd.DataFrame()
    req = with_category(requests)
    req = req[[(m, int(r)) in durations for m, r in zip(req["method"], req["repeat"], strict=True)]]
    if not len(req):
        return pd.DataFrame()
    categories = list(dict.fromkeys(req["category"]))
    wall = throughput_terms(req, durations)
    decode = decode_terms(req)
    spec = _spec_cycles(cycles, req)
    rows = []
    for method in dict.fromkeys(req["method"]):
        mine = []
        for category in [*categories, ALL]:
            pick = (lambda f: f) if category == ALL else (lambda f, c=category: f[f["category"] == c])
            mine.append(_row(method, category, pick(req), pick(wall), pick(decode), pick(spec), baseline, unit_size,
                             margin))
        total = {k: sum(r[k] for r in mine[:-1]) for k in SUMS}  # the overall row: the category rows' sums
        mine[-1].update(total, **_rates(total))
        for r in mine:
            r["token_share"] = r["output_tokens"] / total["output_tokens"] if total["output_tokens"] else None
            r["time_share"] = r["wall_s"] / total["wall_s"] if total["wall_s"] else None
        rows += mine
    return pd.DataFrame(rows)


def _spec_cycles(cycles: pd.DataFrame | None, requests: pd.DataFrame) -> pd.DataFrame:
    """The (method, repeat, request_id) cycle rows that asked for drafts (γ > 0; num_drafts 0 where the proposer
    found none) with their request's category."""
    columns = ["method", "repeat", "request_id", "num_drafts", "accepted", "category"]
    if cycles is None or not len(cycles) or "num_drafts" not in cycles:
        return pd.DataFrame(columns=columns)
    spec = asked_cycles(cycles)[["method", "repeat", "request_id", "num_drafts", "accepted"]]
    keys = requests[["method", "repeat", "request_id", "category"]].drop_duplicates(["method", "repeat", "request_id"])
    return spec.merge(keys, on=["method", "repeat", "request_id"], how="inner")


def _rates(sums: Mapping[str, float]) -> dict[str, float | None]:
    """The rates of a row, from its sums only."""
    return {"output_throughput": sums["output_tokens"] / sums["wall_s"] if sums["wall_s"] > 0 else None,
            "decode_throughput": sums["decode_tokens"] / sums["decode_s"] if sums["decode_s"] > 0 else None,
            "acceptance_length": 1 + sums["accepted_tokens"] / sums["spec_cycles"] if sums["spec_cycles"] else None,
            "no_proposal_share": (sums["no_proposal_cycles"] / (sums["spec_cycles"] + sums["no_proposal_cycles"])
                                  if sums["spec_cycles"] + sums["no_proposal_cycles"] else None)}


def _row(method: str, category: str, req: pd.DataFrame, wall: pd.DataFrame, decode: pd.DataFrame, spec: pd.DataFrame,
         baseline: str, unit_size: int, margin: float) -> dict[str, Any]:
    ok = req[(req["method"] == method) & (req["status"] == "ok")]
    mine_wall, mine_decode = wall[wall["method"] == method], decode[decode["method"] == method]
    mine_asked = spec[spec["method"] == method]
    mine_spec = mine_asked[mine_asked["num_drafts"] > 0]
    sums = {"requests": len(ok), "output_tokens": int(ok["output_tokens"].sum()),
            "decode_tokens": int(mine_decode["num"].sum()), "decode_s": float(mine_decode["den"].sum()),
            "wall_s": float(mine_wall["den"].sum()), "spec_cycles": len(mine_spec),
            "accepted_tokens": int(mine_spec["accepted"].sum()),
            "no_proposal_cycles": int((mine_asked["num_drafts"] == 0).sum())}
    row: dict[str, Any] = {"method": method, "category": category, "prompts": int(ok["request_id"].nunique()), **sums,
                           **_rates(sums)}
    for key, terms in (("speedup", wall), ("decode_speedup", decode)):
        iv = _speedup(terms, method, baseline, unit_size)
        row[key] = 1.0 if method == baseline else iv.estimate if iv else None
        row[f"{key}_ci95_lo"], row[f"{key}_ci95_hi"] = (iv.lo, iv.hi) if iv else (None, None)
        effect = mde(iv) if iv else None
        row[f"{key}_mde_pct"] = None if effect is None else 100 * effect
        row[f"{key}_verdict"] = verdict(iv, margin) if iv else None
        row[f"{key}_units"] = iv.n if iv else 0
    return row


def _speedup(terms: pd.DataFrame, method: str, baseline: str, unit_size: int) -> Interval | None:
    """The paired interval of ``method``'s rate over ``baseline``'s on these rows' units (None for the baseline
    itself, or without both methods)."""
    pair = terms[terms["method"].isin([method, baseline])]
    if method == baseline or {method, baseline} - set(pair["method"]):
        return None
    units = units_of(pair, unit_size)
    if units.n == 0 or method not in units.num or baseline not in units.num:
        return None
    iv = speedup_interval(units, method, baseline)
    return iv if math.isfinite(iv.estimate) else None


def records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The table as JSON-ready rows (NaN → None), for ``summary.json``'s ``by_category``."""
    out = []
    for row in table.to_dict("records"):
        out.append({k: (None if isinstance(v, float) and not np.isfinite(v) else
                        v.item() if isinstance(v, np.generic) else v) for k, v in row.items()})
    return out


def alpha_by_category(categories: Sequence[str], sums: Sequence[float],
                      counts: Sequence[int]) -> dict[str, dict[str, Any]]:
    """``task=acceptance`` per category: per prompt its category, Σ min(p, q) over its positions and their number;
    per category α = Σ sums / Σ counts with its interval over the category's prompts, its prompts, positions and
    share of positions (the shares add up to 1, as the bench's per-category tokens add up to the run's)."""
    total = sum(counts)
    out: dict[str, dict[str, Any]] = {}
    for category in dict.fromkeys(categories):
        pick = [i for i, c in enumerate(categories) if c == category]
        iv = ratio_interval(np.array([sums[i] for i in pick]), np.array([counts[i] for i in pick], dtype=float))
        positions = int(sum(counts[i] for i in pick))
        out[category] = {"alpha": iv.estimate, "alpha_ci95_lo": iv.lo, "alpha_ci95_hi": iv.hi, "prompts": len(pick),
                         "positions": positions, "position_share": positions / total if total else None}
    return out
