"""The cost model fitted to a profile and traces: known answers on synthetic inputs in the agreed formats,
and the CLI against a real tiny sweep."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.costmodel.cli import compare
from analysis.costmodel.fit import as_profile, fit, joint_from_traces, mean_profile, predict
from spectune.costmodel.cycle import expected_tokens_constant
from spectune.errors import SpectuneError


def make_profile(t_verify=(0.010, 0.012, 0.014, 0.016, 0.018), t_draft=0.001, overhead=0.0005, batches=(1,)) -> dict:
    """A profile.json object (task=profile's format) with the given times for every batch size."""
    per_b = {str(b): b for b in batches}
    return {"kind": "spectune-profile", "version": 1, "label": "synthetic", "synthetic": True, "notes": [],
            "models": {"target": {"name_or_path": "spectune/models/tiny/target"},
                       "draft": {"name_or_path": "spectune/models/tiny/draft"}},
            "hardware": {"setup": "cpu", "execution_path": "eager"},
            "batch_sizes": list(batches), "max_positions": len(t_verify),
            "t_draft_s": {k: t_draft * b for k, b in per_b.items()},
            "t_verify_s": {k: [t * b for t in t_verify] for k, b in per_b.items()},
            "overhead_s": {k: overhead for k in per_b}, "interpolated": {k: False for k in per_b}, "fit": {}}


def make_traces(accept_probs: list[list[float]], accepted: list[list[bool]] | None = None) -> pd.DataFrame:
    """traces.parquet rows (cycle, row, position) with the given a_i per recorded (cycle, row)."""
    rows = []
    for cycle, probs in enumerate(accept_probs):
        for i, a in enumerate(probs, start=1):
            flag = accepted[cycle][i - 1] if accepted is not None else True
            rows.append({"cycle": cycle, "row": 0, "request_id": cycle, "prompt_id": f"p{cycle}", "language": "en",
                         "batch_size": 1, "position": i, "context_length": 30, "token_prob": 0.5, "entropy": 1.0,
                         "margin": 0.1, "cum_prob": 0.5**i, "accept_prob": a, "accepted": flag,
                         "recent_acceptance": 0.5, "draft_s": 0.001 * i, "verify_s": 0.01, "max_gamma": len(probs)})
    return pd.DataFrame(rows)


def test_profile_ratios_follow_the_agreed_conventions():
    profile = as_profile(make_profile(batches=(1, 4)))
    assert profile.c(1) == pytest.approx(0.1)
    assert profile.g(1, 1) == pytest.approx(1.2) and profile.g(3, 1) == pytest.approx(1.6)
    assert profile.o(1) == pytest.approx(0.05) and profile.o(4) == pytest.approx(0.0125)
    assert profile.batch_sizes == [1, 4]


def test_a_malformed_profile_fails_in_one_line():
    with pytest.raises(SpectuneError, match="not a spectune profile") as err:
        as_profile({**make_profile(), "kind": "something-else"})
    assert "\n" not in str(err.value)
    with pytest.raises(SpectuneError, match=r"gamma=5 needs a verification of 6 positions"):
        predict([0.9] * 5, as_profile(make_profile()), [5])


def test_profiles_bracketing_a_run_average_element_wise():
    before = as_profile(make_profile(t_verify=(0.010, 0.012, 0.014), t_draft=0.001, overhead=0.0))
    after = as_profile(make_profile(t_verify=(0.012, 0.016, 0.018), t_draft=0.003, overhead=0.002))
    mean = mean_profile([before, after])
    assert mean.t_verify_s[1] == pytest.approx([0.011, 0.014, 0.016])
    assert mean.t_draft_s[1] == pytest.approx(0.002) and mean.overhead_s[1] == pytest.approx(0.001)
    assert mean.c(1) == pytest.approx(0.002 / 0.011) and "mean of 2 profiles" in mean.label
    with pytest.raises(SpectuneError, match="cannot be averaged: batch sizes"):
        mean_profile([before, as_profile(make_profile(t_verify=(0.010, 0.012, 0.014), batches=(1, 2)))])


def test_joint_acceptance_from_traces_known_answer():
    traces = make_traces([[0.8, 0.5, 1.0], [0.6, 1.0, 0.5]],
                         accepted=[[True, False, True], [True, True, True]])
    # expected: mean over pairs of Π_{j≤i} a_j = [(0.8+0.6)/2, (0.4+0.6)/2, (0.4+0.3)/2]
    assert joint_from_traces(traces) == pytest.approx([0.7, 0.5, 0.35])
    # realised: all accepted up to i: pair 0 stops at position 2 (even though position 3 was accepted)
    assert joint_from_traces(traces, "realised") == pytest.approx([1.0, 0.5, 0.5])
    shuffled = traces.sample(frac=1.0, random_state=0)  # order of rows must not matter
    assert joint_from_traces(shuffled) == pytest.approx([0.7, 0.5, 0.35])


def test_realised_joint_of_independent_acceptances_matches_alpha_powers():
    """n = 20,000 cycles of γ 4, each position accepted independently with α = 0.7 (seed 7): the realised
    joint is α^i within 4 standard errors sqrt(α^i (1 − α^i) / n)."""
    n, alpha, gamma = 20_000, 0.7, 4
    rng = np.random.default_rng(7)
    flags = (rng.random((n, gamma)) < alpha).tolist()
    traces = make_traces([[alpha] * gamma] * n, accepted=flags)
    joint = joint_from_traces(traces, "realised")
    for i, value in enumerate(joint, start=1):
        p = alpha**i
        assert abs(value - p) < 4 * math.sqrt(p * (1 - p) / n), (i, value, p)
    assert joint_from_traces(traces) == pytest.approx([alpha**i for i in range(1, gamma + 1)])


def test_predicted_speedup_known_answer():
    profile = as_profile(make_profile())  # c = 0.1, g(γ) = 1 + 0.2γ, o = 0.05
    table = predict([0.7, 0.5, 0.35], profile, [1, 2, 3]).set_index("gamma")
    # γ = 2: E = 1 + 0.7 + 0.5 = 2.2; cost = 0.1·2 + 1.4 + 0.05 = 1.65; S = 2.2 · 1.05 / 1.65
    assert table.loc[2, "E"] == pytest.approx(2.2)
    assert table.loc[2, "cost"] == pytest.approx(1.65)
    assert table.loc[2, "predicted_speedup"] == pytest.approx(2.2 * 1.05 / 1.65)
    # constant α = joint[0] = 0.7: E = 1 + 0.7 + 0.49, same costs; the plain S = E / (cγ + 1)
    assert table.loc[2, "constant_alpha_speedup"] == pytest.approx(2.19 * 1.05 / 1.65)
    assert table.loc[2, "seed_speedup"] == pytest.approx(2.19 / 1.2)
    assert table.loc[3, "E_constant_alpha"] == pytest.approx(expected_tokens_constant(0.7, 3))


def test_a_cycles_first_draft_step_is_charged_apart():
    """With t_first_draft = 0.0025 (c₁ = 0.25, c = 0.1): γ = 1 pays c₁, γ = 3 pays c₁ + 2c; bracketing profiles
    average it, and a profile without it stands in with its t_draft."""
    data = {**make_profile(), "t_first_draft_s": {"1": 0.0025}}
    table = predict([0.7, 0.5, 0.35], as_profile(data), [1, 3]).set_index("gamma")
    assert table.loc[1, "draft"] == pytest.approx(0.25) and table.loc[3, "draft"] == pytest.approx(0.45)
    assert table.loc[3, "cost"] == pytest.approx(0.45 + 1.6 + 0.05)
    assert table.loc[3, "predicted_speedup"] == pytest.approx(2.55 * 1.05 / 2.1)
    mean = mean_profile([as_profile(data), as_profile(make_profile())])
    assert mean.t_first_draft(1) == pytest.approx((0.0025 + 0.001) / 2) and mean.t_draft(1) == pytest.approx(0.001)


def test_joint_equal_to_alpha_powers_gives_the_constant_alpha_prediction():
    profile = as_profile(make_profile())
    table = predict([0.6, 0.36, 0.216, 0.1296], profile, [1, 2, 3, 4])
    assert table["predicted_speedup"].to_numpy() == pytest.approx(table["constant_alpha_speedup"].to_numpy())


def test_fit_covers_the_gamma_both_inputs_allow():
    profile = make_profile(t_verify=(0.01, 0.012, 0.014))  # max_positions 3 → γ ≤ 2
    traces = make_traces([[0.9, 0.8, 0.7, 0.6]])
    assert fit(profile, traces)["gamma"].tolist() == [1, 2]
    with pytest.raises(SpectuneError, match="beyond the traces' max_gamma 4"):
        fit(make_profile(t_verify=(0.01,) * 7), traces, gammas=[5])
    with pytest.raises(SpectuneError, match="need the task=trace format"):
        fit(profile, traces.drop(columns=["accept_prob"]))


def test_compare_puts_the_error_next_to_the_measurement():
    profile = as_profile(make_profile())
    traces = make_traces([[0.8, 0.5, 1.0], [0.6, 1.0, 0.5]])
    runs = pd.DataFrame([{"run": "r", "gamma": g, "batch_size": 1, "language": "en", "measured_speedup": s}
                         for g, s in ((1, 1.2), (2, 1.4))])
    table = compare(profile, traces, runs).set_index("gamma")
    expected = predict([0.7, 0.5], profile, [1, 2]).set_index("gamma")["predicted_speedup"]
    assert table["error"].to_numpy() == pytest.approx((expected / [1.2, 1.4] - 1).to_numpy())


@pytest.mark.slow(reason="python -m analysis.costmodel in a subprocess")
def test_cli_writes_the_comparison_into_the_run_dir(tiny_sweep, tmp_path, cli):
    import shutil

    run_dir = shutil.copytree(tiny_sweep, tmp_path / "sweep")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(make_profile(batches=(1, 2))))
    traces_dir = tmp_path / "trace"
    traces_dir.mkdir()
    make_traces([[0.8, 0.6, 0.5, 0.4]] * 4).to_parquet(traces_dir / "traces.parquet")
    done = cli("--profile", str(profile), "--traces", str(traces_dir / "traces.parquet"), str(run_dir),
               module="analysis.costmodel")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(run_dir / "costmodel_fit.csv")
    assert {"gamma", "predicted_speedup", "measured_speedup", "error"} <= set(table)
    assert sorted(table["gamma"].unique()) == [1, 2] and sorted(table["batch_size"].unique()) == [1, 2]
    assert (table["measured_speedup"] > 0).all() and table["error"].notna().all()
    assert "largest |error|" in done.stdout
    meta = json.loads((run_dir / "costmodel_fit.json").read_text())
    assert meta["joint"] == pytest.approx([0.8, 0.48, 0.24, 0.096]) and "git" in meta
    bad = cli("--profile", str(tmp_path / "missing.json"), "--traces", str(traces_dir), str(run_dir),
              module="analysis.costmodel")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "missing.json' is not found" in bad.stderr
    other = make_profile(batches=(1, 2))
    other["models"]["target"]["name_or_path"] = "meta-llama/Llama-3.1-8B"
    profile.write_text(json.dumps(other))
    refused = cli("--profile", str(profile), "--traces", str(traces_dir), str(run_dir), module="analysis.costmodel")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "was measured with models.target.name_or_path=meta-llama/Llama-3.1-8B" in refused.stderr


@pytest.mark.slow(reason="runs task=profile and task=trace through the CLI first")
def test_cli_on_a_real_profile_and_real_traces(tiny_sweep, tiny_cost_inputs, tmp_path, cli):
    """The whole path on the embedded pair: task=profile and task=trace feed the fit, the tiny sweep is measured.
    Checked: the table is complete and its terms are consistent; not the size of the error (2-core CI noise)."""
    import shutil

    profile, traces = tiny_cost_inputs
    run_dir = shutil.copytree(tiny_sweep, tmp_path / "sweep")
    done = cli("--profile", str(profile), "--traces", str(traces), str(run_dir), module="analysis.costmodel")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(run_dir / "costmodel_fit.csv")
    assert len(table) == 4 and set(table["gamma"]) == {1, 2} and set(table["batch_size"]) == {1, 2}
    real = json.loads(profile.read_text())
    for row in table.itertuples():
        b, g = str(row.batch_size), row.gamma
        step = real["t_verify_s"][b][0]
        assert row.verify == pytest.approx(real["t_verify_s"][b][g] / step)
        first, later = real["t_first_draft_s"][b], real["t_draft_s"][b]  # task=profile measures the two apart
        assert row.draft == pytest.approx((first + (g - 1) * later) / step)
        assert 1 <= row.E <= g + 1 and 1 <= row.measured_E <= g + 1
        cost = row.draft + row.verify + row.overhead
        assert row.predicted_speedup == pytest.approx(row.E * (1 + row.overhead) / cost)
    assert table["measured_speedup"].gt(0).all() and table["in_sample_speedup"].gt(0).all()
