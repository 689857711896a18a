"""Calibrate a cost profile to live wall-clock throughput: the replay's costs made to agree with the grid search.

A profile measured by ``task=profile`` times bare draft steps and verifications; a live run also pays prefill,
admission, sampling and bookkeeping, and on a small machine the timings of millisecond kernels are noisy. A
policy trained in replay learns the profile's trade-off between drafting deeper and verifying sooner, so a
profile whose per-depth cost is off teaches the wrong depth (measured: a PPO policy that beat the grid's γ by
11% in replay lost to it by 14% live).

The grid search measures, on the training prompts, the live tokens/s r_k of every fixed depth k; the traces of
the same prompts give the tokens each depth would emit. In replay a fixed depth k costs, per recorded entry e,
F_e + D_e(k): a fixed part F = (t_verify(1) + overhead)/s and a depth part D(k) = (drafting k steps + t_verify(k+1) −
t_verify(1))/s, where s = b (the entry's share of its batch's cycle) for a system rate and s = 1 (the whole cycle,
which the request waits for) for a request's decode rate, the grid's primary one. Calibration finds the two scales
(α, β) with

    α·Σ_e F_e + β·Σ_e D_e(k) ≈ Σ_e tokens_e(k) / r_k     for every k of the grid,

by least squares on relative errors (non-negative), and returns the profile with the AR step and overhead
scaled by α and the per-depth costs (draft step, verification slope) by β. The fit's residual per depth is
kept in the profile's ``fit`` so a user sees how well two numbers explain the grid.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from harness.errors import SpectuneError
from harness.profile import Profile
from policies.envs.data import TraceSet
from policies.replay import replay_costs

log = logging.getLogger(__name__)


def calibrate_profile(profile: Profile, traces: TraceSet, grid: pd.DataFrame) -> tuple[Profile, dict[str, Any]]:
    """The profile scaled so that replaying ``traces`` at every fixed depth of ``grid`` (columns ``gamma``,
    ``tok_s``: live tokens/s on the traced prompts) gives the live throughput. Replay times cycles only, so a
    ``decode_tok_s`` column (tokens after the first over E2EL − TTFT, pooled over requests), when the grid has one,
    is matched instead of the end-to-end rate, by the replay's per-request rate (:func:`replay_costs`). Returns it
    and the fit."""
    rate = "decode_tok_s" if "decode_tok_s" in grid and grid["decode_tok_s"].notna().any() else "tok_s"
    # Like for like: a request's decode rate against the replay charging each row the whole cycle, the system's
    # end-to-end rate against each row's share (the same at batch 1; at b rows the scales would absorb × b).
    per = "request" if rate == "decode_tok_s" else "system"
    ok = grid.dropna(subset=[rate])
    ok = ok[(ok[rate] > 0) & (ok["gamma"] <= traces.max_depth)]
    if len(ok) < 2:
        raise SpectuneError(f"the grid has {len(ok)} usable depth(s): calibration needs at least two")
    depth = int(ok["gamma"].max())
    base = replay_costs(traces, profile, depth, per)  # [N, depth + 1]
    fixed = base[:, 0]
    per_depth = base - fixed[:, None]
    tokens = np.minimum(traces.leading[:, None], np.arange(depth + 1)[None, :]) + 1.0
    gammas = ok["gamma"].astype(int).to_numpy()
    live_s = tokens[:, gammas].sum(0) / ok[rate].to_numpy(float)  # seconds the live rate implies
    design = np.stack([np.full(len(gammas), fixed.sum()), per_depth[:, gammas].sum(0)], 1)
    (alpha, beta), _ = nnls(design / live_s[:, None], np.ones(len(gammas)))
    if alpha <= 0:
        raise SpectuneError("calibration failed: the grid's throughput cannot be explained with a positive AR step")
    predicted = design @ [alpha, beta]
    residual = {int(g): float(100 * (p / s - 1)) for g, p, s in zip(gammas, predicted, live_s, strict=True)}
    fit = {"method": "least squares on relative error, non-negative: alpha·fixed + beta·per-depth = live seconds",
           "alpha_fixed_scale": float(alpha), "beta_per_depth_scale": float(beta),
           "residual_pct_by_gamma": residual, "max_abs_residual_pct": float(max(abs(r) for r in residual.values())),
           "grid_rate": rate, "replay_rate": per,
           "grid_tok_s": {int(g): float(r) for g, r in zip(gammas, ok[rate], strict=True)},
           "from_profile": profile.label}
    calibrated = dataclasses.replace(
        profile.scaled(draft=beta, verify_slope=beta, overhead=alpha, ar_step=alpha),
        label=f"{profile.label} (calibrated to the live grid)", synthetic=profile.synthetic,
        notes=[*profile.notes, "scaled so that replay at every fixed depth matches the grid search's live tokens/s "
                               "(policies.calibrate)"],
        fit={**profile.fit, "calibration": fit}, metadata=profile.metadata)
    log.info("profile calibrated to the live grid: AR step and overhead × %.3f, per-depth costs × %.3f; residual "
             "by γ: %s", alpha, beta, " ".join(f"{g}:{r:+.1f}%" for g, r in residual.items()))
    return calibrated, fit
