"""Suffix decoding, a draft without a model (spectune/engine/proposers/suffix.py): known chains on hand-made sequences
(most frequent child, scores, the min_token_prob cut, the adaptive length, the per-request/global choice), the
global trie frozen, greedy output equal to autoregressive decoding at every length with rows with and without a
chain in the same cycle, chains clipped at stop ids and the length limit, and the point-mass proposal verified
exactly at T = 1."""

from __future__ import annotations

import pytest
import torch

from spectune.engine import Engine, Request
from spectune.engine.policy import MATCH_SIGNALS, FixedGamma
from spectune.engine.proposers.chain import ChainProposer
from spectune.engine.proposers.suffix import SuffixDrafting
from spectune.engine.proposers.suffix_tree import SuffixTrie, speculate
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import (
    assert_chains_stop_at_stop_ids_and_the_length_limit,
    assert_point_mass_draft_is_exact,
    copying_target,
    greedy_runs,
    repetitive_requests,
    tiny_llama,
)

GREEDY = SamplingParams(temperature=0)


def trie_of(*sequences: list[int], depth: int = 24) -> SuffixTrie:
    return SuffixTrie.of(sequences, depth)


def snapshot(node) -> tuple:
    """A trie as nested tuples (token, count, children), to compare two states."""
    return tuple((token, child.count, snapshot(child)) for token, child in node.children.items())


def test_the_chain_follows_the_most_frequent_child_and_the_best_match_wins():
    """In 1 2 3 1 2 4 1 2 3 1 2, "2" (4 occurrences) goes on with 3 twice and 4 once: the match of 1 token drafts
    3 (score 2/4), then 1, 2 (score 1 each), then 4 (1 2 3 1 2 occurs twice, once at the context's end: 1/2);
    sum of running products 2.0. Matches of 3 to 5 tokens (… 3 1 2, occurring twice, once followed by 4) draft
    4 1 2 3 1 at running product 0.5 throughout: 2.5, the highest; the longest of them (5) is kept."""
    context = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]
    trie = trie_of(context)
    assert trie.find([2]).count == 4 and trie.find([2, 3]).count == 2 and trie.find([1, 2, 3, 1, 2]).count == 2
    draft = speculate(trie, context, 5, adaptive=False)
    assert draft.tokens == (4, 1, 2, 3, 1) and draft.match_length == 5
    assert draft.scores == (0.5, 1.0, 1.0, 1.0, 1.0) and draft.probs == (0.5,) * 5 and draft.score == 2.5
    one = speculate(trie_of(context), context[-2:], 5, adaptive=False)  # the context 1 2: matches of 1 token only
    assert one.tokens == (3, 1, 2, 4, 1) and one.probs == (0.5, 0.5, 0.5, 0.25, 0.25) and one.match_length == 1
    # ties between children: the one created first (3 before 4 after "9 1 2")
    assert speculate(trie_of([9, 1, 2, 3], [9, 1, 2, 4]), [0, 2], 3).tokens == (3,)
    assert speculate(trie_of([1, 2, 3]), [7, 8], 4).tokens == ()  # no match: no chain
    assert speculate(trie_of([5, 6, 7]), [5, 6, 7], 4).tokens == ()  # the context itself: no continuation


def test_min_token_prob_cuts_where_the_running_product_falls_below():
    """After "9": 1 (3 of 4: 0.75), then 2 (2 of 3: running 0.5), then 3 (1 of 2: running 0.25)."""
    trie = trie_of([9, 1, 2, 3], [9, 1, 2, 4], [9, 1, 5, 6], [9, 7])
    full = speculate(trie, [0, 9], 8, min_token_prob=0.25, adaptive=False)
    assert full.tokens == (1, 2, 3) and full.scores == pytest.approx((0.75, 2 / 3, 0.5))
    assert full.probs == pytest.approx((0.75, 0.5, 0.25))
    assert speculate(trie, [0, 9], 8, min_token_prob=0.3, adaptive=False).tokens == (1, 2)
    assert speculate(trie, [0, 9], 8, min_token_prob=0.8, adaptive=False).tokens == ()
    assert speculate(trie, [0, 9], 2, min_token_prob=0.0, adaptive=False).tokens == (1, 2)  # max_gamma


def test_the_adaptive_length_is_the_match_length_times_the_factor():
    """5 6 7 8 9 0 5: only "5" matches (1 token), followed once by 6 7 8 9 0. Adaptive, a match of 1 token drafts
    ⌊1.0 · 1⌋ = 1 token (⌊2.5⌋ = 2 with factor 2.5, none with 0.5: arctic-inference's rounding); not adaptive, up
    to max_gamma."""
    context = [5, 6, 7, 8, 9, 0, 5]
    trie = trie_of(context)
    assert speculate(trie, context, 4).tokens == (6,)
    assert speculate(trie, context, 4, max_spec_factor=2.5).tokens == (6, 7)
    assert speculate(trie, context, 4, max_spec_factor=0.5).tokens == ()  # ⌊0.5⌋ = 0
    assert speculate(trie, context, 4, adaptive=False).tokens == (6, 7, 8, 9)
    assert speculate(trie, context, 4, adaptive=False).probs == (0.5,) * 4
    # A path holds 24 tokens: a match of m tokens leaves 24 − m. Not adaptive, a match of 1 drafts the most (23);
    # adaptive, min(m, 24 − m) peaks at m = 12.
    deep = trie_of(list(range(60)))
    loose = speculate(deep, list(range(30)), 24, adaptive=False)
    assert loose.tokens == tuple(range(30, 53)) and loose.match_length == 1
    tight = speculate(deep, list(range(30)), 24)
    assert tight.tokens == tuple(range(30, 42)) and tight.match_length == 12


def test_the_higher_scoring_trie_wins_and_is_recorded():
    spec = SuffixDrafting(corpus=[[4, 5, 6, 7], [4, 5, 6, 7]], adaptive=False)
    request = trie_of([1, 2, 4, 5, 9, 4, 5])  # "4 5" went on with 9 once (and ends the context): 0.5
    draft = spec.propose(request, [1, 2, 4, 5, 9, 4, 5])
    assert (draft.source, draft.tokens, draft.match_length) == ("global", (6, 7), 2)
    request = trie_of([4, 5, 6, 7, 4, 5])  # 4 5 → 6 7 4 5 (once in two): 4 × 0.5 = 2.0, the global chain's score
    tie = spec.propose(request, [4, 5, 6, 7, 4, 5])
    assert (tie.source, tie.tokens, tie.score) == ("request", (6, 7, 4, 5), 2.0)  # ties: the per-request trie
    assert SuffixDrafting().global_tree is None
    with pytest.raises(SpectuneError, match="min_token_prob"):
        SuffixDrafting(min_token_prob=1.5)
    with pytest.raises(SpectuneError, match="max_tree_depth"):
        SuffixDrafting(max_tree_depth=1)


def test_the_proposer_reports_scores_and_match_lengths_and_rows_without_a_chain_draft_nothing():
    """Two rows in one cycle: row 0's context ends with a repeat (chain 4 1 2 3 1), row 1's has none; the signals
    asked for by name are the chain's scores, running products and match length, 0 where a row drafts nothing."""
    proposer = ChainProposer(SuffixDrafting(adaptive=False, max_gamma=5), batch=2, vocab_size=16, device="cpu")
    proposer.prefill([0, 1], [[1, 2, 3, 1, 2, 4, 1, 2, 3, 1], [5, 6, 7, 8]], limits=[64, 64])
    proposer.begin(torch.tensor([2, 9]))
    assert proposer._chains == [[4, 1, 2, 3, 1], []]
    assert [d.source for d in proposer.source.drafts] == ["request", "none"] and proposer.source.sources["none"] == 1
    rows = []
    for _ in range(5):
        _, q, out = proposer.step(None, frozenset(MATCH_SIGNALS) | {"token_prob"})
        rows.append({name: out[name].tolist() for name in (*MATCH_SIGNALS, "token_prob")})
        assert q[0].max() == 1.0 and q[0].sum() == 1.0  # a point mass
    assert [r["suffix_score"] for r in rows] == [[0.5, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
    assert [r["suffix_prob"][0] for r in rows] == [0.5] * 5 and [r["match_length"] for r in rows] == [[5.0, 0.0]] * 5
    proposal = proposer.finish()
    assert proposal.tokens[0].tolist() == [4, 1, 2, 3, 1] and proposal.num_drafts.tolist() == [5, 0]
    # two accepted: they, ``last`` and row 1's ``last`` join the histories, and the tries catch up at the next begin
    proposer.rollback(torch.tensor([11, 5]), torch.tensor([2, 0]), proposal, torch.tensor([True, True]), [2, 0])
    proposer.begin(torch.tensor([7, 5]))
    assert proposer.source.trees[0].size == 10 + 3 + 1 and proposer.source.trees[1].size == 4 + 1 + 1


def test_chains_stop_before_stop_ids_and_at_the_length_limit():
    assert_chains_stop_at_stop_ids_and_the_length_limit(SuffixDrafting(adaptive=False, stop_ids=(9,)))


@pytest.fixture(scope="module")
def target():
    return copying_target()


def test_greedy_suffix_equals_autoregressive_at_every_length(target):
    """Per-request tries alone: max_new_tokens 1, 2, 3, 5, 9, 16 × γ 1, 4 × concurrency 1, 3, 7 give the outputs
    of plain decoding, the repeated phrases' chains are accepted, and rows with and without a chain share cycles."""
    accepted, mixed = greedy_runs(target, SuffixDrafting(), (1, 2, 3, 5, 9, 16), (1, 4), (1, 3, 7))
    assert accepted > 30, "the repeated phrases should be matched and accepted, or this test exercises little"
    assert mixed > 10, "rows with and without a chain should share cycles (padding of the verification)"


def test_greedy_with_a_global_trie_equals_autoregressive_and_leaves_the_trie_unchanged(target):
    """A global trie of the same prompts' 16-token greedy outputs (a training split that holds the answers): at
    max_new_tokens 5 and 16 × γ 1, 4 × concurrency 1, 7 the outputs are plain decoding's, more drafts are accepted
    than with the per-request tries alone, and the global trie is exactly as built (it cannot be extended)."""
    plain = Engine(target, None, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    requests = repetitive_requests(7, 16)
    outputs = {r.request_id: r.output_ids for r in plain.run(requests, None, 1).requests}
    spec = SuffixDrafting(corpus=[[*r.input_ids, *outputs[r.request_id]] for r in requests])
    built = snapshot(spec.global_tree.root)
    accepted, _ = greedy_runs(target, spec, (5, 16), (1, 4), (1, 7))
    alone, _ = greedy_runs(target, SuffixDrafting(), (5, 16), (1, 4), (1, 7))
    assert accepted > alone > 0, (accepted, alone)
    assert snapshot(spec.global_tree.root) == built
    with pytest.raises(SpectuneError, match="frozen"):
        spec.global_tree.extend([1, 2, 3])


def test_both_tries_propose_in_a_run_and_the_sources_are_counted(target):
    """With the answers in the global trie, most row-cycles take its chain; the per-request trie still wins some
    (repeated phrases in the prompt), and a random prompt's first cycles have none."""
    plain = Engine(target, None, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    requests = repetitive_requests(7, 16)
    outputs = {r.request_id: r.output_ids for r in plain.run(requests, None, 1).requests}
    spec = SuffixDrafting(corpus=[[*r.input_ids, *outputs[r.request_id]] for r in requests[:4]])
    engine = Engine(target, spec, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    session = engine.session(requests, FixedGamma(4), 3)
    while not session.done:
        session.step()
    sources = session.proposer.source.sources
    assert sources["global"] > 0 and sources["request"] > 0 and sources["none"] > 0, sources


@pytest.mark.slow(reason="three engines × 400 requests at T = 1: about 5 s on two quiet cores, a minute under load")
def test_sampled_suffix_emits_the_target_law_and_the_mutants_do_not():
    """Suffix decoding (not adaptive, min_token_prob 0.1) with a global trie over sequences of the law's likeliest
    tokens, under the point-mass audit (tests/tiny_models.py: 4,400 tokens per sampler, seed 0, chi-square; exact
    passes at alpha = 0.001, "resample from p" and "argmax matches" rejected at p < 1e-6)."""
    assert_point_mass_draft_is_exact(SuffixDrafting(adaptive=False, corpus=[[0, 1, 0, 2, 0, 1, 0, 0, 1]] * 3))


def test_the_configured_pair_drafts_by_suffix_with_a_frozen_training_corpus(compose_config, harness_in_process,
                                                                            tmp_path):
    """proposer=suffix through the product's own loading (composition, workload, tokenizer) on the tiny pair: the
    global trie holds the workload's training-split prompts (corpus=train) or nothing (corpus=none), greedy output
    equals plain decoding on 4 English task prompts, and a bad corpus fails in one line before any model loads."""
    from spectune.measure.point import requests_of
    from workloads.setup import open_setup

    base = ["+workload=en", "workload.categories=[rewrite,code]", "workload.num_prompts=4",
            "workload.task_max_new_tokens=16", "workload.sampling.temperature=0"]
    trained = open_setup(compose_config(*base, "proposer=suffix"), "test")
    bare = open_setup(compose_config(*base, "proposer=suffix", "proposer.corpus=none"), "test")
    assert isinstance(trained.engine.draft, SuffixDrafting) and trained.engine.draft.global_tree is not None
    assert bare.engine.draft.global_tree is None
    requests = requests_of(trained.workload.prompts, trained.workload.max_new_tokens)
    plain = trained.engine.run(requests, None, 1)
    drafted = trained.engine.run(requests, FixedGamma(4), 1)
    outputs = {r.request_id: r.output_ids for r in plain.requests}
    assert {r.request_id: r.output_ids for r in drafted.requests} == outputs
    assert sum(c.num_drafts for c in drafted.cycles) > 0
    with pytest.raises(SpectuneError, match=r"proposer\.corpus=.eval. is invalid: must be one of train, none"):
        harness_in_process(tmp_path, *base, "proposer=suffix", "proposer.corpus=eval")


def test_greedy_replay_predicts_the_engines_suffix_cycles():
    """From autoregressive outputs alone, the replay with a per-request trie (request_chains) gives every cycle's
    (drafted, accepted) that the engine then runs with suffix decoding, greedy, concurrency 1, γ 1 and 4, 7 requests
    of 16 tokens, with and without a global trie."""
    from spectune.engine.proposers.replay import replay_greedy
    from spectune.engine.proposers.suffix import request_chains

    target = tiny_llama(seed=3)
    plain = Engine(target, None, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    requests = [Request(i, f"p{i}", "en", [5 + i % 3, 6, 7, 5 + i % 3, 6, 7, 8, 5 + i % 3], 16) for i in range(7)]
    outputs = {r.request_id: r.output_ids for r in plain.run(requests, None, 1).requests}
    drafted = 0
    for corpus in ([], [[6, 7, 8, 9, 10, 6, 7, 8]]):
        spec = SuffixDrafting(max_gamma=6, corpus=corpus)
        engine = Engine(target, spec, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
        for gamma in (1, 4):
            result = engine.run(requests, FixedGamma(gamma), 1)
            for request in requests:
                ran = [(c.num_drafts, c.accepted) for c in result.cycles if c.request_id == request.request_id]
                assert ran == replay_greedy(request.input_ids, outputs[request.request_id], gamma, spec, 16,
                                            chain_of=request_chains(spec)), (gamma, corpus)
                drafted += sum(d for d, _ in ran)
    assert drafted > 20  # the chains were not all empty
