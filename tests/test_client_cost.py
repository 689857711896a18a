"""The client's time beyond a server engine's own (spectune/stats/client_cost.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from spectune.stats.client_cost import client_cost, client_cost_line


def _frame(rows: list[tuple[str, float, float, float | None, float | None, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["method", "admitted_s", "finish_s", "engine_prompt_ms", "engine_decode_ms",
                                       "status"])


def test_the_share_is_the_client_time_beyond_the_engines_over_the_engines():
    """Two methods: ar's requests took 101 ms and 202 ms at the client for 100 and 200 ms of engine time (1% each);
    the other's 110 ms for 100 (10%). A failed request and one without engine times are left out."""
    frame = _frame([("ar", 0.0, 0.101, 20.0, 80.0, "ok"), ("ar", 1.0, 1.202, 50.0, 150.0, "ok"),
                    ("ngram-mod:gamma=4", 2.0, 2.110, 10.0, 90.0, "ok"),
                    ("ngram-mod:gamma=4", 3.0, 3.900, 10.0, 90.0, "error"),
                    ("ngram-mod:gamma=4", 4.0, 4.500, None, None, "ok")])
    cost = client_cost(frame)
    assert cost["ar"]["requests"] == 2 and cost["ar"]["pooled_pct"] == pytest.approx(1.0)
    assert cost["ar"]["median_pct"] == pytest.approx(1.0) and cost["ar"]["median_extra_ms"] == pytest.approx(1.5)
    assert cost["ngram-mod:gamma=4"] == pytest.approx({"requests": 1, "pooled_pct": 10.0, "median_pct": 10.0,
                                                       "median_extra_ms": 10.0})
    line = client_cost_line(cost)
    assert "at most +10.00% (ngram-mod:gamma=4, median request 10.0 ms)" in line


def test_no_engine_times_no_figure():
    """spectune's own engine records no engine_*_ms columns: nothing is invented."""
    plain = pd.DataFrame({"method": ["ar"], "admitted_s": [0.0], "finish_s": [0.1], "status": ["ok"]})
    assert client_cost(plain) is None and client_cost_line(None) is None
    empty = _frame([("ar", 0.0, 0.1, None, None, "ok")])
    assert client_cost(empty) is None
