"""The observation vector of the draft-depth environment — its one definition.

The depth environments (replay and live) and any policy that acts inside the engine (e.g. a PPO policy
trained on them) build the same vector with :func:`depth_observation`, in this order:

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
"""

from __future__ import annotations

import numpy as np

from harness.engine.policy import DRAFT_SIGNALS

OBS_FIELDS: tuple[str, ...] = (*DRAFT_SIGNALS, "position", "context_length", "batch_size", "recent_acceptance",
                               "c", "g")
SCALE: dict[str, float] = {"entropy": 10.0, "position": 10.0, "context_length": 1000.0, "batch_size": 32.0}
OBS_HIGH = 1e4  # every field is >= 0; a finite bound keeps gymnasium's checker quiet
assert OBS_FIELDS[:4] == tuple(DRAFT_SIGNALS)


def depth_observation(token_prob, entropy, margin, cum_prob, position, context_length, batch_size,
                      recent_acceptance, c, g) -> np.ndarray:
    """The vector for one row (scalars → [10]) or many rows (arrays [B] → [B, 10]), float32."""
    values = (token_prob, np.asarray(entropy) / SCALE["entropy"], margin, cum_prob,
              np.asarray(position) / SCALE["position"], np.asarray(context_length) / SCALE["context_length"],
              np.asarray(batch_size) / SCALE["batch_size"], recent_acceptance, c, g)
    return np.stack(np.broadcast_arrays(*[np.asarray(v, dtype=np.float32) for v in values]), axis=-1)
