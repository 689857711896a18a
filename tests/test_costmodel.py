"""The cost model reproduces the published worked numbers and its general form agrees with the constant-α form
(E is the library's, :mod:`spectune.costmodel.cycle`; ``tests/test_cycle.py`` holds its own claims)."""

from __future__ import annotations

import pytest

from analysis.costmodel.model import (
    expected_tokens_from_joint,
    joint_from_accepted_lengths,
    optima,
    speedup,
    sweep,
    verify_cost,
)
from spectune.costmodel.cycle import expected_tokens_constant
from spectune.errors import SpectuneError

SEED_GRID = {"alphas": [0.3, 0.7, 0.9], "cs": [0.05, 0.20], "gammas": range(1, 17)}


def _best(alpha: float, c: float, **kwargs) -> dict:
    best = optima(sweep([alpha], [c], range(1, 17), **kwargs))
    assert len(best) == 1
    return best.iloc[0].to_dict()


def test_seed_numbers() -> None:
    assert expected_tokens_constant(0.7, 6) == pytest.approx(3.058819, abs=5e-7)
    low = _best(0.7, 0.05)
    assert (low["gamma"], round(low["E"], 6), round(low["S"], 3)) == (6, 3.058819, 2.353)
    high = _best(0.7, 0.20)
    assert (high["gamma"], round(high["S"], 3)) == (3, 1.583)
    assert speedup(expected_tokens_constant(0.7, 6), 6, 0.05, g=3) == pytest.approx(0.927, abs=5e-4)


def test_closed_form_equals_sum_of_powers() -> None:
    for alpha in (0.0, 0.1, 0.5, 0.9, 0.999, 1 - 1e-9):
        for gamma in (1, 2, 7, 16):
            direct = sum(alpha**i for i in range(gamma + 1))
            assert expected_tokens_constant(alpha, gamma) == pytest.approx(direct, rel=1e-9)


def test_alpha_one_and_zero() -> None:
    assert expected_tokens_constant(1.0, 5) == 6.0
    assert expected_tokens_constant(1, 1) == 2.0
    assert expected_tokens_constant(0.0, 9) == 1.0
    grid = sweep([1.0, 0.0], [0.0], range(1, 5))
    assert list(grid[grid["alpha"] == 1.0]["S"]) == [2.0, 3.0, 4.0, 5.0]
    best = optima(grid)  # α = 0, c = 0: S = 1 for every γ; the tie goes to the smallest γ
    assert best[best["alpha"] == 0.0]["gamma"].item() == 1


def test_general_e_from_joint_probabilities() -> None:
    for alpha, gamma in ((0.7, 6), (0.3, 3), (1.0, 4)):
        assert expected_tokens_from_joint([alpha**i for i in range(1, gamma + 1)]) == pytest.approx(
            expected_tokens_constant(alpha, gamma), rel=1e-12)
    # Same mean acceptance, different accepted-length distributions, different E.
    hist_all_or_nothing = [0.5, 0.0, 0.5]  # N ∈ {0, 2}: mean per-draft acceptance 0.5
    hist_spread = [0.25, 0.5, 0.25]        # N ∈ {0, 1, 2}: the same mean 0.5
    j1, j2 = joint_from_accepted_lengths(hist_all_or_nothing), joint_from_accepted_lengths(hist_spread)
    assert j1 == pytest.approx([0.5, 0.5]) and j2 == pytest.approx([0.75, 0.25])
    assert expected_tokens_from_joint(j1) == pytest.approx(2.0)
    assert expected_tokens_from_joint(joint_from_accepted_lengths([30, 50, 20])) == pytest.approx(1.9)


def test_verify_cost_forms_agree() -> None:
    table = {g: 1.0 + 0.1 * g for g in range(1, 17)}
    as_list = [table[g] for g in range(1, 17)]
    for gamma in (1, 8, 16):
        assert verify_cost(table, gamma) == verify_cost(as_list, gamma) == verify_cost(
            lambda x: 1.0 + 0.1 * x, gamma) == pytest.approx(1.0 + 0.1 * gamma)
    a = sweep([0.7], [0.05], range(1, 17), g=table)
    b = sweep([0.7], [0.05], range(1, 17), g=lambda x: 1.0 + 0.1 * x)
    assert a["S"].tolist() == pytest.approx(b["S"].tolist())
    assert _best(0.7, 0.05, g=3)["S"] < 1  # exact and slower: exactness says nothing about speed


def test_sweep_grid_and_optima_shape() -> None:
    grid = sweep(**SEED_GRID)
    assert len(grid) == 16 * 3 * 2
    assert set(grid.columns) >= {"alpha", "c", "gamma", "E", "cost", "S"}
    best = optima(grid)
    assert len(best) == 6
    assert best.set_index(["alpha", "c"])["gamma"].to_dict() == {
        (0.3, 0.05): 2, (0.3, 0.2): 1, (0.7, 0.05): 6, (0.7, 0.2): 3, (0.9, 0.05): 13, (0.9, 0.2): 7}
    joint = sweep([0.7], [0.05], range(1, 17), joint=[0.9, 0.7, 0.5])
    assert sorted(joint[joint["series"] == "joint"]["gamma"]) == [1, 2, 3]


@pytest.mark.parametrize(("call", "fragment"), [
    (lambda: sweep([1.5], [0.1], [3]), "alpha=1.5"),
    (lambda: sweep([float("nan")], [0.1], [3]), "alpha=nan"),
    (lambda: sweep([-0.1], [0.1], [3]), "alpha=-0.1"),
    (lambda: sweep([0.5], [0.1], [0]), "gamma=0"),
    (lambda: speedup(2.0, 0, 0.1), "gamma=0"),
    (lambda: speedup(2.0, 3, -0.1), "c=-0.1"),
    (lambda: verify_cost([1.0, 2.0], 3), "gamma=3"),
    (lambda: verify_cost({1: 1.0}, 2), "no entry for gamma=2"),
    (lambda: verify_cost(0.0, 2), "g(gamma=2)=0.0"),
    (lambda: expected_tokens_from_joint([0.5, 0.6]), "joint[1]=0.6"),
    (lambda: expected_tokens_from_joint([1.2]), "joint[0]=1.2"),
    (lambda: joint_from_accepted_lengths([1, -1]), "histogram"),
])
def test_bad_input_is_a_one_line_error(call, fragment: str) -> None:
    with pytest.raises(SpectuneError) as err:
        call()
    assert fragment in str(err.value) and "\n" not in str(err.value)
