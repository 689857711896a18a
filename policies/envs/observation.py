"""The observations of the environments and of the PPO policies inside the engine — their one definition.

**Depth** (``spectune/DraftDepth-v0``, :class:`policies.ppo.PPODepth`): the raw values of :data:`OBS_FIELDS`
(any subset, in a policy file's order) become the vector with :func:`scale_depth` — divided by :data:`SCALE` in
float64, then float32 — whether they come from a recorded cycle, the live session or a :class:`DraftStep` inside
the engine. :func:`depth_observation` is the same by name. The fields, in order:

====  =====================  ==========================================================================
idx   name                   value (scaling)
====  =====================  ==========================================================================
0     token_prob             q(x) of the token just drafted (0 before the first draft step)
1     entropy                entropy of q at this step, nats / 10
2     margin                 top-1 minus top-2 probability of q
3     cum_prob               product of token_prob over this cycle's drafts (1 before the first step)
4     position               draft steps taken this cycle / 10 (LTD's step/10)
5     context_length         tokens in the row's sequence before the cycle / 1000 (LTD's seq_len/1000)
6     batch_size             rows in flight / 32
7     recent_acceptance      accepted / (accepted + rejections) over the row's previous cycles (0.5 before any)
8     c                      profile's draft step over AR step, c(b)
9     g                      profile's verification of one more position, g(position + 1, b)
====  =====================  ==========================================================================

Indices 0–3 are :data:`harness.engine.policy.DRAFT_SIGNALS` (same names, same order).

**Cycle** (``spectune/CycleDepth-v0``, :class:`policies.ppo_cycle.PPOCycle`): the depth is chosen once, before
drafting, so the observation holds only what is known then: :data:`CYCLE_FIELDS`, the depth observation's
fields 5–9 with their values at step 0 (g is g(1, b)), scaled alike (:func:`cycle_observation`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.engine.policy import DRAFT_SIGNALS

OBS_FIELDS: tuple[str, ...] = (*DRAFT_SIGNALS, "position", "context_length", "batch_size", "recent_acceptance",
                               "c", "g")
SCALE: dict[str, float] = {"entropy": 10.0, "position": 10.0, "context_length": 1000.0, "batch_size": 32.0}
OBS_HIGH = 1e4  # every field is >= 0; a finite bound keeps gymnasium's checker quiet
assert OBS_FIELDS[:4] == tuple(DRAFT_SIGNALS)


FIELD = {name: i for i, name in enumerate(OBS_FIELDS)}  # name -> index in the default vector


def scales(fields: tuple[str, ...] = OBS_FIELDS) -> np.ndarray:
    """The divisor of each field (1 for those used as they are), float64."""
    return np.array([SCALE.get(name, 1.0) for name in fields], dtype=np.float64)


def scale_depth(raw: np.ndarray, fields: tuple[str, ...] = OBS_FIELDS, out: np.ndarray | None = None) -> np.ndarray:
    """The observation from raw values [..., F] of ``fields``: divided by their scales in float64, then float32
    (into ``out`` when given)."""
    scaled = np.asarray(raw, dtype=np.float64) / scales(fields)
    if out is None:
        return scaled.astype(np.float32)
    out[...] = scaled
    return out


def scale_rows(columns: Sequence[Sequence[float]], divisors: Sequence[float]) -> np.ndarray:
    """:func:`scale_depth` for values given column by column as Python numbers ([F] columns of [B] each, the
    divisors of :func:`scales` as floats): the same float64 division and float32 result, bit for bit, in one array
    construction. The engine-side policies use it: their decisions run between forwards, on caches the models have
    just evicted, where every numpy call costs tens of µs."""
    rows = len(columns[0]) if columns else 0
    return np.array([[column[row] / divisor for column, divisor in zip(columns, divisors, strict=True)]
                     for row in range(rows)], dtype=np.float32)


def depth_observation(token_prob, entropy, margin, cum_prob, position, context_length, batch_size,
                      recent_acceptance, c, g) -> np.ndarray:
    """:func:`scale_depth` by name, for one row (scalars → [10]) or many rows (arrays [B] → [B, 10])."""
    values = (token_prob, entropy, margin, cum_prob, position, context_length, batch_size, recent_acceptance, c, g)
    return scale_depth(np.stack(np.broadcast_arrays(*[np.asarray(v, dtype=np.float64) for v in values]), axis=-1))


# -- the cycle observation --------------------------------------------------------------------------------
CYCLE_FIELDS: tuple[str, ...] = ("context_length", "batch_size", "recent_acceptance", "c", "g")
assert set(CYCLE_FIELDS) < set(OBS_FIELDS)


def cycle_observation(context_length, batch_size, recent_acceptance, c, g) -> np.ndarray:
    """The cycle policy's observation, known before drafting (g = g(1, b): verifying one drafted position), scaled
    by :func:`scale_depth`'s scales; one row (scalars → [5]) or many (arrays [B] → [B, 5])."""
    values = (context_length, batch_size, recent_acceptance, c, g)
    return scale_depth(np.stack(np.broadcast_arrays(*[np.asarray(v, dtype=np.float64) for v in values]), axis=-1),
                       CYCLE_FIELDS)


# -- the size observation and cut ---------------------------------------------------------------------------
def size_observation(cum: np.ndarray, depths: np.ndarray, batch: int, c: float, g: float,
                     obs_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The size policy's observation (``spectune/VerifySize-v0``, :class:`policies.ppo_size.PPOSize`) and the drafted
    tokens' order (flat indices into ``cum`` [B, D]): the cumulative draft probabilities of the drafted tokens in
    decreasing order (``obs_tokens``, zero padded), then batch size / 32, c(B), g(D, B).

    Only drafted positions (j < depths[b]) count; ties go to earlier rows, then earlier positions (a stable
    sort), so since cumulative probabilities never grow along a chain each row's kept tokens are a prefix."""
    width = cum.shape[1] if cum.ndim == 2 else 0
    drafted = (np.arange(width)[None, :] < np.asarray(depths)[:, None]).ravel()
    flat = np.asarray(cum, dtype=np.float64).reshape(-1)
    candidates = np.flatnonzero(drafted)
    order = candidates[np.argsort(-flat[candidates], kind="stable")]
    obs = np.zeros(obs_tokens + 3, dtype=np.float32)
    top = flat[order][:obs_tokens]
    obs[: len(top)] = top
    obs[-3:] = (batch / SCALE["batch_size"], c, g)
    return obs, order


def size_cut(order: np.ndarray, action: int, levels: int, depths: np.ndarray, width: int) -> np.ndarray:
    """Per-row kept lengths for budget level ``action``: the first round(a / (levels−1) · Σ depths) of ``order``
    (flat indices into a [B, width] grid)."""
    depths = np.asarray(depths, dtype=int)
    budget = round(int(action) / (levels - 1) * int(depths.sum()))
    keep = np.zeros(len(depths) * width, dtype=int)
    keep[order[:budget]] = 1
    return keep.reshape(len(depths), width).sum(1)
