"""What drafts, as the session sees it: the :class:`Proposer` protocol, the :class:`Proposal` it hands over, and what
it is built from (:class:`EngineParts`, :class:`DraftSpec`).

A session drives one proposer over its slots, one cycle at a time (``session.py``), and calls nothing else of it:

    prefill(rows, prompts, ...)       a request enters a slot (its prompt: the target's prefill has run)
    begin(last)                       a cycle opens after ``last`` [B], each row's newest emitted token
    step(uniforms, signals) × k       k draft steps (k ≥ 1), the policy deciding after each
      stop_rows(keep)                 rows that draft no further this cycle
    cut(kept)                         (optional) verify only a prefix of each row's drafts
    finish() -> Proposal              the cycle's drafts and their laws
    rollback(...) | skip(...)         after verification: the accepted drafts (or, with nothing drafted, a plain
                                      target step) become part of each row's sequence
    clear(row)                        a request left its slot

Invariant between cycles: the proposer knows every token of each row's sequence up to, not including, ``last``
(the newest emitted token, which no model has fed yet). A proposer with a cache may hold some of them back as
*pending*, fed with ``last`` at its next first step: a model draft's final draft of a cycle that accepted all
its drafts (it sampled that draft and never fed it: gpt-fast's observation), and every token of a cycle without
speculation (γ = 0); a feature-reading draft's accepted drafts, fed again with the target's own features
(``feature_proposer.py``). A model-free proposer holds the tokens themselves (``proposers/chain.py``).

A cycle in which no row has anything to draft is a plain target step: ``finish`` returns zero columns and the
session verifies nothing. Randomness is the session's: a draw uses the uniforms handed to :meth:`Proposer.step`
(keyed by request and position), so what a proposer drafts never depends on what else ran.

A model stands in the engine's draft slot as itself (the engine builds its proposer: ``factory.py``); a draft that
needs no model stands there as a :class:`DraftSpec`, which builds its own (``proposers/``: one module each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from spectune.engine.clock import DeviceClock
    from spectune.engine.kv import SlotKV
    from spectune.sampling import RowSampling, SamplingParams
    from spectune.sampling.rejection import RejectionSampler


@dataclass
class Proposal:
    """A cycle's drafts: what the target verifies and the exact sampler judges."""

    tokens: torch.Tensor  # [B, γ] drafted tokens
    probs: torch.Tensor  # [B, γ, V] the draft laws they were sampled from (a point mass where none was sampled)
    num_drafts: torch.Tensor | None  # [B] per-row count when rows drafted different lengths, else None


class Proposer(Protocol):
    """What the session calls of whatever drafts (the model draft, the feature-reading draft, a model-free draft).

    Shapes: B is the session's slots (every row takes part in every call; idle rows are masked by ``active``),
    V the sampled vocabulary.
    """

    kv: SlotKV | None  # the draft's own per-slot cache, compacted with the target's; None: it keeps no cache
    reports: frozenset[str]  # the signals (spectune.engine.policy.SIGNALS) its step computes when asked for them
    support: torch.Tensor | None  # ids outside which its laws are exactly 0 (a reduced vocabulary); None: all
    running: torch.Tensor  # [B] bool: rows still drafting in the open cycle
    # (row, last) -> the first token the row would have drafted after ``last`` had its cycle drafted (None: no
    # chain), read from the state before the cycle's rollback or skip: a shadow acceptance test for a row that
    # verified nothing (CycleFeedback.shadow_accepted). None: a proposer that cannot tell (a draft model)
    first_draft: Callable[[int, int], int | None] | None

    def prefill(self, rows: list[int], prompts: list[list[int]], features: torch.Tensor | None = None,
                limits: list[int] | None = None) -> None:
        """Requests enter slots ``rows`` with these prompts (their first token is the session's next ``last``).
        ``features``: the target's prefill features [len(rows), longest prompt, H], left-padded, for a draft that
        reads them; ``limits``: the requests' max_new_tokens, for a draft that clips its chains to them."""

    def begin(self, last: torch.Tensor) -> None:
        """Open a cycle after ``last`` [B] (each row's newest emitted token); every row is drafting."""

    def step(self, uniforms: torch.Tensor | None, signals: frozenset[str] = frozenset()
             ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One draft step for every row: (drafted tokens [B], their law q [B, V], the ``signals`` asked for by name,
        [B] each). ``uniforms`` [B]: the keyed draws of this step (None under greedy sampling)."""

    def stop_rows(self, keep: torch.Tensor) -> torch.Tensor:
        """Rows where ``keep`` [B] is False draft no further this cycle; returns :attr:`running`."""

    def cut(self, kept: torch.Tensor) -> None:
        """Keep only the first ``kept[b]`` drafts of row b (a verification budget chosen after drafting). A cut that
        keeps nothing anywhere leaves the proposer as if the cycle had drafted nothing (:attr:`gamma` 0), so the
        session takes a plain target step and calls :meth:`skip`."""

    @property
    def gamma(self) -> int:
        """Draft steps taken in the open cycle (after :meth:`cut`: the deepest row's kept drafts)."""

    @property
    def num_drafts(self) -> torch.Tensor:
        """[B] drafts each row holds in the open cycle."""

    def finish(self) -> Proposal:
        """The open cycle's drafts (it may propose fewer columns than :attr:`gamma` where no row drafted deeper)."""

    def rollback(self, context_length: torch.Tensor, accepted: torch.Tensor, proposal: Proposal,
                 active: torch.Tensor, accepted_host: list[int], features: torch.Tensor | None = None) -> None:
        """After verification: ``last`` and each active row's ``accepted`` [B] first drafts join its sequence, which
        held ``context_length`` [B] tokens before the cycle. ``accepted_host``: the busy rows' counts, already on
        the host; ``features``: the verification's target features [B, γ + 1, H], for a draft that reads them."""

    def skip(self, last: torch.Tensor, active: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """A cycle without speculation (nothing drafted, or all cut): ``last`` joins each active row's sequence.
        ``features``: the target step's features [B, 1, H], for a draft that reads them."""

    def clear(self, row: int) -> None:
        """The request in slot ``row`` has finished: forget it."""

    def use_sampling(self, sampling: SamplingParams | RowSampling) -> None:
        """The batch's law changed (a slot took a request with other settings): a draft that samples warps its laws
        with it from the next step on; a draft of point masses warps nothing and ignores it."""


class EngineParts(Protocol):
    """What a session runs on, and what a proposer is built from: the models, sampling, sampler, device and clock,
    and the cache factory (:class:`~spectune.engine.engine.Engine` is one; nothing here needs the engine's loop)."""

    target: torch.nn.Module
    draft: torch.nn.Module | DraftSpec | None  # a draft model, or a draft that needs none
    sampling: SamplingParams
    sampler: RejectionSampler
    device: torch.device
    clock: DeviceClock
    eos: set[int]
    seed: int
    compact_waste: float
    vocab_size: int | None

    def cache(self, model: torch.nn.Module, batch: int) -> SlotKV: ...


@runtime_checkable
class DraftSpec(Protocol):
    """A draft that needs no model, as it stands in the engine's draft slot: what it is (its settings, the ids it
    never proposes), and how a session gets its proposer (``proposers/``: prompt lookup, suffix decoding)."""

    stop_ids: tuple[int, ...]  # besides the engine's EOS ids: never proposed (the tokenizer's special ids)

    def proposer(self, parts: EngineParts, batch: int) -> Proposer:
        """A fresh proposer over ``batch`` slots for one session on ``parts``."""
