"""Traces score every γ exactly: replay's outcome at γ = k equals the live engine's at γ = k.

Under greedy decoding the texts of all runs agree, so every cycle of a live run that starts where a
recorded cycle starts is compared (whole requests); under sampling the comparison holds wherever the live
text so far equals the recorded one (common random numbers keep them equal until a γ difference bites).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from spectune.engine import Engine, Request
from spectune.engine.policy import FixedGamma
from spectune.engine.traces import TRACE_COLUMNS, expected_accepted, realised_accepted, record
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests

GAMMA = 5


def _trace(engine: Engine, requests: list[Request], concurrency: int) -> tuple[pd.DataFrame, dict[int, list[int]]]:
    session = engine.session(requests, None, concurrency, keep_laws=True)
    frame = record(session, requests, GAMMA)
    return frame, {r.request_id: r.output_ids for r in session.result().requests}


def _compare(engine, requests, concurrency, frame, traced) -> tuple[int, int]:
    """(cycles compared, cycles whose accepted count differed from the replay's) over k = 1..GAMMA."""
    flags = {key: g.sort_values("position")["accepted"].to_numpy()
             for key, g in frame.groupby(["request_id", "output_position"])}
    compared = wrong = 0
    for k in range(1, GAMMA + 1):
        result = engine.run(requests, FixedGamma(k), concurrency)
        live = {r.request_id: r.output_ids for r in result.requests}
        start = {r.request_id: 1 for r in requests}  # output position at a cycle's start
        for c in result.cycles:
            pos = start[c.request_id]
            start[c.request_id] += c.emitted
            key = (c.request_id, pos)
            if key not in flags or live[c.request_id][:pos] != traced[c.request_id][:pos]:
                continue
            compared += 1
            wrong += int(realised_accepted(flags[key], k) != c.accepted)
    return compared, wrong


@pytest.mark.parametrize("concurrency", [1, 3])
def test_replay_equals_live_at_every_gamma_greedy_whole_requests(pair, concurrency):
    target, draft = pair
    requests = random_requests(3, max_new=12)
    engine = Engine(target, draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    frame, traced = _trace(engine, requests, concurrency)
    compared, wrong = _compare(engine, requests, concurrency, frame, traced)
    assert wrong == 0
    assert compared > 3 * GAMMA, "whole requests: more than the first cycle of each must be compared"


@pytest.mark.parametrize("concurrency", [1, 3])
def test_replay_equals_live_at_every_gamma_sampled(pair, concurrency):
    """T = 1, seed 3, 5 requests × 5 γ; exact equality of accepted counts (no tolerance)."""
    target, draft = pair
    requests = random_requests(5, max_new=10, seed=1)
    engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                    device="cpu", seed=3)
    frame, traced = _trace(engine, requests, concurrency)
    compared, wrong = _compare(engine, requests, concurrency, frame, traced)
    assert wrong == 0
    assert compared >= 5 * GAMMA  # at least every request's first cycle at every γ
    assert frame["accepted"].nunique() == 2 and frame["accept_prob"].between(0, 1).all()


def test_trace_columns_and_scores(pair):
    target, draft = pair
    requests = random_requests(2, max_new=10)
    engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                    device="cpu", seed=5)
    frame, _ = _trace(engine, requests, 2)
    assert list(frame.columns) == list(TRACE_COLUMNS)
    assert (frame.groupby(["cycle", "row"]).size() == GAMMA).all()
    cycle = frame[(frame["cycle"] == 0) & (frame["row"] == 0)].sort_values("position")
    assert np.allclose(cycle["cum_prob"], np.cumprod(cycle["token_prob"]))
    assert cycle["draft_s"].is_monotonic_increasing
    a = cycle["accept_prob"].to_numpy()
    assert expected_accepted(a, 1) == pytest.approx(a[0])
    assert expected_accepted(a, 2) == pytest.approx(a[0] + a[0] * a[1])
    assert realised_accepted(np.array([True, True, False, True]), 4) == 2
    assert realised_accepted(np.array([True, True, True]), 2) == 2
    assert (frame.groupby("request_id")["recent_acceptance"].first() == 0.5).all()
    # later cycles: accepted / (accepted + rejections) over the request's earlier cycles, whatever the γ
    per_cycle = frame.groupby(["request_id", "cycle"], sort=True).agg(
        lead=("accepted", lambda s: int(np.cumprod(s.to_numpy()).sum())), recent=("recent_acceptance", "first"))
    for _, cycles in per_cycle.groupby(level=0):
        lead = cycles["lead"].to_numpy()
        trials = lead + (lead < GAMMA)
        expected = np.cumsum(lead)[:-1] / np.cumsum(trials)[:-1]
        np.testing.assert_allclose(cycles["recent"].to_numpy()[1:], expected)


def test_acceptance_trials_count_the_first_rejection_only():
    from spectune.engine.policy import acceptance_trials

    assert acceptance_trials(2, 4) == 3 and acceptance_trials(4, 4) == 4 and acceptance_trials(0, 1) == 1
    assert acceptance_trials(0, 0) == 0  # no draft, no test


@pytest.mark.slow(reason="python -m harness task=trace in a subprocess")
def test_task_trace_writes_traces_and_metadata_or_nothing(cli, tmp_path):
    """The CLI writes traces.parquet (atomically, via spectune.io) and its metadata; bad input writes nothing."""
    run = cli("task=trace", "+workload=en", "workload.num_prompts=2", "workload.max_new_tokens=6", "task.max_gamma=3",
              "task.warmup=0", run_dir=tmp_path / "ok")
    assert run.returncode == 0, run.stderr
    frame = pd.read_parquet(tmp_path / "ok/traces.parquet")
    assert list(frame.columns) == list(TRACE_COLUMNS) and (frame["max_gamma"] == 3).all()
    assert set(frame["language"]) == {"en"} and frame["prompt_id"].nunique() == 2
    meta = json.loads((tmp_path / "ok/traces.metadata.json").read_text())
    assert meta["max_gamma"] == 3 and meta["rows"] == len(frame) and "device_name" in meta["hardware"]
    assert meta["models"]["target"]["name_or_path"] == "spectune/models/tiny/target"
    assert not list((tmp_path / "ok").glob(".*.tmp"))  # no temporaries left by the atomic writers
    for value, message in (("0", "task.max_gamma=0 is out of range"), ("100000", "task.max_gamma=100000 is out of")):
        bad = cli("task=trace", "+workload=en", f"task.max_gamma={value}", run_dir=tmp_path / value)
        errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
        assert bad.returncode == 2 and len(errors) == 1 and message in errors[0]
        assert not (tmp_path / value / "traces.parquet").exists()
