"""What a model-free proposer would give on a workload, predicted from greedy outputs before it is timed.

Greedy verification accepts a draft iff it is the target's own next greedy token, so at temperature 0 a model-free
proposer's cycles follow from the target's autoregressive output alone: :mod:`spectune.engine.proposers.replay`
gives them exactly (a test compares them with the engine's, cycle by cycle). Priced by a cost profile of the same
pair on the same machine (a target forward over n positions and the per-cycle overhead,
:class:`spectune.costmodel.profile.CycleCosts`) plus what the proposer's own search costs, they predict the decode
speed-up over autoregressive decoding. The copyable fraction (output tokens inside an n-gram that occurred earlier) says
how much of the output any lookup could have copied. Written down before the timed runs, a prediction is what the
measurement then confirms or refutes.

Seconds are summed over requests before dividing (a ratio of sums, as the benchmark's decode speed-up is); the
first output token comes with prefill on both sides and is left out of both.
"""

from __future__ import annotations

import pandas as pd

from spectune.costmodel.cycle import CycleCost


def price(frame: pd.DataFrame, costs: CycleCost, search_s: float | None = None) -> pd.DataFrame:
    """``frame`` (from :func:`spectune.engine.proposers.replay.replay`) with predicted seconds: ``ar_s`` (each decode
    token an autoregressive step) and ``spec_s`` (each cycle a verification of its drafts plus the overhead plus one
    search). ``search_s``: the seconds of one search (None: each row's own, measured while replaying, per cycle)."""
    out = frame.copy()
    out["ar_s"] = out["decode_tokens"] * float(costs.ar)
    verify = [sum(n * float(costs.verify(k)) for k, n in enumerate(hist)) for hist in out["drafts_per_cycle"]]
    per_search = (out["search_s"] / out["cycles"].clip(lower=1)) if search_s is None else search_s
    out["spec_s"] = pd.Series(verify, index=out.index) + out["cycles"] * (float(costs.overhead) + per_search)
    return out


def by_category(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (γ, category) and an ``all`` row per γ (the category rows' sums, rates recomputed from them): tokens, the
    copyable fraction, acceptance length (decode tokens per cycle), the share of cycles with no proposal, and
    where ``frame`` is priced, the predicted decode speed-up Σ ar_s / Σ spec_s."""
    sums = ["output_tokens", "decode_tokens", "copyable_tokens", "cycles", "no_proposal", "drafted", "accepted"]
    sums += [c for c in ("ar_s", "spec_s") if c in frame]
    per = frame.groupby(["gamma", "category"], sort=True)[sums].sum().reset_index()
    per["requests"] = frame.groupby(["gamma", "category"], sort=True).size().to_numpy()
    overall = per.groupby("gamma")[[*sums, "requests"]].sum().reset_index()
    overall["category"] = "all"
    table = pd.concat([per, overall], ignore_index=True)
    table["copyable_fraction"] = table["copyable_tokens"] / table["output_tokens"].clip(lower=1)
    table["acceptance_length"] = table["decode_tokens"] / table["cycles"].clip(lower=1)
    table["no_proposal_share"] = table["no_proposal"] / table["cycles"].clip(lower=1)
    table["draft_acceptance"] = table["accepted"] / table["drafted"].clip(lower=1)
    if "spec_s" in table:
        table["predicted_speedup"] = table["ar_s"] / table["spec_s"]
    rank = {c: i for i, c in enumerate([*sorted(set(frame["category"])), "all"])}
    table = table.sort_values(["gamma", "category"], key=lambda s: s.map(rank) if s.name == "category" else s)
    return table.reset_index(drop=True)
