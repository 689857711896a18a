"""One point: an engine opened on the loaded models, the prompts as requests, and one method run once over all of
them (after warm-up requests of the same batch shape), giving its request rows, cycle rows and summary.

A point is the unit of work, of failure and of resuming (:mod:`spectune.measure.repeats` schedules them).
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pandas as pd

from spectune.engine.records import Request, cycles_frame, requests_frame, summarise, with_acceptance
from spectune.errors import SpectuneError
from spectune.measure.models import Models, draft_of

if TYPE_CHECKING:
    from spectune.engine import Engine
    from spectune.engine.policy import DraftLengthPolicy
    from spectune.run.progress import RunProgress
    from spectune.sampling import SamplingParams

Frames = tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]  # requests, cycles, summary of one point


def open_engine(models: Models, sampling: SamplingParams, sampler: str, seed: int, proposer: Any = None,
                corpus: Iterable[Sequence[int]] = ()) -> Engine:
    """An engine on ``models`` that samples with ``sampling`` (a workload's) and the named rejection sampler;
    ``proposer`` chooses what drafts (:func:`draft_of`; default: the pair's draft model; ``corpus``: the training
    prompts, for a proposer that asks for them)."""
    from spectune.engine import Engine
    from spectune.sampling.rejection import get_sampler

    eos = models.tokenizer.eos_token_id
    draft = draft_of(models, proposer, corpus)
    return Engine(models.pair.target, draft, sampling=sampling, sampler=get_sampler(sampler),
                  device=models.device, eos_token_ids=[eos] if eos is not None else [], seed=int(seed),
                  path=models.path, vocab_size=models.pair.vocab_size)


def requests_of(prompts: Iterable[Any], max_new_tokens: int, ignore_eos: bool = False,
                arrivals: Sequence[float | None] | None = None) -> list[Request]:
    """One request per prompt (``id``, ``language``, ``input_ids``, ``category``, and its own ``sampling`` and
    ``phase`` where it has them), in order; ``ignore_eos``: each runs to ``max_new_tokens``. ``arrivals``: each
    request's send time in an open loop, one per prompt (None: a closed loop)."""
    prompts = list(prompts)
    if arrivals is None:
        arrivals = [None] * len(prompts)
    return [Request(i, p.id, p.language, list(p.input_ids), max_new_tokens, arrival, category=p.category,
                    sampling=getattr(p, "sampling", None), phase=getattr(p, "phase", None), ignore_eos=ignore_eos)
            for i, (p, arrival) in enumerate(zip(prompts, arrivals, strict=True))]


def check_context_fits(requests: list[Request], max_gamma: int, max_context: int | None,
                       key: str = "task.max_gamma") -> None:
    """Whether drafting ``max_gamma`` fits the context: it writes max_gamma + 2 positions past a sequence, all of
    which must fit (a config value's check: a one-line error naming ``key``). Whether γ is a γ at all is
    :func:`spectune.options.check_gamma`."""
    if max_context is None or not requests:
        return
    need = max(len(r.input_ids) + r.max_new_tokens for r in requests) + max_gamma + 2
    if need > max_context:
        raise SpectuneError(f"{key}={max_gamma} is out of range: the longest prompt + max_new_tokens + "
                            f"max_gamma + 2 = {need} positions exceed the context ({max_context}); allowed: "
                            f"1..{max_gamma - (need - max_context)}")


def check_point_fits(requests: list[Request], gamma: int, max_context: int | None) -> None:
    """Whether one point's cycles at γ fit the context: a cycle writes γ+1 positions past the sequence (the draft's
    first step 2). A caller's bug if not (the task checked its ``max_gamma`` first), hence RuntimeError."""
    if max_context is None or not requests:
        return
    need = max(len(r.input_ids) + r.max_new_tokens for r in requests) + gamma + 2
    if need > max_context:
        raise RuntimeError(f"γ={gamma} needs {need} positions per slot (longest prompt + max_new_tokens + γ+2) "
                           f"but the context is {max_context}")


def measure_point(engine: Engine, requests: list[Request], policy: DraftLengthPolicy | None, label: str, gamma: int,
                  *, concurrency: int, warmup: int, max_context: int | None, reset_policy: bool = True,
                  progress: RunProgress | None = None) -> Frames:
    """``requests`` through ``engine`` with ``policy`` (None: autoregressive) at ``concurrency``, after ``warmup``
    requests of the same batch shape (compiled graphs); the request and cycle rows and the point's summary.
    ``reset_policy=False`` goes on with what ``policy`` learned before (a later block; no warm-up then, which
    would teach it requests that are not measured). ``progress``: the run's one progress line, advanced per
    finished request (a point, or a block of one prompt, opens no line of its own)."""
    check_point_fits(requests, gamma, max_context)
    if warmup and not reset_policy:
        raise ValueError("measure_point: a run that keeps the policy's state takes no warm-up (warmup=0)")
    if warmup:
        warm_up(engine, requests, policy, concurrency, warmup)
    # Garbage left by the previous point is collected now, not inside this point's timing; what survives is frozen
    # (gc.freeze), so that a later collection, here or inside a timed run, walks only objects made since. Without
    # it every interleaved block paid a full walk of the loaded models' object graph (~0.1-0.5 s on 2 cores).
    gc.collect()
    gc.freeze()
    result = engine.run(requests, policy, concurrency, reset_policy=reset_policy,
                        on_finish=None if progress is None else lambda _: progress.advance())
    cyc = cycles_frame(result.cycles)
    req = with_acceptance(requests_frame(result.requests), cyc)
    summary = {"method": label, "gamma": gamma, "status": "ok", **summarise(req, cyc), **result.memory,
               "policy": policy.describe() if policy else None}
    req.insert(0, "method", label)
    req.insert(1, "gamma", gamma)
    cyc.insert(0, "method", label)  # cycles carry their own per-cycle `gamma` (the policy's choice)
    return req, cyc, summary


def warm_up(engine: Engine, requests: list[Request], policy: DraftLengthPolicy | None, concurrency: int,
            count: int) -> None:
    """Generate the first ``count`` requests (with their settings) at ``concurrency`` and discard them: the batch
    shapes a measured run will use are compiled (and cached) before it starts."""
    warm = [replace(r, request_id=-1 - i, prompt_id="warmup", arrival_s=None) for i, r in enumerate(requests[:count])]
    engine.run(warm, policy, concurrency)
