"""A method is a value: its label is built in one place and read back by the same type."""

from __future__ import annotations

import pytest

from spectune.errors import SpectuneError
from spectune.methods import AA, AR, BASELINE, Method, is_label


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
