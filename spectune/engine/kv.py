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
def _forward_arguments(model_class: type) -> tuple[str, bool, bool]:
    """(name of the KV-cache argument, takes ``cache_position``, takes ``logits_to_keep``) for this class.

    transformers 5.24 renamed ``past_key_values`` to ``cache`` and derives cache positions itself;
    older 5.x releases (the GPU machine has 5.17) still want ``past_key_values`` + ``cache_position``. A model
    that wraps a transformers model names the class it passes them on to as ``forward_like``.
    """
    params = inspect.signature(getattr(model_class, "forward_like", model_class).forward).parameters
    name = "cache" if "cache" in params else "past_key_values"
    return name, "cache_position" in params, "logits_to_keep" in params


def cache_argument(model: torch.nn.Module) -> str:
    """The name this transformers version gives the KV-cache argument and output (``cache`` or
    ``past_key_values``): one answer for every caller that drives a model by hand."""
    return _forward_arguments(type(model))[0]


def model_kwargs(model: torch.nn.Module, cache: object, start: int, n: int, last_only: bool,
                 device: torch.device) -> dict:
    """Keyword arguments shared by every cached forward: the cache under its version's name, the
    columns written (where the version wants them), and logits for the last position only when that
    is all the caller reads (prefill and draft steps: no [n, V] projection wasted)."""
    cache_arg, takes_position, takes_keep = _forward_arguments(type(model))
    kwargs: dict = {cache_arg: cache, "use_cache": True}
    if takes_position:
        kwargs["cache_position"] = torch.arange(start, start + n, device=device)
    if last_only and takes_keep:
        kwargs["logits_to_keep"] = 1
    return kwargs


def attention_mask(valid: torch.Tensor, start: int, n: int, width: int, model: torch.nn.Module) -> torch.Tensor:
    """The 4D mask [B, 1, n, width] for queries at columns start..start+n-1, built here (transformers
    passes a 4D mask through untouched), so eager and static paths share one rule:

    a query sees the valid columns at or before its own, and always its own column. The last part
    keeps padding dummies (left padding, empty slots) from attending to nothing: a fully masked row
    makes NaN, which would sit in the cache and poison any product with it (0 · NaN = NaN).
    """
    padded = torch.nn.functional.pad(valid, (0, width - valid.shape[1])) if width > valid.shape[1] else valid.clone()
    if n == 1:  # one query at the newest column: every column before it is causal already (the draft step's case)
        padded[:, start] = True
        mask = padded[:, None, None, :]
    else:
        cols = torch.arange(width, device=valid.device)
        query_cols = torch.arange(start, start + n, device=valid.device)
        causal = cols.unsqueeze(0) <= query_cols.unsqueeze(1)
        own = cols.unsqueeze(0) == query_cols.unsqueeze(1)
        mask = (padded[:, None, None, :] & causal) | own
    if _is_eager(model):  # eager adds the mask to scores
        dtype = next(model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


def _is_eager(model: torch.nn.Module) -> bool:
    # transformers' config attribute lookup costs microseconds, paid per step: read it once per model
    eager = model.__dict__.get("_spectune_eager")
    if eager is None:
        eager = getattr(model.config, "_attn_implementation", "sdpa") == "eager"
        model.__dict__["_spectune_eager"] = eager
    return eager


class SlotKV:
    """KV cache of one model for ``batch`` slots, each with its own length and positions."""

    def __init__(self, batch: int, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.batch = batch
        self.cache = DynamicCache()
        self._constants: dict[tuple, torch.Tensor] = {}
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

    def forward(self, model: torch.nn.Module, tokens: torch.Tensor, new_valid: torch.Tensor | None = None,
                last_only: bool = False, features: torch.Tensor | None = None) -> torch.Tensor:
        """Feed ``tokens [B, n]``; ``new_valid [B, n]`` says which are real (False = padding dummy; None = all real).

        Real tokens of a row get consecutive positions from the row's ``next_pos``. Returns logits
        [B, n, V], or [B, 1, V] for the last column when ``last_only``. ``features [B, n, H]`` go to a draft
        that reads the target's features beside its tokens (:mod:`spectune.models.feature_draft`).
        """
        n = tokens.shape[1]
        start = self._reserve(n)
        all_real = new_valid is None
        if all_real:  # draft steps and verifications: no per-row counting (a few µs a step add up)
            # one token: its position is next_pos itself (a view, no add; next_pos is replaced below, not written)
            positions = self.next_pos.unsqueeze(1) if n == 1 else self.next_pos.unsqueeze(1) + self._steps(n)
            new_valid = self._all_real(tokens.shape[0], n)
            advance: torch.Tensor | int = n
        else:
            offsets = new_valid.long().cumsum(1) - 1
            positions = self.next_pos.unsqueeze(1) + offsets.clamp(min=0)
            advance = new_valid.long().sum(1)
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.col_pos = torch.cat([self.col_pos, positions], dim=1)
        width = self._mask_width()
        if all_real and n == 1 and width == self.columns and not _is_eager(model):
            # A draft step's mask is the validity itself (its own column was just appended as valid): a view, where
            # attention_mask would copy it and set that column again. Read-only: ``valid`` is replaced, never
            # written, before the next forward.
            mask = self.valid.view(self.valid.shape[0], 1, 1, width)
        else:
            mask = attention_mask(self.valid, start, n, width, model)
        self._prepare_write(start, n)
        forward = self.forward_fn or model
        extra = {} if features is None else {"features": features}
        out = forward(input_ids=tokens, attention_mask=mask, position_ids=positions, **extra,
                      **model_kwargs(model, self.cache, start, n, last_only, self.device))
        self.next_pos = self.next_pos + advance
        return out.logits

    def _steps(self, n: int) -> torch.Tensor:
        """arange(n) on the device, made once per n (read-only)."""
        cached = self._constants.get(("steps", n))
        if cached is None:
            cached = self._constants[("steps", n)] = torch.arange(n, device=self.device)
        return cached

    def _all_real(self, batch: int, n: int) -> torch.Tensor:
        """An all-True [batch, n] validity block, made once per shape (read-only: ``torch.cat`` copies it)."""
        cached = self._constants.get(("real", batch, n))
        if cached is None:
            cached = self._constants[("real", batch, n)] = torch.ones(batch, n, dtype=torch.bool, device=self.device)
        return cached

    # Hooks the static subclass overrides: where columns go and how wide the mask is.
    forward_fn = None

    def _reserve(self, n: int) -> int:
        return self.columns

    def _mask_width(self) -> int:
        return self.columns

    def _prepare_write(self, start: int, n: int) -> None:
        pass

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
            for idx, theirs in enumerate(_layers(other.cache)):
                empty = theirs.keys.new_zeros(self.batch, theirs.keys.shape[1], self.columns, theirs.keys.shape[3])
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
        """Keep the columns ``index`` names: a slice (crop) or a per-row gather [B, width] (compaction)."""
        if isinstance(index, slice):
            self.valid, self.col_pos = self.valid[:, index], self.col_pos[:, index]
        else:
            self.valid, self.col_pos = self.valid.gather(1, index), self.col_pos.gather(1, index)
        self._select_kv(index)

    def _grow(self, extra: int) -> None:
        """Append ``extra`` hole columns to every row."""
        self._grow_kv(extra)
        self.valid = torch.cat([self.valid, self.valid.new_zeros(self.batch, extra)], dim=1)
        self.col_pos = torch.cat([self.col_pos, self.col_pos.new_zeros(self.batch, extra)], dim=1)

    # Storage hooks: a growing HF cache here; fixed buffers in the static subclass.
    def _select_kv(self, index: slice | torch.Tensor) -> None:
        for layer in _layers(self.cache):
            if not layer.is_initialized:
                continue
            if isinstance(index, slice):
                layer.keys, layer.values = layer.keys[:, :, index], layer.values[:, :, index]
            else:
                idx = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)

    def _grow_kv(self, extra: int) -> None:
        for layer in _layers(self.cache):
            if layer.is_initialized:
                pad = layer.keys.new_zeros(*layer.keys.shape[:2], extra, layer.keys.shape[3])
                layer.keys = torch.cat([layer.keys, pad], dim=2)
                layer.values = torch.cat([layer.values, pad.clone()], dim=2)


def prefill_slots(model: torch.nn.Module, kv: SlotKV, rows: list[int], prompts: list[list[int]],
                  features: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Run newly admitted prompts through ``model`` as one batch and load them into slots ``rows``.

    Shorter prompts are left-padded with masked dummy columns (never attended), so every row's last
    token is in the last column and only that column's logits are computed. Returns them, [k, V].
    ``features`` ([len(prompt), H] each) go beside the tokens to a draft that reads them, padded alike.
    """
    longest = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), longest, dtype=torch.long)
    valid = torch.zeros(len(prompts), longest, dtype=torch.bool)
    feats = None
    if features is not None:
        feats = features[0].new_zeros(len(prompts), longest, features[0].shape[-1])
    for i, prompt in enumerate(prompts):
        tokens[i, longest - len(prompt):] = torch.tensor(prompt)
        valid[i, longest - len(prompt):] = True
        if feats is not None:
            feats[i, longest - len(prompt):] = features[i]
    fresh = SlotKV(len(prompts), kv.device)
    logits = fresh.forward(model, tokens.to(kv.device), valid.to(kv.device), last_only=True, features=feats)
    for i, row in enumerate(rows):
        kv.load_row(row, fresh, other_row=i)
    return logits[:, -1]
