"""Per-slot KV bookkeeping on top of a Hugging Face cache, for sequences that advance raggedly.

HF caches append columns for the whole batch at once, so all rows share one column cursor. Each row
keeps its own validity mask over the columns and the position id of every column. Rolling a row back
is then just lowering its next position: columns at or beyond it turn into holes (mask 0) and are
never attended again. Holes shared by every row at the tail are cropped (at batch 1 that is a plain
crop, like HF assisted generation); holes inside are squeezed out by :meth:`SlotKV.compact`.
"""

from __future__ import annotations

import inspect
from functools import cache as _memo

import torch
from transformers import DynamicCache


def _layers(cache: DynamicCache) -> list:
    return list(cache.layers)


@_memo
def cache_arguments(model_class: type) -> tuple[str, bool]:
    """Name of the KV-cache argument and whether ``cache_position`` is taken, for this model class.

    transformers 5.24 renamed ``past_key_values`` to ``cache`` and derives cache positions itself;
    older 5.x releases (the GPU machine has 5.17) still want ``past_key_values`` + ``cache_position``.
    """
    params = inspect.signature(model_class.forward).parameters
    name = "cache" if "cache" in params else "past_key_values"
    return name, "cache_position" in params


class SlotKV:
    """KV cache of one model for ``batch`` slots, each with its own length and positions."""

    def __init__(self, batch: int, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.batch = batch
        self.cache = DynamicCache()
        self.reset()

    def reset(self) -> None:
        """Empty every slot (the static subclass keeps its buffers: only bookkeeping is cleared)."""
        if isinstance(self.cache, DynamicCache):
            self.cache = DynamicCache()
        self.valid = torch.zeros(self.batch, 0, dtype=torch.bool, device=self.device)
        self.col_pos = torch.zeros(self.batch, 0, dtype=torch.long, device=self.device)
        self.next_pos = torch.zeros(self.batch, dtype=torch.long, device=self.device)

    @property
    def columns(self) -> int:
        return self.valid.shape[1]

    def forward(self, model: torch.nn.Module, tokens: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens [B, n]``; ``new_valid [B, n]`` says which are real (False = padding dummy).

        Real tokens of a row get consecutive positions from the row's ``next_pos``. Returns logits [B, n, V].
        """
        n = tokens.shape[1]
        offsets = new_valid.long().cumsum(1) - 1
        positions = (self.next_pos.unsqueeze(1) + offsets.clamp(min=0))
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.col_pos = torch.cat([self.col_pos, positions], dim=1)
        start = self.columns - n
        cache_arg, takes_position = cache_arguments(type(model))
        extra = {"cache_position": torch.arange(start, start + n, device=self.device)} if takes_position else {}
        out = model(input_ids=tokens, attention_mask=self.valid.long(), position_ids=positions,
                    use_cache=True, **{cache_arg: self.cache}, **extra)
        self.next_pos = self.next_pos + new_valid.long().sum(1)
        return out.logits

    def rollback(self, next_pos: torch.Tensor) -> None:
        """Keep, per row, only the columns whose position is below ``next_pos``; crop the common tail."""
        self.next_pos = next_pos.to(self.device)
        self.valid &= self.col_pos < self.next_pos.unsqueeze(1)
        used = self.valid.any(0).nonzero()
        keep = int(used.max()) + 1 if used.numel() else 0
        if keep < self.columns:
            self._select_columns(slice(0, keep))

    def clear(self, row: int) -> None:
        """Free one slot: all its columns become holes."""
        self.valid[row] = False
        self.next_pos[row] = 0

    def load_row(self, row: int, other: SlotKV, other_row: int = 0) -> None:
        """Copy row ``other_row`` of another cache (e.g. a fresh prefill) into slot ``row``, at columns 0..P-1.

        The slot's old columns are holes by then, so the new prompt may reuse them; later tokens of
        this row go to columns >= P, which keeps the column order causal.
        """
        length = other.columns
        if not _layers(self.cache):  # first admission: shape the empty cache after the prefill's layers
            batch = self.valid.shape[0]
            for idx, theirs in enumerate(_layers(other.cache)):
                empty = theirs.keys.new_zeros(batch, theirs.keys.shape[1], self.columns, theirs.keys.shape[3])
                self.cache.update(empty, empty.clone(), idx)
        if length > self.columns:
            self._grow(length - self.columns)
        self.clear(row)
        for mine, theirs in zip(_layers(self.cache), _layers(other.cache), strict=True):
            mine.keys[row, :, :length] = theirs.keys[other_row]
            mine.values[row, :, :length] = theirs.values[other_row]
        self.valid[row, :length] = other.valid[other_row]
        self.col_pos[row, :length] = other.col_pos[other_row]
        self.next_pos[row] = other.next_pos[other_row]

    def compact(self) -> None:
        """Squeeze holes out: every row's valid columns move left, order kept; rows are left-aligned."""
        counts = self.valid.sum(1)
        width = int(counts.max()) if counts.numel() else 0
        if width == self.columns:
            return
        # Stable sort puts valid columns first in their original order; the rest are holes.
        order = torch.sort((~self.valid).long(), dim=1, stable=True).indices[:, :width]
        self._select_columns(order)

    def waste(self) -> float:
        """Fraction of cache columns that are holes (what compaction would free)."""
        return 1.0 - float(self.valid.float().mean()) if self.valid.numel() else 0.0

    def _select_columns(self, index: slice | torch.Tensor) -> None:
        if isinstance(index, slice):
            self.valid, self.col_pos = self.valid[:, index], self.col_pos[:, index]
            for layer in _layers(self.cache):
                if layer.is_initialized:
                    layer.keys, layer.values = layer.keys[:, :, index], layer.values[:, :, index]
            return
        self.valid = self.valid.gather(1, index)
        self.col_pos = self.col_pos.gather(1, index)
        for layer in _layers(self.cache):
            if layer.is_initialized:
                idx = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)

    def _grow(self, extra: int) -> None:
        batch = self.valid.shape[0]
        self.valid = torch.cat([self.valid, self.valid.new_zeros(batch, extra)], dim=1)
        self.col_pos = torch.cat([self.col_pos, self.col_pos.new_zeros(batch, extra)], dim=1)
        for layer in _layers(self.cache):
            if layer.is_initialized:
                pad = layer.keys.new_zeros(*layer.keys.shape[:2], extra, layer.keys.shape[3])
                layer.keys = torch.cat([layer.keys, pad], dim=2)
                layer.values = torch.cat([layer.values, pad.clone()], dim=2)
