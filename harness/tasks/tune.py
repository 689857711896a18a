"""`python -m harness task=tune +workload=it 'task.concurrency=[1,4,8]'`: which γ to run at each load.

For every concurrency (and language, with ``task.languages``) the AR baseline (γ = 0: speculation off)
and the fixed-γ grid run ``task.repeats`` times in rotated order, exactly as `task=bench` measures them.
Per cell the best γ is the highest pooled throughput — or, when SLOs are set, the highest request goodput
— with its paired CI against AR, the set of γ indistinguishable from it and the MAD rule's pick.

``recommendation.json`` holds that table and the same choice in the form vLLM reads (since v0.25.0; checked on
v0.34.0) for a per-batch-size speculative length (``num_speculative_tokens_per_batch_size`` in
``--speculative-config``: a list of ``[start_bs, end_bs, K]``, K = 0 meaning no drafting; see vLLM's "Dynamic
Speculative Decoding" docs and spectune/vllm_export.py). It holds only for the measured pair, hardware and workload.

With ``task.validate_prompts=N`` each cell's γ from the map then runs again against AR, in the grid's design and
repeats, on the N prompts that follow the grid's (never one it measured): a pick is the best of several noisy
estimates, so its own estimate flatters it. The speed-up on fresh prompts, its paired 95% CI and whether the choice
held (faster than AR / not resolved / slower) go into ``recommendation.json`` under ``validation``; each cell's run
is ``RUN/validate/<workload>_c<concurrency>/``.

On a server engine (``engine=llamacpp``, ``vllm``, ``sglang``) each cell starts its own servers (a server's slots
are set when it starts: one per method at that concurrency, logs in ``RUN/servers/<workload>_c<concurrency>/``), a
method is the engine's speculative type at a length, and each cell's pick is ``best_method`` (with
``engine.spec_type`` listing several types, the type and the length together); the vLLM form is written for
spectune's own engine only.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from analysis.bench_table import bench_table, format_category_table, format_ranking, format_table
from harness.tasks.bench import BenchSettings, build_requests, category_breakdown
from harness.tasks.schemas import TuneFile
from policies.registry import make_policy
from spectune import hardware as hw
from spectune.config import typed
from spectune.engine import proposers
from spectune.engine.records import Request
from spectune.engines import engine_class
from spectune.engines.base import opened
from spectune.errors import SpectuneError
from spectune.measure.confirm import against_ar
from spectune.measure.interleave import block_for, block_size, design_option, run_design
from spectune.measure.repeats import Grid, aggregate, pooled, repeats_option
from spectune.methods import BASELINE, FIXED, Method
from spectune.options import as_list, fresh_prompts, integer
from spectune.run import conditions, rundir
from spectune.run.metadata import base_metadata
from spectune.stats.goodput import parse_slo
from spectune.stats.units import unit_size_of
from spectune.vllm_export import vllm_form
from workloads.regimes import refuse_phases

log = logging.getLogger(__name__)

BUNDLED_LANGUAGES = ("it", "en", "zh", "es")


@dataclass(frozen=True)
class TuneSettings:
    gammas: tuple[int, ...]
    concurrencies: tuple[int, ...]
    languages: tuple[str, ...] | None
    repeats: int
    warmup: int
    slo: dict[str, float]
    request_rate: float | None
    burstiness: float
    noise_floor: bool = False  # AR twice per repeat: the A/A row is each cell's measured noise floor
    block_prompts: int | None = None  # the interleaved block size given (None: one batch per block)
    design: str = "interleaved"  # "blocked": every method runs all prompts at once (spectune.measure.interleave)
    validate_prompts: int | None = None  # the map's γ against AR again on this many fresh prompts per cell
    method_names: tuple[str, ...] = ()  # what names the engine's speculative methods (none: the policy's name)
    engine: str = "spectune"  # what runs the methods (conf/engine/): spectune's own, or a server per method

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> TuneSettings:
        """The tune knobs, before any model loads: their types from the schema (harness/tasks/schemas.py), then
        the ranges and the rules across keys here; each error one line (SpectuneError) naming the key."""
        f = typed(TuneFile, cfg)
        t = f.task
        gammas = tuple(integer(g, "gamma", lo=1) for g in as_list(f.gamma, "gamma"))
        concurrencies = tuple(integer(c, "task.concurrency", lo=1) for c in as_list(t.concurrency,
                                                                                         "task.concurrency"))
        if len(set(concurrencies)) != len(concurrencies):
            raise SpectuneError(f"task.concurrency={list(concurrencies)} is invalid: each concurrency once")
        languages = None
        if t.languages is not None:
            languages = tuple(str(x) for x in as_list(t.languages, "task.languages"))
            for lang in languages:
                if lang not in BUNDLED_LANGUAGES:
                    raise SpectuneError(f"task.languages={list(languages)} is invalid: {lang!r} is not a bundled "
                                        f"language ({', '.join(BUNDLED_LANGUAGES)})")
        if cfg.policy.name != FIXED:
            raise SpectuneError(f"policy={cfg.policy.name} is invalid for task=tune: it tunes a fixed γ "
                                "(policy=fixed), the K a vLLM deployment takes")
        rate = t.request_rate
        if rate is not None and rate <= 0:
            raise SpectuneError(f"task.request_rate={rate!r} is invalid: must be > 0 (req/s) or null (closed loop)")
        block = block_size(t.block_prompts, "task.block_prompts", list(concurrencies),
                           f"task.concurrency={list(concurrencies)}")
        design = design_option(t.design, "task.design", block, rate)
        unit = math.lcm(*(unit_size_of(c, block_for(design, block, c)) for c in concurrencies))
        validate = fresh_prompts(t.validate_prompts, "task.validate_prompts", unit)
        if validate is not None and cfg.get("workload") is not None and cfg.workload.get("num_prompts") is None:
            raise SpectuneError(f"task.validate_prompts={validate} is invalid with workload.num_prompts=null: the "
                                "grid takes every prompt and leaves none fresh; set workload.num_prompts")
        engine = str(cfg.engine.name) if cfg.get("engine") else "spectune"
        names = engine_class(engine).method_names(cfg)  # a bad engine setting: one line, before any model loads
        engine_class(engine).check_config(cfg, [Method(n, g) for n in names for g in gammas])
        return cls(gammas, concurrencies, languages, repeats_option(t.repeats),
                   integer(t.warmup, "task.warmup", lo=0), parse_slo(_slo_node(cfg)), rate, t.burstiness,
                   t.noise_floor, block, design, validate, names, engine)

    def bench(self, policy: dict[str, Any], concurrency: int) -> BenchSettings:
        return BenchSettings(self.gammas, True, policy, concurrency, self.request_rate, self.burstiness, self.warmup,
                             noise_floor=self.noise_floor,
                             block_prompts=block_for(self.design, self.block_prompts, concurrency), design=self.design,
                             method_names=self.method_names)


def _slo_node(cfg: DictConfig) -> dict[str, Any] | None:
    slo = cfg.get("slo")
    return OmegaConf.to_container(slo, resolve=True) if slo is not None else None


def _workload_cfgs(cfg: DictConfig, languages: tuple[str, ...] | None) -> list[DictConfig]:
    """The selected workload, or one per asked language: the same settings on that language's bundled set."""
    if languages is None:
        return [cfg.workload]
    out = []
    for lang in languages:
        node = OmegaConf.create(OmegaConf.to_container(cfg.workload, resolve=True))
        node.name, node.language, node.path = lang, lang, f"workloads/prompts/{lang}.jsonl"
        out.append(node)
    return out


def run(cfg: DictConfig, run_dir: Path) -> int:
    if "workload" not in cfg:
        raise SpectuneError("no workload selected: add +workload=NAME (it, en, zh, es or mix)")
    settings = TuneSettings.from_cfg(cfg)  # the engine's methods and settings too: one line, before any model loads
    refuse_phases(cfg.workload, "task=tune")
    policy = OmegaConf.to_container(cfg.policy, resolve=True)
    from workloads.loader import load_workload  # heavy imports only once the config is valid
    from workloads.setup import engine_of, measuring_engine, models_of

    models = models_of(cfg)
    pair = models.pair
    workload_cfgs = _workload_cfgs(cfg, settings.languages)
    workloads = [load_workload(w, pair.tokenizer) for w in workload_cfgs]
    max_context = models.max_context
    fresh = {w.name: fresh_prompts_after(node, w, settings.validate_prompts, pair.tokenizer)
             for node, w in zip(workload_cfgs, workloads, strict=True)} if settings.validate_prompts else {}
    inner: list[Any] = []  # spectune's in-process engine, built once on the loaded models (a server engine: none)

    def engine_for(workload: Any, concurrency: int, log_dir: Path) -> Any:
        """The configured engine for one cell, not yet opened: a server engine's slots are set when it starts."""
        def inprocess() -> Any:
            if not inner:
                inner.append(engine_of(cfg, models, workload.sampling))
            inner[0].sampling = workload.sampling
            return inner[0]

        return measuring_engine(cfg, models, workload.sampling, lambda m: make_policy(policy, m.gamma),
                                slots=concurrency, log_dir=log_dir, inprocess=inprocess)

    metadata = {**base_metadata(), "task": "tune", "models": pair.metadata,
                "hardware": hw.describe(cfg.hardware, models.device), "workloads": [w.describe() for w in workloads],
                "sampling": vars(workloads[0].sampling), "sampler": cfg.sampler, "settings": vars(settings),
                "engine": settings.engine, "config": OmegaConf.to_container(cfg, resolve=True)}
    rundir.METADATA.write(run_dir, metadata)

    cells: list[dict[str, Any]] = []
    frames: list[tuple[pd.DataFrame, pd.DataFrame]] = []
    engines: dict[str, Any] = {}
    for workload in workloads:
        for c in settings.concurrencies:
            bench = settings.bench(policy, c)
            requests = build_requests(workload, bench, max_context)
            tag = {"language": workload.language, "workload": workload.name, "concurrency": c}
            log.info(f"tune: {workload.name} concurrency={c}: {len(bench.methods())} methods x {settings.repeats} "
                     f"repeats x {len(requests)} prompts")

            def write(grid: Grid, tag: dict[str, Any] = tag) -> None:
                _write(run_dir, frames, grid, tag, cells)

            measured = engine_for(workload, c, run_dir / "servers" / f"{workload.name}_c{c}")
            with opened(measured, bench.methods()):
                engines[f"{workload.name}_c{c}"] = measured.describe()
                grid = run_design(measured, requests, bench.methods(), settings.repeats,
                                  block_prompts=bench.block_prompts, concurrency=c, warmup=bench.warmup,
                                  on_point=write, what=f"tune {workload.name} c={c}")
            methods, ranking = aggregate(grid, seed=int(cfg.seed), slo=settings.slo, unit_size=bench.unit_size)
            per_category = category_breakdown(grid, bench.unit_size)
            cells.append({**tag, "methods": methods, **conditions.summary_fields(grid.points), "points": grid.points,
                          "ranking": ranking, **({"by_category": per_category} if per_category else {})})
            frames.append(_tagged(grid, tag))
            _write(run_dir, frames, None, tag, cells)
            log.info(f"\nworkload={workload.name}  concurrency={c}  repeats={settings.repeats}  "
                     f"prompts={len(requests)}  max_new_tokens={workload.max_new_tokens}")
            log.info(format_table(bench_table(methods, ranking)))
            for line in format_ranking(ranking, methods):
                log.info(line)
            if per_category:
                log.info("\n" + format_category_table(per_category))
            conditions.warn_flagged(cells[-1]["conditions"])
    metadata["engines"] = engines  # each cell's engine as it ran (a server's exact commands and build)
    rundir.METADATA.write(run_dir, metadata)

    recommendation = recommend(cells, settings, pair.metadata, metadata)
    rundir.RECOMMENDATION.write(run_dir, recommendation)
    log.info("\n" + format_recommendation(recommendation))
    if settings.validate_prompts is not None:
        def measuring(workload: Any, concurrency: int) -> Any:
            return engine_for(workload, concurrency, run_dir / "validate" / f"{workload.name}_c{concurrency}" /
                              "servers")

        recommendation["validation"] = validate_map(recommendation["recommendations"], settings, policy,
                                                    {w.name: w for w in workloads}, fresh, measuring, max_context,
                                                    run_dir)
        rundir.RECOMMENDATION.write(run_dir, recommendation)
        log.info("\n" + format_validation(recommendation["validation"]))
    log.info(f"results: {run_dir}")
    return 0 if any(cell["ranking"] for cell in cells) else 3


def _tagged(grid: Grid, tag: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    req, cyc = grid.frames()
    return req.assign(**tag), cyc.assign(**tag)


def _write(run_dir: Path, frames: list[tuple[pd.DataFrame, pd.DataFrame]], grid: Grid | None, tag: dict[str, Any],
           cells: list[dict[str, Any]]) -> None:
    """Rewrite the result files after every point: finished cells plus the one in progress (no CIs yet)."""
    pending = [_tagged(grid, tag)] if grid is not None else []
    done = [f for f in frames + pending if len(f[0])]
    if done:
        rundir.REQUESTS.write(run_dir, pd.concat([f[0] for f in done], ignore_index=True))
        rundir.CYCLES.write(run_dir, pd.concat([f[1] for f in done], ignore_index=True))
    partial = [{**tag, "methods": pooled(grid), "points": grid.points, "ranking": {}}] if grid is not None else []
    rundir.SUMMARY.write(run_dir, {"task": "tune", "cells": cells + partial})


def recommend(cells: list[dict[str, Any]], settings: TuneSettings, models: dict[str, Any],
              metadata: dict[str, Any]) -> dict[str, Any]:
    """Per (language, concurrency) the best γ and how sure it is; per language the vLLM form."""
    metric = "request_goodput" if settings.slo else "output_throughput"
    rows = []
    for cell in cells:
        rank = cell["ranking"].get(metric) if cell["ranking"] else None
        if not rank or rank.get("best") is None:
            rows.append({k: cell[k] for k in ("language", "workload", "concurrency")} | {"best_gamma": None,
                        "status": "failed"})
            continue
        by_name = {m["method"]: m for m in cell["methods"]}
        best = by_name[rank["best"]]
        row = {
            "language": cell["language"], "workload": cell["workload"], "concurrency": cell["concurrency"],
            "status": "ok", "chosen_by": metric, "best_method": rank["best"], "best_gamma": int(best["gamma"]),
            "speculation": best["gamma"] > 0,
            metric: best.get(metric), "speedup": best.get("speedup"),
            "speedup_ci95_lo": best.get("speedup_ci95_lo"), "speedup_ci95_hi": best.get("speedup_ci95_hi"),
            "indistinguishable_gammas": sorted({int(by_name[m]["gamma"]) for m in rank["indistinguishable"]}),
            "indistinguishable_methods": sorted(rank["indistinguishable"]),
            "mad_rule_gamma": int(by_name[rank["mad_pick"]]["gamma"]) if rank.get("mad_pick") else None,
            "noise_floor_pct": cell["ranking"]["output_throughput"].get("noise_floor_pct"),
            "statistics": rank["statistics"],
        }
        if metric == "request_goodput":  # the goodput of the chosen γ relative to AR's, paired
            row.update({k: best.get(k) for k in ("request_goodput_ratio", "request_goodput_ratio_ci95_lo",
                                                 "request_goodput_ratio_ci95_hi", "slo_p99_pass")})
        rows.append(row)
    vllm = {}
    # vLLM's per-batch-size lengths, for what spectune's proposers drafted; on a server engine the map is each cell's
    # best_method (its speculative type and length: a server setting, one server per concurrency)
    exportable = settings.engine == "spectune"
    for lang in dict.fromkeys(r["language"] for r in rows if exportable):
        best_k = {r["concurrency"]: r["best_gamma"] for r in rows if r["language"] == lang and r["status"] == "ok"}
        if best_k:
            drafted = proposers.vllm_method(metadata["config"].get("proposer"),
                                            (models["draft"] or {}).get("name_or_path"))
            vllm[lang] = vllm_form(best_k, drafted)
    return {
        "scope": "holds only for the measured model pair, hardware, workload and sampling settings below; "
                 "re-measure before using it elsewhere",
        "chosen_by": metric, "slo": settings.slo, "repeats": settings.repeats, "gammas": [0, *settings.gammas],
        "recommendations": rows, "vllm": vllm,
        "metadata": {k: metadata[k] for k in ("models", "hardware", "workloads", "sampling", "git", "packages")
                     if k in metadata},
    }


def format_recommendation(rec: dict[str, Any]) -> str:
    rows = []
    for r in rec["recommendations"]:
        if r["status"] != "ok":
            rows.append({"language": r["language"], "concurrency": r["concurrency"], "best γ": "failed"})
            continue
        lo, hi = r.get("speedup_ci95_lo"), r.get("speedup_ci95_hi")
        rows.append({"language": r["language"], "concurrency": r["concurrency"],
                     "best method": r.get("best_method", "-"),
                     "best γ": r["best_gamma"] if r["best_gamma"] else "0 (off)",
                     "speedup": f"{r['speedup']:.2f}" if r.get("speedup") is not None else "-",
                     "95% CI": f"[{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "-",
                     "indistinguishable γ": ",".join(map(str, r["indistinguishable_gammas"])),
                     "MAD rule γ": r["mad_rule_gamma"]})
    lines = [f"Recommendation (chosen by {rec['chosen_by']}; {rec['repeats']} repeats; γ = 0 is no speculation)",
             pd.DataFrame(rows).to_string(index=False)]
    for lang, form in rec["vllm"].items():
        lines.append(f"vLLM {form['vllm_version']} ({lang}): {form['cli']}")
    lines.append(rec["scope"])
    return "\n".join(lines)


def fresh_prompts_after(node: DictConfig, workload: Any, count: int, tokenizer: Any) -> list[Any]:
    """The ``count`` prompts that follow the grid's in the workload's own seeded order (the same workload read with
    no ``num_prompts``): prompts the grid never saw. Too few left is one line, before anything is measured."""
    from workloads.loader import load_workload

    spec = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    pool = load_workload({**spec, "num_prompts": None}, tokenizer).prompts
    used = len(workload.prompts)
    left = pool[used:]
    if len(left) < count:
        raise SpectuneError(f"task.validate_prompts={count} is invalid: workload {workload.name} has {len(left)} "
                            f"prompts left after the grid's {used} (workload.num_prompts); lower one of them")
    fresh = left[:count]
    grid_ids = {p.id for p in workload.prompts}
    assert grid_ids.isdisjoint(p.id for p in fresh), "a validation prompt is one the grid measured"
    return fresh


def validate_map(rows: list[dict[str, Any]], settings: TuneSettings, policy: dict[str, Any],
                 workloads: dict[str, Any], fresh: dict[str, list[Any]], engine_for: Any, max_context: int | None,
                 run_dir: Path) -> dict[str, Any]:
    """Per cell of the map, its γ against AR on the workload's fresh prompts (:func:`against_ar`, the mechanism
    of task=bench's confirmation), in the grid's design and repeats, on the engine ``engine_for(workload, c)`` gives
    (any :class:`~spectune.engines.base.MeasuringEngine`; on a server engine the γ is its speculative method at
    that length). Each cell's run is written to ``RUN/validate/<workload>_c<concurrency>/``."""
    out = []
    for row in rows:
        key = {k: row[k] for k in ("language", "workload", "concurrency")}
        gamma = row.get("best_gamma")
        if row["status"] != "ok" or not gamma:
            status = "grid failed" if row["status"] != "ok" else "speculation off (γ = 0): nothing to validate"
            out.append({**key, "gamma": gamma, "status": status, "held": None})
            continue
        workload, c = workloads[row["workload"]], row["concurrency"]
        bench = settings.bench(policy, c)
        method = next(m for m in bench.methods() if m.label == row["best_method"])
        requests = build_requests(replace(workload, prompts=fresh[workload.name]), bench, max_context)
        engine = engine_for(workload, c)
        where = run_dir / "validate" / f"{workload.name}_c{c}"

        def measure(part: list[Request], methods: list[Any], bench: Any = bench, c: int = c, engine: Any = engine,
                    where: Path = where, name: str = workload.name) -> Grid:
            with opened(engine, methods):  # a server engine: only the methods compared (AR and the map's), fresh
                return run_design(engine, part, methods, settings.repeats, block_prompts=bench.block_prompts,
                                  concurrency=c, warmup=bench.warmup, on_point=lambda g: _write_validation(where, g),
                                  what=f"validate {name} c={c}")

        result = against_ar(measure, method, requests, unit_size=bench.unit_size,
                            what=f"validation {workload.name} c={c}")
        rundir.SUMMARY.write(where, {**rundir.SUMMARY.read_if_present(where, {}), "validation": result})
        out.append({**key, **result})
    return {"prompts": settings.validate_prompts, "repeats": settings.repeats, "design": settings.design,
            "against": BASELINE, "cells": out}


def _write_validation(where: Path, grid: Grid) -> None:
    req, cyc = grid.frames()
    if len(req):
        rundir.REQUESTS.write(where, req)
        rundir.CYCLES.write(where, cyc)
    rundir.SUMMARY.write(where, {"task": "tune", "methods": pooled(grid), **conditions.summary_fields(grid.points),
                                 "points": grid.points})


def format_validation(validation: dict[str, Any]) -> str:
    rows = []
    for cell in validation["cells"]:
        lo, hi = cell.get("speedup_ci95_lo"), cell.get("speedup_ci95_hi")
        rows.append({"language": cell["language"], "concurrency": cell["concurrency"],
                     "map γ": cell["gamma"] if cell["gamma"] is not None else "-",
                     "speedup": f"{cell['speedup']:.2f}" if cell.get("speedup") is not None else "-",
                     "95% CI": f"[{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "-",
                     "held": cell["held"] or cell["status"]})
    return "\n".join([f"Validation of the map on {validation['prompts']} fresh prompts per cell (the map's γ against "
                      f"AR, {validation['repeats']} repeats, {validation['design']}; paired 95% CI)",
                      pd.DataFrame(rows).to_string(index=False)])
