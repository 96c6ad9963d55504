"""Imports only go down the layers (#17), read from the source with ast, function-level
imports included, so a lazy import cannot hide an upward dependency:

    cli, api, diff, verify, modeldiff, report.page      the commands and what they show
    pipeline                                            recipe -> step specs (knows every kind)
    steps, sources, fusion, generation, web, usercode   the kinds: what a step does
    engine                                              plans and runs plain specs
    recipe, spec, environment, errors, _util, ...       data and facts

The engine knows no kind: it imports no pipeline, steps, sources or fusion module; steps
and sources import no engine module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "onnxbuild"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every onnxbuild module ``path`` imports, at any depth of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("onnxbuild")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            if base.startswith("onnxbuild"):
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names if (PACKAGE.parent / f"{base}.{a.name}".replace(".", "/")).with_suffix(".py").exists()}
    return found


MODULES = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


KINDS = ("onnxbuild.pipeline", "onnxbuild.steps", "onnxbuild.sources", "onnxbuild.fusion")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if within(m, "onnxbuild.engine")))
def test_the_engine_imports_no_kind(module: str) -> None:
    upward = sorted(i for i in MODULES[module] if within(i, *KINDS, "onnxbuild.api", "onnxbuild.cli", "onnxbuild.diff", "onnxbuild.verify"))
    assert not upward, f"{module} imports {upward}: the engine plans and runs plain specs (onnxbuild.spec); pass what it needs in"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if within(m, "onnxbuild.steps", "onnxbuild.sources", "onnxbuild.fusion")))
def test_kinds_import_no_engine_module(module: str) -> None:
    upward = sorted(i for i in MODULES[module] if within(i, "onnxbuild.engine", "onnxbuild.pipeline", "onnxbuild.api", "onnxbuild.cli"))
    assert not upward, f"{module} imports {upward}: environment facts are in onnxbuild.environment, step types in onnxbuild.spec"


def test_the_core_imports_nothing_above_it() -> None:
    core = ("onnxbuild.spec", "onnxbuild.environment", "onnxbuild.errors", "onnxbuild._util", "onnxbuild.recipe", "onnxbuild.usercode")
    for module in (m for m in MODULES if within(m, *core)):
        upward = sorted(i for i in MODULES[module] if not within(i, *core, "onnxbuild._version"))
        assert not upward, f"{module} imports {upward}"
