"""The layers of docs/layout.md hold: every import points down, no module or package cycle, no private reach.

The walk reads every module of every package (the library ``spectune``; ``workloads``, ``policies``,
``analysis``; the application ``harness``; ``hydra_plugins``; the scripts of ``bench/``, their sibling imports
included, and of ``bench/results/``) and counts as an import: ``import``/``from`` statements anywhere (module
level, inside functions, under ``TYPE_CHECKING``), ``importlib.import_module("...")`` and ``import_module("...")``
calls with a literal name, ``"package.module:attr"`` entry-point strings (gymnasium registrations), and the Hydra
``_target_`` strings of ``conf/``. The module → layer map is docs/layout.md's ``layers`` block, parsed here: the
longest matching prefix wins. No whitelist.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("spectune", "workloads", "policies", "analysis", "harness", "hydra_plugins", "bench")
ENTRY_POINT = re.compile(r"^((?:spectune|harness|policies|workloads|analysis)(?:\.\w+)*):(\w+)$")


def layer_map() -> dict[str, int]:
    """docs/layout.md's ```layers block: ``module  layer  what`` per line (# comments)."""
    text = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/layout.md needs its ```layers block (the module -> layer map)"
    out = {}
    for line in block.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, layer, *_ = line.split()
            out[name] = int(layer)
    return out


def modules() -> dict[str, Path]:
    """Every module of the packages by dotted name (a package by its own name; a results folder's script under
    ``bench.results.<folder with - as _>.<script>``)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = [part.replace("-", "_") for part in path.relative_to(REPO).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def package_of(module: str, known: dict[str, Path]) -> str:
    """The package a module belongs to: itself for a package (``__init__``), else its parent."""
    return module if known[module].name == "__init__.py" else module.rpartition(".")[0]


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module ``name`` names (a name inside a module resolves to the module)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _literal_import(node: ast.Call) -> str | None:
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def imports_of(module: str, path: Path) -> list[tuple[str, list[str]]]:
    """(imported dotted name, names taken from it) for every import of ``module`` (see the module docstring)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # `from pkg import mod` imports the submodule when there is one
                found.append((f"{base}.{alias.name}", [alias.name]))
        elif isinstance(node, ast.Call) and (name := _literal_import(node)):
            found.append((name, []))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := ENTRY_POINT.match(node.value)):
            found.append((f"{m.group(1)}.{m.group(2)}", [m.group(2)]))
    return found


def hydra_targets() -> list[tuple[str, str]]:
    """(file, target) of every ``_target_`` in conf/ that names a project module."""
    out = []
    for path in sorted((REPO / "conf").rglob("*.yaml")):
        for target in re.findall(r"_target_:\s*([\w.]+)", path.read_text(encoding="utf-8")):
            if target.split(".")[0] in PACKAGES:
                out.append((path.relative_to(REPO).as_posix(), target))
    return out


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """Module → imported project modules, and every private name imported across packages."""
    known = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    private = []
    for module, path in known.items():
        for name, _ in imports_of(module, path):
            sibling = f"{module.rpartition('.')[0]}.{name}"  # a script's `import gpu_check` beside it (bench/)
            if module.startswith("bench.") and name.split(".")[0] not in PACKAGES \
                    and _resolve(sibling, known) not in (None, "bench"):
                name = sibling
            target = _resolve(name, known)
            if target is None or target == module:
                continue
            edges[module].add(target)
            hidden = [p for p in name.split(".") if p.startswith("_") and not p.startswith("__")]
            if hidden and target.split(".")[0] != module.split(".")[0]:
                private.append(f"{module} imports {name}")
    return edges, private


def layer_of(module: str, layers: dict[str, int]) -> int:
    best = max((p for p in layers if module == p or module.startswith(p + ".")), key=len, default=None)
    assert best is not None, f"{module} has no layer in docs/layout.md's layers block"
    return layers[best]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(edges) | {t for ts in edges.values() for t in ts}):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer_and_the_map_names_only_modules():
    layers, known = layer_map(), modules()
    for module in known:
        layer_of(module, layers)
    stale = [p for p in layers if not any(m == p or m.startswith(p + ".") for m in known)]
    assert not stale, f"docs/layout.md's layers block names modules that do not exist: {stale}"
    assert all(1 <= layer <= 20 for layer in layers.values()), layers


def test_no_import_points_up_a_layer():
    layers = layer_map()
    edges, _ = graph()
    upward = [f"{a} (layer {layer_of(a, layers)}) imports {b} (layer {layer_of(b, layers)})"
              for a, targets in sorted(edges.items()) for b in sorted(targets)
              if layer_of(b, layers) > layer_of(a, layers)]
    assert not upward, upward


def test_no_import_cycle_between_modules():
    edges, _ = graph()
    found = cycles(edges)
    assert not found, found


def package_graph() -> dict[str, set[str]]:
    """Package → packages it imports (through any of its modules); a package's own subpackages are other packages."""
    known = modules()
    edges, _ = graph()
    out: dict[str, set[str]] = defaultdict(set)
    for a, targets in edges.items():
        for b in targets:
            pa, pb = package_of(a, known), package_of(b, known)
            if pa != pb:
                out[pa].add(pb)
    return out


def test_no_import_cycle_between_packages():
    """Between subpackages (spectune.engine and spectune.models) and between the top-level packages."""
    found = cycles(package_graph())
    assert not found, found
    top: dict[str, set[str]] = defaultdict(set)
    for a, targets in package_graph().items():
        top[a.split(".")[0]] |= {b.split(".")[0] for b in targets} - {a.split(".")[0]}
    found = cycles(top)
    assert not found, found


def test_the_library_imports_no_application():
    """spectune imports nothing from the packages built on it."""
    edges, _ = graph()
    up = [f"{a} imports {b}" for a, targets in sorted(edges.items()) if a.split(".")[0] == "spectune"
          for b in sorted(targets) if b.split(".")[0] != "spectune"]
    assert not up, up


def test_no_private_name_is_imported_from_another_package():
    _, private = graph()
    assert not private, private


def test_hydra_targets_name_public_objects_of_existing_modules():
    known = modules()
    for path, target in hydra_targets():
        module, _, attr = target.rpartition(".")
        assert module in known, f"{path}: _target_ {target}: no module {module}"
        assert not attr.startswith("_"), f"{path}: _target_ {target} is private"
        tree = ast.parse(known[module].read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
        assert attr in defined, f"{path}: _target_ {target}: {module} defines no {attr}"


def test_the_walk_sees_imports_in_functions_type_checking_and_import_module(tmp_path):
    """The walker itself: each kind of import it claims to count is counted."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from spectune.engine import Engine\n"
              "def f():\n    import policies.train\n    importlib.import_module('analysis.report')\n"
              "ENV = 'policies.envs.gamma:DraftGammaEnv'\nfrom harness.tasks import _repeats\n")
    path = tmp_path / "m.py"
    path.write_text(source, encoding="utf-8")
    names = {name for name, _ in imports_of("workloads.m", path)}
    assert {"spectune.engine.Engine", "policies.train", "analysis.report", "policies.envs.gamma.DraftGammaEnv",
            "harness.tasks._repeats"} <= names
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_engine_does_not_need_hydra_to_import():
    """The GPU image has no Hydra: the engine and its protocol import without omegaconf at module level."""
    for rel in ("spectune/engine", "spectune/sampling", "spectune/hardware.py"):
        paths = [REPO / rel] if rel.endswith(".py") else sorted((REPO / rel).rglob("*.py"))
        for path in paths:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
            mods = {getattr(n, "module", None) or n.names[0].name for n in top}
            assert not any(m and m.split(".")[0] in ("omegaconf", "hydra") for m in mods), path
