"""Behaviour pinned through refactors: the same seed gives the same results as the golden file records.

``tests/pinning.py`` computes, on the embedded tiny pair (``+workload=en``, 4 prompts, 12 new tokens, seed of
conf/), and ``tests/data/pinning/golden.json`` holds what the code gave when it was recorded:

- engine: the output token ids of every request and (request, γ, drafts, accepted, emitted) of every cycle,
  for AR, fixed γ, confidence, hf-heuristic, svip and the trained PPO γ policy, at concurrency 1 and/or 2;
- traces: ``task=trace``'s recording at γ 4, concurrency 2 — a sha256 of every column but the timing ones
  (``draft_s``, ``verify_s``), with its row count and accepted total;
- replay: the replay table, per-entry γ and scores of every policy (bandit and AdaEDL included: in replay
  their feedback costs come from a profile) against fixed γ and the oracle, with the shipped profile
  ``tiny-cpu-2core-vm``;
- train: ``policies.train`` in process (traces of the split, that profile, γ PPO, two γ/size rounds at
  concurrency 2, live fine-tuning with ``train.live_time=profile``): sha256 of every tensor of ``gamma.zip`` and
  ``size.zip``, the replay curves and the final validation scores.

Equality is exact (bit for bit) on the floating-point path the file was recorded on (torch version, thread
count, and the CPU: MKL's kernels differ between Intel and AMD processors in the last bits). The traces' sha256
identifies that path. On another one, the exact values (token ids, cycles, counts, γ, the traces' exact
columns) must still be equal, and every float must agree within a relative 1e-5 or an absolute 5e-6 (the
draft signals are float32 probabilities, entropies and margins, sums whose reduction order follows the CPU's
vector width: on an AVX2-only CPU they moved by up to 1.2e-6, and a margin, a difference of two probabilities, by
1.5e-4 of itself); the trained PPO weights, which
small float differences move bit by bit, are then skipped with that reason. After an intended change of
behaviour rerecord with ``python -m tests.pinning --record``.

Not pinnable: what reads the clock. The grid's best γ and every tokens/s of a bench or of ``policies.evaluate``,
the profile measured by ``task=profile``, the bandit's rewards live (its feedback is the measured cycle time) and
the live γ environment under ``live_time="measured"``. Those are covered by their own tests, which assert
properties rather than values: tests/test_tune.py and tests/test_evaluate.py (the grid and its ranking, on
measured points), tests/test_stats.py (the intervals and the best/indistinguishable set), tests/test_profile.py
(the profile's schema and lookups), tests/test_policies.py (the bandit's choices on given rewards) and
tests/test_envs.py (the live environment under the checker with profile time).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests import pinning

GOLDEN = json.loads(pinning.GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def computed(tmp_path_factory) -> dict[str, Any]:
    """Every pinned value of today's code, computed once for this module (about a minute on 2 loaded cores)."""
    return pinning.jsonable(pinning.compute(tmp_path_factory.mktemp("pinning")))


FLOAT_RTOL = 1e-5  # on another floating-point path: float32 kernels differ in the last bits, not more
FLOAT_ATOL = 5e-6  # float32 sums of ≤ 1 probabilities, reduced in another order (see the module docstring)
# The traces' frame_sha256 covers their floats bit for bit and identifies the recording's floating-point path;
# their "floats" (stored for the comparison off that path, from whichever path last stored them) are compared
# only off it.
BITWISE_SKIP, TOLERANT_SKIP = frozenset({"floats"}), frozenset({"frame_sha256"})


def _differences(got: Any, want: Any, path: str = "", rtol: float = 0.0) -> list[str]:
    """Where two JSON values differ (first few paths), for a readable failure; floats within ``rtol``."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}/{k}: missing" for k in want if k not in got] + [f"{path}/{k}: extra" for k in got
                                                                         if k not in want]
        skip = TOLERANT_SKIP if rtol else BITWISE_SKIP
        for key in want:
            if key in got and key not in skip:
                out += _differences(got[key], want[key], f"{path}/{key}", rtol)
        return out
    close = (rtol and isinstance(want, float) and isinstance(got, float | int) and not isinstance(got, bool)
             and (math.isclose(got, want, rel_tol=rtol, abs_tol=FLOAT_ATOL) or (math.isnan(got) and math.isnan(want))))
    if close:
        return []
    if got != want and not (got != got and want != want):  # NaN == NaN here
        if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
            return [d for g, w, i in zip(got, want, range(len(want)), strict=True)
                    for d in _differences(g, w, f"{path}[{i}]", rtol)]
        return [f"{path}: {str(got)[:120]} != recorded {str(want)[:120]}"]
    return []


def _same_float_path(computed: dict[str, Any]) -> bool:
    return computed["traces"]["frame_sha256"] == GOLDEN["traces"]["frame_sha256"]


@pytest.mark.parametrize("part", ["engine", "traces", "replay", "train"])
def test_results_equal_the_recorded_ones(computed, part):
    """Bit for bit on the recording's floating-point path; elsewhere exact values exact and floats within 1e-5."""
    if _same_float_path(computed):
        differences = _differences(computed[part], GOLDEN[part])
    elif part == "train":
        pytest.skip("this CPU's floating-point path is not the one golden.json was recorded on (the traces' "
                    "sha256 differs; their exact columns are compared in [traces]): trained PPO weights are "
                    "pinned bit for bit only there")
    else:
        differences = _differences(computed[part], GOLDEN[part], rtol=FLOAT_RTOL)
    assert not differences, differences[:10]


def test_the_float_tolerance_catches_a_real_change():
    """The relaxed comparison still fails on a changed token, count or a float off by more than 1e-5."""
    want = {"tokens": [1, 2, 3], "score": 10.0, "frame_sha256": "a"}
    assert not _differences({"tokens": [1, 2, 3], "score": 10.00001, "frame_sha256": "b"}, want, rtol=FLOAT_RTOL)
    assert _differences({"tokens": [1, 2, 3], "score": 10.0, "frame_sha256": "b"}, want)  # another path
    assert _differences({"tokens": [1, 2, 4], "score": 10.0, "frame_sha256": "a"}, want, rtol=FLOAT_RTOL)
    assert _differences({"tokens": [1, 2, 3], "score": 10.001, "frame_sha256": "a"}, want, rtol=FLOAT_RTOL)
    # a small float, such as a probability, may move by the absolute tolerance, not by more
    assert not _differences({"p": 0.010004}, {"p": 0.01}, rtol=FLOAT_RTOL)
    assert _differences({"p": 0.01001}, {"p": 0.01}, rtol=FLOAT_RTOL)
    assert _differences({"tokens": [1, 2, 3], "score": 10.00001, "frame_sha256": "a"}, want)  # bit for bit


def test_the_golden_file_pins_every_part():
    """The recorded file is complete: every policy and batch of the engine runs, every tensor of both files."""
    assert set(GOLDEN["engine"]) == {f"{label}/c{c}" for label, _, _, batches in
                                     (*pinning.ENGINE_POLICIES, ("ppo", None, 0, (1, 2))) for c in batches}
    assert all(run["cycles"] and all(run["tokens"].values()) for run in GOLDEN["engine"].values())
    assert GOLDEN["traces"]["rows"] > 0 and len(GOLDEN["traces"]["frame_sha256"]) == 64
    assert len(GOLDEN["traces"]["exact_sha256"]) == 64 and GOLDEN["traces"]["floats"]
    assert all(len(values) == GOLDEN["traces"]["rows"] for values in GOLDEN["traces"]["floats"].values())
    for name in ("gamma_weights_sha256", "size_weights_sha256"):
        assert {"all"} < set(GOLDEN["train"][name])
    assert "live" in map(str, GOLDEN["train"]["curves"]["round"])
