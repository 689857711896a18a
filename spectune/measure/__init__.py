"""Measuring, shared by every application that drives the engine: load the models once per process, open an
engine on them, measure one point, and repeat points in a rotated order with the per-method aggregate.

- :func:`load_models` loads the configured pair on the configured hardware (cached: a process that traces,
  profiles and fine-tunes loads it once); :func:`open_engine` builds an :class:`~spectune.engine.Engine` on it
  for a workload's sampling settings; :func:`requests_of` turns prompts into requests.
- :func:`measure_point` runs one method once on all requests (after warm-up requests of the same batch shape).
- Repeats: a point is one method run once on all prompts: the unit of work, of failure and of resuming, keyed
  (method, repeat). Repeat r runs the methods in the order rotated r times (ABC, BCA, CAB, ...)
  (:func:`schedule`, :func:`run_points`); :func:`aggregate` gives per-method summaries with paired CIs, the
  best method, its indistinguishable set, the MAD rule's pick, the noise floor and (with SLOs) goodput.
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from spectune.engine.records import (
    Request,
    cycles_frame,
    requests_frame,
    summarise,
    summarise_repeats,
    with_acceptance,
)
from spectune.errors import SpectuneError
from spectune.stats.compare import AA_LABEL, Comparison, compare, latency_intervals, rotation
from spectune.stats.goodput import good_requests, p99_check

if TYPE_CHECKING:
    import torch

    from spectune.engine import Engine
    from spectune.engine.policy import DraftLengthPolicy
    from spectune.hardware import ExecutionPath
    from spectune.models.loading import ModelPair
    from spectune.run.progress import RunProgress
    from spectune.sampling import SamplingParams

log = logging.getLogger(__name__)

Point = tuple[str, int, int]  # (method label, γ, repeat)
Frames = tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]  # requests, cycles, summary of one point
RunPoint = Callable[[str, int], Frames]


# -- models and engine ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Models:
    """A loaded pair on its device: what an engine is built from, and what a profile or a result names."""

    pair: ModelPair
    device: torch.device
    path: ExecutionPath
    max_context: int | None  # positions a slot may use (the model's, or the static cache's when smaller)
    hardware: dict[str, Any]  # hardware.describe() plus the device name a profile is matched on

    @property
    def tokenizer(self) -> Any:
        return self.pair.tokenizer


_LOADED: dict[str, Models] = {}


def _key(*nodes: Any) -> str:
    from omegaconf import DictConfig, OmegaConf

    return json.dumps([OmegaConf.to_container(n, resolve=True) if isinstance(n, DictConfig) else n for n in nodes],
                      sort_keys=True, default=str)


def load_models(models_cfg: Any, hardware_cfg: Any, draft: bool = True) -> Models:
    """The configured pair on the configured hardware, loaded once per process (same configs: same objects).

    ``draft=False``: the target alone, for a model-free draft (:func:`needs_draft_model`); its ``pair.draft`` and
    the metadata's ``draft`` are None. Either way round, a process loads the target once."""
    key = _key(models_cfg, hardware_cfg)
    held = _LOADED.get(key)
    if held is None or (draft and held.pair.draft is None):
        from spectune import hardware as hw
        from spectune.costmodel.profile import device_name
        from spectune.models.loading import load_pair

        device = hw.setup(hardware_cfg)
        path = hw.execution_path(hardware_cfg)
        pair = load_pair(models_cfg, hardware_cfg, draft=draft, loaded_target=held.pair if held else None)
        max_context = getattr(pair.target.config, "max_position_embeddings", None)
        if path.static:  # a static cache holds prompt + output + one block per slot
            max_context = min(max_context or path.max_cache_len, path.max_cache_len)
        hardware = {**hw.describe(hardware_cfg, device), "device_name": device_name(device)}
        held = _LOADED[key] = Models(pair, device, path, max_context, hardware)
    if draft or held.pair.draft is None:
        return held
    pair = replace(held.pair, draft=None, metadata={**held.pair.metadata, "draft": None,
                                                    "vocabulary_check": "target only"})
    return replace(held, pair=pair)


def needs_draft_model(proposer: Any = None) -> bool:
    """Whether the configured proposer (:func:`draft_of`'s node; None: the pair's draft model) drafts with the
    pair's draft model, so that it must be loaded."""
    from spectune.engine import proposers

    return proposers.needs_draft_model(proposer)


def draft_of(models: Models, proposer: Any = None, corpus: Iterable[Sequence[int]] = ()) -> Any:
    """What drafts, as the configured proposer's entry builds it (:mod:`spectune.engine.proposers`; ``proposer``
    None: the pair's draft model) from ``models`` and, where the entry asks for them, the workload's training
    prompts (``corpus``). No model-free draft ever proposes the tokenizer's special (chat-template) ids. An unknown
    proposer or setting, or a setting out of range, is a one-line error."""
    from spectune.engine import proposers

    entry, settings = proposers.settings_of(proposer)
    special = tuple(getattr(models.tokenizer, "all_special_ids", ()) or ())
    return entry.draft(settings, proposers.DraftSources(models.pair.draft, special, list(corpus)))


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


def requests_of(prompts: Iterable[Any], max_new_tokens: int) -> list[Request]:
    """One closed-loop request per prompt (``id``, ``language``, ``input_ids``, ``task``, and its own ``sampling``
    and ``phase`` where it has them), in order."""
    return [Request(i, p.id, p.language, list(p.input_ids), max_new_tokens, task=p.task,
                    sampling=getattr(p, "sampling", None), phase=getattr(p, "phase", None))
            for i, p in enumerate(prompts)]


def check_gamma(requests: list[Request], max_gamma: int, max_context: int | None, key: str = "task.max_gamma") -> None:
    """Drafting ``max_gamma`` writes max_gamma + 2 positions past a sequence: all must fit in the context."""
    if max_context is None or not requests:
        return
    need = max(len(r.input_ids) + r.max_new_tokens for r in requests) + max_gamma + 2
    if need > max_context:
        raise SpectuneError(f"{key}={max_gamma} is out of range: the longest prompt + max_new_tokens + "
                            f"max_gamma + 2 = {need} positions exceed the context ({max_context}); allowed: "
                            f"1..{max_gamma - (need - max_context)}")


def check_fits(requests: list[Request], gamma: int, max_context: int | None) -> None:
    """A cycle at γ writes γ+1 positions past the sequence (the draft's first step 2): all must fit."""
    if max_context is None or not requests:
        return
    need = max(len(r.input_ids) + r.max_new_tokens for r in requests) + gamma + 2
    if need > max_context:
        raise RuntimeError(f"γ={gamma} needs {need} positions per slot (longest prompt + max_new_tokens + γ+2) "
                           f"but the context is {max_context}")


# -- one point --------------------------------------------------------------------------------------------
def measure_point(engine: Engine, requests: list[Request], policy: DraftLengthPolicy | None, label: str, gamma: int,
                  *, concurrency: int, warmup: int, max_context: int | None, reset_policy: bool = True,
                  progress: RunProgress | None = None) -> Frames:
    """``requests`` through ``engine`` with ``policy`` (None: autoregressive) at ``concurrency``, after ``warmup``
    requests of the same batch shape (compiled graphs); the request and cycle rows and the point's summary.
    ``reset_policy=False`` goes on with what ``policy`` learned before (a later block; no warm-up then, which
    would teach it requests that are not measured). ``progress``: the run's one progress line, advanced per
    finished request (a point, or a block of one prompt, opens no line of its own)."""
    check_fits(requests, gamma, max_context)
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


# -- repeats ----------------------------------------------------------------------------------------------


def repeats_option(value: Any) -> int:
    """``task.repeats``: an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpectuneError(f"task.repeats={value!r} is invalid: must be an integer >= 1")
    return value


def schedule(methods: list[tuple[str, int]], repeats: int) -> list[Point]:
    """Every (method, γ) once per repeat, in the order rotated by the repeat's index."""
    return [(label, gamma, r) for r in range(repeats) for label, gamma in rotation(methods, r)]


@dataclass
class Grid:
    """What has been measured so far: per-point summaries and their request / cycle rows."""

    points: list[dict[str, Any]] = field(default_factory=list)
    requests: list[pd.DataFrame] = field(default_factory=list)
    cycles: list[pd.DataFrame] = field(default_factory=list)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        req = pd.concat(self.requests, ignore_index=True) if self.requests else pd.DataFrame()
        cyc = pd.concat(self.cycles, ignore_index=True) if self.cycles else pd.DataFrame()
        return req, cyc


def _tag(frame: pd.DataFrame, repeat: int) -> pd.DataFrame:
    frame = frame.copy()
    if "repeat" in frame:
        frame["repeat"] = repeat
    else:
        frame.insert(1, "repeat", repeat)
    return frame


def run_points(points: list[Point], run_point: RunPoint, *, done: Any = None,
               on_point: Callable[[Grid], None] | None = None, progress: RunProgress | None = None) -> Grid:
    """Run (or take from ``done``, a resume.Completed) every point; a point that raises RuntimeError,
    MemoryError or ValueError is recorded as failed and the others go on (bad input still stops). ``progress``
    counts the points (``run_point`` advances its requests)."""
    grid = Grid()
    for label, gamma, repeat in points:
        key = (label, repeat)
        resumed = done is not None and key in done
        if resumed:
            log.info("resume: %s%s already complete, skipped", label, f" repeat {repeat}" if repeat else "")
            summary = done.summaries[key]
            grid.requests.append(done.requests[key])
            grid.cycles.append(done.cycles[key])
            if progress is not None:
                progress.skip(len(done.requests[key]), points=1)
        else:
            try:
                req, cyc, summary = run_point(label, gamma)
                grid.requests.append(_tag(req, repeat))
                grid.cycles.append(_tag(cyc, repeat))
            except SpectuneError:
                raise  # bad input is the user's to fix, not a failed measurement
            except (RuntimeError, MemoryError, ValueError) as err:
                summary = {"method": label, "gamma": gamma, "status": "failed", "error": f"{type(err).__name__}: {err}"}
                log.error(f"grid point {label} failed (repeat {repeat}): {summary['error']}")
            summary = {**summary, "repeat": repeat}
        grid.points.append(summary)
        if progress is not None and not resumed:
            progress.point_done()
        if on_point is not None:
            on_point(grid)
    return grid


def _method_order(points: list[dict[str, Any]]) -> list[tuple[str, int]]:
    seen: dict[str, int] = {}
    for p in points:
        seen.setdefault(p["method"], int(p.get("gamma", 0)))
    return list(seen.items())


def pooled(grid: Grid) -> list[dict[str, Any]]:
    """Per method, the repeats pooled (medians and pooled percentiles; no intervals): cheap, written after
    every point so a killed run's summary.json still describes what finished."""
    req, cyc = grid.frames()
    out = []
    for label, gamma in _method_order(grid.points):
        pts = [p for p in grid.points if p["method"] == label]
        ok = [p for p in pts if p.get("status") == "ok"]
        if not ok:
            out.append({"method": label, "gamma": gamma, "status": "failed", "repeats": 0,
                        "error": next((p.get("error") for p in pts if p.get("error")), None)})
            continue
        mine_req = req[req["method"] == label] if len(req) else req
        mine_cyc = cyc[cyc["method"] == label] if len(cyc) else cyc
        entry = {"method": label, "gamma": gamma, "status": "ok", **summarise_repeats(ok, mine_req, mine_cyc),
                 "policy": ok[0].get("policy"), "failed_repeats": len(pts) - len(ok)}
        out.append(entry)
    return out


def aggregate(grid: Grid, *, seed: int, slo: Mapping[str, float] | None = None, unit_size: int = 1
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-method summaries with CIs over units of ``unit_size`` consecutive prompts (1: the prompt; at
    concurrency > 1 the prompts batched together, :func:`unit_size_of`), and the ranking (by throughput; also by
    goodput when SLOs are set). ``seed`` seeds the latency percentiles' bootstrap."""
    methods = pooled(grid)
    req, _ = grid.frames()
    ok_points = [p for p in grid.points if p.get("status") == "ok"]
    if not ok_points or not len(req):
        return methods, {}
    gammas = {m["method"]: int(m["gamma"]) for m in methods}
    ok_methods = {m["method"] for m in methods if m["status"] == "ok"}
    req = req[req["method"].isin(ok_methods)]
    ok_keys = {(p["method"], int(p["repeat"])) for p in ok_points}
    req = req[[(m, int(r)) in ok_keys for m, r in zip(req["method"], req["repeat"], strict=True)]]
    durations = {(p["method"], int(p["repeat"])): float(p["duration_s"]) for p in ok_points}
    per_repeat = {m: [p["output_throughput"] for p in ok_points if p["method"] == m] for m in ok_methods}
    by_tp = compare(req, durations, per_repeat, gammas, unit_size=unit_size)
    by_name = {m["method"]: m for m in methods}
    for label, fields in by_tp.fields.items():
        by_name[label].update(fields)
        by_name[label].update(latency_intervals(req[req["method"] == label], seed=seed))
    ranking = {"output_throughput": _ranking(by_tp)}
    if slo:
        req = req.assign(good=good_requests(req, slo).to_numpy())
        good_per_repeat = {m: [int(req[(req["method"] == m) & (req["repeat"] == p["repeat"])]["good"].sum())
                               / float(p["duration_s"]) for p in ok_points if p["method"] == m] for m in ok_methods}
        by_gp = compare(req, durations, good_per_repeat, gammas, value="good", metric="request_goodput",
                        unit_size=unit_size)
        for label, fields in by_gp.fields.items():
            entry = by_name[label]
            entry["request_goodput"] = float(np.median(good_per_repeat[label]))
            entry.update({(f"goodput_{k}" if k in ("best", "indistinguishable_from_best", "mad_score") else k): v
                          for k, v in fields.items()})
            entry.update(p99_check(req[req["method"] == label], slo))
        ranking["request_goodput"] = _ranking(by_gp)
        ranking["slo"] = dict(slo)
    return methods, ranking


def _ranking(comp: Comparison) -> dict[str, Any]:
    return {"best": comp.best, "best_resolved": comp.best_resolved, "indistinguishable": comp.indistinguishable,
            "mad_pick": comp.mad_pick,
            "noise_floor_pct": comp.noise_floor_pct, "statistics": comp.statistics,
            "aa_label": AA_LABEL if comp.noise_floor_pct is not None else None}
