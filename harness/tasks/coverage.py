"""`python -m harness task=coverage +workload=en`: do this machine's intervals keep their promise?

K comparisons whose truth is "no difference", each in a fresh worker process (the model reloaded, as pyperf
runs its workers) on its own draw of prompts (``workload.seed`` + k): AR against itself, a fixed γ against itself
under another label, and a policy that provably does the fixed γ's work (``confidence`` with threshold 0 drafts
every one of its γ tokens) against that γ. Each is measured as ``task=bench`` measures — the same design, units
and intervals — and the report counts how many of the nominal 95% intervals contain "no difference", with the
binomial (Clopper–Pearson) interval of that coverage, beside the same runs read with the old unit (every (repeat,
prompt) cell counted as independent, BCa). It also gives the noise floor (the intervals' median half-width), the
smallest speedup a run of this size resolves (MDE, 80% power), and the between-process component: the variance
of the K estimates beyond what their own intervals expect, which no single run can see.

The policy pair is identical work through another code path: an interval that excludes 1 there is the
policy's own overhead (it reads q(x) every step), not necessarily a failure of the interval.

On a server engine (``engine=llamacpp task.pairs=[ar,fixed]``) the fixed γ is the engine's speculative type at
``task.gamma`` and a duplicate is a second server of the same command: the intervals are checked on the engine
users deploy. The policy pair needs spectune's own engine.
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from scipy import stats

from harness.tasks.schemas import CoverageFile
from spectune import hardware as hw
from spectune.config import typed
from spectune.engines import engine_class
from spectune.engines.base import opened
from spectune.errors import SpectuneError
from spectune.io import write_json
from spectune.measure.interleave import block_for, block_size, design_option, run_design
from spectune.measure.point import requests_of
from spectune.measure.repeats import pooled, repeats_option
from spectune.methods import AA, AR, BASELINE, FIXED, Method
from spectune.options import integer
from spectune.run import conditions, resume, rundir
from spectune.run.metadata import base_metadata
from spectune.run.progress import RunProgress
from spectune.stats.compare import throughput_units
from spectune.stats.intervals import bootstrap_paired_ratio_interval, mde, paired_ratio_interval
from spectune.stats.units import speedup_interval, unit_size_of, units_of
from workloads.regimes import refuse_phases

log = logging.getLogger(__name__)

PAIRS = (BASELINE, "fixed", "policy")  # a pair is named after its reference method (AR's A/A pair: "ar")
NO_DIFFERENCE = (BASELINE, "fixed")  # the pairs whose truth is exactly no difference (same code, same work)
POLICY = {"name": "confidence", "threshold": 0.0}  # q(x) >= 0 always: drafts every one of its γ tokens
WORKER_DONE = "worker.json"  # written last by a worker: its comparison is complete


@dataclass(frozen=True)
class CoverageSettings:
    comparisons: int
    pairs: tuple[str, ...]
    gamma: int
    repeats: int
    warmup: int
    concurrency: int
    design: str
    block_prompts: int | None  # the block size the runs use (None: the blocked design)
    worker: int | None
    fixed_name: str = FIXED  # what the fixed γ is called on the engine: spectune's fixed policy, or a server's type

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> CoverageSettings:
        """Types from the schema (harness/tasks/schemas.py), ranges and choices here: one line each, before any
        model loads."""
        f = typed(CoverageFile, cfg)
        t = f.task
        pairs = tuple(t.pairs) if isinstance(t.pairs, list) else (t.pairs,)
        unknown = [p for p in pairs if p not in PAIRS]
        if unknown or not pairs or len(set(pairs)) != len(pairs):
            raise SpectuneError(f"task.pairs={list(pairs)} is invalid: choose distinct pairs from {', '.join(PAIRS)}")
        c = integer(f.concurrency, "concurrency", lo=1)
        block = block_size(t.block_prompts, "task.block_prompts", [c], f"concurrency={c}")
        design = design_option(t.design, "task.design", block, None)
        gamma = integer(t.gamma, "task.gamma", lo=1)
        return cls(integer(t.comparisons, "task.comparisons", lo=1), pairs, gamma,
                   repeats_option(t.repeats), integer(t.warmup, "task.warmup", lo=0), c, design,
                   block_for(design, block, c), None if t.worker is None else integer(t.worker, "task.worker", lo=0),
                   _fixed_name(cfg, pairs, gamma))

    @property
    def unit_size(self) -> int:
        return unit_size_of(self.concurrency, self.block_prompts)

    def pair(self, pair: str) -> tuple[Method, Method]:
        """(compared, reference) methods of a pair; a method's settings are its policy node."""
        fixed = Method(self.fixed_name, self.gamma, {"name": FIXED})
        return {BASELINE: (AA, AR), "fixed": (fixed.duplicate(), fixed),
                "policy": (Method("confidence-0", self.gamma, dict(POLICY)), fixed)}[pair]

    def labels(self, pair: str) -> tuple[str, str]:
        """(compared, reference) method labels of a pair."""
        compared, reference = self.pair(pair)
        return compared.label, reference.label

    def methods(self) -> list[Method]:
        """Every method a worker runs, once each, in the order of the first repeat (a server engine: one server
        each, the duplicate a second server of the same command)."""
        out: dict[str, Method] = {}
        for pair in self.pairs:
            compared, reference = self.pair(pair)
            for method in (reference, compared):
                out.setdefault(method.label, method)
        return list(out.values())


def _fixed_name(cfg: DictConfig, pairs: tuple[str, ...], gamma: int) -> str:
    """The fixed γ's method name on the configured engine: spectune's fixed policy, or a server engine's one
    speculative type (checked as configured: one line, before any model loads). The policy pair needs spectune's
    own engine (a server runs no draft-length policy)."""
    from workloads.setup import engine_name, in_process

    if in_process(cfg):
        return FIXED
    engine = engine_class(engine_name(cfg))
    if "policy" in pairs:
        raise SpectuneError(f"task.pairs={list(pairs)} is invalid with engine={engine.engine}: the policy pair runs "
                            "a draft-length policy, on engine=spectune only; use task.pairs=[ar,fixed]")
    names = engine.method_names(cfg)
    if len(names) != 1:
        raise SpectuneError(f"the engine's speculative methods {list(names)} are invalid for task=coverage: its fixed "
                            "pair compares one method with itself; name one")
    engine.check_config(cfg, [Method(names[0], gamma)])
    return names[0]


def run(cfg: DictConfig, run_dir: Path) -> int:
    if "workload" not in cfg:
        raise SpectuneError("no workload selected: add +workload=NAME (it, en, zh, es or mix)")
    settings = CoverageSettings.from_cfg(cfg)  # the engine's method and settings too, before any model loads
    refuse_phases(cfg.workload, "task=coverage")
    if settings.worker is not None:
        return _worker(cfg, run_dir, settings)
    return _parent(cfg, run_dir, settings)


# -- one comparison, in its own process --------------------------------------------------------------------
def _worker(cfg: DictConfig, run_dir: Path, s: CoverageSettings) -> int:
    from policies.registry import make_policy
    from workloads.loader import load_workload
    from workloads.setup import measuring_engine, models_of

    models = models_of(cfg)
    workload = load_workload(cfg.workload, models.tokenizer)
    requests = requests_of(workload.prompts, workload.max_new_tokens, workload.ignore_eos)
    methods = s.methods()
    nodes = {m.label: dict(m.settings) if m.speculative else None for m in methods}
    measured = measuring_engine(cfg, models, workload.sampling, lambda m: make_policy(nodes[m.label], m.gamma),
                                slots=s.concurrency, log_dir=run_dir / "servers")
    with opened(measured, methods):
        rundir.METADATA.write(run_dir, {**base_metadata(), "task": "coverage-worker", "comparison": s.worker,
                                        "models": models.pair.metadata, "hardware": hw.describe(cfg.hardware,
                                                                                                models.device),
                                        "workload": workload.describe(), "sampling": vars(workload.sampling),
                                        "engine": measured.describe(),
                                        "config": OmegaConf.to_container(cfg, resolve=True)})
        grid = run_design(measured, requests, methods, s.repeats, block_prompts=s.block_prompts,
                          concurrency=s.concurrency, warmup=s.warmup)
    req, cyc = grid.frames()
    rundir.REQUESTS.write(run_dir, req)
    rundir.CYCLES.write(run_dir, cyc)
    rundir.SUMMARY.write(run_dir, {"workload": workload.name, "repeats": s.repeats, "methods": pooled(grid),
                                   **conditions.summary_fields(grid.points), "points": grid.points})
    write_json(run_dir / WORKER_DONE, {"comparison": s.worker, "prompts": len(requests)})
    return 0


# -- the parent: K workers, then the coverage ----------------------------------------------------------------
def _worker_command(cfg: DictConfig, k: int, where: Path) -> list[str]:
    """This job's command line for worker ``k``: the same overrides, its own run directory and prompt draw."""
    from hydra.core.hydra_config import HydraConfig

    skip = ("task.worker=", "hydra.run.dir=", "workload.seed=", "++workload.seed=")
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith(skip)]
    return [sys.executable, "-m", "harness", *overrides, f"task.worker={k}",
            f"workload.seed={int(cfg.workload.seed) + k}", f"hydra.run.dir={where}"]


RECORD_COLUMNS = ("method", "repeat", "request_id", "prompt_id", "status", "output_tokens", "ttft_ms", "e2el_ms")


def worker_records(worker_dir: Path, k: int) -> pd.DataFrame:
    """What the coverage of one comparison is computed from, gathered into the parent's ``records.parquet``: each
    request's method, repeat, prompt, status, tokens and latencies, and its (method, repeat) run's duration. The
    workers' own directories (every column, the cycles) can then be left out of a committed result."""
    req = rundir.REQUESTS.read(worker_dir)
    points = rundir.SUMMARY.read(worker_dir)["points"]
    durations = {(p["method"], int(p["repeat"])): float(p["duration_s"]) for p in points if p.get("status") == "ok"}
    req = req[[(m, int(r)) in durations for m, r in zip(req["method"], req["repeat"], strict=True)]]
    out = req[list(RECORD_COLUMNS)].copy()
    out.insert(0, "comparison", k)
    out["duration_s"] = [durations[m, int(r)] for m, r in zip(out["method"], out["repeat"], strict=True)]
    return out


def comparison_rows(records: pd.DataFrame, s: CoverageSettings, k: int, seed: int) -> list[dict[str, Any]]:
    """One row per pair of comparison ``k`` (its rows of :func:`worker_records`): the product's interval and the
    old unit's, on the same records."""
    req = records[records["comparison"] == k]
    durations = {(m, int(r)): float(d) for m, r, d in zip(req["method"], req["repeat"], req["duration_s"], strict=True)}
    units = throughput_units(req, durations, unit_size=s.unit_size)
    per_request = throughput_units(req, durations).cells  # the old unit: every (repeat, prompt) cell on its own
    width = int(per_request["unit"].max()) + 1
    cells = units_of(per_request.assign(request_id=per_request["repeat"] * width + per_request["unit"], repeat=0))
    rows = []
    for pair in s.pairs:
        a, b = s.labels(pair)
        if a not in units.num or b not in units.num:
            rows.append({"comparison": k, "pair": pair, "status": "failed"})
            continue
        iv = speedup_interval(units, a, b)
        alone = paired_ratio_interval(units.num[a], units.den[a], units.num[b], units.den[b])  # no repeat component
        old = bootstrap_paired_ratio_interval(cells.num[a], cells.den[a], cells.num[b], cells.den[b], seed=seed + k)
        rows.append({"comparison": k, "pair": pair, "status": "ok", "a": a, "b": b, "units": iv.n,
                     "estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "se_log": iv.se, "df": iv.df,
                     "contains": iv.contains(1.0), "mde_pct": 100 * (mde(iv) or float("nan")),
                     "units_lo": alone.lo, "units_hi": alone.hi, "units_se_log": alone.se,
                     "units_contains": alone.contains(1.0),
                     "old_cells": old.n, "old_lo": old.lo, "old_hi": old.hi, "old_contains": old.contains(1.0)})
    return rows


def coverage_summary(rows: list[dict[str, Any]], pairs: tuple[str, ...]) -> dict[str, Any]:
    """Per pair, and over the no-difference pairs together: coverage with its exact binomial interval, the median
    interval width of both units, the noise floor and MDE, and the between-process SD of the estimates."""
    out: dict[str, Any] = {}
    groups = {pair: [pair] for pair in pairs}
    if len([p for p in pairs if p in NO_DIFFERENCE]) > 1:
        groups["no difference (ar, fixed)"] = [p for p in pairs if p in NO_DIFFERENCE]
    for name, members in groups.items():
        ok = [r for r in rows if r["pair"] in members and r["status"] == "ok"]
        if not ok:
            continue
        hits, old_hits = sum(r["contains"] for r in ok), sum(r["old_contains"] for r in ok)
        unit_hits = sum(r["units_contains"] for r in ok)
        ci = stats.binomtest(hits, len(ok)).proportion_ci(0.95, method="exact")
        logs = np.log([r["estimate"] for r in ok])
        within = float(np.mean([r["se_log"] ** 2 for r in ok if r["se_log"] is not None]))
        excess = float(np.var(logs, ddof=1)) - within if len(ok) > 1 else float("nan")
        out[name] = {"comparisons": len(ok), "contain_no_difference": hits, "coverage": hits / len(ok),
                     "coverage_ci95": [float(ci.low), float(ci.high)],
                     "units_only_contain": unit_hits, "units_only_coverage": unit_hits / len(ok),
                     "units_only_median_width_pct": 100 * float(np.median([r["units_hi"] - r["units_lo"] for r in ok])),
                     "old_unit_contain": old_hits, "old_unit_coverage": old_hits / len(ok),
                     "median_width_pct": 100 * float(np.median([r["hi"] - r["lo"] for r in ok])),
                     "old_unit_median_width_pct": 100 * float(np.median([r["old_hi"] - r["old_lo"] for r in ok])),
                     "noise_floor_pct": 100 * float(np.median([max(r["hi"] - 1, 1 - r["lo"]) for r in ok])),
                     "median_mde_pct": float(np.nanmedian([r["mde_pct"] for r in ok])),
                     "mean_estimate_pct": 100 * float(np.exp(logs.mean()) - 1),
                     "between_process_sd_pct": (100 * math.sqrt(max(0.0, excess)) if np.isfinite(excess) else None)}
    return out


def format_coverage(summary: dict[str, Any]) -> list[str]:
    head = (f"{'pair':<26} {'runs':>4} {'contain':>7} {'coverage [95% CI]':>20} {'width':>7} {'units only':>15} "
            f"{'old unit':>15} {'floor':>6} {'MDE':>6} {'process SD':>10}")
    lines = [head, "-" * len(head)]
    for name, r in summary.items():
        lo, hi = r["coverage_ci95"]
        proc = "-" if r["between_process_sd_pct"] is None else f"{r['between_process_sd_pct']:.2f}%"
        lines.append(f"{name:<26} {r['comparisons']:>4} {r['contain_no_difference']:>7} "
                     f"{100 * r['coverage']:>5.1f}% [{100 * lo:4.1f}, {100 * hi:5.1f}] {r['median_width_pct']:>6.2f}% "
                     f"{100 * r['units_only_coverage']:>5.1f}% {r['units_only_median_width_pct']:>6.2f}%  "
                     f"{100 * r['old_unit_coverage']:>5.1f}% {r['old_unit_median_width_pct']:>6.2f}%  "
                     f"{r['noise_floor_pct']:>5.2f}% {r['median_mde_pct']:>5.2f}% {proc:>10}")
    lines.append("coverage: share of the product's 95% intervals (unit: prompt, or batch block; jackknife t; plus "
                 "the method x repeat component) containing no difference; units only: the same without the repeat "
                 "component; old unit: (repeat, prompt) cells as independent, BCa; all on the same runs. width: "
                 "median interval width; floor: median half-width; MDE: median minimum detectable effect (80% "
                 "power); process SD: spread of the estimates across processes beyond their own intervals")
    return lines


def _parent(cfg: DictConfig, run_dir: Path, s: CoverageSettings) -> int:
    seed = int(cfg.seed)
    rundir.METADATA.write(run_dir, {**base_metadata(), "task": "coverage", "settings": vars(s),
                                    "config": OmegaConf.to_container(cfg, resolve=True),
                                    "job": resume.job_identity()})
    rows: list[dict[str, Any]] = []
    records: list[pd.DataFrame] = []
    workers: dict[str, Any] = {}  # where the workers measured: the first finished worker's metadata
    with RunProgress("coverage", s.comparisons, unit="comparisons") as progress:
        for k in range(s.comparisons):
            where = run_dir / "comparisons" / f"{k:03d}"
            reused = (where / WORKER_DONE).exists()  # a finished worker (an earlier, interrupted run) is not rerun
            if not reused:
                proc = subprocess.run(_worker_command(cfg, k, where), capture_output=True, text=True, check=False)
                if proc.returncode == 2:  # bad input: the same for every worker
                    raise SpectuneError(proc.stderr.strip().splitlines()[-1].removeprefix("error: "))
                if proc.returncode != 0 or not (where / WORKER_DONE).exists():
                    log.error("comparison %d failed (exit %d): %s", k, proc.returncode, proc.stderr.strip()[-500:])
                    rows += [{"comparison": k, "pair": pair, "status": "failed"} for pair in s.pairs]
                    progress.advance()
                    continue
            if not workers:
                meta = rundir.METADATA.read(where)
                workers = {key: meta.get(key) for key in ("models", "hardware", "host", "packages", "git",
                                                          "workload", "sampling")}
            records.append(worker_records(where, k))
            rundir.COVERAGE_RECORDS.write(run_dir, pd.concat(records, ignore_index=True))
            new = comparison_rows(records[-1], s, k, seed)
            rows += new
            log.info("comparison %d: %s", k, "; ".join(f"{r['pair']} {100 * (r['estimate'] - 1):+.2f}% "
                                                        f"[{100 * (r['lo'] - 1):+.2f}, {100 * (r['hi'] - 1):+.2f}]"
                                                        for r in new if r["status"] == "ok"))
            summary = coverage_summary(rows, s.pairs)
            rundir.COVERAGE.write(run_dir, {"task": "coverage", "settings": vars(s), "workers": workers,
                                            "summary": summary, "rows": rows})
            if reused:
                progress.skip(1)
            else:
                progress.advance()
    summary = coverage_summary(rows, s.pairs)
    log.info(f"\ncoverage: {s.comparisons} comparisons x {', '.join(s.pairs)}; concurrency={s.concurrency} "
             f"design={s.design} repeats={s.repeats} workload={cfg.workload.name} "
             f"T={cfg.workload.sampling.temperature}")
    for line in format_coverage(summary):
        log.info(line)
    log.info(f"results: {run_dir}")
    return 0 if summary else 3
