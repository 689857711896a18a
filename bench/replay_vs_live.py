"""How well did the replay predict each policy of a recorded ``policies.evaluate`` run? Both accounts side by side.

For every concurrency of RUN_DIR this rebuilds the policies the run measured live (the learned files of
``train/c<N>/``, or of ``--policies-from``; the threshold values the run tuned, from its ``metadata.json``),
replays them on the run's own held-out traces (``heldout_traces_c<N>.parquet``) with the profile the learned
policies were trained with, and prints, per policy, the live decode tok/s (``comparison.parquet``), the replay's
per-request rate when each row is charged its batch cycle at the cycle's deepest γ (lockstep, as the engine
runs) and when charged at its own γ (as the γ environment charges a row), and each account's error
relative to the best fixed γ's: error(policy) − error(best fixed γ), in points. A policy whose relative error is
far above the fixed γ' is one the replay flatters: the replay said it gains what the live run did not.

Offline (no model runs): seconds on the 2-core VM.

    python bench/replay_vs_live.py RUN_DIR [--policies-from TRAIN_DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.policy_table import AA_POLICY, BEST_FIXED
from policies.envs.data import TraceSet
from policies.envs.replay import replay_gammas, replay_scores
from policies.evaluate.pipeline import learned_files, learned_profile, policy_node
from policies.registry import make_policy
from spectune.methods import BASELINE, Method, is_label
from spectune.run import rundir

AR_LABELS = (BASELINE, AA_POLICY)


def learned_dir(run: Path, concurrency: int, policies_from: Path | None) -> Path:
    base = policies_from or run / "train"
    nested = base / f"c{concurrency}"
    return nested if nested.is_dir() else base


def rescore(run: Path, concurrency: int, policies_from: Path | None) -> pd.DataFrame:
    """One row per policy of the run at ``concurrency``: live decode tok/s and both replay accounts."""
    table = rundir.COMPARISON.read(run)
    table = table[table["concurrency"] == concurrency]
    meta = rundir.METADATA.read(run)
    settings, tuned = meta["settings"], meta.get("tuned", {}).get(f"c{concurrency}", {})
    max_gamma = int(settings["max_gamma"])
    learned = learned_dir(run, concurrency, policies_from)
    profile = learned_profile(learned)
    traces = TraceSet(pd.read_parquet(run / rundir.HELDOUT_TRACES.named(concurrency=concurrency).name), {},
                      "held-out traces")
    rows = []
    for _, live in table.iterrows():
        policy, gamma = str(live["policy"]), live.get("gamma")
        if policy in AR_LABELS:
            gammas = np.zeros(traces.count, dtype=int)
        elif is_label(policy) or policy == BEST_FIXED:
            gamma = Method.parse(policy).gamma if is_label(policy) else int(gamma)
            gammas = np.full(traces.count, gamma)
        else:
            params = {**settings.get("params", {}).get(policy, {}), **tuned.get(policy, {})}
            node = policy_node(policy, params, **learned_files(policy, learned, concurrency))
            gammas = replay_gammas(make_policy(node, max_gamma), traces, max_gamma, profile)
        scores = {lock: replay_scores(traces, profile, max_gamma, gammas, rate="request", lockstep=lock,
                                       oracles=False)
                  for lock in (True, False)}
        rows.append({"policy": policy, "live": float(live["decode_tok_s"]),
                     "lockstep": scores[True]["policy_tok_s"], "own_gamma": scores[False]["policy_tok_s"],
                     "mean_gamma": float(gammas.mean())})
    frame = pd.DataFrame(rows)
    for account in ("lockstep", "own_gamma"):
        frame[f"{account}_err_pct"] = 100 * (frame[account] / frame["live"] - 1)
    best = frame[frame["policy"] == "best fixed γ"]
    if len(best):
        for account in ("lockstep", "own_gamma"):
            frame[f"{account}_vs_best_pts"] = frame[f"{account}_err_pct"] - float(best[f"{account}_err_pct"].iloc[0])
    return frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("run", type=Path, help="a policies.evaluate run directory")
    parser.add_argument("--policies-from", type=Path, default=None,
                        help="the learned policies' directory, when the run read them from another run")
    args = parser.parse_args(argv)
    if not (args.run / rundir.COMPARISON.name).is_file():
        print(f"error: {args.run} is not a policies.evaluate run: no {rundir.COMPARISON.name} there", file=sys.stderr)
        return 2
    table = rundir.COMPARISON.read(args.run)
    pd.set_option("display.width", 200)
    for concurrency in sorted(table["concurrency"].unique()):
        frame = rescore(args.run, int(concurrency), args.policies_from)
        print(f"\n{args.run} — concurrency {concurrency}: decode tok/s, live vs replay (per-request rate); "
              "errors in %, and relative to the best fixed γ's error in points")
        print(frame.round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
