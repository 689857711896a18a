"""What the replay environments replay: recorded cycles (``traces.parquet``) and cost profiles.

:class:`TraceSet` holds the traces as dense arrays, one entry per recorded (cycle, row), each with
``max_gamma`` draft positions, so that a replay step is a few array lookups. :class:`ProfileSet` gives
the profile of an episode: one of a set, optionally scaled at random around it, so that a policy can learn
to condition on the hardware (the observation carries c and g).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spectune import names
from spectune.costmodel.profile import CycleCosts, Profile, check_profile, load_profile
from spectune.engine.policy import DRAFT_SIGNALS, MATCH_SIGNALS, SIGNALS
from spectune.errors import SpectuneError
from spectune.run import rundir


class TraceSet:
    """Recorded cycles of ``task=trace`` as arrays; ``metadata`` is ``traces.metadata.json`` when present."""

    def __init__(self, frame: pd.DataFrame, metadata: dict | None = None, source: str = "traces") -> None:
        if not len(frame):
            raise SpectuneError(f"traces={source} is invalid: it holds no cycles (run task=trace on a workload "
                                "with prompts)")
        missing = [c for c in ("cycle", "row", "position", "accepted", "accept_prob", *DRAFT_SIGNALS) if c not in frame]
        if missing:
            raise SpectuneError(f"traces={source} is invalid: missing columns {', '.join(missing)}")
        frame = frame.sort_values(["cycle", "row", "position"], kind="stable")
        gamma = int(frame["position"].max())
        sizes = frame.groupby(["cycle", "row"], sort=False).size()
        if not (sizes == gamma).all():
            raise SpectuneError(f"traces={source} is invalid: every (cycle, row) needs positions 1..{gamma}")
        n = len(sizes)
        self.source, self.metadata, self.max_gamma, self.count = source, metadata or {}, gamma, n

        def grid(col: str, dtype=np.float64) -> np.ndarray:
            return frame[col].to_numpy(dtype=dtype).reshape(n, gamma)

        # a model-free draft's traces hold its match signals too (spectune.engine.traces.CHAIN_COLUMNS)
        self.match_signals = all(name in frame for name in MATCH_SIGNALS)
        recorded = SIGNALS if self.match_signals else DRAFT_SIGNALS
        self.signals = np.stack([grid(s) for s in recorded], axis=-1)  # [N, D, 4], or [N, D, 8]: SIGNALS' order
        # drafts each entry's chain held: a model-free draft's chain may end before max_gamma (the live engine verifies
        # no further), a draft model's never does
        self.chain = grid("drafted", bool).sum(1) if "drafted" in frame else np.full(n, gamma)
        self.accepted = grid("accepted", bool)
        self.accept_prob = grid("accept_prob")
        first = frame.groupby(["cycle", "row"], sort=False).first()
        self.cycle = first.index.get_level_values(0).to_numpy()
        self.context_length = first["context_length"].to_numpy(float)
        self.batch_size = first["batch_size"].to_numpy(int)
        self.recent_acceptance = first["recent_acceptance"].to_numpy(float)
        # slot and request of each entry: what a policy replayed cycle by cycle (policies.envs.replay) is told
        self.row = first.index.get_level_values(1).to_numpy()
        self.request_id = first["request_id"].to_numpy(int) if "request_id" in first else np.full(n, -1)
        # Realised accepted at γ = k = min(k, leading accepted); expected = Σ_{i≤k} Π_{j≤i} a_j.
        self.leading = np.cumprod(self.accepted, axis=1).sum(1)
        self.expected = np.concatenate([np.zeros((n, 1)), np.cumsum(np.cumprod(self.accept_prob, 1), 1)], 1)
        # cycle -> entries of that cycle (the rows of one batch), for the verification-budget environment
        self.cycle_starts = np.flatnonzero(np.r_[True, self.cycle[1:] != self.cycle[:-1]])  # first entry of each
        self.cycle_slices = [slice(a, b) for a, b in zip(self.cycle_starts, [*self.cycle_starts[1:], n], strict=True)]

    @classmethod
    def load(cls, path: str | Path | None) -> TraceSet:
        return cls(*read_traces(path), str(path))

    def accepted_at(self, entry: int, gamma: int, expected: bool = False) -> float:
        """Accepted drafts of entry ``entry`` had it stopped at ``gamma`` (realised, or the expectation)."""
        if expected:
            return float(self.expected[entry, gamma])
        return float(min(gamma, self.leading[entry]))


def read_traces(path: str | Path | None) -> tuple[pd.DataFrame, dict]:
    """A ``traces.parquet`` of ``task=trace`` and the metadata recorded beside it ({} if none), or one line naming
    the bad path."""
    if path is None or not Path(path).is_file():
        raise SpectuneError(f"traces={None if path is None else str(path)!r} is not found: give the traces.parquet "
                            "that task=trace wrote")
    try:
        frame = names.upgrade_frame(pd.read_parquet(path))  # traces written before: max_depth -> max_gamma
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise SpectuneError(f"traces={path} is invalid: cannot read it as Parquet ({type(err).__name__})") from None
    return frame, rundir.TRACES_METADATA.read_if_present(Path(path).parent, {})


class ProfileSet:
    """The cost profile of each episode: one of ``profiles`` at random, scaled by exp(U(−jitter, jitter)) on the
    draft step and on the verification's per-position slope when ``jitter`` > 0 (a learnable hardware axis)."""

    def __init__(self, profiles: str | Path | Profile | list, jitter: float = 0.0,
                 traces: TraceSet | None = None, allow_mismatch: bool = False) -> None:
        items = profiles if isinstance(profiles, list | tuple) else [profiles]
        if not items:
            raise SpectuneError("profile=[] is invalid: give at least one profile (path or shipped name)")
        self.profiles = [p if isinstance(p, Profile) else load_profile(p) for p in items]
        if not 0 <= jitter <= 2:
            raise SpectuneError(f"profile_jitter={jitter!r} is out of range: must be in [0, 2] (log scale)")
        self.jitter = jitter
        self.synthetic: str | None = None
        if traces is not None and traces.metadata:
            run = {"models": traces.metadata.get("models", {}), "hardware": traces.metadata.get("hardware", {})}
            labels = [check_profile(p, run, allow_mismatch) for p in self.profiles]
            self.synthetic = next((label for label in labels if label), None)
        if jitter > 0 and self.synthetic is None:
            self.synthetic = "synthetic: profiles scaled around the measured ones (profile_jitter)"

        self._cache: dict[tuple[int, int], CycleCosts] = {}

    def costs(self, index: int, batch: int) -> CycleCosts:
        """The costs of profile ``index`` at ``batch`` rows (cached)."""
        key = (index, batch)
        if key not in self._cache:
            self._cache[key] = self.profiles[index].costs(batch)
        return self._cache[key]

    def sample(self, rng: np.random.Generator, batch: int) -> tuple[int, CycleCosts]:
        """An episode's profile index and costs at ``batch`` rows (scaled at random when ``jitter`` > 0)."""
        index = int(rng.integers(len(self.profiles))) if len(self.profiles) > 1 else 0
        costs = self.costs(index, batch)
        if self.jitter == 0:
            return index, costs
        d, s = np.exp(rng.uniform(-self.jitter, self.jitter, size=2))
        verify = costs.t_verify
        return index, CycleCosts(costs.t_draft * d, verify[0] + s * (verify - verify[0]), costs.overhead,
                                 costs.first_draft * d)


BACKENDS = ("replay", "live")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise SpectuneError(f"backend={backend!r} is unknown: choose one of {', '.join(BACKENDS)}")
    return backend


LIVE_GAMMA_LIMIT = 12  # the γ ceiling of a live environment (no traces bound it)


def attach_source(env: Any, backend: str, traces: Any, profile: Any, profile_jitter: float,
                  allow_profile_mismatch: bool, engine: Any, requests: list | None, concurrency: int,
                  live_time: str) -> tuple[int, int]:
    """Give ``env`` what both environments step through: the traces (replay) or the engine and requests (live),
    and the profile set. Returns (default γ: the traces' max_gamma or the live limit, the largest γ
    allowed: that and the profiles' max_positions - 1)."""
    if profile is None:
        raise SpectuneError("profile is missing: give a profile.json (task=profile) or a shipped profile name")
    if backend == "replay":
        env.traces = traces if isinstance(traces, TraceSet) else TraceSet.load(traces)
        limit = env.traces.max_gamma
    else:
        if engine is None or not requests:
            raise SpectuneError("backend='live' needs engine= and requests= (the models to drive)")
        if live_time not in ("measured", "profile"):
            raise SpectuneError(f"live_time={live_time!r} is unknown: choose measured or profile")
        env.traces, limit = None, LIVE_GAMMA_LIMIT
        env.engine, env.requests, env.concurrency, env.live_time = engine, list(requests), int(concurrency), live_time
        env._session = None
    env.profiles = ProfileSet(profile, profile_jitter, env.traces, allow_profile_mismatch)
    env.synthetic = env.profiles.synthetic
    return limit, min(limit, min(p.max_positions for p in env.profiles.profiles) - 1)
