"""`python -m harness task=trace +workload=en`: draft traces, every cycle drafted to ``task.max_depth``.

Writes ``traces.parquet`` (one row per cycle, row and draft position: every draft signal, the target's
acceptance probability a_i = min(1, p_i/q_i), the realised accept/reject under the keyed uniforms, the
cycle's timings; columns in :data:`harness.engine.traces.TRACE_COLUMNS`) and ``traces.metadata.json``
beside it. The replay environments (``policies.envs``) read them. From one recorded cycle every depth
k ≤ max_depth is scored exactly; across cycles a replay is an approximation (see ``harness.engine.traces``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import hardware as hw
from harness import rundir
from harness.errors import SpectuneError
from harness.metadata import base_metadata
from harness.profile import device_name
from harness.tasks._options import integer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceSettings:
    max_depth: int
    concurrency: int
    warmup: int

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> TraceSettings:
        task = cfg.task
        return cls(integer(task.get("max_depth"), "task.max_depth", lo=1),
                   integer(task.get("concurrency"), "task.concurrency", lo=1),
                   integer(task.get("warmup"), "task.warmup", lo=0))


@dataclass
class Setup:
    """What a task that drives the engine on the configured models and workload needs."""

    pair: Any
    workload: Any
    engine: Any
    device: Any
    max_context: int | None
    metadata: dict[str, Any]


def build_setup(cfg: DictConfig, task: str) -> Setup:
    """Load models and workload, build the engine, and the metadata every result of ``task`` carries."""
    from harness.engine import Engine  # heavy imports only once the config is valid
    from harness.models.loading import load_pair
    from harness.sampling.rejection import get_sampler
    from workloads.loader import load_workload

    if not cfg.get("workload"):
        raise SpectuneError(f"task={task} needs a workload: add +workload=it|en|zh|es|mix")
    device = hw.setup(cfg.hardware)
    path = hw.execution_path(cfg.hardware)
    pair = load_pair(cfg.models, cfg.hardware)
    workload = load_workload(cfg.workload, pair.tokenizer)
    max_context = getattr(pair.target.config, "max_position_embeddings", None)
    if path.static:
        max_context = min(max_context or path.max_cache_len, path.max_cache_len)
    eos = pair.tokenizer.eos_token_id
    engine = Engine(pair.target, pair.draft, sampling=workload.sampling, sampler=get_sampler(cfg.sampler),
                    device=device, eos_token_ids=[eos] if eos is not None else [], seed=int(cfg.seed), path=path,
                    vocab_size=pair.vocab_size)
    hardware = {**hw.describe(cfg.hardware, device), "device_name": device_name(device)}  # what profiles match
    metadata = {**base_metadata(), "task": task, "models": pair.metadata, "hardware": hardware,
                "workload": workload.describe(), "sampling": vars(workload.sampling), "sampler": cfg.sampler,
                "seed": int(cfg.seed), "config": OmegaConf.to_container(cfg, resolve=True)}
    return Setup(pair, workload, engine, device, max_context, metadata)


def workload_requests(workload: Any) -> list:
    from harness.engine import Request

    return [Request(i, p.id, p.language, list(p.input_ids), workload.max_new_tokens)
            for i, p in enumerate(workload.prompts)]


def check_depth(requests: list, max_depth: int, max_context: int | None) -> None:
    """Drafting ``max_depth`` writes max_depth + 2 positions past a sequence: all must fit in the context."""
    if max_context is None or not requests:
        return
    need = max(len(r.input_ids) + r.max_new_tokens for r in requests) + max_depth + 2
    if need > max_context:
        raise SpectuneError(f"task.max_depth={max_depth} is out of range: the longest prompt + max_new_tokens + "
                            f"max_depth + 2 = {need} positions exceed the context ({max_context}); allowed: "
                            f"1..{max_depth - (need - max_context)}")


def run(cfg: DictConfig, run_dir: Path) -> int:
    from harness.engine.traces import record

    settings = TraceSettings.from_cfg(cfg)
    setup = build_setup(cfg, "trace")
    requests = workload_requests(setup.workload)
    check_depth(requests, settings.max_depth, setup.max_context)
    engine = setup.engine
    if settings.warmup:
        warm = [type(r)(-1 - i, "warmup", r.language, r.input_ids, r.max_new_tokens)
                for i, r in enumerate(requests[: settings.warmup])]
        record(engine.session(warm, None, settings.concurrency, keep_laws=True), warm, settings.max_depth)
    log.info("tracing %d requests of %s at max_depth %d, concurrency %d", len(requests), setup.workload.name,
             settings.max_depth, settings.concurrency)
    frame = record(engine.session(requests, None, settings.concurrency, keep_laws=True), requests, settings.max_depth)
    metadata = {**setup.metadata, "max_depth": settings.max_depth, "concurrency": settings.concurrency,
                "rows": len(frame), "cycles": int(frame["cycle"].nunique()) if len(frame) else 0,
                "randomness": "keyed by (seed, stream, request, position); inverse-CDF draws",
                "replay_note": "every depth <= max_depth is exact for a recorded cycle; across cycles the context, "
                               "recent acceptance and batch composition come from the recording"}
    path = rundir.TRACES.write(run_dir, frame)
    rundir.TRACES_METADATA.write(run_dir, metadata)
    if len(frame):
        first = frame.groupby(["cycle", "row"])["accepted"].apply(lambda s: int(s.cumprod().sum()))
        log.info("%d cycles, %d rows; mean accepted at max_depth %.3f; mean accept_prob by position: %s",
                 metadata["cycles"], len(frame), first.mean(),
                 " ".join(f"{v:.2f}" for v in frame.groupby("position")["accept_prob"].mean()))
    log.info("wrote %s", path)
    return 0
