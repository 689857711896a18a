"""Policies by config name: ``conf/policy/<name>.yaml`` holds each policy's parameters (defaults live there only).

A policy is a class with a ``name`` (its config's name) in a module of this package; the catalogue finds it by
reading the modules' source, without importing them, and imports only the module of the policy asked for. So a
new policy is its module and its config, and naming one policy never loads the others (nor SB3 and torch's
training stack for a rule that needs neither). The fixed γ lives with the engine (``name = "fixed"``).

The grid's γ reaches every policy as ``gamma`` (the fixed length, a start value or a ceiling); every other
parameter comes from the policy's config node, so ``policy=confidence policy.threshold=0.3`` works.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from spectune.engine.policy import DraftLengthPolicy, FixedGamma
from spectune.errors import SpectuneError

HERE = Path(__file__).resolve().parent


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


def make_policy(node: Mapping[str, Any], gamma: int) -> DraftLengthPolicy:
    """Build the policy a config node names, at the grid's ``gamma``. Unknown names or parameters fail in one line."""
    params = dict(node)
    name = params.pop("name", None)
    if name not in POLICIES:
        raise SpectuneError(f"policy={name!r} is unknown: choose one of {', '.join(sorted(POLICIES))}")
    cls = POLICIES[name]
    parameters = inspect.signature(cls.__init__).parameters
    # keyword-only parameters are for code (an object already built), never a config's
    accepted = [p for p, spec in parameters.items()
                if p not in ("self", "gamma") and spec.kind is not inspect.Parameter.KEYWORD_ONLY]
    for key in params:
        if key not in accepted:
            raise SpectuneError(f"policy.{key} is not a parameter of policy={name}: "
                                f"its parameters are {', '.join(accepted) or 'none'}")
    missing = [key for key in accepted if key not in params and parameters[key].default is inspect.Parameter.empty]
    if missing:
        raise SpectuneError(f"policy={name} needs policy.{missing[0]} (set it in conf/policy/{name}.yaml "
                            "or on the command line)")
    return cls(gamma=gamma, **params)
