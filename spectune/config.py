"""Typed configs: the dataclasses that are the schemas of conf/'s YAML files, and OmegaConf's errors in one line.

Each YAML file of a typed group names its schema in its defaults (Hydra's "structured config as a schema for YAML"
pattern), so that Hydra types every key while it composes: a value of the wrong type or a key the schema does not
have fails there, before any job starts, and :func:`one_line` restates OmegaConf's several-line error as the
product's one line (spectune.run.cli). The fields carry no defaults (``MISSING``): the values live in the YAML files
only, the schema adds the types, and the composed config (what ``--cfg job`` prints) is the YAML's, key for key.
The schema comes first (before ``_self_``), so its field order is the keys' order, which each schema keeps as its
file has it; the hardware files list their keys in different orders, and a models file's extra key (a subclass's
field) sits between the common ones, so theirs comes after ``_self_``, where it types the keys without reordering
them (no hardware or models key is a list that could be null, which a schema merged after the values would reset).
A value or a list of values (``gamma=4`` or ``gamma=[1,2]``) is ``Any``: OmegaConf's unions hold scalars only; such
items, ranges and rules across keys are checked in code, where the values are read.

This module holds the library's schemas (the workload, hardware and models groups, and conf/config.yaml's own keys:
:class:`RootConfig`, an open root) and the helpers; the applications keep theirs beside them
(harness/tasks/schemas.py, policies/train/schema.py, policies/evaluate/schema.py) and register them all when their
entry module is imported, before Hydra composes (:func:`register` here, theirs there). A proposer's schema is its
settings dataclass, in its own module: :func:`spectune.engine.proposers.register_schemas` stores them all (this layer
sits below the engine, so the applications call it beside :func:`register`).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf, ValueNode
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from spectune import names
from spectune.errors import SpectuneError

T = TypeVar("T")
SCHEMA_GROUP = "schema"  # conf/ YAML files name their schema as /schema/<name>@_here_ (or /schema/task/<task>@_here_)


# ---- the library's schemas --------------------------------------------------------------------------------

@dataclass
class SamplingConfig:
    """``workload.sampling``: the law every method samples (spectune.sampling checks the ranges)."""

    temperature: float = MISSING
    top_p: float = MISSING
    top_k: int = MISSING


@dataclass
class WorkloadConfig:
    """``workload``: conf/workload/_bundled.yaml and each bundled workload (workloads/loader.py reads them)."""

    source: str = MISSING
    path: str | None = MISSING
    field: str = MISSING
    subset: str | None = MISSING
    split: str = MISSING
    num_prompts: int | None = MISSING
    shuffle: bool = MISSING
    prompt_tokens: list[int] | None = MISSING
    chat_template: str | bool = MISSING  # auto, true or false
    max_new_tokens: int = MISSING
    ignore_eos: bool = MISSING
    categories: Any = MISSING  # a prompt category or a list of them (workloads/categories.py)
    profile: str = MISSING
    splits: Any = MISSING  # a split or a list of them
    task_prompt_tokens: list[int] | None = MISSING
    task_max_new_tokens: int | None = MISSING
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)  # `field` is a key here
    sampling_mix: Any = MISSING  # null or a list of {temperature, share[, top_k, top_p]} (workloads/regimes.py)
    phases: Any = MISSING  # null or a list of phases (workloads/regimes.py checks their keys)
    phase_order: str = MISSING  # listed or shuffled
    seed: int = MISSING
    name: str = MISSING
    language: str = MISSING


@dataclass
class MixWorkloadConfig(WorkloadConfig):
    """``workload=mix``: the bundled workload's keys and the languages it interleaves."""

    languages: list[str] = MISSING


@dataclass
class HardwareConfig:
    """``hardware``: conf/hardware/*.yaml (spectune.hardware checks the choices and ranges)."""

    name: str = MISSING
    device: str = MISSING
    dtype: str = MISSING
    attn_implementation: str = MISSING
    threads: int | None = MISSING
    kv_cache: str = MISSING
    max_cache_len: int | None = MISSING
    compile: str | None = MISSING
    compile_backend: str = MISSING


@dataclass
class ModelConfig:
    """``models.target`` and ``models.draft``: one model of the pair (spectune.models.loading reads them)."""

    name_or_path: str = MISSING  # a hub id, a folder (against the repo root) or gguf:<package>/<file>
    revision: str | None = MISSING  # a branch, tag or commit hash; null: the default branch


@dataclass
class ModelsConfig:
    """``models``: conf/models/*.yaml. A key only some pairs have is typed by a subclass that only their files
    name, not by a default here: a default would add the key to every pair's composed config (``--cfg job``),
    and the code reads its absence (``${oc.select:models.prompt_profile,long}``; no weights note in reports)."""

    name: str = MISSING
    target: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    draft: ModelConfig = dataclasses.field(default_factory=ModelConfig)


@dataclass
class ProfiledModelsConfig(ModelsConfig):
    """``models=tiny``: a pair that chooses its built categories' profile and answer budget
    (workloads/categories.py)."""

    prompt_profile: str = MISSING
    task_max_new_tokens: int | None = MISSING


@dataclass
class NotedModelsConfig(ModelsConfig):
    """``models=smollm2|smollm2-eagle``: a pair whose weights are not the release's, as its reports say."""

    weights_note: str = MISSING


@dataclass
class SloConfig:
    """``slo``: service-level objectives in ms, null when not set (spectune.stats.goodput checks the ranges)."""

    ttft_ms: int | float | None = MISSING  # a number as written: 200 stays 200 in the recorded config
    tpot_ms: int | float | None = MISSING
    e2el_ms: int | float | None = MISSING


@dataclass
class RootConfig:
    """conf/config.yaml's own keys, stored as an open root (the groups add their keys beside these)."""

    seed: int = MISSING
    sampler: str = MISSING  # exact, naive or argmax-match (spectune.sampling.rejection checks the name)
    resume: bool = MISSING
    slo: SloConfig = dataclasses.field(default_factory=SloConfig)


def register() -> None:
    """Store the library's schemas where the YAML files name them: /schema/workload, /schema/workload_mix,
    /schema/hardware, /schema/models (and models_profiled, models_noted) and /schema/config (conf/config.yaml's own
    keys). Every application's own ``register`` calls this first, and the proposers' (/schema/proposer/<name>:
    :func:`spectune.engine.proposers.register_schemas`)."""
    store("workload", WorkloadConfig)
    store("workload_mix", MixWorkloadConfig)
    store("hardware", HardwareConfig)
    store("models", ModelsConfig)
    store("models_profiled", ProfiledModelsConfig)
    store("models_noted", NotedModelsConfig)
    store("config", RootConfig, root=True)


# ---- storing and reading schemas ----------------------------------------------------------------------------

def store(name: str, schema: type, *, root: bool = False) -> None:
    """Store ``schema`` in Hydra's ConfigStore as /schema/<name>. ``root``: the schema types top-level keys of the
    config (a task file in the ``_global_`` package) and is stored as :func:`open_root`."""
    from hydra.core.config_store import ConfigStore

    group, _, leaf = f"{SCHEMA_GROUP}/{name}".rpartition("/")
    ConfigStore.instance().store(group=group, name=leaf, node=open_root(schema) if root else schema,
                                 provider="spectune")


def open_root(schema: type) -> DictConfig:
    """The fields of ``schema`` as typed nodes under an untyped root. Merged at the config's root, a dataclass
    would type the root itself and close it to the keys the other groups add after it (models, hardware,
    workload); this types the schema's own keys and leaves the root open."""
    nodes = OmegaConf.structured(schema)
    return OmegaConf.create({key: nodes._get_node(key) for key in nodes})


def typed(schema: type[T], node: Any, prefix: str = "") -> T:
    """``node`` (a composed config node, or a plain one built by a caller) read as an instance of ``schema``: the
    same type checks as at composition, for configs that did not come through it, every error in one line
    (:class:`SpectuneError`). Only the schema's keys are read (a key added with ``+key=...`` is the caller's own);
    interpolations are resolved against the node's config. ``prefix``: where ``node`` sits (``task``)."""
    try:
        values = _schema_values(node, schema)
    except OmegaConfBaseException as err:  # an interpolation that does not resolve: its key is already absolute
        raise SpectuneError(one_line(err)) from None
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except OmegaConfBaseException as err:
        raise SpectuneError(one_line(err, prefix)) from None


def _schema_values(node: Any, schema: type) -> dict[str, Any]:
    """The values of ``node`` at the fields of ``schema``, resolved, nested schemas likewise."""
    hints = typing.get_type_hints(schema)
    out: dict[str, Any] = {}
    for item in dataclasses.fields(schema):
        if not _has(node, item.name):
            continue
        value = node[item.name]
        if dataclasses.is_dataclass(hints[item.name]) and isinstance(value, DictConfig | dict):
            out[item.name] = _schema_values(value, hints[item.name])
        elif isinstance(value, DictConfig | ListConfig):
            out[item.name] = OmegaConf.to_container(value, resolve=True)
        else:
            out[item.name] = value
    return out


def _has(node: Any, key: str) -> bool:
    """``key`` is set in ``node`` (a missing value ``???`` counts as set: reading it says it is missing)."""
    if isinstance(node, DictConfig):
        return key in node or OmegaConf.is_missing(node, key)
    return isinstance(node, dict) and key in node


# ---- OmegaConf's errors in one line -------------------------------------------------------------------------

def one_line(err: OmegaConfBaseException, prefix: str = "") -> str:
    """OmegaConf's error (several lines: the message, the full key, the types) as the product's one line, naming
    the key, the value and what is allowed there. ``prefix``: where the node that raised sits in the config."""
    key = _join(prefix, getattr(err, "full_key", None) or "")
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, MissingMandatoryValue):
        return f"{key} is missing: set it in its conf/ file or on the command line ({key}=...)"
    if isinstance(err, ConfigAttributeError | ConfigKeyError) and " not in " in first:
        renamed = names.renamed_config_key(key)
        if renamed is not None:  # a key of before it was renamed (spectune.names)
            return f"{key} is now {renamed}: {names.renamed_why(renamed)} (give {renamed}=...)"
        return f"{key} is not a key of the config: check its spelling, or add it with +{key}=..."
    if isinstance(err, ValidationError):
        allowed = _allowed(err)
        if allowed:
            return f"{key}={_shown(err.value)} is invalid: must be {allowed}"
    return f"{key + ': ' if key else ''}{first}"


def _join(prefix: str, key: str) -> str:
    if not prefix:
        return key
    return f"{prefix}{key}" if not key or key.startswith("[") else f"{prefix}.{key}"


def _shown(value: Any) -> str:
    """A value as the messages of the rest of the product show it (repr; containers as plain lists and dicts)."""
    if isinstance(value, DictConfig | ListConfig):
        value = OmegaConf.to_container(value)
    return repr(value)


def _allowed(err: ValidationError) -> str:
    """What the schema allows at the key that failed, from its type hint ("" when it cannot be told)."""
    owner = getattr(err, "object_type", None)
    if dataclasses.is_dataclass(owner):
        hint = typing.get_type_hints(owner).get(str(err.key))
        return describe(hint) if hint is not None else ""
    node = getattr(err, "child_node", None)
    if isinstance(node, ValueNode):  # a typed key of an open root (spectune.config.open_root): its node's type
        hint = node._metadata.ref_type
        return describe(hint | None if node._is_optional() else hint) if hint is not Any else ""
    container = _without_none(getattr(err, "ref_type", None))
    args = typing.get_args(container)
    if typing.get_origin(container) is list and args:
        return describe(args[0])
    if typing.get_origin(container) is dict and len(args) == 2:
        return describe(args[1])
    return ""


NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
PLURALS = {int: "integers", float: "numbers", bool: "true or false values", str: "strings"}


def describe(hint: Any) -> str:
    """A type hint in words: ``int | None`` -> "an integer or null", ``list[int]`` -> "a list of integers"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        if int in kinds and float in kinds:  # a number, written as 5 or as 5.0
            kinds = [float, *(a for a in kinds if a not in (int, float))]
        words = [w for a in kinds for w in (["true", "false"] if a is bool else [describe(a)])]
        words += ["null"] if type(None) in args else []
        return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]
    if origin is list:
        return f"a list of {PLURALS.get(args[0], 'values')}" if args else "a list"
    if origin is dict or hint is dict:
        return "a mapping"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"one of {', '.join(member.name for member in hint)}"
    if dataclasses.is_dataclass(hint):
        return f"a mapping of {', '.join(f.name for f in dataclasses.fields(hint))}"
    if hint is Any:
        return "any value"
    return NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def _without_none(hint: Any) -> Any:
    """``X | None`` -> ``X``; other hints unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint
