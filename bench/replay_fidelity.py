"""Does the replay predict the live engine? Tokens/s predicted from traces + a profile vs measured, side by side.

In one run on the embedded pair: traces are recorded at γ 8 for each concurrency; in each repeat a
profile is measured (``task=profile``'s measurement through the engine's session) right before the live
runs it predicts, and for fixed γ ∈ {1, 2, 4, 8} and the confidence stop (q(x) < 0.4, ceiling 8) the replay
predicts decode throughput from the traces and that profile:

    Σ_cycles Σ_rows (accepted at the policy's γ + 1) / Σ_cycles (γ·t_draft(b) + t_verify(b, γ+1) + o(b))

(γ = the deepest row's at batch b: verification is padded). The live engine then runs the same prompts
with that policy; printed over ``--repeats``: live decode tokens/s (tokens of the cycles over their
synchronised time), live end-to-end tokens/s (including prefill and admission, which a per-cycle profile
does not hold), and the ratio live/replay with a 95% t-interval over repeats.

    python bench/replay_fidelity.py --prompts 4 --max-new 24 --repeats 3
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from env_speed import TINY, workload_cfg  # a sibling script (run as python bench/replay_fidelity.py)
from scipy import stats

from policies.confidence import ConfidenceStop
from policies.envs.data import TraceSet
from policies.envs.replay import replay_gammas
from spectune.engine import Engine
from spectune.engine.policy import DraftLengthPolicy, FixedGamma
from spectune.engine.records import cycles_frame, requests_frame, summarise
from spectune.engine.traces import record
from spectune.measure import requests_of
from spectune.measure.profiling import measure_costs
from spectune.models.loading import load_pair
from spectune.profile import Profile
from spectune.sampling.rejection import get_sampler
from workloads.loader import load_workload

GAMMA = 8
THRESHOLD = 0.4


def policy_of(method: str) -> DraftLengthPolicy:
    """``method``'s policy: the confidence stop at the ceiling GAMMA, or fixed γ = k for "gamma=k"."""
    return ConfidenceStop(GAMMA, THRESHOLD) if method == "confidence" else FixedGamma(int(method.split("=")[1]))


def predicted(traces: TraceSet, profile: Profile, method: str) -> float:
    """Replay's decode tokens/s for ``method`` from traces at γ = GAMMA: each row's γ as the replay drives the
    policy (:func:`policies.envs.replay.replay_gammas`: the engine's drafting loop over the recorded cycles), each
    cycle charged once at its deepest row (verification is padded)."""
    gammas = replay_gammas(policy_of(method), traces, GAMMA, profile)
    tokens = float((np.minimum(gammas, traces.leading) + 1).sum())
    time_s = 0.0
    for cycle in traces.cycle_slices:
        time_s += profile.cycle_s(int(gammas[cycle].max()), cycle.stop - cycle.start)
    return tokens / time_s


def live(engine: Engine, requests: list, method: str, concurrency: int) -> tuple[float, float]:
    """(decode tokens/s over the cycles' synchronised time, end-to-end output tokens/s)."""
    result = engine.run(requests, policy_of(method), concurrency)
    cyc = cycles_frame(result.cycles)
    per_cycle = cyc.groupby("cycle").agg(emitted=("emitted", "sum"), draft_s=("draft_s", "first"),
                                         verify_s=("verify_s", "first"), rest_s=("rest_s", "first"))
    decode = per_cycle["emitted"].sum() / (per_cycle[["draft_s", "verify_s", "rest_s"]].sum().sum())
    return float(decode), float(summarise(requests_frame(result.requests), cyc)["output_throughput"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(TINY, {"dtype": "float32", "device": "cpu", "attn_implementation": "sdpa"})
    workload = load_workload(workload_cfg("en", args.prompts), pair.tokenizer)
    requests = requests_of(workload.prompts, workload.max_new_tokens)
    for r in requests:
        r.max_new_tokens = args.max_new
    engine = Engine(pair.target, pair.draft, sampling=workload.sampling, sampler=get_sampler("exact"), device="cpu",
                    seed=1, vocab_size=pair.vocab_size)
    eos = pair.tokenizer.eos_token_id
    sizes = sorted(set(args.concurrency))
    long = [type(r)(i, r.prompt_id, r.language, r.input_ids, 6 * (GAMMA + 1) + 1)  # profile rows: never end early
            for i, r in enumerate(requests[i % len(requests)] for i in range(max(sizes)))]

    def measured_profile(c: int) -> Profile:
        """Costs at batch 1 and c (interpolated between), measured now: the machine's speed drifts."""
        engine.eos = set()
        sizes_c = sorted({1, c})
        draft, verify, overhead, first, _ = measure_costs(engine, long, sizes_c, GAMMA, 1, 3)
        engine.eos = {eos} if eos is not None else set()
        return Profile("fidelity", sizes_c, GAMMA + 1, draft, verify, overhead, t_first_draft_s=first)

    methods = [f"gamma={g}" for g in (1, 2, 4, 8)] + ["confidence"]
    print(f"embedded pair, en, {len(requests)} prompts x {args.max_new} new tokens, T = "
          f"{workload.sampling.temperature}, torch threads {args.threads}, {args.repeats} repeats; in each repeat a "
          "profile is measured (batch 1 and the concurrency, means of 3 cycles per (batch, n)) right before the live "
          "runs it predicts")
    print(f"{'conc':>4} {'method':<11}{'replay':>9}{'live dec':>10}{'ratio':>7}{'95% CI':>16}{'live e2e':>10}"
          f"{'e2e/replay':>11}")
    for c in sizes:
        traces = TraceSet(record(engine.session(requests, None, c, keep_laws=True), requests, GAMMA),
                          {"concurrency": c}, f"traces at concurrency {c}")
        cells: dict[str, list[tuple[float, float, float]]] = {m: [] for m in methods}
        for _ in range(args.repeats):
            profile = measured_profile(c)
            for method in methods:
                decode, e2e = live(engine, requests, method, c)
                cells[method].append((predicted(traces, profile, method), decode, e2e))
        for method in methods:
            pred, decode, e2e = (np.array(x) for x in zip(*cells[method], strict=True))
            ratios = decode / pred
            half = (stats.t.ppf(0.975, len(ratios) - 1) * ratios.std(ddof=1) / np.sqrt(len(ratios))
                    if len(ratios) > 1 else float("nan"))
            print(f"{c:>4} {method:<11}{np.median(pred):>9.1f}{np.median(decode):>10.1f}"
                  f"{ratios.mean():>7.3f}  [{ratios.mean() - half:.3f}, {ratios.mean() + half:.3f}]"
                  f"{np.median(e2e):>10.1f}{np.mean(e2e / pred):>11.3f}")

if __name__ == "__main__":
    main()
