"""The measuring engine: continuous batching of autoregressive or speculative generation.

One loop: admit arrived requests into free slots (prefill → first token), run one cycle for all
slots, emit 1..γ+1 tokens per busy slot, retire finished requests. Every clock read synchronises
the device. The only host sync inside a cycle is reading the verdict (plus one per draft step for
policies that stop early).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.engine.clock import DeviceClock, MemoryTracker
from harness.engine.kv import SlotKV
from harness.engine.policy import CycleFeedback, DraftLengthPolicy
from harness.engine.proposer import DraftProposer
from harness.engine.records import CycleRecord, Request, RequestRecord
from harness.engine.scorer import TargetScorer
from harness.engine.static_kv import StaticSlotKV
from harness.hardware import ExecutionPath
from harness.sampling import SamplingParams, draw
from harness.sampling.rejection import RejectionSampler


@dataclass
class RunRecords:
    requests: list[RequestRecord]
    cycles: list[CycleRecord]
    memory: dict = field(default_factory=dict)
    wall_s: float = 0.0


class Engine:
    """Generates for a list of requests with at most ``concurrency`` in flight.

    ``policy=None`` (or no draft model) is the autoregressive baseline on the same code path, so
    the comparison measures speculation and nothing else.
    """

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module | None, *, sampling: SamplingParams,
                 sampler: RejectionSampler, device: torch.device | str, eos_token_ids: list[int] | None = None,
                 seed: int = 0, compact_waste: float = 0.5, path: ExecutionPath | None = None,
                 vocab_size: int | None = None) -> None:
        self.target, self.draft = target, draft
        self.sampling, self.sampler = sampling, sampler
        self.device = torch.device(device)
        self.eos = set(eos_token_ids or [])
        self.seed = seed
        self.compact_waste = compact_waste
        self.path = path or ExecutionPath()
        self.vocab_size = vocab_size  # sample over the first ids only (the tokenizer's; see check_pair)
        self.clock = DeviceClock(self.device)
        self._static: dict[tuple[int, int], StaticSlotKV] = {}  # reused across runs: graphs keep addresses
        self._forward = {}
        if self.path.compile_mode is not None:
            # One graph per (model, batch, n) shape; both models share forward's code object, so the default
            # limit (8) would silently fall back to eager mid-benchmark.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
            for model in (target, draft):
                if model is not None:
                    self._forward[id(model)] = torch.compile(model.forward, mode=self.path.compile_mode,
                                                             backend=self.path.compile_backend, dynamic=False)

    def _kv(self, model: torch.nn.Module, batch: int) -> SlotKV:
        if not self.path.static:
            return SlotKV(batch, self.device)
        key = (id(model), batch)
        if key not in self._static:
            self._static[key] = StaticSlotKV(batch, self.device, model, self.path.max_cache_len,
                                             forward_fn=self._forward.get(id(model)))
        kv = self._static[key]
        kv.reset()
        return kv

    @torch.inference_mode()
    def run(self, requests: list[Request], policy: DraftLengthPolicy | None, concurrency: int,
            on_finish: Callable[[RequestRecord], None] | None = None) -> RunRecords:
        speculative = policy is not None and self.draft is not None
        batch = concurrency
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        scorer = TargetScorer(self.target, self._kv(self.target, batch), self.sampling, self.vocab_size)
        proposer = (DraftProposer(self.draft, self._kv(self.draft, batch), self.sampling, self.vocab_size)
                    if speculative else None)
        if policy is not None:
            policy.reset()
        memory = MemoryTracker(self.device)

        waiting = deque(sorted(requests, key=lambda r: (r.arrival_s or 0.0, r.request_id)))
        records = {r.request_id: RequestRecord(r.request_id, r.prompt_id, r.language, len(r.input_ids),
                                               r.arrival_s) for r in requests}
        slots: list[Request | None] = [None] * batch
        last = torch.zeros(batch, dtype=torch.long, device=self.device)
        cycles: list[CycleRecord] = []
        start = self.clock.now()

        def finish(row: int, when: float) -> None:
            record = records[slots[row].request_id]
            record.finish_s = when
            slots[row] = None
            scorer.kv.clear(row)
            if proposer is not None:
                proposer.clear(row)
            if on_finish is not None:
                on_finish(record)

        def emit(row: int, tokens: list[int], when: float) -> int:
            """Append tokens up to EOS / max_new_tokens; returns how many were really emitted."""
            request, record = slots[row], records[slots[row].request_id]
            count = 0
            for token in tokens:
                record.output_ids.append(token)
                record.token_times_s.append(when)
                count += 1
                if token in self.eos or record.output_tokens >= request.max_new_tokens:
                    finish(row, when)
                    break
            return count

        cycle_index = 0
        while waiting or any(s is not None for s in slots):
            now = self.clock.now() - start
            admitted: list[int] = []
            for row in range(batch):  # admit every arrived request a free slot can take
                if slots[row] is None and waiting and (waiting[0].arrival_s or 0.0) <= now:
                    slots[row] = waiting.popleft()
                    record = records[slots[row].request_id]
                    record.admitted_s = now
                    if record.arrival_s is None:  # closed loop: sent the moment a slot is free
                        record.arrival_s = now
                    admitted.append(row)
            if admitted:  # one batched prefill; its time counts in these requests' TTFT
                prompts = [slots[row].input_ids for row in admitted]
                first_laws = scorer.prefill(admitted, prompts)
                if proposer is not None:
                    proposer.prefill(admitted, prompts)
                first = draw(first_laws, self.sampling, generator)
                last[admitted] = first
                when = self.clock.now() - start
                for row, token in zip(admitted, first.tolist(), strict=True):
                    records[slots[row].request_id].first_token_s = when
                    emit(row, [token], when)
            active_rows = [row for row in range(batch) if slots[row] is not None]
            if not active_rows:  # nothing in flight (open loop, or requests done at their first token)
                if waiting:
                    time.sleep(max(0.0, (waiting[0].arrival_s or 0.0) - (self.clock.now() - start)))
                continue
            active = torch.zeros(batch, dtype=torch.bool, device=self.device)
            active[active_rows] = True
            context = scorer.kv.next_pos.clone()

            t0 = self.clock.mark()
            if speculative:
                gamma = policy.begin_cycle(len(active_rows))
                proposal = proposer.propose(last, gamma, policy, context, generator)
                t1 = self.clock.mark()
                target_laws = scorer.score(last, proposal.tokens)
                verdict = self.sampler(target_laws, proposal.probs, proposal.tokens, generator,
                                       num_drafts=proposal.num_drafts)
                accepted = verdict.num_accepted
                next_tokens, accepted_list = verdict.next_token.tolist(), accepted.tolist()  # the host sync
                drafts_list = proposal.tokens.tolist()
                num_drafts = (proposal.num_drafts.tolist() if proposal.num_drafts is not None
                              else [proposal.tokens.shape[1]] * batch)
            else:
                gamma = 0
                t1 = t0
                next_tok = draw(scorer.score(last, None)[:, 0], self.sampling, generator)
                accepted = torch.zeros(batch, dtype=torch.long, device=self.device)
                next_tokens, accepted_list = next_tok.tolist(), [0] * batch  # the host sync
                drafts_list, num_drafts = [[] for _ in range(batch)], [0] * batch
            t2 = self.clock.mark()
            when = time.perf_counter() - start  # the tokens are on the host now: their emission time
            draft_s, verify_s = self.clock.seconds(t0, t1), self.clock.seconds(t1, t2)

            scorer.rollback(torch.where(active, context + accepted + 1, 0))
            if proposer is not None:
                proposer.rollback(context, accepted, proposal, active)
            last = torch.tensor(next_tokens, device=self.device)
            row_ids = {row: slots[row].request_id for row in active_rows}  # emit() may free slots
            emitted = {row: emit(row, [*drafts_list[row][: accepted_list[row]], next_tokens[row]], when)
                       for row in active_rows}
            if scorer.kv.waste() > self.compact_waste:
                scorer.kv.compact()
                if proposer is not None:
                    proposer.kv.compact()
            memory.sample()
            rest_s = self.clock.seconds(t2, self.clock.mark())
            if speculative:
                policy.observe(CycleFeedback([num_drafts[r] for r in active_rows],
                                             [accepted_list[r] for r in active_rows], draft_s, verify_s,
                                             draft_s + verify_s + rest_s))
            cycles.extend(
                CycleRecord(cycle=cycle_index, request_id=row_ids[row], slot=row, batch_size=len(active_rows),
                            gamma=gamma, num_drafts=num_drafts[row], accepted=accepted_list[row],
                            emitted=emitted[row], draft_s=draft_s, verify_s=verify_s, rest_s=rest_s,
                            start_s=when - draft_s - verify_s)
                for row in active_rows
            )
            cycle_index += 1
        return RunRecords(list(records.values()), cycles, memory.report(), self.clock.now() - start)
