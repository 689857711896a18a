"""Do the draft's signals predict acceptance? ROC AUC per signal, side by side for several trace files.

Each ``--traces LABEL=PATH`` is a ``traces.parquet`` of ``python -m harness task=trace`` (e.g. the tiny pair
and smollm2 on the same workload); the table has one row per (label, signal) with the AUC of the oriented
signal (q(x), −entropy, margin, cum_prob) for "this draft was accepted" over the positions the verification
tested, its 95% request-bootstrap interval and the counts (:mod:`analysis.signals`). With ``--profile LABEL=PATH``
(a ``task=profile`` result of the same pair and hardware) the traces of that label are also replayed
(:func:`policies.envs.replay.replay_scores`): the best fixed γ in hindsight and the hindsight oracle (the best γ
per cycle), i.e. the headroom an adaptive policy has over the best fixed γ on these prompts.

    python bench/signal_auc.py --traces tiny-en=RUN1/traces.parquet smollm2-en=RUN2/traces.parquet \
        --out bench/results/signal-auc-cpu-DATE
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.report import markdown_table
from analysis.signals import signal_auc
from spectune import rundir
from spectune.io import write_csv, write_text
from spectune.metadata import base_metadata

log = logging.getLogger("bench.signal_auc")


def parse_pairs(values: list[str], flag: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for value in values:
        label, sep, path = value.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"error: {flag} {value!r} is invalid: give LABEL=PATH")
        if not Path(path).is_file():
            raise SystemExit(f"error: {flag} {value!r}: no file at {path}")
        out[label] = Path(path)
    return out


def oracle_headroom(frame: pd.DataFrame, meta: dict, label: str, profile_path: Path) -> dict:
    """Replay tok/s of the best fixed γ, of the hindsight oracle and of the informed oracle (choosing on the
    drafted tokens' acceptance probabilities, not on the acceptance coin) on these traces, with the profile's costs."""
    from policies.envs.data import TraceSet
    from policies.envs.replay import replay_scores
    from spectune.profile import load_profile

    traces = TraceSet(frame, meta, label)
    profile = load_profile(profile_path)
    gamma = int(frame["position"].max())
    scores = replay_scores(traces, profile, gamma, np.zeros(traces.count, dtype=int))
    best = int(scores["best_fixed_gamma"])
    fixed = float(np.asarray(scores["fixed_tok_s"])[best])
    return {"profile": profile.label, "best_fixed_gamma": best, "best_fixed_tok_s": fixed,
            "oracle_tok_s": float(scores["oracle_tok_s"]), "headroom_pct": 100 * (scores["oracle_tok_s"] / fixed - 1),
            "informed_oracle_tok_s": float(scores["informed_oracle_tok_s"]),
            "informed_headroom_pct": float(scores["informed_oracle_vs_best_fixed_pct"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", required=True, help="LABEL=traces.parquet, one or more")
    parser.add_argument("--profile", nargs="*", default=[], help="LABEL=profile.json for the oracle's headroom")
    parser.add_argument("--resamples", type=int, default=1000, help="request-bootstrap resamples for the 95%% CI")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write OUT.csv and OUT.md (with the metadata)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.resamples < 0:
        raise SystemExit(f"error: --resamples={args.resamples} is invalid: an integer >= 0")
    tables, sources, headroom = [], {}, []
    profiles = parse_pairs(args.profile, "--profile")
    for label, path in parse_pairs(args.traces, "--traces").items():
        frame = pd.read_parquet(path)
        table = signal_auc(frame, args.resamples, args.seed)
        table.insert(0, "traces", label)
        tables.append(table)
        meta = rundir.TRACES_METADATA.read(path.parent) if rundir.TRACES_METADATA.exists(path.parent) else {}
        sources[label] = {"path": str(path), "models": meta.get("models", {}).get("name"),
                          "workload": (meta.get("workload") or {}).get("name"),
                          "max_gamma": meta.get("max_gamma"), "sampling": (meta.get("workload") or {}).get("sampling")}
        if label in profiles:
            headroom.append({"traces": label, **oracle_headroom(frame, meta, label, profiles[label])})
    result = pd.concat(tables, ignore_index=True)
    text = result.to_string(index=False, float_format=lambda v: f"{v:.3f}")
    oracle = pd.DataFrame(headroom)
    if len(oracle):
        text += "\n\n" + oracle.to_string(index=False, float_format=lambda v: f"{v:.3f}")
    sys.stdout.write(text + "\n")
    if args.out:
        write_csv(args.out.with_suffix(".csv"), result)
        meta = {**base_metadata(), "command": "python bench/signal_auc.py " + " ".join(sys.argv[1:]),
                "sources": sources}
        write_text(args.out.with_suffix(".md"),
                   "# Draft signals against acceptance: ROC AUC\n\n"
                   "Positions the verification tested (every earlier draft of the cycle accepted); AUC = "
                   "Mann–Whitney U / (n₁·n₀), ties half; 95% interval: percentile bootstrap over requests "
                   f"({args.resamples} resamples, seed {args.seed}).\n\n"
                   + markdown_table(result, "{:.3f}") + "\n\n"
                   + ("## Headroom: the hindsight oracle over the best fixed γ (replay, the profile's costs)\n\n"
                      + markdown_table(oracle, "{:.3f}") + "\n\n" if len(oracle) else "") + "```json\n"
                   + json.dumps(meta, indent=2, default=str) + "\n```\n")
        log.info("wrote %s.csv and .md", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
