"""The cost model fitted to measurements: a ``task=profile`` result (the costs) and ``task=trace`` traces (the
acceptance) give the predicted speed-up per γ (:func:`fit`), never taken from the runs it predicts; the model itself
(E, the cycle's price in target steps, the speed-up) is :mod:`analysis.costmodel.model`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.costmodel.model import DRAFTS, StepCosts, expected_tokens_from_joint
from spectune.costmodel.cycle import expected_tokens, expected_tokens_constant
from spectune.costmodel.profile import Profile, load_profile
from spectune.errors import SpectuneError
from spectune.options import check_gamma


def as_profile(profile: Profile | Mapping[str, Any] | str | Path) -> Profile:
    """A :class:`spectune.costmodel.profile.Profile` from itself, its JSON object, a ``profile.json`` path or a shipped
    name (one schema and one validation for the replay environments and the cost model)."""
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, Mapping):
        return Profile.from_json(dict(profile))
    return load_profile(profile)


def mean_profile(profiles: Sequence[Profile]) -> Profile:
    """The element-wise mean of profiles of one setup (same batch sizes and positions), e.g. measured right
    before and right after a bench so that drift in the machine's load cancels to first order."""
    first = profiles[0]
    for other in profiles[1:]:
        if other.batch_sizes != first.batch_sizes or other.max_positions != first.max_positions:
            raise SpectuneError(f"profiles {first.label!r} and {other.label!r} cannot be averaged: batch sizes "
                                f"{first.batch_sizes} vs {other.batch_sizes}, max_positions {first.max_positions} "
                                f"vs {other.max_positions}")
    if len(profiles) == 1:
        return first
    n = len(profiles)
    data = first.to_json()
    data.update(label=f"mean of {n} profiles ({', '.join(p.label for p in profiles)})",
                notes=[*first.notes, f"element-wise mean of {n} profiles of the same setup"])
    for key in ("t_draft_s", "overhead_s"):
        data[key] = {str(b): sum(getattr(p, key)[b] for p in profiles) / n for b in first.batch_sizes}
    # A cycle's first draft step: averaged when every profile measured it apart, else each one's t_draft stands in.
    if any(p.t_first_draft_s for p in profiles):
        data["t_first_draft_s"] = {str(b): sum(p.t_first_draft(b) for p in profiles) / n for b in first.batch_sizes}
    data["t_verify_s"] = {str(b): [sum(v) / n for v in zip(*(p.t_verify_s[b] for p in profiles), strict=True)]
                          for b in first.batch_sizes}
    return Profile.from_json(data, data["label"])


def joint_from_traces(traces: pd.DataFrame, method: str = "expected") -> list[float]:
    """P(first i drafts accepted), i = 1..max_gamma, over the recorded (cycle, row) pairs of ``task=trace``.

    ``expected`` averages Π_{j≤i} a_j (a_j = min(1, p/q) of the drafted token: no sampling noise from the
    uniforms); ``realised`` averages the indicator that positions 1..i were all accepted. A pair with fewer
    positions (generation ended) counts only for the positions it has.
    """
    if method not in ("expected", "realised"):
        raise SpectuneError(f"method={method!r} is invalid: choose expected or realised")
    missing = [c for c in ("cycle", "row", "position", "accept_prob", "accepted") if c not in traces]
    if missing or traces.empty:
        raise SpectuneError(f"traces are empty or lack columns {missing}: need the task=trace format")
    keys = [k for k in ("run", "cycle", "row") if k in traces]
    frame = traces.sort_values([*keys, "position"])
    value = frame["accept_prob"].clip(0, 1) if method == "expected" else frame["accepted"].astype(float)
    joint = value.groupby([frame[k] for k in keys]).cumprod()
    per_position = joint.groupby(frame["position"]).mean().sort_index()
    if list(per_position.index) != list(range(1, len(per_position) + 1)):
        raise SpectuneError(f"traces positions are {list(per_position.index)}: expected 1..max_gamma")
    # Pairs cut short can lift a deeper mean a hair above a shallower one; P(first i) cannot rise with i.
    return [float(v) for v in per_position.cummin()]


def predict(joint: Sequence[float], profile: Profile, gammas: Iterable[int], batch_size: int = 1) -> pd.DataFrame:
    """Predicted speed-up of every fixed γ over AR, next to the constant-α models, at one batch size.

    Fitted: S = E (1 + o) / (c₁ + c (γ − 1) + g(γ) + o), E = 1 + Σ_{i≤γ} joint[i-1]: the classic formula with
    measured joint acceptance and measured costs, a cycle's first draft step c₁ apart from the later ones c (it
    also feeds the draft what the last cycle emitted; c₁ = c for a profile that did not measure it apart), and the
    per-cycle overhead o paid by the AR step too (both are timed the same way, TPOT-based).
    ``constant_alpha_speedup``: the same costs with E from α = joint[0]. ``seed_speedup``: the plain
    S = E(α) / (c γ + 1) (g = 1, no overhead, every draft step alike). Costs are :class:`StepCosts` (the AR step
    1 + o is their ``ar``), E is :func:`spectune.costmodel.cycle.expected_tokens` of the joint.
    """
    expected_tokens_from_joint(joint)
    alpha, measured = float(joint[0]), expected_tokens(joint)
    c, c_first, o = profile.c(batch_size), profile.c_first(batch_size), profile.o(batch_size)
    costs = StepCosts(c, lambda drafts: profile.g(drafts, batch_size), o, c_first)
    seed = StepCosts(c, lambda drafts: 1.0)  # the plain model: g = 1, no overhead, every draft step alike
    rows = []
    for gamma in sorted({check_gamma(x, DRAFTS) for x in gammas}):
        if gamma > len(joint):
            raise SpectuneError(f"gamma={gamma} is beyond the traces' max_gamma {len(joint)}: trace deeper")
        if gamma + 1 > profile.max_positions:
            raise SpectuneError(f"gamma={gamma} needs a verification of {gamma + 1} positions but the profile "
                                f"{profile.label!r} measured up to {profile.max_positions} (task.max_gamma)")
        draft, g, cost = costs.draft(gamma), costs.verify(gamma), costs.cycle(gamma)
        e, e_alpha = float(measured[gamma]), expected_tokens_constant(alpha, gamma)
        rows.append({"gamma": gamma, "batch_size": batch_size, "E": e, "c": c, "c_first": c_first, "draft": draft,
                     "verify": g, "overhead": o, "cost": cost, "predicted_speedup": e * costs.ar / cost,
                     "alpha": alpha, "E_constant_alpha": e_alpha, "constant_alpha_speedup": e_alpha * costs.ar / cost,
                     "seed_speedup": e_alpha / seed.cycle(gamma)})
    return pd.DataFrame(rows)


def fit(profile: Profile | Mapping[str, Any] | str | Path, traces: pd.DataFrame, gammas: Iterable[int] | None = None,
        batch_size: int = 1, method: str = "expected") -> pd.DataFrame:
    """The cost model from a profile and traces (never from the runs it predicts): one row per γ.

    ``gammas`` defaults to 1..max_gamma of the traces (bounded by the profile's max_positions − 1). Costs at a
    batch size the profile did not measure are interpolated by :class:`spectune.costmodel.profile.Profile`.
    """
    profile = as_profile(profile)
    joint = joint_from_traces(traces, method)
    if gammas is None:
        gammas = range(1, min(len(joint), profile.max_positions - 1) + 1)
    return predict(joint, profile, gammas, batch_size)

