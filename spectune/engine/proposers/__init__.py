"""What drafts, by config name: ``proposer=<name>`` is ``conf/proposer/<name>.yaml`` and one module of this package.

A proposer's module declares one :class:`~spectune.engine.proposers.base.ProposerEntry`
(``PROPOSER = ProposerEntry(name="<name>", ...)``): its settings schema and their check, whether it needs the pair's
draft model or the workload's training prompts, how it builds its draft, and what the exporters and the results
index say of it. The catalogue finds the entries by reading this package's source and imports only the module of
the one asked for (:func:`register_schemas` imports them all: none imports torch). Everything else in the library
asks this registry; nothing else names a proposer.

The other modules hold what the proposers share, one role each: ``ngram.py`` (the n-gram search), ``suffix_tree.py``
(suffix tries and their rule), ``chain.py`` (the proposer of every model-free draft), ``replay.py`` (a model-free
draft replayed offline from greedy outputs). The protocol the session calls is ``spectune/engine/proposer.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from spectune.engine.proposers.base import DraftSources, ProposerEntry
from spectune.errors import SpectuneError
from spectune.vllm_export import VllmMethod

HERE = Path(__file__).resolve().parent
CONF = HERE.parents[2] / "conf" / "proposer"  # each proposer's values: conf/proposer/<name>.yaml
DEFAULT = "model"  # what drafts where no proposer is configured (conf/config.yaml's default): the pair's draft model

__all__ = ["DEFAULT", "DraftSources", "ProposerEntry", "check", "entry", "entry_of", "label", "names",
           "needs_draft_model", "register_schemas", "settings_of", "vllm_method"]


@cache
def _locations() -> dict[str, str]:
    """Config name -> module of every entry of this package (read, not imported)."""
    found: dict[str, str] = {}
    for path in sorted(HERE.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["PROPOSER"]
                    and isinstance(node.value, ast.Call)):
                continue
            named = [k.value for k in node.value.keywords if k.arg == "name"]
            if not (named and isinstance(named[0], ast.Constant) and isinstance(named[0].value, str)):
                raise SpectuneError(f"{path.name}: PROPOSER = ProposerEntry(name=\"...\", ...) needs its name as a "
                                    "literal string (the catalogue reads it without importing the module)")
            name = named[0].value
            if name in found:
                raise SpectuneError(f"two proposers are named {name!r}: {found[name]} and {path.stem}")
            found[name] = f"{__package__}.{path.stem}"
    return found


def names() -> list[str]:
    """Every proposer's config name: the default first, then the others by name."""
    return sorted(_locations(), key=lambda name: (name != DEFAULT, name))


def entry(name: str) -> ProposerEntry:
    """The entry of proposer ``name`` (its module imported); an unknown name fails in one line naming the known."""
    if name not in _locations():
        raise SpectuneError(f"proposer={name!r} is unknown: choose one of {', '.join(names())}")
    declared = importlib.import_module(_locations()[name]).PROPOSER
    assert declared.name == name, (declared.name, name)
    return declared


def entry_of(node: Mapping[str, Any] | None) -> ProposerEntry:
    """The entry a proposer node names (None, or a node without a name: the default)."""
    return entry(str((node or {}).get("name") or DEFAULT))


def settings_of(node: Mapping[str, Any] | None) -> tuple[ProposerEntry, Any]:
    """A proposer node (a composed ``proposer`` node, or a caller's mapping) read through its entry's settings and
    checked: an unknown name or setting, or a value out of range, fails in one line naming the allowed. A caller's
    mapping may leave settings out: they take conf/proposer/<name>.yaml's values, as composing would."""
    values = {key: node[key] for key in node} if node else {}
    found = entry_of(values)
    values["name"] = found.name
    fields = {item.name: item for item in dataclasses.fields(found.settings)}
    if unknown := sorted(set(values) - set(fields)):
        settings = sorted(set(fields) - {"name"})
        raise SpectuneError(f"proposer.{unknown[0]} is not a setting of proposer={found.name}: "
                            f"its settings are {', '.join(settings) or 'none'}")
    if set(fields) - set(values):
        values = {**file_values(found.name), **values}
    hints = typing.get_type_hints(found.settings)
    settings = found.settings(**{key: _as(hints[key], values[key], f"proposer.{key}") for key in fields})
    settings.check()
    return found, settings


def check(node: Mapping[str, Any] | None) -> None:
    """The configured proposer's settings, checked before any model loads (the front doors call this)."""
    settings_of(node)


def file_values(name: str) -> dict[str, Any]:
    """conf/proposer/<name>.yaml's values (its defaults list left out)."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))
    values.pop("defaults", None)
    return values


def _as(hint: Any, value: Any, key: str) -> Any:
    """An enum setting given by its name (a caller's plain mapping, a recorded run) as the enum's member."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum) and isinstance(value, str):
        if value not in hint.__members__:
            raise SpectuneError(f"{key}={value!r} is invalid: must be one of {', '.join(hint.__members__)}")
        return hint[value]
    return value


def needs_draft_model(node: Mapping[str, Any] | None = None) -> bool:
    """Whether the configured proposer (None: the default) drafts with the pair's draft model, so it must load."""
    return entry_of(node).needs_draft_model


def vllm_method(node: Mapping[str, Any] | None, draft_name: str | None) -> VllmMethod | None:
    """vLLM's method and keys for what a run's recorded ``proposer`` node drafted (None: the pair's draft model,
    ``draft_name``); None where vLLM has no such method."""
    found = entry_of(node)
    return found.vllm(dict(node or {}), draft_name) if found.vllm is not None else None


def label(node: Mapping[str, Any] | None, models: Mapping[str, Any]) -> str:
    """How a results index names what a run drafted (its recorded ``proposer`` node and ``models`` metadata); a
    proposer this version does not know is named as recorded."""
    name = str((node or {}).get("name") or DEFAULT)
    if name not in _locations():
        return f"proposer {name}"
    return entry(name).label(dict(node or {}), models)


def register_schemas() -> None:
    """Store every proposer's settings as /schema/proposer/<name>, where conf/proposer/<name>.yaml names it
    (:mod:`spectune.config`); every application's ``register`` calls this beside :func:`spectune.config.register`."""
    from spectune.config import store

    for name in names():
        store(f"proposer/{name}", entry(name).settings)
