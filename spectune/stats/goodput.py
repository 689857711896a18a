"""Service-level objectives: request goodput as vLLM's ``bench serve --goodput`` defines it, and an
MLPerf-style check of p99 TTFT / TPOT against limits.

vLLM (``calculate_metrics`` in ``vllm/benchmarks/serve.py``): a completed request is *good* when every
SLO that is set holds with ``metric <= limit``; a request with one output token has TPOT 0 there;
``request_goodput = good requests / benchmark duration``. MLPerf Inference (server scenario): a run is
valid only if the p99 TTFT and the p99 TPOT meet their limits, percentiles by nearest rank (e.g.
Llama-2-70B server 2000 ms / 200 ms, interactive 450 ms / 40 ms).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from spectune.errors import SpectuneError

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


def parse_slo(raw: Mapping[str, Any] | None) -> dict[str, float]:
    """The SLOs that are set (``null`` = not set), validated: each a finite number > 0 (milliseconds)."""
    out: dict[str, float] = {}
    for key, value in (raw or {}).items():
        if key not in SLO_KEYS:
            raise SpectuneError(f"slo.{key} is unknown: the SLOs are {', '.join('slo.' + k for k in SLO_KEYS)}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise SpectuneError(f"slo.{key}={value!r} is invalid: must be a number of milliseconds > 0, or null")
        out[key] = float(value)
    return out


def good_requests(requests: pd.DataFrame, slo: Mapping[str, float]) -> pd.Series:
    """1 for a completed request meeting every set SLO (``<=``), else 0 (failed requests are never good)."""
    good = requests["status"] == "ok"
    for key, limit in slo.items():
        values = requests[key].astype(float)
        if key == "tpot_ms":
            values = values.fillna(0.0)  # one output token: vLLM counts TPOT 0
        good &= values.le(limit)  # NaN (missing) compares False: not good
    return good.astype(int)


def nearest_rank(values: np.ndarray, q: float) -> float | None:
    """The q-th percentile by nearest rank (MLPerf): the ⌈q/100·n⌉-th smallest value."""
    arr = np.sort(np.asarray(values, dtype=float))
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return None
    return float(arr[max(0, math.ceil(q / 100 * arr.size) - 1)])


def p99_check(requests: pd.DataFrame, slo: Mapping[str, float]) -> dict[str, Any]:
    """MLPerf-style: p99 (nearest rank) of TTFT and TPOT over completed requests against the set limits."""
    ok = requests[requests["status"] == "ok"]
    out: dict[str, Any] = {}
    verdicts = []
    for key in ("ttft_ms", "tpot_ms"):
        if key not in slo:
            continue
        values = ok[key].astype(float).fillna(0.0).to_numpy() if key == "tpot_ms" else ok[key].dropna().to_numpy()
        p99 = nearest_rank(values, 99)
        passed = p99 is not None and p99 <= slo[key]
        out[f"p99_{key}_nearest_rank"] = p99
        out[f"slo_p99_{key}_pass"] = passed
        verdicts.append(passed)
    if verdicts:
        out["slo_p99_pass"] = all(verdicts)
        out["slo_p99_samples"] = len(ok)
    return out
