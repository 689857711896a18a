"""`python -m harness task=verify`: the exactness audit (Leviathan et al. 2023) for any (p, q) given in config.

1. Exact laws in float64: accepted mass, Z, residual, corrected law (= p), naive law, TV.
2. Monte Carlo through the real sampler code, both variants on shared proposals and acceptance uniforms,
   judged by a stated rule (:class:`spectune.audit.fit.FitRule`).
3. Optionally the same for the first two emitted tokens of γ = 2 blocks (the prefix is part of the state).

``engine=llamacpp`` checks llama-server's speculation against its own AR instead
(:mod:`harness.tasks.verify_llamacpp`). ``task.source=models`` audits the real (target, draft) pair of ``models``
on a workload instead
(:mod:`spectune.audit.real_pair`): the sampler on the pair's next-token laws, then the Engine itself.

The exit code follows the *configured* sampler (top-level ``sampler``): 0 when it passes, 1 when it fails
— so `sampler=naive` exits non-zero. Everything lands in ``verify.json`` in the run directory.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from spectune.audit.fit import FitResult, FitRule, conditional_tables, fit, fmt, pair_law, token_labels
from spectune.audit.laws import PositionLaws, total_variation, validate_pair
from spectune.errors import SpectuneError
from spectune.options import as_list, flag, integer, number, required
from spectune.run import rundir
from spectune.run.metadata import base_metadata

log = logging.getLogger(__name__)

# The pair check has V² categories: keep it where the chi-square still has ≥ ~5 expected per cell.
MAX_PAIR_VOCAB = 16


SOURCES = ("lists", "models")


def _rule(task: DictConfig) -> FitRule:
    return FitRule(z_max=number(required(task, "z_max", "task.z_max"), "task.z_max", lo=0, lo_open=True),
                   min_pvalue=number(required(task, "chi2_min_pvalue", "task.chi2_min_pvalue"),
                                     "task.chi2_min_pvalue", lo=0, hi=1))


def _sampler_name(cfg: DictConfig) -> str:
    """The configured sampler's name (checked against the samplers by ``get_sampler`` once torch loads)."""
    return str(required(cfg, "sampler", "sampler"))


def _model_settings(cfg: DictConfig) -> dict[str, Any]:
    """``task.source=models``: validate ``task.real.*`` and the workload's presence before torch loads."""
    if not cfg.get("workload"):
        raise SpectuneError("task=verify task.source=models needs a workload: add +workload=it|en|zh|es|mix")
    real = required(cfg.task, "real", "task.real")

    def get(key: str) -> Any:
        return required(real, key, f"task.real.{key}")

    min_expected = number(get("min_expected"), "task.real.min_expected", lo=0, lo_open=True)
    return {
        "configured": _sampler_name(cfg), "seed": integer(required(cfg, "seed", "seed"), "seed", lo=0),
        "rule": _rule(cfg.task),
        "prompts": integer(get("prompts"), "task.real.prompts", lo=1),
        "trials": integer(get("trials"), "task.real.trials", lo=100),
        "min_expected": min_expected,
        "engine": {
            "requests": integer(get("engine_requests"), "task.real.engine_requests", lo=0),
            "concurrency": integer(get("engine_concurrency"), "task.real.engine_concurrency", lo=1),
            "gamma": integer(get("engine_gamma"), "task.real.engine_gamma", lo=1),
            "conditions": integer(get("engine_conditions"), "task.real.engine_conditions", lo=0),
            "min_expected": min_expected,
        },
        "mix": _engine_mix(real.get("engine_mix")),
    }


MIX_KEYS = ("temperature", "top_k", "top_p")


def _engine_mix(node: Any) -> list[dict[str, Any]] | None:
    """``task.real.engine_mix``: null, or a list of at least two settings ({temperature[, top_k, top_p]}); their
    ranges are SamplingParams' to check (run_models, before any model loads)."""
    if node is None:
        return None
    items = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(items, list) or len(items) < 2 or not all(isinstance(i, dict) and "temperature" in i
                                                                 for i in items):
        raise SpectuneError(f"task.real.engine_mix={items!r} is invalid: a list of at least two "
                            "{temperature[, top_k, top_p]} settings, or null")
    for i, item in enumerate(items):
        if unknown := sorted(set(item) - set(MIX_KEYS)):
            raise SpectuneError(f"task.real.engine_mix[{i}].{unknown[0]} is not a key of a setting: allowed "
                                f"{', '.join(MIX_KEYS)}")
    return items


def _settings(cfg: DictConfig) -> dict[str, Any]:
    """Validate the task's values before torch is loaded, so a typo fails in about a second."""
    task = cfg.task
    p, q = validate_pair(as_list(required(task, "p", "task.p"), "task.p"),
                         as_list(required(task, "q", "task.q"), "task.q"), names=("task.p", "task.q"))
    return {
        "p": p, "q": q, "configured": _sampler_name(cfg),
        "trials": integer(required(task, "trials", "task.trials"), "task.trials", lo=100),
        "seed": integer(required(cfg, "seed", "seed"), "seed", lo=0),
        "rule": _rule(task),
        "block_check": flag(required(task, "block_check", "task.block_check"), "task.block_check"),
    }


def _print_laws(laws: PositionLaws, labels: list[str]) -> None:
    log.info("Exact laws of one position (float64)")
    log.info(f"{'token':>6} {'p':>9} {'q':>9} {'min(p,q)':>9} {'residual':>9} {'corrected':>9} {'naive':>9}")
    for i, label in enumerate(labels):
        r = None if laws.residual is None else float(laws.residual[i])
        log.info(f"{label:>6} {fmt(laws.p[i])} {fmt(laws.q[i])} {fmt(laws.accepted_mass[i])} {fmt(r)} "
                 f"{fmt(laws.corrected[i])} {fmt(laws.naive[i])}")
    residual_note = "" if laws.residual is not None else " (Z = 0: residual never evaluated)"
    log.info(f"accepted total {laws.accepted_total:.6f}   Z {laws.z:.6f}{residual_note}   "
             f"TV(corrected, p) {laws.tv_corrected:.6f}   TV(naive, p) {laws.tv_naive:.6f}")


def _print_fit(title: str, results: dict[str, FitResult], labels: list[str], configured: str) -> None:
    log.info(f"\n{title}")
    log.info(f"{'variant':>8} {'token':>6} {'expected':>9} {'freq':>9} {'|freq-p|':>9} {'SE':>9} {'|Δ|/SE':>9}")
    for name, res in results.items():
        for i, label in enumerate(labels):
            log.info(f"{name:>8} {label:>6} {fmt(res.law[i])} {fmt(res.frequencies[i])} "
                     f"{fmt(res.abs_error[i])} {fmt(res.se[i])} {fmt(float(res.z[i]), digits=2)}")
    for name, res in results.items():
        chi = "n/a" if res.chi2_pvalue is None else f"{res.chi2_pvalue:.3g}"
        mark = " (configured)" if name == configured else ""
        why = f"  [{'; '.join(res.reasons)}]" if res.reasons else ""
        log.info(f"{name}{mark}: TV {res.tv:.6f}  max |Δ|/SE {res.max_z:.2f}  chi-square p {chi}  "
                 f"-> {res.verdict}{why}")


def run(cfg: DictConfig, run_dir: Path) -> int:
    engine = str(cfg.engine.name) if cfg.get("engine") else "spectune"
    if engine == "llamacpp":  # llama-server's speculation against its own AR (harness/tasks/verify_llamacpp.py)
        from harness.tasks import verify_llamacpp

        return verify_llamacpp.run(cfg, run_dir, _rule(cfg.task))
    if engine != "spectune":
        raise SpectuneError(f"task=verify runs on engine=spectune or engine=llamacpp (engine={engine} reports no "
                            "per-token probabilities to test against)")
    source = required(cfg.task, "source", "task.source")
    if source not in SOURCES:
        raise SpectuneError(f"task.source={source!r} is unknown: choose one of {', '.join(SOURCES)}")
    if source == "models":
        return run_models(cfg, run_dir, _model_settings(cfg))
    s = _settings(cfg)
    from spectune.audit.montecarlo import first_pair_counts, first_token_counts  # loads torch
    from spectune.sampling.rejection import SAMPLERS, get_sampler

    get_sampler(s["configured"])  # one-line error for an unknown name
    p, q, n, seed, rule = s["p"], s["q"], s["trials"], s["seed"], s["rule"]
    laws = PositionLaws.of(p, q)
    labels = token_labels(len(p))
    _print_laws(laws, labels)

    samplers = {name: get_sampler(name) for name in SAMPLERS}  # every variant, for the comparison
    counts = first_token_counts(samplers, p, q, n, seed)
    single = {name: fit(c, p, rule) for name, c in counts.items()}
    _print_fit(f"Monte Carlo, γ = 1: {n} trials, seed {seed}, first emitted token "
               "(proposal x ~ q and acceptance uniforms shared by the variants)", single, labels,
               s["configured"])

    block: dict[str, Any] = {"skipped": "task.block_check=false"}
    pair: dict[str, FitResult] = {}
    if s["block_check"] and len(p) > MAX_PAIR_VOCAB:
        block = {"skipped": f"vocabulary {len(p)} > {MAX_PAIR_VOCAB} (the pair law has V² cells)"}
    elif s["block_check"]:
        p1, q1 = conditional_tables(p, q)
        target_pair = pair_law(p, p1)
        pair = {name: fit(c, target_pair, rule)
                for name, c in first_pair_counts(samplers, p, q, n, seed).items()}
        pair_labels = [a + b for a in labels for b in labels]
        _print_fit(f"Monte Carlo, γ = 2: {n} trials, law of the first two emitted tokens, "
                   "p1(.|x) = roll(p, x+1), q1(.|x) = roll(q, x)", pair, pair_labels, s["configured"])
        block = {"gamma": 2, "p1_given_x0": p1.tolist(), "q1_given_x0": q1.tolist(),
                 "labels": pair_labels, "variants": {k: v.as_dict() for k, v in pair.items()}}

    verdicts = {name: "PASS" if res.passed and (name not in pair or pair[name].passed) else "FAIL"
                for name, res in single.items()}
    log.info(f"\nRule: {rule.describe()}" + (" (for the γ = 1 and the γ = 2 check)" if pair else ""))
    log.info("Verdict: " + ", ".join(f"{k} {v}" + (" (configured)" if k == s["configured"] else "")
                                    for k, v in verdicts.items()))
    code = 0 if verdicts[s["configured"]] == "PASS" else 1
    if code == 0 and np.isclose(total_variation(laws.naive, p), 0.0):
        log.info("note: for this (p, q) the naive law equals p (Z = 0 or residual = p): the audit cannot tell "
                 "the variants apart here")

    out = rundir.VERIFY.write(run_dir, {
        "task": "verify", "rule": rule.describe(), "z_max": rule.z_max, "chi2_min_pvalue": rule.min_pvalue,
        "n": n, "seed": seed, "configured_sampler": s["configured"], "exit_code": code,
        "labels": labels, "laws": laws.as_dict(),
        "monte_carlo": {"gamma": 1, "shared": "proposal x ~ q and acceptance uniforms",
                        "variants": {k: v.as_dict() for k, v in single.items()}},
        "block_check": block, "verdict": verdicts, "metadata": base_metadata(),
        "config": OmegaConf.to_container(cfg, resolve=True),
    })
    log.info(f"wrote {out}")
    return code


def run_models(cfg: DictConfig, run_dir: Path, s: dict[str, Any]) -> int:
    """The audit on the real pair: sampler level on K prompts, then the Engine on the shortest of them."""
    from spectune.audit import real_pair as am  # loads torch and transformers
    from spectune.measure.models import load_models
    from spectune.sampling import SamplingParams
    from spectune.sampling.rejection import SAMPLERS, get_sampler
    from workloads.loader import load_workload

    get_sampler(s["configured"])
    mix = None
    if s["mix"] is not None:
        base = cfg.workload.sampling
        try:
            mix = [SamplingParams(**{"top_k": base.top_k, "top_p": base.top_p, **item}) for item in s["mix"]]
        except SpectuneError as err:
            raise SpectuneError(f"task.real.engine_mix: {err}") from None
    pair = load_models(cfg.models, cfg.hardware).pair  # validates the setup, applies its thread count
    wl = load_workload(cfg.workload, pair.tokenizer)
    prompts = wl.prompts[: s["prompts"]]
    samplers = {name: get_sampler(name) for name in SAMPLERS}
    rule, seed = s["rule"], s["seed"]
    log.info(f"pair {pair.metadata.get('name')} (vocabulary {pair.metadata['target']['vocab_size']}), workload "
             f"{wl.name}: T={wl.sampling.temperature}, top_p={wl.sampling.top_p}, top_k={wl.sampling.top_k}\n")
    start = time.perf_counter()
    rows = am.sampler_level(pair, prompts, wl.sampling, samplers, s["trials"], seed, rule, s["min_expected"])
    sampler_s = time.perf_counter() - start
    am.print_sampler_level(rows, s["trials"], s["min_expected"], s["configured"], sampler_s)
    verdicts = {name: all(r["fits"][name].passed for r in rows) for name in samplers}

    engine: dict[str, Any] = {"skipped": "task.real.engine_requests=0"}
    if s["engine"]["requests"] > 0:
        shortest = min(prompts, key=lambda p: len(p.input_ids))  # cheapest prefill
        engine = am.engine_level(pair, shortest, wl.sampling, samplers, s["engine"], seed, rule)
        am.print_engine_level(engine, s["configured"])
        verdicts = {k: v and engine["variants"][k]["passed"] for k, v in verdicts.items()}
    mixed: dict[str, Any] = {"skipped": "task.real.engine_mix=null"}
    if mix is not None and s["engine"]["requests"] > 0:
        shortest = min(prompts, key=lambda p: len(p.input_ids))
        mixed = am.mixed_engine_level(pair, shortest, mix, samplers, s["engine"], seed, rule)
        am.print_mixed_engine_level(mixed, s["configured"])
        verdicts = {k: v and mixed["variants"][k]["passed"] for k, v in verdicts.items()}

    words = {k: "PASS" if v else "FAIL" for k, v in verdicts.items()}
    log.info(f"\nRule: {rule.describe()}; sampler level on the cells of each prompt; engine level with the "
             "chi-square and event p-value thresholds divided by the Bonferroni family size")
    log.info("Verdict: " + ", ".join(f"{k} {v}" + (" (configured)" if k == s["configured"] else "")
                                    for k, v in words.items()))
    code = 0 if verdicts[s["configured"]] else 1
    out = rundir.VERIFY.write(run_dir, {
        "task": "verify", "source": "models", "rule": rule.describe(), "z_max": rule.z_max,
        "chi2_min_pvalue": rule.min_pvalue, "seed": seed, "configured_sampler": s["configured"],
        "exit_code": code, "min_expected": s["min_expected"],
        "binning": "tokens with n*p >= min_expected are their own cells; other p>0 tokens share 'rest', "
                   "p=0 tokens share 'p=0'; cells depend on (p, n) only",
        "models_audit": {"sampler_level": {**am.sampler_level_json(rows, s["trials"], s["min_expected"]),
                                           "wall_s": sampler_s},
                         "engine_level": engine, "mixed_batch": mixed},
        "verdict": words, "models": pair.metadata, "workload": wl.describe(),
        "hardware": OmegaConf.to_container(cfg.hardware, resolve=True), "metadata": base_metadata(),
        "config": OmegaConf.to_container(cfg, resolve=True),
    })
    log.info(f"wrote {out}")
    return code
