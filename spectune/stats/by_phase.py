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

from typing import Any

import pandas as pd

from spectune.stats.compare import BASELINE


def phases_of(requests: pd.DataFrame) -> list[str]:
    """The phases of a run's requests in run order ([] when it has none)."""
    if not len(requests) or "phase" not in requests:
        return []
    return [str(p) for p in dict.fromkeys(requests["phase"]) if p is not None and p == p]


def by_phase(requests: pd.DataFrame, baseline: str = BASELINE) -> list[dict[str, Any]]:
    """One row per (method, phase) of ``requests`` (columns method, repeat, phase, status, output_tokens,
    arrival_s, finish_s), methods in their order of appearance, phases in run order."""
    phases = phases_of(requests)
    if not phases:
        return []
    ok = requests[requests["status"] == "ok"]
    spans = ok.groupby(["method", "phase", "repeat"], sort=False).agg(
        requests=("request_id", "size"), output_tokens=("output_tokens", "sum"), first=("arrival_s", "min"),
        last=("finish_s", "max")).reset_index()
    spans["seconds"] = spans["last"] - spans["first"]
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
    return rows


def format_phase_table(rows: list[dict[str, Any]]) -> str:
    """The per-phase rows as a text table (method, phase, requests, tok/s, speed-up over the baseline)."""
    lines = [f"{'method':<24} {'phase':<16} {'requests':>8} {'tok/s':>9} {'speedup':>8}"]
    for r in rows:
        tps = "-" if r["output_throughput"] is None else f"{r['output_throughput']:.2f}"
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        lines.append(f"{r['method']:<24} {r['phase']:<16} {r['requests']:>8} {tps:>9} {speedup:>8}")
    return "\n".join(lines)
