"""Hugging Face's classic heuristic schedule for the number of assistant tokens (a published baseline)."""

from __future__ import annotations

import torch

from policies.rows import RowTracker
from spectune.engine.policy import CycleFeedback, DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError
from spectune.options import check_gamma


class HFHeuristic(DraftLengthPolicy):
    """transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 after a cycle in which every
    draft was accepted, else −1 (floor 1). Applied per batch: it grows only if all rows accepted all.
    The grid's γ is the start value; ``max_gamma`` caps growth.
    """

    name = "hf-heuristic"

    def __init__(self, gamma: int, max_gamma: int) -> None:
        check_gamma(gamma, "the hf-heuristic start")
        if not (isinstance(max_gamma, int) and not isinstance(max_gamma, bool) and gamma <= max_gamma):
            raise SpectuneError(f"hf-heuristic gamma={gamma!r}, policy.max_gamma={max_gamma!r} are invalid: "
                                "need integers with 1 <= gamma <= max_gamma")
        self.start, self.max_gamma, self.gamma = gamma, max_gamma, gamma

    def begin_cycle(self, batch_size: int) -> int:
        return self.gamma

    def observe(self, feedback: CycleFeedback) -> None:
        all_in = all(a == d for a, d in zip(feedback.num_accepted, feedback.num_drafts, strict=True))
        self.gamma = min(self.max_gamma, self.gamma + 2) if all_in else max(1, self.gamma - 1)

    def reset(self) -> None:
        self.gamma = self.start

    def describe(self) -> dict:
        return {"name": self.name, "start": self.start, "max_gamma": self.max_gamma}


class HFHeuristicTransient(DraftLengthPolicy):
    """transformers' ``"heuristic_transient"``: the same +2/−1 schedule, restarted at its start value for every
    request (transformers keeps "heuristic" across ``generate`` calls and resets "heuristic_transient" after each).

    With several requests in flight each row follows its own schedule: the cycle's ceiling is the largest row
    value, and rows below it stop drafting at their own length. Requests are told apart by the ids
    ``before_cycle`` gives (then a step where no row stops costs no host sync), else by :class:`RowTracker` at
    step 0.
    """

    name = "hf-heuristic-transient"

    def __init__(self, gamma: int, max_gamma: int) -> None:
        check_gamma(gamma, "the hf-heuristic-transient start")
        if not (isinstance(max_gamma, int) and not isinstance(max_gamma, bool) and gamma <= max_gamma):
            raise SpectuneError(f"hf-heuristic-transient gamma={gamma!r}, policy.max_gamma={max_gamma!r} are invalid: "
                                "need integers with 1 <= gamma <= max_gamma")
        self.start, self.max_gamma = gamma, max_gamma
        self.rows = RowTracker()
        self.gammas: dict[int, int] = {}  # slot -> its request's current schedule value

    def before_cycle(self, rows: list[int], request_ids: list[int], context_lengths: list[int] | None = None) -> None:
        new = self.rows.see_cycle(rows, request_ids, context_lengths)
        self.gammas = {row: self.start if row in new else self.gammas.get(row, self.start) for row in rows}

    def begin_cycle(self, batch_size: int) -> int:
        self.rows.begin_cycle()
        if self.rows.told:
            return max(self.gammas.values(), default=self.start)
        ceiling = max([self.start, *self.gammas.values()])
        # At least 2 so that step 0 is shown to the policy (new requests are seen there); rows stop at their own γ.
        return min(self.max_gamma, max(2, ceiling)) if self.max_gamma >= 2 else 1

    def continue_drafting(self, step: DraftStep) -> torch.Tensor | None:
        if step.step == 0 and not self.rows.told:
            self.rows.on_step(step)
            busy = self.rows.busy_rows()
            self.gammas = {row: self.start if row in self.rows.new_rows else self.gammas.get(row, self.start)
                           for row in busy}
        if self.rows.told and all(gamma > step.step + 1 for gamma in self.gammas.values()):
            return None  # nobody stops here: no host sync
        limit = torch.tensor([self.gammas.get(row, 0) for row in range(step.active.shape[0])],
                             device=step.active.device)
        return limit > step.step + 1

    def observe(self, feedback: CycleFeedback) -> None:
        for row, _, drafts, accepted, _ in self.rows.outcomes(feedback):
            current = self.gammas.get(row, self.start)
            self.gammas[row] = min(self.max_gamma, current + 2) if accepted == drafts else max(1, current - 1)

    def reset(self) -> None:
        self.rows.reset()
        self.gammas = {}

    def describe(self) -> dict:
        return {"name": self.name, "start": self.start, "max_gamma": self.max_gamma, "per": "request"}
