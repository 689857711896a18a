"""Policies by config name: ``conf/policy/<name>.yaml`` holds each policy's parameters (defaults live there only).

A policy is a class with a ``name`` (its config's name) in a module of this package; the catalogue finds it by
reading the modules' source, without importing them, and imports only the module of the policy asked for. So a
new policy is its module and its config, and naming one policy never loads the others (nor SB3 and torch's
training stack for a rule that needs neither). The fixed γ lives with the engine (``name = "fixed"``).

The grid's γ reaches every policy as ``gamma`` (the fixed length, a start value or a ceiling); every other
parameter comes from the policy's config node, so ``policy=confidence policy.threshold=0.3`` works. A policy's
schema is its constructor: :func:`parameters_schema` makes the structured config from ``__init__``'s type hints, and
:func:`make_policy` reads the node through it (OmegaConf's type checks, the product's one-line errors), so a new
policy needs no schema file and its config can never disagree with what it takes.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import importlib
import inspect
import types
import typing
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

from spectune.config import typed
from spectune.engine.policy import DraftLengthPolicy, FixedGamma
from spectune.errors import SpectuneError

HERE = Path(__file__).resolve().parent
POLICY_CONF = HERE.parent / "conf" / "policy"  # one file per policy: its parameters' defaults


@cache
def _locations() -> dict[str, tuple[str, str]]:
    """Config name -> (module, class) of every policy class in this package's modules (read, not imported)."""
    found = {FixedGamma.name: (FixedGamma.__module__, FixedGamma.__name__)}
    for path in sorted(HERE.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef) or not node.bases:
                continue
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["name"]
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
                    name = stmt.value.value
                    if name in found:
                        raise SpectuneError(f"two policies are named {name!r}: {found[name]} and {path.stem}")
                    found[name] = (f"{__package__}.{path.stem}", node.name)
    return found


class Catalogue(Mapping[str, type[DraftLengthPolicy]]):
    """Every policy by config name; a policy's module is imported when its class is first looked up."""

    def __getitem__(self, name: str) -> type[DraftLengthPolicy]:
        if name not in _locations():
            raise KeyError(name)
        module, cls = _locations()[name]
        return getattr(importlib.import_module(module), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(_locations()))

    def __len__(self) -> int:
        return len(_locations())

    def __contains__(self, name: object) -> bool:
        return name in _locations()


POLICIES = Catalogue()


def config_names() -> list[str]:
    """Every policy a config names (``conf/policy/*.yaml``)."""
    return sorted(p.stem for p in POLICY_CONF.glob("*.yaml"))


def policy_config(name: str, key: str = "policy") -> dict[str, Any]:
    """``conf/policy/<name>.yaml`` as a plain node, the policy's defaults; an unknown name is one line naming ``key``
    and the choices."""
    if name not in config_names():
        raise SpectuneError(f"{key}={name!r} is invalid: choose one of {', '.join(config_names())}")
    return OmegaConf.to_container(OmegaConf.load(POLICY_CONF / f"{name}.yaml"), resolve=True)


def make_policy(node: Mapping[str, Any], gamma: int) -> DraftLengthPolicy:
    """Build the policy a config node names, at the grid's ``gamma``. Unknown names or parameters fail in one line."""
    params = dict(node)
    name = params.pop("name", None)
    if name not in POLICIES:
        raise SpectuneError(f"policy={name!r} is unknown: choose one of {', '.join(sorted(POLICIES))}")
    cls = POLICIES[name]
    parameters = inspect.signature(cls.__init__).parameters
    accepted = config_parameters(cls)
    for key in params:
        if key not in accepted:
            raise SpectuneError(f"policy.{key} is not a parameter of policy={name}: "
                                f"its parameters are {', '.join(accepted) or 'none'}")
    missing = [key for key in accepted if key not in params and parameters[key].default is inspect.Parameter.empty]
    if missing:
        raise SpectuneError(f"policy={name} needs policy.{missing[0]} (set it in conf/policy/{name}.yaml "
                            "or on the command line)")
    values = typed(parameters_schema(cls), params, prefix="policy")
    return cls(gamma=gamma, **{key: getattr(values, key) for key in params})


def config_parameters(cls: type) -> list[str]:
    """The parameters of ``cls.__init__`` that a config sets: all but ``self``, the grid's ``gamma`` and the
    keyword-only ones (for code that passes an object already built)."""
    parameters = inspect.signature(cls.__init__).parameters
    return [p for p, spec in parameters.items()
            if p not in ("self", "gamma") and spec.kind is not inspect.Parameter.KEYWORD_ONLY]


@cache
def parameters_schema(cls: type) -> type:
    """The structured config of a policy's parameters, made from its ``__init__``'s type hints and defaults (an
    optional parameter a config may leave out). Hints OmegaConf cannot type (a class, a callable) become ``Any``."""
    hints = typing.get_type_hints(cls.__init__)
    defaults = {p: spec.default for p, spec in inspect.signature(cls.__init__).parameters.items()
                if spec.default is not inspect.Parameter.empty}
    fields = [(p, _config_type(hints.get(p, Any)), dataclasses.field(default=defaults.get(p, MISSING)))
              for p in config_parameters(cls)]
    return dataclasses.make_dataclass(f"{cls.__name__}Parameters", fields)


SCALARS = (int, float, bool, str)


def _config_type(hint: Any) -> Any:
    """``hint`` as OmegaConf types a field: scalars, ``X | None``, lists (``Sequence[float]``: ``list[float]``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in SCALARS:
        return hint
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = _config_type(rest[0]) if len(rest) == 1 else Any
        return inner | None if inner is not Any and type(None) in args else Any
    if origin in (list, collections.abc.Sequence) and args and args[0] in SCALARS:
        return list[args[0]]
    return Any
