"""A batch whose rows sample with different settings (greedy, T = 1, T = 0.7 with top-k and top-p): every row keeps
its own law, the exact sampler stays exact row by row, the wrong samplers are caught on the rows that sample, and a
policy that reads each row's settings can switch speculation off for some rows and back on."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from spectune.engine import Engine, Request
from spectune.engine.policy import DraftLengthPolicy, DraftStep, FixedGamma
from spectune.sampling import SamplingParams, warp
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests, tiny_llama

GREEDY = SamplingParams(temperature=0)
HOT = SamplingParams(temperature=1.0)
WARM = SamplingParams(temperature=0.7, top_k=3, top_p=0.9)
SETTINGS = (GREEDY, HOT, WARM)


def _outputs(engine: Engine, requests: list[Request], policy, concurrency: int) -> dict[int, list[int]]:
    return {r.request_id: r.output_ids for r in engine.run(requests, policy, concurrency).requests}


def test_each_row_of_a_mixed_batch_emits_what_it_emits_among_rows_of_its_own_settings(pair):
    """9 requests, settings greedy / T = 1 / T = 0.7 top-k 3 top-p 0.9 in turn, 16 new tokens, γ = 3, seed 7. In a
    mixed batch (3 and 9 rows) each request's tokens are those it gets in a batch where every row shares its
    settings (the one-law path), token for token: its laws, its keyed draws and so its tokens are its own. The greedy
    ones also equal autoregressive greedy decoding. The records carry each request's settings."""
    target, draft = pair
    base = random_requests(9, max_new=16)
    mixed = [replace(r, sampling=SETTINGS[i % 3]) for i, r in enumerate(base)]
    engine = Engine(target, draft, sampling=HOT, sampler=get_sampler("exact"), device="cpu", seed=7)
    alone = {}
    for settings in SETTINGS:  # each setting on its own: the engine's law for all (no per-row settings)
        engine.sampling = settings
        own = [r for r in base if mixed[r.request_id].sampling == settings]
        alone.update(_outputs(engine, own, FixedGamma(3), 3))
        if settings.greedy:
            assert _outputs(engine, own, None, 1) == {r.request_id: alone[r.request_id] for r in own}
    engine.sampling = HOT
    for concurrency in (3, 9):
        result = engine.run(mixed, FixedGamma(3), concurrency)
        assert {r.request_id: r.output_ids for r in result.requests} == alone, concurrency
        assert len({len(ids) for ids in alone.values()}) == 1 and len(alone[0]) == 16
        recorded = {r.request_id: (r.temperature, r.top_k, r.top_p) for r in result.requests}
        assert recorded == {r.request_id: (r.sampling.temperature, r.sampling.top_k, r.sampling.top_p) for r in mixed}
    assert any(c.accepted > 0 for c in result.cycles)


def _prefix_law(target, prompt: list[int], length: int, sampling: SamplingParams) -> dict[tuple, float]:
    """Law of the first ``length`` generated tokens at ``sampling``, by enumeration through the target alone."""
    law = {}
    for seq in itertools.product(range(target.config.vocab_size), repeat=length):
        prob, ids = 1.0, list(prompt)
        for token in seq:
            prob *= float(warp(target(torch.tensor([ids])).logits[0, -1], sampling)[token])
            ids.append(token)
        law[seq] = prob
    return law


@pytest.mark.slow(reason="three engine runs of 6,000 requests each (a law test per setting and per sampler)")
@torch.inference_mode()
@pytest.mark.parametrize("sampler", ["exact", "naive", "argmax-match"])
def test_each_rows_law_in_a_mixed_batch_is_its_targets_and_the_wrong_samplers_fail_on_the_sampled_rows(sampler):
    """One run of 6,000 requests of one prompt at concurrency 300, γ = 2, seed 20260923, settings in turn: greedy,
    T = 1, T = 0.7 with top-k 3 and top-p 0.9 (2,000 each). Per setting, the joint law of the first 3 generated
    tokens (V = 4: 64 cells) against the target's enumerated law at that setting, chi-square goodness of fit:
    p-value > 1e-3 passes. Greedy rows must all emit the target's greedy tokens under every sampler (each is right
    where p is one-hot); the exact sampler passes on both sampled settings; "resample from p" (naive) and "keep the
    draft iff it is the target's argmax" (argmax-match) fail on both (p-value < 1e-3). The pair and prompt are
    chosen so that the naive law of the second token is far from the target's: 0.13 in TV at T = 0.7 (top-k 3,
    top-p 0.9) and 0.21 at T = 1, averaged over the first token (spectune.audit.laws, float64)."""
    target = tiny_llama(vocab=4, hidden=32, layers=2, seed=3, init=0.3)
    draft = tiny_llama(vocab=4, hidden=16, layers=1, seed=4, init=0.3)
    prompt, per_setting = [3, 3, 1, 0, 2, 1], 2000
    requests = [Request(i, "p", "en", prompt, 3, sampling=SETTINGS[i % 3]) for i in range(3 * per_setting)]
    engine = Engine(target, draft, sampling=HOT, sampler=get_sampler(sampler), device="cpu", seed=20260923)
    result = engine.run(requests, FixedGamma(2), 300)
    greedy_law = _prefix_law(target, prompt, 3, GREEDY)
    greedy_path = max(greedy_law, key=greedy_law.get)
    by_setting = {s: [tuple(r.output_ids) for r in result.requests if SETTINGS[r.request_id % 3] == s]
                  for s in SETTINGS}
    assert set(by_setting[GREEDY]) == {greedy_path}
    for settings in (HOT, WARM):
        law = _prefix_law(target, prompt, 3, settings)
        counts = {cell: 0 for cell in law}
        for output in by_setting[settings]:
            counts[output] += 1
        observed = np.array([counts[c] for c in law], dtype=float)
        expected = np.array([law[c] for c in law])
        if np.any((observed > 0) & (expected == 0)):  # a sequence the law cannot emit: no fit needed
            assert sampler != "exact", settings
            continue
        keep = expected > 0
        expected = expected[keep] / expected[keep].sum() * per_setting
        pvalue = chisquare(observed[keep], expected).pvalue
        assert (pvalue > 1e-3) == (sampler == "exact"), (settings, pvalue)


class OffWhenHotAndBusy(DraftLengthPolicy):
    """The test double of a controller that reads the request: γ 0 for rows at T > 0 while ``busy`` or more rows
    are in flight, ``gamma`` otherwise. All busy rows hot: no drafting at all (begin_cycle says 0); some: the hot
    rows' drafts are cut to none (end_drafting). It records what it was shown."""

    reads_sampling = True

    def __init__(self, gamma: int, busy: int) -> None:
        self.gamma, self.busy = gamma, busy
        self.shown: list[tuple[list[int], list[SamplingParams], int | None]] = []

    def before_cycle(self, rows, request_ids, context_lengths=None, sampling=None) -> None:
        self.request_ids, self.sampling = request_ids, sampling
        self.shown.append((list(request_ids), list(sampling), None))

    def _off(self, settings: SamplingParams | None, busy_rows: int) -> bool:
        return settings is not None and not settings.greedy and busy_rows >= self.busy

    def begin_cycle(self, batch_size: int) -> int:
        return 0 if all(self._off(s, batch_size) for s in self.sampling) else self.gamma

    def end_drafting(self, step: DraftStep) -> list[int]:
        ids, sampling, _ = self.shown[-1]
        self.shown[-1] = (ids, sampling, step.busy_rows)
        return [0 if self._off(s, step.busy_rows) else self.gamma for s in step.sampling]


@torch.inference_mode()
def test_a_policy_reads_each_rows_settings_and_a_row_back_from_gamma_0_drafts_from_a_caught_up_cache(pair):
    """4 slots: a greedy request (5 new tokens), three at T = 1 (24, 24 and 9), γ = 3, seed 3. The policy switches the
    T = 1 rows off while 3 or more rows are busy: first by cutting their drafts (the greedy row drafts), then, the
    greedy one done, by not drafting at all; once one T = 1 row is done the other two speculate again. It is shown
    each busy row's own settings and the busy rows; the greedy row emits the greedy tokens; and at every draft the
    draft model's law q is the one a fresh forward of the draft over the row's whole context gives (to 1e-5): a row
    back from γ 0 has caught up on every token it did not draft."""
    target, draft = pair
    base = random_requests(4, max_new=24)
    requests = [replace(base[0], sampling=GREEDY, max_new_tokens=5), replace(base[1], sampling=HOT),
                replace(base[2], sampling=HOT), replace(base[3], sampling=HOT, max_new_tokens=9)]
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=3)
    reference = _outputs(engine, [requests[0]], None, 1)
    policy = OffWhenHotAndBusy(gamma=3, busy=3)
    session = engine.session(requests, policy, 4, keep_laws=True)
    settings = {r.request_id: r.sampling for r in requests}
    context = {r.request_id: list(r.input_ids) for r in requests}
    checked, off, back = 0, set(), set()
    while not session.done:
        outcome = session.step()
        if outcome is None:
            continue
        for row in outcome.rows:
            rid = outcome.request_ids[row]
            if outcome.num_drafts[row] == 0:
                off.add(rid)
                continue
            full = context[rid] + session.records[rid].output_ids[: outcome.output_position[row]]
            fresh = warp(draft(torch.tensor([full])).logits[0, -1], settings[rid])
            assert torch.allclose(outcome.proposal.probs[row, 0], fresh, atol=1e-5), (rid, outcome.cycle)
            checked += 1
            if rid in off:
                back.add(rid)
    records = {r.request_id: r for r in session.result().requests}
    assert records[0].output_ids == reference[0]
    for ids, shown, _ in policy.shown:
        assert shown == [settings[i] for i in ids]
    cycles = session.result().cycles
    hot_off = [c for c in cycles if c.request_id in (1, 2, 3) and c.batch_size >= 3]
    assert hot_off and all(c.num_drafts == 0 for c in hot_off)
    assert any(c.gamma == 0 for c in hot_off) and any(c.gamma == 3 for c in hot_off)  # both ways of switching off
    assert back == {1, 2} and checked > 0
    assert {busy for *_, busy in policy.shown if busy is not None} >= {2, 4}
