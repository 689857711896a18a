"""Where a policy's decision time goes inside the engine: every protocol call timed while the models run.

``bench/policy_decisions.py`` times decisions in a tight loop, on warm caches. Inside the engine a decision runs
between forwards that have just evicted the caches, and costs several times more; this script wraps each
protocol method of one policy (``before_cycle``, ``begin_cycle``, ``continue_drafting``, ``end_drafting``,
``observe``, and any other method named with ``--also``) with ``time.perf_counter`` and runs the engine on real
prompts (T = 1, batch 1), then prints the mean µs per call and per cycle beside the engine's own ``policy_s``
and the mean cycle time.

    python bench/decisions_live.py --models smollm2 --policy ppo-cycle --param path=RUN/train/c1/cycle.zip \\
        --param allow_profile_mismatch=true --also observation choose
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from env_speed import ROOT, pair_and_engine, workload_cfg  # a sibling script (python bench/decisions_live.py)
from omegaconf import OmegaConf

from policies.registry import make_policy
from spectune.engine.records import cycles_frame
from spectune.measure import requests_of
from workloads.loader import load_workload

PROTOCOL = ("before_cycle", "begin_cycle", "continue_drafting", "end_drafting", "observe")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny", help="a pair under conf/models (tiny, smollm2, ...)")
    parser.add_argument("--policy", default="ppo", help="a file of conf/policy/")
    parser.add_argument("--param", nargs="*", default=[], help="KEY=VALUE policy parameters (YAML values)")
    parser.add_argument("--gamma", type=int, default=4, help="the ceiling")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--also", nargs="*", default=[], help="more methods of the policy to time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair, engine = pair_and_engine(args.models)
    node = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "policy" / f"{args.policy}.yaml"))
    node.update(OmegaConf.to_container(OmegaConf.from_dotlist(args.param)))
    policy = make_policy(node, args.gamma)
    times: dict[str, list[float]] = collections.defaultdict(list)
    for name in (*PROTOCOL, *args.also):
        method = getattr(policy, name, None)
        if method is None:
            continue

        def timed(*a, _method=method, _name=name, **k):
            start = time.perf_counter()
            out = _method(*a, **k)
            times[_name].append(time.perf_counter() - start)
            return out

        setattr(policy, name, timed)
    workload = load_workload(workload_cfg("en", args.prompts), pair.tokenizer)
    result = engine.run(requests_of(workload.prompts, args.max_new), policy, 1)
    cycles = cycles_frame(result.cycles)
    n = len(cycles)
    cycle_ms = 1e3 * (cycles["draft_s"] + cycles["verify_s"] + cycles["rest_s"]).mean()
    print(f"{args.models}, policy={args.policy}, γ ≤ {args.gamma}, {args.prompts} prompts × {args.max_new} tokens, "
          f"torch threads {args.threads}: {n} cycles, mean cycle {cycle_ms:.2f} ms, the engine's policy_s "
          f"{1e6 * cycles['policy_s'].mean():.0f} µs a cycle ({100 * cycles['policy_s'].mean() / cycle_ms * 1e3:.2f}%)")
    for name, values in times.items():
        print(f"  {name:<18} {len(values):5d} calls, {1e6 * sum(values) / len(values):7.1f} µs a call, "
              f"{1e6 * sum(values) / n:7.1f} µs a cycle")


if __name__ == "__main__":
    main()
