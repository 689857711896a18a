"""A draft whose LM head covers only the target's most frequent token ids (a reduced draft vocabulary).

Why: with a 49,152-id vocabulary the output layer is most of a small draft's cost (and of its size).
EAGLE-3 keeps a reduced draft vocabulary with a draft→target id map; so does this. The draft's law q is
zero outside its ids, which leaves speculative sampling exact: the rejection sampler sees q over *all*
target ids (the head scatters its logits into the full vocabulary, the rest filled with ``FILL``, whose
exponent underflows to exactly 0 in every float dtype and temperature ≥ 0.01 while staying finite, so
entropies and logs of q stay finite too), and tokens the draft cannot propose are still emitted through
the residual max(p − q, 0).

On disk the draft is an ordinary ``LlamaForCausalLM`` checkpoint with ``vocab_size = rows + 1`` (the
extra input row embeds every id outside the draft vocabulary), tied embeddings, the shared tokenizer, and
``draft_vocab.safetensors`` holding ``draft_to_target`` [rows]. :func:`load` reads it with
``from_pretrained`` and swaps in the two mapping modules, so the model's own forward (KV cache,
``logits_to_keep``) is untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

MAP_FILE = "draft_vocab.safetensors"
CONFIG_KEY = "spectune_draft_vocab"
FILL = -1.0e4


def is_reduced(directory: str | Path) -> bool:
    return (Path(directory) / MAP_FILE).is_file()


class MappedEmbedding(nn.Module):
    """Target ids → draft rows (ids outside the draft vocabulary share the last row)."""

    def __init__(self, embedding: nn.Embedding, target_to_draft: torch.Tensor) -> None:
        super().__init__()
        self.embedding = embedding
        self.register_buffer("target_to_draft", target_to_draft, persistent=False)

    @property
    def weight(self) -> nn.Parameter:
        return self.embedding.weight

    @property
    def num_embeddings(self) -> int:
        return self.embedding.num_embeddings

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(self.target_to_draft[input_ids])


class ScatterHead(nn.Module):
    """Logits over the draft's ids, scattered into the full target vocabulary (``FILL`` elsewhere)."""

    def __init__(self, weight: nn.Parameter, draft_to_target: torch.Tensor, full_vocab_size: int) -> None:
        super().__init__()
        self.weight = weight  # tied with the input embedding; its last row is the "other ids" input row
        self.register_buffer("draft_to_target", draft_to_target, persistent=False)
        self.rows = int(draft_to_target.numel())
        self.full_vocab_size = full_vocab_size  # what the pair check counts as LM-head rows

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight[: self.rows])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.draft_logits(hidden)
        out = small.new_full((*small.shape[:-1], self.full_vocab_size), FILL)
        return out.index_copy_(-1, self.draft_to_target, small)


def target_to_draft_map(draft_to_target: torch.Tensor, full_vocab_size: int) -> torch.Tensor:
    """[full_vocab_size] draft row of each target id; ids outside the draft vocabulary → the extra row."""
    rows = draft_to_target.numel()
    out = torch.full((full_vocab_size,), rows, dtype=torch.long)
    out[draft_to_target] = torch.arange(rows)
    return out


def wrap(model: Any, draft_to_target: torch.Tensor, full_vocab_size: int) -> Any:
    """Swap a reduced-vocabulary ``*ForCausalLM``'s input embedding and head for the mapping modules."""
    d2t = draft_to_target.to(device=model.device, dtype=torch.long)
    t2d = target_to_draft_map(d2t.cpu(), full_vocab_size).to(model.device)
    base = model.get_input_embeddings()
    if base.num_embeddings != d2t.numel() + 1:
        raise ValueError(f"draft vocabulary map has {d2t.numel()} ids but the embedding {base.num_embeddings} "
                         "rows (expected ids + 1)")
    model.set_input_embeddings(MappedEmbedding(base, t2d))
    model.lm_head = ScatterHead(base.weight, d2t, full_vocab_size)
    model.config.tie_word_embeddings = False  # the head now holds the shared weight itself
    # the ids it reads and the logits it returns span the target's vocabulary (what transformers' assisted
    # generation checks to accept it as the target's assistant); the stored checkpoint keeps rows + 1
    model.config.vocab_size = full_vocab_size
    return model


def load(directory: str | Path, **kwargs: Any) -> Any:
    """``from_pretrained`` on the stored checkpoint, then :func:`wrap` with its id map."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, **kwargs)
    return wrap(model, *read_map(directory, model.config))


def read_map(directory: str | Path, config: Any) -> tuple[torch.Tensor, int]:
    """The stored draft→target id map and the target's vocabulary size (the config's, else the map's largest id
    + 1)."""
    from safetensors.torch import load_file

    meta = getattr(config, CONFIG_KEY, None) or {}
    d2t = load_file(str(Path(directory) / MAP_FILE))["draft_to_target"]
    return d2t, int(meta.get("full_vocab_size", int(d2t.max()) + 1))
