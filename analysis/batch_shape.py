"""Where a phase's time went, by the rows busy in each cycle: per method, the cycles run with b busy rows, their
seconds, the tokens they emitted and their rate; and each method's rate at the baseline's mix of batch sizes.

Why: at concurrency above one, a block of prompts runs until its longest answer ends, and the cycles after its
first answer ends run with fewer rows at nearly the same price. A method's rate over a phase therefore mixes how fast
its cycles are with how long the answers it drew are. Under sampling each method draws its own answers (a
speculative method's rejections draw from the residual, so its answers differ from AR's while their law is the same),
and AR's answers are the same in every repeat (the seed fixes them), so repeats do not average that draw away.
Cycles with the same number of busy rows separate the two: ``at_mix`` prices the baseline's tokens at each batch size
with the method's own rate there, which is the method's rate had it drawn answers of the baseline's lengths.
``workload.ignore_eos`` fixes the answers' lengths instead, but not where each row finishes: a speculative cycle
emits several tokens for some rows and one for others, so a block's rows still end at different cycles, while AR's
all end together.

``drafting_split`` sets, at one batch size, the cycles that verified a draft against the plain steps: what drafting
returned where the method chose to draft. ``cycle_count`` reads the phase as cycles times their price: with a price
nearly flat in the busy rows, a draft that lets a row end before its block's slowest one saves no cycle.
``plain_spans`` is what a method pays in a cycle where it does not speculate (its proposer and policy still run).
``unit_spread`` is each method's standard deviation, across the units the harness's interval pairs (each request's
time its share of the phase's span), of its log rate over the baseline's: how much each unit moves the interval.

    python -m analysis.batch_shape RUN_DIR [--phase NAME]   # --phase: a phase of a workload in phases
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from spectune.methods import BASELINE
from spectune.run import rundir
from spectune.stats.by_phase import phase_spans, phase_terms, phases_of
from spectune.stats.units import units_of

log = logging.getLogger(__name__)

SPANS = ("draft_s", "verify_s", "rest_s", "policy_s", "policy_outside_s")  # a cycle's timed parts, as recorded


def cycle_table(cycles: pd.DataFrame, requests: pd.DataFrame, phase: str | None = None) -> pd.DataFrame:
    """One row per (method, repeat, cycle): its busy rows, seconds (drafting, verification, the rest and the
    policy's time outside those spans), the tokens its rows emitted and whether any row verified a draft
    (``drafted``); ``phase``: that phase's cycles only."""
    if phase is not None:
        if phase not in phases_of(requests):
            raise ValueError(f"phase {phase!r} is not in this run: its phases are {phases_of(requests)}")
        mine = requests.loc[requests["phase"] == phase, ["method", "repeat", "request_id"]]
        cycles = cycles.merge(mine, on=["method", "repeat", "request_id"])
    outside = cycles.get("policy_outside_s", 0.0)  # the policy's time between the timed spans
    cycles = cycles.assign(seconds=cycles["draft_s"] + cycles["verify_s"] + cycles["rest_s"] + outside,
                           drafted=cycles["num_drafts"] > 0, policy_s=cycles.get("policy_s", 0.0),
                           policy_outside_s=outside)
    return cycles.groupby(["method", "repeat", "cycle"], sort=False).agg(
        batch_size=("batch_size", "first"), seconds=("seconds", "first"), tokens=("emitted", "sum"),
        drafted=("drafted", "max"), **{span: (span, "first") for span in SPANS}).reset_index()


def plain_spans(table: pd.DataFrame) -> pd.DataFrame:
    """Per method, the mean seconds of each recorded span over its plain steps (cycles that verified no draft): what
    a method pays in a cycle where it does not speculate. ``policy_s`` is all of the policy's time, inside the draft,
    verify and rest spans or outside them (``policy_outside_s``)."""
    plain = table[~table["drafted"]]
    return plain.groupby("method", sort=False)[list(SPANS)].mean().reset_index()


def by_batch_size(table: pd.DataFrame) -> pd.DataFrame:
    """Per (method, batch size): cycles, seconds, tokens and tokens per second, methods in their order."""
    out = table.groupby(["method", "batch_size"], sort=False).agg(
        cycles=("cycle", "size"), seconds=("seconds", "sum"), tokens=("tokens", "sum")).reset_index()
    out["rate"] = out["tokens"] / out["seconds"]
    order = {m: i for i, m in enumerate(dict.fromkeys(table["method"]))}
    return out.sort_values(["method", "batch_size"], key=lambda c: c.map(order) if c.name == "method" else c,
                           ignore_index=True)


def drafting_split(table: pd.DataFrame, batch_size: int) -> pd.DataFrame:
    """Per method, its cycles at ``batch_size`` busy rows split into those that verified a draft and plain steps:
    the share that drafted, each kind's mean seconds and tokens, and the drafting cycles' rate over the plain ones'
    (what drafting returned where the method chose it; NaN where it has no cycle of a kind)."""
    rows = []
    for method, mine in table[table["batch_size"] == batch_size].groupby("method", sort=False):
        kinds = mine.groupby("drafted")[["seconds", "tokens"]]
        mean, total = kinds.mean().reindex([True, False]), kinds.sum().reindex([True, False])  # NaN: no such cycle
        rate = total["tokens"] / total["seconds"]
        rows.append({"method": method, "cycles": len(mine), "drafted_share": float(mine["drafted"].mean()),
                     "drafted_s": mean.at[True, "seconds"], "drafted_tokens": mean.at[True, "tokens"],
                     "plain_s": mean.at[False, "seconds"], "plain_tokens": mean.at[False, "tokens"],
                     "drafted_over_plain": rate[True] / rate[False]})
    return pd.DataFrame(rows)


def cycle_count(table: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Per method, its cycles, their mean seconds, and both over the baseline's. Why: a cycle costs nearly the same
    with one busy row as with the full batch, so a block lasts about as many cycles as its slowest row needs; a
    method gains only where it runs fewer cycles than their extra price costs it."""
    out = table.groupby("method", sort=False).agg(cycles=("cycle", "size"), seconds=("seconds", "sum"))
    out["mean_s"] = out["seconds"] / out["cycles"]
    if baseline not in out.index:
        raise ValueError(f"the baseline {baseline!r} is not in this run")
    out["cycles_over"] = out["cycles"] / out.at[baseline, "cycles"]
    out["mean_s_over"] = out["mean_s"] / out.at[baseline, "mean_s"]
    return out.reset_index()


def at_mix(rates: pd.DataFrame, baseline: str = BASELINE) -> pd.Series:
    """Per method, the baseline's tokens at each batch size over the seconds the method's own rate there takes
    for them: its rate at the baseline's mix (NaN where it never ran a batch size the baseline ran)."""
    base = rates[rates["method"] == baseline].set_index("batch_size")["tokens"]
    if base.empty:
        raise ValueError(f"the baseline {baseline!r} is not in this run")
    out = {}
    for method, mine in rates.groupby("method", sort=False):
        rate = mine.set_index("batch_size")["rate"].reindex(base.index)
        out[method] = float(base.sum() / (base / rate).sum()) if rate.notna().all() else float("nan")
    return pd.Series(out, name="rate_at_baseline_mix")


def unit_spread(requests: pd.DataFrame, phase: str, size: int, baseline: str = BASELINE) -> pd.Series:
    """Per method but the baseline, the standard deviation across the phase's units (``size`` consecutive prompts,
    their repeats pooled, as :func:`~spectune.stats.by_phase.phase_intervals` pairs them) of log(its rate over the
    baseline's in the unit)."""
    part = requests[requests["phase"] == phase]
    units = units_of(phase_terms(part, phase_spans(part), size), 1)
    base = np.log(units.num[baseline] / units.den[baseline])
    return pd.Series({m: float(np.std(np.log(units.num[m] / units.den[m]) - base, ddof=1))
                      for m in units.num if m != baseline}, name="unit_log_ratio_sd")


def report(run: Path, phase: str | None = None, baseline: str = BASELINE) -> str:
    """The per-batch-size table of ``run`` (a bench run directory with ``cycles.parquet``) and each method's pooled
    cycle rate beside its rate at the baseline's mix, both over the baseline's."""
    requests = rundir.REQUESTS.read(run)
    table = cycle_table(rundir.CYCLES.read(run), requests, phase)
    rates = by_batch_size(table)
    pooled = table.groupby("method", sort=False)[["tokens", "seconds"]].sum()
    pooled = pooled["tokens"] / pooled["seconds"]
    mixed = at_mix(rates, baseline)
    lines = [f"{run}" + (f", phase {phase}" if phase else ""),
             f"{'method':<24} {'rows':>4} {'cycles':>7} {'seconds':>9} {'tokens':>7} {'tok/s':>7}"]
    lines += [f"{r.method:<24} {r.batch_size:>4} {r.cycles:>7} {r.seconds:>9.2f} {r.tokens:>7} {r.rate:>7.2f}"
              for r in rates.itertuples()]
    lines.append(f"{'method':<24} {'cycles tok/s':>12} {'over ' + baseline:>9} {'at its mix':>11} {'over':>6}")
    for method in pooled.index:
        lines.append(f"{method:<24} {pooled[method]:>12.2f} {pooled[method] / pooled[baseline]:>9.3f} "
                     f"{mixed[method]:>11.2f} {mixed[method] / mixed[baseline]:>6.3f}")
    full = int(table["batch_size"].max())
    for size in range(full, 0, -1):  # the full batch first: where a method chose to draft most
        split = drafting_split(table, size)
        if size < full and not split["drafted_share"].gt(0).any():
            continue
        lines.append(f"cycles with {size} busy rows: {'drafted':>8} {'ms':>7} {'tokens':>7} | {'plain ms':>8} "
                     f"{'tokens':>7} | drafted tok/s over plain")
        for r in split.itertuples():
            lines.append(f"{r.method:<24} {r.drafted_share:>8.1%} {1e3 * r.drafted_s:>7.1f} "
                         f"{r.drafted_tokens:>7.2f} | {1e3 * r.plain_s:>8.1f} {r.plain_tokens:>7.2f} | "
                         f"{r.drafted_over_plain:.3f}")
    lines.append(f"{'method':<24} {'cycles':>7} {'over ' + baseline:>9} {'ms a cycle':>11} {'over':>6}")
    for r in cycle_count(table, baseline).itertuples():
        lines.append(f"{r.method:<24} {r.cycles:>7} {r.cycles_over:>9.3f} {1e3 * r.mean_s:>11.1f} "
                     f"{r.mean_s_over:>6.3f}")
    lines.append(f"{'plain steps, mean ms:':<24} {'draft':>7} {'verify':>7} {'rest':>6} {'policy':>7} {'outside':>8}")
    for r in plain_spans(table).itertuples():
        lines.append(f"{r.method:<24} {1e3 * r.draft_s:>7.2f} {1e3 * r.verify_s:>7.2f} {1e3 * r.rest_s:>6.2f} "
                     f"{1e3 * r.policy_s:>7.2f} {1e3 * r.policy_outside_s:>8.2f}")
    if phase is not None:
        size = int(rundir.METADATA.read(run)["settings"]["phases"][phase])  # the phase's concurrency: its unit
        spread = unit_spread(requests, phase, size, baseline)
        lines.append(f"units of {size} prompts: SD of the per-unit log rate over {baseline}: "
                     + ", ".join(f"{m} {v:.3f}" for m, v in spread.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a bench run directory (with cycles.parquet)")
    parser.add_argument("--phase", help="one phase of a workload in phases")
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args(argv)
    missing = [args.run / f.name for f in (rundir.CYCLES, rundir.REQUESTS) if not (args.run / f.name).is_file()]
    try:
        if missing:
            raise ValueError(f"{missing[0]} does not exist: give a bench run directory")
        text = report(args.run, args.phase, args.baseline)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(text)  # the table is the command's output


if __name__ == "__main__":
    main()
