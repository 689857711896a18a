"""Per-slot bookkeeping for policies that learn per row (per request) from what the engine tells them.

The protocol reports a cycle's outcome as lists over the *busy* rows (:class:`CycleFeedback`), without their
slot numbers, and does not announce new requests. Both can be recovered from what a policy is shown: an empty
slot has context length 0 (its cache was cleared), so the busy slots are the rows with a positive context at the
first draft step, in slot order — the order the engine lists them in. A row whose context is not the one its
previous cycle led to (context + accepted + 1) holds a new request. This needs the first :class:`DraftStep` of
every cycle, so policies using this tracker ask for a ceiling of at least 2 and stop rows themselves: a row that
stops at step 0 costs no extra draft forward (the proposer breaks when no row is left drafting).

When the engine reports ``CycleFeedback.rows`` (the slot of each listed row, as Session does), those are used.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from harness.engine.policy import CycleFeedback, DraftStep

log = logging.getLogger(__name__)


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

    def rows_of(self, feedback: CycleFeedback) -> list[int] | None:
        """Slot of each row listed in ``feedback``; None when this cycle cannot be mapped (then learn nothing)."""
        explicit = getattr(feedback, "rows", None)
        if explicit is not None:
            return list(explicit)
        rows = self.busy_rows()
        if len(rows) == len(feedback.num_drafts):
            return rows
        log.debug("cycle feedback lists %d rows, %d busy slots seen: not learning from it",
                  len(feedback.num_drafts), len(rows))
        return None

    def observe(self, feedback: CycleFeedback) -> list[int] | None:
        """Map the feedback to slots and remember where each slot's next cycle should start.

        A cycle that showed no draft step (γ ≤ 1, or no speculation) is mapped to the slots of the previous
        cycle when their number matches (a request that ended and one admitted into its slot in between look
        the same: an approximation only such cycles make)."""
        explicit = getattr(feedback, "rows", None) is not None
        rows = self.rows_of(feedback) if self.context is not None or explicit else None
        if rows is None and self.context is None and len(self.expected) == len(feedback.num_drafts):
            rows = sorted(self.expected)
        if rows is None:
            self.expected = {}
            return None
        start = {row: self._lengths[row] if self.context is not None else self.expected.get(row) for row in rows}
        self.expected = {row: start[row] + accepted + 1
                         for row, accepted in zip(rows, feedback.num_accepted, strict=True) if start[row] is not None}
        return rows

    def signal(self, name: str, row: int, position: int) -> float | None:
        """The signal ``name`` of slot ``row`` at 1-based draft ``position``, if the policy was shown it."""
        if position - 1 >= len(self.steps) or name not in self.steps[position - 1]:
            return None
        return float(self.steps[position - 1][name][row])
