"""How well each draft signal predicts acceptance: ROC AUC of a signal for "this draft was accepted", from traces.

Every adaptive draft-length method (confidence stops, SVIP, AdaEDL, classifiers, PPO) reads signals of the draft
law q. Whether they can beat a fixed γ depends first on whether those signals carry information about acceptance
on the pair at hand: an AUC of 0.5 is chance. The score of each signal is oriented so that higher predicts
acceptance: q(x) (``token_prob``), −entropy, the top-1/top-2 ``margin`` and ``cum_prob``.

Positions counted: those the verification really tested, i.e. every earlier draft of the cycle accepted (a trace
drafts every cycle to its ``max_gamma``; the positions after the first rejection are counterfactual: no live
policy reaches them). AUC is the Mann–Whitney statistic U / (n₁·n₀) with ties counted half
(:func:`scipy.stats.mannwhitneyu`); its 95% interval is a percentile bootstrap over requests (positions of one
request are not independent), seeded.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu

# signal column -> sign that makes "higher predicts accepted"
ORIENTED: dict[str, float] = {"token_prob": 1.0, "entropy": -1.0, "margin": 1.0, "cum_prob": 1.0}


def verified_positions(traces: pd.DataFrame) -> pd.DataFrame:
    """The rows of positions the verification tested: every earlier position of the same cycle and row accepted."""
    ordered = traces.sort_values(["cycle", "row", "position"], kind="stable")
    rejected = (~ordered["accepted"].astype(bool)).astype(int)
    rejected_before = rejected.groupby([ordered["cycle"], ordered["row"]], sort=False).cumsum() - rejected
    return ordered[rejected_before == 0]


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(score of an accepted draft > score of a rejected one) + ½·P(tie); NaN without both kinds."""
    labels = labels.astype(bool)
    positives, negatives = scores[labels], scores[~labels]
    if not len(positives) or not len(negatives):
        return float("nan")
    u = mannwhitneyu(positives, negatives, alternative="two-sided").statistic
    return float(u / (len(positives) * len(negatives)))


def signal_auc(traces: pd.DataFrame, resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per signal: AUC, its request-bootstrap 95% interval, positions, accepted share, requests."""
    tested = verified_positions(traces)
    labels = tested["accepted"].to_numpy(bool)
    requests = tested["request_id"].to_numpy()
    ids, inverse = np.unique(requests, return_inverse=True)
    members = [np.flatnonzero(inverse == i) for i in range(len(ids))]
    rng = np.random.default_rng(seed)
    draws = [np.concatenate([members[i] for i in rng.integers(0, len(ids), len(ids))]) for _ in range(resamples)]
    rows = []
    for name, sign in ORIENTED.items():
        scores = sign * tested[name].to_numpy(float)
        boot = np.array([auc(scores[d], labels[d]) for d in draws]) if resamples else np.array([])
        boot = boot[np.isfinite(boot)]
        rows.append({"signal": name if sign > 0 else f"-{name}", "auc": auc(scores, labels),
                     "ci95_lo": float(np.percentile(boot, 2.5)) if len(boot) else float("nan"),
                     "ci95_hi": float(np.percentile(boot, 97.5)) if len(boot) else float("nan"),
                     "positions": len(labels), "accepted_share": float(labels.mean()) if len(labels) else
                     float("nan"), "requests": len(ids)})
    return pd.DataFrame(rows)
