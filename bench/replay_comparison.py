"""Every draft-length policy replayed on held-out traces under three cost profiles, with PPO's transfer checks.

In one run on the embedded tiny pair (CPU, T = 1, concurrency 1):

1. Traces (``task=trace``'s recorder) at ``--max-gamma``: the English workload's seeded shuffle split into a
   training part (the first ``--train`` prompts) and a held-out part (the next ``--heldout``); the Italian
   training part too (for the language transfer).
2. Per profile (``h200-llama3-8b-1b``, ``h200-llama3-8b-160m``: the tiny pair's acceptance × H200 costs, labelled
   synthetic; ``tiny-cpu-2core-vm``): a PPO γ policy trained in replay on the English training traces with
   ``policies.train.pipeline.train_policies`` (``--timesteps`` steps, conf/train.yaml's PPO settings); for
   ``--language-profiles`` also one trained on the Italian training traces.
3. Per profile, on the held-out English traces, :func:`policies.envs.replay.replay_table`: every baseline at its
   conf/policy defaults with the γ ceiling ``--max-gamma`` (hf-heuristic and its transient variant start at the
   ceiling, as transformers' 20 would, and cap there; the acceptance classifier fitted on the English training
   traces), the fixed γ that is best on the TRAINING traces (the reference), the PPO trained for this profile,
   the PPOs trained for the other profiles (hardware transfer: they read this profile's c and g) and, where trained,
   the PPO trained on Italian (language transfer); plus the best fixed γ in hindsight and the oracle.

Replay tok/s is on realised outcomes (see ``policies.envs.replay`` for what is exact and what is approximate).
Writes ``bench/results/replay-comparison.md`` and ``.csv``.

    python bench/replay_comparison.py --train 48 --heldout 16 --timesteps 20000
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from policies.classifier import fit_classifier, save_classifier
from policies.envs.data import TraceSet
from policies.envs.replay import replay_scores, replay_table
from policies.registry import make_policy
from policies.train import schema as train_schema
from policies.train.pipeline import train_policies
from policies.train.ppo import split_requests
from spectune import rundir
from spectune.engine.traces import record
from spectune.io import write_csv, write_text
from spectune.measure import requests_of
from spectune.profile import check_profile, load_profile
from workloads.setup import open_setup

REPO = Path(__file__).resolve().parent.parent
PROFILES = ("h200-llama3-8b-1b", "h200-llama3-8b-160m", "tiny-cpu-2core-vm")
BASELINES = ("fixed", "hf-heuristic", "hf-heuristic-transient", "confidence", "confidence-adaptive", "svip",
             "adaedl", "acceptance-classifier", "bandit")
log = logging.getLogger("bench.replay_comparison")


def config(language: str, args: argparse.Namespace, *overrides: str) -> DictConfig:
    """conf/train.yaml on the embedded pair, ``language``'s workload sized for the split."""
    train_schema.register()  # conf/'s schemas, as the entry module registers them
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=[
            f"+workload={language}", f"workload.num_prompts={args.train + args.heldout}",
            f"workload.max_new_tokens={args.max_new}", f"train.max_gamma={args.max_gamma}",
            f"train.train_prompts={args.train}", f"train.heldout_prompts={args.heldout}", *overrides])


def record_splits(language: str, args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """Trace the training and held-out splits of ``language`` (each to its own directory, with metadata)."""
    setup = open_setup(config(language, args), "trace")
    train, heldout = split_requests(requests_of(setup.workload.prompts, setup.workload.max_new_tokens), args.train,
                                    args.heldout)
    out = {}
    for split, requests in (("train", train), ("heldout", heldout)):
        if split == "heldout" and language != "en":
            continue
        frame = record(setup.engine.session(requests, None, 1, keep_laws=True), requests, args.max_gamma)
        directory = work / f"{language}-{split}"
        path = rundir.TRACES.write(directory, frame)
        rundir.TRACES_METADATA.write(directory, {**setup.metadata, "max_gamma": args.max_gamma, "concurrency": 1,
                                                 "split": split})
        log.info("traced %s %s: %d prompts, %d cycles", language, split, len(requests), frame["cycle"].nunique())
        out[split] = path
    return out


def train_ppo(traces: Path, profile: str, language: str, args: argparse.Namespace, work: Path) -> Path:
    """policies.train.pipeline.train_policies on recorded traces for one profile; returns its gamma.zip."""
    run_dir = work / f"ppo-{language}-{profile}"
    cfg = config(language, args, f"train.traces={traces}", f"train.profile={profile}",
                 "train.allow_profile_mismatch=true", f"train.timesteps={args.timesteps}",
                 f"train.eval_every={args.timesteps}")
    start = time.perf_counter()
    train_policies(cfg, run_dir)
    log.info("PPO %s on %s: %.0f s", language, profile, time.perf_counter() - start)
    return rundir.GAMMA_POLICY.path(run_dir)


def policies_for(profile: str, ppos: dict[tuple[str, str], Path], classifier: Path, gamma: int) -> dict:
    """Baselines at their conf/policy defaults (ceiling ``gamma``) and every trained PPO, read under ``profile``."""
    import yaml

    extra = {"hf-heuristic": {"max_gamma": gamma}, "hf-heuristic-transient": {"max_gamma": gamma},
             "acceptance-classifier": {"weights_path": str(classifier)}}
    out = {}
    for name in BASELINES:
        node = {**yaml.safe_load((REPO / "conf/policy" / f"{name}.yaml").read_text()), **extra.get(name, {})}
        out[f"fixed γ={gamma}" if name == "fixed" else name] = make_policy(node, gamma)
    ppo = yaml.safe_load((REPO / "conf/policy/ppo.yaml").read_text())
    for (language, trained), path in sorted(ppos.items(), key=lambda kv: (kv[0][1] != profile, kv[0])):
        label = f"ppo ({language} x {'this profile' if trained == profile else trained})"
        out[label] = make_policy({**ppo, "gamma_path": str(path), "profile": profile, "allow_profile_mismatch": True},
                                 gamma)
    return out


def where_ppo_loses(table: pd.DataFrame) -> str:
    """One sentence per PPO row: its gap to the fixed γ chosen on the training traces and who beats it."""
    rows = table.set_index("policy")
    baselines = [p for p in rows.index if not p.startswith(("ppo", "oracle", "best fixed"))]
    lines = []
    for name in (p for p in rows.index if p.startswith("ppo")):
        rate = rows.loc[name, "tok_s"]
        ahead = [f"{b} ({rows.loc[b, 'tok_s']:.1f})" for b in baselines if rows.loc[b, "tok_s"] > rate]
        lines.append(f"- {name}: {rate:.1f} tok/s, {rows.loc[name, 'vs_best_fixed_pct']:+.1f} % vs the fixed γ "
                     f"chosen on the training traces; ahead of it: {', '.join(ahead) or 'none'}.")
    return "\n".join(lines)


def markdown(frame: pd.DataFrame) -> str:
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) and abs(v) >= 10 else
                                        f"{v:.2f}" if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return (f"{os.cpu_count()}-core {platform.machine()} VM ({cpu}), torch {torch.__version__} "
            f"({torch.get_num_threads()} thread(s)), Python {platform.python_version()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=48)
    parser.add_argument("--heldout", type=int, default=16)
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--max-gamma", type=int, default=8)
    parser.add_argument("--timesteps", type=int, default=20000)
    parser.add_argument("--language-profiles", nargs="*", default=["h200-llama3-8b-1b"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: robust on a shared machine)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/replay-comparison"))
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/replay-comparison")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    started, load = time.perf_counter(), os.getloadavg()[0]
    en, it = record_splits("en", args, args.work), record_splits("it", args, args.work)
    train_traces, heldout = TraceSet.load(en["train"]), TraceSet.load(en["heldout"])
    classifier = save_classifier(fit_classifier(pd.read_parquet(en["train"])), rundir.CLASSIFIER.path(args.work))
    ppos = {("en", p): train_ppo(en["train"], p, "en", args, args.work) for p in PROFILES}
    ppos |= {("it", p): train_ppo(it["train"], p, "it", args, args.work) for p in args.language_profiles}
    sections, frames = [], []
    for name in PROFILES:
        profile = load_profile(name)
        label = check_profile(profile, {k: heldout.metadata.get(k, {}) for k in ("models", "hardware")}, True)
        chosen = replay_scores(train_traces, profile, args.max_gamma,
                                         np.zeros(train_traces.count, dtype=int))["best_fixed_gamma"]
        table = replay_table(policies_for(name, ppos, classifier, args.max_gamma), heldout, profile, args.max_gamma,
                             fixed_gamma=chosen)
        title = f"### {name}{f'  [{label}]' if label else ''}: fixed γ chosen on the training traces = {chosen}"
        print(f"\n{title}\n{markdown(table)}")
        sections.append(f"{title}\n\n{markdown(table)}\n\n{where_ppo_loses(table)}")
        frames.append(table.assign(profile=name, synthetic=label or ""))
    wall = time.perf_counter() - started
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    header = [
        "# Every policy replayed on held-out traces, three cost profiles; PPO's hardware and language transfer",
        "", f"`python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}`".replace("  ", " "), "",
        f"Date {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {commit.strip()}, {machine()}; 1-minute load "
        f"{load:.1f} at the start; the whole script took {wall:.0f} s.", "",
        f"Embedded tiny pair, T = 1, concurrency 1, max γ {args.max_gamma}. Traces: English prompts "
        f"{args.train} train / {args.heldout} held out (the workload's seeded shuffle; {train_traces.count} / "
        f"{heldout.count} recorded cycles), Italian {args.train} train. PPO: {args.timesteps} steps per policy "
        "(conf/train.yaml settings, 20 % of the training prompts for its own validation). Tok/s: replay on "
        "realised outcomes of the held-out cycles; % vs best fixed: against the fixed γ chosen on the training "
        "traces; acceptance length: 1 + mean accepted per cycle.", ""]
    write_text(args.out.with_suffix(".md"), "\n".join(header) + "\n" + "\n\n".join(sections) + "\n")
    write_csv(args.out.with_suffix(".csv"), pd.concat(frames, ignore_index=True))
    print(f"\nwrote {args.out.with_suffix('.md')} and .csv ({wall:.0f} s)")


if __name__ == "__main__":
    main()
