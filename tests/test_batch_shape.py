"""The per-batch-size table: a method whose cycles run as fast as the baseline's at every batch size reads 1 at the
baseline's mix whatever mix its own answers gave it; and the committed held-out run's figures recompute."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.batch_shape import at_mix, by_batch_size, cycle_count, cycle_table, main

REPO = Path(__file__).resolve().parents[1]
FRESH = REPO / "bench/results/adaptive-regimes-fresh-smollm2-cpu-20261207/held-out-en"
NO_PROBE = REPO / "bench/results/adaptive-regimes-no-probe-en-smollm2-cpu-20261207/held-out-en"


def frames(mixes: dict[str, dict[int, int]], seconds: dict[str, dict[int, float]]) -> tuple[pd.DataFrame, ...]:
    """Cycles and requests of a one-repeat run: per method, ``mixes[method][b]`` cycles of b busy rows (one token a
    row), each taking ``seconds[method][b]``; every request in phase ``p``."""
    rows, cycle = [], 0
    for method, mix in mixes.items():
        for size, count in mix.items():
            for _ in range(count):
                rows += [{"method": method, "repeat": 0, "cycle": cycle, "request_id": row, "batch_size": size,
                          "emitted": 1, "num_drafts": 0, "draft_s": 0.0, "verify_s": seconds[method][size],
                          "rest_s": 0.0}
                         for row in range(size)]
                cycle += 1
    cycles = pd.DataFrame(rows)
    requests = pd.DataFrame([{"method": m, "repeat": 0, "request_id": r, "phase": "p"} for m in mixes
                             for r in range(4)])
    return cycles, requests


def test_the_rate_at_the_baselines_mix_takes_the_draw_of_lengths_out():
    """B's cycles cost what A's cost at each batch size, but B's answers left it more single-row cycles: its pooled
    rate is lower, its rate at A's mix equal. C is 10% faster at every size: 1.1 at A's mix."""
    price = {1: 0.10, 2: 0.11, 4: 0.12}
    mixes = {"ar": {4: 100, 2: 10, 1: 2}, "b": {4: 90, 2: 10, 1: 30}, "c": {4: 100, 2: 10, 1: 2}}
    seconds = {"ar": price, "b": price, "c": {b: s / 1.1 for b, s in price.items()}}
    rates = by_batch_size(cycle_table(*frames(mixes, seconds), phase="p"))
    assert list(dict.fromkeys(rates["method"])) == ["ar", "b", "c"]
    assert rates.loc[(rates["method"] == "b") & (rates["batch_size"] == 1), "cycles"].item() == 30
    pooled = rates.groupby("method")[["tokens", "seconds"]].sum()
    pooled = pooled["tokens"] / pooled["seconds"]
    assert pooled["b"] / pooled["ar"] < 0.95  # the draw of lengths, read as speed
    mixed = at_mix(rates, "ar")
    assert mixed["b"] / mixed["ar"] == pytest.approx(1.0)
    assert mixed["c"] / mixed["ar"] == pytest.approx(1.1)


def test_the_cycle_count_reads_a_phase_as_cycles_times_their_price():
    """B runs 10% fewer cycles than A at 20% more a cycle: 0.9 and 1.2 over A, whatever rows its cycles held."""
    mixes = {"ar": {4: 100}, "b": {4: 60, 1: 30}}
    seconds = {"ar": {4: 0.1}, "b": {4: 0.12, 1: 0.12}}
    counts = cycle_count(cycle_table(*frames(mixes, seconds)), "ar").set_index("method")
    assert counts.at["b", "cycles"] == 90 and counts.at["b", "cycles_over"] == pytest.approx(0.9)
    assert counts.at["b", "mean_s_over"] == pytest.approx(1.2) and counts.at["ar", "mean_s_over"] == 1.0
    with pytest.raises(ValueError, match="the baseline 'x' is not in this run"):
        cycle_count(cycle_table(*frames(mixes, seconds)), "x")


def test_a_batch_size_the_method_never_ran_gives_no_rate_and_a_wrong_phase_one_line():
    cycles, requests = frames({"ar": {4: 5, 1: 1}, "b": {4: 5}}, {"ar": {4: 0.1, 1: 0.1}, "b": {4: 0.1}})
    assert math.isnan(at_mix(by_batch_size(cycle_table(cycles, requests)), "ar")["b"])
    with pytest.raises(ValueError, match=r"phase 'q' is not in this run: its phases are \['p'\]"):
        cycle_table(cycles, requests, phase="q")


def test_the_fresh_runs_t1_c4_phase_recomputes(capsys):
    """The held-out run's T = 1 four-to-a-batch phase: the controller's answers left it 61 single-row cycles against
    AR's 2; its cycles' rate is 0.96 of AR's pooled and 1.007 at AR's mix; the map (AR's computation) 0.991; the
    units the interval pairs spread by 0.074 (controller) and 0.065 (map) in log rate over AR; with four rows busy
    the controller verified a draft on 43.7% of cycles, which returned 1.016 of its plain steps' rate (match-length
    0.778)."""
    main([str(FRESH), "--phase", "t1-c4"])
    out = capsys.readouterr().out
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines()[2:18]}
    assert rows[("ar", "1")][2] == "2" and rows[("hysteresis:gamma=8", "1")][2] == "61"
    lines = out.splitlines()
    summary = {line.split()[0]: line.split()[1:] for line in lines[19:23]}
    assert summary["hysteresis:gamma=8"][1] == "0.959" and summary["hysteresis:gamma=8"][3] == "1.007"
    assert summary["regime-map:gamma=8"][3] == "0.991"
    split = {line.split()[0]: line.split()[1:] for line in lines[24:28]}  # cycles with four busy rows
    assert split["hysteresis:gamma=8"] == ["43.7%", "134.6", "4.87", "|", "112.2", "4.00", "|", "1.016"]
    assert split["match-length:gamma=8"][-1] == "0.778" and split["ar"][0] == "0.0%"
    assert lines[-1] == ("units of 4 prompts: SD of the per-unit log rate over ar: "
                                    "hysteresis:gamma=8 0.074, match-length:gamma=8 0.105, regime-map:gamma=8 0.065")


def test_the_no_probe_runs_t1_c4_phase_recomputes(capsys):
    """The controller without probes, English, T = 1 four to a batch: it verified a draft on 43.6% of four-row cycles
    (0.996 of its plain steps' rate) and 60.1% of three-row cycles (0.983), and ran 0.975 of AR's cycles at 1.094 of
    their mean price; a plain step of its own paid 1.19 ms drafting (the lookup its shadow tests need) and 0.71 ms of
    policy."""
    main([str(NO_PROBE), "--phase", "t1-c4"])
    lines = capsys.readouterr().out.splitlines()
    split = {line.split()[0]: line.split()[1:] for line in lines[24:28]}  # cycles with four busy rows
    assert split["hysteresis:gamma=8"] == ["43.6%", "125.3", "4.89", "|", "102.0", "4.00", "|", "0.996"]
    assert lines[28].startswith("cycles with 3 busy rows")
    three = {line.split()[0]: line.split()[1:] for line in lines[29:33]}
    assert three["hysteresis:gamma=8"][0] == "60.1%" and three["hysteresis:gamma=8"][-1] == "0.983"
    counts = {line.split()[0]: line.split()[1:] for line in lines[-10:-6]}
    assert counts["ar"] == ["1524", "1.000", "106.1", "1.000"]
    assert counts["hysteresis:gamma=8"] == ["1486", "0.975", "116.1", "1.094"]
    assert lines[-6].startswith("plain steps, mean ms:")
    spans = {line.split()[0]: line.split()[1:] for line in lines[-5:-1]}  # its proposer and policy while off
    assert spans["hysteresis:gamma=8"] == ["1.19", "104.91", "0.74", "0.71", "0.32"]
    assert spans["ar"][0] == "0.00" and spans["ar"][3] == "0.00"


def test_the_command_fails_in_one_line_with_exit_2(tmp_path, capsys):
    for argv in ([str(tmp_path)], [str(FRESH), "--phase", "t1-c8"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
