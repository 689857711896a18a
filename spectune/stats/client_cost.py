"""What the harness's client adds to a server engine's own time.

A server engine reports, per request, the milliseconds it spent on the prompt and on decoding (llama-server's
``timings.prompt_ms`` and ``predicted_ms``). The client sees the request from the moment it sent it to the moment
the last streamed event arrived. The difference is everything outside the engine's own clocks: HTTP, the event
stream's framing and parsing, the client's bookkeeping, and the server's own scheduling around the request. If it
were large, a speed-up measured through the client would understate the engine's; the figure says how large.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

ENGINE_COLUMNS = ("engine_prompt_ms", "engine_decode_ms")


def client_cost(requests: pd.DataFrame) -> dict[str, Any] | None:
    """Per method, the client's time beyond the engine's (``(finish - sent) - (prompt_ms + decode_ms)``) as a share
    of the engine's: pooled (Σ extra / Σ engine) and the median request's. ``None`` where the records carry no
    engine times (spectune's own engine, or a server that reports none); requests without them are left out."""
    if requests.empty or not set(ENGINE_COLUMNS) <= set(requests.columns) or "admitted_s" not in requests:
        return None
    rows = requests.dropna(subset=[*ENGINE_COLUMNS, "admitted_s", "finish_s"])
    if "status" in rows:
        rows = rows[rows["status"] == "ok"]
    if rows.empty:
        return None
    engine_ms = rows["engine_prompt_ms"].astype(float) + rows["engine_decode_ms"].astype(float)
    client_ms = 1000.0 * (rows["finish_s"].astype(float) - rows["admitted_s"].astype(float))
    frame = pd.DataFrame({"method": rows["method"], "engine_ms": engine_ms, "extra_ms": client_ms - engine_ms})
    frame = frame[frame["engine_ms"] > 0]
    if frame.empty:
        return None
    out: dict[str, Any] = {}
    for method, part in frame.groupby("method", sort=False):
        out[str(method)] = {"requests": len(part),
                            "pooled_pct": 100.0 * float(part["extra_ms"].sum() / part["engine_ms"].sum()),
                            "median_pct": 100.0 * float((part["extra_ms"] / part["engine_ms"]).median()),
                            "median_extra_ms": float(part["extra_ms"].median())}
    return out


def client_cost_line(cost: dict[str, Any] | None) -> str | None:
    """One line for the console: the largest pooled share over the methods, and which method had it."""
    if not cost:
        return None
    worst = max(cost, key=lambda m: cost[m]["pooled_pct"])
    share = cost[worst]["pooled_pct"]
    return (f"client time beyond the engine's own (sent to last event, less the server's prompt and decode ms): at "
            f"most {share:+.2f}% ({worst}, median request {cost[worst]['median_extra_ms']:.1f} ms)")
