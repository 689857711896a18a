"""The measuring engine: continuous batching of autoregressive or speculative generation.

One loop: admit arrived requests into free slots (prefill → first token), run one cycle for all
slots, emit 1..γ+1 tokens per busy slot, retire finished requests. The loop body is a
:class:`~spectune.engine.session.Session` step (which also serves traces and the live environments).
Every clock read synchronises the device. The only host sync inside a cycle is reading the verdict
(plus one per draft step for policies that stop early).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from spectune.engine.clock import DeviceClock
from spectune.engine.features import reads_features
from spectune.engine.kv import SlotKV
from spectune.engine.policy import DraftLengthPolicy
from spectune.engine.proposer import DraftSpec
from spectune.engine.records import Request, RequestRecord
from spectune.engine.session import RunRecords, Session
from spectune.engine.static_kv import StaticSlotKV
from spectune.errors import SpectuneError
from spectune.hardware import ExecutionPath
from spectune.sampling import SamplingParams
from spectune.sampling.rejection import RejectionSampler

__all__ = ["Engine", "RunRecords", "Session"]


class Engine:
    """Generates for a list of requests with at most ``concurrency`` in flight.

    ``draft``: a draft model, a draft that needs none (a :class:`~spectune.engine.proposer.DraftSpec`: prompt lookup,
    suffix decoding, built by :mod:`spectune.engine.proposers`), or None.
    ``policy=None`` (or no draft) is the autoregressive baseline on the same code path, so
    the comparison measures speculation and nothing else.
    """

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module | DraftSpec | None, *,
                 sampling: SamplingParams, sampler: RejectionSampler, device: torch.device | str,
                 eos_token_ids: list[int] | None = None, seed: int = 0, compact_waste: float = 0.5,
                 path: ExecutionPath | None = None, vocab_size: int | None = None) -> None:
        self.target, self.draft = target, draft
        self.sampling, self.sampler = sampling, sampler
        self.device = torch.device(device)
        self.eos = set(eos_token_ids or [])
        self.seed = seed
        self.compact_waste = compact_waste
        self.path = path or ExecutionPath()
        if self.path.static and reads_features(draft):
            raise SpectuneError("a draft that reads the target's features runs on the dynamic-cache path only: "
                                "drop the static/compiled hardware choice (e.g. hardware=cpu or hardware=cuda)")
        self.vocab_size = vocab_size  # sample over the first ids only (the tokenizer's; see check_pair)
        self.clock = DeviceClock(self.device)
        self._static: dict[tuple[int, int], StaticSlotKV] = {}  # reused across runs: graphs keep addresses
        self._forward = {}
        if self.path.compile_mode is not None:
            # One graph per (model, batch, n) shape; both models share forward's code object, so the default
            # limit (8) would silently fall back to eager mid-benchmark.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
            for model in (target, draft):
                if isinstance(model, torch.nn.Module):
                    self._forward[id(model)] = torch.compile(model.forward, mode=self.path.compile_mode,
                                                             backend=self.path.compile_backend, dynamic=False)

    def cache(self, model: torch.nn.Module, batch: int) -> SlotKV:
        """A cleared per-slot KV cache of ``model`` for ``batch`` slots: a new dynamic one, or the static one of that
        shape (reused across runs, so compiled graphs keep their addresses)."""
        if not self.path.static:
            return SlotKV(batch, self.device)
        key = (id(model), batch)
        if key not in self._static:
            self._static[key] = StaticSlotKV(batch, self.device, model, self.path.max_cache_len,
                                             forward_fn=self._forward.get(id(model)))
        kv = self._static[key]
        kv.reset()
        return kv

    def session(self, requests: list[Request], policy: DraftLengthPolicy | None, concurrency: int,
                on_finish: Callable[[RequestRecord], None] | None = None, keep_laws: bool = False,
                reset_policy: bool = True) -> Session:
        """A :class:`Session` over these requests: the engine stepped one cycle at a time."""
        return Session(self, requests, policy, concurrency, on_finish=on_finish, keep_laws=keep_laws,
                       reset_policy=reset_policy)

    @torch.inference_mode()
    def run(self, requests: list[Request], policy: DraftLengthPolicy | None, concurrency: int,
            on_finish: Callable[[RequestRecord], None] | None = None, reset_policy: bool = True) -> RunRecords:
        """Generate for every request (``policy=None``: autoregressive); one :meth:`Session.step` per cycle.
        ``reset_policy=False`` keeps what the policy learned in an earlier run (a run cut into blocks)."""
        session = self.session(requests, policy, concurrency, on_finish, reset_policy=reset_policy)
        while not session.done:
            session.step()
        return session.result()
