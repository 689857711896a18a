"""The model-based baseline: E(γ) from per-position acceptance, costs measured from the run's own cycles, and the
argmax of expected tokens per second — known answers on hand-built cycles, then live on the tiny pair."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.model_based import ModelBased
from policies.rows import RowLimits
from spectune.engine import Engine
from spectune.engine.policy import CycleFeedback, DraftStep, draft_cycle
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import get_sampler
from tests.tiny_models import random_requests


def _policy(gamma: int = 6, min_gamma: int = 0) -> ModelBased:
    return ModelBased(gamma=gamma, min_gamma=min_gamma, prior_strength=4.0, cost_halflife=16.0, verify_slope=0.05)


def _step0(policy: ModelBased, context: list[int]) -> torch.Tensor | None:
    batch = len(context)
    return policy.continue_drafting(DraftStep(step=0, active=torch.ones(batch, dtype=torch.bool),
                                              context_length=torch.tensor(context), batch_size=batch))


def _cycle(policy: ModelBased, drafts: list[int], accepted: list[int], step_s: float, verify_s: float,
           rest_s: float = 0.0, requests: list[int] | None = None, context: list[int] | None = None) -> None:
    """Run one cycle through the protocol: begin, show step 0, observe the outcome. ``context`` (each row's
    tokens, advanced in place by accepted + 1) keeps the rows' requests continuing; None: new each cycle."""
    batch = len(drafts)
    policy.begin_cycle(batch)
    _step0(policy, context or [10] * batch)
    if context is not None:
        context[:] = [c + a + 1 for c, a in zip(context, accepted, strict=True)]
    steps = max(drafts)
    policy.observe(CycleFeedback(drafts, accepted, steps * step_s, verify_s, steps * step_s + verify_s + rest_s,
                                 rows=list(range(batch)), request_ids=requests or list(range(batch))))


def test_cheap_drafts_that_are_always_accepted_draft_to_the_ceiling():
    policy = _policy()
    for _ in range(20):  # step 0.1 ms, verification 10 ms at 7 positions: every draft accepted
        _cycle(policy, [6], [6], step_s=1e-4, verify_s=1e-2)
    assert policy.begin_cycle(1) == 6


def test_drafts_that_are_never_accepted_stop_speculation():
    policy = _policy()
    for _ in range(40):  # step 3 ms beside a 10 ms verification, nothing accepted: γ = 0 is fastest
        _cycle(policy, [6], [0], step_s=3e-3, verify_s=1e-2)
    assert policy.begin_cycle(1) == 0


def test_each_request_gets_its_own_gamma():
    """Two requests in flight: one whose drafts are always accepted, one whose drafts never are."""
    policy = _policy(min_gamma=1)
    context = [10, 10]
    for _ in range(30):
        _cycle(policy, [6, 6], [6, 0], step_s=1e-3, verify_s=1e-2, requests=[7, 8], context=context)
    assert policy.begin_cycle(2) == 6
    keep = _step0(policy, context)
    assert policy.limits == {0: 6, 1: 1}
    assert keep is not None and keep.tolist() == [True, False]


def test_the_verification_line_is_fitted_from_measured_sizes():
    policy = _policy()
    for drafts, verify in (([1], 0.010), ([3], 0.014), ([5], 0.018)):  # 2 ms per position
        for _ in range(5):
            _cycle(policy, drafts, [0], step_s=1e-3, verify_s=verify)
    costs = policy.costs[1]
    assert np.isclose(policy.costs_at(1).t_draft, 1e-3)
    assert np.allclose(costs.verify_s(np.array([1.0, 2.0, 7.0])), [0.008, 0.010, 0.020], atol=1e-9)
    # the library's cycle: 2 draft steps, the line at 3 positions, no rest
    assert np.isclose(policy.costs_at(1).cycle_s(2), 2e-3 + 0.012)


def test_a_plain_step_is_priced_from_plain_steps_not_from_the_line_through_verifications():
    """The verification times of prompt lookup on smollm2 at T = 1 alone on a 2-vCPU CPU (the means by drafted
    tokens in held-out-en/cycles.parquet of the archived adaptive-regimes-smollm2-cpu-20261207, ms): a plain step 74,
    one drafted token 124, two 164, three to seven 112-127 — not a line. With a 0.11 acceptance rate, one draft's
    expected speed-up E(1) · cycle(0) / cycle(1) is 1.11 · 74 / 124 = 0.66 on the measured prices; the line through
    every width (what priced it before: 112 and 114 ms) puts it at 1.09, a gain, which kept a controller on."""
    policy = _policy(gamma=8)
    times = {0: 0.0741, 1: 0.1238, 2: 0.1638, 3: 0.1140, 4: 0.1171, 5: 0.1123, 6: 0.1271, 7: 0.1132}
    for _ in range(20):
        for drafts, verify in times.items():
            _cycle(policy, [drafts], [0], step_s=0.0, verify_s=verify)
    measured = policy.costs[1]
    assert measured.verify_s(np.array([1.0]))[0] == pytest.approx(0.0741, rel=1e-9)
    assert measured.verify_s(np.array([2.0]))[0] > 0.11  # the line over the drafted widths
    cycle = policy.costs_at(1).cycle_s(np.arange(2))
    assert 1.11 * cycle[0] / cycle[1] < 0.95 * 0.75
    n = np.arange(1.0, 9.0)
    slope, intercept = np.polyfit(n, list(times.values()), 1)
    old = intercept + slope * n
    assert 1.11 * old[0] / old[1] > 0.95


def test_a_measured_width_is_priced_at_its_own_mean_where_the_times_are_not_a_line():
    """Prompt lookup greedy on smollm2 alone on a 2-vCPU CPU (the controller's means by drafted tokens in the same
    committed run's cycles, ms): one and two drafted tokens cost more to verify than three to eight. Priced by what
    each width measured, no γ pays at acceptance 0.3 and one or two drafts are never best; a line through every
    width (the old pricing) drafts two at 0.3."""
    policy = _policy(gamma=8)
    times = {0: 0.0729, 1: 0.1263, 2: 0.1447, 3: 0.1119, 4: 0.1079, 5: 0.1216, 6: 0.1474, 7: 0.1144, 8: 0.1206}
    for _ in range(20):
        for drafts, verify in times.items():
            _cycle(policy, [drafts], [0], step_s=0.0, verify_s=verify)
    priced = policy.costs[1].verify_s(np.arange(1.0, 10.0))
    assert np.allclose(priced, list(times.values()), rtol=1e-9)
    n = np.arange(1.0, 10.0)
    slope, intercept = np.polyfit(n, list(times.values()), 1)
    for alpha, best_measured in ((0.3, 0), (0.5, 4), (0.7, 7)):
        expected = (1 - alpha ** (n)) / (1 - alpha)  # E(γ) for γ = 0..8
        assert int(np.argmax(expected * times[0] / priced)) == best_measured
    expected = (1 - 0.3 ** n) / 0.7
    assert int(np.argmax(expected * (intercept + slope) / (intercept + slope * n))) == 2


def test_the_policys_costs_are_the_library_cycle_and_its_old_arithmetic_bit_for_bit():
    """The model-based policy charges through :class:`spectune.costmodel.profile.CycleCosts` built from its
    measurements; its seconds per γ are, bit for bit, what its own formula gave (γ × step + the verification line at γ
    + 1 positions + the rest): folding the two definitions into one changed no decision."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        policy = ModelBased(gamma=int(rng.integers(1, 9)), min_gamma=int(rng.integers(0, 2)), prior_strength=4.0,
                            cost_halflife=float(rng.uniform(1, 64)), verify_slope=float(rng.uniform(0, 0.2)))
        for _ in range(int(rng.integers(1, 12))):
            drafts = int(rng.integers(0, policy.ceiling + 1))
            _cycle(policy, [drafts], [0], step_s=float(rng.uniform(1e-4, 5e-3)),
                   verify_s=float(rng.uniform(5e-3, 2e-2)), rest_s=float(rng.uniform(0, 2e-3)))
        batch = 1
        measured, drafted = policy.costs[batch], [b for b, c in policy.costs.items() if c.step.weight]
        step_s = policy.costs[drafted[0]].step.mean if drafted else 0.0
        gammas = np.arange(policy.min_gamma, policy.ceiling + 1, dtype=float)
        old = gammas * step_s + measured.verify_s(gammas + 1.0) + measured.rest.mean
        assert policy.seconds(policy.costs_at(batch)).tobytes() == old.tobytes()


@pytest.mark.parametrize("concurrency", [1, 3])
def test_live_runs_choose_within_the_ceiling_and_learn_costs(pair, concurrency):
    target, draft = pair
    engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    policy = _policy(gamma=5)
    result = engine.run(random_requests(4, max_new=12), policy, concurrency)
    assert all(0 <= c.num_drafts <= c.gamma <= 5 for c in result.cycles)
    assert policy.costs and any(c.step.weight > 0 for c in policy.costs.values())
    assert all(policy.costs_at(b).t_draft > 0 for b in policy.costs)  # every batch size has a draft step's cost
    assert policy.pooled[1, 1] > 0  # position 1 was tested


class _Watched(ModelBased):
    """Records each cycle's ceiling and per-slot choice, and counts per-step decisions."""

    def reset(self) -> None:
        super().reset()
        self.record: list[tuple[int, dict[int, int]]] = []
        self.refreshes: list[bool] = []
        self.decisions = 0

    def begin_cycle(self, batch_size: int) -> int:
        gamma = super().begin_cycle(batch_size)
        self.record.append((gamma, dict(self.limits)))
        self.refreshes.append(self.since == 0)
        return gamma

    def continue_drafting(self, step: DraftStep) -> torch.Tensor | None:
        keep = super().continue_drafting(step)
        self.decisions += keep is not None
        return keep


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("refresh", [1, 4])
def test_told_the_requests_every_row_is_chosen_before_drafting_and_drafts_its_own_gamma(pair, concurrency,
                                                                                          refresh):
    """Through before_cycle (the engine's path) each slot's γ is chosen in begin_cycle, new requests included; the
    batch drafts to its deepest row, every row verifies its own γ (a row that chose 0 in a drafting cycle: the one
    draft all rows take), and a per-step decision is made only at a step where some row stops (none when the rows
    chose alike). With ``refresh`` > 1 a request's γ is recomputed only every ``refresh`` cycles or when a request
    is new, from every outcome queued until then."""
    target, draft = pair
    engine = Engine(target, draft, sampling=SamplingParams(temperature=1.0), sampler=get_sampler("exact"),
                    device="cpu", seed=0)
    policy = _Watched(gamma=5, min_gamma=0, prior_strength=4.0, cost_halflife=16.0, verify_slope=0.05,
                      refresh=refresh)
    result = engine.run(random_requests(5, max_new=16), policy, concurrency)
    by_cycle: dict[int, list] = {}
    for record in result.cycles:
        by_cycle.setdefault(record.cycle, []).append(record)
    assert len(by_cycle) == len(policy.record) == len(policy.refreshes)
    stops, last = 0, {}
    for (gamma, limits), refreshed, records in zip(policy.record, policy.refreshes,
                                                   (by_cycle[c] for c in sorted(by_cycle)), strict=True):
        assert set(limits) == {r.slot for r in records}  # every row chosen before anything was drafted
        assert gamma == (max(limits.values()) if gamma else 0) and 0 <= gamma <= 5
        for record in records:
            assert record.num_drafts == (min(limits[record.slot], gamma) if gamma else 0)
            if not refreshed:  # between refreshes a request keeps its γ
                assert limits[record.slot] == last[record.request_id]
            last[record.request_id] = limits[record.slot]
        stops += len({limits[r.slot] for r in records if limits[r.slot] < gamma})  # a step where rows stop
    assert policy.decisions == stops
    assert {gamma for gamma, _ in policy.record} != {5}  # it did choose: not the ceiling throughout
    assert all(policy.refreshes) == (refresh == 1)
    assert len(policy.pending) <= refresh  # at most the cycles since the last refresh are queued


def test_a_decision_is_made_only_at_steps_where_some_row_stops():
    """Rows at γ 1, 3 and 5 in a cycle drafting 5 (the drafting loop asks after steps 0..3, never after the last):
    decisions at steps 0 and 2 only. A row that stopped earlier stays stopped without one (a decision at every step
    after the first stop was a host sync per step for nothing)."""
    policy = _policy(gamma=5)
    policy.before_cycle([0, 1, 2], [7, 8, 9])
    policy.begin_cycle(3)
    policy.limits, policy.first_stop = {0: 1, 1: 3, 2: 5}, 1
    decided = []
    for s in range(4):
        keep = policy.continue_drafting(DraftStep(step=s, active=torch.ones(3, dtype=torch.bool),
                                                  context_length=torch.tensor([10, 10, 10]), batch_size=3))
        if keep is not None:
            decided.append((s, keep.tolist()))
    assert decided == [(0, [False, True, True]), (2, [False, False, True])]



class CountingDrafter:
    """A drafter of ``rows`` rows that counts its draft steps and records the cut (the Drafter protocol)."""

    def __init__(self, rows: int) -> None:
        self.active, self.steps, self.kept = torch.ones(rows, dtype=torch.bool), 0, None

    def draft(self, signals: frozenset[str]) -> DraftStep:
        self.steps += 1
        return DraftStep(step=self.steps - 1, active=self.active.clone(), context_length=torch.full_like(
            self.active, 10, dtype=torch.long), batch_size=len(self.active))

    def stop(self, keep: torch.Tensor) -> bool:
        self.active &= keep
        return bool(self.active.any())

    def cut(self, kept: list[int]) -> None:
        self.kept = kept


class DecidesAtFirstStep(RowLimits):
    """Drafts to the ceiling until its first step, then sets each row's γ there (as the controller does at a
    model-free draft's match)."""

    name = "decides-at-first-step"

    def __init__(self, ceiling: int, late: dict[int, int]) -> None:
        self.late = late
        self.set_limits(dict.fromkeys(late, ceiling))

    def continue_drafting(self, step: DraftStep) -> torch.Tensor | None:
        if step.step == 0:
            self.set_limits(self.late)
        return super().continue_drafting(step)


@pytest.mark.parametrize(("late", "steps", "kept"), [({0: 0, 1: 0}, 1, [0, 0]), ({0: 0, 1: 3}, 3, [0, 3]),
                                                     ({0: 2, 1: 5}, 5, None)])
def test_rows_set_off_at_the_first_step_stop_drafting_there(late, steps, kept):
    """Every row set to γ 0 after the first step: drafting ends at that step, not at the ceiling (8) only to be cut
    to nothing; where some row still drafts, the batch drafts to the deepest γ and each row is cut to its own."""
    policy, drafter = DecidesAtFirstStep(8, late), CountingDrafter(2)
    draft_cycle(policy, policy.begin_cycle(2), drafter)
    assert drafter.steps == steps and drafter.kept == kept
