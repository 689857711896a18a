"""The bench's one-glance table: per method tokens/s, speedup vs AR, acceptance length, latency, memory."""

from __future__ import annotations

from typing import Any

import pandas as pd

COLUMNS = {
    "output_throughput": "tok/s",
    "speedup": "speedup",
    "spec_decode_acceptance_length": "acc_len",
    "p50_ttft_ms": "TTFT p50 ms",
    "p99_ttft_ms": "TTFT p99 ms",
    "p50_tpot_ms": "TPOT p50 ms",
    "p99_tpot_ms": "TPOT p99 ms",
    "peak_mb": "peak MB",
}


def bench_table(summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per method; speedup = output throughput / the AR baseline's (same run, same prompts)."""
    frame = pd.DataFrame(summaries)
    if frame.empty:
        return frame
    for key in ("output_throughput", "peak_rss_bytes"):
        if key not in frame:
            frame[key] = float("nan")
    base = frame.loc[frame["method"] == "ar", "output_throughput"]
    base_tps = float(base.iloc[0]) if len(base) and pd.notna(base.iloc[0]) else None
    frame["speedup"] = frame["output_throughput"] / base_tps if base_tps else float("nan")
    memory = frame["peak_allocated_bytes"] if "peak_allocated_bytes" in frame else frame["peak_rss_bytes"]
    frame["peak_mb"] = memory / 2**20
    for key in COLUMNS:
        if key not in frame:
            frame[key] = float("nan")
    table = frame[["method", "status", *COLUMNS]].rename(columns=COLUMNS)
    return table.set_index("method")


def format_table(table: pd.DataFrame) -> str:
    return table.to_string(float_format=lambda v: f"{v:,.2f}", na_rep="-")
