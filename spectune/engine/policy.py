"""The small interface between the engine and a draft-length policy (vLLM-style separation).

It lives with the engine so the engine never imports ``policies``: the adaptive policies there
implement this protocol from above. :class:`FixedGamma`, the grid's own policy, lives here too.

Per cycle the engine asks :meth:`DraftLengthPolicy.begin_cycle` for a ceiling γ, drafts step by step
and, after each step, offers the policy the draft's signals so it may stop some rows early; when drafting ends
it shows the last step (:meth:`DraftLengthPolicy.end_drafting`, optional), which may cut each row's chain to a
prefix before verification; after verification it reports what happened through :meth:`DraftLengthPolicy.observe`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from spectune.options import check_gamma
from spectune.sampling import SamplingParams

# Signals computed from the draft law q at each step. Each costs time on every draft step, so the engine
# computes only those its policy declares (`DraftLengthPolicy.signals`); one name per signal, used alike in
# DraftStep, in traces and in the gymnasium environments.
DRAFT_SIGNALS: dict[str, str] = {
    "token_prob": "q(x) of the token just drafted",
    "entropy": "entropy of q at this step, nats",
    "margin": "top-1 minus top-2 probability of q",
    "cum_prob": "product of token_prob over this cycle's drafts so far",
}
# Signals of what a model-free draft matched (prompt lookup, suffix decoding: spectune/engine/proposers/lookup.py,
# suffix.py).
# Their q is a point mass, so DRAFT_SIGNALS say nothing there (entropy 0, token_prob 1); these say how good the match
# is. Found with the chain at the cycle's first draft step; [B] each, 0 on a row without a chain this cycle; a model
# draft computes none of them (DraftStep leaves them None, and its traces have no such columns). Computed, like the
# q-derived ones, only when asked for by name.
MATCH_SIGNALS: dict[str, str] = {
    "match_length": "tokens of the context's end that the chain's match covers; the same at every step of the cycle",
    "matches": "earlier occurrences of that matched suffix followed by a token; the same at every step of the cycle",
    "suffix_score": "count(child) / count(node) of the token just drafted, in the trie that proposed it (prompt "
                    "lookup copies one occurrence: 1); 0 where the row drafted nothing at this step",
    "suffix_prob": "product of suffix_score over this cycle's drafts so far; 0 where the row drafted nothing at "
                   "this step",
}
SIGNALS: dict[str, str] = {**DRAFT_SIGNALS, **MATCH_SIGNALS}  # every signal a DraftStep can carry, in this order


def acceptance_trials(accepted: int, drafted: int) -> int:
    """Acceptance tests a cycle really ran: its accepted drafts plus the first rejection, if there was one.

    Σ accepted / Σ trials estimates the per-token acceptance rate whatever γ the cycles drafted (the censored
    geometric estimate); Σ accepted / Σ drafted does not: it falls with the γ, so a policy trained on traces
    drafted to the ceiling would see a lower "recent acceptance" than the same requests give it live.
    """
    return accepted + (1 if accepted < drafted else 0)


RECENT_PRIOR = 0.5  # the recent acceptance of a request before its first cycle


class AcceptanceHistory:
    """Recent acceptance per key (a request id, or the slot a policy sees): accepted drafts over acceptance trials
    (:func:`acceptance_trials`) of the key's previous cycles, :data:`RECENT_PRIOR` before any. The one definition
    the traces record, the live γ environment observes and the PPO policy computes inside the engine."""

    def __init__(self) -> None:
        self.totals: dict[int, tuple[int, int]] = {}  # key -> (accepted, trials)

    def add(self, key: int, accepted: int, drafted: int, shadow: int | None = None) -> None:
        """One cycle of ``key``: ``accepted`` of its ``drafted`` drafts. A cycle that verified nothing adds nothing,
        unless ``shadow`` says whether its model-free draft's first token equalled the token the target emitted
        (:attr:`CycleFeedback.shadow_accepted`): then it is one acceptance test, as a chain of one would have run."""
        if drafted == 0 and shadow is not None:
            accepted, drafted = int(shadow), 1
        old_accepted, old_trials = self.totals.get(key, (0, 0))
        self.totals[key] = (old_accepted + accepted, old_trials + acceptance_trials(accepted, drafted))

    def rate(self, key: int) -> float:
        accepted, trials = self.totals.get(key, (0, 0))
        return accepted / trials if trials else RECENT_PRIOR

    def forget(self, key: int) -> None:
        """``key`` starts over (its slot took a new request)."""
        self.totals.pop(key, None)

    def clear(self) -> None:
        self.totals.clear()


@dataclass(frozen=True)
class DraftStep:
    """What a policy may read after draft step ``step`` (0-based; the draft position is ``step + 1``).

    The q-derived signals (:data:`DRAFT_SIGNALS`) are ``None`` unless the policy declared them; the match signals
    (:data:`MATCH_SIGNALS`) too, and always under a draft model, which has no match.
    """

    step: int
    active: torch.Tensor  # [B] bool: rows still drafting before this step's decision
    context_length: torch.Tensor  # [B] tokens in each row's sequence before this cycle
    batch_size: int  # slots of the batch this cycle (the padded shape the models run)
    busy_rows: int | None = None  # slots serving a request this cycle (None: not known, e.g. a replayed trace)
    sampling: tuple[SamplingParams | None, ...] | None = None  # per slot, its request's settings (None: idle slot)
    token_prob: torch.Tensor | None = None  # [B]
    entropy: torch.Tensor | None = None  # [B]
    margin: torch.Tensor | None = None  # [B]
    cum_prob: torch.Tensor | None = None  # [B]
    match_length: torch.Tensor | None = None  # [B]
    matches: torch.Tensor | None = None  # [B]
    suffix_score: torch.Tensor | None = None  # [B]
    suffix_prob: torch.Tensor | None = None  # [B]


def draft_signals(q: torch.Tensor, x: torch.Tensor, names: frozenset[str],
                  cum_prob: torch.Tensor | None, support: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The requested q-derived signals of one draft step (q: [B, V] law, x: [B] drafted tokens).

    ``support``: the ids outside which q is exactly 0 (a reduced-vocabulary draft head). Entropy and the top-2
    margin are then computed over those columns only: the same values (the entropy up to float32 summation
    order), over a quarter of the columns for smollm2's draft (12,288 of 49,152 ids; measured inside the engine by
    the archived probe ``signal_cost.py``, bench/results/archive/probes.json: 0.42–0.46 → 0.26–0.27 ms a step at
    8 rows)."""
    out: dict[str, torch.Tensor] = {}
    if not names:
        return out
    token_prob = q.gather(1, x.unsqueeze(1)).squeeze(1) if names & {"token_prob", "cum_prob"} else None
    if "token_prob" in names:
        out["token_prob"] = token_prob
    dense = q if support is None or not names & {"entropy", "margin"} else q.index_select(1, support)
    if "entropy" in names:
        out["entropy"] = -(dense * dense.clamp(min=1e-30).log()).sum(-1)
    if "margin" in names:
        top = dense.topk(2, dim=-1).values if dense.shape[-1] > 1 else torch.cat([dense, torch.zeros_like(dense)],
                                                                                  -1)
        out["margin"] = top[:, 0] - top[:, 1]
    if "cum_prob" in names:
        out["cum_prob"] = token_prob if cum_prob is None else cum_prob * token_prob
    return out


@dataclass(frozen=True)
class CycleFeedback:
    """What one draft-and-verify cycle did, per busy row (in slot order), and what it cost (synchronised seconds).

    ``rows`` and ``request_ids`` name the slot and the request of each listed row (None when the caller does not
    know them, e.g. hand-built feedback in tests).
    """

    num_drafts: list[int]
    num_accepted: list[int]
    draft_s: float
    verify_s: float
    cycle_s: float
    rows: list[int] | None = None
    request_ids: list[int] | None = None
    # Per listed row, only for a policy that asks (:attr:`DraftLengthPolicy.shadow_trials`) under a model-free draft:
    # on a row that verified nothing, 1 if the draft's first token equals the token the target emitted, 0 if not,
    # None without a chain (or on a row that drafted). A point mass δ_x is accepted with probability p(x), the chance
    # the target's own draw is x, so this is a fair acceptance test of that token at any temperature, bought with a
    # chain search instead of a verification; a policy that stops drafting keeps measuring acceptance.
    shadow_accepted: list[int | None] | None = None


class DraftLengthPolicy(ABC):
    """Chooses how many tokens to draft. Stateless policies ignore :meth:`observe`."""

    name: str = "policy"
    signals: frozenset[str] = frozenset()  # names from SIGNALS that continue_drafting reads
    reads_context: bool = False  # True: before_cycle is given each busy slot's context length (a host read)
    shadow_trials: bool = False  # True: observe is told CycleFeedback.shadow_accepted (model-free drafts only)
    reads_sampling: bool = False  # True: before_cycle is given each busy slot's sampling settings (``sampling=``)

    def before_cycle(self, rows: list[int], request_ids: list[int], context_lengths: list[int] | None = None,
                     sampling: list[SamplingParams] | None = None) -> None:
        """The cycle about to start: its busy slots, the request each serves and, for a policy that
        :attr:`reads_context`, each slot's tokens before the cycle (called before :meth:`begin_cycle`; optional).
        A policy with per-slot state learns here which slots took a new request; with the context it can decide a
        new request's first cycle before anything is drafted, as its environment does. A policy that
        :attr:`reads_sampling` is also given each busy slot's temperature, top-k and top-p (``sampling``, in the
        order of ``rows``; host values, no device read): with ``len(rows)``, the batch's busy rows, it can choose
        γ = 0 in :meth:`begin_cycle` (no drafting at all) or cut some rows to 0 in :meth:`end_drafting`, where
        :class:`DraftStep` carries the same settings per slot."""

    @abstractmethod
    def begin_cycle(self, batch_size: int) -> int:
        """γ ceiling for this cycle (≥ 1); 0 would mean no drafting (the autoregressive baseline)."""

    def continue_drafting(self, step: DraftStep) -> torch.Tensor | None:
        """Rows that keep drafting after ``step``; ``None`` = all of them (costs no host sync)."""
        return None

    @property
    def reads_steps(self) -> bool:
        """Whether this policy overrides :meth:`continue_drafting` (otherwise the drafting loop neither calls it nor
        builds the :class:`DraftStep` it would be shown)."""
        return type(self).continue_drafting is not DraftLengthPolicy.continue_drafting

    @property
    def reads_last_step(self) -> bool:
        """Whether this policy overrides :meth:`end_drafting` (only then is the last step's signals computed)."""
        return type(self).end_drafting is not DraftLengthPolicy.end_drafting

    def end_drafting(self, step: DraftStep) -> list[int] | None:
        """The cycle's last draft step, once drafting has ended; per-slot kept lengths to verify, or None (all).

        Optional (the default does nothing, and costs nothing: the session calls it, and computes ``signals``
        for the last step, only for policies that override it). At the ceiling γ this is the only place a
        policy sees the last step's signals (:meth:`continue_drafting` is not called after it); when drafting
        ended because every row stopped, ``step`` is the one :meth:`continue_drafting` was just shown. The
        returned lengths (clamped to each row's drafts) keep a prefix of each row's chain, as a verification
        budget does. A cut that depends only on the draft (its tokens and signals, never the target) leaves
        the sampler exact: which drafts are verified is fixed before the target is read.
        """
        return None

    def observe(self, feedback: CycleFeedback) -> None:
        """Learn from a finished cycle."""

    def reset(self) -> None:
        """Forget per-run state (called before each run)."""

    def describe(self) -> dict:
        return {"name": self.name}


class Drafter(Protocol):
    """What :func:`draft_cycle` drives: the open cycle of a live session, or a recorded cycle replayed."""

    def draft(self, signals: frozenset[str]) -> DraftStep:
        """One draft step for every row still drafting (computing ``signals``); the step the policy is shown."""

    def stop(self, keep: torch.Tensor) -> bool:
        """Rows where ``keep`` is False draft no further; whether any row still drafts."""

    def cut(self, kept: list[int]) -> None:
        """Verify only the first ``kept[slot]`` drafts of each row (clamped to the row's drafts)."""


def draft_cycle(policy: DraftLengthPolicy, gamma: int, drafter: Drafter,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """The drafting loop, one definition for the engine and the replay: up to ``gamma`` draft steps; after every
    step but the last the policy may stop rows (:meth:`~DraftLengthPolicy.continue_drafting`); a policy that
    reads the last step is shown it and may cut each row's chain (:meth:`~DraftLengthPolicy.end_drafting`).
    Signals are computed only for what the policy reads (the last step's only for those that read it). Returns
    the seconds spent in the policy's calls."""
    wanted = frozenset(policy.signals)
    final = policy.reads_last_step
    decides = policy.reads_steps  # False: continue_drafting is the default's (all rows go on): not called
    inside = 0.0
    state = None
    for step in range(gamma):
        last = step == gamma - 1
        state = drafter.draft(wanted if final or not last else frozenset())
        if last or not decides:  # no continue/stop decision after the last draft, nor by a policy that makes none
            continue
        start = clock()
        keep = policy.continue_drafting(state)
        inside += clock() - start
        if keep is not None and not drafter.stop(keep):  # a host sync, paid by policies that stop rows
            break
    if final and state is not None:
        start = clock()
        kept = policy.end_drafting(state)
        if kept is not None:
            drafter.cut(kept)
        inside += clock() - start
    return inside


class FixedGamma(DraftLengthPolicy):
    """Draft exactly γ tokens every cycle: the grid-search baseline everything is compared to."""

    name = "fixed"

    def __init__(self, gamma: int) -> None:
        self.gamma = check_gamma(gamma)

    def begin_cycle(self, batch_size: int) -> int:
        return self.gamma

    def describe(self) -> dict:
        return {"name": self.name, "gamma": self.gamma}
