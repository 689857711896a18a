"""What reading the draft's signals costs inside the engine: every call of the signal computation timed while the
models run, for a policy that reads all four signals and never stops (fixed γ), at each number of rows.

A policy that decides after every draft step reads the draft law's signals (q(x), entropy, top-2 margin,
cumulative q); the engine computes them in the draft step, so their cost is part of c for that policy. This
script wraps :func:`spectune.engine.policy.draft_signals` as the proposer calls it and prints the median µs a call
and the mean draft step beside it. Run each tree on its own ``PYTHONPATH`` to compare two versions.

    python bench/signal_cost.py --models smollm2 --rows 1 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from env_speed import pair_and_engine, workload_cfg  # a sibling script (python bench/signal_cost.py)

import spectune.engine.model_proposer as proposer
from spectune.engine.policy import DRAFT_SIGNALS, DraftLengthPolicy, DraftStep
from spectune.engine.records import cycles_frame
from spectune.measure import requests_of
from workloads.loader import load_workload


class ReadAll(DraftLengthPolicy):
    """γ every cycle, every draft signal read after every step, no row ever stopped."""

    name = "read-all"
    signals = frozenset(DRAFT_SIGNALS)

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma

    def begin_cycle(self, batch_size: int) -> int:
        return self.gamma

    def continue_drafting(self, step: DraftStep) -> torch.Tensor:
        return torch.ones_like(step.active)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="smollm2", help="a pair under conf/models (tiny, smollm2, ...)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8], help="concurrency levels")
    parser.add_argument("--gamma", type=int, default=2)
    parser.add_argument("--max-new", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    calls: list[float] = []
    original = proposer.draft_signals

    def timed(*a, **k):
        start = time.perf_counter()
        out = original(*a, **k)
        calls.append(time.perf_counter() - start)
        return out

    proposer.draft_signals = timed
    pair, engine = pair_and_engine(args.models)
    workload = load_workload(workload_cfg("en", 16), pair.tokenizer)
    print(f"{args.models}, γ = {args.gamma}, every signal read, en prompts × {args.max_new} tokens, torch threads "
          f"{args.threads}; harness from {proposer.__file__}")
    for rows in args.rows:
        requests = requests_of(workload.prompts[: max(4, 2 * rows)], args.max_new)
        engine.run(requests[:rows], ReadAll(args.gamma), rows)  # warm-up
        calls.clear()
        result = engine.run(requests, ReadAll(args.gamma), rows)
        cycles = cycles_frame(result.cycles).groupby("cycle").first()
        spec = cycles[cycles["num_drafts"] > 0]
        step_ms = 1e3 * float((spec["draft_s"] / spec["gamma"]).mean())
        print(f"rows {rows}: {len(calls)} signal calls, median {1e6 * statistics.median(calls):.0f} µs a call; "
              f"{len(spec)} cycles, mean draft step {step_ms:.2f} ms (signals included)")


if __name__ == "__main__":
    main()
