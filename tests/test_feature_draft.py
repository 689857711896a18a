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

from policies.heuristic import HFHeuristic
from spectune.engine import Engine
from spectune.engine.features import HiddenTap
from spectune.engine.policy import FixedGamma
from spectune.models import feature_draft
from spectune.sampling import SamplingParams, warp
from spectune.sampling.rejection import get_sampler
from tests.test_engine import RaggedStop, SkipEveryOther
from tests.tiny_models import random_requests

VOCAB = 64


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
            gamma = out.num_drafts[row]
            drafts = out.proposal.tokens[row, :gamma].tolist()
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
    assert not any(name.startswith("embed.") for name, _ in again.named_parameters())  # the target's, not stored
    x, f = torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 32, dtype=torch.float64)
    assert torch.equal(again(x, f).logits, draft(x, f).logits)


def test_a_grown_draft_starts_as_the_draft_it_grew_from_and_can_learn(feature_pair, tmp_path):
    """``grow`` adds layers on top whose output projections are zero: the grown draft's logits equal the original's
    exactly (a fine-tune starts where the shipped draft is), the new layers still get gradients through those
    projections, and it saves and loads with its new γ."""
    target, draft = feature_pair
    grown = feature_draft.grow(draft, 3)
    assert grown.config.num_hidden_layers == 3 and draft.config.num_hidden_layers == 1
    x, f = torch.tensor([[1, 2, 3, 4]]), torch.randn(1, 4, 32, dtype=torch.float64)
    assert torch.equal(grown(x, f).logits, draft(x, f).logits)
    grown.train()
    grown(x, f).logits[..., :48].logsumexp(-1).sum().backward()
    assert grown.model.layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert grown.model.layers[2].mlp.down_proj.weight.grad.abs().sum() > 0
    grown.save(tmp_path / "g")
    again = feature_draft.load(tmp_path / "g", torch.float64).attach(target)
    assert again.config.num_hidden_layers == 3 and torch.equal(again(x, f).logits, grown(x, f).logits)
    with pytest.raises(ValueError, match="layers=0 is invalid"):
        feature_draft.grow(draft, 0)


def test_unrolled_steps_are_what_a_cycle_computes(feature_pair):
    """``unrolled`` (the training-time test) gives, at every entry and step 1..3, the feature a cycle begun
    k − 1 entries earlier predicts: checked against the from-scratch chain at several entries of two padded rows."""
    target, draft = feature_pair
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (12, 9)]
    tap = HiddenTap.on(target)
    width = max(map(len, seqs)) - 1
    ids = torch.zeros(2, width, dtype=torch.long)
    feats = torch.zeros(2, width, 32, dtype=torch.float64)
    mask = torch.zeros(2, width, dtype=torch.long)
    with torch.no_grad():
        for r, seq in enumerate(seqs):
            target(torch.tensor([seq]))
            ids[r, : len(seq) - 1], feats[r, : len(seq) - 1] = torch.tensor(seq[1:]), tap.last[0, :-1]
            mask[r, : len(seq) - 1] = 1
        steps = feature_draft.unrolled(draft, ids, feats, mask, 3)
        sampling = SamplingParams(temperature=1.0)
        for r, seq in enumerate(seqs):
            for k in (1, 2, 3):
                for col in range(k - 1, len(seq) - 2):
                    # column col is entry col+1; at step k its cycle began at entry col+2-k (``last``), and the
                    # k − 1 tokens drafted before it are the true ones
                    start = col + 3 - k
                    law = reference_laws(target, draft, seq[:start], seq[start: col + 3], sampling)[-1]
                    mine = warp(draft.lm_head(steps[k - 1][r, col])[:VOCAB], sampling)
                    assert torch.allclose(mine, law, atol=1e-6), (r, k, col)


def test_audit_laws_of_a_feature_draft_continue_the_prompt(feature_pair):
    """The models audit's q(· | prompt, t) for a feature draft (cached prompt, one entry per t) equals its next-token
    law over prompt + t computed afresh (to 1e-9), and rows sum to 1."""
    from types import SimpleNamespace

    import numpy as np

    from spectune.audit.real_pair import draft_continuation_laws, draft_next_law

    target, draft = feature_pair
    pair, sampling, prompt = SimpleNamespace(target=target, draft=draft, vocab_size=60), SamplingParams(1.0), \
        [5, 9, 2, 33, 7]
    law = draft_next_law(pair, prompt, sampling)
    assert law.shape == (60,) and abs(law.sum() - 1) < 1e-12
    firsts = [3, 17, 40]
    rows = draft_continuation_laws(pair, prompt, firsts, sampling)
    fresh = np.stack([draft_next_law(pair, [*prompt, t], sampling) for t in firsts])
    assert rows.shape == fresh.shape == (3, 60) and np.abs(rows - fresh).max() < 1e-9

