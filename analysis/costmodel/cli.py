"""`python -m analysis.costmodel --profile PROFILE.json --traces TRACES.parquet RUN_DIR`: the fitted cost
model's speed-up next to the measured fixed-γ runs.

The prediction comes from a ``task=profile`` result (costs) and ``task=trace`` traces (acceptance), never
from the runs it predicts. The measurement is like for like: a TPOT-based speed-up (the AR's mean TPOT
over the method's; the formula leaves out prefill, and so does TPOT). Beside each speed-up stand the
terms on both sides, in units of the run's own AR step: E (tokens per cycle), draft (c₁ + c (γ − 1): a cycle's
first draft step apart from the later ones), verify (g(γ))
and overhead (o), so a miss says which term is off. ``measured_E`` is the acceptance length (1 + accepted),
``measured_emitted`` the tokens a cycle really delivered (the last cycle of a request is cut at
max_new_tokens or EOS, a finite-length term the formula leaves out); ``in_sample_speedup`` puts the run's
own terms (emitted tokens, draft, verify, overhead) into the formula: if it misses too, the time is outside
the cycles (admission, scheduling). Writes ``costmodel_fit.csv`` and ``costmodel_fit.json`` (with metadata)
into RUN_DIR.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.costmodel.fit import fit, joint_from_traces, mean_profile
from analysis.load import add_speedups, fixed_gamma, load_cycles, load_summaries, load_traces
from spectune.costmodel.profile import Profile, load_profile, profile_mismatch
from spectune.errors import SpectuneError
from spectune.methods import BASELINE
from spectune.run import cli, rundir
from spectune.run.metadata import base_metadata

log = logging.getLogger(__name__)

FIT_CSV = rundir.COSTMODEL_FIT_CSV.name
FIT_JSON = rundir.COSTMODEL_FIT_JSON.name
COLUMNS = ["gamma", "batch_size", "predicted_speedup", "measured_speedup", "error", "constant_alpha_speedup",
           "constant_alpha_error", "seed_speedup", "E", "E_constant_alpha", "measured_E", "measured_emitted", "draft",
           "measured_draft", "verify", "measured_verify", "overhead", "measured_overhead", "in_sample_speedup",
           "language", "run"]


def measured(run_dir: Path | str, allow_mixed: bool = False) -> pd.DataFrame:
    """Per fixed-γ grid point of the runs below ``run_dir``: the TPOT-based speed-up over the same run's AR,
    and the cycle's terms in units of that AR's mean step (verify seconds of an AR cycle)."""
    summaries = add_speedups(load_summaries(run_dir, allow_mixed))
    fixed = summaries[fixed_gamma(summaries["method"]) & (summaries["status"] == "ok")]
    if fixed.empty or not summaries["method"].eq(BASELINE).any():
        raise SpectuneError(f"{run_dir} has no fixed-γ runs with an AR baseline to compare with: run "
                            "python -m harness +workload=NAME (policy=fixed, task.baseline=true)")
    rows_of_cycles = load_cycles(run_dir, allow_mixed)  # one row per (cycle, request)
    emitted = rows_of_cycles[rows_of_cycles["num_drafts"] > 0].groupby(["run", "method"])["emitted"].mean()
    cycles = rows_of_cycles.drop_duplicates(["run", "method", "cycle"])  # one row per cycle: its times
    per_cycle = cycles.groupby(["run", "method"])[["draft_s", "verify_s", "rest_s"]].mean()
    rows = []
    for point in fixed.itertuples(index=False):
        run = point.run
        if (run, BASELINE) not in per_cycle.index or (run, point.method) not in per_cycle.index:
            continue
        step = per_cycle.loc[(run, BASELINE), "verify_s"]
        times = per_cycle.loc[(run, point.method)]
        rows.append({"run": run, "gamma": int(point.gamma), "batch_size": int(point.concurrency or 1),
                     "language": point.language, "measured_speedup": point.tpot_speedup,
                     "measured_E": point.spec_decode_acceptance_length,
                     "measured_emitted": emitted.get((run, point.method), float("nan")),
                     "measured_draft": times["draft_s"] / step, "measured_verify": times["verify_s"] / step,
                     "measured_overhead": times["rest_s"] / step,
                     "measured_ar_overhead": per_cycle.loc[(run, BASELINE), "rest_s"] / step})
    out = pd.DataFrame(rows)
    if len(out):  # the formula with every term taken from the run itself: does the formula close?
        out["in_sample_speedup"] = out["measured_emitted"] * (1 + out["measured_ar_overhead"]) / (
            out["measured_draft"] + out["measured_verify"] + out["measured_overhead"])
    return out


def check_same_setup(profile: Profile, traces_meta: dict[str, Any], run: Path, allow_mixed: bool) -> None:
    """The profile (models and hardware, :data:`spectune.costmodel.profile.MATCH_FIELDS`) and the traces (models) must
    describe the runs, else the fit means nothing. A field the run did not record is not held against it."""
    if allow_mixed:
        return
    meta = rundir.METADATA.read(run)
    for field, (theirs, ours) in profile_mismatch(profile, meta).items():
        if theirs is not None and ours is not None:
            raise SpectuneError(f"the profile {profile.label!r} was measured with {field}={theirs} but {run} ran "
                                f"{field}={ours}: pass --allow-mixed to compare them anyway")
    for role in ("target", "draft"):
        theirs = rundir.current_model_path(((traces_meta.get("models") or {}).get(role) or {}).get("name_or_path"))
        ours = rundir.current_model_path(((meta.get("models") or {}).get(role) or {}).get("name_or_path"))
        if theirs is not None and ours is not None and theirs != ours:
            raise SpectuneError(f"the traces were recorded with {role} {theirs} but {run} ran {ours}: pass "
                                "--allow-mixed to compare them anyway")


def compare(profile: Profile, traces: pd.DataFrame, runs: pd.DataFrame, method: str = "expected") -> pd.DataFrame:
    """Predictions at each run's batch size and γ, joined to the measurement; error = predicted/measured − 1."""
    rows = []
    for (batch, language), part in runs.groupby(["batch_size", "language"], dropna=False):
        own = traces
        if "language" in traces and language in set(traces["language"]):
            own = traces[traces["language"] == language]  # acceptance is per language
        prediction = fit(profile, own, sorted(int(g) for g in part["gamma"].unique()), int(batch), method)
        rows.append(part.merge(prediction, on=["gamma", "batch_size"], how="left"))
    out = pd.concat(rows, ignore_index=True).sort_values(["batch_size", "gamma", "run"], ignore_index=True)
    out["error"] = out["predicted_speedup"] / out["measured_speedup"] - 1
    out["constant_alpha_error"] = out["constant_alpha_speedup"] / out["measured_speedup"] - 1
    return out


def run(profile_path: Path | str | Sequence[Path | str], traces_path: Path, run_dir: Path, allow_mixed: bool = False,
        method: str = "expected") -> pd.DataFrame:
    """Fit, compare, print and write ``costmodel_fit.csv`` / ``.json`` into ``run_dir``."""
    paths = [profile_path] if isinstance(profile_path, str | Path) else list(profile_path)
    profile = mean_profile([load_profile(p) for p in paths])
    traces = load_traces(traces_path)
    runs = measured(run_dir, allow_mixed)
    if runs.empty:
        raise SpectuneError(f"{run_dir} has no cycles.parquet for its fixed-γ runs: nothing to compare with")
    first = load_summaries(run_dir, allow_mixed).iloc[0]
    traces_meta = rundir.TRACES_METADATA.read_if_present(traces["run"].iloc[0], {})
    for run in runs["run"].unique():
        check_same_setup(profile, traces_meta, Path(run), allow_mixed)
    table = compare(profile, traces, runs, method)[[*COLUMNS, "measured_ar_overhead"]]
    joint = joint_from_traces(traces, method)
    log.info(f"Cost model fitted on profile {profile.label!r} ({', '.join(map(str, paths))}) and traces {traces_path} "
             f"({method} joint acceptance, {len(joint)} positions), against the fixed-γ runs in {run_dir}")
    powers = " ".join(f"{joint[0] ** i:.3f}" for i in range(1, len(joint) + 1))
    log.info("joint P(first i accepted): " + " ".join(f"{p:.3f}" for p in joint) + f"   vs α^i: {powers}")
    log.info("S = E(1+o)/(c₁ + c(γ−1) + g(γ) + o); measured = AR mean TPOT / mean TPOT; terms in AR steps "
             "(predicted, measured_)")
    shown = table[["gamma", "batch_size", "language", "predicted_speedup", "measured_speedup", "error",
                   "constant_alpha_speedup", "constant_alpha_error", "E", "measured_E", "draft", "measured_draft",
                   "verify", "measured_verify", "overhead", "measured_overhead"]]
    log.info(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    worst = float(table["error"].abs().max())
    log.info(f"largest |error| {worst:.1%} (goal 10%)")
    rundir.COSTMODEL_FIT_CSV.write(run_dir, table)
    rundir.COSTMODEL_FIT_JSON.write(run_dir, {
        **base_metadata(), "task": "costmodel_fit", "profile": [str(p) for p in paths], "traces": str(traces_path),
        "runs": str(run_dir), "joint_method": method, "joint": joint, "alpha": joint[0],
        "profile_label": profile.label, "profile_models": profile.models, "profile_hardware": profile.hardware,
        "profile_synthetic": profile.synthetic, "traces_metadata": traces_meta,
        "models": {k: first.get(k) for k in ("models", "target", "draft", "dtype")},
        "hardware": {k: first.get(k) for k in ("hardware", "device", "device_name", "execution_path")},
        "formula": "S = E (1 + o) / (c γ + g(γ) + o), E = 1 + Σ_{i≤γ} P(first i accepted)",
        "measured": "TPOT-based: mean TPOT of AR / mean TPOT of the fixed γ, same run",
        "rows": table.to_dict("records")})
    log.info(f"wrote {rundir.COSTMODEL_FIT_CSV.path(run_dir)}")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m analysis.costmodel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, action="append",
                        help="profile.json written by task=profile, or a shipped name; repeat it to average profiles "
                             "taken before and after the runs (load drift cancels to first order)")
    parser.add_argument("--traces", required=True, type=Path, help="traces.parquet written by task=trace")
    parser.add_argument("run_dir", type=Path, help="a bench run or sweep directory with fixed-γ runs and AR")
    parser.add_argument("--joint", choices=("expected", "realised"), default="expected",
                        help="joint acceptance from Π a_j (expected, default) or realised acceptances")
    parser.add_argument("--allow-mixed", action="store_true", help="allow different models or hardware")
    return cli.run_command(parser, _fit, argv)


def _fit(args: argparse.Namespace) -> None:
    run(args.profile, args.traces, args.run_dir, args.allow_mixed, args.joint)


if __name__ == "__main__":
    raise SystemExit(main())
