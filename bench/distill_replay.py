"""What the distilled per-step policy keeps of its network's choices, in replay on recorded runs' held-out traces.

For each ``policies.evaluate`` run directory given (its ``train/c1/gamma.zip``, training traces and calibrated
profile, and ``heldout_traces_c1.parquet``): the network is distilled on its training traces
(:func:`policies.ppo_distilled.distill`, nothing written into the file), then the network, its distilled
thresholds (step 0's on recent acceptance included) and the run's tuned confidence rule (``tuning.csv``) are
replayed on the held-out traces with the run's profile, beside the best fixed γ and the two oracles. Replay
charges no decision time (the live cost of a decision is ``decide%`` in ``policies.evaluate``), so this reads what
the thresholds keep of the network's *choices*, on the real pair, offline and independent of the machine's load.

    python bench/distill_replay.py bench/results/smollm2-eagle-policies-interleaved-cpu-20261202/{en,zh}
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pandas as pd

from policies.envs.data import TraceSet
from policies.envs.replay import replay_gammas, replay_scores
from policies.evaluate import learned_profile
from policies.ppo_distilled import distill
from policies.registry import make_policy
from spectune import rundir


def study(run: Path) -> list[dict]:
    train = run / "train" / "c1"
    gamma = rundir.GAMMA_POLICY.found(train)
    profile = learned_profile(train)
    max_gamma = int(rundir.TRAIN.read(train)["settings"]["max_gamma"])
    result = distill(gamma, TraceSet.load(rundir.TRACES.path(train)), profile, max_gamma)
    heldout = TraceSet.load(rundir.HELDOUT_TRACES.named(concurrency=1).path(run))
    node = {"gamma_path": str(gamma), "trust_pickle": False, "profile": None, "allow_profile_mismatch": True}
    policies = {"ppo (network)": make_policy({"name": "ppo", **node, "deterministic": True, "seed": 0}, max_gamma),
                "ppo-distilled": make_policy({"name": "ppo-distilled", **node,
                                              "thresholds": list(result.thresholds),
                                              "start_threshold": result.start_threshold}, max_gamma)}
    tuning = rundir.TUNING.path(run)
    if tuning.is_file():
        table = pd.read_csv(tuning)
        chosen = table[(table["policy"] == "confidence") & table["chosen"]]
        if len(chosen):
            value = float(chosen.iloc[0]["value"])
            policies[f"confidence (tuned: {value:g})"] = make_policy({"name": "confidence", "threshold": value},
                                                                     max_gamma)
    rows = []
    oracles = None
    for label, policy in policies.items():
        gammas = replay_gammas(policy, heldout, max_gamma, profile)
        scores = replay_scores(heldout, profile, max_gamma, gammas, rate="request", oracles=oracles is None)
        oracles = oracles or scores
        rows.append({"run": run.name, "policy": label, "tok_s": scores["policy_tok_s"],
                     "vs_best_fixed_pct": scores["vs_best_fixed_pct"], "mean_gamma": scores["mean_gamma"]})
    best = oracles["best_fixed_gamma"]
    rows.append({"run": run.name, "policy": f"best fixed γ ({best}, hindsight)",
                 "tok_s": oracles["best_fixed_tok_s"], "vs_best_fixed_pct": 0.0, "mean_gamma": float(best)})
    for key, label in (("oracle", "oracle (hindsight)"), ("informed_oracle", "informed oracle")):
        rows.append({"run": run.name, "policy": label, "tok_s": oracles[f"{key}_tok_s"],
                     "vs_best_fixed_pct": oracles[f"{key}_vs_best_fixed_pct"], "mean_gamma": float("nan")})
    agreement = ", ".join("–" if a is None else f"{a:.3f}" for a in result.agreement)
    start = "–" if result.start_agreement is None else f"{result.start_agreement:.3f}"
    print(f"{run}: thresholds {[round(t, 4) for t in result.thresholds]}, agreement per step [{agreement}] "
          f"(overall {result.overall:.3f} over {sum(result.decisions)} decisions); step 0: recent acceptance >= "
          f"{result.start_threshold}, agreement {start} over {result.start_decisions} rows; on the training traces "
          f"{result.distilled_tok_s:.2f} tok/s against the network's {result.network_tok_s:.2f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="policies.evaluate run directories")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = [row for run in args.runs for row in study(run)]
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
