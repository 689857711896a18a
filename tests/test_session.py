"""The steppable session: γ = 0 cycles, phase-by-phase driving, and common random numbers (keyed uniforms)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectune.engine import Engine
from spectune.engine.policy import DraftLengthPolicy, FixedGamma
from spectune.engine.randomness import KeyedUniforms, request_uniforms
from spectune.sampling import SamplingParams, inverse_cdf
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests

GREEDY = SamplingParams(temperature=0)
SAMPLED = SamplingParams(temperature=1.0)


class Alternating(DraftLengthPolicy):
    """γ cycles through ``schedule`` (0 = don't speculate this cycle: a plain target step)."""

    def __init__(self, schedule: tuple[int, ...]) -> None:
        self.schedule, self.calls = schedule, 0

    def begin_cycle(self, batch_size: int) -> int:
        self.calls += 1
        return self.schedule[(self.calls - 1) % len(self.schedule)]

    def reset(self) -> None:
        self.calls = 0


@pytest.mark.parametrize("concurrency", [1, 3])
def test_cycles_without_speculation_keep_greedy_output(pair, concurrency):
    """Runs of γ = 0 cycles (one, then two in a row) leave the draft pending tokens it catches up on."""
    target, draft = pair
    requests = random_requests(5, max_new=18)
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, None, 1).requests}
    result = engine.run(requests, Alternating((0, 3, 0, 0, 2)), concurrency)
    assert {r.request_id: r.output_ids for r in result.requests} == reference
    gammas = {c.gamma for c in result.cycles}
    assert gammas == {0, 2, 3}
    assert all(c.num_drafts == 0 and c.emitted == 1 for c in result.cycles if c.gamma == 0)
    assert any(c.accepted > 0 for c in result.cycles), "the draft must be usable after catching up"


def test_session_driven_by_hand_equals_run(pair):
    """begin_cycle / draft_step / verify, as an environment drives them, give what Engine.run gives."""
    target, draft = pair
    requests = random_requests(4, max_new=12)
    engine = Engine(target, draft, sampling=SAMPLED, sampler=get_sampler("exact"), device="cpu", seed=7)
    reference = {r.request_id: r.output_ids for r in engine.run(requests, FixedGamma(3), 2).requests}
    session = engine.session(requests, None, 2)
    while not session.done:
        if session.begin_cycle():
            for _ in range(3):
                session.draft_step()
            session.verify()
    assert {r.request_id: r.output_ids for r in session.result().requests} == reference


@pytest.mark.parametrize("concurrency", [1, 4])
def test_outcome_at_gamma_k_does_not_depend_on_the_gamma_chosen(pair, concurrency):
    """Sampled (T = 1), seed 11, 6 requests: in the first cycle of every request the accepted count at γ = k
    equals min(k, accepted at γ = 8) for every k (common random numbers; exact equality, no tolerance)."""
    target, draft = pair
    requests = random_requests(6, max_new=10)  # only first cycles are compared: short requests suffice
    engine = Engine(target, draft, sampling=SAMPLED, sampler=get_sampler("exact"), device="cpu", seed=11)

    def first_cycles(gamma: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for c in engine.run(requests, FixedGamma(gamma), concurrency).cycles:
            out.setdefault(c.request_id, c.accepted)
        return out

    deep = first_cycles(8)
    assert len(set(deep.values())) > 1, "the pair should accept different lengths, or this test shows nothing"
    for k in (1, 2, 3, 5):
        assert first_cycles(k) == {rid: min(k, n) for rid, n in deep.items()}, k


def test_keyed_uniforms_depend_on_the_key_only():
    """The same (seed, stream, request) gives the same numbers in any slot; other keys give others."""
    keys = KeyedUniforms(seed=5, batch=3, device=torch.device("cpu"))
    keys.load(2, request_id=41, length=6)
    keys.load(0, request_id=7, length=9)  # a longer request widens the tables
    assert np.array_equal(keys.tables["accept"][2, :6].numpy(), request_uniforms(5, "accept", 41, 6))
    assert not np.array_equal(request_uniforms(5, "accept", 41, 6), request_uniforms(5, "draft", 41, 6))
    assert not np.array_equal(request_uniforms(5, "accept", 41, 6), request_uniforms(6, "accept", 41, 6))
    got = keys.at("accept", torch.tensor([0, 0, 3]), count=4)
    assert np.array_equal(got[2, :3].numpy(), request_uniforms(5, "accept", 41, 6)[3:])  # positions 6+ never emitted


def test_inverse_cdf_draw_law_and_zero_entries():
    """n = 40000 stratified uniforms through one law with zeros: zeros never drawn, |freq − p| ≤ 1/n + 1e-12."""
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2])
    n = 40000
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    draws = inverse_cdf(probs.expand(n, -1), u).numpy()
    freq = np.bincount(draws, minlength=5) / n
    assert freq[0] == freq[2] == 0
    assert np.abs(freq - probs.numpy()).max() <= 1 / n + 1e-12


class Recording(FixedGamma):
    """A fixed γ that keeps every CycleFeedback it is given."""

    def __init__(self, gamma: int) -> None:
        super().__init__(gamma)
        self.feedback = []

    def observe(self, feedback) -> None:
        self.feedback.append(feedback)


def test_cycle_feedback_names_each_rows_slot_and_request(pair):
    """Policies learning per row get the slot and request of every listed row, matching the cycle records."""
    target, draft = pair
    engine = Engine(target, draft, sampling=SAMPLED, sampler=get_sampler("exact"), device="cpu", seed=3)
    policy = Recording(2)
    result = engine.run(random_requests(5, max_new=10), policy, 3)
    by_cycle: dict[int, dict[int, int]] = {}
    for record in result.cycles:
        by_cycle.setdefault(record.cycle, {})[record.slot] = record.request_id
    assert len(policy.feedback) == len(by_cycle)
    for feedback, (_, slots) in zip(policy.feedback, sorted(by_cycle.items()), strict=True):
        assert feedback.rows == sorted(slots) and len(feedback.rows) == len(feedback.num_drafts)
        assert feedback.request_ids == [slots[row] for row in feedback.rows]


class StopBusyRows(DraftLengthPolicy):
    """Stops every busy row after its first draft and tells every free slot (context 0) to continue."""

    def begin_cycle(self, batch_size: int) -> int:
        return 4

    def continue_drafting(self, step):
        return step.context_length == 0


def test_free_slots_do_not_keep_a_cycle_drafting(pair):
    """One request in three slots: the busy row stops after one draft, so every cycle drafts one step, whatever the
    policy said for the two free slots; and its output equals γ = 1's (greedy)."""
    target, draft = pair
    requests = random_requests(1, max_new=12)
    engine = Engine(target, draft, sampling=GREEDY, sampler=get_sampler("exact"), device="cpu", seed=0)
    session = engine.session(requests, StopBusyRows(), 3)
    steps = []
    while not session.done:
        outcome = session.step()
        if outcome is not None and outcome.rows:
            steps.append(len(outcome.draft_step_s))
    assert steps and set(steps) == {1}
    reference = engine.run(requests, FixedGamma(1), 3).requests[0].output_ids
    assert session.result().requests[0].output_ids == reference
