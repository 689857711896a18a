"""SlotKV must give exactly the logits of a plain full-sequence forward, through ragged rollback,
compaction and slot refill (float64, tolerance 1e-10; eager attention 1e-6, below)."""

from __future__ import annotations

import pytest
import torch

from spectune.engine.kv import SlotKV, attention_mask
from spectune.engine.kv import prefill_slots as _prefill
from spectune.engine.static_kv import StaticSlotKV
from tests.tiny_models import tiny_llama

TOL = 1e-10
# transformers' eager attention takes its softmax in float32 even for float64 models: a padded row and the
# unpadded full forward then round differently by ~1e-8, depending on the CPU's vector width (AVX2 against
# AVX-512). A wrong position, mask or cache row moves the logits by > 1e-2, far above this.
EAGER_TOL = 1e-6


def _full(model, seq: torch.Tensor) -> torch.Tensor:
    return model(seq.unsqueeze(0)).logits[0]


def _prefilled(model, seqs: list[torch.Tensor]) -> SlotKV:
    kv = SlotKV(len(seqs), "cpu")
    for row, seq in enumerate(seqs):
        single = SlotKV(1, "cpu")
        single.forward(model, seq[:-1].unsqueeze(0), torch.ones(1, len(seq) - 1, dtype=torch.bool))
        kv.load_row(row, single)
    return kv


@torch.inference_mode()
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_ragged_rollback_compaction_and_refill_match_full_forward(attn):
    model = tiny_llama(vocab=50, seed=1, attn=attn)
    tol = EAGER_TOL if attn == "eager" else TOL
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 50, (n,), generator=gen) for n in (5, 9, 7)]
    kv = _prefilled(model, seqs)

    block = torch.randint(0, 50, (3, 3), generator=gen)
    tokens = torch.cat([torch.stack([s[-1] for s in seqs]).unsqueeze(1), block], dim=1)
    logits = kv.forward(model, tokens, torch.ones(3, 4, dtype=torch.bool))
    for row, seq in enumerate(seqs):
        assert (logits[row] - _full(model, torch.cat([seq, block[row]]))[-4:]).abs().max() < tol

    keep = [1, 4, 2]  # ragged: row 0 keeps only its last token, row 1 the whole block
    base = torch.tensor([len(s) - 1 for s in seqs])
    kv.rollback(base + torch.tensor(keep))
    histories = [torch.cat([seq, block[row, : keep[row] - 1]]) for row, seq in enumerate(seqs)]
    assert kv.waste() > 0
    kv.compact()
    assert kv.columns == max(len(h) for h in histories)

    step = torch.randint(0, 50, (3, 1), generator=gen)
    logits = kv.forward(model, step, torch.ones(3, 1, dtype=torch.bool))
    for row, hist in enumerate(histories):
        assert (logits[row, -1] - _full(model, torch.cat([hist, step[row]]))[-1]).abs().max() < tol
        histories[row] = torch.cat([hist, step[row]])

    fresh = torch.randint(0, 50, (12,), generator=gen)  # refill slot 1 with a longer prompt
    single = SlotKV(1, "cpu")
    single.forward(model, fresh[:-1].unsqueeze(0), torch.ones(1, 11, dtype=torch.bool))
    kv.load_row(1, single)
    nxt = torch.randint(0, 50, (3,), generator=gen)
    inputs = torch.stack([nxt[0], fresh[-1], nxt[2]]).unsqueeze(1)
    logits = kv.forward(model, inputs, torch.ones(3, 1, dtype=torch.bool))
    assert (logits[1, -1] - _full(model, fresh)[-1]).abs().max() < tol
    assert (logits[0, -1] - _full(model, torch.cat([histories[0], nxt[:1]]))[-1]).abs().max() < tol


@torch.inference_mode()
def test_padding_dummy_column_is_invisible():
    """A row fed [dummy(invalid), token] sees the same logits as one fed [token] alone."""
    model = tiny_llama(vocab=50, seed=2)
    seq = torch.tensor([3, 14, 15, 9, 26])
    kv = _prefilled(model, [seq, seq])
    tokens = torch.tensor([[7, 5], [7, 5]])
    valid = torch.tensor([[False, True], [True, True]])
    logits = kv.forward(model, tokens, valid)
    assert (logits[0, -1] - _full(model, torch.cat([seq[:-1], torch.tensor([5])]))[-1]).abs().max() < TOL
    assert (logits[1, -1] - _full(model, torch.cat([seq[:-1], torch.tensor([7, 5])]))[-1]).abs().max() < TOL
    assert (logits[0, -1] - logits[1, -1]).abs().max() > 1e-6  # the dummy really was hidden from row 0
    assert kv.next_pos.tolist() == [5, 6]


def _finite(kv: SlotKV) -> bool:
    return all(bool(torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all())
               for layer in kv.cache.layers)


@torch.inference_mode()
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_padding_and_empty_slots_never_put_nan_in_the_cache(static):
    """Left-padded prefill and an empty slot both feed dummies with nothing valid before them; each
    sees its own column, so no query is fully masked and the cache stays finite (0 · NaN would poison
    later products). The loaded rows still match a plain forward."""
    model = tiny_llama(vocab=50, seed=4)
    kv = StaticSlotKV(3, "cpu", model, max_len=32) if static else SlotKV(3, "cpu")
    short, long = [5, 6, 7], [1, 2, 3, 4, 8, 9, 10]
    logits = _prefill(model, kv, [0, 2], [short, long])
    assert (logits[0] - _full(model, torch.tensor(short))[-1]).abs().max() < TOL
    assert (logits[1] - _full(model, torch.tensor(long))[-1]).abs().max() < TOL
    step = kv.forward(model, torch.tensor([[11], [12], [13]]), torch.ones(3, 1, dtype=torch.bool))
    assert _finite(kv) and torch.isfinite(step).all()
    assert (step[0, -1] - _full(model, torch.tensor([*short, 11]))[-1]).abs().max() < TOL
    assert (step[2, -1] - _full(model, torch.tensor([*long, 13]))[-1]).abs().max() < TOL


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_no_query_row_is_fully_masked(attn):
    """Dummies with nothing valid at or before them still see their own column. (PyTorch's CPU SDPA
    returns zeros for a fully masked row, but other kernels return NaN: the rule must not rely on it.)"""
    model = tiny_llama(vocab=50, seed=4, attn=attn)
    valid = torch.tensor([[False, False, True, True], [False, False, False, False]])
    mask = attention_mask(valid, start=1, n=3, width=4, model=model)
    visible = mask if mask.dtype == torch.bool else mask == 0
    assert visible.any(-1).all()
    # queries sit at columns 1, 2, 3
    assert visible[0, 0, 0].tolist() == [False, True, False, False]  # nothing valid before it: only itself
    assert visible[0, 0, 1].tolist() == [False, False, True, False]  # column 3 is its future
    assert visible[0, 0, 2].tolist() == [False, False, True, True]
    assert visible[1, 0, 0].tolist() == [False, True, False, False]  # an empty slot's dummy
