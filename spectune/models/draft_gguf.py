"""A reduced-vocabulary draft (:mod:`spectune.models.draft_vocab`) written as a GGUF that llama.cpp accepts as the
draft of its target: the target's full vocabulary and tokenizer, every target id a row.

Why: llama-server's ``--spec-type draft-simple`` refuses a draft whose vocabulary differs from the target's by more
than 128 tokens or in any token's text (``common_speculative_are_compatible``), and spectune's distilled drafts keep
12,288 output rows mapped to target ids. The expansion keeps the draft's function exactly:

- the input embedding gets a row per target id: the draft's row of that id, and the shared "other ids" row for every
  id outside the draft vocabulary (what :class:`~spectune.models.draft_vocab.MappedEmbedding` looks up);
- the output layer gets a row per target id: the draft's head row for its ids, zeros elsewhere, and an output bias
  of 0 on the draft's ids and ``draft_vocab.FILL`` (-1e4) elsewhere, the logits
  :class:`~spectune.models.draft_vocab.ScatterHead` returns. An id outside the draft vocabulary has logit -1e4
  whatever the hidden state: its softmax mass, exp(-1e4 - max logit), is exactly 0 in float32, and it never wins the
  argmax while any draft id's logit exceeds -1e4.

A Llama output layer has no bias in llama.cpp; Qwen2's has an optional one (``output.bias``) and is otherwise Llama's
computation (RMSNorm, GQA attention with optional q/k/v biases left out, SwiGLU, untied output) with rotary pairs
offset by half the head (NEOX), which is Hugging Face's layout: the weights go in unpermuted. The architecture is
the draft's business alone: llama.cpp compares the two vocabularies, never the two architectures. The tokenizer's
metadata (tokens, types, merges, special ids, pre-tokenizer, chat template) is copied from the target's GGUF, so the
two vocabularies are identical by construction.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from spectune.errors import SpectuneError
from spectune.models import draft_vocab

FORMAT = 1  # bump when the written file changes: it is part of the cache key
ARCH = "qwen2"
OUTTYPES = ("f32", "f16")
log = logging.getLogger(__name__)

# Hugging Face Llama names -> GGUF names (per layer: {i})
LAYER_TENSORS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def expand_vocabulary(embedding: np.ndarray, draft_to_target: np.ndarray,
                      full_vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(token_embd, output, output_bias)`` over the full vocabulary from a reduced draft's tied ``embedding``
    [rows + 1, d] (the last row embeds every other id) and its ``draft_to_target`` [rows] map.

    ``output @ h + output_bias`` equals the draft's head logits on its ids and ``FILL`` elsewhere, for every h.
    """
    rows = int(draft_to_target.shape[0])
    if embedding.shape[0] != rows + 1:
        raise ValueError(f"the embedding has {embedding.shape[0]} rows, the id map {rows} ids (expected ids + 1)")
    ids = draft_to_target.astype(np.int64)
    if len(np.unique(ids)) != rows or ids.min() < 0 or ids.max() >= full_vocab_size:
        raise ValueError(f"the id map must hold {rows} distinct ids in 0..{full_vocab_size - 1}")
    to_draft = np.full(full_vocab_size, rows, dtype=np.int64)  # as draft_vocab.target_to_draft_map
    to_draft[ids] = np.arange(rows)
    token_embd = embedding[to_draft]
    output = np.zeros((full_vocab_size, embedding.shape[1]), dtype=embedding.dtype)
    output[ids] = embedding[:rows]
    bias = np.full(full_vocab_size, draft_vocab.FILL, dtype=np.float32)
    bias[ids] = 0.0
    return token_embd, output, bias


def _read_draft(directory: Path) -> tuple[dict[str, Any], dict[str, np.ndarray], np.ndarray, int]:
    """The draft's config, its weights as float32 numpy, its id map and the target's vocabulary size."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "llama" or not config.get("tie_word_embeddings", False):
        raise SpectuneError(f"{directory} is not a reduced-vocabulary Llama draft with tied embeddings "
                            f"(model_type={config.get('model_type')!r}): only those are exported to GGUF")
    weights = {k: v.to(torch.float32).numpy() for k, v in load_file(str(directory / "model.safetensors")).items()}
    d2t = load_file(str(directory / draft_vocab.MAP_FILE))["draft_to_target"].numpy()
    meta = config.get(draft_vocab.CONFIG_KEY) or {}
    return config, weights, d2t, int(meta.get("full_vocab_size", int(d2t.max()) + 1))


def _tokenizer_fields(target_gguf: Path) -> list[tuple[str, Any, Any, Any]]:
    """Every ``tokenizer.*`` key of the target's GGUF: (key, value, type, element type)."""
    import gguf

    reader = gguf.GGUFReader(str(target_gguf))
    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        out.append((key, field.contents(), vtype, sub))
    return out


def write(draft_dir: str | Path, target_gguf: Path, dest: Path, outtype: str = "f32") -> Path:
    """Write the draft in ``draft_dir`` as a full-vocabulary GGUF at ``dest`` (tokenizer from ``target_gguf``)."""
    import gguf

    if outtype not in OUTTYPES:
        raise SpectuneError(f"outtype={outtype!r} is invalid: one of {', '.join(OUTTYPES)}")
    directory = Path(draft_dir)
    config, weights, d2t, vocab = _read_draft(directory)
    tokenizer = _tokenizer_fields(target_gguf)
    n_tokens = next((len(v) for k, v, *_ in tokenizer if k == "tokenizer.ggml.tokens"), None)
    if n_tokens != vocab:
        raise SpectuneError(f"the target GGUF {target_gguf.name} has {n_tokens} tokens, the draft's id map "
                            f"{vocab}: the draft was not made for this target")
    token_embd, output, bias = expand_vocabulary(weights["model.embed_tokens.weight"], d2t, vocab)
    matrix = np.float16 if outtype == "f16" else np.float32

    writer = gguf.GGUFWriter(str(dest), ARCH)
    writer.add_name(f"{directory.name} (spectune reduced-vocabulary draft, {len(d2t)} of {vocab} ids)")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if outtype == "f16" else gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_head_count_kv(int(config["num_key_value_heads"]))
    writer.add_rope_freq_base(float((config.get("rope_parameters") or {}).get("rope_theta")
                                    or config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    for key, value, vtype, sub in tokenizer:
        writer.add_key_value(key, value, vtype, sub)

    writer.add_tensor("token_embd.weight", token_embd.astype(matrix))
    for i in range(int(config["num_hidden_layers"])):
        for hf, name in LAYER_TENSORS.items():
            tensor = weights[f"model.layers.{i}.{hf}.weight"]
            writer.add_tensor(f"blk.{i}.{name}.weight", tensor.astype(matrix if tensor.ndim == 2 else np.float32))
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"].astype(np.float32))
    writer.add_tensor("output.weight", output.astype(matrix))
    writer.add_tensor("output.bias", bias)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def cache_name(draft_dir: str | Path, target_gguf: Path, outtype: str = "f32") -> str:
    """The exported file's name: keyed by the draft's weights and id map, the target's GGUF and :data:`FORMAT`."""
    directory = Path(draft_dir)
    digest = hashlib.sha256(f"format={FORMAT} outtype={outtype}".encode())
    for part in (directory / "config.json", directory / "model.safetensors", directory / draft_vocab.MAP_FILE,
                 target_gguf):
        digest.update(_file_sha256(part).encode())
    return f"{directory.resolve().parent.name}-{directory.name}.{outtype.upper()}-{digest.hexdigest()[:16]}.gguf"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def cached(draft_dir: str | Path, target_gguf: Path, folder: Path, outtype: str = "f32") -> Path | None:
    """The exported draft in ``folder`` when it was written before, else None."""
    path = folder / cache_name(draft_dir, target_gguf, outtype)
    return path if path.is_file() else None


def export(draft_dir: str | Path, target_gguf: Path, folder: Path, outtype: str = "f32") -> Path:
    """The draft's GGUF in ``folder``, written once (into a temporary file renamed into place) and found after."""
    if not draft_vocab.is_reduced(draft_dir):
        raise SpectuneError(f"{draft_dir} is not a reduced-vocabulary draft (no {draft_vocab.MAP_FILE}): a draft "
                            "with the target's vocabulary converts with llama.cpp's convert_hf_to_gguf.py")
    found = cached(draft_dir, target_gguf, folder, outtype)
    if found is not None:
        log.info("draft GGUF already written: %s", found)
        return found
    dest = folder / cache_name(draft_dir, target_gguf, outtype)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=folder)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(draft_dir, target_gguf, tmp, outtype)
        tmp.chmod(0o644)  # mkstemp's 0600 would hide it from another user of a shared cache
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("draft GGUF written: %s", dest)
    return dest
