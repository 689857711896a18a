"""A draft that reads the target's features: EAGLE's recipe (Li et al., ICML 2024) on a reduced vocabulary.

Why: an independent small draft must rebuild, from tokens alone, what the target's 30 layers know about the
context; on SmolLM2-135M a 2-layer one plateaued at α ≈ 0.38 in English. The target's last hidden state f_t (the
vector its LM head reads) already holds that knowledge, and the verification computes it for free. EAGLE's
draft predicts the *next* feature from the current one and the token that follows it:

    entry j = fc([norm(embed(x_j)), norm(f_{j-1})])  →  decoder layer(s), causal over entries  →  f̂_j  →  q(x_{j+1})

At a cycle's first draft step every f is the target's; deeper steps feed the draft's own f̂ (the proposer
keeps them), which is why acceptance falls faster with γ than for an independent draft. The token
embedding is the target's own input embedding, borrowed when the pair loads (not stored: the draft's files
stay small); the head covers the draft vocabulary only (:mod:`spectune.models.draft_vocab`), so q = 0 elsewhere
and speculative sampling stays exact.

On disk: ``config.json`` (a LlamaConfig of the decoder layer, with ``spectune_feature_draft``), and
``model.safetensors`` (fc, the layer, the norm, the head rows) beside ``draft_vocab.safetensors``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaModel, LlamaRMSNorm

from spectune.engine.kv import cache_argument
from spectune.models import draft_vocab

CONFIG_KEY = "spectune_feature_draft"
WEIGHTS = "model.safetensors"


def is_feature_draft(directory: str | Path) -> bool:
    config = Path(directory) / "config.json"
    return config.is_file() and CONFIG_KEY in json.loads(config.read_text(encoding="utf-8"))


@dataclass
class Output:
    logits: torch.Tensor


class FeatureDraft(nn.Module):
    """fc over [token embedding, target feature] → Llama decoder layers → norm → a reduced-vocabulary head.

    Its ``forward`` takes the arguments a ``LlamaForCausalLM`` takes (so the engine's KV bookkeeping drives it as
    any draft) plus ``features`` [B, n, H]: f_{j-1} beside each token x_j.
    """

    forward_like = LlamaForCausalLM  # whose forward's cache arguments this one passes on (spectune.engine.kv)
    reads_target_features = True  # the engine asks this (spectune.engine.features), never for the class

    def __init__(self, config: Any, draft_to_target: torch.Tensor, full_vocab_size: int) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        # EAGLE-3 normalises both inputs: SmolLM2's features have norm ~48, its embedding rows ~3, so without this
        # the token would enter the fc 15x fainter than the context
        self.embed_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.feature_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.model = LlamaModel(config)
        self.model.embed_tokens = None  # inputs come as embeddings: the target's rows, borrowed (attach)
        head = nn.Parameter(torch.zeros(draft_to_target.numel(), hidden))
        self.lm_head = draft_vocab.ScatterHead(head, draft_to_target.long(), full_vocab_size)
        self.embed: nn.Module | None = None

    def attach(self, target: nn.Module) -> FeatureDraft:
        """Borrow the target's input embedding (shared, not copied; outside this module's parameters, so moving or
        saving the draft never touches it)."""
        object.__setattr__(self, "embed", target.get_input_embeddings())
        return self

    def get_input_embeddings(self) -> nn.Module | None:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def num_parameters(self) -> int:
        """The draft's own weights (the borrowed embedding is the target's)."""
        return sum(p.numel() for p in self.parameters())

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def entries(self, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """fc([norm(embed(x_j)), norm(f_{j-1})]) for each entry."""
        assert self.embed is not None, "attach(target) first: the draft borrows the target's embedding"
        token = self.embed_norm(self.embed(input_ids).to(self.dtype))
        return self.fc(torch.cat([token, self.feature_norm(features.to(self.dtype))], -1))

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits_to_keep: int = 0, **kwargs: Any) -> Output:
        out = self.model(inputs_embeds=self.entries(input_ids, features), attention_mask=attention_mask,
                         position_ids=position_ids, **kwargs)
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return Output(self.lm_head(hidden))

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft's own ids (training reads these; the engine reads the scattered ones)."""
        return F.linear(hidden, self.lm_head.weight)

    def save(self, directory: Path) -> None:
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS))
        save_file({"draft_to_target": self.lm_head.draft_to_target.cpu().contiguous()},
                  str(directory / draft_vocab.MAP_FILE))
        config = self.config.to_dict()
        config[CONFIG_KEY] = {"full_vocab_size": self.lm_head.full_vocab_size, "rows": self.lm_head.rows}
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def unrolled(draft: FeatureDraft, ids: torch.Tensor, features: torch.Tensor, mask: torch.Tensor, gamma: int
             ) -> list[torch.Tensor]:
    """The draft's predicted features at every entry as a cycle's draft step 1..``gamma`` would compute them
    (EAGLE-3's training-time test), [B, n, H] each, for right-padded entries (``mask`` [B, n], 1 = real).

    Step 1 is one causal pass over the target's features. At step k each entry j reads the step-(k−1) prediction
    at entry j−1 (a feature the draft predicted, as at inference) and attends to the target-feature entries up to
    j−k+1 (where that cycle began) and to its own chain: step m's entry j−(k−m) for m = 2..k. One pass per step,
    each appending to the KV cache, so the cost is ``gamma`` forwards, not one per position.
    """
    out = draft.model(inputs_embeds=draft.entries(ids, features), attention_mask=mask, use_cache=True)
    cache_name = cache_argument(draft.model)
    cache, steps = out[cache_name], [out.last_hidden_state]
    batch, n = ids.shape
    valid, cols = mask.bool(), torch.arange(n, device=ids.device)
    positions = cols.unsqueeze(0).expand(batch, -1)
    for k in range(2, gamma + 1):
        started = valid[:, None, :] & (cols[None, :] <= cols[:, None] - k + 1).unsqueeze(0)
        chain = [(cols[None, :] == cols[:, None] - (k - m)).unsqueeze(0).expand(batch, -1, -1) for m in range(2, k + 1)]
        attend = torch.cat([started, *chain], -1).unsqueeze(1)  # [B, 1, n, k·n]
        shifted = torch.cat([features[:, :1], steps[-1][:, :-1].to(features.dtype)], 1)
        out = draft.model(inputs_embeds=draft.entries(ids, shifted), attention_mask=attend, position_ids=positions,
                          use_cache=True, **{cache_name: cache})
        cache = out[cache_name]
        steps.append(out.last_hidden_state)
    return steps


def build(target: nn.Module, layers: int, draft_to_target: torch.Tensor, copy_layer: int | None = None
          ) -> FeatureDraft:
    """A fresh draft of the target's width: ``layers`` decoder layers (the first copied from the target's layer
    ``copy_layer`` when given), the target's final norm, and the head rows of the draft vocabulary."""
    from transformers import LlamaConfig

    cfg = target.config.to_dict()
    for key in ("architectures", "_name_or_path", "_model_name_or_path", "dtype", "transformers_version"):
        cfg.pop(key, None)
    cfg.update(num_hidden_layers=layers, vocab_size=1, tie_word_embeddings=False, pad_token_id=None,
               bos_token_id=None, eos_token_id=None)
    draft = FeatureDraft(LlamaConfig(**cfg), draft_to_target, target.config.vocab_size).float()
    with torch.no_grad():
        hidden = cfg["hidden_size"]
        # start as a residual stream does: the (normalised) token plus the (normalised) context
        draft.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.eye(hidden)], 1))
        if copy_layer is not None:
            draft.model.layers[0].load_state_dict(
                {k: v.float() for k, v in target.model.layers[copy_layer].state_dict().items()})
        draft.model.norm.load_state_dict({k: v.float() for k, v in target.model.norm.state_dict().items()})
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight.float()[draft_to_target.long()])
    return draft.attach(target)


def grow(draft: FeatureDraft, layers: int) -> FeatureDraft:
    """The same draft with ``layers`` decoder layers: the new ones on top, their attention and MLP output
    projections zero, so each adds nothing to the residual stream and the grown draft computes exactly what
    ``draft`` did (the zero-initialised residual branch of progressive stacking); training then uses them."""
    from transformers import LlamaConfig

    have = draft.config.num_hidden_layers
    if layers < have:
        raise ValueError(f"layers={layers} is invalid: a draft of {have} layer(s) grows, it does not shrink")
    cfg = draft.config.to_dict()
    cfg["num_hidden_layers"] = layers
    grown = FeatureDraft(LlamaConfig(**cfg), draft.lm_head.draft_to_target, draft.lm_head.full_vocab_size)
    grown = grown.to(dtype=draft.dtype, device=draft.device)
    missing, unexpected = grown.load_state_dict(draft.state_dict(), strict=False)
    assert not unexpected and all(k.startswith(tuple(f"model.layers.{i}." for i in range(have, layers)))
                                  for k in missing), (missing, unexpected)
    with torch.no_grad():
        for layer in grown.model.layers[have:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    if draft.embed is not None:
        object.__setattr__(grown, "embed", draft.embed)
    return grown.train(draft.training)


def load(directory: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
         attn_implementation: str | None = None) -> FeatureDraft:
    """Read a stored draft (un-attached: :meth:`FeatureDraft.attach` the target before use)."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    directory = Path(directory)
    raw = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    meta = raw.pop(CONFIG_KEY)
    if attn_implementation:
        raw["attn_implementation"] = attn_implementation
    d2t = load_file(str(directory / draft_vocab.MAP_FILE))["draft_to_target"]
    draft = FeatureDraft(LlamaConfig(**raw), d2t, int(meta["full_vocab_size"]))
    draft.load_state_dict(load_file(str(directory / WEIGHTS)))
    return draft.to(device=device, dtype=dtype).eval()
