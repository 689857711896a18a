"""Where does a verification budget pay? Static budgets of spectune/VerifySize-v0 against plain fixed γ.

From traces recorded at concurrency B and γ D (``task=trace task.concurrency=4``), every recorded cycle is
scored in replay (deterministically, all cycles, no sampling) under each cost profile:

- ``gamma d``: draft d tokens on every row and verify them all (time d·t_draft + t_verify(d+1) + overhead);
- ``budget f``: draft D on every row, then verify only the fraction f of the batch's B·D drafted tokens with
  the highest cumulative draft probability (each row keeps a prefix; verification padded to the longest kept
  prefix), as the environment charges it;
- ``per-cycle best budget``: the hindsight best level per cycle (a bound, not a policy).

Tokens per cycle = Σ_rows min(kept, first rejection) + B. Throughput = Σ tokens / Σ time over all cycles.

    python -m harness task=trace +workload=en task.concurrency=4 task.max_gamma=8 hydra.run.dir=/tmp/vb
    python bench/verify_budget.py /tmp/vb/traces.parquet --profiles tiny-cpu-2core-vm h200-llama3-8b-1b
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.envs.data import TraceSet
from spectune.profile import load_profile

LEVELS = (0.25, 0.5, 0.75, 1.0)


def score(traces: TraceSet, profile, levels=LEVELS) -> list[tuple[str, float, float]]:
    """(method, tokens/s, tokens per cycle) for fixed γ, static budgets and the per-cycle best budget."""
    gamma = traces.max_gamma
    rows: dict[str, list[float]] = {}
    best_tokens = best_time = 0.0
    for piece in traces.cycle_slices:
        batch = piece.stop - piece.start
        leading = traces.leading[piece]
        cum = traces.signals[piece, :gamma, 3]
        costs = profile.costs(batch)
        for d in range(0, gamma + 1):
            tokens = float(np.minimum(leading, d).sum() + batch)
            time_s = costs.cycle_s(d)
            acc = rows.setdefault(f"gamma {d}", [0.0, 0.0])
            acc[0] += tokens
            acc[1] += time_s
        order = np.argsort(-cum.ravel(), kind="stable")
        cycle_best = (0.0, 1.0)
        for level in np.linspace(0, 1, 17):
            keep = np.zeros(batch * gamma, dtype=bool)
            keep[order[: round(level * batch * gamma)]] = True
            kept = keep.reshape(batch, gamma).sum(1)
            tokens = float(np.minimum(kept, leading).sum() + batch)
            time_s = costs.cycle_s(gamma, int(kept.max()))
            if tokens / time_s > cycle_best[0] / cycle_best[1]:
                cycle_best = (tokens, time_s)
            if any(abs(level - f) < 1e-9 for f in levels):
                acc = rows.setdefault(f"budget {level:.2f} of D={gamma}", [0.0, 0.0])
                acc[0] += tokens
                acc[1] += time_s
        best_tokens += cycle_best[0]
        best_time += cycle_best[1]
    rows["per-cycle best budget (bound)"] = [best_tokens, best_time]
    cycles = len(traces.cycle_slices)
    return [(name, tok / t, tok / cycles) for name, (tok, t) in rows.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path)
    parser.add_argument("--profiles", nargs="+", default=["tiny-cpu-2core-vm", "h200-llama3-8b-1b"])
    args = parser.parse_args()
    traces = TraceSet.load(args.traces)
    batches = sorted(set(traces.batch_size.tolist()))
    print(f"traces {args.traces}: {len(traces.cycle_slices)} cycles, γ {traces.max_gamma}, batch sizes {batches}")
    for name in args.profiles:
        profile = load_profile(name)
        results = score(traces, profile)
        best_gamma = max((r for r in results if r[0].startswith("gamma")), key=lambda r: r[1])
        print(f"\nprofile {name}: best fixed γ {best_gamma[0]} at {best_gamma[1]:.1f} tok/s")
        print(f"{'method':36s} {'tok/s':>10s} {'vs best gamma':>14s} {'tokens/cycle':>13s}")
        for method, rate, per_cycle in results:
            print(f"{method:36s} {rate:10.1f} {rate / best_gamma[1]:13.3f}x {per_cycle:13.2f}")


if __name__ == "__main__":
    main()
