"""Calibrating a profile to live throughput: two scales recovered exactly from a grid that a scaled profile made,
and bad grids refused in one line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from policies.envs.data import TraceSet
from policies.envs.replay import replay_scores
from policies.train.calibrate import calibrate_profile
from spectune.costmodel.profile import Profile
from spectune.errors import SpectuneError


def _traces(leading: list[int], gamma: int = 4) -> TraceSet:
    rows = [{"cycle": c, "row": 0, "request_id": c, "position": k, "batch_size": 1, "context_length": 10,
             "recent_acceptance": 0.5, "token_prob": 0.5, "entropy": 1.0, "margin": 0.1, "cum_prob": 0.5 ** k,
             "accept_prob": 0.5, "accepted": k <= lead} for c, lead in enumerate(leading) for k in range(1, gamma + 1)]
    return TraceSet(pd.DataFrame(rows))


def _profile(ar: float, draft: float, slope: float, overhead: float, gamma: int = 4) -> Profile:
    return Profile("measured", [1], gamma + 1, {1: draft}, {1: [ar + slope * n for n in range(gamma + 1)]},
                   {1: overhead})


def test_the_scales_of_a_scaled_profile_are_recovered():
    """Live = the measured profile with AR step + overhead × 1.3 and per-γ costs × 0.6: the grid made from
    the live profile's replay rates is explained exactly (residual < 1e-6 %), and the calibrated profile replays
    to the grid's rates at every γ."""
    traces = _traces([4, 0, 2, 3, 1, 4, 4, 0])
    measured = _profile(ar=10.0, draft=1.0, slope=0.5, overhead=2.0)
    live = _profile(ar=13.0, draft=0.6, slope=0.3, overhead=2.6)
    rates = replay_scores(traces, live, 4, np.zeros(traces.count, dtype=int))["fixed_tok_s"]
    grid = pd.DataFrame({"gamma": range(5), "tok_s": rates})
    calibrated, fit = calibrate_profile(measured, traces, grid)
    assert fit["alpha_fixed_scale"] == pytest.approx(1.3) and fit["beta_per_gamma_scale"] == pytest.approx(0.6)
    assert fit["max_abs_residual_pct"] < 1e-6
    replayed = replay_scores(traces, calibrated, 4, np.zeros(traces.count, dtype=int))["fixed_tok_s"]
    np.testing.assert_allclose(replayed, rates, rtol=1e-9)
    assert "calibrated" in calibrated.label and calibrated.fit["calibration"]["from_profile"] == "measured"


def _batched(leading: list[int], batch: int = 2, gamma: int = 4) -> TraceSet:
    """``leading`` split into cycles of ``batch`` rows (one request per row)."""
    rows = [{"cycle": i // batch, "row": i % batch, "request_id": i % batch, "position": k, "batch_size": batch,
             "context_length": 10 + i, "recent_acceptance": 0.5, "token_prob": 0.5, "entropy": 1.0, "margin": 0.1,
             "cum_prob": 0.5 ** k, "accept_prob": 0.5, "accepted": k <= lead}
            for i, lead in enumerate(leading) for k in range(1, gamma + 1)]
    return TraceSet(pd.DataFrame(rows))


def _batched_profile(ar: float, draft: float, slope: float, overhead: float, gamma: int = 4) -> Profile:
    return Profile("measured", [1, 2], gamma + 1, {1: draft, 2: 1.2 * draft},
                   {b: [b * 0.8 * ar + slope * n for n in range(gamma + 1)] for b in (1, 2)},
                   {1: overhead, 2: overhead})


@pytest.mark.parametrize(("column", "rate"), [("decode_tok_s", "request"), ("tok_s", "system")])
def test_at_two_rows_each_grid_rate_is_matched_by_its_own_replay_rate(column, rate):
    """At 2 rows a request's decode rate is the system's over 2: a grid of decode tok/s (pooled over requests) is
    fitted with the replay charging each row the whole cycle, a grid of end-to-end tok/s with each row's share; both
    recover the live scales (1.3, 0.6), not scales × 2."""
    traces = _batched([4, 0, 2, 3, 1, 4, 4, 0])
    measured = _batched_profile(ar=10.0, draft=1.0, slope=0.5, overhead=2.0)
    live = _batched_profile(ar=13.0, draft=0.6, slope=0.3, overhead=2.6)
    zeros = np.zeros(traces.count, dtype=int)
    rates = replay_scores(traces, live, 4, zeros, rate=rate)["fixed_tok_s"]
    system = replay_scores(traces, live, 4, zeros)["fixed_tok_s"]
    np.testing.assert_allclose(np.asarray(system) / 2 if rate == "request" else system, rates, rtol=1e-12)
    _, fit = calibrate_profile(measured, traces, pd.DataFrame({"gamma": range(5), column: rates}))
    assert fit["alpha_fixed_scale"] == pytest.approx(1.3) and fit["beta_per_gamma_scale"] == pytest.approx(0.6)
    assert fit["replay_rate"] == rate and fit["max_abs_residual_pct"] < 1e-6


def test_an_unknown_replay_rate_is_refused():
    with pytest.raises(SpectuneError, match=r"rate='tokens' is unknown: choose one of system, request"):
        replay_scores(_traces([1, 2]), _profile(10, 1, 0.5, 2), 4, np.zeros(8, dtype=int), rate="tokens")


def test_a_grid_with_fewer_than_two_gammas_is_refused():
    with pytest.raises(SpectuneError, match="calibration needs at least two"):
        calibrate_profile(_profile(10, 1, 0.5, 2), _traces([1, 2]), pd.DataFrame({"gamma": [2], "tok_s": [5.0]}))


def test_train_calibrate_to_reads_a_grid_file_and_writes_the_calibrated_profile(tmp_path):
    from policies.train.pipeline import TrainSettings, _calibrated

    traces = _traces([4, 0, 2, 3, 1, 4, 4, 0])
    frame = pd.DataFrame([{"cycle": c, "row": 0, "request_id": c, "position": k, "batch_size": 1,
                           "context_length": 10, "recent_acceptance": 0.5, "token_prob": 0.5, "entropy": 1.0,
                           "margin": 0.1, "cum_prob": 0.5 ** k, "accept_prob": 0.5, "accepted": k <= lead}
                          for c, lead in enumerate([4, 0, 2, 3, 1, 4, 4, 0]) for k in range(1, 5)])
    live = _profile(ar=13.0, draft=0.6, slope=0.3, overhead=2.6)
    rates = replay_scores(traces, live, 4, np.zeros(traces.count, dtype=int))["fixed_tok_s"]
    grid = tmp_path / "grid_c1.csv"
    pd.DataFrame({"concurrency": [1] * 5 + [4], "gamma": [*range(5), 1], "tok_s": [*rates, 1.0]}).to_csv(grid)
    settings = TrainSettings(None, None, False, 8, 0, 0.2, 4, 1, 1, "throughput", "expected", 0.0, 100, 50, {},
                             calibrate_to=str(grid))
    calibrated = _calibrated(_profile(10.0, 1.0, 0.5, 2.0), TraceSet(frame), settings, tmp_path)
    assert calibrated.fit["calibration"]["max_abs_residual_pct"] < 1e-6  # the concurrency-4 row was ignored
    assert (tmp_path / "profile.calibrated.json").is_file()
    with pytest.raises(SpectuneError, match=r"train\.calibrate_to='/no/grid\.csv' is not found"):
        _calibrated(calibrated, TraceSet(frame), TrainSettings(None, None, False, 8, 0, 0.2, 4, 1, 1, "throughput",
                                                         "expected", 0.0, 100, 50, {}, calibrate_to="/no/grid.csv"),
                    tmp_path)


@pytest.mark.parametrize(("column", "rate", "traces"), [
    ("decode_tok_s", "request", lambda: _traces([4, 0, 2, 3, 1, 4, 4, 0])),
    ("tok_s", "system", lambda: _batched([4, 0, 2, 3, 1, 4, 4, 0])),
])
def test_per_gamma_matching_explains_a_grid_two_scales_cannot(column, rate, traces):
    """Live costs that no (α, β) explains: verification of 4 positions 30% dearer and of 3 positions 20% cheaper than
    the line. Two scales leave residuals of several %; per_gamma=True brings every grid γ to < 1e-6 %, shifts only
    the verifications of the grid's γ, and leaves a γ outside the grid (γ = 4) at the two-scale fit."""
    traces = traces()
    batched = rate == "system"
    measured = (_batched_profile if batched else _profile)(ar=10.0, draft=1.0, slope=0.5, overhead=2.0)
    live = (_batched_profile if batched else _profile)(ar=13.0, draft=0.6, slope=0.3, overhead=2.6)
    for table in live.t_verify_s.values():
        table[3] *= 1.3
        table[2] *= 0.8
    zeros = np.zeros(traces.count, dtype=int)
    rates = replay_scores(traces, live, 4, zeros, rate=rate)["fixed_tok_s"][:4]
    grid = pd.DataFrame({"gamma": range(4), column: rates})
    two, two_fit = calibrate_profile(measured, traces, grid)
    assert two_fit["max_abs_residual_pct"] > 2
    matched, fit = calibrate_profile(measured, traces, grid, per_gamma=True)
    assert fit["per_gamma"] and fit["max_abs_residual_pct_after"] < 1e-6
    replayed = replay_scores(traces, matched, 4, zeros, rate=rate)["fixed_tok_s"]
    np.testing.assert_allclose(replayed[:4], rates, rtol=1e-9)
    for b, table in matched.t_verify_s.items():
        assert table[4] == pytest.approx(two.t_verify_s[b][4])  # γ = 4 was not in the grid: untouched
        assert all(t > 0 for t in table)
    assert "matched per γ" in matched.label


def test_per_gamma_matching_never_makes_a_verification_free():
    """Live seconds at γ = 2 that no positive verification can give (less than its two draft steps and overhead)
    are clamped: that verification keeps a quarter of its cost and the residual says what is left unexplained;
    the other γ are matched."""
    from policies.envs.replay import replay_costs
    from policies.train.calibrate import MIN_SHARE, _per_gamma

    traces = _traces([4, 0, 2, 3, 1, 4, 4, 0])
    measured = _profile(ar=10.0, draft=1.0, slope=0.5, overhead=2.0)
    gammas = np.arange(4)
    live_s = replay_costs(traces, measured, 3, "request").sum(0) * np.array([1.1, 0.9, 1.0, 1.2])
    live_s[2] = 0.5 * traces.count  # 0.5 s a cycle: below 2 draft steps (2 s) + overhead (2 s)
    matched, fit = _per_gamma(measured, traces, gammas, live_s, "request", {})
    assert matched.t_verify_s[1][2] == pytest.approx(MIN_SHARE * measured.t_verify_s[1][2])
    assert fit["residual_pct_by_gamma_after"][2] > 100
    assert all(abs(fit["residual_pct_by_gamma_after"][k]) < 1e-6 for k in (0, 1, 3))
