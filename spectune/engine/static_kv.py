"""Static per-slot KV for the compiled path: preallocated buffers, fixed shapes, a 4D mask we build.

gpt-fast's lesson: with a static cache indexed by column, rollback is free (only bookkeeping moves)
and every forward has the same shapes, so it can be captured by torch.compile / CUDA graphs. Here the
shapes are [B, n] tokens, [B, 1, n, L] mask and [B, Hkv, L, D] buffers, with n ∈ {1, 2, γ+1}.

HF attention layers call ``cache.update(k, v, layer_idx, ...)`` and attend over what it returns; a 4D
mask is passed through untouched by transformers' mask builder. So a small duck-typed object that
writes at this step's columns and returns the whole buffers is all a Llama-style model needs, on
transformers 5.17 and 5.24 alike (no dependence on the version-specific Cache internals).
"""

from __future__ import annotations

import torch

from spectune.engine.kv import SlotKV


class _Layer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values
        self.is_initialized = True


class ColumnCache:
    """What the model sees as its cache: writes k/v at ``write_index`` columns, returns full buffers."""

    def __init__(self, layers: list[_Layer], write_index: torch.Tensor) -> None:
        self.layers = layers
        self.write_index = write_index  # mutated in place before each forward (stable address)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        layer.keys.index_copy_(2, self.write_index, key_states.to(layer.keys.dtype))
        layer.values.index_copy_(2, self.write_index, value_states.to(layer.values.dtype))
        return layer.keys, layer.values

    def get_seq_length(self, layer_idx: int = 0) -> int:  # only asked when no position ids are given
        return 0


def kv_shape(config) -> tuple[int, int]:
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return heads, head_dim


class StaticSlotKV(SlotKV):
    """:class:`SlotKV` bookkeeping over fixed buffers of ``max_len`` columns.

    ``valid``/``col_pos`` still cover only the used columns [0, cursor); the mask pads them to
    ``max_len`` with False, so stale buffer columns past the cursor are never attended.
    """

    def __init__(self, batch: int, device: torch.device | str, model: torch.nn.Module, max_len: int,
                 forward_fn=None) -> None:
        super().__init__(batch, device)
        config = model.config
        self.fixed_shapes = True  # ask the draft to always feed 2 tokens in its first step
        heads, head_dim = kv_shape(config)
        dtype = next(model.parameters()).dtype
        self.max_len = max_len
        layers = []
        for _ in range(config.num_hidden_layers):
            keys = torch.zeros(batch, heads, max_len, head_dim, dtype=dtype, device=self.device)
            values = torch.zeros_like(keys)
            if hasattr(torch, "_dynamo"):  # CUDA graphs may keep these addresses
                torch._dynamo.mark_static_address(keys)
                torch._dynamo.mark_static_address(values)
            layers.append(_Layer(keys, values))
        self._write_index: dict[int, torch.Tensor] = {}
        self.cache = ColumnCache(layers, torch.zeros(1, dtype=torch.long, device=self.device))
        self.forward_fn = forward_fn

    def _reserve(self, n: int) -> int:
        if self.columns + n > self.max_len:
            self.compact()
            if self.columns + n > self.max_len:
                raise RuntimeError(f"static KV cache full: {self.columns} + {n} columns > max_len {self.max_len}; "
                                   "raise the hardware setup's max_cache_len")
        return self.columns

    def _mask_width(self) -> int:
        return self.max_len

    def _prepare_write(self, start: int, n: int) -> None:
        index = self._write_index.setdefault(n, torch.zeros(n, dtype=torch.long, device=self.device))
        index.copy_(torch.arange(start, start + n, device=self.device))  # in place: a stable address
        self.cache.write_index = index

    def _select_kv(self, index: slice | torch.Tensor) -> None:
        if isinstance(index, slice):  # a crop: buffers stay, the mask hides what is past the cursor
            return
        width = index.shape[1]
        for layer in self.cache.layers:  # in place, so compiled graphs keep their buffer addresses
            idx = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys[:, :, :width].copy_(layer.keys.gather(2, idx))
            layer.values[:, :, :width].copy_(layer.values.gather(2, idx))

    def _grow_kv(self, extra: int) -> None:  # the buffers are preallocated: only check they suffice
        if self.columns + extra > self.max_len:
            raise RuntimeError(f"static KV cache full: a {self.columns + extra}-token prompt > max_len {self.max_len}")
