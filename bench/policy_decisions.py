"""How long each γ policy takes to decide, next to what a cycle of the embedded pair costs, in one run.

For batch sizes 1 and 4: the engine runs fixed γ = 4 on real prompts (T = 1) to measure the mean draft step and
the mean cycle; then every policy decides a cycle's worth on real draft signals (begin_cycle, then the engine's
drafting loop: continue_drafting after steps 1..γ-1 and end_drafting on the last, observe), repeated, timed with
perf_counter. For the PPO policy the batched actor call is set beside stable-baselines3's own ``predict`` called
once per row (what a naive integration would do).

    python bench/policy_decisions.py --repeats 300

Writes bench/results/policy-decisions-<host>-<date>.json and prints a table (median µs per cycle, % of the
median cycle).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import socket
import tempfile
import time
from pathlib import Path

import gymnasium
import numpy as np
import torch
from hydra import compose, initialize_config_dir

from harness.tasks import schemas
from policies.classifier import AcceptanceModel, save_classifier
from policies.ppo import DEFAULT_OBSERVATION, observation_low_high
from policies.registry import make_policy
from policies.sb3_files import annotate_policy_file
from spectune import hardware as hw
from spectune import rundir
from spectune.engine import Engine, Request
from spectune.engine.policy import DRAFT_SIGNALS, CycleFeedback, DraftStep, FixedGamma, draft_cycle, draft_signals
from spectune.io import write_json
from spectune.metadata import base_metadata
from spectune.models.loading import load_pair
from spectune.sampling import SamplingParams, warp
from spectune.sampling.rejection import get_sampler
from workloads.loader import load_workload

CONF = Path(__file__).resolve().parent.parent / "conf"
GAMMA = 4
log = logging.getLogger("policy_decisions")


def _ppo_file(directory: Path, profile: Path) -> tuple[Path, object]:
    """A real SB3 PPO file on the default γ observation (random weights, SB3's default [64, 64] MLP)."""
    from stable_baselines3 import PPO

    low, high = observation_low_high(DEFAULT_OBSERVATION)
    env = gymnasium.make("CartPole-v1")  # replaced below: only the spaces matter for timing
    env.observation_space = gymnasium.spaces.Box(low, high, dtype=np.float32)
    model = PPO("MlpPolicy", env, seed=0, device="cpu")
    path = rundir.GAMMA_POLICY.found(directory)
    model.save(path)
    annotate_policy_file(path, {"observation": list(DEFAULT_OBSERVATION), "actions": ["stop", "continue"]})
    return path, model


def _profile(directory: Path, draft_s: float, verify_s: float) -> Path:
    t_verify = [verify_s * (1 + 0.1 * n) for n in range(GAMMA + 1)]
    return rundir.PROFILE.write(directory, {
        "kind": "spectune-profile", "version": 1, "label": "bench", "synthetic": True, "models": {},
        "hardware": {}, "batch_sizes": [1, 4], "max_positions": GAMMA + 1,
        "t_draft_s": {"1": draft_s, "4": draft_s}, "t_verify_s": {"1": t_verify, "4": t_verify},
        "overhead_s": {"1": 0.0, "4": 0.0}})


def _steps(pair, prompts: list[list[int]], batch: int, sampling: SamplingParams) -> list[DraftStep]:
    """Real draft signals: the draft's laws after each prompt, extended by its own samples, GAMMA steps."""
    rows = [list(p) for p in prompts[:batch]]
    steps, cum = [], None
    generator = torch.Generator().manual_seed(0)
    for step in range(GAMMA):
        width = max(len(r) for r in rows)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        with torch.no_grad():
            logits = pair.draft(input_ids=ids, attention_mask=mask).logits[:, -1, : pair.vocab_size].float()
        q = warp(logits, sampling)
        x = torch.multinomial(q, 1, generator=generator).squeeze(1)
        signals = draft_signals(q, x, frozenset(DRAFT_SIGNALS), cum)
        cum = signals["cum_prob"]
        steps.append(DraftStep(step=step, active=torch.ones(batch, dtype=torch.bool),
                               context_length=torch.tensor([len(p) for p in prompts[:batch]]), batch_size=batch,
                               **signals))
        rows = [[*r, int(t)] for r, t in zip(rows, x.tolist(), strict=True)]
    return steps


class _Shown:
    """The prepared draft steps as :func:`~spectune.engine.policy.draft_cycle` drives them: each draft shows the next
    one, and no row is stopped or cut (the steps are data, so every policy decides a whole cycle's worth)."""

    def __init__(self, steps: list[DraftStep]) -> None:
        self.steps, self.drafted = steps, 0

    def draft(self, signals: frozenset[str]) -> DraftStep:
        self.drafted += 1
        return self.steps[self.drafted - 1]

    def stop(self, keep: torch.Tensor) -> bool:
        return True

    def cut(self, kept: list[int]) -> None:
        pass


def _decide(policy, steps: list[DraftStep], batch: int, repeats: int) -> float:
    """Median seconds per cycle of decisions: begin_cycle, the engine's drafting loop over the steps
    (:func:`~spectune.engine.policy.draft_cycle`: continue_drafting after steps 0..γ-2, end_drafting on the last for
    a policy that reads it), observe (the median, because on a shared machine a few cycles catch another process's
    burst)."""
    feedback = CycleFeedback([GAMMA] * batch, [1] * batch, 1e-3, 2e-3, 3.5e-3, rows=list(range(batch)),
                             request_ids=list(range(batch)))  # per-row policies need each row's slot and request
    policy.reset()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        policy.begin_cycle(batch)
        draft_cycle(policy, len(steps), _Shown(steps))
        policy.observe(feedback)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="en")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    schemas.register()  # conf/'s schemas, as the entry module registers them
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"+workload={args.workload}", "workload.num_prompts=8",
                                           "workload.max_new_tokens=32"])
    device = hw.setup(cfg.hardware)
    pair = load_pair(cfg.models, cfg.hardware)
    workload = load_workload(cfg.workload, pair.tokenizer)
    prompts = [p.input_ids for p in workload.prompts]
    sampling = SamplingParams(temperature=1.0)
    engine = Engine(pair.target, pair.draft, sampling=sampling, sampler=get_sampler("exact"), device=device,
                    vocab_size=pair.vocab_size, eos_token_ids=[], seed=0)
    tmp = Path(tempfile.mkdtemp())
    classifier = AcceptanceModel(["token_prob", "entropy", "margin", "cum_prob", "position", "context_length"], [16])
    classifier_path = save_classifier(classifier, rundir.CLASSIFIER.path(tmp))
    rows = []
    for batch in (1, 4):
        requests = [Request(i, f"p{i}", "en", ids, 32) for i, ids in enumerate(prompts)]
        engine.run(requests[:2], FixedGamma(GAMMA), batch)  # warm-up
        cycles = engine.run(requests, FixedGamma(GAMMA), batch).cycles
        seen = {c.cycle: c for c in cycles}.values()
        draft_step_s = float(np.median([c.draft_s / c.gamma for c in seen]))
        cycle_s = float(np.median([c.draft_s + c.verify_s + c.rest_s for c in seen]))
        verify_s = float(np.median([c.verify_s for c in seen]))
        profile = _profile(tmp, draft_step_s, verify_s)
        ppo_path, sb3_model = _ppo_file(tmp, profile)
        steps = _steps(pair, prompts, batch, sampling)
        nodes = {
            "hf-heuristic": {"name": "hf-heuristic", "max_gamma": 32},
            "hf-heuristic-transient": {"name": "hf-heuristic-transient", "max_gamma": 32},
            "confidence": {"name": "confidence", "threshold": 0.4},
            "confidence-adaptive": {"name": "confidence-adaptive", "threshold": 0.4, "fn_weight": 3.0,
                                    "min_samples": 5, "scope": "request"},
            "svip": {"name": "svip", "h": 10.0},
            "adaedl": {"name": "adaedl", "c_e": 0.01, "lam": 0.0, "epsilon": 0.01, "beta": 0.9, "lam_min": 0.0,
                       "lam_max": 0.95},
            "acceptance-classifier": {"name": "acceptance-classifier", "weights_path": str(classifier_path),
                                      "threshold": 0.99},
            "bandit": {"name": "bandit", "min_gamma": 0, "exploration": 1.0},
            "ppo": {"name": "ppo", "gamma_path": str(ppo_path), "trust_pickle": False, "profile": str(profile),
                    "allow_profile_mismatch": False, "deterministic": True, "seed": 0},
        }
        for name, node in nodes.items():
            seconds = _decide(make_policy(node, GAMMA), steps, batch, args.repeats)
            rows.append({"batch": batch, "policy": name, "decision_us_per_cycle": seconds * 1e6,
                         "pct_of_cycle": 100 * seconds / cycle_s, "draft_step_ms": draft_step_s * 1e3,
                         "cycle_ms": cycle_s * 1e3})
        ppo = make_policy(nodes["ppo"], GAMMA)
        obs = [ppo.observation(step) for step in steps[:-1]]
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for o in obs:
                for row in range(batch):
                    sb3_model.predict(o[row], deterministic=True)
            times.append(time.perf_counter() - start)
        seconds = float(np.median(times))
        rows.append({"batch": batch, "policy": "ppo via SB3 predict per row", "decision_us_per_cycle": seconds * 1e6,
                     "pct_of_cycle": 100 * seconds / cycle_s, "draft_step_ms": draft_step_s * 1e3,
                     "cycle_ms": cycle_s * 1e3})
    log.info("%-28s %5s %12s %9s %9s", "policy", "batch", "µs/cycle", "% cycle", "cycle ms")
    for row in rows:
        log.info("%-28s %5d %12.1f %9.2f %9.2f", row["policy"], row["batch"], row["decision_us_per_cycle"],
                 row["pct_of_cycle"], row["cycle_ms"])
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M")
    out = write_json(Path(args.out) / f"policy-decisions-{socket.gethostname()[:12]}-{stamp}.json", {
        "command": f"python bench/policy_decisions.py --repeats {args.repeats}", "gamma": GAMMA, "rows": rows,
        "models": pair.metadata, "hardware": hw.describe(cfg.hardware, device), "metadata": base_metadata()})
    log.info("wrote %s", out)


if __name__ == "__main__":
    main()
