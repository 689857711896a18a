"""The static answers on a workload in regimes: the best single static setting for the whole workload, and the best
fixed γ per regime (temperature × concurrency), from bench runs over the regimes on training prompts.

An adaptive controller is judged against both: the single setting a user would pick knowing only the workload, and
the map a user would pick knowing each regime in advance (the map is what ``policy=regime-map`` runs, and, per
temperature, a vLLM per-batch-size table). Both are chosen on training prompts only (``workload.splits=[train]``),
never on the prompts they are judged on.

From each run directory of ``task=bench`` on a workload with phases: the summary's per-phase rows (output tokens and
seconds per method and phase, :mod:`spectune.stats.by_phase`) and each phase's regime from the metadata (its
concurrency and its sampling mix, which must be a single setting). A method measured in several runs is pooled.

- best single static setting: among AR, every fixed γ and the non-learned rules measured (``RULES``), the largest
  output tokens over seconds summed over every phase (the whole workload's rate; each phase's equal token budget
  weighs the phases as the workload does);
- per-regime map: in each regime, the largest output tok/s among AR (γ 0) and the fixed γ (a map entry is a γ);
  and the map's rate over the whole workload against the best single setting's (``map_vs_static_pct``: the pilot of
  how much knowing the regime is worth on these prompts).

``python -m policies.static_answers RUN_DIR [RUN_DIR ...] --out MAP.json`` prints both and writes the map
(``policies.regime_map``'s file, with the answers, the vLLM tables and the runs it came from).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from policies.regime_map import KIND, VERSION
from spectune.errors import SpectuneError
from spectune.io import write_json
from spectune.methods import BASELINE, Method
from spectune.run import cli, rundir
from spectune.vllm_export import vllm_schedule

log = logging.getLogger(__name__)

RULES = ("match-length", "suffix-prob")  # non-learned, stateless rules: static settings a user could pick
COLUMNS = ("method", "phase", "temperature", "concurrency", "output_tokens", "seconds")


def phase_regimes(metadata: dict[str, Any], where: str) -> dict[str, tuple[float, int]]:
    """Each phase's regime (temperature, concurrency) from a bench run's metadata."""
    phases = (metadata.get("workload") or {}).get("phases")
    if not phases:
        raise SpectuneError(f"run={where} is invalid here: its workload has no phases (run task=bench on a workload "
                            "in phases, e.g. +workload=shift-en)")
    out = {}
    for phase in phases:
        mix = phase.get("sampling_mix") or []
        if len(mix) != 1:
            raise SpectuneError(f"run={where}: phase {phase.get('name')!r} samples with {len(mix)} settings; a regime "
                                "is one temperature (give each phase a single sampling_mix entry)")
        out[str(phase["name"])] = (float(mix[0]["temperature"]), int(phase["concurrency"]))
    return out


def phase_table(run_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """One row per (method, phase) of every run (``COLUMNS``), methods measured in several runs pooled."""
    frames = []
    for run in run_dirs:
        summary, metadata = rundir.SUMMARY.read(Path(run)), rundir.METADATA.read(Path(run))
        regimes = phase_regimes(metadata, str(run))
        rows = summary.get("by_phase") or []
        if not rows:
            raise SpectuneError(f"run={run} is invalid here: its summary has no by_phase rows (an unfinished run?)")
        frame = pd.DataFrame(rows)
        frame["temperature"] = [regimes[p][0] for p in frame["phase"]]
        frame["concurrency"] = [regimes[p][1] for p in frame["phase"]]
        frames.append(frame[list(COLUMNS)])
    table = pd.concat(frames).groupby(["method", "phase", "temperature", "concurrency"], as_index=False,
                                      sort=False)[["output_tokens", "seconds"]].sum()
    table["tok_s"] = table["output_tokens"] / table["seconds"]
    return table


def static_answers(table: pd.DataFrame, rules: Sequence[str] = RULES) -> dict[str, Any]:
    """The best single static setting and the per-regime map of a :func:`phase_table` (see the module)."""
    methods = {label: Method.parse(label) for label in dict.fromkeys(table["method"])}
    static = [label for label, m in methods.items() if not m.speculative or m.name == "fixed" or m.name in rules]
    fixed = [label for label, m in methods.items() if not m.speculative or m.name == "fixed"]
    if not fixed:
        raise SpectuneError("the runs hold no AR or fixed γ: a map needs them (run task=bench with policy=fixed)")
    phases = set(table["phase"])
    complete = [label for label in static if set(table[table["method"] == label]["phase"]) == phases]
    whole = table[table["method"].isin(complete)].groupby("method", sort=False)[["output_tokens", "seconds"]].sum()
    whole["tok_s"] = whole["output_tokens"] / whole["seconds"]
    best = str(whole["tok_s"].idxmax())
    ar_rate = float(whole.loc[BASELINE, "tok_s"]) if BASELINE in whole.index else None
    regimes = []
    for (temperature, concurrency), rows in table[table["method"].isin(fixed)].groupby(["temperature",
                                                                                        "concurrency"]):
        top = rows.loc[rows["tok_s"].idxmax()]
        ar = rows[rows["method"] == BASELINE]["tok_s"]
        regimes.append({"temperature": float(temperature), "concurrency": int(concurrency),
                        "method": str(top["method"]), "gamma": methods[str(top["method"])].gamma,
                        "tok_s": float(top["tok_s"]), "speedup": float(top["tok_s"] / ar.iloc[0]) if len(ar) else None})
    # The map over the whole workload: each phase at its regime's best fixed γ, tokens over seconds summed (the
    # registered pilot: how much a map told the regime gains over the best single setting on these prompts).
    chosen = {(r["temperature"], r["concurrency"]): r["method"] for r in regimes}
    picked = table[[chosen[(t, c)] == m for m, t, c in zip(table["method"], table["temperature"],
                                                            table["concurrency"], strict=True)]]
    map_rate = float(picked["output_tokens"].sum() / picked["seconds"].sum())
    best_rate = float(whole.loc[best, "tok_s"])
    return {"best_static": {"method": best, "gamma": methods[best].gamma, "tok_s": best_rate,
                            "speedup": best_rate / ar_rate if ar_rate else None,
                            "candidates": {str(k): float(v) for k, v in whole["tok_s"].items()}},
            "regimes": regimes, "map_tok_s": map_rate, "map_vs_static_pct": 100 * (map_rate / best_rate - 1)}


def regime_map(answers: dict[str, Any], sources: Sequence[str]) -> dict[str, Any]:
    """The map file ``policy=regime-map`` reads: the regimes' γ, the single static γ for a temperature not listed
    (the best fixed γ where the best single setting is a rule), each temperature's vLLM table, and provenance."""
    best = answers["best_static"]
    static = best["gamma"] if Method.parse(best["method"]).name in ("fixed", BASELINE) else max(
        (m for m in answers["regimes"]), key=lambda r: r["tok_s"])["gamma"]
    by_temperature: dict[float, dict[int, int]] = {}
    for entry in answers["regimes"]:
        by_temperature.setdefault(entry["temperature"], {})[entry["concurrency"]] = entry["gamma"]
    return {"kind": KIND, "version": VERSION, "static": int(static), "regimes": answers["regimes"],
            "best_static": best, "map_vs_static_pct": answers["map_vs_static_pct"],
            "vllm_num_speculative_tokens_per_batch_size": {str(t): vllm_schedule(c) for t, c in by_temperature.items()},
            "sources": [str(s) for s in sources]}


def format_answers(answers: dict[str, Any]) -> str:
    best = answers["best_static"]
    speedup = f"{best['speedup']:.2f}x AR" if best["speedup"] else "no AR measured"
    lines = [f"best single static setting: {best['method']} ({best['tok_s']:.1f} tok/s over the workload, {speedup})",
             f"per-regime map over the workload: {answers['map_tok_s']:.1f} tok/s, "
             f"{answers['map_vs_static_pct']:+.1f}% against the best single setting",
             f"{'temperature':>11} {'concurrency':>11} {'best fixed':<16} {'tok/s':>8} {'vs AR':>6}"]
    for r in answers["regimes"]:
        vs = f"{r['speedup']:.2f}" if r["speedup"] else "-"
        lines.append(f"{r['temperature']:>11g} {r['concurrency']:>11d} {r['method']:<16} {r['tok_s']:>8.1f} {vs:>6}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m policies.static_answers RUN_DIR [RUN_DIR ...] [--out MAP.json]``: the best single static setting
    and the per-regime map of bench runs over the regimes."""
    parser = cli.ArgumentParser(prog="python -m policies.static_answers", description=main.__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="task=bench run directories over the regimes (training prompts)")
    parser.add_argument("--out", default=None, help="write the map here (policy=regime-map policy.path=...)")
    return cli.run_command(parser, _answer, argv)


def _answer(args: argparse.Namespace) -> None:
    answers = static_answers(phase_table(args.runs))
    log.info("%s", format_answers(answers))
    if args.out:
        write_json(args.out, regime_map(answers, args.runs))
        log.info("map written to %s", args.out)


if __name__ == "__main__":
    raise SystemExit(main())
