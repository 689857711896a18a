"""Per-phase rows of a run in phases (``workload.phases``): what each method did in each regime.

A phase runs alone inside every point (its requests after the previous phase's, the clocks merged end to end), so its
seconds are its own span: from its first request's arrival to its last request's finish, in each repeat. The
per-category table's time shares (:mod:`spectune.stats.by_category`) would not do here: they scale each request's
latency, and a request in a batch of four has a latency four requests share. Per (method, phase): requests, output
tokens, seconds (summed over repeats), output tok/s over them, each repeat's tok/s, and the speed-up over the
baseline in the same phase (the ratio of the two pooled rates; a point estimate: the run's intervals are the overall
table's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from spectune.stats.compare import BASELINE, throughput_terms
from spectune.stats.units import Units, speedup_interval, units_of


def phases_of(requests: pd.DataFrame) -> list[str]:
    """The phases of a run's requests in run order ([] when it has none)."""
    if not len(requests) or "phase" not in requests:
        return []
    return [str(p) for p in dict.fromkeys(requests["phase"]) if p is not None and p == p]


def by_phase(requests: pd.DataFrame, baseline: str = BASELINE, concurrency: Mapping[str, int] | None = None
             ) -> list[dict[str, Any]]:
    """One row per (method, phase) of ``requests`` (columns method, repeat, phase, status, output_tokens,
    arrival_s, finish_s; request_id and e2el_ms for the intervals), methods in their order of appearance, phases in
    run order. ``concurrency``: each phase's, for the speed-up's interval (none where it is not given)."""
    phases = phases_of(requests)
    if not phases:
        return []
    spans = phase_spans(requests)
    rows: list[dict[str, Any]] = []
    for method in dict.fromkeys(requests["method"]):
        for phase in phases:
            mine = spans[(spans["method"] == method) & (spans["phase"] == phase)]
            if not len(mine):
                continue
            seconds = float(mine["seconds"].sum())
            tokens = int(mine["output_tokens"].sum())
            rows.append({"method": str(method), "phase": phase, "requests": int(mine["requests"].sum()),
                         "output_tokens": tokens, "seconds": seconds,
                         "output_throughput": tokens / seconds if seconds > 0 else None,
                         "output_throughput_per_repeat": [float(t / s) if s > 0 else None for t, s in
                                                          zip(mine["output_tokens"], mine["seconds"], strict=True)]})
    base = {r["phase"]: r["output_throughput"] for r in rows if r["method"] == baseline}
    for row in rows:
        ref, mine = base.get(row["phase"]), row["output_throughput"]
        row["speedup"] = mine / ref if ref and mine is not None else None
    for phase, size in (concurrency or {}).items():
        intervals = phase_intervals(requests[requests["phase"] == phase], spans[spans["phase"] == phase],
                                    int(size), baseline)
        for row in rows:
            if row["phase"] == phase and row["method"] in intervals:
                row["speedup_ci"] = intervals[row["method"]]
    return rows


def phase_spans(requests: pd.DataFrame) -> pd.DataFrame:
    """Per (method, phase, repeat): requests, output tokens and ``seconds``, the span from the phase's first arrival
    to its last finish (its completed requests)."""
    ok = requests[requests["status"] == "ok"]
    spans = ok.groupby(["method", "phase", "repeat"], sort=False).agg(
        requests=("request_id", "size"), output_tokens=("output_tokens", "sum"), first=("arrival_s", "min"),
        last=("finish_s", "max")).reset_index()
    spans["seconds"] = spans["last"] - spans["first"]
    return spans


def workload_units(requests: pd.DataFrame, concurrency: Mapping[str, int]) -> Units:
    """The whole workload's units, for comparing two methods over every phase at once: each phase keeps its own
    units (a prompt alone, or a block of the phase's concurrency of its consecutive prompts, never spanning phases)
    and each request's time is its share of its phase's span. A method's rate over these units is its tokens over
    its phases' summed spans, the phases weighed as the workload weighs them (``policies.static_answers`` ranks
    settings by the same rate), and :func:`~spectune.stats.units.speedup_interval` on them is paired unit by unit."""
    spans = phase_spans(requests)
    terms, offset = [], 0
    for phase, size in concurrency.items():
        part = requests[requests["phase"] == phase]
        if not len(part):
            continue
        mine = phase_terms(part, spans[spans["phase"] == phase], size)
        terms.append(mine.assign(request_id=offset + mine["request_id"]))
        offset += int(mine["request_id"].max()) + 1
    return units_of(pd.concat(terms), 1)


def phase_terms(requests: pd.DataFrame, spans: pd.DataFrame, size: int) -> pd.DataFrame:
    """One phase's throughput terms (:func:`~spectune.stats.compare.throughput_terms`), each (method, repeat)'s
    duration its span in the phase, ``request_id`` replaced by the request's unit in the phase: ``size``
    consecutive prompts counted from the phase's first."""
    unit = (requests["request_id"] - requests["request_id"].min()) // max(1, int(size))
    durations = {(m, int(r)): float(s) for m, r, s in zip(spans["method"], spans["repeat"], spans["seconds"],
                                                          strict=True)}
    return throughput_terms(requests.assign(request_id=unit), durations)


def phase_intervals(requests: pd.DataFrame, spans: pd.DataFrame, size: int, baseline: str
                    ) -> dict[str, list[float]]:
    """Per method but the baseline, [lo, hi] of its speed-up over the baseline in one phase: request ids renumbered
    from the phase's first so that a unit is ``size`` consecutive prompts of the phase; each (method, repeat)'s
    duration its span in the phase. Methods without two units in common with the baseline get none."""
    if baseline not in set(requests["method"]):
        return {}
    units = units_of(phase_terms(requests, spans, size), 1)
    out: dict[str, list[float]] = {}
    for method in dict.fromkeys(requests["method"]):
        if method == baseline or method not in units.num or len(units.keys) < 2:
            continue
        interval = speedup_interval(units, str(method), baseline)
        out[str(method)] = [float(interval.lo), float(interval.hi)]
    return out


def format_phase_table(rows: list[dict[str, Any]]) -> str:
    """The per-phase rows as a text table (method, phase, requests, tok/s, speed-up over the baseline)."""
    lines = [f"{'method':<24} {'phase':<16} {'requests':>8} {'tok/s':>9} {'speedup':>8} {'95% CI':>14}"]
    for r in rows:
        tps = "-" if r["output_throughput"] is None else f"{r['output_throughput']:.2f}"
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        ci = f"[{r['speedup_ci'][0]:.2f}, {r['speedup_ci'][1]:.2f}]" if r.get("speedup_ci") else "-"
        lines.append(f"{r['method']:<24} {r['phase']:<16} {r['requests']:>8} {tps:>9} {speedup:>8} {ci:>14}")
    return "\n".join(lines)
