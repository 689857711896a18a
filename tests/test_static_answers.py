"""The static answers on a workload in regimes (policies.static_answers) and the map a row drafts by
(policy=regime-map): the best single static setting over the whole workload, the best fixed γ per regime, the map
file and what it makes each row draft."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from policies.regime_map import RegimeMap, RegimeTable
from policies.static_answers import main, phase_table, regime_map, static_answers
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams


def _table(rates: dict[tuple[str, str], float]) -> pd.DataFrame:
    """A phase table from tok/s per (method, phase): 100 tokens each, the seconds that rate takes."""
    regimes = {"greedy-c1": (0.0, 1), "t1-c1": (1.0, 1), "greedy-c4": (0.0, 4), "t1-c4": (1.0, 4)}
    rows = [{"method": m, "phase": p, "temperature": regimes[p][0], "concurrency": regimes[p][1],
             "output_tokens": 100, "seconds": 100 / r, "tok_s": r} for (m, p), r in rates.items()]
    return pd.DataFrame(rows)


def test_the_best_static_setting_is_the_whole_workloads_rate_and_the_map_each_regimes_best_fixed_gamma():
    """Four phases of equal tokens. γ 8 wins both greedy phases, AR both T = 1 phases; over the whole workload (sum of
    tokens over sum of seconds) γ 4 wins though it wins no phase; match-length is a candidate for the single
    setting but not a map entry; ppo is neither. The map: greedy -> 8 at both concurrencies, T = 1 -> 0, and its
    gain over γ 4 on the whole workload is the ratio of their summed seconds."""
    rates = {}
    for phase, (ar, g4, g8, rule, ppo) in {"greedy-c1": (10, 18, 20, 19, 50), "t1-c1": (10, 9.5, 7, 8, 50),
                                           "greedy-c4": (30, 45, 48, 40, 90), "t1-c4": (30, 28, 20, 21, 90)}.items():
        rates |= {("ar", phase): ar, ("fixed:gamma=4", phase): g4, ("fixed:gamma=8", phase): g8,
                  ("match-length:gamma=8", phase): rule, ("ppo:gamma=8", phase): ppo}
    answers = static_answers(_table(rates))
    seconds = {m: sum(100 / r for (mm, _), r in rates.items() if mm == m) for m in ("ar", "fixed:gamma=4",
                                                                                       "fixed:gamma=8")}
    assert min(seconds, key=seconds.get) == "fixed:gamma=4" == answers["best_static"]["method"]
    assert set(answers["best_static"]["candidates"]) == {"ar", "fixed:gamma=4", "fixed:gamma=8",
                                                          "match-length:gamma=8"}
    assert answers["best_static"]["speedup"] == pytest.approx(seconds["ar"] / seconds["fixed:gamma=4"])
    assert {(r["temperature"], r["concurrency"]): r["gamma"] for r in answers["regimes"]} == {
        (0.0, 1): 8, (1.0, 1): 0, (0.0, 4): 8, (1.0, 4): 0}
    map_seconds = 100 / 20 + 100 / 10 + 100 / 48 + 100 / 30
    assert answers["map_vs_static_pct"] == pytest.approx(100 * (seconds["fixed:gamma=4"] / map_seconds - 1))
    table = RegimeTable.from_json(regime_map(answers, ["run"]))
    assert table.static == 4
    assert [table.gamma(t, busy) for t, busy in ((0.0, 1), (0.0, 3), (0.0, 4), (0.0, 9), (1.0, 2), (0.7, 1))] == \
        [8, 8, 8, 8, 0, 4]


def test_the_map_drives_each_row_by_its_regime_and_bad_maps_fail_in_one_line(tmp_path: Path):
    """A map greedy: 6 alone, 3 from four rows; T = 1: 0 (written as static_answers writes it): in a batch of four
    with two greedy and two T = 1 rows the greedy rows draft 3 and the others nothing; alone, greedy drafts 6 (5
    under a ceiling of 5)."""
    answers = {"best_static": {"method": "fixed:gamma=2", "gamma": 2, "tok_s": 1.0, "speedup": 1.1, "candidates": {}},
               "map_tok_s": 1.2, "map_vs_static_pct": 20.0,
               "regimes": [{"temperature": 0.0, "concurrency": 1, "method": "fixed:gamma=6", "gamma": 6},
                           {"temperature": 0.0, "concurrency": 4, "method": "fixed:gamma=3", "gamma": 3},
                           {"temperature": 1.0, "concurrency": 1, "method": "ar", "gamma": 0}]}
    path = tmp_path / "map.json"
    path.write_text(json.dumps(regime_map(answers, ["run"])), encoding="utf-8")
    greedy, hot = SamplingParams(temperature=0), SamplingParams(temperature=1.0)
    policy = RegimeMap(8, str(path))
    policy.before_cycle([0, 1, 2, 3], [10, 11, 12, 13], sampling=[greedy, hot, greedy, hot])
    assert policy.limits == {0: 3, 1: 0, 2: 3, 3: 0} and policy.begin_cycle(4) == 3
    policy.before_cycle([2], [12], sampling=[greedy])
    assert policy.begin_cycle(1) == 6
    capped = RegimeMap(5, str(path))
    capped.before_cycle([0], [1], sampling=[greedy])
    assert capped.begin_cycle(1) == 5
    path.write_text(json.dumps({"kind": "spectune-regime-map", "version": 1, "static": 2,
                                "regimes": [{"temperature": 0, "concurrency": 0, "gamma": 2}]}), encoding="utf-8")
    with pytest.raises(SpectuneError, match="every γ must be >= 0 and every concurrency >= 1"):
        RegimeMap(8, str(path))
    with pytest.raises(SpectuneError, match=r"policy\.path is missing"):
        RegimeMap(8, None)


PHASES = ("workload.phases=[{name:greedy-c1,concurrency:1,token_budget:8,sampling_mix:[{temperature:0,share:1.0}]},"
          "{name:t1-c2,concurrency:2,token_budget:8,sampling_mix:[{temperature:1.0,share:1.0}]}]")
RUN = ("+workload=en", "workload.num_prompts=null", "workload.max_new_tokens=4", PHASES, "task.warmup=1",
       "task.repeats=1", "gamma=[1,2]", "workload.categories=[chat-lines]")


@pytest.mark.slow(reason="a real bench run in two phases on the embedded tiny pair")
def test_static_answers_read_a_real_phased_bench_run_and_write_a_map_regime_map_reads(harness_in_process,
                                                                                      tmp_path: Path, caplog):
    """A bench of AR, γ 1 and γ 2 over two phases (greedy alone, T = 1 two to a batch; 2 requests of 4 tokens each):
    the phase table has each (method, phase) with its regime, the answers name a measured method per regime and
    overall, and ``python -m policies.static_answers RUN --out MAP`` writes a map that policy=regime-map reads, with
    each temperature's vLLM table. A run without phases (the committed tiny sweep's) fails in one line."""
    run = tmp_path / "run"
    assert harness_in_process(run, *RUN) == 0
    table = phase_table([run])
    assert set(zip(table["method"], table["phase"], strict=True)) == {
        (m, p) for m in ("ar", "fixed:gamma=1", "fixed:gamma=2") for p in ("greedy-c1", "t1-c2")}
    assert set(zip(table["temperature"], table["concurrency"], strict=True)) == {(0.0, 1), (1.0, 2)}
    out = tmp_path / "map.json"
    with caplog.at_level("INFO", logger="policies.static_answers"):
        assert main([str(run), "--out", str(out)]) == 0
    written = json.loads(out.read_text(encoding="utf-8"))
    assert {(r["temperature"], r["concurrency"]) for r in written["regimes"]} == {(0.0, 1), (1.0, 2)}
    assert all(r["method"] in {"ar", "fixed:gamma=1", "fixed:gamma=2"} for r in written["regimes"])
    assert set(written["vllm_num_speculative_tokens_per_batch_size"]) == {"0.0", "1.0"}
    assert RegimeMap(4, str(out)).table.static == written["static"]
    assert "best single static setting" in caplog.text
    with pytest.raises(SpectuneError, match="its workload has no phases"):
        phase_table([Path(__file__).parent / "data" / "tiny_sweep" / "0"])
