"""A method is a value: its label is built in one place and read back by the same type."""

from __future__ import annotations

import pytest

from spectune.errors import SpectuneError
from spectune.methods import AA, AR, BASELINE, Method, is_fixed_label, is_label, label_gammas
from spectune.options import check_gamma


@pytest.mark.parametrize("method", [AR, AA, Method("fixed", 4), Method("match-length", 12), Method("ngram-mod", 8)])
def test_a_label_reads_back_as_the_same_method(method):
    assert Method.parse(method.label) == method


def test_the_baseline_is_gamma_zero_and_only_it():
    assert AR.label == BASELINE and AR.is_baseline and not AR.speculative
    assert not AA.is_baseline and AA.label == "ar#2"
    assert Method.fixed(0) == AR and Method.fixed(3).label == "fixed:gamma=3"
    with pytest.raises(SpectuneError, match="only it"):
        Method("fixed", 0)
    with pytest.raises(SpectuneError, match="only it"):
        Method(BASELINE, 2)


@pytest.mark.parametrize("label", ["fixed", "fixed:gamma=", "fixed:gamma=0", ":gamma=3", "fixed:gamma=x", ""])
def test_a_malformed_label_fails_in_one_line(label):
    assert not is_label(label)
    with pytest.raises(SpectuneError) as err:
        Method.parse(label)
    assert "\n" not in str(err.value)


def test_settings_do_not_change_identity_or_label():
    assert Method("confidence", 4, {"threshold": 0.3}) == Method("confidence", 4)


def test_a_duplicate_runs_the_same_point_under_a_label_of_its_own():
    fixed = Method("fixed", 4)
    assert AR.duplicate() == AA and AA.label == "ar#2" and Method.parse("ar#2") == AA
    assert fixed.duplicate().label == "fixed:gamma=4#2" and fixed.duplicate().gamma == 4
    assert fixed.duplicate() != fixed  # two runs of one grid: two methods


@pytest.mark.parametrize(("label", "fixed"), [
    ("fixed:gamma=1", True), ("fixed:gamma=24", True), ("fixed:gamma=2#2", True),  # labels committed runs carry
    ("ar", False), ("ar#2", False), ("confidence-0:gamma=2", False), ("match-length", False), ("ppo", False),
    ("best fixed γ", False), ("ar (A/A)", False), ("fixed", False), ("fixed:gamma=0", False), ("", False)])
def test_a_fixed_gamma_is_told_by_its_label(label, fixed):
    assert is_fixed_label(label) is fixed
    if is_label(label):
        assert Method.parse(label).is_fixed is fixed


def test_the_measuring_pairs_are_label_and_gamma_in_order():
    assert label_gammas([AR, AA, Method("match-length", 8)]) == [("ar", 0), ("ar#2", 0), ("match-length:gamma=8", 8)]


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "3", None])
def test_a_gamma_that_is_no_positive_integer_fails_in_one_line_naming_key_and_purpose(value):
    with pytest.raises(SpectuneError) as err:
        check_gamma(value, "the bandit's largest arm", key="policy.gamma")
    assert str(err.value) == f"policy.gamma={value!r} is invalid: the bandit's largest arm must be an integer >= 1"
    assert check_gamma(3, "γ") == 3
