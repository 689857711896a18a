"""Calibrating a profile to live throughput: two scales recovered exactly from a grid that a scaled profile made,
and bad grids refused in one line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.errors import SpectuneError
from harness.profile import Profile
from policies.calibrate import calibrate_profile
from policies.envs.data import TraceSet
from policies.replay import replay_scores


def _traces(leading: list[int], depth: int = 4) -> TraceSet:
    rows = [{"cycle": c, "row": 0, "request_id": c, "position": k, "batch_size": 1, "context_length": 10,
             "recent_acceptance": 0.5, "token_prob": 0.5, "entropy": 1.0, "margin": 0.1, "cum_prob": 0.5 ** k,
             "accept_prob": 0.5, "accepted": k <= lead} for c, lead in enumerate(leading) for k in range(1, depth + 1)]
    return TraceSet(pd.DataFrame(rows))


def _profile(ar: float, draft: float, slope: float, overhead: float, depth: int = 4) -> Profile:
    return Profile("measured", [1], depth + 1, {1: draft}, {1: [ar + slope * n for n in range(depth + 1)]},
                   {1: overhead})


def test_the_scales_of_a_scaled_profile_are_recovered():
    """Live = the measured profile with AR step + overhead × 1.3 and per-depth costs × 0.6: the grid made from
    the live profile's replay rates is explained exactly (residual < 1e-6 %), and the calibrated profile replays
    to the grid's rates at every γ."""
    traces = _traces([4, 0, 2, 3, 1, 4, 4, 0])
    measured = _profile(ar=10.0, draft=1.0, slope=0.5, overhead=2.0)
    live = _profile(ar=13.0, draft=0.6, slope=0.3, overhead=2.6)
    rates = replay_scores(traces, live, 4, np.zeros(traces.count, dtype=int))["fixed_tok_s"]
    grid = pd.DataFrame({"gamma": range(5), "tok_s": rates})
    calibrated, fit = calibrate_profile(measured, traces, grid)
    assert fit["alpha_fixed_scale"] == pytest.approx(1.3) and fit["beta_per_depth_scale"] == pytest.approx(0.6)
    assert fit["max_abs_residual_pct"] < 1e-6
    replayed = replay_scores(traces, calibrated, 4, np.zeros(traces.count, dtype=int))["fixed_tok_s"]
    np.testing.assert_allclose(replayed, rates, rtol=1e-9)
    assert "calibrated" in calibrated.label and calibrated.fit["calibration"]["from_profile"] == "measured"


def test_a_grid_with_fewer_than_two_depths_is_refused():
    with pytest.raises(SpectuneError, match="calibration needs at least two"):
        calibrate_profile(_profile(10, 1, 0.5, 2), _traces([1, 2]), pd.DataFrame({"gamma": [2], "tok_s": [5.0]}))


def test_train_calibrate_to_reads_a_grid_file_and_writes_the_calibrated_profile(tmp_path):
    from policies.pipeline import TrainSettings, _calibrated

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
    calibrated = _calibrated(_profile(10.0, 1.0, 0.5, 2.0), frame, {}, settings, tmp_path)
    assert calibrated.fit["calibration"]["max_abs_residual_pct"] < 1e-6  # the concurrency-4 row was ignored
    assert (tmp_path / "profile.calibrated.json").is_file()
    with pytest.raises(SpectuneError, match=r"train\.calibrate_to='/no/grid\.csv' is not found"):
        _calibrated(calibrated, frame, {}, TrainSettings(None, None, False, 8, 0, 0.2, 4, 1, 1, "throughput",
                                                         "expected", 0.0, 100, 50, {}, calibrate_to="/no/grid.csv"),
                    tmp_path)
