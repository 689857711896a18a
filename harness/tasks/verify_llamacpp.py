"""`python -m harness task=verify engine=llamacpp`: is llama-server's speculation exact? (docs/llamacpp.md)

An AR server and one server per speculative type of ``task.server.spec_types`` (γ = ``task.server.gamma``), all of
the same build and GGUF (``engine.weights``), each on a free port with the flags of ``engine=llamacpp``:

1. greedy: every prompt of the workload on AR and on each speculative server; the equality rate per type, and
   each divergence classified by AR's top-2 gap at its first diverging token (``task.server.gap_bound``):
   :mod:`spectune.engines.llamacpp_exactness`, :mod:`spectune.audit.divergence`;
2. T = 1 (``task.server.distribution``): draws inside speculated spans of a fresh ``task.server.draw_spec_type``
   server against p from the AR server, judged by the audit's rule (``task.z_max``, ``task.chi2_min_pvalue``),
   with the draws the chi-square needs for ``task.server.power`` against "on rejection, resample from p", and the
   same rule shown to reject draws simulated from that wrong rule.

Written: ``verify.json`` (the table, every divergence, the T = 1 test, the servers' commands, the build) and
``greedy.parquet`` (one row per spec type and prompt). Exit code 0 when no divergence is a possible sampler fault
and the T = 1 test passes with teeth; 1 otherwise (a server that fails: its one line, exit 1).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from spectune.audit.divergence import FAULT, NUMERICS, equality_by_type
from spectune.audit.fit import FitRule
from spectune.errors import SpectuneError
from spectune.methods import AR, BASELINE, Method
from spectune.options import flag, integer, number, required
from spectune.run import rundir
from spectune.run.metadata import base_metadata

log = logging.getLogger(__name__)


def settings_of(cfg: DictConfig, rule: FitRule) -> dict[str, Any]:
    """``task.server`` checked, with the engine's settings and every method, before any model loads or server
    starts."""
    from spectune.engines import llamacpp

    if not cfg.get("workload"):
        raise SpectuneError("task=verify engine=llamacpp needs a workload: add +workload=it|en|zh|es|mix")
    node = required(cfg.task, "server", "task.server")

    def get(key: str) -> Any:
        return required(node, key, f"task.server.{key}")

    engine = llamacpp.settings_of(cfg)
    gamma = integer(get("gamma"), "task.server.gamma", lo=1)
    types = [str(t) for t in get("spec_types")]
    draw_type = str(get("draw_spec_type"))
    if not types:
        raise SpectuneError("task.server.spec_types=[] is invalid: name at least one of "
                            f"{', '.join(llamacpp.spec_types())}")
    for name in dict.fromkeys([*types, draw_type]):
        if name not in llamacpp.spec_types():
            raise SpectuneError(f"task.server spec type {name!r} is invalid: choose among "
                                f"{', '.join(llamacpp.spec_types())}")
        llamacpp.check_method(Method(name, gamma), engine)
    llamacpp.gguf_of(str(cfg.models.target.name_or_path), "target (models.target.name_or_path)")
    from spectune.engines.llamacpp_exactness import DrawSettings

    draws = DrawSettings(
        prefix_tokens=integer(get("prefix_tokens"), "task.server.prefix_tokens", lo=6),
        pilot=integer(get("pilot"), "task.server.pilot", lo=1),
        n_probs=integer(get("n_probs"), "task.server.n_probs", lo=2),
        target_power=number(get("power"), "task.server.power", lo=0, hi=1, lo_open=True),
        max_requests=integer(get("max_requests"), "task.server.max_requests", lo=1),
        min_expected=number(get("min_expected"), "task.server.min_expected", lo=0, lo_open=True),
        rule=rule, seed=integer(required(cfg, "seed", "seed"), "seed", lo=0),
        lookup=engine.ngram_mod_n_match if draw_type == "ngram-mod" else 0)
    return {"engine": engine, "gamma": gamma, "spec_types": list(dict.fromkeys(types)), "draw_spec_type": draw_type,
            "max_new_tokens": integer(get("max_new_tokens"), "task.server.max_new_tokens", lo=1),
            "gap_bound": number(get("gap_bound"), "task.server.gap_bound", lo=0, lo_open=True),
            "distribution": flag(get("distribution"), "task.server.distribution"),
            "draw_category": str(get("draw_category")), "draws": draws}


def greedy_frame(rows: list[Any]) -> pd.DataFrame:
    """One row per (spec type, prompt), with the same dtypes whether or not anything diverged."""
    frame = pd.DataFrame([r.row() for r in rows])
    for column in ("position", "ar_token", "spec_token", "top1", "top2", "drafted", "accepted"):
        frame[column] = frame[column].astype("Int64")
    for column in ("gap_nats", "decode_gap_nats"):
        frame[column] = frame[column].astype("float64")
    return frame


def _draw_prompts(prompts: list[Any], category: str) -> list[Any]:
    """The prompts C may start from, in the order tried: the draw category's first, then the others."""
    return sorted(prompts, key=lambda p: getattr(p, "category", None) != category)


def run(cfg: DictConfig, run_dir: Path, rule: FitRule) -> int:
    s = settings_of(cfg, rule)
    from spectune.engines import llamacpp_build as build
    from spectune.engines.llamacpp import LlamaCppFlavour, gguf_of
    from spectune.engines.llamacpp_exactness import distribution_check, greedy_check
    from spectune.engines.server import ManagedServer, ServerFailure
    from workloads.loader import load_workload
    from workloads.setup import models_of

    engine = s["engine"]
    server_bin = build.server_binary(engine.version)  # one line naming the build command when it is not built
    shipped = gguf_of(str(cfg.models.target.name_or_path), "target")
    model = build.f32_gguf(shipped, engine.version) if engine.weights == "f32" else shipped
    models = models_of(cfg)  # the target's tokenizer renders and tokenises the prompts, as on every engine
    workload = load_workload(cfg.workload, models.tokenizer)
    prompts = workload.prompts
    flavour = LlamaCppFlavour(engine, server=server_bin, model=model)
    threads = cfg.hardware.get("threads")
    methods = {BASELINE: AR, **{t: Method(t, s["gamma"]) for t in s["spec_types"]}}

    def server(label: str, method: Method) -> ManagedServer:
        name = label.replace(":", "_").replace("=", "")
        return ManagedServer(method, flavour, threads=int(threads) if threads else None, slots=1,
                             log_path=run_dir / "servers" / f"{name}.log", port=engine.port,
                             ready_timeout_s=engine.ready_timeout_s)

    servers = {label: server(label, m) for label, m in methods.items()}
    draw_server = server(f"draws-{s['draw_spec_type']}", Method(s["draw_spec_type"], s["gamma"]))
    result: dict[str, Any] = {}
    try:
        for srv in servers.values():
            srv.start()
        log.info(f"greedy: {len(prompts)} prompts x AR and {', '.join(s['spec_types'])} (γ {s['gamma']}), "
                 f"{s['max_new_tokens']} new tokens, weights {engine.weights}")
        rows = greedy_check(servers[BASELINE], {t: servers[t] for t in s["spec_types"]}, flavour, prompts,
                            s["max_new_tokens"], s["gap_bound"], int(cfg.seed))
        rundir.VERIFY_GREEDY.write(run_dir, greedy_frame(rows))  # kept if the T = 1 test fails
        for label in s["spec_types"]:
            servers[label].stop()
        if s["distribution"]:
            draw_server.start()
            order = _draw_prompts(prompts, s["draw_category"])
            result = distribution_check(servers[BASELINE], draw_server, flavour, [p.input_ids for p in order],
                                        s["draws"])
            if "prompt_index" in result:
                result = {"prompt_id": order[result["prompt_index"]].id, **result}
    except ServerFailure as err:
        raise SpectuneError(str(err)) from None
    finally:
        for srv in [*servers.values(), draw_server]:
            srv.stop()
    table = equality_by_type(rows)
    _print(table, rows, result, s)
    faults = sum(r.verdict == FAULT for r in rows)
    t1_ok = (not s["distribution"]) or (result.get("passed") is True and result["teeth"]["rejected"])
    code = 0 if faults == 0 and t1_ok else 1
    out = rundir.VERIFY.write(run_dir, {
        "task": "verify", "engine": "llamacpp", "exit_code": code, "gap_bound_nats": s["gap_bound"],
        "rule": rule.describe(), "greedy": {"by_spec_type": table, "divergences": [r.row() for r in rows
                                                                                   if not r.equal]},
        "distribution": result if s["distribution"] else {"skipped": "task.server.distribution=false"},
        "servers": {label: srv.describe() for label, srv in {**servers, "draws": draw_server}.items()},
        "build": build.find_build(engine.version), "weights": engine.weights, "model": str(model),
        "workload": workload.describe(), "models": models.pair.metadata, "metadata": base_metadata(),
        "config": OmegaConf.to_container(cfg, resolve=True)})
    log.info(f"wrote {out}")
    return code


def _print(table: list[dict[str, Any]], rows: list[Any], t1: dict[str, Any], s: dict[str, Any]) -> None:
    log.info(f"\nGreedy: each speculative server's output against AR's (bound {s['gap_bound']:g} nats)")
    log.info(f"{'spec type':>14} {'prompts':>8} {'equal':>6} {'rate':>6} {NUMERICS:>9} {FAULT:>23} {'max gap':>8} "
             f"{'drafted':>8} {'accepted':>8}")
    for t in table:
        gap = "-" if t["max_gap_nats"] is None else f"{t['max_gap_nats']:.4f}"
        log.info(f"{t['spec_type']:>14} {t['prompts']:>8} {t['equal']:>6} {t['equality_rate']:>6.2f} "
                 f"{t[NUMERICS]:>9} {t[FAULT]:>23} {gap:>8} {t['drafted']:>8} {t['accepted']:>8}")
    for r in rows:
        if not r.equal:
            decode = "" if r.decode_gap_nats is None else f", AR's gap when decoding {r.decode_gap_nats:.4f}"
            log.info(f"  {r.spec_type} {r.prompt_id}: token {r.position}, AR {r.ar_token} / spec {r.spec_token}, "
                     f"AR top-2 {r.top1}, {r.top2} gap {r.gap_nats:.4f} nats{decode} -> {r.verdict}")
    if not t1:
        return
    if "skipped" in t1:
        log.info(f"\nT = 1: {t1['skipped']}")
        return
    fit = t1["fit"]
    log.info(f"\nT = 1 ({s['draw_spec_type']}, γ {s['gamma']}): C = {t1['prompt_id']} + {t1['cut']} greedy tokens; "
             f"x2 given x1 = {t1['x1']} where the request drafted; draft {t1['draft']} (p {t1['p_draft']:.3f})")
    log.info(f"  draws {t1['draws']} of {t1['requests']} requests (needed {t1['draws_needed']} for power "
             f"{t1['target_power']:g}; power at {t1['draws']}: {t1['power_at_draws']:.3f}); cells {t1['cells']}")
    chi = fit["chi2"]["pvalue"]
    log.info(f"  llama-server: TV {fit['tv_vs_expected']:.4f} max|Δ|/SE {fit['max_abs_error_over_se']:.2f} chi2 p "
             f"{'n/a' if chi is None else f'{chi:.3g}'} -> {fit['verdict']}")
    log.info(f"  the same rule on {t1['teeth']['simulations']} seeded simulations of the wrong rule at n = "
             f"{t1['draws']}: rejects {t1['teeth']['rejected_share']:.1%} (must be >= {t1['target_power']:.0%}: "
             f"{'it has teeth' if t1['teeth']['rejected'] else 'NO TEETH'})")
