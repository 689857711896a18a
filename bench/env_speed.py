"""Environment steps per second: replay (goal ≥ 20,000 on one core) and live, side by side in one run.

The replay env replays traces recorded here first (``task=trace``'s recorder on the embedded pair, so the
run needs nothing but the repository); the live env drives the engine on the same pair. Both take random
stop/continue actions (P(continue) = 0.7, seed 0) through the raw environment (no gymnasium wrappers).

    python bench/env_speed.py --replay-steps 50000 --live-steps 300
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from harness.tasks import schemas
from policies.envs.data import TraceSet
from policies.envs.gamma import DraftGammaEnv
from spectune.engine import Engine
from spectune.engine.traces import record
from spectune.measure import requests_of
from spectune.models.loading import load_pair
from spectune.profile import Profile
from spectune.sampling.rejection import get_sampler
from workloads.loader import load_workload

TINY = {"name": "tiny", "target": {"name_or_path": "spectune/models/tiny/target"},
        "draft": {"name_or_path": "spectune/models/tiny/draft"}}
GAMMA = 8
ROOT = Path(__file__).resolve().parent.parent


def pair_and_engine(models: str, temperature: float = 1.0, draft: str | None = None) -> tuple[Any, Engine]:
    """A pair of conf/models (``tiny``: the embedded one; ``draft``: another draft directory for its target) in
    float32 on the CPU and an engine on it (exact sampler, seed 1): what the engine benchmarks measure."""
    from omegaconf import OmegaConf

    from spectune.sampling import SamplingParams

    node = TINY if models == "tiny" else OmegaConf.load(ROOT / "conf" / "models" / f"{models}.yaml")
    if draft is not None:
        node = OmegaConf.merge(node, {"draft": {"name_or_path": draft}})
    pair = load_pair(node, {"dtype": "float32", "device": "cpu", "attn_implementation": "sdpa"})
    engine = Engine(pair.target, pair.draft, sampling=SamplingParams(temperature=temperature),
                    sampler=get_sampler("exact"), device="cpu", seed=1, vocab_size=pair.vocab_size)
    return pair, engine


def steps_per_second(env: DraftGammaEnv, steps: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    actions = (rng.random(steps) < 0.7).astype(int)
    env.reset(seed=seed)
    start = time.perf_counter()
    for a in actions:
        _, _, done, _, _ = env.step(a)
        if done:
            env.reset()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replay-steps", type=int, default=50000)
    parser.add_argument("--live-steps", type=int, default=300)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core
    pair = load_pair(TINY, {"dtype": "float32", "device": "cpu", "attn_implementation": "sdpa"})
    workload = load_workload(workload_cfg("en", args.prompts), pair.tokenizer)
    requests = requests_of(workload.prompts, workload.max_new_tokens)
    engine = Engine(pair.target, pair.draft, sampling=workload.sampling, sampler=get_sampler("exact"), device="cpu",
                    seed=1, vocab_size=pair.vocab_size)
    frame = record(engine.session(requests, None, 1, keep_laws=True), requests, GAMMA)
    profile = Profile("bench", [1], GAMMA + 1, {1: 0.0007}, {1: [0.0048 * (1 + 0.02 * n) for n in range(GAMMA + 1)]},
                      {1: 0.0003})
    replay = DraftGammaEnv(backend="replay", traces=TraceSet(frame, {}, "memory"), profile=profile)
    live = DraftGammaEnv(backend="live", engine=engine, requests=requests, profile=profile, max_gamma=GAMMA)
    r = steps_per_second(replay, args.replay_steps)
    lv = steps_per_second(live, args.live_steps)
    print(f"traces: {len(frame)} rows, {frame.groupby(['cycle', 'row']).ngroups} cycles at γ {GAMMA}; "
          "torch threads 1; random actions P(continue) = 0.7, seed 0")
    print(f"{'backend':<10}{'steps':>10}{'steps/s':>12}")
    print(f"{'replay':<10}{args.replay_steps:>10}{r:>12.0f}   (goal >= 20000)")
    print(f"{'live':<10}{args.live_steps:>10}{lv:>12.1f}")
    print(f"replay / live = {r / lv:.0f}x")


def workload_cfg(language: str, prompts: int):
    """The bundled workload ``language`` as Hydra composes it, cut to ``prompts`` prompts."""
    schemas.register()  # conf/'s schemas, as the entry module registers them
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent.parent / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+workload={language}", f"workload.num_prompts={prompts}"])
    return cfg.workload


if __name__ == "__main__":
    main()
