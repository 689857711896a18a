"""The engines a method runs on, behind one seam: ``engine=spectune`` (spectune's own engine, in process: the
default), ``engine=llamacpp`` (llama-server on the CPU), ``engine=vllm`` and ``engine=sglang`` (servers on a GPU
node). An engine is one module of this package with a class whose ``name`` is its config's name
(``conf/engine/<name>.yaml``) and that satisfies :class:`~spectune.engines.base.MeasuringEngine`; nothing else in
the library names an engine. The catalogue reads the modules' source and imports only the engine asked for.
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


def engine_names() -> list[str]:
    return sorted(_locations())


def engine_class(name: str) -> type:
    """The class of engine ``name``; an unknown name fails in one line naming the known ones."""
    if name not in _locations():
        raise SpectuneError(f"engine={name!r} is unknown: choose one of {', '.join(engine_names())}")
    module, cls = _locations()[name]
    return getattr(importlib.import_module(module), cls)
