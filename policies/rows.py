"""Per-slot bookkeeping for policies that learn per row (per request) from what the engine tells them.

The protocol reports a cycle's outcome as lists over the busy rows (:class:`CycleFeedback`) with the slot of each
(``rows``) and its request (``request_ids``): the engine's session and the replay both give them, and a feedback
without ``rows`` is refused (:meth:`RowTracker.observe`) rather than its slots guessed. :meth:`RowTracker.outcomes`
is the one opening of every per-row policy's ``observe``: (slot, request, drafts, accepted) per listed row.

New requests are announced by ``before_cycle`` (:meth:`RowTracker.see_cycle`); a caller that does not call it
leaves them to be recovered from what a policy is shown: an empty slot has context length 0 (its cache was
cleared), so the busy slots are the rows with a positive context at the first draft step, and a row whose context
is not the one its previous cycle led to (context + accepted + 1) holds a new request. That needs the first
:class:`DraftStep` of every cycle, so policies using this tracker ask for a ceiling of at least 2 and stop rows
themselves: a row that stops at step 0 costs no extra draft forward (the proposer breaks when no row is left
drafting).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

import torch

from spectune.engine.policy import CycleFeedback, DraftLengthPolicy, DraftStep
from spectune.errors import SpectuneError

log = logging.getLogger(__name__)


class RowOutcome(NamedTuple):
    """One listed row of a cycle's feedback: its slot, the request it served, its drafts and accepted drafts, and its
    shadow acceptance test when it verified nothing (:attr:`CycleFeedback.shadow_accepted`)."""

    slot: int
    request_id: int
    drafts: int
    accepted: int
    shadow: int | None = None


class RowTracker:
    """Remembers, per cycle, each slot's context and the draft signals seen at each step (host tensors).

    After :meth:`observe` the caller gets, per busy slot: its number of drafts, accepted drafts, the signals of
    the positions that were shown to the policy, and whether the slot started a new request this cycle.
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names = tuple(names)
        self.reset()

    def reset(self) -> None:
        self.context: torch.Tensor | None = None  # [B] this cycle's context lengths, None before step 0
        self._lengths: list[int] = []  # the same as ints
        self.steps: list[dict[str, torch.Tensor]] = []  # per step: name -> [B] host tensor
        self.expected: dict[int, int] = {}  # slot -> context its next cycle starts at if the request continues
        self.new_rows: set[int] = set()  # slots whose request began before this cycle
        self.serving: dict[int, int] = {}  # slot -> request it serves this cycle (see_cycle)
        self.announced: dict[int, int] = {}  # slot -> context length before this cycle (see_cycle), when given
        self.told = False  # see_cycle was called: the caller names each cycle's requests (else found at step 0)

    def see_cycle(self, rows: list[int], request_ids: list[int],
                  context_lengths: list[int] | None = None) -> set[int]:
        """What ``before_cycle`` tells a policy: each busy slot's request and, when given, its context length.
        Returns the slots whose request is new this cycle (a slot serving another request than last cycle)."""
        serving = dict(zip(rows, request_ids, strict=True))
        new = {row for row, rid in serving.items() if self.serving.get(row) != rid}
        self.serving = serving
        self.announced = dict(zip(rows, context_lengths, strict=True)) if context_lengths is not None else {}
        self.told = True
        return new

    def begin_cycle(self) -> None:
        self.context, self.steps, self._lengths = None, [], []

    def on_step(self, step: DraftStep) -> None:
        """Record one draft step; at step 0 detect which busy slots hold a new request."""
        if step.step == 0:
            self.see_context(step.context_length)
        values = {}
        for name in self.names:
            value = getattr(step, name)
            if value is not None:
                values[name] = value.detach().to("cpu", torch.float64)
        self.steps.append(values)

    def see_context(self, context_length: torch.Tensor) -> None:
        """This cycle's context lengths (any draft step shows them): which busy slots hold a new request."""
        self.context = context_length.detach().to("cpu", torch.long)
        self._lengths = self.context.tolist()  # plain ints: per-row tensor indexing costs µs each, between forwards
        self.new_rows = {row for row in self.busy_rows() if self.expected.get(row) != self._lengths[row]}

    @property
    def lengths(self) -> list[int]:
        """This cycle's context length per slot as ints (empty before its first draft step is seen)."""
        return self._lengths

    def busy_rows(self) -> list[int]:
        return [] if self.context is None else [row for row, length in enumerate(self._lengths) if length > 0]

    def observe(self, feedback: CycleFeedback) -> list[int]:
        """The slot of each row listed in ``feedback`` (its ``rows``, mandatory), remembering where each slot's next
        cycle should start (a cycle that showed no draft step starts where the previous one led)."""
        if feedback.rows is None:
            raise SpectuneError("CycleFeedback.rows is None: a per-row policy needs the slot of each listed row "
                                "(the engine's session and the replay give it; hand-built feedback must too)")
        rows = [int(row) for row in feedback.rows]
        start = {row: self._lengths[row] if self.context is not None else self.expected.get(row) for row in rows}
        self.expected = {row: start[row] + accepted + 1
                         for row, accepted in zip(rows, feedback.num_accepted, strict=True) if start[row] is not None}
        return rows

    def outcomes(self, feedback: CycleFeedback) -> list[RowOutcome]:
        """:meth:`observe`, then each listed row's outcome; its request is ``feedback.request_ids``' (else the one
        ``see_cycle`` named for the slot, else -1 - slot: a slot's own stream)."""
        rows = self.observe(feedback)
        ids = feedback.request_ids or [self.serving.get(row, -1 - row) for row in rows]
        shadows = feedback.shadow_accepted or [None] * len(rows)
        return [RowOutcome(row, int(rid), int(drafts), int(accepted), shadow) for row, rid, drafts, accepted, shadow
                in zip(rows, ids, feedback.num_drafts, feedback.num_accepted, shadows, strict=True)]

    def signal(self, name: str, row: int, position: int) -> float | None:
        """The signal ``name`` of slot ``row`` at 1-based draft ``position``, if the policy was shown it."""
        if position - 1 >= len(self.steps) or name not in self.steps[position - 1]:
            return None
        return float(self.steps[position - 1][name][row])


class RowLimits(DraftLengthPolicy):
    """A policy that decides every busy row's γ before drafting (in ``before_cycle``), 0 for a row that drafts
    nothing: the batch drafts to the deepest row's γ, each row stops at its own (a host sync only at a step where
    some row stops) and rows that chose 0 are cut to no draft when drafting ends (they drafted the batch's first
    step). Subclasses set :attr:`limits` (slot -> γ) in ``before_cycle`` through :meth:`set_limits`, or at the
    first draft step (the controller, once a model-free draft shows its match): where every limit then lies at or
    below the drafts made, drafting ends there. The cut reads the policy's own state, never the target: the
    sampler stays exact."""

    limits: dict[int, int]
    first_stop: int = 0

    def set_limits(self, limits: dict[int, int]) -> None:
        self.limits = limits
        self.first_stop = min(limits.values(), default=0)

    def begin_cycle(self, batch_size: int) -> int:
        return max(self.limits.values(), default=0)

    def continue_drafting(self, step: DraftStep) -> torch.Tensor | None:
        done = step.step + 1  # drafts each row has now
        # Limits set after drafting began (a policy deciding at the first step's match) may all lie at or below this
        # step: then every row stops now, rather than drafting on to the ceiling only to be cut to nothing.
        deepest = max(self.limits.values(), default=0)
        if done < self.first_stop or (deepest > done and all(g != done for g in self.limits.values())):
            return None  # nobody stops here: no host sync
        limit = torch.tensor([self.limits.get(row, 0) for row in range(step.active.shape[0])],
                             device=step.active.device)
        return limit > done

    def end_drafting(self, step: DraftStep) -> list[int] | None:
        if self.first_stop > 0:
            return None  # every row keeps what it drafted (each stopped at its own γ)
        return [self.limits.get(row, 0) for row in range(step.active.shape[0])]
