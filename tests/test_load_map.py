"""analysis.comparison's per-load map on a hand-built comparison frame: the grid's γ per load (0 = speculation off),
the best adaptive policy there, and vLLM's per-batch-size ranges."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.comparison import load_map, report, vllm_schedules

# (language, concurrency) -> (best fixed γ, its decode speed-up over AR, {policy: % vs best fixed})
CELLS = {("en", 1): (1, 1.07, {"ppo": 0.7, "confidence": 2.4, "bandit": -9.8}),
         ("en", 2): (0, 1.0, {"ppo": -3.0, "confidence": -1.0, "bandit": -5.0}),
         ("en", 4): (1, 1.01, {"ppo": 4.0, "confidence": 1.0, "bandit": 2.0}),
         ("zh", 1): (2, 1.16, {"ppo": -3.8, "confidence": -0.5, "bandit": -13.2})}


def _frame() -> pd.DataFrame:
    rows = []
    for (language, concurrency), (best, speedup, policies) in CELLS.items():
        base = {"language": language, "concurrency": concurrency, "best_fixed_gamma": best, "hindsight_gamma": best}
        rows.append({**base, "policy": "ar", "decode_speedup_vs_ar": 1.0,
                     "decode_vs_best_fixed_pct": 100 * (1 / speedup - 1)})
        if best:
            rows.append({**base, "policy": "best fixed γ", "decode_speedup_vs_ar": speedup,
                         "decode_vs_best_fixed_pct": 0.0})
        rows.append({**base, "policy": "fixed:gamma=3", "decode_speedup_vs_ar": speedup * 1.3,  # never "adaptive"
                     "decode_vs_best_fixed_pct": 30.0})
        for policy, pct in policies.items():
            rows.append({**base, "policy": policy, "decode_speedup_vs_ar": speedup * (1 + pct / 100),
                         "decode_vs_best_fixed_pct": pct})
    frame = pd.DataFrame(rows)
    frame["decode_vs_best_fixed_pct_ci95_lo"] = frame["decode_vs_best_fixed_pct"] - 2
    frame["decode_vs_best_fixed_pct_ci95_hi"] = frame["decode_vs_best_fixed_pct"] + 2
    return frame


def test_the_map_names_the_load_s_gamma_and_its_best_adaptive_policy():
    table = load_map(_frame()).set_index(["language", "concurrency"])
    assert list(table.index) == sorted(CELLS)
    for cell, (best, speedup, policies) in CELLS.items():
        row = table.loc[cell]
        assert row["best_fixed_gamma"] == best
        assert row["best_fixed_speedup_vs_ar"] == pytest.approx(speedup)  # 1.0 where speculation is off
        winner = max(policies, key=policies.get)
        assert row["best_policy"] == winner  # never a fixed γ of the hindsight rows
        assert row["best_policy_vs_best_fixed_pct"] == pytest.approx(policies[winner])
        assert row["best_policy_ci95_lo"] == pytest.approx(policies[winner] - 2)
        assert row["ppo_vs_best_fixed_pct"] == pytest.approx(policies["ppo"])


def test_the_grid_s_choices_become_vllm_ranges_and_the_report_shows_them():
    frame = _frame()
    assert vllm_schedules(frame) == {"en": [[1, 1, 1], [2, 2, 0], [3, 4, 1]], "zh": [[1, 1, 2]]}
    text = report(frame)
    assert "## Per load (by decode tok/s)" in text
    assert "- en: `[[1, 1, 1], [2, 2, 0], [3, 4, 1]]`" in text
