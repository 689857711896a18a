"""Prompt lookup, a draft without a model (spectune/engine/proposers/lookup.py): the same drafts as transformers'
PromptLookupCandidateGenerator, greedy output equal to autoregressive decoding at every length, chains clipped at
stop tokens and at the length limit, and a point-mass proposal verified exactly at T > 0."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from spectune.engine import Engine
from spectune.engine.policy import FixedGamma
from spectune.engine.proposers.lookup import PromptLookup
from spectune.engine.proposers.ngram import clip, lookup
from spectune.engine.proposers.replay import copyable_fraction, replay_greedy
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import (
    assert_chains_stop_at_stop_ids_and_the_length_limit,
    assert_point_mass_draft_is_exact,
    copying_target,
    greedy_runs,
    repetitive_requests,
)

GREEDY = SamplingParams(temperature=0)


def test_the_drafts_are_transformers_prompt_lookup_candidates():
    """400 seeded contexts over 4 ids (many matches), n up to 1..4, 1..6 tokens, with and without an EOS id."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(0)
    compared = matched = 0
    for _ in range(400):
        context = [rng.randrange(4) for _ in range(rng.randrange(2, 40))]
        max_n, tokens = rng.randrange(1, 5), rng.randrange(1, 7)
        eos = rng.choice([None, 3])
        hf = PromptLookupCandidateGenerator(eos_token_id=None if eos is None else torch.tensor([eos]),
                                            num_output_tokens=tokens, max_matching_ngram_size=max_n,
                                            max_length=10**6)
        ids = torch.tensor([context])
        candidates, _ = hf.get_candidates(ids)
        expected = candidates[0, len(context):].tolist()
        ours = clip(lookup(context, max_n, 1, tokens), [] if eos is None else [eos], 10**6)
        assert ours == expected, (context, max_n, tokens, eos)
        compared += 1
        matched += bool(expected)
    assert compared == 400 and 100 < matched < 400, matched  # both branches exercised


def test_lookup_finds_the_earliest_longest_match_and_nothing_without_one():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 3, 1, 2) == [9, 1]  # earliest occurrence, n = 3
    assert lookup([5, 6, 7, 8], 3, 1, 4) == []  # no earlier occurrence of any suffix
    assert lookup([1, 2, 1, 2], 2, 2, 5) == [1, 2]  # continuation cut at the context's end
    assert lookup([4, 1, 4], 3, 2, 3) == []  # min_n = 2: the 1-gram match does not count
    assert clip([1, 2, 0, 3], [0], 10) == [1, 2] and clip([1, 2, 3], [], 2) == [1, 2]
    with pytest.raises(SpectuneError, match="min_n"):
        PromptLookup(max_n=2, min_n=3)


@pytest.fixture(scope="module")
def target():
    return copying_target()


def test_greedy_lookup_equals_autoregressive_at_every_length(target):
    """γ 1, 4 × concurrency 1, 3, 7 × max_new_tokens 1, 2, 3, 5, 9, 16: the outputs of plain decoding."""
    accepted, mixed = greedy_runs(target, PromptLookup(max_n=3), (1, 2, 3, 5, 9, 16), (1, 4), (1, 3, 7))
    assert accepted > 50, "the repeated phrases should be matched and accepted, or this test exercises little"
    assert mixed > 10, "rows with and without a match should share cycles (padding of the verification)"


def test_chains_stop_before_stop_ids_and_at_the_length_limit():
    assert_chains_stop_at_stop_ids_and_the_length_limit(PromptLookup(max_n=2, stop_ids=(9,)))


@pytest.mark.slow(reason="three engines × 400 requests at T = 1: about 30 s on two quiet cores")
def test_sampled_lookup_emits_the_target_law_and_the_mutants_do_not():
    """Prompt lookup (max_n 3) under the point-mass audit (tests/tiny_models.py: 4,400 tokens per sampler, seed 0,
    chi-square; exact passes at alpha = 0.001, "resample from p" and "argmax matches" rejected at p < 1e-6)."""
    assert_point_mass_draft_is_exact(PromptLookup(max_n=3))


def point_mass_laws(sampler_name: str, x: int, n: int = 20_000) -> np.ndarray:
    """The emitted token's law for p = (0.5, 0.3, 0.2) and a point mass on token ``x``."""
    p = torch.tensor([0.5, 0.3, 0.2])
    target = p.expand(n, 2, 3).clone()  # position 0 verifies the draft, position 1 would be the bonus
    q = torch.zeros(n, 1, 3)
    q[:, 0, x] = 1.0
    tokens = torch.full((n, 1), x, dtype=torch.long)
    verdict = get_sampler(sampler_name)(target, q, tokens, torch.Generator().manual_seed(x))
    first = torch.where(verdict.num_accepted > 0, tokens[:, 0], verdict.next_token)
    return np.bincount(first.numpy(), minlength=3)


def test_point_mass_proposal_is_exact_and_both_mutants_are_caught():
    """n = 20,000 draws each (seeded), chi-square against p = (0.5, 0.3, 0.2) at alpha = 0.001. The exact rule
    passes with the point mass on token 0 and on token 1 (p(x) = 0.5 and 0.3: neither 0 nor 1). With it on token 0
    (the target's argmax), "resample from p" (law 0.5·δ_0 + 0.5·p = (0.75, 0.15, 0.10)) and "accept when the
    target's argmax matches" (law δ_0) are rejected (p-value < 1e-6)."""
    p = np.array([0.5, 0.3, 0.2])
    for x in (0, 1):
        exact = point_mass_laws("exact", x)
        assert chisquare(exact, p * exact.sum()).pvalue > 0.001, x
    for wrong in ("naive", "argmax-match"):
        counts = point_mass_laws(wrong, 0)
        assert chisquare(counts, p * counts.sum()).pvalue < 1e-6, wrong


def test_greedy_replay_predicts_the_engines_cycles(target):
    """From autoregressive outputs alone, the replay gives every cycle's (drafted, accepted) that the engine then
    runs with prompt lookup, greedy, concurrency 1, γ 1 and 4, 7 requests of 16 tokens."""
    spec = PromptLookup(max_n=3)
    plain = Engine(target, None, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    engine = Engine(target, spec, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    requests = repetitive_requests(7, 16)
    outputs = {r.request_id: r.output_ids for r in plain.run(requests, None, 1).requests}
    for gamma in (1, 4):
        result = engine.run(requests, FixedGamma(gamma), 1)
        for request in requests:
            ran = [(c.num_drafts, c.accepted) for c in result.cycles if c.request_id == request.request_id]
            assert ran == replay_greedy(request.input_ids, outputs[request.request_id], gamma, spec, 16), gamma


def test_copyable_fraction_counts_output_tokens_inside_earlier_ngrams():
    assert copyable_fraction([1, 2, 3, 4], [1, 2, 3, 9]) == 0.75  # 1 2 3 copies the prompt; 9 does not
    assert copyable_fraction([1, 2, 3], [5, 6, 7, 5, 6, 7]) == 0.5  # the second 5 6 7 repeats the output's first
    assert copyable_fraction([1, 2], [3]) == 0.0 and copyable_fraction([], []) == 0.0


def test_the_configured_pair_drafts_by_prompt_lookup_and_greedy_stays_autoregressive(compose_config):
    """The embedded tiny pair through the product's own loading (Hydra composition, workload, tokenizer): with
    ``{name: lookup}`` prompt lookup drafts, never a special (chat-template) id, and greedy output equals plain
    decoding on 6 English task prompts (24 new tokens); an unknown proposer or setting is a one-line error."""
    from spectune.measure.models import draft_of, load_models
    from spectune.measure.point import open_engine, requests_of
    from workloads.loader import load_workload

    cfg = compose_config("+workload=en", "workload.categories=[rewrite,code]", "workload.num_prompts=6",
                         "workload.sampling.temperature=0")
    models = load_models(cfg.models, cfg.hardware)
    workload = load_workload(cfg.workload, models.tokenizer)
    spec = draft_of(models, {"name": "lookup", "max_n": 4})
    assert isinstance(spec, PromptLookup) and spec.max_n == 4
    assert set(models.tokenizer.all_special_ids) <= set(spec.stop_ids)
    requests = requests_of(workload.prompts, 24)
    plain = open_engine(models, workload.sampling, "exact", 0, {"name": "model"}).run(requests, None, 1)
    looked = open_engine(models, workload.sampling, "exact", 0, {"name": "lookup"}).run(requests, FixedGamma(4), 2)
    assert {r.request_id: r.output_ids for r in looked.requests} == {r.request_id: r.output_ids for r in plain.requests}
    assert sum(c.num_drafts for c in looked.cycles) > 0
    with pytest.raises(SpectuneError, match="proposer='ngram' is unknown: choose one of model, "):
        draft_of(models, {"name": "ngram"})
    with pytest.raises(SpectuneError, match=r"proposer\.n is not a setting of proposer=lookup"):
        draft_of(models, {"name": "lookup", "n": 3})
