"""Prompt categories: what a workload's prompts ask for, read from ``workloads/tasks/{lang}.jsonl`` and checked.

``workload.categories`` lists categories: ``chat-lines`` (the short dialogue lines of ``workloads/prompts/``, or the
user's own file; the default of every Hydra task but the bench, whose default is the six built categories) and the
categories built by ``python -m workloads.build.categories``: ``chat`` (multi-turn), ``summarise``,
``qa`` (questions over given documents), ``translate``, ``rewrite`` (proofread, change the register, make a
list) and ``code`` (edit a function). ``workload.profile`` picks their length profile (``long``: 200–1,500
SmolLM2 tokens as rendered, for instruct targets; ``short``: ≤ 368 tiny-pair tokens, for base models; the
models config's ``prompt_profile`` chooses, ``long`` when it has none) and ``workload.splits`` their splits.

:func:`check_categories` validates the selection and counts each category's prompts in the token band from the token
counts the files record, before any model loads; :func:`category_records` returns the records to tokenise. (The
files' own field for the category is ``task``, as built; what users read says category.)
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.errors import SpectuneError

CATEGORY_DIR = Path(__file__).resolve().parent / "tasks"
PROMPT_DIR = CATEGORY_DIR.parent / "prompts"  # the bundled chat-line files
CHAT_LINES = "chat-lines"
CATEGORIES = ("chat", "summarise", "qa", "translate", "rewrite", "code")  # built; the one definition
LANGUAGES = ("it", "en", "zh", "es")
SPLITS = ("train", "select", "evaluate")
COUNTED_BY = {"long": "smollm2", "short": "tiny"}  # the tokenizer whose recorded count the band is checked on


@dataclass(frozen=True)
class CategorySelection:
    """The validated category keys of a workload."""

    categories: tuple[str, ...]  # in the order given; chat-lines possibly among them
    profile: str
    splits: tuple[str, ...]
    band: tuple[int, int]  # tokens fed to the target (rendered through its chat template when it has one)
    max_new_tokens: int | None  # None: the answer budget the records carry

    @property
    def built(self) -> tuple[str, ...]:
        """The built categories among them (every one but chat-lines)."""
        return tuple(c for c in self.categories if c != CHAT_LINES)


@functools.cache
def _stats() -> dict[str, Any]:
    path = CATEGORY_DIR / "STATS.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise SpectuneError(f"{path}: cannot read the built categories' summary ({err}); rebuild them with "
                            "`python -m workloads.build.categories`") from None


def _names(spec: dict[str, Any], key: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    value = spec.get(key)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not value or not all(isinstance(x, str) for x in value):
        raise SpectuneError(f"workload.{key}={value!r} is invalid: a non-empty list of {', '.join(allowed)}")
    for x in value:
        if x not in allowed:
            raise SpectuneError(f"workload.{key} has {x!r}, which is unknown: choose from {', '.join(allowed)}")
    if len(set(value)) != len(value):
        raise SpectuneError(f"workload.{key}={list(value)!r} names one twice")
    return tuple(value)


def selection(spec: dict[str, Any]) -> CategorySelection:
    """The category keys of a workload (``categories``, ``profile``, ``splits``, ``task_prompt_tokens``,
    ``task_max_new_tokens``), validated; one-line errors naming the bad value and what is allowed."""
    categories = _names(spec, "categories", (CHAT_LINES, *CATEGORIES))
    splits = _names(spec, "splits", SPLITS)
    max_new = spec.get("task_max_new_tokens")
    if max_new is not None and (not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1):
        raise SpectuneError(f"workload.task_max_new_tokens={max_new!r} is invalid: an integer >= 1 or null (the "
                            "profile's answer budget)")
    profile, band = spec.get("profile"), spec.get("task_prompt_tokens")
    if categories == (CHAT_LINES,):  # the profile and its band only matter to the built categories
        return CategorySelection(categories, str(profile), splits, (1, 1), max_new)
    profiles = _stats()["profiles"]
    if profile not in profiles:
        raise SpectuneError(f"workload.profile={profile!r} is invalid: choose {' or '.join(sorted(profiles))}")
    if band is None:
        band = profiles[profile]["band"]
    ok = (isinstance(band, list | tuple) and len(band) == 2
          and all(isinstance(b, int) and not isinstance(b, bool) for b in band) and 1 <= band[0] <= band[1])
    if not ok:
        raise SpectuneError(f"workload.task_prompt_tokens={band!r} is invalid: [min, max] tokens or null (the "
                            "profile's band)")
    return CategorySelection(categories, profile, splits, (int(band[0]), int(band[1])), max_new)


def category_languages(spec: dict[str, Any]) -> tuple[str, ...]:
    """The languages whose category files a workload reads: ``languages`` of a mix, else ``language``."""
    key = "languages" if spec.get("source") == "mix" else "language"
    langs = spec.get("languages") if key == "languages" else [spec.get("language")]
    for lang in langs if isinstance(langs, list) and langs else [langs]:
        if lang not in LANGUAGES:
            raise SpectuneError(f"workload.{key} has {lang!r}, which has no built categories: choose from "
                                f"{', '.join(LANGUAGES)}")
    return tuple(langs)


@functools.cache
def read_category_file(lang: str) -> tuple[dict[str, Any], ...]:
    """Every record of ``workloads/tasks/{lang}.jsonl``; a malformed line fails naming file and line."""
    path = CATEGORY_DIR / f"{lang}.jsonl"
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise SpectuneError(f"{path}: cannot read it ({err.strerror}); rebuild the categories with "
                            "`python -m workloads.build.categories`") from None
    for lineno, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise SpectuneError(f"{path}:{lineno}: malformed JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or rec.get("task") not in CATEGORIES:
            raise SpectuneError(f"{path}:{lineno}: not a category prompt record (prompt, task, profile, tokens, ...)")
        records.append(rec)
    return tuple(records)


def category_records(lang: str, category: str, sel: CategorySelection) -> list[dict[str, Any]]:
    """The records of one (language, category) in the selection's profile and splits, in file order (the files
    name the category ``task``)."""
    return [r for r in read_category_file(lang)
            if r["task"] == category and r["profile"] == sel.profile and r["split"] in sel.splits]


def check_workload(workload_cfg: Any) -> None:
    """:func:`check_categories` on a workload's config node (a Hydra ``DictConfig`` or a dict): what the applications
    call before they load any model."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        spec = OmegaConf.to_container(workload_cfg, resolve=True) if isinstance(workload_cfg, DictConfig) \
            else dict(workload_cfg)
    except OmegaConfBaseException as err:
        raise SpectuneError(f"workload is invalid: {str(err).strip().splitlines()[0]}") from None
    if spec and "categories" in spec:
        check_categories(spec)


def check_own_prompts_read(spec: dict[str, Any], sel: CategorySelection) -> None:
    """``workload.source=hf`` or a ``workload.path`` other than the bundled file are chat-line prompts: only the
    chat-lines category reads them. Without it in ``workload.categories`` (the main job's default is the built ones)
    they would be ignored in silence; this says so in one line instead."""
    if CHAT_LINES in sel.categories:
        return
    source, path = spec.get("source"), spec.get("path")
    if source == "hf":
        raise SpectuneError(f"workload.source=hf gives chat-line prompts, which "
                            f"workload.categories={list(sel.categories)} does not read: add "
                            f"workload.categories=[{CHAT_LINES}]")
    if source == "jsonl" and path is not None and not _is_bundled(str(path)):
        raise SpectuneError(f"workload.path={path!r} holds chat-line prompts, which "
                            f"workload.categories={list(sel.categories)} does not read: add "
                            f"workload.categories=[{CHAT_LINES}]")


def _is_bundled(path: str) -> bool:
    """Whether ``path`` (absolute, or relative to the current directory or the repository) is a bundled chat-line
    file (``workloads/prompts/``)."""
    given = Path(path).expanduser()
    candidates = [given] if given.is_absolute() else [Path.cwd() / given, PROMPT_DIR.parents[1] / given]
    return any(c.resolve().parent == PROMPT_DIR.resolve() for c in candidates)


def check_categories(spec: dict[str, Any]) -> CategorySelection:
    """Validate a workload's category selection; a category with no prompt in the band (by the token counts the files
    record for the profile's reference tokenizer) is a one-line error, and so is a workload that names prompts of
    its own but no category that reads them (:func:`check_own_prompts_read`). Reads no model."""
    sel = selection(spec)
    if not sel.built:
        return sel
    counted = COUNTED_BY.get(sel.profile, "smollm2")
    lo, hi = sel.band
    for lang in category_languages(spec):
        for category in sel.built:
            records = category_records(lang, category, sel)
            counts = [r["tokens"][counted] for r in records]
            if not any(lo <= n <= hi for n in counts):
                have = f"its {len(counts)} prompts have {min(counts)}–{max(counts)} tokens" if counts else \
                    "it has no prompt in these splits"
                raise SpectuneError(f"workload.categories: {category} ({lang}, profile {sel.profile}, splits "
                                    f"{list(sel.splits)}) yields no prompt in the band {list(sel.band)} ({have})")
    check_own_prompts_read(spec, sel)
    return sel
