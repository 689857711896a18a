"""A generation session: admits requests and runs one draft-and-verify cycle at a time.

:meth:`Engine.run` is a loop over :meth:`Session.step`; the trace task, the live gymnasium environments
and the benchmarks drive the same object phase by phase instead:

    session.begin_cycle()            admit arrived requests (prefill → first token); False if none in flight
    session.draft_step(signals)      one draft step for every row (draw with the keyed uniforms)
    session.stop_rows(keep)          rows that draft no further this cycle
    session.cut(kept)                (optional) verify only a prefix of each row's drafts (Session.step: the
                                     policy's end_drafting, shown the last draft step, returns them)
    outcome = session.verify()       target scores, exact sampler decides, both caches roll back, tokens emitted

A cycle with no draft step (the policy returned γ = 0: "don't speculate now") is a plain target step for
every row; the draft catches up on those tokens in its next first step (the proposer's contract: ``proposer.py``).

Randomness is keyed by (seed, stream, request, position) (``randomness.py``), so a cycle's outcome at
γ = k is the same whatever γ was chosen, and two policies run on the same requests are paired.

Every clock read synchronises the device; inside a cycle the only host sync is reading the verdict
(plus one per draft step for policies that stop rows early).

Each request samples with its own settings (``Request.sampling``; None: the engine's). The batch's law is one
:class:`~spectune.sampling.SamplingParams` while every busy row shares its settings (the path a uniform batch has
always taken: no per-row tensor) and a :class:`~spectune.sampling.RowSampling` while they differ; it is rebuilt
only when a slot's request changes, and both models' laws, every draw and so the exact rejection sampler (which
works row by row on the laws it is given) follow each row's own settings.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from spectune.engine.clock import MemoryTracker
from spectune.engine.factory import proposer_for
from spectune.engine.features import reads_features
from spectune.engine.policy import CycleFeedback, DraftLengthPolicy, DraftStep, draft_cycle
from spectune.engine.proposer import EngineParts, Proposal, Proposer
from spectune.engine.randomness import KeyedUniforms
from spectune.engine.records import CycleRecord, Request, RequestRecord
from spectune.engine.scorer import TargetScorer
from spectune.sampling import RowSampling, SamplingParams, batch_sampling, draw, select_rows

DRAFT_BLOCK = 8  # draft uniforms gathered at a cycle's first step (widened when the cycle drafts deeper)


@dataclass
class CycleOutcome:
    """What one cycle did. Per-row lists are indexed by slot (length = batch); ``rows`` are the active ones.

    ``proposal``, ``target_laws`` and ``accept_uniforms`` are kept only when the session was opened with
    ``keep_laws=True`` (traces, tests): they are large.
    """

    cycle: int
    rows: list[int]
    request_ids: dict[int, int]
    gamma: int
    num_drafts: list[int]
    accepted: list[int]
    emitted: dict[int, int]
    context_length: list[int]
    output_position: list[int]
    draft_s: float
    verify_s: float
    rest_s: float
    draft_step_s: list[float] = field(default_factory=list)  # draft seconds up to and including step i
    proposal: Proposal | None = None
    target_laws: torch.Tensor | None = None  # [B, γ+1, V]
    accept_uniforms: torch.Tensor | None = None  # [B, γ]
    shadow_accepted: dict[int, int | None] | None = None  # per active row, when verify was asked for shadow tests

    @property
    def cycle_s(self) -> float:
        return self.draft_s + self.verify_s + self.rest_s


@dataclass(frozen=True)
class CycleView:
    """The open cycle as a driver sees it (the live environments): which slots are busy, each busy slot's context
    length before the cycle, and the request each busy slot serves."""

    rows: list[int]
    context_length: torch.Tensor  # [B] tokens in each slot's sequence before the cycle (0: idle slot)
    request_ids: dict[int, int]  # busy slot -> request id


@dataclass
class RunRecords:
    requests: list[RequestRecord]
    cycles: list[CycleRecord]
    memory: dict = field(default_factory=dict)
    wall_s: float = 0.0


class Session:
    """One run of ``requests`` through ``engine`` with at most ``concurrency`` in flight.

    Args:
        engine: the models, sampler, device, clock and seed.
        requests: the requests, served in order of arrival (then id).
        policy: the draft-length policy for :meth:`step`; ``None`` (or no draft model) is the
            autoregressive baseline on the same code path.
        concurrency: slots of the continuous batch.
        on_finish: called with each request's record when it finishes.
        keep_laws: keep each cycle's drafts, laws and uniforms in its :class:`CycleOutcome`.
        reset_policy: forget the policy's per-run state first (False: a later block of one run goes on with
            what the policy learned in the earlier blocks).
    """

    @torch.inference_mode()
    def __init__(self, engine: EngineParts, requests: list[Request], policy: DraftLengthPolicy | None, concurrency: int,
                 on_finish: Callable[[RequestRecord], None] | None = None, keep_laws: bool = False,
                 reset_policy: bool = True) -> None:
        self.engine, self.policy, self.batch = engine, policy, concurrency
        self.speculative = engine.draft is not None
        self.on_finish, self.keep_laws = on_finish, keep_laws
        self.clock, self.device, self.sampling = engine.clock, engine.device, engine.sampling
        features = reads_features(engine.draft)  # an EAGLE-style draft: the scorer keeps the target's features
        self.scorer = TargetScorer(engine.target, engine.cache(engine.target, concurrency), engine.sampling,
                                   engine.vocab_size, keep_features=features)
        self.proposer: Proposer | None = proposer_for(engine, concurrency) if self.speculative else None
        self.request_sampling = {r.request_id: r.sampling or engine.sampling for r in requests}
        # Greedy draws need no random numbers; one request that samples needs the tables (greedy rows ignore them).
        sampled = any(not s.greedy for s in self.request_sampling.values()) if requests else not engine.sampling.greedy
        self.keys = KeyedUniforms(engine.seed, concurrency, self.device, enabled=sampled)
        if policy is not None and reset_policy:
            policy.reset()
        self.memory = MemoryTracker(self.device)
        self.waiting = deque(sorted(requests, key=lambda r: (r.arrival_s or 0.0, r.request_id)))
        self.records = {r.request_id: RequestRecord.of(r, self.request_sampling[r.request_id]) for r in requests}
        self.slots: list[Request | None] = [None] * concurrency
        self.slot_sampling: tuple[SamplingParams | None, ...] = (None,) * concurrency  # each busy slot's settings
        self._law_stale = False  # a slot's request changed since the batch's law was built
        self.last = torch.zeros(concurrency, dtype=torch.long, device=self.device)
        self.position = torch.zeros(concurrency, dtype=torch.long, device=self.device)  # tokens emitted per row
        self.cycles: list[CycleRecord] = []
        self.cycle_index = 0
        self.start = self.clock.now()
        self._open = False

    # -- state -------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return not self.waiting and all(s is None for s in self.slots)

    @property
    def active_rows(self) -> list[int]:
        return [row for row in range(self.batch) if self.slots[row] is not None]

    def result(self) -> RunRecords:
        return RunRecords(list(self.records.values()), self.cycles, self.memory.report(), self.clock.now() - self.start)

    # -- admission and emission --------------------------------------------------------------------------
    def _finish(self, row: int, when: float) -> None:
        record = self.records[self.slots[row].request_id]
        record.finish_s = when
        self.slots[row] = None
        self._law_stale = True
        self.scorer.kv.clear(row)
        if self.proposer is not None:
            self.proposer.clear(row)
        if self.on_finish is not None:
            self.on_finish(record)

    def _emit(self, row: int, tokens: list[int], when: float) -> int:
        """Append tokens up to EOS / max_new_tokens; returns how many were really emitted."""
        request, record = self.slots[row], self.records[self.slots[row].request_id]
        count = 0
        for token in tokens:
            record.output_ids.append(token)
            record.token_times_s.append(when)
            count += 1
            if (token in self.engine.eos and not request.ignore_eos) or record.output_tokens >= request.max_new_tokens:
                self._finish(row, when)
                break
        return count

    def admit(self) -> list[int]:
        """Admit every arrived request a free slot can take: one batched prefill, then their first tokens."""
        now = self.clock.now() - self.start
        admitted: list[int] = []
        for row in range(self.batch):
            if self.slots[row] is None and self.waiting and (self.waiting[0].arrival_s or 0.0) <= now:
                request = self.slots[row] = self.waiting.popleft()
                record = self.records[request.request_id]
                record.admitted_s = now
                if record.arrival_s is None:  # closed loop: sent the moment a slot is free
                    record.arrival_s = now
                self.keys.load(row, request.request_id, request.max_new_tokens)
                admitted.append(row)
        if admitted or self._law_stale:
            self._set_law()
        if not admitted:
            return admitted
        prompts = [self.slots[row].input_ids for row in admitted]
        first_laws = self.scorer.prefill(admitted, prompts)
        if self.proposer is not None:
            self.proposer.prefill(admitted, prompts, self.scorer.features,
                                  limits=[self.slots[row].max_new_tokens for row in admitted])
        rows = torch.tensor(admitted, device=self.device)
        position0 = torch.zeros(self.batch, dtype=torch.long, device=self.device)
        first = draw(first_laws, select_rows(self.sampling, admitted), uniforms=self.keys.at("target", position0)[rows])
        self.last[rows] = first
        self.position[rows] = 1
        when = self.clock.now() - self.start
        for row, token in zip(admitted, first.tolist(), strict=True):
            self.records[self.slots[row].request_id].first_token_s = when
            self._emit(row, [token], when)
        return admitted

    def _set_law(self) -> None:
        """The batch's law from its busy slots' settings, handed to the scorer and to a draft model's proposer (a
        model-free draft proposes point masses and warps nothing). Host work only, and only when a slot changed.
        Untimed so far: the per-row path's cost (a divide, a sort where any row filters, a where on greedy rows, per
        warp) is what a run of mixed requests against the same requests sharing one setting would show."""
        self._law_stale = False
        self.slot_sampling = tuple(self.request_sampling[s.request_id] if s is not None else None for s in self.slots)
        busy = [s for s in self.slot_sampling if s is not None]
        law = batch_sampling(busy) if busy else self.engine.sampling
        if isinstance(law, RowSampling):  # idle slots take any law: they are never verified
            law = RowSampling.of([s or self.engine.sampling for s in self.slot_sampling], self.device)
        self.sampling = self.scorer.sampling = law
        if self.proposer is not None:
            self.proposer.use_sampling(law)

    # -- one cycle, phase by phase ----------------------------------------------------------------------
    @torch.inference_mode()
    def begin_cycle(self) -> bool:
        """Admit, then open a cycle over the busy slots. False when nothing is in flight (the caller loops)."""
        assert not self._open, "verify() the open cycle first"
        self.admit()
        rows = self.active_rows
        if not rows:  # nothing in flight (open loop, or requests done at their first token)
            if self.waiting:
                time.sleep(max(0.0, (self.waiting[0].arrival_s or 0.0) - (self.clock.now() - self.start)))
            return False
        self._rows = rows
        self._active = torch.zeros(self.batch, dtype=torch.bool, device=self.device)
        self._active[rows] = True
        self._context = self.scorer.kv.next_pos.clone()
        self._marks = [self.clock.mark()]
        self._open = True
        self._started = False
        return True

    @property
    def cycle(self) -> CycleView | None:
        """The open cycle (between :meth:`begin_cycle` and :meth:`verify`), or None when none is open."""
        if not self._open:
            return None
        return CycleView(list(self._rows), self._context, {row: self.slots[row].request_id for row in self._rows})

    @property
    def gamma(self) -> int:
        """Draft steps taken in the open cycle."""
        return self.proposer.gamma if self._started else 0

    @torch.inference_mode()
    def draft_step(self, signals: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
        """One draft step for every slot; returns the drafted tokens ``x``, their law ``q`` and ``signals``."""
        return self._draft_step(signals)

    def _draft_step(self, signals: frozenset[str]) -> dict[str, torch.Tensor]:
        """:meth:`draft_step` without entering inference mode (:meth:`step` is in it for the whole cycle: entering
        it per draft step cost a context manager's construction, entry and exit on every step's path)."""
        assert self._open
        if self._started:
            gamma = self.proposer.gamma
        else:
            self.proposer.begin(self.last)
            self._started, gamma = True, 0
        uniforms = None
        if self.keys.enabled:
            # The cycle's draft uniforms in one gather at its first step (positions fixed while drafting), split into
            # one column per step there: a later step picks its column from a tuple, with no tensor op.
            if gamma == 0 or gamma >= len(self._draft_u):
                self._draft_u = self.keys.at("draft", self.position, max(DRAFT_BLOCK, 2 * gamma)).unbind(1)
            uniforms = self._draft_u[gamma]
        x, q, out = self.proposer.step(uniforms, signals)
        self._marks.append(self.clock.mark())
        return {"x": x, "q": q, **out}

    @torch.inference_mode()
    def stop_rows(self, keep: torch.Tensor) -> torch.Tensor:
        """Rows where ``keep`` is False stop drafting; returns the rows still drafting ([B] bool)."""
        return self.proposer.stop_rows(keep)

    @torch.inference_mode()
    def cut(self, kept: list[int]) -> None:
        """Verify only the first ``kept[slot]`` drafts of each row (0: a plain target step for that row)."""
        assert self._open and self._started
        self.proposer.cut(torch.tensor(kept, dtype=torch.long, device=self.device))
        if self.proposer.gamma == 0:
            self._started = False

    def draft_state(self, signals: dict[str, torch.Tensor]) -> DraftStep:
        return DraftStep(step=self.proposer.gamma - 1, active=self.proposer.running, context_length=self._context,
                         batch_size=self.batch, busy_rows=len(self._rows), sampling=self.slot_sampling,
                         **{k: v for k, v in signals.items() if k not in ("x", "q")})

    @torch.inference_mode()
    def verify(self, gamma: int | None = None, shadow: bool = False) -> CycleOutcome:
        """Close the cycle: verify the drafts (or take a plain target step when none were drafted), emit.

        ``gamma`` is the ceiling the policy chose, recorded per cycle (default: the drafts made). ``shadow``: under a
        model-free draft, each row that verified nothing gets a shadow acceptance test (``shadow_accepted``).
        """
        assert self._open
        self._open = False
        active, context, rows = self._active, self._context, self._rows
        t1 = self._marks[-1]
        drafted = self.gamma
        proposal = target_laws = accept_u = None
        if drafted:
            proposal = self.proposer.finish()
            drafted = proposal.tokens.shape[1]  # a model-free draft proposes only as deep as its longest chain
        if drafted:
            target_laws = self.scorer.score(self.last, proposal.tokens)
            accept_u = self.keys.at("accept", self.position, drafted)
            verdict = self.engine.sampler(target_laws, proposal.probs, proposal.tokens, None, uniforms=accept_u,
                                          num_drafts=proposal.num_drafts,
                                          recovery_uniforms=self.keys.at("target", self.position, drafted + 1))
            accepted = verdict.num_accepted
            next_tokens, accepted_list = verdict.next_token.tolist(), accepted.tolist()  # the host sync
            drafts_list = proposal.tokens.tolist()
            num_drafts = (proposal.num_drafts.tolist() if proposal.num_drafts is not None else [drafted] * self.batch)
        else:
            laws = self.scorer.score(self.last, None)[:, 0]
            next_tok = draw(laws, self.sampling, uniforms=self.keys.at("target", self.position))
            accepted = torch.zeros(self.batch, dtype=torch.long, device=self.device)
            next_tokens, accepted_list = next_tok.tolist(), [0] * self.batch  # the host sync
            drafts_list, num_drafts = [[] for _ in range(self.batch)], [0] * self.batch
        context_list = context.tolist()  # ready since the sync above: reading it now costs no extra stall
        t2 = self.clock.mark()
        when = time.perf_counter() - self.start  # the tokens are on the host now: their emission time
        t0 = self._marks[0]
        draft_s, verify_s = self.clock.seconds(t0, t1), self.clock.seconds(t1, t2)
        step_s = [self.clock.seconds(t0, m) for m in self._marks[1:]]
        # before the rollback or skip below, the proposer still holds the cycle's starting state (charged to rest_s)
        shadows = self._shadows(rows, num_drafts, next_tokens) if shadow else None

        self.scorer.rollback(torch.where(active, context + accepted + 1, 0))
        if self.proposer is not None:
            if drafted:
                self.proposer.rollback(context, accepted, proposal, active, [accepted_list[r] for r in rows],
                                       self.scorer.features)
            else:
                self.proposer.skip(self.last, active, self.scorer.features)
        positions = self.position.tolist() if self.keep_laws else []  # traces only (a sync: fine off the clock)
        self.position = self.position + torch.where(active, accepted + 1, 0)
        self.last = torch.tensor(next_tokens, device=self.device)
        row_ids = {row: self.slots[row].request_id for row in rows}  # _emit() may free slots
        emitted = {row: self._emit(row, [*drafts_list[row][: accepted_list[row]], next_tokens[row]], when)
                   for row in rows}
        if self.scorer.kv.waste() > self.engine.compact_waste:
            self.scorer.kv.compact()
            if self.proposer is not None and self.proposer.kv is not None:
                self.proposer.kv.compact()
        self.memory.sample()
        rest_s = self.clock.seconds(t2, self.clock.mark())
        gamma = drafted if gamma is None else gamma
        outcome = CycleOutcome(self.cycle_index, rows, row_ids, gamma, num_drafts, accepted_list, emitted,
                               context_list, positions, draft_s, verify_s, rest_s, step_s, shadow_accepted=shadows)
        if self.keep_laws:
            outcome.proposal, outcome.target_laws, outcome.accept_uniforms = proposal, target_laws, accept_u
        self.cycles.extend(
            CycleRecord(cycle=self.cycle_index, request_id=row_ids[row], slot=row, batch_size=len(rows),
                        gamma=gamma, num_drafts=num_drafts[row], accepted=accepted_list[row],
                        emitted=emitted[row], draft_s=draft_s, verify_s=verify_s, rest_s=rest_s,
                        start_s=when - draft_s - verify_s)
            for row in rows)
        self.cycle_index += 1
        return outcome

    def _shadows(self, rows: list[int], num_drafts: list[int], next_tokens: list[int]) -> dict[int, int | None]:
        """Each row's shadow acceptance test (1, 0, or None: it drafted, or had no chain; see
        :attr:`~spectune.engine.policy.CycleFeedback.shadow_accepted`), None everywhere under a draft model."""
        first_draft = self.proposer.first_draft
        if first_draft is None:
            return dict.fromkeys(rows)
        last = self.last.tolist()
        out: dict[int, int | None] = {}
        for row in rows:
            token = first_draft(row, last[row]) if num_drafts[row] == 0 else None
            out[row] = None if token is None else int(token == next_tokens[row])
        return out

    # -- one cycle with the session's policy ------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> CycleOutcome | None:
        """One cycle driven by the session's policy (None: nothing was in flight). The policy's host time is
        recorded per cycle (``policy_s``; ``policy_outside_s`` of it falls outside the cycle's timed spans)."""
        if not self.begin_cycle():
            return None
        policy = self.policy if self.speculative else None
        if policy is None:
            return self.verify(0)
        clock = time.perf_counter
        start = clock()
        rows = list(self._rows)
        context = self._context.tolist() if policy.reads_context else None  # a host read, only when asked for
        ids = [self.slots[row].request_id for row in rows]
        contexts = [context[row] for row in rows] if context is not None else None
        if policy.reads_sampling:  # host-side settings the session holds already: no device read
            policy.before_cycle(rows, ids, contexts, sampling=[self.slot_sampling[row] for row in rows])
        else:
            policy.before_cycle(rows, ids, contexts)
        gamma = policy.begin_cycle(len(self._rows))
        outside = clock() - start
        inside = draft_cycle(policy, gamma, _LiveCycle(self, policy.reads_steps or policy.reads_last_step), clock)
        first = len(self.cycles)
        outcome = self.verify(gamma, shadow=policy.shadow_trials)
        rows = outcome.rows
        start = clock()
        shadows = outcome.shadow_accepted
        policy.observe(CycleFeedback([outcome.num_drafts[r] for r in rows], [outcome.accepted[r] for r in rows],
                                     outcome.draft_s, outcome.verify_s, outcome.cycle_s, rows=list(rows),
                                     request_ids=[outcome.request_ids[r] for r in rows],
                                     shadow_accepted=[shadows[r] for r in rows] if shadows is not None else None))
        outside += clock() - start
        for record in self.cycles[first:]:
            record.policy_s, record.policy_outside_s = inside + outside, outside
        return outcome


class _LiveCycle:
    """The session's open cycle as :func:`~spectune.engine.policy.draft_cycle` drives it."""

    def __init__(self, session: Session, shown: bool = True) -> None:
        self.session, self.shown = session, shown

    def draft(self, signals: frozenset[str]) -> DraftStep | None:
        # Session.step is in inference mode already. ``shown`` False: the policy reads no step (fixed γ), so none is
        # built (a DraftStep is a 14-field frozen dataclass: microseconds per step).
        out = self.session._draft_step(signals)
        return self.session.draft_state(out) if self.shown else None

    def stop(self, keep: torch.Tensor) -> bool:
        # One host read of the decision, judged on the busy rows only: a slot without a request drafts in lockstep
        # but is never verified, so whatever a policy says for it must not keep the cycle drafting (measured: a
        # per-step policy whose empty slots said "continue" drafted twice as long in cycles with free slots). When
        # every busy row keeps (most steps of a stop rule) the rows drafting are unchanged and the verification
        # keeps its uniform-γ path: no tensor op at all. Otherwise the proposer directly (the session method's
        # inference-mode entry costs µs per step).
        rows = self.session._rows
        flags = keep.tolist()
        if all(flags[row] for row in rows):
            return True
        running = self.session.proposer.stop_rows(keep).tolist()
        return any(running[row] for row in rows)

    def cut(self, kept: list[int]) -> None:
        drafted = self.session.proposer.num_drafts.tolist()
        self.session.cut([min(int(k), d) for k, d in zip(kept, drafted, strict=True)])
