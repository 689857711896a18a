"""The tree reads as the data's path: imports go one way (base pieces below policies/workloads/analysis)."""

from __future__ import annotations

import ast

from tests.conftest import REPO

UPPER = ("policies", "workloads", "analysis")
APPLICATION = ("harness/tasks/", "harness/__main__.py")


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_harness_below_the_application_never_imports_upward():
    offenders = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(APPLICATION):
            continue
        for name in _imports(path):
            if name.split(".")[0] in UPPER:
                offenders.append(f"{rel} imports {name}")
    assert not offenders, offenders


def test_engine_does_not_need_hydra_to_import():
    """The GPU image has no Hydra: the engine and its protocol import without omegaconf at module level."""
    for rel in ("harness/engine", "harness/sampling", "harness/hardware.py"):
        paths = [REPO / rel] if rel.endswith(".py") else sorted((REPO / rel).rglob("*.py"))
        for path in paths:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
            mods = {getattr(n, "module", None) or n.names[0].name for n in top}
            assert not any(m and m.split(".")[0] in ("omegaconf", "hydra") for m in mods), path
