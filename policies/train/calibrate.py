"""Calibrate a cost profile to live wall-clock throughput: the replay's costs made to agree with the grid search.

A profile measured by ``task=profile`` times bare draft steps and verifications; a live run also pays prefill,
admission, sampling and bookkeeping, and on a small machine the timings of millisecond kernels are noisy. A
policy trained in replay learns the profile's trade-off between drafting deeper and verifying sooner, so a
profile whose per-γ cost is off teaches the wrong γ (measured: a PPO policy that beat the grid's γ by
11% in replay lost to it by 14% live).

The grid search measures, on the training prompts, the live tokens/s r_k of every fixed γ = k; the traces of
the same prompts give the tokens each γ would emit. In replay a fixed γ = k costs, per recorded entry e,
F_e + D_e(k): a fixed part F = (t_verify(1) + overhead)/s and a γ part D(k) = (drafting k steps + t_verify(k+1) −
t_verify(1))/s, where s = b (the entry's share of its batch's cycle) for a system rate and s = 1 (the whole cycle,
which the request waits for) for a request's decode rate, the grid's primary one. Calibration finds the two scales
(α, β) with

    α·Σ_e F_e + β·Σ_e D_e(k) ≈ Σ_e tokens_e(k) / r_k     for every k of the grid,

by least squares on relative errors (non-negative), and returns the profile with the AR step and overhead
scaled by α and the per-γ costs (draft step, verification slope) by β. The fit's residual per γ is
kept in the profile's ``fit`` so a user sees how well two numbers explain the grid.

Two numbers can leave residuals of ±6% between neighbouring γ (measured on smollm2 in bfloat16: γ = 3 +5.9%,
γ = 4 −6.1%), larger than the differences a policy must learn, so a policy trained on them prefers the γ the
replay over-rates. With ``per_gamma=True`` the verification of k + 1 positions then takes, at every batch size, an
additive correction δ_k that makes the replay at each grid γ = k equal the grid's live rate: the costs a policy
learns are the costs the grid paid, per γ (γ outside the grid keep the two-number fit). The price is the
grid's own noise, now in the costs; a separate run tests it (the held-out fixed-γ rows of ``task=evaluate``; the
archived probe ``replay_fidelity.py``, bench/results/archive/probes.json, in git history at 2fb8dda).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from policies.envs.data import TraceSet
from policies.envs.replay import realised_tokens, replay_costs
from spectune.costmodel.profile import Profile
from spectune.errors import SpectuneError

log = logging.getLogger(__name__)


def calibrate_profile(profile: Profile, traces: TraceSet, grid: pd.DataFrame, per_gamma: bool = False
                      ) -> tuple[Profile, dict[str, Any]]:
    """The profile scaled so that replaying ``traces`` at every fixed γ of ``grid`` (columns ``gamma``,
    ``tok_s``: live tokens/s on the traced prompts) gives the live throughput. Replay times cycles only, so a
    ``decode_tok_s`` column (tokens after the first over E2EL − TTFT, pooled over requests), when the grid has one,
    is matched instead of the end-to-end rate, by the replay's per-request rate (:func:`replay_costs`). Returns it
    and the fit. ``per_gamma``: then match every grid γ exactly (module doc)."""
    rate = "decode_tok_s" if "decode_tok_s" in grid and grid["decode_tok_s"].notna().any() else "tok_s"
    # Like for like: a request's decode rate against the replay charging each row the whole cycle, the system's
    # end-to-end rate against each row's share (the same at batch 1; at b rows the scales would absorb × b).
    per = "request" if rate == "decode_tok_s" else "system"
    ok = grid.dropna(subset=[rate])
    ok = ok[(ok[rate] > 0) & (ok["gamma"] <= traces.max_gamma)]
    if len(ok) < 2:
        raise SpectuneError(f"the grid has {len(ok)} usable γ: calibration needs at least two")
    gamma = int(ok["gamma"].max())
    base = replay_costs(traces, profile, gamma, per)  # [N, γ + 1]
    fixed = base[:, 0]
    gamma_part = base - fixed[:, None]
    tokens = realised_tokens(traces, gamma)
    gammas = ok["gamma"].astype(int).to_numpy()
    live_s = tokens[:, gammas].sum(0) / ok[rate].to_numpy(float)  # seconds the live rate implies
    design = np.stack([np.full(len(gammas), fixed.sum()), gamma_part[:, gammas].sum(0)], 1)
    (alpha, beta), _ = nnls(design / live_s[:, None], np.ones(len(gammas)))
    if alpha <= 0:
        raise SpectuneError("calibration failed: the grid's throughput cannot be explained with a positive AR step")
    predicted = design @ [alpha, beta]
    residual = {int(g): float(100 * (p / s - 1)) for g, p, s in zip(gammas, predicted, live_s, strict=True)}
    fit = {"method": "least squares on relative error, non-negative: alpha·fixed + beta·per-γ = live seconds",
           "alpha_fixed_scale": float(alpha), "beta_per_gamma_scale": float(beta),
           "residual_pct_by_gamma": residual, "max_abs_residual_pct": float(max(abs(r) for r in residual.values())),
           "grid_rate": rate, "replay_rate": per,
           "grid_tok_s": {int(g): float(r) for g, r in zip(gammas, ok[rate], strict=True)},
           "from_profile": profile.label}
    calibrated = dataclasses.replace(
        profile.scaled(draft=beta, verify_slope=beta, overhead=alpha, ar_step=alpha),
        label=f"{profile.label} (calibrated to the live grid)", synthetic=profile.synthetic,
        notes=[*profile.notes, "scaled so that replay at every fixed γ matches the grid search's live tokens/s "
                               "(policies.train.calibrate)"],
        fit={**profile.fit, "calibration": fit}, metadata=profile.metadata)
    log.info("profile calibrated to the live grid: AR step and overhead × %.3f, per-γ costs × %.3f; residual "
             "by γ: %s", alpha, beta, " ".join(f"{g}:{r:+.1f}%" for g, r in residual.items()))
    if per_gamma:
        calibrated, fit = _per_gamma(calibrated, traces, gammas, live_s, per, fit)
    return calibrated, fit


MIN_SHARE = 0.25  # a corrected verification keeps at least this share of its scaled value (never 0 or negative)


def _per_gamma(profile: Profile, traces: TraceSet, gammas: np.ndarray, live_s: np.ndarray, per: str,
               fit: dict[str, Any]) -> tuple[Profile, dict[str, Any]]:
    """``profile`` with t_verify(k + 1) shifted by δ_k at every batch size so that replay at each grid γ = k
    costs the live seconds: Σ_e cost_e(k) + δ_k·Σ_e 1/share_e = live_s(k) (share_e: the entry's batch for a system
    rate, 1 for a request's)."""
    gamma = int(gammas.max())
    costs = replay_costs(traces, profile, gamma, per)
    weight = float((1.0 / traces.batch_size).sum()) if per == "system" else float(traces.count)
    tables = {b: list(map(float, v)) for b, v in profile.t_verify_s.items()}
    shift: dict[int, float] = {}
    for k, seconds in zip(gammas, live_s, strict=True):
        delta = (float(seconds) - float(costs[:, k].sum())) / weight
        floor = min(MIN_SHARE * tables[b][k] for b in tables)
        delta = max(delta, floor - min(tables[b][k] for b in tables))
        shift[int(k)] = delta
        for b in tables:
            tables[b][k] += delta
    note = "verification of k + 1 positions shifted per grid γ = k so that replay matches the grid exactly"
    corrected = dataclasses.replace(profile, t_verify_s=tables, label=f"{profile.label}, matched per γ",
                                    notes=[*profile.notes, f"{note} (policies.train.calibrate)"])
    after = replay_costs(traces, corrected, gamma, per)[:, gammas].sum(0)
    residual = {int(g): float(100 * (a / s - 1)) for g, a, s in zip(gammas, after, live_s, strict=True)}
    at_one = corrected.batch_sizes[0]
    fit = {**fit, "per_gamma": True, "per_gamma_shift_ms": {k: 1e3 * d for k, d in shift.items()},
           "per_gamma_shift_pct": {k: 100 * d / (tables[at_one][k] - d) for k, d in shift.items()},
           "residual_pct_by_gamma_after": residual,
           "max_abs_residual_pct_after": float(max(abs(r) for r in residual.values()))}
    corrected = dataclasses.replace(corrected, fit={**corrected.fit, "calibration": fit})
    log.info("matched per γ: verification shifted by %s; residual by γ now %s",
             " ".join(f"{k}:{1e3 * d:+.2f}ms" for k, d in shift.items()),
             " ".join(f"{g}:{r:+.2f}%" for g, r in residual.items()))
    return corrected, fit
