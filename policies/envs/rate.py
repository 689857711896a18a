"""ρ, the running tokens/s that the environments' rewards ``tokens − ρ·time`` charge time at.

Summed over cycles, ``tokens − ρ·time`` ranks policies by throughput when ρ is the rate the policy itself
reaches (Dinkelbach's step for a ratio objective). A cumulative average over all of training lags far
behind a policy that improves: early, exploring cycles keep ρ low for tens of thousands of steps, time looks
cheap, and drafting to the ceiling looks best. So ρ is a ratio of exponentially decayed sums over about the
last ``window`` cycles, per (profile, batch size), started from one autoregressive step (the prior).
"""

from __future__ import annotations

WINDOW = 2000  # cycles; the decay per cycle is 1 - 1/WINDOW


class RunningRate:
    """ρ per key: decayed Σ tokens / decayed Σ seconds, with a prior of one AR step (``prior_tokens`` in
    ``prior_s``) at the first cycle of a key."""

    def __init__(self, window: int = WINDOW) -> None:
        self.decay = 1.0 - 1.0 / window
        self._sums: dict[tuple[int, int], list[float]] = {}

    def clear(self) -> None:
        self._sums.clear()

    def charge(self, key: tuple[int, int], prior_tokens: float, prior_s: float, tokens: float, time_s: float) -> float:
        """``tokens − ρ·time_s`` with ρ as it stood before this cycle; then this cycle joins ρ."""
        sums = self._sums.setdefault(key, [prior_tokens, prior_s])
        reward = tokens - sums[0] / sums[1] * time_s
        sums[0] = self.decay * sums[0] + tokens
        sums[1] = self.decay * sums[1] + time_s
        return reward
