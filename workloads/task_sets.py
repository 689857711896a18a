"""Task prompt sets: which tasks a workload takes, read from ``workloads/tasks/{lang}.jsonl`` and checked.

``workload.tasks`` lists tasks: ``chat-lines`` (the short dialogue lines of ``workloads/prompts/``, or the user's
own file; the default of every Hydra task but the bench, whose default is the six task sets) and the task sets built
by ``python -m workloads.build.tasks``: ``chat`` (multi-turn), ``summarise``,
``qa`` (questions over given documents), ``translate``, ``rewrite`` (proofread, change the register, make a
list) and ``code`` (edit a function). ``workload.profile`` picks their length profile (``long``: 200–1,500
SmolLM2 tokens as rendered, for instruct targets; ``short``: ≤ 368 tiny-pair tokens, for base models; the
models config's ``prompt_profile`` chooses, ``long`` when it has none) and ``workload.splits`` their splits.

:func:`check_tasks` validates the selection and counts each task's prompts in the token band from the token
counts the files record, before any model loads; :func:`task_records` returns the records to tokenise.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.errors import SpectuneError

TASK_DIR = Path(__file__).resolve().parent / "tasks"
PROMPT_DIR = TASK_DIR.parent / "prompts"  # the bundled chat-line files
CHAT_LINES = "chat-lines"
TASKS = ("chat", "summarise", "qa", "translate", "rewrite", "code")
LANGUAGES = ("it", "en", "zh", "es")
SPLITS = ("train", "select", "evaluate")
COUNTED_BY = {"long": "smollm2", "short": "tiny"}  # the tokenizer whose recorded count the band is checked on


@dataclass(frozen=True)
class TaskSelection:
    """The validated task keys of a workload."""

    tasks: tuple[str, ...]  # in the order given; chat-lines possibly among them
    profile: str
    splits: tuple[str, ...]
    band: tuple[int, int]  # tokens fed to the target (rendered through its chat template when it has one)
    max_new_tokens: int | None  # None: the answer budget the records carry

    @property
    def task_sets(self) -> tuple[str, ...]:
        return tuple(t for t in self.tasks if t != CHAT_LINES)


@functools.cache
def _stats() -> dict[str, Any]:
    path = TASK_DIR / "STATS.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise SpectuneError(f"{path}: cannot read the task sets' summary ({err}); rebuild them with "
                            "`python -m workloads.build.tasks`") from None


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


def selection(spec: dict[str, Any]) -> TaskSelection:
    """The task keys of a workload (``tasks``, ``profile``, ``splits``, ``task_prompt_tokens``,
    ``task_max_new_tokens``), validated; one-line errors naming the bad value and what is allowed."""
    tasks = _names(spec, "tasks", (CHAT_LINES, *TASKS))
    splits = _names(spec, "splits", SPLITS)
    max_new = spec.get("task_max_new_tokens")
    if max_new is not None and (not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1):
        raise SpectuneError(f"workload.task_max_new_tokens={max_new!r} is invalid: an integer >= 1 or null (the "
                            "profile's answer budget)")
    profile, band = spec.get("profile"), spec.get("task_prompt_tokens")
    if tasks == (CHAT_LINES,):  # the profile and its band only matter to the task sets
        return TaskSelection(tasks, str(profile), splits, (1, 1), max_new)
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
    return TaskSelection(tasks, profile, splits, (int(band[0]), int(band[1])), max_new)


def task_languages(spec: dict[str, Any]) -> tuple[str, ...]:
    """The languages whose task files a workload reads: ``languages`` of a mix, else ``language``."""
    key = "languages" if spec.get("source") == "mix" else "language"
    langs = spec.get("languages") if key == "languages" else [spec.get("language")]
    for lang in langs if isinstance(langs, list) and langs else [langs]:
        if lang not in LANGUAGES:
            raise SpectuneError(f"workload.{key} has {lang!r}, which has no task prompt sets: choose from "
                                f"{', '.join(LANGUAGES)}")
    return tuple(langs)


@functools.cache
def read_task_file(lang: str) -> tuple[dict[str, Any], ...]:
    """Every record of ``workloads/tasks/{lang}.jsonl``; a malformed line fails naming file and line."""
    path = TASK_DIR / f"{lang}.jsonl"
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise SpectuneError(f"{path}: cannot read it ({err.strerror}); rebuild the task sets with "
                            "`python -m workloads.build.tasks`") from None
    for lineno, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise SpectuneError(f"{path}:{lineno}: malformed JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or rec.get("task") not in TASKS:
            raise SpectuneError(f"{path}:{lineno}: not a task prompt record (prompt, task, profile, tokens, ...)")
        records.append(rec)
    return tuple(records)


def task_records(lang: str, task: str, sel: TaskSelection) -> list[dict[str, Any]]:
    """The records of one (language, task) in the selection's profile and splits, in file order."""
    return [r for r in read_task_file(lang)
            if r["task"] == task and r["profile"] == sel.profile and r["split"] in sel.splits]


def check_workload(workload_cfg: Any) -> None:
    """:func:`check_tasks` on a workload's config node (a Hydra ``DictConfig`` or a dict): what the applications
    call before they load any model."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        spec = OmegaConf.to_container(workload_cfg, resolve=True) if isinstance(workload_cfg, DictConfig) \
            else dict(workload_cfg)
    except OmegaConfBaseException as err:
        raise SpectuneError(f"workload is invalid: {str(err).strip().splitlines()[0]}") from None
    if spec and "tasks" in spec:
        check_tasks(spec)


def check_own_prompts_read(spec: dict[str, Any], sel: TaskSelection) -> None:
    """``workload.source=hf`` or a ``workload.path`` other than the bundled file are chat-line prompts: only the
    chat-lines task reads them. Without it in ``workload.tasks`` (the main job's default is the task sets) they
    would be ignored in silence; this says so in one line instead."""
    if CHAT_LINES in sel.tasks:
        return
    source, path = spec.get("source"), spec.get("path")
    if source == "hf":
        raise SpectuneError(f"workload.source=hf gives chat-line prompts, which workload.tasks={list(sel.tasks)} "
                            f"does not read: add workload.tasks=[{CHAT_LINES}]")
    if source == "jsonl" and path is not None and not _is_bundled(str(path)):
        raise SpectuneError(f"workload.path={path!r} holds chat-line prompts, which workload.tasks={list(sel.tasks)} "
                            f"does not read: add workload.tasks=[{CHAT_LINES}]")


def _is_bundled(path: str) -> bool:
    """Whether ``path`` (absolute, or relative to the current directory or the repository) is a bundled chat-line
    file (``workloads/prompts/``)."""
    given = Path(path).expanduser()
    candidates = [given] if given.is_absolute() else [Path.cwd() / given, PROMPT_DIR.parents[1] / given]
    return any(c.resolve().parent == PROMPT_DIR.resolve() for c in candidates)


def check_tasks(spec: dict[str, Any]) -> TaskSelection:
    """Validate a workload's task selection; a task with no prompt in the band (by the token counts the files
    record for the profile's reference tokenizer) is a one-line error, and so is a workload that names prompts of
    its own but no task that reads them (:func:`check_own_prompts_read`). Reads no model."""
    sel = selection(spec)
    if not sel.task_sets:
        return sel
    counted = COUNTED_BY.get(sel.profile, "smollm2")
    lo, hi = sel.band
    for lang in task_languages(spec):
        for task in sel.task_sets:
            records = task_records(lang, task, sel)
            counts = [r["tokens"][counted] for r in records]
            if not any(lo <= n <= hi for n in counts):
                have = f"its {len(counts)} prompts have {min(counts)}–{max(counts)} tokens" if counts else \
                    "it has no prompt in these splits"
                raise SpectuneError(f"workload.tasks: {task} ({lang}, profile {sel.profile}, splits "
                                    f"{list(sel.splits)}) yields no prompt in the band {list(sel.band)} ({have})")
    check_own_prompts_read(spec, sel)
    return sel
