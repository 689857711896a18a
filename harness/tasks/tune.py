"""`python -m harness task=tune +workload=it 'task.concurrency=[1,4,8]'`: which γ to run at each load.

For every concurrency (and language, with ``task.languages``) the AR baseline (γ = 0: speculation off)
and the fixed-γ grid run ``task.repeats`` times in rotated order, exactly as `task=bench` measures them.
Per cell the best γ is the highest pooled throughput — or, when SLOs are set, the highest request goodput
— with its paired CI against AR, the set of γ indistinguishable from it and the MAD rule's pick.

``recommendation.json`` holds that table and the same choice in the form vLLM reads (since v0.25.0; checked on
v0.34.0) for a per-batch-size speculative length (``num_speculative_tokens_per_batch_size`` in
``--speculative-config``: a list of ``[start_bs, end_bs, K]``, K = 0 meaning no drafting; see vLLM's "Dynamic
Speculative Decoding" docs and spectune/vllm_export.py). It holds only for the measured pair, hardware and workload.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
from spectune.engines.spectune import SpectuneEngine
from spectune.errors import SpectuneError
from spectune.measure.interleave import block_for, block_size, design_option, run_design
from spectune.measure.repeats import Grid, aggregate, pooled, repeats_option
from spectune.options import as_list, integer
from spectune.run import conditions, rundir
from spectune.run.metadata import base_metadata
from spectune.stats.goodput import parse_slo
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
        if cfg.policy.name != "fixed":
            raise SpectuneError(f"policy={cfg.policy.name} is invalid for task=tune: it tunes a fixed γ "
                                "(policy=fixed), the K a vLLM deployment takes")
        rate = t.request_rate
        if rate is not None and rate <= 0:
            raise SpectuneError(f"task.request_rate={rate!r} is invalid: must be > 0 (req/s) or null (closed loop)")
        block = block_size(t.block_prompts, "task.block_prompts", list(concurrencies),
                           f"task.concurrency={list(concurrencies)}")
        design = design_option(t.design, "task.design", block, rate)
        return cls(gammas, concurrencies, languages, repeats_option(t.repeats),
                   integer(t.warmup, "task.warmup", lo=0), parse_slo(_slo_node(cfg)), rate, t.burstiness,
                   t.noise_floor, block, design)

    def bench(self, policy: dict[str, Any], concurrency: int) -> BenchSettings:
        return BenchSettings(self.gammas, True, policy, concurrency, self.request_rate, self.burstiness, self.warmup,
                             noise_floor=self.noise_floor,
                             block_prompts=block_for(self.design, self.block_prompts, concurrency), design=self.design)


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
    settings = TuneSettings.from_cfg(cfg)
    refuse_phases(cfg.workload, "task=tune")
    from workloads.setup import require_in_process

    require_in_process(cfg, "tune")  # before any model loads
    policy = OmegaConf.to_container(cfg.policy, resolve=True)
    from workloads.loader import load_workload  # heavy imports only once the config is valid
    from workloads.setup import engine_of, models_of

    models = models_of(cfg)
    pair = models.pair
    workloads = [load_workload(w, pair.tokenizer) for w in _workload_cfgs(cfg, settings.languages)]
    max_context = models.max_context
    engine = engine_of(cfg, models, workloads[0].sampling)
    metadata = {**base_metadata(), "task": "tune", "models": pair.metadata,
                "hardware": hw.describe(cfg.hardware, models.device), "workloads": [w.describe() for w in workloads],
                "sampling": vars(workloads[0].sampling), "sampler": cfg.sampler, "settings": vars(settings),
                "config": OmegaConf.to_container(cfg, resolve=True)}
    rundir.METADATA.write(run_dir, metadata)

    cells: list[dict[str, Any]] = []
    frames: list[tuple[pd.DataFrame, pd.DataFrame]] = []
    for workload in workloads:
        engine.sampling = workload.sampling
        for c in settings.concurrencies:
            bench = settings.bench(policy, c)
            requests = build_requests(workload, bench, max_context)
            tag = {"language": workload.language, "workload": workload.name, "concurrency": c}
            log.info(f"tune: {workload.name} concurrency={c}: {len(bench.methods())} methods x {settings.repeats} "
                     f"repeats x {len(requests)} prompts")

            def write(grid: Grid, tag: dict[str, Any] = tag) -> None:
                _write(run_dir, frames, grid, tag, cells)

            measured = SpectuneEngine(engine, lambda m, b=bench: make_policy(b.policy, m.gamma), max_context)
            grid = run_design(measured, requests, bench.methods(), settings.repeats,
                              block_prompts=bench.block_prompts, concurrency=c, warmup=bench.warmup, on_point=write,
                              what=f"tune {workload.name} c={c}")
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

    recommendation = recommend(cells, settings, pair.metadata, metadata)
    rundir.RECOMMENDATION.write(run_dir, recommendation)
    log.info("\n" + format_recommendation(recommendation))
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
            "status": "ok", "chosen_by": metric, "best_gamma": int(best["gamma"]), "speculation": best["gamma"] > 0,
            metric: best.get(metric), "speedup": best.get("speedup"),
            "speedup_ci95_lo": best.get("speedup_ci95_lo"), "speedup_ci95_hi": best.get("speedup_ci95_hi"),
            "indistinguishable_gammas": sorted(int(by_name[m]["gamma"]) for m in rank["indistinguishable"]),
            "mad_rule_gamma": int(by_name[rank["mad_pick"]]["gamma"]) if rank.get("mad_pick") else None,
            "noise_floor_pct": cell["ranking"]["output_throughput"].get("noise_floor_pct"),
            "statistics": rank["statistics"],
        }
        if metric == "request_goodput":  # the goodput of the chosen γ relative to AR's, paired
            row.update({k: best.get(k) for k in ("request_goodput_ratio", "request_goodput_ratio_ci95_lo",
                                                 "request_goodput_ratio_ci95_hi", "slo_p99_pass")})
        rows.append(row)
    vllm = {}
    for lang in dict.fromkeys(r["language"] for r in rows):
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
