"""The pieces of task=verify engine=llamacpp that need no server: where two greedy outputs part and how a
divergence is classified, the T = 1 law with a remainder bin, the wrong rule's law, and the draws the chi-square
needs for its power (checked against a seeded simulation of the rule itself)."""

from __future__ import annotations

import numpy as np
import pytest

from spectune.audit.divergence import FAULT, NUMERICS, TopTwo, classify, compare, equality_by_type, first_divergence
from spectune.audit.draft_law import REMAINDER, TopLaw, draws_for_power, judge, power_at, simulated_counts
from spectune.audit.fit import FitRule

RULE = FitRule(z_max=4.5, min_pvalue=1e-3)


def test_first_divergence_finds_the_first_differing_token_or_the_shorter_end():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2  # the speculative output stopped early
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], []) is None


@pytest.mark.parametrize(("logprobs", "spec_token", "verdict"), [
    ((-0.70, -0.72), 20, NUMERICS),   # a near tie swapped: AR's runner-up
    ((-0.70, -0.79), 20, NUMERICS),   # gap 0.09 < 0.1
    ((-0.30, -1.50), 20, FAULT),      # a clear winner lost
    ((-0.70, -0.72), 99, FAULT),      # a near tie, but the token is not AR's runner-up
    ((-0.70, -0.72), None, NUMERICS),  # the speculative output ended there, the gap alone judges
    ((-0.10, -0.20), 20, FAULT),      # gap exactly at the bound is not below it
])
def test_a_divergence_is_numerics_only_for_a_swapped_near_tie(logprobs, spec_token, verdict):
    assert classify(TopTwo((10, 20), logprobs), spec_token, bound=0.1) == verdict


def test_the_bound_must_be_positive():
    with pytest.raises(ValueError, match="bound"):
        classify(TopTwo((1, 2), (-0.1, -0.2)), 2, bound=0.0)


def test_compare_queries_ar_only_where_the_outputs_part_and_the_table_counts_by_type():
    asked: list[int] = []

    def top_at(position: int) -> TopTwo:
        asked.append(position)
        return TopTwo((7, 8), (-0.5, -0.55))

    equal = compare("ngram-mod", "p0", "qa", [1, 2, 3], [1, 2, 3], top_at, 0.1, drafted=4, accepted=2)
    parted = compare("ngram-mod", "p1", "qa", [1, 7, 3], [1, 8, 4], top_at, 0.1, decode_gaps=[1.0, 0.04, 2.0])
    wrong = compare("ngram-simple", "p1", "qa", [1, 7], [1, 9], top_at, 0.1)
    assert asked == [1, 1] and equal.equal and equal.verdict == "equal"
    assert (parted.position, parted.ar_token, parted.spec_token, parted.verdict) == (1, 7, 8, NUMERICS)
    assert parted.gap_nats == pytest.approx(0.05) and parted.decode_gap_nats == 0.04
    assert wrong.verdict == FAULT
    table = {t["spec_type"]: t for t in equality_by_type([equal, parted, wrong])}
    assert table["ngram-mod"]["equality_rate"] == 0.5 and table["ngram-mod"][NUMERICS] == 1
    assert table["ngram-simple"][FAULT] == 1 and table["ngram-simple"]["equal"] == 0
    assert (table["ngram-mod"]["drafted"], table["ngram-mod"]["accepted"]) == (4, 2)


def test_the_top_law_keeps_a_remainder_bin_and_bins_unseen_tokens_there():
    law = TopLaw.of([5, 9], [0.5, 0.3])
    assert law.ids == (5, 9, REMAINDER) and np.allclose(law.p, [0.5, 0.3, 0.2])
    assert law.counts([5, 5, 9, 42, 7]).tolist() == [2, 1, 2]
    with pytest.raises(ValueError):
        TopLaw.of([5, 5], [0.5, 0.3])


def test_the_wrong_rule_moves_the_draft_by_p_times_one_minus_p():
    law = TopLaw.of([5, 9], [0.5, 0.3])
    wrong = law.wrong_rule(9)  # P(d) = p(d) + (1 - p(d)) p(d); others (1 - p(d)) p(x)
    assert wrong == pytest.approx([0.7 * 0.5, 0.3 + 0.7 * 0.3, 0.7 * 0.2])
    assert wrong.sum() == pytest.approx(1.0)


def test_the_draws_needed_reach_the_power_and_one_fewer_does_not():
    law = TopLaw.of([5, 9, 11], [0.55, 0.25, 0.1])
    wrong = law.wrong_rule(5)
    n = draws_for_power(law.p, wrong, target=0.9, min_expected=5, min_pvalue=1e-3, max_draws=100_000)
    assert n is not None and 20 < n < 1000
    assert power_at(law.p, wrong, n, 5, 1e-3) >= 0.9 > power_at(law.p, wrong, n - 1, 5, 1e-3)
    # a draft the model is sure of barely moves under the wrong rule: far more draws, or none within the cap
    sure = TopLaw.of([5, 9], [0.995, 0.004])
    assert draws_for_power(sure.p, sure.wrong_rule(5), target=0.9, min_expected=5, min_pvalue=1e-3,
                           max_draws=n) is None


def test_the_stated_power_is_what_a_seeded_simulation_of_the_wrong_rule_shows():
    """400 simulated runs of n draws each from the wrong rule (seeded): the rule rejects in at least the stated
    share (the chi-square power is a lower bound on the rule's), within a binomial tolerance of 4 SE; and runs
    from p itself pass at the rule's level (at most 2% of 400 fail)."""
    law = TopLaw.of([5, 9, 11], [0.55, 0.25, 0.1])
    wrong = law.wrong_rule(5)
    n = draws_for_power(law.p, wrong, target=0.9, min_expected=5, min_pvalue=1e-3, max_draws=100_000)
    runs = 400
    rejected = sum(not judge(simulated_counts(wrong, n, seed), law, 5, RULE)[0].passed for seed in range(runs))
    false_alarms = sum(not judge(simulated_counts(law.p, n, seed), law, 5, RULE)[0].passed for seed in range(runs))
    assert rejected / runs >= 0.9 - 4 * np.sqrt(0.9 * 0.1 / runs)
    assert false_alarms / runs <= 0.02


def test_judge_names_the_cells_by_token_id():
    law = TopLaw.of([5, 9], [0.6, 0.3])
    result, labels = judge(np.array([60, 30, 10]), law, 5, RULE)
    assert labels == ["5", "9", "other"] and result.passed


def test_the_context_is_cut_where_x1_is_sure_and_x2_is_not():
    """choose_cut maximises p(x1)·p(x2)(1 − p(x2)) over positions from min_cut: here position 2 (x1 at 0.95, then a
    0.5 token) beats position 0 (x1 at 0.99, then 0.99) and position 3 (x1 at 0.5)."""
    from spectune.engines.llamacpp_exactness import choose_cut

    top = [[(1, np.log(p)), (2, np.log(1 - p))] for p in (0.99, 0.99, 0.95, 0.5, 0.9)]
    assert choose_cut(top, min_cut=0) == 2
    assert choose_cut(top, min_cut=3) == 3


def test_the_cut_goes_where_an_n_gram_lookup_can_draft():
    """A cut after which no n-gram lookup can draft yields no draws: the best position where one can is taken, and
    drafts_after says where (the last `lookup` tokens seen before)."""
    from spectune.engines.llamacpp_exactness import choose_cut, drafts_after

    top = [[(1, np.log(p)), (2, np.log(1 - p))] for p in (0.99, 0.99, 0.95, 0.5, 0.9)]
    assert choose_cut(top, min_cut=0, drafts=lambda k: k != 2) == 1
    assert choose_cut(top, min_cut=0, drafts=lambda k: False) is None  # none can: no cut
    assert drafts_after([5, 6, 7, 8, 5, 6], lookup=2) and not drafts_after([5, 6, 7, 8, 6, 5], lookup=2)
    assert drafts_after([1, 2], lookup=0) and not drafts_after([1, 2], lookup=2)
