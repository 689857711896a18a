"""Draft traces: every cycle drafted to ``max_gamma``, with every signal and the realised accept/reject.

One row per (cycle, row, draft position). Because the engine's randomness is keyed by (seed, request,
position) (``randomness.py``), a recorded cycle scores *every* γ = k ≤ max_gamma exactly for that cycle:

- realised accepted at γ = k = min(k, first position with accepted = False, minus 1) — what the live
  engine would have accepted in this cycle had it stopped at k (same drafts, same uniforms);
- expected accepted at γ = k = Σ_{i≤k} Π_{j≤i} a_j with a_j = min(1, p_j(x_j)/q_j(x_j)) — the same
  quantity averaged over the acceptance uniforms (lower variance, for training).

Across cycles a replay is an approximation: a different stop changes the next context, so the context
length, recent acceptance and batch composition of the next cycle come from the recording.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from spectune.engine.policy import DRAFT_SIGNALS, AcceptanceHistory
from spectune.engine.records import Request
from spectune.engine.session import CycleOutcome, Session

TRACE_COLUMNS: dict[str, str] = {
    "cycle": "int", "row": "int", "request_id": "int", "prompt_id": "str", "language": "str",
    "batch_size": "int", "position": "int", "context_length": "int", "output_position": "int",
    "token_prob": "float", "entropy": "float", "margin": "float", "cum_prob": "float",
    "accept_prob": "float", "accepted": "bool", "recent_acceptance": "float",
    "draft_s": "float", "verify_s": "float", "max_gamma": "int",
}


def realised_accepted(accepted: np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """Accepted drafts at γ ``k`` from the per-position outcomes ``accepted [..., D]`` (bool)."""
    leading = np.cumprod(np.asarray(accepted, dtype=bool), axis=-1).sum(-1)
    return np.minimum(leading, k)


def expected_accepted(accept_prob: np.ndarray, k: int) -> np.ndarray:
    """E[accepted | γ = k] = Σ_{i≤k} Π_{j≤i} a_j over the last axis of ``accept_prob [..., D]``."""
    return np.cumprod(np.asarray(accept_prob, dtype=float)[..., :k], axis=-1).sum(-1)


def cycle_rows(outcome: CycleOutcome, signals: dict[str, torch.Tensor], requests: dict[int, Request],
               recent: AcceptanceHistory, max_gamma: int) -> dict[str, np.ndarray]:
    """The trace rows of one recorded cycle (columnar), from its outcome and the per-step signals [B, D]."""
    rows = np.asarray(outcome.rows)
    gamma = outcome.proposal.tokens.shape[1]
    x = outcome.proposal.tokens.unsqueeze(-1)
    p_x = outcome.target_laws[:, :gamma].gather(-1, x).squeeze(-1).double()
    q_x = outcome.proposal.probs.gather(-1, x).squeeze(-1).double()
    accept_prob = torch.where(q_x > 0, (p_x / q_x.clamp(min=1e-300)).clamp(max=1.0), torch.ones_like(q_x))
    accepted = outcome.accept_uniforms * q_x < p_x  # the sampler's own comparison, at every position
    n = len(rows) * gamma

    def per_row(values) -> np.ndarray:
        return np.repeat(np.asarray(values)[rows], gamma)

    def grid(tensor: torch.Tensor) -> np.ndarray:
        return tensor[torch.as_tensor(rows)].reshape(-1).double().numpy() if tensor.dtype != torch.bool \
            else tensor[torch.as_tensor(rows)].reshape(-1).numpy()

    ids = [outcome.request_ids[r] for r in outcome.rows]
    out: dict[str, np.ndarray] = {
        "cycle": np.full(n, outcome.cycle), "row": np.repeat(rows, gamma),
        "request_id": np.repeat(ids, gamma),
        "prompt_id": np.repeat([requests[i].prompt_id for i in ids], gamma),
        "language": np.repeat([requests[i].language for i in ids], gamma),
        "batch_size": np.full(n, len(rows)), "position": np.tile(np.arange(1, gamma + 1), len(rows)),
        "context_length": per_row(outcome.context_length), "output_position": per_row(outcome.output_position),
    }
    for name in DRAFT_SIGNALS:
        out[name] = grid(signals[name])
    out.update(accept_prob=grid(accept_prob), accepted=grid(accepted),
               recent_acceptance=np.repeat([recent.rate(i) for i in ids], gamma),
               draft_s=np.tile(np.asarray(outcome.draft_step_s, dtype=float), len(rows)),
               verify_s=np.full(n, outcome.verify_s), max_gamma=np.full(n, max_gamma))
    return out


def record(session: Session, requests: list[Request], max_gamma: int) -> pd.DataFrame:
    """Run ``session`` (opened with ``keep_laws=True``) to the end, drafting ``max_gamma`` every cycle."""
    assert session.keep_laws and session.speculative
    by_id = {r.request_id: r for r in requests}
    recent = AcceptanceHistory()  # per request
    chunks: list[dict[str, np.ndarray]] = []
    wanted = frozenset(DRAFT_SIGNALS)
    while not session.done:
        if not session.begin_cycle():
            continue
        steps = [session.draft_step(wanted) for _ in range(max_gamma)]
        outcome = session.verify()
        signals = {name: torch.stack([s[name] for s in steps], 1) for name in DRAFT_SIGNALS}
        chunks.append(cycle_rows(outcome, signals, by_id, recent, max_gamma))
        for row in outcome.rows:
            recent.add(outcome.request_ids[row], outcome.accepted[row], outcome.num_drafts[row])
    if not chunks:
        return pd.DataFrame({name: pd.Series(dtype=kind if kind != "str" else object)
                             for name, kind in TRACE_COLUMNS.items()})
    frame = pd.DataFrame({name: np.concatenate([c[name] for c in chunks]) for name in TRACE_COLUMNS})
    return frame.astype({name: kind if kind != "str" else object for name, kind in TRACE_COLUMNS.items()})
