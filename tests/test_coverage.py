"""Do the intervals keep their promise? Simulated runs with a known truth (spectune.stats.simulate): prompts of
unequal length and difficulty, a speedup that varies by prompt, near-identical repeats, AR(1) drift, episodes
that shift the machine for 20 requests, and a process shift; methods interleaved prompt by prompt.

Each case: 3,000 simulated runs (seeded), so a 95% coverage has a binomial SD of 0.4 points. The units' part of
the product's interval (prompt as the unit, jackknife t with Kish df) must cover the truth in 93–97% of them;
the whole interval, which adds the method × repeat component, in 93–98% (that component, estimated from
two or three repeats and never negative, makes it slightly conservative where no such shift exists) and in at
least 90% where one-label-per-repeat shifts of 3–5% exist (below the nominal 95%: a component estimated with
two degrees of freedom and truncated at zero), which the units alone cover in under half of the runs. The old
unit, every (repeat, prompt) cell counted as independent, is computed on the same runs and reported beside it.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from spectune.stats.intervals import Interval, mde, paired_ratio_interval, verdict
from spectune.stats.simulate import Scenario, coverage, simulate

log = logging.getLogger(__name__)
RUNS = 3000


@pytest.mark.parametrize("prompts", [8, 16, 36])
@pytest.mark.parametrize(("speedup", "interaction_sd"), [(1.0, 0.0), (1.05, 0.05), (1.3, 0.10)],
                         ids=["A/A", "+5%", "+30%"])
def test_prompt_unit_interval_covers_the_truth_93_to_97_percent(prompts, speedup, interaction_sd):
    runs = simulate(Scenario(prompts=prompts, speedup=speedup, interaction_sd=interaction_sd), RUNS,
                    seed=20261204 + prompts)
    covered, width = coverage(runs, "prompt-sums")
    whole, whole_width = coverage(runs, "prompt")
    old, old_width = coverage(runs, "repeat-prompt")
    log.info("n=%d speedup %.2f: prompt unit %.3f (median width %.4f), with the repeat component %.3f (%.4f); "
             "(repeat, prompt) unit %.3f (%.4f)", prompts, speedup, covered, width, whole, whole_width, old, old_width)
    assert 0.93 <= covered <= 0.97, (covered, old)
    assert 0.93 <= whole <= 0.98, whole


@pytest.mark.parametrize("shift", [0.03, 0.05])
@pytest.mark.parametrize("prompts", [8, 36])
def test_a_method_by_repeat_shift_is_covered_by_the_repeat_component(prompts, shift):
    # one label faster or slower by SD `shift` for a whole repeat (3 repeats): every prompt of the repeat shares it
    scenario = Scenario(prompts=prompts, repeats=3, method_repeat_sd=shift)
    runs = simulate(scenario, RUNS, seed=int(1000 * shift) + prompts)
    assert coverage(runs, "prompt-sums")[0] < 0.5
    assert coverage(runs, "prompt")[0] >= 0.90


def test_the_old_unit_under_covers_a_real_effect_on_the_same_runs():
    # 16 prompts, +5% varying by prompt (SD 5%), identical repeats: three repeats are not three times the evidence
    runs = simulate(Scenario(prompts=16, speedup=1.05, interaction_sd=0.05), RUNS, seed=7)
    new, new_width = coverage(runs, "prompt-sums")
    old, old_width = coverage(runs, "repeat-prompt")
    assert old < 0.85 < 0.93 <= new, (old, new)
    assert old_width < 0.7 * new_width


def test_a_blocked_design_on_a_drifting_machine_defeats_prompt_resampling():
    # the same machine, each method running all prompts at once: drift lands on whole methods, and no
    # resampling of prompts can see it; this is why interleaving is the default
    runs = simulate(Scenario(prompts=16, design="blocked"), RUNS, seed=11)
    assert coverage(runs, "prompt-sums")[0] < 0.6
    interleaved = simulate(Scenario(prompts=16, design="interleaved"), RUNS, seed=11)
    assert coverage(interleaved, "prompt-sums")[0] >= 0.93


def test_a_method_by_process_shift_is_invisible_inside_one_process():
    # a method 3% faster in this process than in another (SD): no interval from one process can cover it,
    # which is what task=coverage measures across fresh processes
    runs = simulate(Scenario(prompts=36, method_process_sd=0.03), RUNS, seed=13)
    assert coverage(runs, "prompt")[0] < 0.8


def test_mde_and_verdicts_read_the_interval_as_documented():
    # n = 16 equal units, B exactly 10% faster on every unit but with ±2% alternating noise: the CI excludes 1
    tokens = np.full(16, 100.0)
    a = np.full(16, 1.0)
    b = a / 1.10 * np.where(np.arange(16) % 2, 1.02, 0.98)
    iv = paired_ratio_interval(tokens, b, tokens, a)
    assert iv.lo > 1.0 and verdict(iv, 0.02) == "faster"
    assert verdict(paired_ratio_interval(tokens, a, tokens, b), 0.02) == "slower"
    # the MDE at 80% power is (t_.975 + t_.80)·se on the log scale, with Kish df = 16 - 1 for (near) equal units
    from scipy import stats
    assert iv.df == pytest.approx(15, abs=0.01)  # the weights (seconds of both) are equal to ±2%
    assert mde(iv) == pytest.approx(np.exp((stats.t.ppf(0.975, iv.df) + stats.t.ppf(0.8, iv.df)) * iv.se) - 1)
    # a tight interval around 1 is equivalent within 2%; a wide one is not resolved and says its MDE
    tight = Interval(1.0, 0.995, 1.006, 16, "t", 0.0025, 15, "log")
    wide = Interval(1.01, 0.97, 1.05, 16, "t", 0.019, 15, "log")
    assert verdict(tight, 0.02) == "equivalent (±2%)"
    assert verdict(wide, 0.02) == f"not resolved (MDE {100 * mde(wide):.1f}%)"
    assert verdict(Interval(0.0, -1.0, 2.0, 8, "t", 0.7, 7, "linear"), 0.0, null=0.0) == "not resolved"


def test_the_planner_asks_for_the_units_whose_mde_meets_the_target():
    from scipy import stats

    from spectune.stats.units import units_needed

    # a pilot of 8 units with SD 10% per unit: its 80% upper limit is 10%·sqrt(7 / chi2.ppf(0.2, 7)); the plan is
    # the smallest n with (t_.975 + t_.80, n - 1 df)·SD_up/√n <= log(1.03), and n - 1 units would not do
    upper = 0.10 * np.sqrt(7 / stats.chi2.ppf(0.2, 7))
    n = units_needed(0.10, 8, 0.03)

    def mde_at(k: int) -> float:
        return (stats.t.ppf(0.975, k - 1) + stats.t.ppf(0.8, k - 1)) * upper / np.sqrt(k)

    assert mde_at(n) <= np.log(1.03) < mde_at(n - 1)
    assert 100 < n < 200
    assert units_needed(0.10, 8, 0.06) < n / 3  # half the effect, about a quarter of the units
    assert units_needed(0.0, 8, 0.03) == 2
