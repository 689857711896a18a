"""Hardware cost profiles: schema round trip, the shipped H200 profiles against their source rows,
interpolation between batch sizes, the mismatch check, and task=profile end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spectune.costmodel.profile import (
    Profile,
    check_profile,
    dearer_note,
    dearer_than_longer,
    fit_linear,
    load_profile,
    profile_mismatch,
    shipped_profiles,
)
from spectune.costmodel.profiles.build import build
from spectune.errors import SpectuneError
from spectune.run.rundir import current_model_path

H200_DATA = {"meta": {}, "rows": [
    {"model": "llama3-8b", "n": 1, "compiled_ms": 6.94, "batch": 1},
    {"model": "llama3-8b", "n": 8, "compiled_ms": 7.25, "batch": 1},
    {"model": "llama3-1b", "n": 1, "compiled_ms": 1.85, "batch": 1},
    {"model": "llama-160m", "n": 1, "compiled_ms": 1.06, "batch": 1},
    {"model": "llama3-8b", "n": 1, "compiled_ms": 16.86, "batch": 32},
    {"model": "llama3-8b", "n": 8, "compiled_ms": 21.2, "batch": 32},
]}


def _profile(**changes) -> Profile:
    base = dict(label="toy", batch_sizes=[1, 4], max_positions=3, t_draft_s={1: 0.001, 4: 0.002},
                t_verify_s={1: [0.010, 0.011, 0.012], 4: [0.020, 0.024, 0.028]}, overhead_s={1: 0.0005, 4: 0.001},
                models={"name": "tiny", "target": {"name_or_path": "t"}, "draft": {"name_or_path": "d"}},
                hardware={"device": "cpu", "device_name": "AMD EPYC", "dtype": "float32", "execution_path": "eager"})
    base.update(changes)
    return Profile(**base)


def test_conventions_and_interpolation():
    p = _profile()
    assert p.c(1) == pytest.approx(0.1)
    assert p.g(2, 4) == pytest.approx(1.4)  # 3 positions over one at batch 4
    assert p.o(1) == pytest.approx(0.05)
    assert p.t_verify(2, 2) == pytest.approx(0.011 + (0.024 - 0.011) / 3)  # linear in b between 1 and 4
    assert p.t_draft(16) == p.t_draft(4)  # beyond the measured sizes: the nearest
    assert p.cycle_s(2, 1) == pytest.approx(2 * 0.001 + 0.012 + 0.0005)
    with pytest.raises(SpectuneError, match="positions=4 is out of range"):
        p.t_verify(1, 4)


def test_first_draft_step_is_charged_apart():
    """A cycle of d ≥ 1 drafts costs t_first_draft + (d − 1)·t_draft; without t_first_draft_s every step is t_draft
    (older and synthetic profiles keep their costs exactly)."""
    plain = _profile()
    p = _profile(t_first_draft_s={1: 0.0015, 4: 0.003})
    assert p.c_first(1) == pytest.approx(0.15) and p.c(1) == pytest.approx(0.1) and plain.c_first(1) == plain.c(1)
    assert p.cycle_s(0, 1) == pytest.approx(0.010 + 0.0005) == plain.cycle_s(0, 1)
    assert p.cycle_s(1, 1) == pytest.approx(0.0015 + 0.011 + 0.0005)
    assert p.cycle_s(2, 1) == pytest.approx(0.0015 + 0.001 + 0.012 + 0.0005)
    assert p.cycle_s(2, 1) - plain.cycle_s(2, 1) == pytest.approx(0.0005)
    costs = p.costs(2)  # interpolated like the other columns
    assert costs.first_draft == pytest.approx(0.0015 + (0.003 - 0.0015) / 3)
    assert list(costs.draft_s(np.array([0, 1, 3]))) == pytest.approx([0, costs.first_draft,
                                                                       costs.first_draft + 2 * costs.t_draft])
    scaled = p.scaled(draft=2.0)
    assert scaled.t_first_draft(1) == pytest.approx(0.003) and scaled.t_draft(1) == pytest.approx(0.002)
    both = p.scaled(ar_step=2.0, verify_slope=0.5)  # the AR step and the per-position slope apart
    assert both.t_verify(1, 1) == pytest.approx(2 * p.t_verify(1, 1))
    assert both.t_verify(1, 3) - both.t_verify(1, 1) == pytest.approx(0.5 * (p.t_verify(1, 3) - p.t_verify(1, 1)))
    assert both.synthetic and both.t_draft(1) == p.t_draft(1) and both.overhead(1) == p.overhead(1)
    assert load_profile_json(p.to_json()).t_first_draft_s == {1: 0.0015, 4: 0.003}
    assert "t_first_draft_s" not in plain.to_json() and load_profile_json(plain.to_json()).t_first_draft_s is None


def load_profile_json(data: dict) -> Profile:
    return Profile.from_json(json.loads(json.dumps(data)))


def test_round_trip_and_invalid_files(tmp_path):
    p = _profile()
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(p.to_json()))
    again = load_profile(path)
    assert again.to_json() == p.to_json()
    bad = p.to_json()
    bad["t_verify_s"]["4"] = [0.02]
    path.write_text(json.dumps(bad))
    with pytest.raises(SpectuneError, match="is invalid"):
        load_profile(path)
    path.write_text("{not json")
    with pytest.raises(SpectuneError, match="cannot read it as JSON"):
        load_profile(path)
    with pytest.raises(SpectuneError, match="is not found"):
        load_profile(tmp_path / "missing.json")


def test_shipped_h200_profiles_reproduce_the_measured_rows():
    """The measured compiled rows come back exactly (ms → s); unmeasured batch sizes are flagged."""
    assert {"h200-llama3-8b-1b", "h200-llama3-8b-160m"} <= set(shipped_profiles())
    for name, draft_ms in (("h200-llama3-8b-1b", 1.85), ("h200-llama3-8b-160m", 1.06)):
        p = load_profile(name)
        assert p.t_verify(1, 1) == pytest.approx(6.94e-3) and p.t_verify(1, 8) == pytest.approx(7.25e-3)
        assert p.t_verify(32, 1) == pytest.approx(16.86e-3) and p.t_verify(32, 8) == pytest.approx(21.2e-3)
        assert p.t_draft(1) == pytest.approx(draft_ms * 1e-3)
        assert p.g(7, 32) == pytest.approx(21.2 / 16.86)
        assert not p.interpolated[1] and all(p.interpolated[b] for b in (2, 4, 8, 16, 32))
        assert all(o == 0 for o in p.overhead_s.values()) and any("overhead_s = 0" in n for n in p.notes)
        assert p.to_json() == build(H200_DATA, name.rsplit("-", 1)[1]).to_json() | {"notes": p.notes,
                                                                                    "metadata": p.metadata}


def test_profile_of_other_models_or_hardware_is_an_error_naming_the_fields():
    p = _profile()
    run = {"models": {"name": "tiny", "target": {"name_or_path": "t"}, "draft": {"name_or_path": "d"}},
           "hardware": {"device": "cpu", "device_name": "AMD EPYC", "dtype": "float32", "execution_path": "eager"}}
    assert check_profile(p, run) is None
    run["hardware"] = {**run["hardware"], "device": "cuda:0", "device_name": "NVIDIA H200"}
    with pytest.raises(SpectuneError) as err:
        check_profile(p, run)
    assert "hardware.device:" in str(err.value) and "hardware.device_name" in str(err.value)
    assert "models." not in str(err.value) and "allow_profile_mismatch=true" in str(err.value)
    assert check_profile(p, run, allow_mismatch=True) == "synthetic: tiny acceptance x toy costs"


def test_a_profile_from_a_cpu_with_other_bfloat16_support_is_refused_where_both_record_it():
    p = _profile()
    run = {"models": {"name": "tiny", "target": {"name_or_path": "t"}, "draft": {"name_or_path": "d"}},
           "hardware": {"device": "cpu", "device_name": "AMD EPYC", "dtype": "float32", "execution_path": "eager",
                        "cpu_bf16": "native"}}
    assert check_profile(p, run) is None  # the profile predates the field: compared only where both record it
    p = _profile(hardware={**p.hardware, "cpu_bf16": "emulated"})
    assert check_profile(p, run) is None  # float32 on both: bfloat16 support does not decide its costs
    p = _profile(hardware={**p.hardware, "cpu_bf16": "emulated", "dtype": "bfloat16"})
    run["hardware"]["dtype"] = "bfloat16"
    with pytest.raises(SpectuneError, match=r"hardware\.cpu_bf16: profile 'emulated' vs run 'native'") as err:
        check_profile(p, run)
    assert "\n" not in str(err.value)
    assert check_profile(p, run, allow_mismatch=True).startswith("synthetic:")


def test_linear_fit_reports_residuals():
    exact = fit_linear([1, 2, 3, 4], [1.0, 1.5, 2.0, 2.5])
    assert exact["a"] == pytest.approx(0.5) and exact["b"] == pytest.approx(0.5)
    assert exact["max_rel_residual"] == pytest.approx(0.0, abs=1e-12)
    assert fit_linear([1, 2, 3], [1.0, 3.0, 2.0])["max_rel_residual"] > 0.1


@pytest.mark.slow(reason="python -m harness task=profile in a subprocess")
def test_task_profile_writes_a_loadable_profile(cli, tmp_path):
    run = cli("task=profile", "+workload=en", "task.batch_sizes=[1,2]", "task.max_gamma=2", "task.repeats=2",
              "task.warmup=1", "hardware.threads=1", "workload.num_prompts=2", run_dir=tmp_path)
    assert run.returncode == 0, run.stderr
    p = load_profile(tmp_path / "profile.json")
    assert p.batch_sizes == [1, 2] and p.max_positions == 3 and not p.synthetic
    assert all(t > 0 for t in [*p.t_draft_s.values(), *p.t_first_draft_s.values(), *p.t_verify_s[1],
                               *p.t_verify_s[2]])
    assert set(p.fit["t_verify_s ~ a + b*n"]) == {"1", "2"}
    assert p.models["target"]["name_or_path"] == "spectune/models/tiny/target" and "device_name" in p.hardware
    bad = cli("task=profile", "+workload=en", "task.max_gamma=0", run_dir=tmp_path / "bad")
    assert bad.returncode == 2 and "task.max_gamma=0" in bad.stderr and not (tmp_path / "bad/profile.json").exists()


def test_shipped_cpu_profile_is_of_the_embedded_pair():
    p = load_profile("tiny-cpu-2core-vm")  # measured when the pair lived under harness/models/
    assert current_model_path(p.models["target"]["name_or_path"]) == "spectune/models/tiny/target"
    assert current_model_path(p.models["draft"]["name_or_path"]) == "spectune/models/tiny/draft"
    run = {"models": {"target": {"name_or_path": "spectune/models/tiny/target"},
                      "draft": {"name_or_path": "spectune/models/tiny/draft"}}, "hardware": p.hardware}
    assert profile_mismatch(p, run) == {}
    assert p.hardware["device"] == "cpu" and p.hardware["execution_path"] == "eager" and not p.synthetic
    assert p.max_positions == 13 and p.batch_sizes == [1, 2, 4]
    assert all(0 < p.c(b) < 1 for b in p.batch_sizes)  # a draft step is cheaper than a target step
    assert set(p.fit["t_verify_s ~ a + b*n"]) == {"1", "2", "4"}


def test_a_verification_dearer_than_a_longer_one_is_named():
    """The verification means of smollm2 on task prompts (ms, n = 1..8, a 2-vCPU AMD EPYC, float32): n = 2 and 3
    cost more than n = 5, n = 6 and 7 more than n = 8; n = 4 is within 20% of n = 5 (tolerance 0.2); costs that grow
    with n name nothing."""
    ms = [66.3, 136.8, 139.3, 112.6, 95.8, 121.0, 146.3, 99.7]
    assert dearer_than_longer(ms, tolerance=0.2) == [(2, 5), (3, 5), (6, 8), (7, 8)]
    assert dearer_than_longer([66.0, 70.0, 75.0, 74.0, 90.0]) == []  # 75 vs 74: within the 10% of noise
    note = dearer_note(1, [t / 1e3 for t in ms], tolerance=0.2)
    assert note is not None and "n=3 139.3 ms > n=5 95.8 ms" in note
    assert dearer_note(1, [0.066, 0.07, 0.075]) is None
