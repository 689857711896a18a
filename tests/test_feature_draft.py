"""A draft that reads the target's features (EAGLE-style): the engine feeds it exactly the entries its training
assumes, and speculation with it stays exact.

The bookkeeping claim is checked law by law: every q the engine drew a draft from equals the q recomputed from
scratch, i.e. the draft run over the whole sequence with the target's features (from a fresh target forward) and,
deeper in the cycle, its own predicted features for the tokens drafted so far. Any entry fed twice, missed, fed
with the wrong feature or at the wrong position changes q.
"""

from __future__ import annotations

import pytest
import torch

from harness.engine import Engine
from harness.models import feature_draft
from harness.models.feature_draft import HiddenTap
from harness.sampling import SamplingParams, warp
from harness.sampling.rejection import get_sampler
from policies import FixedGamma, HFHeuristic
from tests.test_engine import RaggedStop, SkipEveryOther
from tests.tiny_models import random_requests, tiny_llama

VOCAB = 64


@pytest.fixture(scope="module")
def feature_pair():
    """A tiny random target and a 1-layer feature draft over 48 of its 64 ids (q = 0 on the rest)."""
    target = tiny_llama(vocab=VOCAB, hidden=32, layers=2, seed=1, init=0.1)
    torch.manual_seed(7)
    return target, feature_draft.build(target, 1, torch.arange(48)).to(torch.float64).eval()


def reference_laws(target, draft, sequence: list[int], drafts: list[int], sampling: SamplingParams
                   ) -> list[torch.Tensor]:
    """The laws q of drafts 1..k after ``sequence`` (its last token not yet seen by the target), from scratch: the
    entries (x_j, f_{j-1}) with the target's features, then each drafted token with the draft's predicted feature."""
    tap = HiddenTap.on(target)
    with torch.no_grad():
        target(torch.tensor([sequence]))
        ids, feats = torch.tensor([sequence[1:]]), tap.last[:, :-1]
        laws = []
        for token in drafts:
            hidden = draft.model(inputs_embeds=draft.entries(ids, feats)).last_hidden_state[:, -1:]
            laws.append(warp(draft.lm_head(hidden)[0, 0, :VOCAB], sampling))
            ids, feats = torch.cat([ids, torch.tensor([[token]])], 1), torch.cat([feats, hidden], 1)
    return laws


class GammaPattern(FixedGamma):
    """γ by cycle from a fixed pattern (0: a plain target step): deep, shallow and skipped cycles mixed."""

    def __init__(self, pattern: list[int]) -> None:
        super().__init__(max(pattern))
        self.pattern, self.calls = pattern, 0

    def begin_cycle(self, batch_size):
        self.calls += 1
        return self.pattern[self.calls % len(self.pattern)]


@pytest.mark.parametrize(("policy", "concurrency"), [
    (GammaPattern([3, 0, 1, 4, 0, 0, 2]), 1),
    (GammaPattern([3, 0, 1, 4, 0, 0, 2]), 3),
    (RaggedStop(4), 3),
], ids=["pattern-c1", "pattern-c3", "ragged-stop-c3"])
def test_engine_feeds_the_draft_the_entries_it_was_trained_on(feature_pair, policy, concurrency):
    """Every q the engine sampled from (T = 1, 5 requests × 14 tokens, seed 3) equals the from-scratch q, to 1e-6
    (float64 models, float32 laws): after accepted, rejected and skipped cycles, ragged rows and mid-run admissions."""
    target, draft = feature_pair
    sampling = SamplingParams(temperature=1.0)
    engine = Engine(target, draft, sampling=sampling, sampler=get_sampler("exact"), device="cpu", seed=3)
    requests = random_requests(5, max_new=14, seed=2)
    session = engine.session(requests, policy, concurrency, keep_laws=True)
    outcomes = []
    while not session.done:
        outcome = session.step()
        if outcome is not None:
            outcomes.append(outcome)
    outputs = {r.request_id: r.output_ids for r in session.result().requests}
    prompts = {r.request_id: r.input_ids for r in requests}
    checked, accepted = 0, 0
    for out in outcomes:
        if out.proposal is None:
            continue
        for row in out.rows:
            rid = out.request_ids[row]
            sequence = prompts[rid] + outputs[rid][: out.output_position[row]]
            depth = out.num_drafts[row]
            drafts = out.proposal.tokens[row, :depth].tolist()
            for k, law in enumerate(reference_laws(target, draft, sequence, drafts, sampling)):
                assert torch.allclose(out.proposal.probs[row, k], law, atol=1e-6), (out.cycle, row, k)
                checked += 1
            accepted += out.accepted[row]
    assert checked > 40 and accepted > 0, (checked, accepted)


def test_greedy_speculation_with_a_feature_draft_equals_autoregressive(feature_pair):
    target, draft = feature_pair
    greedy = SamplingParams(temperature=0)
    requests = random_requests(6, max_new=16)
    engine = Engine(target, draft, sampling=greedy, sampler=get_sampler("exact"), device="cpu", seed=0)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    for policy, concurrency in ((FixedGamma(1), 1), (FixedGamma(4), 3), (HFHeuristic(gamma=3, max_gamma=8), 2),
                                (SkipEveryOther(3), 2)):
        result = engine.run(requests, policy, concurrency)
        assert {r.request_id: r.output_ids for r in result.requests} == reference, (policy, concurrency)


def test_feature_draft_saves_and_loads_without_the_targets_embedding(feature_pair, tmp_path):
    target, draft = feature_pair
    draft.save(tmp_path / "d")
    assert feature_draft.is_feature_draft(tmp_path / "d")
    again = feature_draft.load(tmp_path / "d", torch.float64).attach(target)
    assert not any(name.startswith("embed") for name, _ in again.named_parameters())
    x, f = torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 32, dtype=torch.float64)
    assert torch.equal(again(x, f).logits, draft(x, f).logits)
