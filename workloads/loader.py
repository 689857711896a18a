"""Workloads: which prompts, how many new tokens, which sampling law, which seed.

``+workload=it|en|zh|es|mix`` picks a bundled set (``conf/workload/*.yaml``). Sources:

- ``jsonl``: a JSON-lines file with one object per line and a text field (``field``, default
  ``prompt``; ``id`` optional). Bundled sets are such files. Point any workload at your own file with
  ``+workload=en 'workload.categories=[chat-lines]' workload.path=/my/prompts.jsonl`` (relative paths: the current
  directory first, then the repo root; set ``workload.language`` and ``workload.prompt_tokens=null`` as needed).
- ``hf``: ``datasets.load_dataset(path, subset, split=split)`` and the column ``field`` — any hub or local
  dataset (``+workload=en 'workload.categories=[chat-lines]' workload.source=hf workload.path=... workload.split=test
  workload.field=text``).
  The dataset config name is the key ``subset`` because ``name`` is the workload's own name.
- ``mix``: the bundled files of ``languages``, interleaved so every language gets an equal share.

Categories (:mod:`workloads.categories`): ``workload.categories`` picks what the prompts ask for. ``chat-lines``
is the prompts of ``source`` above (the bundled chat-line files, or the user's: only this category reads them), the
default of every task but the bench (the main job: the six built categories, ``conf/task/bench.yaml``); ``chat``,
``summarise``, ``qa``, ``translate``, ``rewrite`` and ``code`` are the categories built in ``workloads/tasks/`` in
the workload's language(s): ``+workload=it 'workload.categories=[summarise,qa]'``. Several categories (and
languages) are interleaved so that every prefix of the workload holds each (language, category) in equal shares,
each shuffled with the seed (with several categories, each group is cut to the size of the smallest).
Built categories' prompts are cut to ``task_prompt_tokens`` counted on what the target is fed (rendered through its chat
template when it has one; null = the profile's band) and answer up to ``task_max_new_tokens`` tokens (null =
the profile's budget: 256 long, 128 short); ``max_new_tokens`` is the chat lines' own (a workload with any built
category uses that budget for every prompt). ``ignore_eos: true`` runs every answer to that budget, as vLLM's and
SGLang's serving benchmarks can: under sampling each method draws its own answers, so their lengths differ between
methods unless they are fixed (where each row of a batch finishes still differs: docs/benchmarking.md).

JSONL files are read line by line with the standard library: a malformed line, bytes that are not UTF-8, a
record without its text or an empty text are reported by file and line number (Arrow's JSON reader, used here
before, failed on mixed column types and very long lines with multi-line errors). Every setting comes from the
workload's YAML (``conf/workload/_bundled.yaml`` holds the defaults); a missing key is a one-line error.

Chat templates: instruct models are benchmarked on prompts rendered through their tokenizer's chat template
(one user turn plus the generation prompt), as serving benchmarks do. ``chat_template: auto`` renders when
the tokenizer has a template, ``true`` requires one, ``false`` feeds the raw text. The length band
(``prompt_tokens``) is applied to the raw text's tokens either way, so the same prompts are chosen (and the
same seeded shuffle holds them) whether or not they are rendered.
"""

from __future__ import annotations

import json
import os
import random
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from spectune.errors import SpectuneError
from spectune.sampling import SamplingParams
from workloads.categories import CHAT_LINES, CategorySelection, category_languages, category_records, check_categories
from workloads.regimes import Regimes, assign, read_regimes

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLED = REPO_ROOT / "workloads" / "prompts"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    input_ids: list[int]
    language: str
    category: str = CHAT_LINES  # what the prompt asks for (workloads.categories); records carry it
    split: str | None = None  # train / select / evaluate for the built categories; None for chat lines
    sampling: SamplingParams | None = None  # its own settings, from a sampling mix (None: the workload's)
    phase: str | None = None  # the workload phase it runs in (workloads.regimes; None: no phases)


@dataclass
class Workload:
    """A list of tokenised prompts plus the generation settings every engine run must share."""

    name: str
    language: str
    prompts: list[Prompt]
    max_new_tokens: int
    sampling: SamplingParams
    seed: int
    ignore_eos: bool = False  # every answer runs to max_new_tokens (EOS does not end it)
    source: dict[str, Any] = field(default_factory=dict)
    chat_template: dict[str, Any] = field(default_factory=dict)  # the setting and whether it was applied
    regimes: Regimes = field(default_factory=Regimes)  # per-request sampling mix and phases (workloads.regimes)

    def describe(self) -> dict[str, Any]:
        """Metadata for result files: source, settings and the prompt-length distribution in tokens."""
        out: dict[str, Any] = {
            "name": self.name, "language": self.language, "source": self.source,
            "num_prompts": len(self.prompts), "max_new_tokens": self.max_new_tokens, "ignore_eos": self.ignore_eos,
            "sampling": {"temperature": self.sampling.temperature, "top_k": self.sampling.top_k,
                         "top_p": self.sampling.top_p},
            "seed": self.seed, "prompt_tokens": length_stats([len(p.input_ids) for p in self.prompts]),
            "chat_template": self.chat_template, **self.regimes.describe(),
        }
        for key, attr in (("language", "language"), ("category", "category")):
            values = list(dict.fromkeys(getattr(p, attr) for p in self.prompts))
            values = sorted(values) if key == "language" else values  # categories in workload order
            if len(values) > 1:
                out[f"prompt_tokens_by_{key}"] = {
                    v: length_stats([len(p.input_ids) for p in self.prompts if getattr(p, attr) == v])
                    for v in values}
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


def read_jsonl(path: Path, text_field: str) -> list[tuple[str, str]]:
    """[(id, text)] from a JSON-lines file, each line checked: a bad one fails in one line naming file:line."""
    records: list[tuple[str, str]] = []
    try:
        handle = path.open("rb")
    except OSError as err:
        raise SpectuneError(f"workload.path={str(path)!r}: cannot read it ({err.strerror})") from None
    with handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise SpectuneError(f"{path}:{lineno}: not UTF-8 text (byte {raw[err.start]:#04x} at column "
                                    f"{err.start + 1}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise SpectuneError(f"{path}:{lineno}: malformed JSON ({err.msg} at column {err.colno})") from None
            except RecursionError:
                raise SpectuneError(f"{path}:{lineno}: malformed JSON (nested too deeply)") from None
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise SpectuneError(f"{path}:{lineno}: expected an object with a string field {text_field!r}")
            text = record[text_field]
            if not text.strip():
                raise SpectuneError(f"{path}:{lineno}: the {text_field!r} text is empty")
            if not _is_unicode(text):
                raise SpectuneError(f"{path}:{lineno}: the {text_field!r} text holds an unpaired surrogate "
                                    "escape (\\ud800-\\udfff), which is not a character")
            pid = record.get("id")
            records.append((f"{path.stem}-{len(records):04d}" if pid is None else str(pid), text))
    if not records:
        raise SpectuneError(f"{path}: no prompts in the file")
    return records


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_hf(spec: dict[str, Any], text_field: str) -> list[tuple[str, str]]:
    """[(id, text)] from any `datasets` dataset; a one-line error when offline and not cached."""
    from datasets import load_dataset

    from spectune.models.loading import hub_unreachable

    path, subset, split = _require(spec, "path"), _require(spec, "subset"), _text(spec, "split")
    if not path or not isinstance(path, str):
        raise SpectuneError("workload.path is required with workload.source=hf (a dataset name or directory)")
    local = Path(os.path.expanduser(str(path))).exists()
    if not local and not os.environ.get("HF_HUB_OFFLINE") and not os.environ.get("HF_DATASETS_OFFLINE"):
        reason = hub_unreachable()
        if reason is not None:
            raise SpectuneError(f"cannot load dataset {path!r}: the hub is unreachable ({reason}); "
                                f"set HF_DATASETS_OFFLINE=1 to use a cached copy")
    try:
        ds = load_dataset(path, subset, split=split)
    except Exception as err:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError…)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SpectuneError(f"cannot load dataset {path!r} (subset={subset!r}, split={split!r}): {first}") from None
    if text_field not in ds.column_names:
        raise SpectuneError(f"dataset {path!r} has no column {text_field!r}: columns are {ds.column_names}")
    ids = ds["id"] if "id" in ds.column_names else [f"{Path(str(path)).name}-{i:05d}" for i in range(len(ds))]
    return [(str(i), str(t)) for i, t in zip(ids, ds[text_field], strict=True)]


_MISSING = object()


def _require(spec: dict[str, Any], key: str) -> Any:
    """A workload key every workload carries (its default lives in conf/workload/_bundled.yaml, nowhere else)."""
    value = spec.get(key, _MISSING)
    if value is _MISSING:
        raise SpectuneError(f"workload.{key} is missing: every workload sets it (defaults in "
                            "conf/workload/_bundled.yaml)")
    return value


def _text(spec: dict[str, Any], key: str, allow_null: bool = False) -> str | None:
    value = _require(spec, key)
    if value is None and allow_null:
        return None
    if not isinstance(value, str) or not value:
        raise SpectuneError(f"workload.{key}={value!r} is invalid: must be a non-empty string"
                            + (" or null" if allow_null else ""))
    return value


def _positive_int(spec: dict, key: str, allow_null: bool = False) -> int | None:
    value = _require(spec, key)
    if value is None and allow_null:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpectuneError(f"workload.{key}={value!r} is invalid: must be an integer >= 1"
                            + (" or null (all)" if allow_null else ""))
    return value


def _band(spec: dict) -> tuple[int, int] | None:
    band = _require(spec, "prompt_tokens")
    if band is None:
        return None
    ok = (isinstance(band, list | tuple) and len(band) == 2
          and all(isinstance(b, int) and not isinstance(b, bool) for b in band))
    if not ok or not 1 <= band[0] <= band[1]:
        raise SpectuneError(f"workload.prompt_tokens={band!r} is invalid: [min, max] tokens or null")
    return int(band[0]), int(band[1])


def _sampling(spec: dict[str, Any]) -> SamplingParams:
    """The sampling law; its values are validated by SamplingParams (one place for that concern)."""
    node = _require(spec, "sampling")
    keys = {"temperature", "top_k", "top_p"}
    if not isinstance(node, dict) or set(node) != keys:
        raise SpectuneError(f"workload.sampling={node!r} is invalid: give exactly temperature, top_k and top_p")
    return SamplingParams(**node)


def chat_template_use(setting: Any, tokenizer: Any) -> bool:
    """Whether prompts are rendered: ``auto`` when the tokenizer has a chat template; ``true`` requires one."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if setting == "auto":
        return has
    if not isinstance(setting, bool):
        raise SpectuneError(f"workload.chat_template={setting!r} is invalid: choose auto, true or false")
    if setting and not has:
        raise SpectuneError("workload.chat_template=true but the target's tokenizer has no chat template; "
                            "use auto or false")
    return setting


def render(tokenizer: Any, text: str | list[dict[str, str]]) -> list[int]:
    """Token ids of ``text`` as one user turn (or of a conversation, a list of ``{"role", "content"}`` turns)
    through the tokenizer's chat template, ready for the reply."""
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else text
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return [int(i) for i in ids]


def load_workload(workload_cfg: DictConfig | dict, tokenizer: Any) -> Workload:
    """Read, tokenise, filter to the length band, shuffle (seeded) and cut to ``num_prompts``."""
    try:
        spec = OmegaConf.to_container(workload_cfg, resolve=True) if isinstance(workload_cfg, DictConfig) \
            else dict(workload_cfg)
    except OmegaConfBaseException as err:  # e.g. an override with an interpolation that does not resolve
        raise SpectuneError(f"workload is invalid: {str(err).strip().splitlines()[0]}") from None
    if not spec:
        raise SpectuneError("no workload given: add +workload=it|en|zh|es|mix")
    name, language = _text(spec, "name"), _text(spec, "language")
    num = _positive_int(spec, "num_prompts", allow_null=True)
    max_new = _positive_int(spec, "max_new_tokens")
    seed = _require(spec, "seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SpectuneError(f"workload.seed={seed!r} is invalid: must be an integer")
    shuffle = _require(spec, "shuffle")
    if not isinstance(shuffle, bool):
        raise SpectuneError(f"workload.shuffle={shuffle!r} is invalid: must be true or false")
    ignore_eos = spec.get("ignore_eos", False)  # optional: a hand-built spec may leave it out
    if not isinstance(ignore_eos, bool):
        raise SpectuneError(f"workload.ignore_eos={ignore_eos!r} is invalid: must be true or false")
    sampling = _sampling(spec)
    band = _band(spec)
    source = _require(spec, "source")
    text_field = _text(spec, "field")
    template_setting = _require(spec, "chat_template")
    templated = chat_template_use(template_setting, tokenizer)

    for key in ("categories", "profile", "splits", "task_prompt_tokens", "task_max_new_tokens"):
        _require(spec, key)
    sel = check_categories(spec)  # names, profile, splits, a prompt in the band for each category: no tokenizer needed
    regimes = read_regimes(spec, sampling, sel.categories)

    lines: dict[str, list[tuple[str, str]]] = {}  # the chat-line prompts by language
    src: dict[str, Any] = {}
    if CHAT_LINES in sel.categories:
        lines, src = _chat_lines(spec, source, language, text_field)
    langs = list(lines) if CHAT_LINES in sel.categories else list(category_languages(spec))
    groups: list[_Group] = []  # (language, category) in round order: languages, then categories as listed
    for lang in langs:
        for category in sel.categories:
            if category == CHAT_LINES:
                groups.append(_Group(lang, category, [(pid, text, None, None) for pid, text in lines[lang]]))
            else:
                groups.append(_Group(lang, category, [(r["id"], r["prompt"], r.get("messages"), r["split"])
                                                      for r in category_records(lang, category, sel)]))
    src["categories"] = list(sel.categories)
    if sel.built:
        src.update(profile=sel.profile, splits=list(sel.splits), task_prompt_tokens_band=list(sel.band))
        max_new = sel.max_new_tokens or max(
            r["max_new_tokens"] for lang in langs for c in sel.built for r in category_records(lang, c, sel))

    rng = random.Random(seed)
    per_group: list[list[Prompt]] = []
    dropped = 0
    for group in groups:
        prompts = _tokenise(group, tokenizer, templated, band, sel)
        dropped += len(group.records) - len(prompts)
        if not prompts and group.category != CHAT_LINES:
            raise SpectuneError(f"workload.categories: {group.category} ({group.language}) yields no prompt in the "
                                f"band {list(sel.band)} once tokenised for this target (task_prompt_tokens counts what "
                                "the target is fed); widen workload.task_prompt_tokens")
        if shuffle:
            rng.shuffle(prompts)
        per_group.append(prompts)
    if len(sel.categories) > 1:  # several: every group cut to the shortest, so that every prefix has equal shares
        shortest = min(len(g) for g in per_group)
        per_group = [g[:shortest] for g in per_group]
    # Interleave the groups (languages x categories): round i holds the i-th prompt of each; one group is unchanged.
    merged = [p for row in _zip_longest(per_group) for p in row]
    if num is not None and num > len(merged):
        raise SpectuneError(f"workload.num_prompts={num} but only {len(merged)} prompts are available"
                            + (f" ({dropped} outside the token band)" if dropped else "")
                            + (" (several categories: each as many as the one with fewest)" if len(sel.categories) > 1
                               else ""))
    src.update(available=len(merged), dropped_by_length=dropped, prompt_tokens_band=list(band) if band else None)
    chosen = [replace(merged[a.index], sampling=a.sampling, phase=a.phase)
              for a in assign([p.category for p in merged], regimes, int(max_new), seed, num)]
    return Workload(name=name, language=language, prompts=chosen, max_new_tokens=int(max_new), sampling=sampling,
                    seed=seed, ignore_eos=ignore_eos, source=src,
                    chat_template={"setting": template_setting, "applied": templated}, regimes=regimes)


@dataclass
class _Group:
    language: str
    category: str
    records: list[tuple[str, str, list[dict[str, str]] | None, str | None]]  # (id, text, turns, split)


def _chat_lines(spec: dict[str, Any], source: Any, language: str,
                text_field: str) -> tuple[dict[str, list[tuple[str, str]]], dict[str, Any]]:
    """The prompts of ``source`` (the chat-lines category) by language, and the source's description."""
    if source == "jsonl":
        path = resolve_path(_text(spec, "path"))
        return {language: read_jsonl(path, text_field)}, {"source": "jsonl", "path": str(path), "field": text_field}
    if source == "hf":
        return ({language: read_hf(spec, text_field)},
                {"source": "hf", **{k: spec.get(k) for k in ("path", "subset", "split", "field")}})
    if source == "mix":
        langs = spec.get("languages")
        if not (isinstance(langs, list) and langs and all(isinstance(x, str) and x for x in langs)):
            raise SpectuneError(f"workload.languages={langs!r} is invalid with workload.source=mix: "
                                "a list of bundled languages (it, en, zh, es)")
        unknown = [x for x in langs if not (BUNDLED / f"{x}.jsonl").is_file()]
        if unknown:
            raise SpectuneError(f"workload.languages has {unknown[0]!r}, which is not bundled: choose from "
                                f"{', '.join(sorted(f.stem for f in BUNDLED.glob('*.jsonl')))}")
        return ({lang: read_jsonl(resolve_path(str(BUNDLED / f"{lang}.jsonl")), "prompt") for lang in langs},
                {"source": "mix", "languages": list(langs)})
    raise SpectuneError(f"workload.source={source!r} is invalid: choose jsonl, hf or mix")


def _tokenise(group: _Group, tokenizer: Any, templated: bool, band: tuple[int, int] | None,
              sel: CategorySelection) -> list[Prompt]:
    """The group's prompts in the length band. Chat lines: ``band`` on the raw text's tokens (the same prompts
    whether rendered or not); built categories' prompts: ``sel.band`` on the tokens the target is fed."""
    prompts = []
    for pid, text, turns, split in group.records:
        ids = list(tokenizer(text)["input_ids"])
        if not ids:
            raise SpectuneError(f"prompt {pid!r} is empty once tokenised: a request needs at least one token")
        if group.category == CHAT_LINES:
            if band is not None and not band[0] <= len(ids) <= band[1]:
                continue
            if templated:
                ids = render(tokenizer, text)
        else:
            if templated:
                ids = render(tokenizer, turns or text)
            if not sel.band[0] <= len(ids) <= sel.band[1]:
                continue
        prompts.append(Prompt(id=pid, text=text, input_ids=ids, language=group.language, category=group.category,
                              split=split))
    return prompts


def _zip_longest(groups: list[list[Prompt]]) -> list[list[Prompt]]:
    """Round i: the i-th prompt of every group that has one, in group order."""
    longest = max((len(g) for g in groups), default=0)
    return [[g[i] for g in groups if i < len(g)] for i in range(longest)]
