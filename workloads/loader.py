"""Workloads: which prompts, how many new tokens, which sampling law, which seed.

``+workload=it|en|zh|es|mix`` picks a bundled set (``conf/workload/*.yaml``). Sources:

- ``jsonl``: a JSON-lines file with one object per line and a text field (``field``, default
  ``prompt``; ``id`` optional). Bundled sets are such files. Point any workload at your own file with
  ``+workload=en workload.path=/my/prompts.jsonl`` (relative paths: the current directory first, then
  the repo root; set ``workload.language`` and ``workload.prompt_tokens=null`` as needed).
- ``hf``: ``datasets.load_dataset(path, subset, split=split)`` and the column ``field`` — any hub or local
  dataset (``+workload=en workload.source=hf workload.path=... workload.split=test workload.field=text``).
  The dataset config name is the key ``subset`` because ``name`` is the workload's own name.
- ``mix``: the bundled files of ``languages``, interleaved so every language gets an equal share.

Files are read through ``datasets.load_dataset("json", data_files=...)`` after a line-by-line check, so a
malformed line is reported by file and line number instead of as an Arrow parse error.
"""

from __future__ import annotations

import json
import os
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.errors import SpectuneError
from harness.sampling import SamplingParams

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLED = REPO_ROOT / "workloads" / "prompts"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    input_ids: list[int]
    language: str


@dataclass
class Workload:
    """A list of tokenised prompts plus the generation settings every engine run must share."""

    name: str
    language: str
    prompts: list[Prompt]
    max_new_tokens: int
    sampling: SamplingParams
    seed: int
    source: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """Metadata for result files: source, settings and the prompt-length distribution in tokens."""
        out: dict[str, Any] = {
            "name": self.name, "language": self.language, "source": self.source,
            "num_prompts": len(self.prompts), "max_new_tokens": self.max_new_tokens,
            "sampling": {"temperature": self.sampling.temperature, "top_k": self.sampling.top_k,
                         "top_p": self.sampling.top_p},
            "seed": self.seed, "prompt_tokens": length_stats([len(p.input_ids) for p in self.prompts]),
        }
        langs = sorted({p.language for p in self.prompts})
        if len(langs) > 1:
            out["prompt_tokens_by_language"] = {
                lang: length_stats([len(p.input_ids) for p in self.prompts if p.language == lang])
                for lang in langs}
        return out


def length_stats(lengths: list[int]) -> dict[str, float]:
    if not lengths:
        return {"count": 0}
    return {"count": len(lengths), "min": min(lengths), "p50": statistics.median(lengths),
            "mean": round(statistics.fmean(lengths), 2), "max": max(lengths)}


def resolve_path(path: str) -> Path:
    p = Path(os.path.expanduser(str(path)))
    for candidate in ([p] if p.is_absolute() else [Path.cwd() / p, REPO_ROOT / p]):
        if candidate.is_file():
            return candidate.resolve()
    raise SpectuneError(f"workload.path={path!r}: no such file (relative paths: current directory, then "
                        f"{REPO_ROOT})")


def check_jsonl(path: Path, text_field: str) -> int:
    """Validate every line before Arrow sees it; returns the number of records."""
    count = 0
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise SpectuneError(f"{path}:{lineno}: malformed JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise SpectuneError(f"{path}:{lineno}: expected an object with a string field {text_field!r}")
            count += 1
    if count == 0:
        raise SpectuneError(f"{path}: no prompts in the file")
    return count


def read_jsonl(path: Path, text_field: str) -> list[tuple[str, str]]:
    """[(id, text)] from a JSONL file via datasets.load_dataset("json")."""
    from datasets import load_dataset  # imported lazily: a second or so

    check_jsonl(path, text_field)
    ds = load_dataset("json", data_files=str(path), split="train")
    ids = ds["id"] if "id" in ds.column_names else [f"{path.stem}-{i:04d}" for i in range(len(ds))]
    return [(str(i), t) for i, t in zip(ids, ds[text_field], strict=True)]


def read_hf(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """[(id, text)] from any `datasets` dataset; a one-line error when offline and not cached."""
    from datasets import load_dataset

    from harness.models.loading import _hub_unreachable

    path, text_field = spec.get("path"), spec.get("field") or "prompt"
    if not path:
        raise SpectuneError("workload.path is required with workload.source=hf (a dataset name or directory)")
    local = Path(os.path.expanduser(str(path))).exists()
    if not local and not os.environ.get("HF_HUB_OFFLINE") and not os.environ.get("HF_DATASETS_OFFLINE"):
        reason = _hub_unreachable()
        if reason is not None:
            raise SpectuneError(f"cannot load dataset {path!r}: the hub is unreachable ({reason}); "
                                f"set HF_DATASETS_OFFLINE=1 to use a cached copy")
    try:
        ds = load_dataset(str(path), spec.get("subset"), split=spec.get("split") or "train")
    except Exception as err:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError…)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SpectuneError(f"cannot load dataset {path!r} (subset={spec.get('subset')!r}, "
                            f"split={spec.get('split')!r}): {first}") from None
    if text_field not in ds.column_names:
        raise SpectuneError(f"dataset {path!r} has no column {text_field!r}: columns are {ds.column_names}")
    ids = ds["id"] if "id" in ds.column_names else [f"{Path(str(path)).name}-{i:05d}" for i in range(len(ds))]
    return [(str(i), str(t)) for i, t in zip(ids, ds[text_field], strict=True)]


def _positive_int(spec: dict, key: str, allow_null: bool = False) -> int | None:
    value = spec.get(key)
    if value is None and allow_null:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpectuneError(f"workload.{key}={value!r} is invalid: must be an integer >= 1"
                            + (" or null (all)" if allow_null else ""))
    return value


def _band(spec: dict) -> tuple[int, int] | None:
    band = spec.get("prompt_tokens")
    if band is None:
        return None
    ok = isinstance(band, list | tuple) and len(band) == 2 and all(isinstance(b, int) for b in band)
    if not ok or not 1 <= band[0] <= band[1]:
        raise SpectuneError(f"workload.prompt_tokens={band!r} is invalid: [min, max] tokens or null")
    return int(band[0]), int(band[1])


def load_workload(workload_cfg: DictConfig | dict, tokenizer: Any) -> Workload:
    """Read, tokenise, filter to the length band, shuffle (seeded) and cut to ``num_prompts``."""
    spec = OmegaConf.to_container(workload_cfg, resolve=True) if isinstance(workload_cfg, DictConfig) \
        else dict(workload_cfg)
    if not spec:
        raise SpectuneError("no workload given: add +workload=it|en|zh|es|mix")
    name, language = str(spec.get("name", "custom")), str(spec.get("language", "unknown"))
    num = _positive_int(spec, "num_prompts", allow_null=True)
    max_new = _positive_int(spec, "max_new_tokens")
    seed = spec.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SpectuneError(f"workload.seed={seed!r} is invalid: must be an integer")
    sampling_spec = spec.get("sampling") or {}
    unknown = set(sampling_spec) - {"temperature", "top_k", "top_p"}
    if unknown:
        raise SpectuneError(f"workload.sampling has unknown keys {sorted(unknown)}: use temperature, top_k, top_p")
    sampling = SamplingParams(**sampling_spec)
    band = _band(spec)
    source = str(spec.get("source", "jsonl"))
    text_field = spec.get("field") or "prompt"

    groups: list[tuple[str, list[tuple[str, str]]]]  # (language, records)
    if source == "jsonl":
        path = resolve_path(spec.get("path") or "")
        groups = [(language, read_jsonl(path, text_field))]
        src = {"source": "jsonl", "path": str(path), "field": text_field}
    elif source == "hf":
        groups = [(language, read_hf(spec))]
        src = {"source": "hf", **{k: spec.get(k) for k in ("path", "subset", "split", "field")}}
    elif source == "mix":
        langs = spec.get("languages") or []
        if not langs:
            raise SpectuneError("workload.languages is required with workload.source=mix")
        groups = [(lang, read_jsonl(resolve_path(str(BUNDLED / f"{lang}.jsonl")), "prompt")) for lang in langs]
        src = {"source": "mix", "languages": list(langs)}
    else:
        raise SpectuneError(f"workload.source={source!r} is invalid: choose jsonl, hf or mix")

    rng = random.Random(seed)
    per_language: list[list[Prompt]] = []
    dropped = 0
    for lang, records in groups:
        prompts = []
        for pid, text in records:
            ids = list(tokenizer(text)["input_ids"])
            if band is not None and not band[0] <= len(ids) <= band[1]:
                dropped += 1
                continue
            prompts.append(Prompt(id=pid, text=text, input_ids=ids, language=lang))
        if spec.get("shuffle", True):
            rng.shuffle(prompts)
        per_language.append(prompts)
    # Interleave languages (a mix gets equal shares of every prefix); a single group is unchanged.
    merged = [p for row in _zip_longest(per_language) for p in row]
    if num is not None and num > len(merged):
        raise SpectuneError(f"workload.num_prompts={num} but only {len(merged)} prompts are available"
                            + (f" ({dropped} outside prompt_tokens={list(band)})" if dropped and band else ""))
    src.update(available=len(merged), dropped_by_length=dropped, prompt_tokens_band=list(band) if band else None)
    return Workload(name=name, language=language, prompts=merged[:num] if num else merged,
                    max_new_tokens=int(max_new), sampling=sampling, seed=seed, source=src)


def _zip_longest(groups: list[list[Prompt]]) -> list[list[Prompt]]:
    longest = max((len(g) for g in groups), default=0)
    return [[g[i] for g in groups if i < len(g)] for i in range(longest)]
