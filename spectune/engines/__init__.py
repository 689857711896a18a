"""The engines a method runs on, behind one seam: ``engine=spectune`` (spectune's own engine, in process: the
default), ``engine=llamacpp`` (llama-server on the CPU), ``engine=vllm`` and ``engine=sglang`` (servers on a GPU
node). An engine is one module of this package with a class whose ``name`` is its config's name
(``conf/engine/<name>.yaml``) and that satisfies :class:`~spectune.engines.base.MeasuringEngine`; nothing else in
the library names an engine. The catalogue reads the modules' source and imports only the engine asked for.

A server engine's flavour (what starts, feeds and reads its server: ``vllm.VllmFlavour``, ``sglang.SglangFlavour``)
names its config's schema (``schema``, a dataclass of ``conf/engine/<name>.yaml``'s keys); :func:`register_schemas`
stores each as ``/schema/engine/<name>``, where that file names it.
"""

from __future__ import annotations

import ast
import importlib
from functools import cache
from pathlib import Path

from spectune.errors import SpectuneError

HERE = Path(__file__).resolve().parent


@cache
def _locations() -> dict[str, tuple[str, str]]:
    """Config name -> (module, class) of every engine class of this package (read, not imported)."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(HERE.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["engine"]
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
                    name = stmt.value.value
                    if name in found:
                        raise SpectuneError(f"two engines are named {name!r}: {found[name]} and {path.stem}")
                    found[name] = (f"{__package__}.{path.stem}", node.name)
    return found


@cache
def _schema_locations() -> dict[str, tuple[str, str]]:
    """Config name -> (module, class) of every flavour of this package that names a schema (read, not imported):
    a class whose body assigns ``name = "<name>"`` and ``schema``."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(HERE.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            assigned = {t.id: stmt.value for stmt in node.body if isinstance(stmt, ast.Assign)
                        for t in stmt.targets if isinstance(t, ast.Name)}
            name = assigned.get("name")
            if "schema" in assigned and isinstance(name, ast.Constant) and isinstance(name.value, str):
                found[name.value] = (f"{__package__}.{path.stem}", node.name)
    return found


def register_schemas() -> None:
    """Store every server engine's config schema as /schema/engine/<name> (conf/engine/<name>.yaml names it)."""
    from spectune.config import store

    for name, (module, cls) in _schema_locations().items():
        store(f"engine/{name}", getattr(importlib.import_module(module), cls).schema)


def engine_names() -> list[str]:
    return sorted(_locations())


def engine_class(name: str) -> type:
    """The class of engine ``name``; an unknown name fails in one line naming the known ones."""
    if name not in _locations():
        raise SpectuneError(f"engine={name!r} is unknown: choose one of {', '.join(engine_names())}")
    module, cls = _locations()[name]
    return getattr(importlib.import_module(module), cls)
