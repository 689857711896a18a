"""A UCB bandit over the draft length (BanditSpec, ICML 2025: UCBSpec), one bandit per batch size.

Each arm is a γ; the reward of a cycle is its throughput, tokens emitted per second of the whole cycle (draft,
verify and the engine's own work, synchronised), as BanditSpec rewards tokens per synchronised wall-second.
Rewards are divided by the largest reward seen at that batch size so they lie in [0, 1] as UCB1 assumes.
The arm γ = 0 ("do not speculate this cycle") is a plain target step, which can win under load; ``min_gamma``
sets the lowest arm.
"""

from __future__ import annotations

import math

from spectune.engine.policy import CycleFeedback, DraftLengthPolicy
from spectune.errors import SpectuneError
from spectune.options import check_gamma


class UCBBandit(DraftLengthPolicy):
    """UCB1 over γ ∈ ``min_gamma``..γ (the grid's value is the largest arm), separately per batch size.

    Every arm is played once (smallest first), then the arm maximising mean + ``exploration``·√(2 ln t / n).
    """

    name = "bandit"

    def __init__(self, gamma: int, min_gamma: int, exploration: float) -> None:
        check_gamma(gamma, "the bandit's largest arm")
        if not (isinstance(min_gamma, int) and not isinstance(min_gamma, bool) and 0 <= min_gamma <= gamma):
            raise SpectuneError(f"bandit gamma={gamma!r}, policy.min_gamma={min_gamma!r} are invalid: "
                                "need integers with 0 <= min_gamma <= gamma and gamma >= 1")
        if isinstance(exploration, bool) or not isinstance(exploration, int | float) or exploration < 0:
            raise SpectuneError(f"policy.exploration={exploration!r} is invalid: must be a number >= 0")
        self.arms = list(range(min_gamma, gamma + 1))
        self.exploration = float(exploration)
        self.reset()

    def reset(self) -> None:
        self.counts: dict[int, list[int]] = {}  # batch size -> plays per arm
        self.sums: dict[int, list[float]] = {}  # batch size -> summed raw reward (tokens/s) per arm
        self.best: dict[int, float] = {}  # batch size -> largest reward seen (normaliser)
        self.last: tuple[int, int] | None = None  # (batch size, arm index) of the cycle in flight

    def choose(self, batch_size: int) -> int:
        counts = self.counts.setdefault(batch_size, [0] * len(self.arms))
        sums = self.sums.setdefault(batch_size, [0.0] * len(self.arms))
        for index, count in enumerate(counts):
            if count == 0:
                return index
        total, scale = sum(counts), self.best.get(batch_size, 0.0) or 1.0
        scores = [sums[i] / counts[i] / scale + self.exploration * math.sqrt(2 * math.log(total) / counts[i])
                  for i in range(len(self.arms))]
        return max(range(len(self.arms)), key=lambda i: (scores[i], -i))  # ties to the smaller γ

    def begin_cycle(self, batch_size: int) -> int:
        index = self.choose(batch_size)
        self.last = (batch_size, index)
        return self.arms[index]

    def observe(self, feedback: CycleFeedback) -> None:
        if self.last is None or feedback.cycle_s <= 0:
            return
        batch_size, index = self.last
        reward = (sum(feedback.num_accepted) + len(feedback.num_accepted)) / feedback.cycle_s
        self.counts[batch_size][index] += 1
        self.sums[batch_size][index] += reward
        self.best[batch_size] = max(self.best.get(batch_size, 0.0), reward)
        self.last = None

    def estimates(self, batch_size: int) -> dict[int, float]:
        """Mean reward (tokens/s) per arm played at ``batch_size``."""
        counts, sums = self.counts.get(batch_size, []), self.sums.get(batch_size, [])
        return {self.arms[i]: sums[i] / counts[i] for i in range(len(counts)) if counts[i]}

    def describe(self) -> dict:
        return {"name": self.name, "arms": self.arms, "exploration": self.exploration, "reward": "tokens/s",
                "per": "batch size"}
