"""`python -m harness task=trace +workload=en`: draft traces, every cycle drafted to ``task.max_gamma``.

Writes ``traces.parquet`` (one row per cycle, row and draft position: every draft signal, the target's
acceptance probability a_i = min(1, p_i/q_i), the realised accept/reject under the keyed uniforms, the
cycle's timings; columns in :data:`spectune.engine.traces.TRACE_COLUMNS`, and with ``proposer=lookup`` or
``proposer=suffix`` also ``CHAIN_COLUMNS``: where each chain reached and the match signals a γ policy can observe)
and ``traces.metadata.json`` beside it. The replay environments (``policies.envs``) read them. From one recorded
cycle every γ k ≤ max_gamma is scored exactly; across cycles a replay is an approximation (see
``spectune.engine.traces``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from harness.tasks.schemas import TraceTask
from spectune.config import typed
from spectune.measure.point import check_context_fits, requests_of
from spectune.options import integer
from spectune.run import rundir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceSettings:
    max_gamma: int
    concurrency: int
    warmup: int

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> TraceSettings:
        """Types from the schema (harness/tasks/schemas.py), ranges here: one line each, before any model loads."""
        task = typed(TraceTask, cfg.task, "task")
        return cls(integer(task.max_gamma, "task.max_gamma", lo=1), integer(task.concurrency, "task.concurrency", lo=1),
                   integer(task.warmup, "task.warmup", lo=0))


def run(cfg: DictConfig, run_dir: Path) -> int:
    from spectune.engine.traces import record
    from workloads.setup import open_setup

    settings = TraceSettings.from_cfg(cfg)
    setup = open_setup(cfg, "trace")
    requests = requests_of(setup.workload.prompts, setup.workload.max_new_tokens, setup.workload.ignore_eos)
    check_context_fits(requests, settings.max_gamma, setup.max_context)
    engine = setup.engine
    if settings.warmup:
        warm = [type(r)(-1 - i, "warmup", r.language, r.input_ids, r.max_new_tokens)
                for i, r in enumerate(requests[: settings.warmup])]
        record(engine.session(warm, None, settings.concurrency, keep_laws=True), warm, settings.max_gamma)
    log.info("tracing %d requests of %s at max_gamma %d, concurrency %d", len(requests), setup.workload.name,
             settings.max_gamma, settings.concurrency)
    frame = record(engine.session(requests, None, settings.concurrency, keep_laws=True), requests, settings.max_gamma)
    metadata = {**setup.metadata, "max_gamma": settings.max_gamma, "concurrency": settings.concurrency,
                "rows": len(frame), "cycles": int(frame["cycle"].nunique()) if len(frame) else 0,
                "randomness": "keyed by (seed, stream, request, position); inverse-CDF draws",
                "replay_note": "every γ <= max_gamma is exact for a recorded cycle; across cycles the context, "
                               "recent acceptance and batch composition come from the recording"}
    path = rundir.TRACES.write(run_dir, frame)
    rundir.TRACES_METADATA.write(run_dir, metadata)
    if len(frame):
        first = frame.groupby(["cycle", "row"])["accepted"].apply(lambda s: int(s.cumprod().sum()))
        log.info("%d cycles, %d rows; mean accepted at max_gamma %.3f; mean accept_prob by position: %s",
                 metadata["cycles"], len(frame), first.mean(),
                 " ".join(f"{v:.2f}" for v in frame.groupby("position")["accept_prob"].mean()))
    log.info("wrote %s", path)
    return 0
