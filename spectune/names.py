"""One name per idea, and the readers of what was written under the names ideas had before.

The number of tokens drafted in a cycle (chosen, fixed, or drafted so far) is ``gamma`` (γ), its ceiling
``max_gamma``, a list of them ``gammas``; names built on it follow (``mean_gamma``, ``best_fixed_gamma``, ...).
Until 2026-12-05 the same quantity was also called ``depth`` (``max_depth``, ``mean_depth``, ``depth.zip``, the
policy kind ``"depth"``, ...). What was written then — run directories, traces, profiles, policy files, configs
recorded in metadata — still reads: the readers (:mod:`spectune.run.rundir`'s, ``policies.envs.data.read_traces``,
``spectune.costmodel.profile``'s, ``policies.sb3_files.read_policy_file``) pass what they read through :func:`upgrade`
(JSON objects, policy files' ``spectune.json``) or :func:`upgrade_frame` (tables), which rename the old names
listed here and leave everything else alone: a file written with the new names passes through unchanged, and
applying them twice is applying them once.

What a prompt asks for (chat, summarise, qa, translate, rewrite, code, or the dialogue lines ``chat-lines``) is
its ``category``; ``task`` is the job a run does (``task=bench``). Until 2026-12-06 the category was also called a
task: ``workload.tasks``, the records' ``task`` column, ``by_task.parquet``, ``summary.json``'s ``by_task`` and
``answers_by_task``, ``acceptance.json``'s ``alpha_by_task``. Those read through the same two functions: the JSON
keys and files are in the maps below, the ``task`` column of a table is in :data:`COLUMNS`, and the ``task`` key of
a per-category row (a JSON object's list of rows, under a key of :data:`ROW_KEYS`) is renamed there only: a run's
own ``"task": "bench"`` stays what it is.

This module is the whole mapping, old → new: :data:`KEYS` (JSON keys, table columns, config keys at any level),
:data:`COLUMNS` (table columns only), :data:`ROW_KEYS` (the keys of the rows under a JSON key), :data:`VALUES`
(string values that named the draft length: the cycle policy's ``actions``, an observation's ``kind``, the curves'
``policy``), :data:`FILES` (a run directory's file names) and :data:`CONFIG_KEYS` (the command-line keys, for the
one-line error an old key gets, with :func:`renamed_why`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

# JSON keys and table columns (at any level of a JSON object; columns of traces, curves, tuning tables).
GAMMA_KEYS: dict[str, str] = {
    "max_depth": "max_gamma",  # the ceiling: traces' column and metadata, task/train configs, policy files
    "mean_depth": "mean_gamma",  # replay scores, curves, validation records
    "best_fixed_depth": "best_fixed_gamma",
    "fixed_depth": "fixed_gamma",
    "calibrate_per_depth": "calibrate_per_gamma",  # train config
    "per_depth": "per_gamma",  # a calibrated profile's fit
    "per_depth_shift_ms": "per_gamma_shift_ms",
    "per_depth_shift_pct": "per_gamma_shift_pct",
    "beta_per_depth_scale": "beta_per_gamma_scale",
    "feature_depth": "feature_max_gamma",  # task=acceptance's config and acceptance.json
    "depth_path": "gamma_path",  # policy=ppo / ppo-distilled config
    "reference_depth": "reference_gamma",  # a replay table's attrs
    "hindsight_depth": "hindsight_gamma",
}
CATEGORY_KEYS: dict[str, str] = {
    "tasks": "categories",  # workload.tasks, a phase's tasks, a workload's recorded source
    "by_task": "by_category",  # summary.json (bench, tune's cells), prediction.json
    "answers_by_task": "answers_by_category",
    "alpha_by_task": "alpha_by_category",  # acceptance.json
    "prompt_tokens_by_task": "prompt_tokens_by_category",  # a workload's recorded source
}
KEYS: dict[str, str] = {**GAMMA_KEYS, **CATEGORY_KEYS}
# Table columns only: in a table ``task`` is always the category (requests, by_task, prediction).
COLUMNS: dict[str, str] = {"task": "category"}
# The keys of each row (a JSON object) of the list under a key: per-category rows named their category ``task``.
ROW_KEYS: dict[str, dict[str, str]] = {
    "by_category": COLUMNS, "answers_by_category": COLUMNS, "alpha_per_prompt": COLUMNS,
}
# String values that named the draft length, by the key (or column) that holds them.
VALUES: dict[str, dict[str, str]] = {
    "actions": {"depth": "gamma"},  # a cycle policy file: its action is the cycle's γ
    "kind": {"depth": "gamma"},  # a policy file's observation kind (policies.envs.observation.GAMMA)
    "policy": {"depth": "gamma"},  # curves.csv: the per-step γ policy's rows
}
# A run directory's files, by stem: new -> the stem a run written before gave the file (``depth.zip``).
FILES: dict[str, str] = {"gamma": "depth", "by_category": "by_task"}
# Config keys as given on the command line (old -> new).
CONFIG_KEYS: dict[str, str] = {
    "task.max_depth": "task.max_gamma",
    "task.feature_depth": "task.feature_max_gamma",
    "train.max_depth": "train.max_gamma",
    "train.calibrate_per_depth": "train.calibrate_per_gamma",
    "policy.depth_path": "policy.gamma_path",
}
# Why a key was renamed, by the new name's last part (the one-line error an old key gets says it).
WHY: dict[str, str] = {
    **{new: "the draft length is named gamma everywhere" for new in GAMMA_KEYS.values()},
    **{new.rpartition(".")[2]: "the draft length is named gamma everywhere" for new in CONFIG_KEYS.values()},
    **{new: "what a prompt asks for is its category (task= is the job)" for new in CATEGORY_KEYS.values()},
}


def upgrade(value: Any) -> Any:
    """``value`` (a JSON value) with the old names of :data:`KEYS` and :data:`VALUES` replaced by the new ones, at
    every level. Keys that are not old names, and values under other keys, are kept as they are; where an old key
    and its new name are both present (never written by spectune), the new one wins. Returns ``value`` itself when
    nothing was renamed."""
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        changed = False
        for key, item in value.items():
            new_key = KEYS.get(key, key) if isinstance(key, str) else key
            new_item = upgrade(item)
            values = VALUES.get(new_key)
            if values is not None and isinstance(new_item, str) and new_item in values:
                new_item = values[new_item]
            rows = ROW_KEYS.get(new_key)
            if rows is not None and isinstance(new_item, list):
                new_item = _rows(new_item, rows)
            if new_key != key and new_key in value:
                changed = True
                continue  # both spellings: keep the new one's value
            changed = changed or new_key != key or new_item is not item
            out[new_key] = new_item
        return out if changed else value
    if isinstance(value, list):
        items = [upgrade(item) for item in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


def _rows(items: list[Any], keys: Mapping[str, str]) -> list[Any]:
    """``items`` with the keys of each row (a dict) renamed by ``keys``; ``items`` itself when none was."""
    out = [{keys.get(k, k): v for k, v in item.items() if not (k in keys and keys[k] in item)}
           if isinstance(item, Mapping) and any(k in keys for k in item) else item for item in items]
    return out if any(a is not b for a, b in zip(out, items, strict=True)) else items


def current_column(name: str) -> str:
    """A table column's current name (``task`` -> ``category``, ``max_depth`` -> ``max_gamma``)."""
    return COLUMNS.get(name) or KEYS.get(name, name)


def upgrade_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A table (requests, traces, curves, tuning, comparison...) with the old column names of :data:`KEYS` and
    :data:`COLUMNS` and the old values of :data:`VALUES` in their columns renamed; ``frame`` itself when it holds
    none."""
    columns = {c: current_column(c) for c in frame.columns
               if isinstance(c, str) and current_column(c) != c and current_column(c) not in frame.columns}
    values = {c: m for c, m in VALUES.items() if c in frame.columns and frame[c].isin(list(m)).any()}
    if not columns and not values:
        return frame
    out = frame.rename(columns=columns)
    for column, mapping in values.items():
        out[column] = out[column].replace(mapping)
    return out


def run_file(run_dir: Path | str, name: str) -> Path:
    """The path of file ``name`` in ``run_dir``: under the name a run written before gave it (:data:`FILES`) when
    only that one is there."""
    path = Path(run_dir) / name
    old = FILES.get(path.stem)
    if old is not None and not path.is_file() and path.with_stem(old).is_file():
        return path.with_stem(old)
    return path


def renamed_config_key(key: str) -> str | None:
    """The current name of a config key given with its old name (``task.max_depth`` -> ``task.max_gamma``);
    None when ``key`` is no old name."""
    if key in CONFIG_KEYS:
        return CONFIG_KEYS[key]
    head, _, last = key.rpartition(".")
    if last in KEYS:
        return f"{head}.{KEYS[last]}" if head else KEYS[last]
    return None


def renamed_why(new_key: str) -> str:
    """Why a config key has its new name (:func:`renamed_config_key`'s answer), for the one-line error."""
    return WHY.get(new_key.rpartition(".")[2], "it was renamed")
