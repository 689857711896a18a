"""The match signals of the model-free drafts (spectune.engine.policy.MATCH_SIGNALS): prompt lookup's and suffix
decoding's proposers report what their chain matched (its length, how many earlier occurrences are followed by a
token, each token's frequency score), per row and step; the engine shows them to a policy that declares them, and a
model draft leaves them None."""

from __future__ import annotations

import random

import pytest
import torch

from spectune.engine import Engine, Request
from spectune.engine.policy import DRAFT_SIGNALS, MATCH_SIGNALS, SIGNALS, DraftStep, FixedGamma
from spectune.engine.proposers.chain import ChainProposer
from spectune.engine.proposers.lookup import PromptLookup
from spectune.engine.proposers.ngram import Chain, lookup, lookup_chain, occurrences
from spectune.engine.proposers.suffix import SuffixDrafting
from spectune.engine.proposers.suffix_tree import SuffixTrie, speculate
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests


def test_the_signals_are_named_once_and_a_draft_step_carries_each():
    assert list(SIGNALS) == [*DRAFT_SIGNALS, *MATCH_SIGNALS] and not set(DRAFT_SIGNALS) & set(MATCH_SIGNALS)
    assert set(SIGNALS) <= set(DraftStep.__dataclass_fields__)


def _reference_match(context: list[int], max_n: int, min_n: int) -> tuple[int, int]:
    """(n, earlier occurrences of the last n tokens followed by a token) for the longest n in min_n..max_n that
    occurs earlier, by counting windows; (0, 0) when none does."""
    for n in range(min(max_n, len(context) - 1), min_n - 1, -1):
        windows = [tuple(context[i:i + n]) for i in range(len(context) - n)]  # each followed by a token
        count = windows.count(tuple(context[len(context) - n:]))
        if count:
            return n, count
    return 0, 0


def test_lookup_chain_is_lookups_chain_with_the_match_counted_by_windows():
    """600 seeded contexts over 3 or 6 ids, n up to 1..4 (min_n 1 or 2), 1..6 tokens: the chain is lookup()'s
    (whose drafts are transformers', test_lookup.py) and (match_length, matches) are the window count's."""
    rng = random.Random(1)
    matched = 0
    for _ in range(600):
        context = [rng.randrange(rng.choice([3, 6])) for _ in range(rng.randrange(1, 40))]
        max_n, length = rng.randrange(1, 5), rng.randrange(1, 7)
        min_n = rng.randrange(1, max_n + 1) if max_n > 1 else 1
        found = lookup_chain(context, max_n, min_n, length)
        assert list(found.tokens) == lookup(context, max_n, min_n, length), context
        assert (found.match_length, found.matches) == _reference_match(context, max_n, min_n), context
        assert bool(found.tokens) == (found.match_length > 0) and found.scores is None
        fast = lookup_chain(context, max_n, min_n, length, count=False)  # what the proposer finds every cycle
        assert fast.tokens == found.tokens and fast.match_length == found.match_length
        assert fast.matches == (None if found.tokens else 0)
        if found.tokens:
            assert occurrences(context, found.match_length) == found.matches
        matched += found.matches > 1
    assert 100 < matched < 600, matched  # multiple occurrences and single ones both exercised
    assert lookup_chain([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 3, 1, 2) == Chain((9, 1), 3, 2)
    assert lookup_chain([5, 6, 7, 8], 3, 1, 4) == Chain() and lookup_chain([1, 2, 1, 2], 2, 1, 0) == Chain()


def _steps(proposer, count: int, names=frozenset(MATCH_SIGNALS)) -> list[dict[str, list[float]]]:
    out = []
    for _ in range(count):
        _, _, signals = proposer.step(None, frozenset(names))
        out.append({name: signals[name].tolist() for name in names})
    return out


def test_the_lookup_proposer_reports_its_match_at_every_step_and_scores_only_where_it_drafts():
    """Row 0: ... 4 5 6 occurs twice before (→ 7 8, clipped at the length limit to 2 tokens); row 1: no match;
    row 2: idle. Four steps: the match at every step, score 1 and running product 1 while the row drafts, 0 after."""
    proposer = ChainProposer(PromptLookup(max_n=3), batch=3, vocab_size=16, device="cpu")
    proposer.prefill([0, 1], [[4, 5, 6, 7, 8, 4, 5, 6, 7, 8, 4, 5], [1, 2, 3]], limits=[4, 64])
    proposer.begin(torch.tensor([6, 9, 0]))
    assert proposer._chains == [[7, 8], [], []]
    rows = _steps(proposer, 4)
    assert [r["match_length"] for r in rows] == [[3.0, 0.0, 0.0]] * 4
    assert [r["matches"] for r in rows] == [[2.0, 0.0, 0.0]] * 4
    assert [r["suffix_score"] for r in rows] == [[1.0, 0.0, 0.0]] * 2 + [[0.0, 0.0, 0.0]] * 2
    assert [r["suffix_prob"] for r in rows] == [[1.0, 0.0, 0.0]] * 2 + [[0.0, 0.0, 0.0]] * 2
    assert all(t.dtype == torch.float32 for t in proposer.step(None, frozenset(MATCH_SIGNALS))[2].values())
    assert set(proposer.step(None, frozenset({"token_prob"}))[2]) == {"token_prob"}  # only what is asked for


def test_the_suffix_proposer_reports_the_matched_nodes_occurrences_followed_by_a_token():
    """In 1 2 3 1 2 4 1 2 3 1 2 (test_suffix.py's case) the best match is the last 5 tokens, which occur twice,
    once at the context's end: 1 occurrence followed by a token (the node's children's counts); the 1-token match
    "2" occurs 4 times, 3 of them followed by a token."""
    context = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]
    draft = speculate(SuffixTrie.of([context], 24), context, 5, adaptive=False)
    assert (draft.match_length, draft.matches) == (5, 1)
    one = speculate(SuffixTrie.of([context], 24), context[-2:], 5, adaptive=False)
    assert (one.match_length, one.matches) == (1, 3)
    proposer = ChainProposer(SuffixDrafting(adaptive=False, max_gamma=5), batch=2, vocab_size=16, device="cpu")
    proposer.prefill([0, 1], [context[:-1], [5, 6, 7, 8]], limits=[64, 64])
    proposer.begin(torch.tensor([2, 9]))
    rows = _steps(proposer, 5)
    assert [r["match_length"] for r in rows] == [[5.0, 0.0]] * 5 and [r["matches"] for r in rows] == [[1.0, 0.0]] * 5
    assert [r["suffix_score"][0] for r in rows] == [0.5, 1.0, 1.0, 1.0, 1.0]
    assert [r["suffix_prob"][0] for r in rows] == [0.5] * 5


class Shown(FixedGamma):
    """A fixed γ that declares every signal and keeps, per draft step it is shown, each signal (None or a list)."""

    signals = frozenset(SIGNALS)

    def reset(self) -> None:
        self.shown: list[dict[str, list[float] | None]] = []

    def continue_drafting(self, step: DraftStep) -> None:
        self.shown.append({name: None if getattr(step, name) is None else getattr(step, name).tolist()
                           for name in SIGNALS})
        return None


@pytest.mark.parametrize("proposer", ["lookup", "model"])
def test_the_engine_shows_a_policy_the_match_signals_of_a_model_free_draft_and_none_of_a_model(pair, proposer):
    """Greedy, γ 4, 3 requests whose prompts repeat a phrase, concurrency 2: under prompt lookup every declared
    signal reaches the policy, the match length within 1..max_n on rows with a chain; under the draft model the match
    signals stay None and the q-derived ones arrive."""
    target, model = pair
    draft = PromptLookup(max_n=3) if proposer == "lookup" else model
    engine = Engine(target, draft, sampling=SamplingParams(temperature=0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    requests = [Request(r.request_id, r.prompt_id, r.language, r.input_ids * 3, 10)
                for r in random_requests(3, max_new=10, seed=2)]
    policy = Shown(4)
    engine.run(requests, policy, 2)
    assert policy.shown
    for shown in policy.shown:
        assert all(shown[name] is not None for name in DRAFT_SIGNALS)
        if proposer == "model":
            assert all(shown[name] is None for name in MATCH_SIGNALS)
            continue
        assert all(shown[name] is not None for name in MATCH_SIGNALS)
        assert all(0 <= n <= 3 and n == int(n) for n in shown["match_length"])
    if proposer == "lookup":
        assert any(n > 0 for shown in policy.shown for n in shown["match_length"])  # the repeats matched
