"""Fuzzing the inputs users type or hand over (hypothesis, derandomized): workload files and config overrides.

The claim under test, for every generated input: either it is accepted, or it fails with one SpectuneError
line naming what is wrong -- never another exception (a traceback for the user) and never a file written.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from harness.errors import SpectuneError
from tests.conftest import REPO

FUZZ = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Values a user can produce with an override: numbers of every kind, bools, text, null, short lists.
SCALARS = st.one_of(
    st.integers(-3, 10), st.integers(-(2**63), 2**63), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=8), st.sampled_from(["1", "true", "null", "1e3", "nan", "-0"]),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4))


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _one_line_error(err: SpectuneError, *names: str) -> None:
    text = str(err)
    assert text and "\n" not in text, text
    assert any(name in text for name in names), (names, text)


@pytest.fixture(scope="module")
def bench_cfg():
    return _compose("+workload=en")


BENCH_KEYS = ["gamma", "concurrency", "request_rate", "burstiness", "task.warmup", "task.baseline"]


@FUZZ
@given(key=st.sampled_from(BENCH_KEYS), value=VALUES)
def test_bench_settings_accept_or_fail_in_one_line(bench_cfg, tmp_path, key, value):
    from harness.tasks import bench

    cfg = OmegaConf.create(OmegaConf.to_container(bench_cfg))
    OmegaConf.update(cfg, key, value, force_add=True)
    out = tmp_path / "run"
    try:
        s = bench.BenchSettings.from_cfg(cfg)
    except SpectuneError as err:
        _one_line_error(err, key.split(".")[-1])
        with pytest.raises(SpectuneError):  # the task itself stops before writing anything
            bench.run(cfg, out)
        assert not out.exists()
        return
    assert s.methods() and all(isinstance(g, int) and g >= 1 for g in s.gammas)
    assert len(set(s.gammas)) == len(s.gammas)
    assert isinstance(s.concurrency, int) and not isinstance(s.concurrency, bool) and s.concurrency >= 1
    assert s.request_rate is None or (math.isfinite(s.request_rate) and s.request_rate > 0)
    assert math.isfinite(s.burstiness) and s.burstiness > 0
    assert isinstance(s.warmup, int) and not isinstance(s.warmup, bool) and s.warmup >= 0

