"""`python -m harness +workload=it`: the AR baseline and a γ grid, measured side by side, with repeats.

Each grid point runs the same requests through the same engine, ``task.repeats`` times, the methods in an
order rotated per repeat (ABC, BCA, CAB, ...). A point is one (method, repeat): results are rewritten
atomically after every point, so a killed or failing run keeps everything that finished (and
``resume=true`` runs only the rest); a point that raises (e.g. out of memory) is recorded as failed with
its error and the sweep goes on. At the end every method gets CIs from a paired (repeat, prompt)
cluster bootstrap, the best method and its indistinguishable set are marked beside the MAD rule's
pick, and with ``task.noise_floor=true`` the AR baseline runs twice per repeat (the A/A noise floor). With
``task.block_prompts=N`` the methods of a repeat run block by block of N prompts (:mod:`harness.interleave`),
so that a drifting machine drifts under every method alike; a repeat is then the unit of resuming.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf

from analysis.bench_table import bench_table, format_ranking, format_table
from harness import conditions, resume, rundir
from harness import hardware as hw
from harness.engine.policy import check_gamma
from harness.engine.records import Request
from harness.errors import SpectuneError
from harness.interleave import block_for, block_runner, block_size, blocks_of, design_option, run_interleaved
from harness.measure import (
    Frames,
    Grid,
    aggregate,
    load_models,
    open_engine,
    pooled,
    repeats_option,
    run_points,
    schedule,
)
from harness.metadata import base_metadata
from harness.stats.compare import AA_LABEL
from harness.stats.goodput import parse_slo
from harness.stats.units import unit_size_of
from policies.registry import make_policy, measure_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchSettings:
    gammas: tuple[int, ...]
    baseline: bool
    policy: dict[str, Any]
    concurrency: int
    request_rate: float | None
    burstiness: float
    warmup: int
    repeats: int = 1
    noise_floor: bool = False  # run AR twice per repeat: the A/A comparison gives noise_floor_pct
    slo: dict[str, float] = field(default_factory=dict)
    block_prompts: int | None = None  # methods interleaved per block of this many prompts (None: whole runs)
    design: str = "interleaved"  # "blocked": every method runs all prompts at once (harness.interleave)

    @property
    def unit_size(self) -> int:
        """Prompts per independent unit of the intervals (harness.measure.unit_size_of)."""
        return unit_size_of(self.concurrency, self.block_prompts)

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> BenchSettings:
        """Validate the bench knobs in one place (one-line SpectuneError naming the key), before any model loads."""
        raw = cfg.gamma
        gammas = tuple(raw) if isinstance(raw, ListConfig | list | tuple) else (raw,)
        for g in gammas:
            check_gamma(g, "each γ of the grid (the AR baseline is task.baseline=true)")
        if len(set(gammas)) != len(gammas):
            raise SpectuneError(f"gamma={list(gammas)} is invalid: each γ may appear once")
        baseline = cfg.task.baseline
        if not isinstance(baseline, bool):
            raise SpectuneError(f"task.baseline={baseline!r} is invalid: must be true or false")
        if not gammas:
            raise SpectuneError("gamma=[] is invalid: give at least one γ >= 1 (task.baseline=true adds AR)")
        c = cfg.concurrency
        if not (isinstance(c, int) and not isinstance(c, bool) and c >= 1):
            raise SpectuneError(f"concurrency={c!r} is invalid: must be an integer >= 1")
        rate = cfg.request_rate
        if rate is not None and not (_finite(rate) and rate > 0):
            raise SpectuneError(f"request_rate={rate!r} is invalid: must be a finite number > 0 (req/s) "
                                "or null (closed loop)")
        if not (_finite(cfg.burstiness) and cfg.burstiness > 0):
            raise SpectuneError(f"burstiness={cfg.burstiness!r} is invalid: must be a finite number > 0 "
                                "(1 = Poisson)")
        warmup = cfg.task.warmup
        if not (isinstance(warmup, int) and not isinstance(warmup, bool) and warmup >= 0):
            raise SpectuneError(f"task.warmup={warmup!r} is invalid: must be an integer >= 0")
        policy = OmegaConf.to_container(cfg.policy, resolve=True)
        for g in gammas:  # an unknown policy or a bad parameter fails here, before any model loads
            make_policy(policy, g)
        repeats = repeats_option(cfg.task.get("repeats", 1))
        noise_floor = bool(cfg.task.get("noise_floor", False))
        if noise_floor and not baseline:
            raise SpectuneError("task.noise_floor=true is invalid with task.baseline=false: the noise floor is "
                                "the A/A spread of the AR baseline")
        slo = parse_slo(OmegaConf.to_container(cfg.slo, resolve=True) if cfg.get("slo") is not None else None)
        block = block_size(cfg.task.get("block_prompts"), "task.block_prompts", [c], f"concurrency={c}")
        design = design_option(cfg.task.get("design"), "task.design", block, rate)
        return cls(gammas, baseline, policy, c, None if rate is None else float(rate), float(cfg.burstiness),
                   warmup, repeats, noise_floor, slo, block_for(design, block, c), design)

    def methods(self) -> list[tuple[str, int]]:
        """(label, γ) per grid point; γ = 0 is the autoregressive baseline."""
        points = [("ar", 0)] if self.baseline else []
        if self.baseline and self.noise_floor:
            points.append((AA_LABEL, 0))
        return points + [(f"{self.policy['name']}:gamma={g}", g) for g in self.gammas]


def _finite(value: Any) -> bool:
    """A real number (not a bool), neither infinite nor NaN."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def arrival_times(count: int, rate: float | None, burstiness: float, seed: int) -> list[float | None]:
    """Send times (s): None in a closed loop (sent when a slot frees); else Gamma(shape=burstiness)
    gaps with mean 1/rate, first request at 0."""
    if rate is None:
        return [None] * count
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    return [0.0, *np.cumsum(gaps[1:]).tolist()]


def build_requests(workload: Any, settings: BenchSettings, max_context: int | None) -> list[Request]:
    """Requests in workload order. A prompt that cannot even be decoded autoregressively within the
    target's context is the user's error; one that only overflows with a large γ fails that grid point."""
    arrivals = arrival_times(len(workload.prompts), settings.request_rate, settings.burstiness, workload.seed)
    requests = []
    for i, (prompt, arrival) in enumerate(zip(workload.prompts, arrivals, strict=True)):
        need = len(prompt.input_ids) + workload.max_new_tokens + 1
        if max_context is not None and need > max_context:
            raise SpectuneError(f"prompt {prompt.id!r} needs {need} positions (prompt {len(prompt.input_ids)} + "
                                f"max_new_tokens {workload.max_new_tokens} + 1); the context is {max_context}: "
                                "shorten the prompt or lower max_new_tokens")
        requests.append(Request(i, prompt.id, prompt.language, list(prompt.input_ids), workload.max_new_tokens,
                                arrival))
    return requests


def run(cfg: DictConfig, run_dir: Path) -> int:
    if "workload" not in cfg:
        raise SpectuneError("no workload selected: add +workload=NAME (it, en, zh, es or mix)")
    settings = BenchSettings.from_cfg(cfg)
    points = schedule(settings.methods(), settings.repeats)  # rotated order per repeat
    keys = [(label, repeat) for label, _, repeat in points]  # the unit of work and of resuming
    done = resume.load_completed(run_dir, cfg, keys) if resume.wants_resume(cfg, run_dir) else resume.Completed()
    done = conditions.whole_repeats(done, keys)  # a partial repeat reruns whole, in this allocation
    if done.covers(keys):  # decided before any model loads
        log.info("resume: all %d grid points are complete in %s; nothing to run", len(keys), run_dir)
        grid = Grid([done.summaries[k] for k in keys], [done.requests[k] for k in keys],
                    [done.cycles[k] for k in keys])
        methods, ranking = aggregate(grid, seed=int(cfg.seed), slo=settings.slo, unit_size=settings.unit_size)
        _log_table(methods, ranking, grid.points)
        log.info(f"results: {run_dir}")
        return _exit_code(methods)

    from workloads.loader import load_workload  # heavy imports only once the config is valid

    models = load_models(cfg.models, cfg.hardware)
    workload = load_workload(cfg.workload, models.tokenizer)
    max_context = models.max_context
    requests = build_requests(workload, settings, max_context)
    engine = open_engine(models, workload.sampling, cfg.sampler, int(cfg.seed))

    metadata = {**base_metadata(), "task": "bench", "models": models.pair.metadata,
                "hardware": hw.describe(cfg.hardware, models.device), "workload": workload.describe(),
                "sampling": vars(workload.sampling), "sampler": cfg.sampler,
                "settings": vars(settings), "load": "closed loop" if settings.request_rate is None else "open loop",
                "config": OmegaConf.to_container(cfg, resolve=True), "job": resume.job_identity(),
                "resumed_points": [label if r == 0 else f"{label} repeat {r}" for label, r in keys
                                   if (label, r) in done]}
    rundir.METADATA.write(run_dir, metadata)

    def write(grid: Grid, final: dict[str, Any] | None = None) -> None:
        req, cyc = grid.frames()
        body = final or {"methods": pooled(grid)}
        with resume.deferred_signals():  # a SIGTERM now waits until the three files agree
            if len(req):
                rundir.REQUESTS.write(run_dir, req)
                rundir.CYCLES.write(run_dir, cyc)
            rundir.SUMMARY.write(run_dir, {"workload": workload.name, "repeats": settings.repeats, **body,
                                           **conditions.summary_fields(grid.points), "points": grid.points})

    def point(label: str, gamma: int) -> Frames:
        return measure_policy(engine, requests, settings.policy, label, gamma, concurrency=settings.concurrency,
                              warmup=settings.warmup, max_context=max_context)

    if settings.block_prompts is None:
        grid = run_points(points, conditions.watched(point), done=done, on_point=write)
    else:
        block = block_runner(engine, lambda _label, gamma: make_policy(settings.policy, gamma),
                             concurrency=settings.concurrency, warmup=settings.warmup, max_context=max_context)
        grid = run_interleaved(settings.methods(), settings.repeats, blocks_of(requests, settings.block_prompts),
                               block, done=done, on_point=write)
    methods, ranking = aggregate(grid, seed=int(cfg.seed), slo=settings.slo, unit_size=settings.unit_size)
    tp = ranking.get("output_throughput", {})
    write(grid, {"noise_floor_pct": tp.get("noise_floor_pct"), "statistics": tp.get("statistics"),
                 "ranking": ranking, "methods": methods})

    note = f" ({models.pair.metadata['weights_note']})" if models.pair.metadata.get("weights_note") else ""
    log.info(f"\nworkload={workload.name}  models={cfg.models.name}{note}  hardware={cfg.hardware.name}  "
             f"concurrency={settings.concurrency}  {metadata['load']}  prompts={len(requests)}  "
             f"max_new_tokens={workload.max_new_tokens}  repeats={settings.repeats}")
    _log_table(methods, ranking, grid.points)
    log.info(f"results: {run_dir}")
    return _exit_code(methods)


def _log_table(methods: list[dict[str, Any]], ranking: dict[str, Any], points: list[dict[str, Any]]) -> None:
    log.info(format_table(bench_table(methods, ranking)))
    for line in format_ranking(ranking, methods):
        log.info(line)
    conditions.warn_flagged(conditions.assess(points))


def _exit_code(summaries: list[dict[str, Any]]) -> int:
    """3 when every grid point failed (nothing was measured), else 0."""
    failed = [s["method"] for s in summaries if s["status"] != "ok"]
    return 3 if failed and len(failed) == len(summaries) else 0
