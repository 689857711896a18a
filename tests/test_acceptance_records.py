"""Per-request acceptance in the records: requests.parquet carries each request's speculative cycles, cycles without
a proposal, drafted and accepted tokens; summary.json and the per-category table carry the share of cycles without a
proposal, milliseconds per cycle by part and the acceptance length's spread over requests. Checked by hand on a
small frame and against the cycle rows of a real tiny run of prompt lookup."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from spectune.engine.records import acceptance_summary, per_request_acceptance, with_acceptance
from spectune.run import rundir
from spectune.stats.by_category import ALL
from tests.conftest import run_composed

LOOKUP = ["+workload=en", "workload.categories=[rewrite,code]", "workload.num_prompts=4", "workload.max_new_tokens=16",
          "workload.task_max_new_tokens=16", "workload.sampling.temperature=0", "proposer=lookup",
          "proposer.min_n=2", "gamma=[3]", "task.repeats=2", "task.warmup=1"]


def _cycles(rows: list[tuple[int, int, int, int, int]]) -> pd.DataFrame:
    """(cycle, request_id, gamma, num_drafts, accepted) rows with fixed part times."""
    frame = pd.DataFrame(rows, columns=["cycle", "request_id", "gamma", "num_drafts", "accepted"])
    return frame.assign(draft_s=0.001, verify_s=0.010, rest_s=0.002)


def test_per_request_acceptance_counts_cycles_without_a_proposal_apart():
    cycles = _cycles([(0, 0, 3, 3, 3), (1, 0, 3, 0, 0), (2, 0, 3, 2, 0),  # request 0: 2 drafted cycles, 1 miss
                      (0, 1, 3, 0, 0), (1, 1, 3, 0, 0),  # request 1: asked twice, never proposed
                      (0, 2, 0, 0, 0)])  # request 2: an autoregressive step only
    out = per_request_acceptance(cycles).set_index("request_id")
    counts = ["spec_cycles", "no_proposal_cycles", "drafted_tokens", "accepted_tokens"]
    assert out.loc[0, counts].tolist() == [2, 1, 5, 3]
    assert out.loc[0, "acceptance_rate"] == pytest.approx(3 / 5)
    assert out.loc[0, "acceptance_length"] == pytest.approx(1 + 3 / 2)
    assert out.loc[0, "no_proposal_share"] == pytest.approx(1 / 3)
    assert out.loc[1, "no_proposal_share"] == 1.0 and math.isnan(out.loc[1, "acceptance_length"])
    assert 2 not in out.index  # it never asked for drafts
    requests = pd.DataFrame({"request_id": [0, 1, 2], "output_tokens": [9, 2, 1]})
    merged = with_acceptance(requests, cycles).set_index("request_id")
    assert merged.loc[2, "spec_cycles"] == 0 and math.isnan(merged.loc[2, "acceptance_rate"])
    summary = acceptance_summary(cycles)
    assert summary["spec_decode_no_proposal_share"] == pytest.approx(3 / 5)  # 3 misses of 5 request-cycles asked
    # a cycle in which no row had a proposal: cycle 1 (request 0 missed, request 1 missed); cycle 0 had request 0's
    assert summary["mean_no_proposal_ms_per_cycle"] == pytest.approx(13.0)
    assert summary["mean_rest_ms_per_cycle"] == pytest.approx(2.0)
    assert summary["p50_request_acceptance_length"] == pytest.approx(2.5)  # request 0 only has an acceptance length


@pytest.fixture(scope="module")
def lookup_run(tmp_path_factory):
    """A real bench run of prompt lookup on the tiny pair: AR and γ = 3, two repeats, greedy."""
    return run_composed(tmp_path_factory.mktemp("lookup") / "run", *LOOKUP)


def test_a_lookup_runs_records_agree_with_its_cycles(lookup_run):
    requests, cycles = rundir.REQUESTS.read(lookup_run), rundir.CYCLES.read(lookup_run)
    summary = rundir.SUMMARY.read(lookup_run)
    ar = requests[requests["method"] == "ar"]
    assert (ar["spec_cycles"] == 0).all() and (ar["no_proposal_cycles"] == 0).all()
    assert ar["acceptance_length"].isna().all()
    method = "fixed:gamma=3"
    mine, mine_cycles = requests[requests["method"] == method], cycles[cycles["method"] == method]
    misses = 0
    for (repeat, request_id), rows in mine_cycles.groupby(["repeat", "request_id"]):
        record = mine[(mine["repeat"] == repeat) & (mine["request_id"] == request_id)].iloc[0]
        asked = rows[rows["gamma"] > 0]
        drafted = asked[asked["num_drafts"] > 0]
        assert record["spec_cycles"] == len(drafted)
        assert record["no_proposal_cycles"] == len(asked) - len(drafted)
        assert record["drafted_tokens"] == drafted["num_drafts"].sum()
        assert record["accepted_tokens"] == drafted["accepted"].sum()
        misses += len(asked) - len(drafted)
    assert misses > 0  # min_n = 2 leaves cycles without a match: the share is not trivially 0
    entry = next(m for m in summary["methods"] if m["method"] == method)
    asked = mine_cycles[mine_cycles["gamma"] > 0]
    assert entry["spec_decode_no_proposal_share"] == pytest.approx((asked["num_drafts"] == 0).mean())
    lengths = mine["acceptance_length"].dropna().to_numpy(float)
    assert entry["p50_request_acceptance_length"] == pytest.approx(np.percentile(lengths, 50))
    assert entry["mean_rest_ms_per_cycle"] > 0
    overall = next(r for r in summary["by_category"] if r["method"] == method and r["category"] == ALL)
    assert overall["no_proposal_cycles"] == misses
    assert overall["no_proposal_share"] == pytest.approx(entry["spec_decode_no_proposal_share"])
