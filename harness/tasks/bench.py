"""`python -m harness +workload=it`: the AR baseline and a γ grid, measured side by side, with repeats.

Each grid point runs the same requests through the same engine, ``task.repeats`` times, the methods in an
order rotated per repeat (ABC, BCA, CAB, ...). A point is one (method, repeat): results are rewritten
atomically after every point, so a killed or failing run keeps everything that finished (and
``resume=true`` runs only the rest); a point that raises (e.g. out of memory) is recorded as failed with
its error and the sweep goes on. At the end every method gets CIs from a paired (repeat, prompt)
cluster bootstrap, the best method and its indistinguishable set are marked beside the MAD rule's
pick, and with ``task.noise_floor=true`` the AR baseline runs twice per repeat (the A/A noise floor). With
``task.block_prompts=N`` the methods of a repeat run block by block of N prompts (:mod:`spectune.measure.interleave`),
so that a drifting machine drifts under every method alike; a repeat is then the unit of resuming. The methods run on
the configured engine (``engine=spectune``, in process, or ``engine=llamacpp``: one llama-server per method, all up
for the whole run and stopped at its end, on failure and on a signal); a server that fails fails its method's
points, the others go on, and the run exits 1.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from analysis.bench_table import bench_table, format_category_table, format_ranking, format_table
from harness.tasks.compared import Compared, compared_methods, compared_policies
from harness.tasks.schemas import BenchFile, BenchTask
from policies.registry import make_policy
from spectune import hardware as hw
from spectune.config import typed
from spectune.engine.records import Request
from spectune.engines import engine_class
from spectune.engines.base import opened
from spectune.engines.server import ServerFailure
from spectune.errors import SpectuneError
from spectune.measure.confirm import against_ar
from spectune.measure.interleave import block_for, block_size, design_option, run_design
from spectune.measure.point import requests_of
from spectune.measure.repeats import Grid, aggregate, pooled, repeats_option, schedule
from spectune.methods import AA, AA_LABEL, AR, BASELINE, FIXED, Method
from spectune.options import check_gamma, fresh_prompts, integer
from spectune.run import conditions, resume, rundir
from spectune.run.metadata import base_metadata
from spectune.stats.by_category import by_category, categories_of, durations_of, records, several_categories
from spectune.stats.by_phase import by_phase, format_phase_table
from spectune.stats.client_cost import client_cost, client_cost_line
from spectune.stats.compare import throughput_units
from spectune.stats.goodput import parse_slo
from spectune.stats.intervals import paired_ratio_interval
from spectune.stats.units import unit_size_of, units_needed
from workloads.categories import CHAT_LINES
from workloads.regimes import check_regimes

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
    design: str = "interleaved"  # "blocked": every method runs all prompts at once (spectune.measure.interleave)
    target_mde: float | None = None  # plan the prompts from a pilot so the run resolves this speedup (0.03: 3%)
    pilot_prompts: int = 8  # the pilot's prompts (never reused by the planned run)
    confirm_prompts: int | None = None  # confirm the top estimate against AR on this many fresh prompts
    phases: dict[str, int] | None = None  # workload.phases: each phase's concurrency, in run order (closed loop)
    engine: str = "spectune"  # what runs the methods (conf/engine/)
    method_names: tuple[str, ...] = ()  # what names the speculative methods: a server's spec types (none: the policy)
    compare: Compared = ()  # task.compare: more policies (node, γ values) in the same interleaved grid

    @property
    def batch(self) -> int:
        """The concurrency units and blocks are sized by: every phase's divides it (no phases: ``concurrency``)."""
        return math.lcm(*self.phases.values()) if self.phases else self.concurrency

    @property
    def unit_size(self) -> int:
        """Prompts per independent unit of the intervals (spectune.measure.unit_size_of)."""
        return unit_size_of(self.batch, self.block_prompts)

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> BenchSettings:
        """The bench knobs, before any model loads: their types from the schema (harness/tasks/schemas.py), then
        the ranges and the rules across keys here; each error one line (SpectuneError) naming the key."""
        f = typed(BenchFile, cfg)
        t = f.task
        gammas = tuple(f.gamma) if isinstance(f.gamma, list) else (f.gamma,)
        for g in gammas:
            check_gamma(g, "each γ of the grid (the AR baseline is task.baseline=true)")
        if len(set(gammas)) != len(gammas):
            raise SpectuneError(f"gamma={list(gammas)} is invalid: each γ may appear once")
        if not gammas:
            raise SpectuneError("gamma=[] is invalid: give at least one γ >= 1 (task.baseline=true adds AR)")
        c = f.concurrency
        if c < 1:
            raise SpectuneError(f"concurrency={c!r} is invalid: must be an integer >= 1")
        rate = f.request_rate
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise SpectuneError(f"request_rate={rate!r} is invalid: must be a finite number > 0 (req/s) "
                                "or null (closed loop)")
        if not (math.isfinite(f.burstiness) and f.burstiness > 0):
            raise SpectuneError(f"burstiness={f.burstiness!r} is invalid: must be a finite number > 0 "
                                "(1 = Poisson)")
        if t.warmup < 0:
            raise SpectuneError(f"task.warmup={t.warmup!r} is invalid: must be an integer >= 0")
        policy = OmegaConf.to_container(cfg.policy, resolve=True)
        for g in gammas:  # an unknown policy or a bad parameter fails here, before any model loads
            make_policy(policy, g)
        engine = str(cfg.engine.name) if cfg.get("engine") else "spectune"
        names = engine_class(engine).method_names(cfg)  # a bad engine setting: one line, before any model loads
        server = not getattr(engine_class(engine), "in_process", False)  # a server per method, its own drafts
        if server and policy["name"] != FIXED:
            raise SpectuneError(f"policy={policy['name']} is invalid with engine={engine}: a draft-length policy runs "
                                f"on engine=spectune; engine={engine} drafts with its own type, fixed γ per server")
        if t.compare and server:
            raise SpectuneError(f"task.compare is invalid with engine={engine}: draft-length policies run on "
                                "engine=spectune (list a server's types in its engine settings)")
        engine_class(engine).check_config(cfg, [Method(n, g) for n in names for g in gammas])
        compare = compared_policies(t.compare, gammas, [Method(n, g).label for n in names for g in gammas])
        repeats = repeats_option(t.repeats)
        if t.noise_floor and not t.baseline:
            raise SpectuneError("task.noise_floor=true is invalid with task.baseline=false: the noise floor is "
                                "the A/A spread of the AR baseline")
        slo = parse_slo(OmegaConf.to_container(cfg.slo, resolve=True) if cfg.get("slo") is not None else None)
        phases = {p.name: p.concurrency for p in check_regimes(cfg.get("workload")).phases} or None
        if phases and rate is not None:
            raise SpectuneError(f"request_rate={rate} is invalid with workload.phases: phases run in a closed loop "
                                "(request_rate=null)")
        if phases and server:
            raise SpectuneError(f"workload.phases is invalid with engine={engine}: phases run on engine=spectune (a "
                                "server's slots are set when it starts)")
        batch = math.lcm(*phases.values()) if phases else c
        against = "workload.phases' concurrencies" if phases else f"concurrency={c}"
        block = block_size(t.block_prompts, "task.block_prompts", list(phases.values()) if phases else [c], against)
        design = design_option(t.design, "task.design", block, rate)
        unit = unit_size_of(batch, block_for(design, block, batch))
        target, pilot = _planning(t, bool(cfg.get("resume")), unit)
        confirm = _confirming(t, unit)
        if phases and (target is not None or confirm is not None):
            raise SpectuneError("task.target_mde and task.confirm_prompts are invalid with workload.phases: each "
                                "phase's token_budget decides its prompts (set both to null)")
        return cls(gammas, t.baseline, policy, c, rate, f.burstiness, t.warmup, repeats, t.noise_floor, slo,
                   block_for(design, block, batch), design, target, pilot, confirm, phases, engine, names, compare)

    def methods(self) -> list[Method]:
        """The grid's methods: AR (and its A/A duplicate) and one per (name, γ): on a server engine each of its
        speculative types at each γ, on spectune's the policy at each γ, then ``task.compare``'s policies. A
        method's settings are its policy's node (what :func:`make_policy` builds it from)."""
        points = [AR] if self.baseline else []
        if self.baseline and self.noise_floor:
            points.append(AA)
        names = self.method_names or (str(self.policy["name"]),)
        return (points + [Method(n, g, settings=self.policy) for n in names for g in self.gammas]
                + compared_methods(self.compare))

    def pairs(self) -> list[tuple[str, int]]:
        """(label, γ) per method: what schedules, resumes and aggregates key on."""
        return [(m.label, m.gamma) for m in self.methods()]


def _planning(task: BenchTask, resume: bool, unit: int) -> tuple[float | None, int]:
    """``task.target_mde`` (null, or a relative speedup in (0, 1)) and ``task.pilot_prompts`` (at least two units)."""
    target, pilot = task.target_mde, task.pilot_prompts
    if target is None:
        return None, 8 if pilot is None else pilot
    if not (math.isfinite(target) and 0 < target < 1):
        raise SpectuneError(f"task.target_mde={target!r} is invalid: must be a relative speedup in (0, 1), e.g. 0.03, "
                            "or null")
    if not task.baseline:
        raise SpectuneError(f"task.target_mde={target} is invalid with task.baseline=false: the plan is for speedups "
                            "over the AR baseline")
    if resume:
        raise SpectuneError(f"task.target_mde={target} is invalid with resume=true: a planned run starts afresh")
    pilot = integer(pilot, "task.pilot_prompts", lo=2 * unit)
    if pilot % unit:
        raise SpectuneError(f"task.pilot_prompts={pilot} is invalid: must be a multiple of the unit ({unit} prompts)")
    return target, pilot


def _confirming(task: BenchTask, unit: int) -> int | None:
    """``task.confirm_prompts``: null, or at least two units of fresh prompts on which the top estimate is measured
    again against AR (a γ picked on some prompts is confirmed on others)."""
    value = task.confirm_prompts
    if value is None:
        return None
    if not task.baseline:
        raise SpectuneError(f"task.confirm_prompts={value} is invalid with task.baseline=false: the top estimate is "
                            "confirmed against AR")
    return fresh_prompts(value, "task.confirm_prompts", unit)


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
    for prompt in workload.prompts:
        need = len(prompt.input_ids) + workload.max_new_tokens + 1
        if max_context is not None and need > max_context:
            raise SpectuneError(f"prompt {prompt.id!r} needs {need} positions (prompt {len(prompt.input_ids)} + "
                                f"max_new_tokens {workload.max_new_tokens} + 1); the context is {max_context}: "
                                "shorten the prompt or lower max_new_tokens")
    arrivals = arrival_times(len(workload.prompts), settings.request_rate, settings.burstiness, workload.seed)
    requests = requests_of(workload.prompts, workload.max_new_tokens, workload.ignore_eos, arrivals)
    if settings.phases:  # a unit of the intervals never spans two phases
        for name, count in Counter(r.phase for r in requests).items():
            if count % settings.unit_size:
                raise SpectuneError(f"workload.phases: phase {name!r} has {count} requests, not a multiple of the "
                                    f"unit ({settings.unit_size} prompts): raise its token_budget to a multiple of "
                                    f"{settings.unit_size} x max_new_tokens ({workload.max_new_tokens})")
    return requests


def run(cfg: DictConfig, run_dir: Path) -> int:
    if "workload" not in cfg:
        raise SpectuneError("no workload selected: add +workload=NAME (it, en, zh, es or mix)")
    settings = BenchSettings.from_cfg(cfg)
    points = schedule(settings.pairs(), settings.repeats)  # rotated order per repeat
    keys = [(label, repeat) for label, _, repeat in points]  # the unit of work and of resuming
    done = resume.load_completed(run_dir, cfg, keys) if resume.wants_resume(cfg, run_dir) else resume.Completed()
    done = conditions.whole_repeats(done, keys)  # a partial repeat reruns whole, in this allocation
    if done.covers(keys):  # decided before any model loads
        log.info("resume: all %d grid points are complete in %s; nothing to run", len(keys), run_dir)
        grid = Grid([done.summaries[k] for k in keys], [done.requests[k] for k in keys],
                    [done.cycles[k] for k in keys])
        methods, ranking = aggregate(grid, seed=int(cfg.seed), slo=settings.slo, unit_size=settings.unit_size)
        _log_table(methods, ranking, grid.points, category_breakdown(grid, settings.unit_size))
        log.info(f"results: {run_dir}")
        return _exit_code(methods, grid.points)

    from workloads.loader import load_workload  # heavy imports only once the config is valid
    from workloads.setup import measuring_engine, models_of

    models = models_of(cfg)
    workload = load_workload(_workload_cfg(cfg, settings), models.tokenizer)
    max_context = models.max_context
    requests = build_requests(workload, settings, max_context)
    engine = measuring_engine(cfg, models, workload.sampling, lambda m: make_policy(dict(m.settings), m.gamma),
                              slots=settings.concurrency, log_dir=run_dir / "servers")
    with opened(engine, settings.methods()):
        return _measured(cfg, run_dir, settings, models, workload, requests, engine, keys, done)


def _measured(cfg: DictConfig, run_dir: Path, settings: BenchSettings, models: Any, workload: Any,
              requests: list[Request], engine: Any, keys: list[tuple[str, int]], done: Any) -> int:
    """The grid on an opened engine: the metadata, the pilot and the planned run, the confirmation, the table."""
    metadata = {**base_metadata(), "task": "bench", "models": models.pair.metadata,
                "hardware": hw.describe(cfg.hardware, models.device), "workload": workload.describe(),
                "sampling": vars(workload.sampling), "sampler": cfg.sampler,
                "settings": vars(settings), "engine": engine.describe(),
                "load": "closed loop" if settings.request_rate is None else "open loop",
                "config": OmegaConf.to_container(cfg, resolve=True), "job": resume.job_identity(),
                "resumed_points": [label if r == 0 else f"{label} repeat {r}" for label, r in keys
                                   if (label, r) in done]}
    rundir.METADATA.write(run_dir, metadata)

    def measure(part: list[Request], where: Path, done: Any = None, methods: list[Method] | None = None,
                what: str = "measuring") -> Grid:
        def write(grid: Grid) -> None:
            _write(where, workload.name, settings, grid)

        return run_design(engine, part, methods or settings.methods(), settings.repeats,
                          block_prompts=settings.block_prompts, concurrency=settings.concurrency,
                          warmup=settings.warmup, done=done, on_point=write, what=what, phases=settings.phases)

    fresh: list[Request] = []
    if settings.target_mde is None and settings.confirm_prompts is not None:  # keep the configured prompt count
        count = cfg.workload.num_prompts
        requests, fresh = (requests, []) if count is None else (requests[:count], requests[count:])
    if settings.target_mde is not None:
        pilot, requests = requests[:settings.pilot_prompts], requests[settings.pilot_prompts:]
        plan = plan_prompts(measure(pilot, run_dir / "pilot", what="pilot"), settings, available=len(requests))
        _write(run_dir / "pilot", workload.name, settings, Grid(), {"plan": plan})
        requests, fresh = requests[:plan["prompts"]], requests[plan["prompts"]:]
        metadata["plan"] = plan
        rundir.METADATA.write(run_dir, metadata)
    grid = measure(requests, run_dir, done)
    methods, ranking = aggregate(grid, seed=int(cfg.seed), slo=settings.slo, unit_size=settings.unit_size)
    tp = ranking.get("output_throughput", {})
    final = {"noise_floor_pct": tp.get("noise_floor_pct"), "statistics": tp.get("statistics"), "ranking": ranking,
             "methods": methods}
    per_category = category_breakdown(grid, settings.unit_size)
    answers = target_answers(grid, models, workload.max_new_tokens)
    if per_category is not None:
        final["by_category"] = per_category
    per_phase = by_phase(grid.frames()[0], concurrency=settings.phases)
    if per_phase:
        final["by_phase"] = per_phase
    client = client_cost(grid.frames()[0])
    if client:
        final["client_cost"] = client
    if answers is not None:
        final["answers_by_category"] = records(answers.reset_index())
    _write(run_dir, workload.name, settings, grid, final)
    metadata["engine"] = engine.describe()  # as it ended: a server's restarts, a server that failed
    rundir.METADATA.write(run_dir, metadata)
    if settings.confirm_prompts is not None:
        final["confirmation"] = _confirm(tp.get("best"), fresh[:settings.confirm_prompts], settings,
                                         lambda part, pair: measure(part, run_dir / "confirm", methods=pair,
                                                                    what="confirmation"))
        _write(run_dir, workload.name, settings, grid, final)

    note = f" ({models.pair.metadata['weights_note']})" if models.pair.metadata.get("weights_note") else ""
    batch = (f"phases={','.join(f'{n}(c{c})' for n, c in settings.phases.items())}" if settings.phases
             else f"concurrency={settings.concurrency}")
    log.info(f"\nworkload={workload.name}  models={cfg.models.name}{note}  hardware={cfg.hardware.name}  "
             f"{batch}  {metadata['load']}  prompts={len(requests)}  "
             f"max_new_tokens={workload.max_new_tokens}  repeats={settings.repeats}")
    _log_table(methods, ranking, grid.points, per_category, answers)
    if per_phase:
        log.info("per phase (each phase's own span; speed-up over ar in the same phase, a point estimate):\n%s",
                 format_phase_table(per_phase))
    if client:
        log.info(client_cost_line(client))
    log.info(f"results: {run_dir}")
    return _exit_code(methods, grid.points)


def _workload_cfg(cfg: DictConfig, settings: BenchSettings) -> DictConfig:
    """The workload as configured; a planned or confirmed run (task.target_mde, task.confirm_prompts) draws from
    all of its prompts: the plan decides how many it takes, the confirmation takes fresh ones after them."""
    if settings.target_mde is None and settings.confirm_prompts is None:
        return cfg.workload
    node = cfg.workload.copy()
    node.num_prompts = None
    return node


def _write(where: Path, workload: str, settings: BenchSettings, grid: Grid, final: dict[str, Any] | None = None
           ) -> None:
    """The run's three files, rewritten together after every point (``final``: the summary's body at the end; a
    summary of ``{"plan": ...}`` alone merges the plan into the pilot's summary)."""
    if final is not None and set(final) == {"plan"}:
        summary = rundir.SUMMARY.read(where)
        rundir.SUMMARY.write(where, {**summary, **final})
        return
    req, cyc = grid.frames()
    body = final or {"methods": pooled(grid)}
    with resume.deferred_signals():  # a SIGTERM now waits until the three files agree
        if len(req):
            rundir.REQUESTS.write(where, req)
            rundir.CYCLES.write(where, cyc)
        rundir.SUMMARY.write(where, {"workload": workload, "repeats": settings.repeats, **body,
                                     **conditions.summary_fields(grid.points), "points": grid.points})


def plan_prompts(pilot: Grid, settings: BenchSettings, available: int) -> dict[str, Any]:
    """How many prompts the planned run takes: per method, its pilot SD of a unit's log speedup over AR, and the
    units it needs for ``settings.target_mde`` (:func:`spectune.stats.units.units_needed`); the most any method
    needs, in prompts. More than the workload holds past the pilot is an error (the pilot's files are kept)."""
    req, _ = pilot.frames()
    ok = [p for p in pilot.points if p.get("status") == "ok"]
    durations = {(p["method"], int(p["repeat"])): float(p["duration_s"]) for p in ok}
    req = req[[(m, int(r)) in durations for m, r in zip(req["method"], req["repeat"], strict=True)]]
    units = throughput_units(req, durations, unit_size=settings.unit_size)
    per_method: dict[str, Any] = {}
    for label in units.num:
        if label in (BASELINE, AA_LABEL):
            continue
        iv = paired_ratio_interval(units.num[label], units.den[label], units.num[BASELINE], units.den[BASELINE])
        sd = (iv.se or 0.0) * math.sqrt(iv.n)  # the units' SD (a pilot's two or three repeats cannot plan the
        # method x repeat component: the planned run's interval still adds it)
        per_method[label] = {"pilot_sd_pct": 100 * sd, "units": units_needed(sd, iv.n, settings.target_mde)}
    if not per_method:
        raise SpectuneError("task.target_mde: the pilot measured no method against ar (every point failed)")
    need = max(m["units"] for m in per_method.values()) * settings.unit_size
    plan = {"target_mde": settings.target_mde, "pilot_prompts": settings.pilot_prompts, "pilot_units": units.n,
            "bound": "80% upper confidence limit of the pilot SD", "per_method": per_method, "prompts": need}
    log.info("plan: MDE %.1f%% needs %d prompts (%s)", 100 * settings.target_mde, need,
             ", ".join(f"{m} SD {v['pilot_sd_pct']:.1f}% -> {v['units']} units" for m, v in per_method.items()))
    if need > available:
        raise SpectuneError(f"task.target_mde={settings.target_mde} needs {need} prompts after the pilot, the workload "
                            f"has {available}: raise the target, or use a workload with more prompts")
    return plan


def _confirm(top: str | None, fresh: list[Request], settings: BenchSettings, measure: Any) -> dict[str, Any]:
    """The top estimate against AR again, on ``fresh`` prompts the grid never saw (:func:`against_ar`): a γ picked
    on some prompts is confirmed (or not) on others. The confirmation run is ``RUN/confirm/``; its verdict is logged."""
    if top is None or top == BASELINE:
        log.info("confirmation: nothing to confirm (the top estimate is %s)", top or "missing")
        return {"method": top, "status": "nothing to confirm"}
    if len(fresh) < settings.confirm_prompts:
        log.warning("confirmation: %d fresh prompts left, %d asked; not confirmed", len(fresh),
                    settings.confirm_prompts)
        return {"method": top, "status": f"not enough fresh prompts ({len(fresh)})"}
    method = next(m for m in settings.methods() if m.label == top)
    return against_ar(measure, method, fresh, unit_size=settings.unit_size)


def category_breakdown(grid: Grid, unit_size: int) -> list[dict[str, Any]] | None:
    """Per (method, category) rows (:func:`spectune.stats.by_category.by_category`) when the run holds several
    categories, else None: one category's breakdown is the overall table again."""
    req, cyc = grid.frames()
    if not several_categories(req):
        return None
    return records(by_category(req, cyc, durations_of(grid.points), unit_size=unit_size))


def target_answers(grid: Grid, models: Any, max_new_tokens: int) -> pd.DataFrame | None:
    """What the target answered per (language, category) (:mod:`workloads.answers`), from the baseline's first repeat
    (the first method's where the run has no baseline); None for a run of dialogue lines only, which ask for no
    task the target could fail to perform."""
    from workloads.answers import answers_by_category, draft_vocabulary, reading

    req, _ = grid.frames()
    if not len(req) or set(categories_of(req)) <= {CHAT_LINES}:
        return None
    method = BASELINE if BASELINE in set(req["method"]) else str(req["method"].iloc[0])
    mine = req[req["method"] == method]
    mine = mine[mine["repeat"] == mine["repeat"].min()]
    decode, eos_ids = reading(models.tokenizer)
    return answers_by_category(mine, decode, eos_ids, max_new_tokens, draft_vocabulary(models.pair.draft))


def _log_table(methods: list[dict[str, Any]], ranking: dict[str, Any], points: list[dict[str, Any]],
               per_category: list[dict[str, Any]] | None = None, answers: pd.DataFrame | None = None) -> None:
    log.info(format_table(bench_table(methods, ranking)))
    for line in format_ranking(ranking, methods):
        log.info(line)
    if per_category:
        log.info("\n" + format_category_table(per_category))  # a blank line between the tables
    if answers is not None:
        from workloads.answers import warnings

        log.info("\nwhat the target answered per category (ar, first repeat):\n%s",
                 answers.dropna(axis=1, how="all").to_string())  # e.g. draft_vocab_coverage of a full-vocabulary draft
        for line in warnings(answers):
            log.warning(line)
    conditions.warn_flagged(conditions.assess(points))


def _exit_code(summaries: list[dict[str, Any]], points: list[dict[str, Any]]) -> int:
    """3 when every grid point failed (nothing was measured); 1 when a server failed (crashed, never ready, port
    in use: its points are recorded as failed, the others measured); else 0."""
    failed = [s["method"] for s in summaries if s["status"] != "ok"]
    if failed and len(failed) == len(summaries):
        return 3
    server = f"{ServerFailure.__name__}:"
    return 1 if any(str(p.get("error") or "").startswith(server) for p in points if p.get("status") != "ok") else 0
