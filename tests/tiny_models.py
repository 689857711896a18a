"""Tiny real HF Llama models for engine tests (random weights, float64 so batched and unbatched math agree)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab: int = 64, hidden: int = 32, layers: int = 2, seed: int = 0, init: float = 0.02,
               dtype: torch.dtype = torch.float64, attn: str = "sdpa") -> LlamaForCausalLM:
    """A real LlamaForCausalLM small enough to run thousands of steps in a test.

    ``init`` is the weight scale: large values give peaked next-token laws (more signal in law tests).
    """
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=init, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = attn
    return LlamaForCausalLM(config).eval().to(dtype)


def perturbed(model: LlamaForCausalLM, scale: float, seed: int) -> LlamaForCausalLM:
    """A copy of ``model`` with Gaussian noise on every weight: a draft that agrees partly."""
    copy = tiny_llama(model.config.vocab_size, model.config.hidden_size, model.config.num_hidden_layers, seed=seed,
                      dtype=model.dtype)
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy.parameters():
            param.add_(scale * param.std() * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return copy
