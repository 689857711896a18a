"""Replay any draft-length policy on recorded traces, cycle by cycle, as the engine would drive it.

:func:`replay_gammas` walks the recorded cycles of a :class:`~policies.envs.data.TraceSet` in trace order and,
for each one (all its rows: one batch), runs the policy protocol as ``Session.step`` does — ``before_cycle`` and
``begin_cycle``, then the engine's own drafting loop (:func:`spectune.engine.policy.draft_cycle`) over a
:class:`RecordedCycle`: ``begin_cycle(rows)`` gives the ceiling (capped at ``max_gamma``; 0 = no speculation,
every row γ 0); after
every draft step but the last, a :class:`~spectune.engine.policy.DraftStep` with the recorded signals of that
position (only those the policy declares in ``policy.signals``, the others ``None``), the recorded context
lengths in the recorded slots, and the still-drafting rows as ``active``; rows the policy stops draft no further,
nor do rows whose recorded chain ended (a model-free draft's traces record where: ``drafted``), as in the engine.
When the policy overrides ``end_drafting`` it is shown the last draft step, as the engine shows it, and may keep a
prefix of each row's chain. A row's γ is the number of drafts verified: those it took, or the prefix kept (a
cut is then scored as if the row had drafted only that prefix, which undercounts its draft time). ``observe`` then
gets the realised outcome of that γ (accepted = min(γ, leading accepted), exact for the recorded cycle, see
``spectune.engine.traces``) and the profile's cost of the cycle's batch shape: the batch drafts until its deepest
row stops and verifies that many positions plus one (padded), as the engine does.

The approximation: across cycles the replay follows the recording, not the policy. A live run that stopped a
cycle elsewhere would start its next cycle at another context (other signals, other outcomes, under batching
another batch composition); here the next cycle's context, signals and rows are always the recorded ones, which
were drafted to ``max_gamma``. Exact per cycle, approximate per run; the cycle the live engine runs first for
each request is the recorded one (it starts at the same context), which is what the tests compare.

The replay's accounting lives here too: :func:`replay_costs` (what each entry is charged at every γ: its share
of its batch's cycle, :meth:`spectune.costmodel.profile.CycleCosts.cycle_s`, for the system's tokens/s, or the whole
cycle for a request's decode tok/s), :func:`oracle_gammas` (the hindsight-best γ) and
:func:`replay_scores`. :func:`replay_table` scores many policies this way with :func:`replay_scores` (tokens/s on
realised outcomes), next to a fixed γ and the hindsight oracle.

Rows of a batch draft in lockstep: a cycle lasts until its deepest row stops and verifies that many positions plus
one, so every row of it is charged the cycle at that γ (:func:`cycle_gammas`; ``lockstep=True``, the default),
and the oracle chooses one γ per cycle (deeper rows are free once the cycle pays for them). Charged at its own
γ instead (``lockstep=False``, as the γ environment charges a row), a row that drafts deeper than the
others looks cheaper than it is: on smollm2 at concurrency 2 and 4 that made per-step PPO's replay 13.7 and 16.6
points too optimistic relative to fixed γ = 1 (the live decode rates of ``policies.evaluate``). At batch 1 the two
agree.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from policies.envs.data import TraceSet
from spectune.costmodel.profile import Profile
from spectune.engine.policy import SIGNALS, CycleFeedback, DraftLengthPolicy, DraftStep, draft_cycle
from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams

log = logging.getLogger(__name__)

SIGNAL_INDEX = {name: i for i, name in enumerate(SIGNALS)}  # the last axis of TraceSet.signals (its first 4 or all)
TABLE_COLUMNS = ("policy", "tok_s", "vs_best_fixed_pct", "mean_gamma", "acceptance_length", "gap_to_oracle_pct")
# what replay_scores adds with its oracles (they depend on the traces and costs only, not on the γ scored)
ORACLE_KEYS = ("oracle_tok_s", "oracle_vs_best_fixed_pct", "informed_oracle_tok_s", "informed_oracle_vs_best_fixed_pct")


RATES = ("system", "request")  # what Σ tokens / Σ charged seconds measures (replay_costs)


def replay_costs(traces: TraceSet, profile: Profile, max_gamma: int, rate: str = "system") -> np.ndarray:
    """[N, max_gamma + 1] seconds charged to each recorded (cycle, row) at each γ.

    ``rate="system"``: each row its share of its batch's cycle (cycle / b), as the environments charge it; Σ tokens
    / Σ seconds is then the system's tokens/s. ``rate="request"``: each row the whole cycle, the time its request
    waited for it; Σ tokens / Σ seconds is then tokens per second of decode time pooled over requests, the live
    decode tok/s (tokens after the first / (E2EL − TTFT)). The two agree at batch 1.

    A model-free draft's cycle drafts no deeper than its longest chain (``TraceSet.chain``), so a γ beyond it is
    charged that depth: the engine verifies no further (a draft model's chains always reach the traces' max_gamma)."""
    if rate not in RATES:
        raise SpectuneError(f"rate={rate!r} is unknown: choose one of {', '.join(RATES)}")
    out = np.zeros((traces.count, max_gamma + 1))
    depth = np.minimum(np.arange(max_gamma + 1)[None, :], cycle_gammas(traces, traces.chain)[:, None])  # [N, G+1]
    for batch in np.unique(traces.batch_size):
        rows = traces.batch_size == batch
        b = int(batch)
        costs = profile.costs(b)
        share = b if rate == "system" else 1
        out[rows] = np.array([costs.cycle_s(k) / share for k in range(max_gamma + 1)])[depth[rows]]
    return out


def realised_tokens(traces: TraceSet, max_gamma: int) -> np.ndarray:
    """[N, max_gamma + 1] tokens each recorded cycle's row emits at γ 0..max_gamma on its realised outcome: the
    accepted prefix (at most the γ) plus the one token the target adds."""
    return np.minimum(traces.leading[:, None], np.arange(max_gamma + 1)[None, :]) + 1.0


def cycle_gammas(traces: TraceSet, gammas: np.ndarray) -> np.ndarray:
    """[N] the γ each entry's cycle ran to: the deepest of its rows (the batch drafts until that row stops and
    verifies that many positions plus one, padded), what every row of the cycle waits for."""
    starts = traces.cycle_starts
    return np.repeat(np.maximum.reduceat(np.asarray(gammas, dtype=int), starts), np.diff(np.append(starts,
                                                                                                   traces.count)))


def oracle_gammas(tokens: np.ndarray, costs: np.ndarray, iterations: int = 50,
                  starts: np.ndarray | None = None) -> np.ndarray:
    """The hindsight-best γ of every recorded cycle for total tokens / total time (Dinkelbach's method):
    with ρ the rate so far, each cycle takes argmax_k tokens_k − ρ·cost_k; ρ ← the new rate, until it stops
    rising. Exact for this ratio objective. Under greedy decoding and cheap verification it is the cycle's first
    mismatch; when verifying more positions costs more than it returns it stops earlier. With ``starts`` (the
    first entry of each batch cycle, ``TraceSet.cycle_starts``) one γ per batch cycle, its rows' tokens and costs
    summed: the lockstep oracle."""
    if starts is not None:
        counts = np.diff(np.append(starts, len(tokens)))
        per_cycle = oracle_gammas(np.add.reduceat(tokens, starts, axis=0), np.add.reduceat(costs, starts, axis=0),
                                  iterations)
        return np.repeat(per_cycle, counts)
    rate, gammas = 0.0, np.zeros(len(tokens), dtype=int)
    index = np.arange(len(tokens))
    for _ in range(iterations):
        gammas = np.argmax(tokens - rate * costs, axis=1)
        new = float(tokens[index, gammas].sum() / costs[index, gammas].sum())
        if new <= rate * (1 + 1e-12):
            break
        rate = new
    return gammas


def replay_scores(traces: TraceSet, profile: Profile, max_gamma: int, gammas: np.ndarray,
                  rate: str = "system", lockstep: bool = True, oracles: bool = True) -> dict[str, Any]:
    """Replay tokens/s, on realised outcomes, of the given per-entry γ, of every fixed γ, of the
    hindsight oracle (:func:`oracle_gammas`) and of the informed oracle (the same choice on expected outcomes);
    ``rate`` says which tokens/s (:func:`replay_costs`): the oracles maximise that one. ``lockstep``: each row is
    charged its batch cycle at the cycle's deepest row's γ, and the oracles choose per batch cycle (see the
    module); else each row at its own γ. ``oracles=False`` leaves both oracles out (callers that score many
    γ choices on the same traces need them once: they depend on the traces and costs only)."""
    costs = replay_costs(traces, profile, max_gamma, rate)
    index = np.arange(traces.count)
    tokens = realised_tokens(traces, max_gamma)
    fixed = tokens.sum(0) / costs.sum(0)
    best = int(np.argmax(fixed))
    charged = cycle_gammas(traces, gammas) if lockstep else np.asarray(gammas)
    rate = float(tokens[index, gammas].sum() / costs[index, charged].sum())
    scores = {"policy_tok_s": rate, "best_fixed_gamma": best, "best_fixed_tok_s": float(fixed[best]),
              "vs_best_fixed_pct": 100 * (rate / fixed[best] - 1), "mean_gamma": float(np.mean(gammas)),
              "fixed_tok_s": fixed.tolist()}
    if not oracles:
        return scores
    starts = traces.cycle_starts if lockstep else None
    oracle = oracle_gammas(tokens, costs, starts=starts)
    # The same oracle choosing on expected outcomes (Σ Π accept_prob: the target's verdict odds on the drafted
    # tokens, without the acceptance coin), scored on the realised ones: the headroom that is not luck. A policy
    # reading only the draft knows less than this, so it bounds what any of them can gain.
    informed = oracle_gammas(traces.expected[:, : max_gamma + 1] + 1.0, costs, starts=starts)
    oracle_rate = float(tokens[index, oracle].sum() / costs[index, oracle].sum())
    informed_rate = float(tokens[index, informed].sum() / costs[index, informed].sum())
    return {**scores, "oracle_tok_s": oracle_rate, "oracle_vs_best_fixed_pct": 100 * (oracle_rate / fixed[best] - 1),
            "informed_oracle_tok_s": informed_rate,
            "informed_oracle_vs_best_fixed_pct": 100 * (informed_rate / fixed[best] - 1)}


def check_replay_depth(traces: TraceSet, max_gamma: int, profile: Profile) -> int:
    """``max_gamma`` if the replay can go that deep: the traces recorded that deep and the profile verifies
    max_gamma + 1 positions."""
    limit = min(traces.max_gamma, profile.max_positions - 1)
    if isinstance(max_gamma, bool) or not isinstance(max_gamma, int | np.integer) or not 1 <= max_gamma <= limit:
        raise SpectuneError(f"max_gamma={max_gamma!r} is out of range: must be an integer in 1..{limit} (the "
                            f"traces' max_gamma {traces.max_gamma}, profile {profile.label!r} verifies up to "
                            f"{profile.max_positions} positions)")
    return int(max_gamma)


def slot_count(traces: TraceSet) -> int:
    """Slots of the recorded batch (the run's concurrency when the metadata holds it): DraftStep's width."""
    recorded = int(traces.metadata.get("concurrency") or 0)
    return max(recorded, int(traces.row.max()) + 1)


def _step(policy_signals: frozenset[str], traces: TraceSet, entries: slice, rows: torch.Tensor, slots: int,
          step: int, running: torch.Tensor, context: torch.Tensor) -> DraftStep:
    """The DraftStep the engine would show after draft step ``step`` of the recorded cycle ``entries``."""
    values = {}
    for name in policy_signals:
        if SIGNAL_INDEX[name] >= traces.signals.shape[-1]:  # a draft model's traces: no match signals (None, as live)
            continue
        column = torch.zeros(slots, dtype=torch.float64)  # idle slots: 0 (policies read only busy rows)
        column[rows] = torch.tensor(traces.signals[entries, step, SIGNAL_INDEX[name]])
        values[name] = column
    return DraftStep(step=step, active=running.clone(), context_length=context, batch_size=slots, **values)


def _feedback(traces: TraceSet, entries: slice, gammas: np.ndarray, profile: Profile, shadow: bool = False
              ) -> CycleFeedback:
    """What the engine reports after verifying the cycle at these per-row γ (profile costs, padded batch); with
    ``shadow``, as the engine reports it to a policy that asks for shadow acceptance tests."""
    batch, deepest = len(gammas), int(gammas.max())
    costs = profile.costs(batch)
    accepted = np.minimum(gammas, traces.leading[entries])
    shadows = None
    if shadow and traces.match_signals:  # model-free: a row that verified nothing learns if its first draft was right
        first = traces.accepted[entries, 0]
        chain = traces.chain[entries]
        shadows = [int(first[i]) if gammas[i] == 0 and chain[i] > 0 else None for i in range(batch)]
    return CycleFeedback([int(d) for d in gammas], [int(a) for a in accepted], float(costs.draft_s(deepest)),
                         float(costs.verify(deepest)), float(costs.cycle_s(deepest)),
                         rows=[int(r) for r in traces.row[entries]],
                         request_ids=[int(r) for r in traces.request_id[entries]], shadow_accepted=shadows)


class RecordedCycle:
    """A recorded cycle as :func:`~spectune.engine.policy.draft_cycle` drives it: each draft step shows the recorded
    signals of that position (those asked for; the others ``None``), the recorded context lengths in the recorded
    slots, and the rows still drafting as ``active``; ``drafts`` counts each slot's drafts (after a cut, the prefix
    kept)."""

    def __init__(self, traces: TraceSet, entries: slice, slots: int) -> None:
        self.traces, self.entries, self.slots = traces, entries, slots
        self.rows = torch.tensor(traces.row[entries], dtype=torch.long)
        self.running = torch.zeros(slots, dtype=torch.bool)
        self.running[self.rows] = True
        self.context = torch.zeros(slots, dtype=torch.long)  # idle slots have context 0, as the engine's caches
        self.context[self.rows] = torch.tensor(traces.context_length[entries], dtype=torch.long)
        self.drafts = torch.zeros(slots, dtype=torch.long)
        self.chain = torch.zeros(slots, dtype=torch.long)  # a model-free draft's chain may end before max_gamma
        self.chain[self.rows] = torch.tensor(traces.chain[entries], dtype=torch.long)
        self.steps = 0

    def draft(self, signals: frozenset[str]) -> DraftStep:
        self.running &= self.chain > self.steps  # as the live proposer: a row whose chain ended drafts no more
        self.drafts += self.running.long()
        self.steps += 1
        return _step(signals, self.traces, self.entries, self.rows, self.slots, self.steps - 1, self.running,
                     self.context)

    def stop(self, keep: torch.Tensor) -> bool:
        self.running &= keep.to("cpu", torch.bool)
        return bool(self.running.any())

    def cut(self, kept: list[int]) -> None:
        self.drafts = torch.minimum(self.drafts, torch.tensor([int(k) for k in kept], dtype=torch.long))


def replay_cycle(policy: DraftLengthPolicy, traces: TraceSet, entries: slice, max_gamma: int, slots: int,
                 sampling: Mapping[int, SamplingParams] | None = None) -> np.ndarray:
    """Per-row γ the policy chooses on one recorded cycle (begin_cycle, then the engine's drafting loop). A policy
    that reads each row's sampling settings is given them from ``sampling`` (by request id), as the engine does."""
    count = entries.stop - entries.start
    rows, ids = [int(r) for r in traces.row[entries]], [int(r) for r in traces.request_id[entries]]
    contexts = [int(c) for c in traces.context_length[entries]] if policy.reads_context else None
    if policy.reads_sampling and sampling is not None:
        policy.before_cycle(rows, ids, contexts, sampling=[sampling[i] for i in ids])
    else:
        policy.before_cycle(rows, ids, contexts)
    gamma = min(int(policy.begin_cycle(count)), max_gamma)
    if gamma <= 0:
        return np.zeros(count, dtype=int)
    cycle = RecordedCycle(traces, entries, slots)
    draft_cycle(policy, gamma, cycle)
    return cycle.drafts[cycle.rows].numpy().astype(int)


def replay_gammas(policy: DraftLengthPolicy, traces: TraceSet, max_gamma: int, profile: Profile,
                  sampling: Mapping[int, SamplingParams] | None = None) -> np.ndarray:
    """The γ ``policy`` chooses for every recorded (cycle, row), in TraceSet entry order (see the module).

    ``policy.reset()`` first; ``observe`` after every cycle with the realised outcome and ``profile``'s costs.
    ``sampling``: each request's settings by request id (traces do not record them), for a policy that reads them."""
    max_gamma = check_replay_depth(traces, max_gamma, profile)
    slots = slot_count(traces)
    policy.reset()
    gammas = np.zeros(traces.count, dtype=int)
    for entries in traces.cycle_slices:
        gammas[entries] = replay_cycle(policy, traces, entries, max_gamma, slots, sampling)
        policy.observe(_feedback(traces, entries, gammas[entries], profile, policy.shadow_trials))
    return gammas


def _row(name: str, traces: TraceSet, gammas: np.ndarray, rate: float, reference: float, oracle: float) -> dict:
    accepted = np.minimum(gammas, traces.leading)
    return {"policy": name, "tok_s": rate, "vs_best_fixed_pct": 100 * (rate / reference - 1),
            "mean_gamma": float(gammas.mean()), "acceptance_length": float(1 + accepted.mean()),
            "gap_to_oracle_pct": 100 * (rate / oracle - 1)}


def replay_table(policies: Mapping[str, DraftLengthPolicy], traces: TraceSet, profile: Profile, max_gamma: int,
                 fixed_gamma: int | None = None) -> pd.DataFrame:
    """One row per policy (replayed with :func:`replay_gammas`), then the reference fixed γ and the oracle.

    Columns: replay tok/s (realised outcomes), % vs the reference fixed γ, mean γ, acceptance length
    (tokens per cycle and row: 1 + mean accepted), % gap to the hindsight oracle (≤ 0). The reference fixed γ
    is ``fixed_gamma`` when given (chosen beforehand, e.g. on training traces) — then the best fixed γ in
    hindsight on these traces is listed too — else the best in hindsight. ``attrs`` hold the γ used.
    """
    max_gamma = check_replay_depth(traces, max_gamma, profile)
    if fixed_gamma is not None and not 0 <= fixed_gamma <= max_gamma:
        raise SpectuneError(f"fixed_gamma={fixed_gamma!r} is out of range: must be in 0..{max_gamma}")
    base = replay_scores(traces, profile, max_gamma, np.zeros(traces.count, dtype=int), oracles=False)
    fixed = np.asarray(base["fixed_tok_s"])
    tokens = realised_tokens(traces, max_gamma)
    costs = replay_costs(traces, profile, max_gamma)
    best = oracle_gammas(tokens, costs, starts=traces.cycle_starts)
    index = np.arange(traces.count)
    oracle = float(tokens[index, best].sum() / costs[index, best].sum())
    hindsight = int(base["best_fixed_gamma"])
    reference = hindsight if fixed_gamma is None else int(fixed_gamma)
    rows = []
    for name, policy in policies.items():
        gammas = replay_gammas(policy, traces, max_gamma, profile)
        scores = replay_scores(traces, profile, max_gamma, gammas, oracles=False)
        rows.append(_row(name, traces, gammas, scores["policy_tok_s"], fixed[reference], oracle))
        log.info("replayed %s: %.1f tok/s, mean γ %.2f", name, scores["policy_tok_s"], gammas.mean())
    label = "best fixed γ (hindsight)" if fixed_gamma is None else "fixed γ chosen beforehand"
    rows.append(_row(f"{label}: {reference}", traces, np.full(traces.count, reference), fixed[reference],
                     fixed[reference], oracle))
    if fixed_gamma is not None:
        rows.append(_row(f"best fixed γ (hindsight): {hindsight}", traces, np.full(traces.count, hindsight),
                         fixed[hindsight], fixed[reference], oracle))
    rows.append(_row("oracle (hindsight, per cycle)", traces, best, oracle, fixed[reference], oracle))
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    table.attrs.update(reference_gamma=reference, hindsight_gamma=hindsight, max_gamma=max_gamma,
                       profile=profile.label, entries=traces.count)
    return table
