"""Draft traces: every cycle drafted to ``max_gamma``, with every signal and the realised accept/reject.

One row per (cycle, row, draft position). Because the engine's randomness is keyed by (seed, request,
position) (``randomness.py``), a recorded cycle scores *every* γ = k ≤ max_gamma exactly for that cycle:

- realised accepted at γ = k = min(k, first position with accepted = False, minus 1) — what the live
  engine would have accepted in this cycle had it stopped at k (same drafts, same uniforms);
- expected accepted at γ = k = Σ_{i≤k} Π_{j≤i} a_j with a_j = min(1, p_j(x_j)/q_j(x_j)) — the same
  quantity averaged over the acceptance uniforms (lower variance, for training).

A model-free draft (prompt lookup, suffix decoding) drafts a row only as deep as its chain, which may end before
``max_gamma`` (or be empty: the cycle is then a plain target step). Its traces still hold ``max_gamma`` positions per
(cycle, row), and :data:`CHAIN_COLUMNS` besides: ``drafted`` (the chain reached this position) and the match signals
(:data:`~spectune.engine.policy.MATCH_SIGNALS`) as the proposer reported them. A position past the chain has
``accepted`` False and ``accept_prob`` 0 (nothing there can be accepted), so both formulas above still hold; its
q-derived signals are what the proposer reported for its placeholder.

Across cycles a replay is an approximation: a different stop changes the next context, so the context
length, recent acceptance and batch composition of the next cycle come from the recording.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from spectune.engine.policy import DRAFT_SIGNALS, MATCH_SIGNALS, AcceptanceHistory
from spectune.engine.records import Request
from spectune.engine.session import CycleOutcome, Session

TRACE_COLUMNS: dict[str, str] = {
    "cycle": "int", "row": "int", "request_id": "int", "prompt_id": "str", "language": "str",
    "batch_size": "int", "position": "int", "context_length": "int", "output_position": "int",
    "token_prob": "float", "entropy": "float", "margin": "float", "cum_prob": "float",
    "accept_prob": "float", "accepted": "bool", "recent_acceptance": "float",
    "draft_s": "float", "verify_s": "float", "max_gamma": "int",
}
# What a model-free draft's traces add (its proposer reports the match signals): where its chain reached, and its match.
CHAIN_COLUMNS: dict[str, str] = {"drafted": "bool", **{name: "float" for name in MATCH_SIGNALS}}


def trace_columns(session: Session) -> dict[str, str]:
    """The columns of ``session``'s traces: :data:`TRACE_COLUMNS`, and :data:`CHAIN_COLUMNS` where its proposer
    reports the match signals."""
    reports = session.proposer.reports
    return {**TRACE_COLUMNS, **CHAIN_COLUMNS} if set(MATCH_SIGNALS) <= reports else dict(TRACE_COLUMNS)


def realised_accepted(accepted: np.ndarray, k: int | np.ndarray) -> np.ndarray:
    """Accepted drafts at γ ``k`` from the per-position outcomes ``accepted [..., D]`` (bool)."""
    leading = np.cumprod(np.asarray(accepted, dtype=bool), axis=-1).sum(-1)
    return np.minimum(leading, k)


def expected_accepted(accept_prob: np.ndarray, k: int) -> np.ndarray:
    """E[accepted | γ = k] = Σ_{i≤k} Π_{j≤i} a_j over the last axis of ``accept_prob [..., D]``."""
    return np.cumprod(np.asarray(accept_prob, dtype=float)[..., :k], axis=-1).sum(-1)


def verdicts(outcome: CycleOutcome, depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """([B, depth] accept_prob, accepted, drafted) of a cycle drafted ``depth`` steps: a_j = min(1, p_j/q_j) and the
    sampler's own comparison at every position a row drafted, 0 and False past its drafts (a model-free chain that
    ended, or a cycle that verified nothing)."""
    batch = len(outcome.num_drafts)
    drafted = torch.arange(depth)[None, :] < torch.tensor(outcome.num_drafts, dtype=torch.long)[:, None]
    accept_prob = torch.zeros(batch, depth, dtype=torch.float64)
    accepted = torch.zeros(batch, depth, dtype=torch.bool)
    verified = outcome.proposal.tokens.shape[1] if outcome.proposal is not None else 0
    if verified:
        x = outcome.proposal.tokens.unsqueeze(-1)
        p_x = outcome.target_laws[:, :verified].gather(-1, x).squeeze(-1).double()
        q_x = outcome.proposal.probs.gather(-1, x).squeeze(-1).double()
        ratio = torch.where(q_x > 0, (p_x / q_x.clamp(min=1e-300)).clamp(max=1.0), torch.ones_like(q_x))
        mine = drafted[:, :verified]
        accept_prob[:, :verified] = torch.where(mine, ratio, torch.zeros_like(ratio))
        accepted[:, :verified] = mine & (outcome.accept_uniforms * q_x < p_x)  # the sampler's own comparison
    return accept_prob, accepted, drafted


def cycle_rows(outcome: CycleOutcome, signals: dict[str, torch.Tensor], requests: dict[int, Request],
               recent: AcceptanceHistory, max_gamma: int) -> dict[str, np.ndarray]:
    """The trace rows of one recorded cycle (columnar), from its outcome and the per-step signals [B, D] (D: the
    draft steps taken, ``max_gamma``); the match signals among them become columns with ``drafted``."""
    rows = np.asarray(outcome.rows)
    gamma = len(outcome.draft_step_s)
    accept_prob, accepted, drafted = verdicts(outcome, gamma)
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
    if set(MATCH_SIGNALS) <= signals.keys():
        out["drafted"] = grid(drafted)
        for name in MATCH_SIGNALS:
            out[name] = grid(signals[name])
    return out


def record(session: Session, requests: list[Request], max_gamma: int) -> pd.DataFrame:
    """Run ``session`` (opened with ``keep_laws=True``) to the end, drafting ``max_gamma`` every cycle (a model-free
    draft: as deep as each row's chain, at most that); the columns are :func:`trace_columns`'."""
    assert session.keep_laws and session.speculative
    by_id = {r.request_id: r for r in requests}
    recent = AcceptanceHistory()  # per request
    chunks: list[dict[str, np.ndarray]] = []
    columns = trace_columns(session)
    names = [name for name in (*DRAFT_SIGNALS, *MATCH_SIGNALS) if name in columns]
    wanted = frozenset(names)
    while not session.done:
        if not session.begin_cycle():
            continue
        steps = [session.draft_step(wanted) for _ in range(max_gamma)]
        outcome = session.verify()
        signals = {name: torch.stack([s[name] for s in steps], 1) for name in names}
        chunks.append(cycle_rows(outcome, signals, by_id, recent, max_gamma))
        for row in outcome.rows:
            recent.add(outcome.request_ids[row], outcome.accepted[row], outcome.num_drafts[row])
    if not chunks:
        return pd.DataFrame({name: pd.Series(dtype=kind if kind != "str" else object)
                             for name, kind in columns.items()})
    frame = pd.DataFrame({name: np.concatenate([c[name] for c in chunks]) for name in columns})
    return frame.astype({name: kind if kind != "str" else object for name, kind in columns.items()})
