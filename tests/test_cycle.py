"""A cycle's cost and its expected tokens are each defined once (:mod:`spectune.costmodel.cycle`): the closed form is
the per-position form at a constant rate, the joint form sums left to right as the cost model always did, and the
three implementations of the cycle's cost (a profile's seconds, the model-based policy's measured seconds, the
cost model's target steps) are one sum, equal to each other where they describe the same costs."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from analysis.costmodel.fit import predict
from analysis.costmodel.model import StepCosts, speedup, sweep
from spectune.costmodel.cycle import CycleCost, expected_tokens, expected_tokens_constant, expected_tokens_from_rates
from spectune.costmodel.profile import CycleCosts, Profile

ALPHAS = (0.0, 0.05, 0.3, 0.5, 0.7, 0.9, 0.99, 1 - 1e-6, 1.0)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_closed_form_is_the_per_position_form_at_a_constant_rate(alpha):
    gammas = np.arange(17)
    general = expected_tokens_from_rates(np.full(16, alpha))
    closed = [expected_tokens_constant(alpha, int(g)) for g in gammas]
    assert np.allclose(general, closed, rtol=1e-12, atol=0)
    assert general[0] == closed[0] == 1.0


def test_per_position_rates_are_the_joint_form_of_their_running_product():
    rates = np.random.default_rng(0).uniform(0, 1, 12)
    assert expected_tokens_from_rates(rates).tobytes() == expected_tokens(np.cumprod(rates)).tobytes()


def test_the_joint_form_sums_left_to_right_so_a_prefix_gives_the_same_bits():
    """E(γ) of a joint is its γ-prefix's E, bit for bit: the cost model reads E(γ) off one cumulative sum where it
    summed each prefix before. On Python 3.11 that sum (``sum``, left to right) is the same bits too; from 3.12
    ``sum`` compensates, so the old spelling is compared there only up to rounding."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        joint = list(np.minimum.accumulate(rng.uniform(0, 1, int(rng.integers(1, 20)))))
        whole = expected_tokens(joint)
        for gamma in range(len(joint) + 1):
            running = 0.0
            for value in joint[:gamma]:
                running += value
            assert whole[gamma] == 1.0 + running == expected_tokens(joint[:gamma])[-1]
            old = 1.0 + float(sum(joint[:gamma]))
            if sys.version_info < (3, 12):
                assert whole[gamma] == old
            else:
                assert whole[gamma] == pytest.approx(old, rel=1e-15)


def test_a_cycle_is_draft_plus_verification_plus_overhead_in_that_order():
    class Costs(CycleCost):
        overhead = 0.25

        def draft(self, drafted):
            return 0.1 * drafted

        def verify(self, drafts):
            return 1.0 + 0.01 * drafts

    costs = Costs()
    assert costs.cycle(3) == 0.1 * 3 + (1.0 + 0.01 * 3) + 0.25
    assert costs.cycle(3, 1) == 0.1 * 3 + (1.0 + 0.01 * 1) + 0.25  # a budget verifies fewer than were drafted
    assert costs.ar == 1.0 + 0.25


def _profile(first: bool) -> Profile:
    rng = np.random.default_rng(2)
    verify = {b: sorted(rng.uniform(0.005, 0.03, 6).tolist()) for b in (1, 4)}
    return Profile("random", [1, 4], 6, {1: 0.0013, 4: 0.0021}, verify, {1: 0.0007, 4: 0.0011},
                   t_first_draft_s={1: 0.0019, 4: 0.0026} if first else None)


@pytest.mark.parametrize("first", [False, True])
def test_a_profiles_cycle_is_its_terms_summed_and_the_ar_step_its_plain_target_step(first):
    costs = _profile(first).costs(2)
    for drafted in range(6):
        old = drafted * costs.t_draft + (costs.first_draft - costs.t_draft) * (drafted > 0)
        assert costs.cycle_s(drafted) == old + costs.t_verify[drafted] + costs.overhead
        assert costs.cycle_s(5, drafted) == costs.draft_s(5) + costs.t_verify[drafted] + costs.overhead
    assert costs.ar_s == costs.t_verify[0] + costs.overhead == costs.cycle_s(0)
    gammas = np.arange(6)
    assert costs.cycle_s(gammas).tolist() == [costs.cycle_s(int(d)) for d in gammas]


@pytest.mark.parametrize("first", [False, True])
def test_the_cost_models_target_steps_are_a_profiles_seconds_over_one_target_step(first):
    """The same costs in the cost model's units (:class:`StepCosts`) and in seconds scaled by the AR step agree;
    their draft terms are spelled c₁ + c(γ − 1) and γc + (c₁ − c), equal up to rounding (a few ulp)."""
    profile = _profile(first)
    for batch in (1, 2, 4):
        seconds = profile.costs(batch)
        unit = seconds.t_verify[0]
        scaled = CycleCosts(seconds.c, seconds.t_verify / unit, seconds.overhead / unit, seconds.c_first)
        steps = StepCosts(profile.c(batch), lambda drafts, b=batch: profile.g(drafts, b), profile.o(batch),
                          profile.c_first(batch))
        for gamma in range(1, 6):
            assert steps.verify(gamma) == scaled.verify(gamma)
            assert steps.cycle(gamma) == pytest.approx(scaled.cycle_s(gamma), rel=4 * np.finfo(float).eps)
            assert steps.cycle(gamma) == pytest.approx(seconds.cycle_s(gamma) / unit, rel=8 * np.finfo(float).eps)
        assert steps.ar == 1.0 + profile.o(batch) and steps.draft(0) == 0.0


def test_the_cost_models_tables_keep_their_arithmetic():
    """sweep's and speedup's cost is c·γ + g(γ) + overhead, predict's c₁ + c(γ − 1) + g(γ) + o with S = E(1 + o)
    / cost, the seed S = E(α) / (cγ + 1): each spelled as before, bit for bit, through the one cycle."""
    grid = sweep([0.7], [0.05, 0.137], range(1, 9), g=[1.01 + 0.013 * i for i in range(8)], overhead=0.031,
                 joint=[0.83, 0.71, 0.6, 0.52, 0.433])
    for row in grid.itertuples():
        assert row.cost == row.c * row.gamma + row.g + row.overhead
        assert row.E / row.cost == row.S
    assert speedup(2.9, 6, 0.05, 3.0, 0.1) == 2.9 / (0.05 * 6 + 3.0 + 0.1)
    profile = _profile(True)
    table = predict([0.8, 0.6, 0.45, 0.3, 0.2], profile, range(1, 6), 4)
    c, c1, o = profile.c(4), profile.c_first(4), profile.o(4)
    for row in table.itertuples():
        assert row.draft == c1 + c * (row.gamma - 1)
        assert row.cost == row.draft + profile.g(row.gamma, 4) + o
        assert row.predicted_speedup == row.E * (1 + o) / row.cost
        assert row.seed_speedup == row.E_constant_alpha / (c * row.gamma + 1.0)
        assert row.E_constant_alpha == expected_tokens_constant(0.8, row.gamma)
    assert not math.isnan(table["predicted_speedup"].sum())
