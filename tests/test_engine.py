"""The engine's two promises: greedy speculative output equals greedy autoregressive output token for
token (every γ, every concurrency), and under sampling the law of the generated tokens is the target's."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from policies.confidence import ConfidenceStop
from policies.heuristic import HFHeuristic
from spectune.engine import Engine, Request
from spectune.engine.policy import FixedGamma
from spectune.engine.records import cycles_frame, requests_frame, summarise
from spectune.hardware import ExecutionPath
from spectune.sampling import SamplingParams, warp
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests, tiny_llama

GREEDY = SamplingParams(temperature=0)


def test_greedy_speculative_equals_autoregressive(pair):
    target, draft = pair
    requests = random_requests(7, max_new=16)
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    assert all(len(ids) == 16 for ids in reference.values())
    accepted_any = False
    for gamma, concurrency in itertools.product((1, 3, 6), (1, 3, 7)):
        result = engine.run(requests, FixedGamma(gamma), concurrency)
        assert {r.request_id: r.output_ids for r in result.requests} == reference, (gamma, concurrency)
        accepted_any |= any(c.accepted > 0 for c in result.cycles)
        assert all(1 <= c.emitted <= c.num_drafts + 1 for c in result.cycles)
    assert accepted_any, "the perturbed draft should agree sometimes, or this test exercises nothing"


@pytest.mark.parametrize("path", [
    ExecutionPath(static=True, max_cache_len=48),  # small: forces compaction of holes mid-run
    pytest.param(ExecutionPath(static=True, max_cache_len=64, compile_mode="default", compile_backend="eager"),
                 marks=pytest.mark.slow(reason="dynamo traces the models (the compiled path): ~10 s on CPU")),
], ids=["static", "static-dynamo"])
def test_static_cache_path_matches_autoregressive(pair, path):
    """The compiled path's static buffers (and dynamo tracing of the model through them) change nothing."""
    target, draft = pair
    requests = random_requests(5, max_new=20)
    reference = {r.request_id: r.output_ids for r in
                 Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu")
                 .run(requests, None, 1).requests}
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", path=path)
    for policy, concurrency in ((None, 2), (FixedGamma(3), 2), (FixedGamma(5), 5)):
        result = engine.run(requests, policy, concurrency)
        assert {r.request_id: r.output_ids for r in result.requests} == reference, (policy, concurrency)


def test_draft_equal_to_target_accepts_everything_and_matches(pair):
    """α = 1: every cycle emits γ+1 tokens; exercises the 'draft never fed its last token' path."""
    target, _ = pair
    requests = random_requests(4, max_new=20)
    engine = Engine(target, target, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 2).requests}
    result = engine.run(requests, FixedGamma(3), 2)
    assert {r.request_id: r.output_ids for r in result.requests} == reference
    assert all(c.accepted == c.num_drafts == 3 for c in result.cycles if c.emitted == 4)
    summary = summarise(requests_frame(result.requests), cycles_frame(result.cycles))
    assert summary["spec_decode_acceptance_rate"] == 1.0


def test_adaptive_policy_keeps_greedy_output(pair):
    target, draft = pair
    requests = random_requests(5, max_new=16)
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    result = engine.run(requests, HFHeuristic(gamma=3, max_gamma=32), 2)
    assert {r.request_id: r.output_ids for r in result.requests} == reference
    assert len({c.gamma for c in result.cycles}) > 1  # the schedule really moved


class RaggedStop(FixedGamma):
    """Row b stops drafting after step b mod 3: every batch holds rows with 1, 2 and 3+ drafts."""

    def continue_drafting(self, step):
        rows = torch.arange(step.active.shape[0])
        return rows % 3 > step.step


@pytest.mark.parametrize("concurrency", [1, 4])
def test_rows_that_stop_drafting_early_keep_greedy_output(pair, concurrency):
    """Per-row early stop (ragged draft counts in one batch) through the same verify path."""
    target, draft = pair
    requests = random_requests(5, max_new=16)
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    result = engine.run(requests, RaggedStop(5), concurrency)
    assert {r.request_id: r.output_ids for r in result.requests} == reference
    counts = {c.num_drafts for c in result.cycles}
    assert counts == {1} if concurrency == 1 else counts >= {1, 2, 3}  # slot 0 stops first, slot 2 last
    assert all(c.accepted <= c.num_drafts for c in result.cycles)


def test_eos_and_max_new_tokens_end_requests(pair):
    target, draft = pair
    requests = random_requests(3, max_new=12)
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    free = engine.run(requests, None, 1).requests
    eos = free[0].output_ids[5]  # a token request 0 emits at step 6 becomes the EOS
    engine.eos = {eos}
    for result in (engine.run(requests, None, 1), engine.run(requests, FixedGamma(4), 3)):
        for rec, ref in zip(sorted(result.requests, key=lambda r: r.request_id), free, strict=True):
            cut = ref.output_ids.index(eos) + 1 if eos in ref.output_ids else len(ref.output_ids)
            assert rec.output_ids == ref.output_ids[:cut]
    # workload.ignore_eos: the same requests run to max_new_tokens through the EOS, token for token as before
    fixed = [dataclasses.replace(r, ignore_eos=True) for r in requests]
    for result in (engine.run(fixed, None, 1), engine.run(fixed, FixedGamma(4), 3)):
        assert [r.output_ids for r in sorted(result.requests, key=lambda r: r.request_id)] == \
            [r.output_ids for r in free]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_requests_that_end_at_their_first_token(pair, concurrency):
    """max_new_tokens = 1 (or EOS first) ends a request at prefill: no cycle runs for it, the loop goes on."""
    target, draft = pair
    requests = random_requests(2, max_new=5, seed=9) + random_requests(3, max_new=1)  # the last one ends at prefill
    for i, req in enumerate(requests):
        req.request_id = i
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    result = engine.run(requests, FixedGamma(2), concurrency)
    assert [len(r.output_ids) for r in sorted(result.requests, key=lambda r: r.request_id)] == [5, 5, 1, 1, 1]
    frame = requests_frame(result.requests)
    assert frame["tpot_ms"].isna().sum() == 3  # TPOT is undefined for one-token outputs


def test_continuous_batching_and_open_loop_timing(pair):
    target, draft = pair
    requests = random_requests(6, max_new=8)
    for i, req in enumerate(requests):  # in pairs: two rows in flight however fast a request finishes
        req.arrival_s = 0.02 * (i // 2)
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    result = engine.run(requests, FixedGamma(2), 2)
    frame = requests_frame(result.requests)
    assert (frame["admitted_s"] >= frame["arrival_s"]).all()
    assert (frame["first_token_s"] >= frame["admitted_s"]).all()
    assert (frame["finish_s"] >= frame["first_token_s"]).all()
    assert (frame["output_tokens"] == 8).all()
    cycles = cycles_frame(result.cycles)
    assert cycles["batch_size"].max() == 2  # never more than `concurrency` in flight
    assert set(cycles["slot"]) == {0, 1}
    tpot = (frame["e2el_ms"] - frame["ttft_ms"]) / 7
    assert np.allclose(frame["tpot_ms"], tpot)


class SkipEveryOther(FixedGamma):
    """γ alternates between 0 (no speculation this cycle: a plain target step) and the given γ."""

    def begin_cycle(self, batch_size):
        self.calls = getattr(self, "calls", 0) + 1
        return 0 if self.calls % 2 else self.gamma


def _exact_prefix_law(target, prompt: list[int], length: int, sampling: SamplingParams) -> dict[tuple, float]:
    """Law of the first ``length`` generated tokens, by enumeration through the target alone."""
    vocab = target.config.vocab_size
    law = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, ids = 1.0, list(prompt)
        for token in seq:
            logits = target(torch.tensor([ids])).logits[0, -1]
            prob *= float(warp(logits, sampling)[token])
            ids.append(token)
        law[seq] = prob
    return law


@torch.inference_mode()
@pytest.mark.parametrize(("sampler", "should_pass", "path", "policy"), [
    ("exact", True, ExecutionPath(), FixedGamma(2)),
    ("naive", False, ExecutionPath(), FixedGamma(2)),
    ("exact", True, ExecutionPath(static=True, max_cache_len=16), FixedGamma(2)),
    ("exact", True, ExecutionPath(), ConfidenceStop(gamma=3, threshold=0.5)),
    ("exact", True, ExecutionPath(), None),
], ids=["exact", "naive", "exact-static", "exact-early-stop", "exact-no-speculation-cycles"])
def test_sampled_law_of_generated_tokens_is_the_targets(sampler, should_pass, path, policy):
    """Joint law of the first 3 generated tokens (V = 4: 64 cells), n = 3000 requests, seeded.

    Rule: chi-square goodness of fit against the enumerated target law, p-value > 1e-3 passes.
    The same test must catch the naive 'resample from p on rejection' sampler (p-value < 1e-3).
    """
    target = tiny_llama(vocab=4, hidden=32, layers=2, seed=3, init=0.8)
    draft = tiny_llama(vocab=4, hidden=16, layers=1, seed=4, init=0.8)
    sampling = SamplingParams(temperature=1.0)
    prompt = [1, 2, 3, 0, 2]
    exact = _exact_prefix_law(target, prompt, 3, sampling)
    n = 3000
    requests = [Request(i, "p", "en", prompt, 3) for i in range(n)]
    engine = Engine(target, draft, sampling=sampling, sampler=get_sampler(sampler), device="cpu", seed=20260923,
                    path=path)
    policy = policy or SkipEveryOther(2)  # γ = 0 and γ = 2 cycles alternate: the draft catches up on skipped tokens
    result = engine.run(requests, policy, 250)
    if isinstance(policy, ConfidenceStop):  # the test must really exercise ragged per-row draft counts
        assert len({c.num_drafts for c in result.cycles}) > 1
    counts = {cell: 0 for cell in exact}
    for rec in result.requests:
        counts[tuple(rec.output_ids)] += 1
    observed = np.array([counts[c] for c in exact], dtype=float)
    expected = np.array([exact[c] for c in exact])
    expected = expected / expected.sum() * n  # the float32 warp sums to 1 only within ~1e-7
    pvalue = chisquare(observed, expected).pvalue
    assert (pvalue > 1e-3) == should_pass, pvalue
