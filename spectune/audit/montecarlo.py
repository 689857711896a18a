"""Monte Carlo exactness audit: drive the real batched sampler and count what it emits.

The proof says the corrected law is p; the audit exists to catch *coding* errors, so it
calls :func:`spectune.sampling.rejection.get_sampler` and :func:`spectune.sampling.warp.sample` themselves, never a
re-implementation. Variants share the proposals and the acceptance uniforms (a controlled comparison:
only the recovery distribution differs), and each has its own generator for what it draws on rejection.
"""

from __future__ import annotations

import numpy as np
import torch

from spectune.audit.fit import conditional_tables
from spectune.sampling import sample
from spectune.sampling.rejection import RejectionSampler

# Rows × vocabulary per sampler call: bounds memory for large user-given vocabularies.
_CHUNK_ELEMENTS = 2_000_000


def _chunks(n: int, vocab: int) -> list[int]:
    size = max(1, min(n, _CHUNK_ELEMENTS // max(vocab, 1)))
    return [min(size, n - start) for start in range(0, n, size)]


def first_token_counts(samplers: dict[str, RejectionSampler], p: np.ndarray, q: np.ndarray, n: int,
                       seed: int) -> dict[str, np.ndarray]:
    """γ = 1 blocks: count the first emitted token (the draft if accepted, else ``next_token``).

    target_probs is [n, 2, V] (position 0 and the bonus position, both p), draft_probs [n, 1, V].
    """
    vocab = len(p)
    p_t, q_t = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    shared = torch.Generator().manual_seed(seed)
    own = {name: torch.Generator().manual_seed(seed + 1 + i) for i, name in enumerate(samplers)}
    counts = {name: np.zeros(vocab, dtype=np.int64) for name in samplers}
    for rows in _chunks(n, vocab):
        target = p_t.expand(rows, 2, vocab)
        draft = q_t.expand(rows, 1, vocab)
        draft_tokens = sample(draft[:, 0], shared).unsqueeze(1)  # x ~ q, shared by the variants
        uniforms = torch.rand((rows, 1), generator=shared, dtype=torch.float64)
        for name, sampler in samplers.items():
            verdict = sampler(target, draft, draft_tokens, generator=own[name], uniforms=uniforms)
            first = verdict.emitted(draft_tokens)[:, 0]
            counts[name] += torch.bincount(first, minlength=vocab).numpy()
    return counts


def first_pair_counts(samplers: dict[str, RejectionSampler], p: np.ndarray, q: np.ndarray, n: int,
                      seed: int) -> dict[str, np.ndarray]:
    """γ = 2 blocks: count the first two emitted tokens (index x0·V + x1).

    When the block's first draft is rejected the cycle emits one token y0; the second then comes from
    a following γ = 1 cycle from prefix y0, exactly as generation would continue.
    """
    vocab = len(p)
    p1_tab, q1_tab = (torch.as_tensor(t, dtype=torch.float64) for t in conditional_tables(p, q))
    p_t, q_t = torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)
    shared = torch.Generator().manual_seed(seed)
    own = {name: torch.Generator().manual_seed(seed + 101 + i) for i, name in enumerate(samplers)}
    counts = {name: np.zeros(vocab * vocab, dtype=np.int64) for name in samplers}
    for rows in _chunks(n, vocab * vocab):
        x0 = sample(q_t.expand(rows, vocab), shared)
        x1 = sample(q1_tab[x0], shared)
        draft_tokens = torch.stack([x0, x1], dim=1)
        target = torch.stack([p_t.expand(rows, vocab), p1_tab[x0], p_t.expand(rows, vocab)], dim=1)
        draft = torch.stack([q_t.expand(rows, vocab), q1_tab[x0]], dim=1)
        uniforms = torch.rand((rows, 2), generator=shared, dtype=torch.float64)
        for name, sampler in samplers.items():
            gen = own[name]
            verdict = sampler(target, draft, draft_tokens, generator=gen, uniforms=uniforms)
            emitted = verdict.emitted(draft_tokens)
            first, second = emitted[:, 0], emitted[:, 1].clone()
            again = verdict.num_accepted == 0  # only one token emitted: run the next cycle from y0
            if bool(again.any()):
                y0 = first[again]
                m = y0.shape[0]
                t2 = torch.stack([p1_tab[y0], p_t.expand(m, vocab)], dim=1)
                d2 = q1_tab[y0].unsqueeze(1)
                tok2 = sample(d2[:, 0], gen).unsqueeze(1)
                second[again] = sampler(t2, d2, tok2, generator=gen).emitted(tok2)[:, 0]
            counts[name] += torch.bincount(first * vocab + second, minlength=vocab * vocab).numpy()
    return counts
