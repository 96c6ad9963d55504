"""Imports only go down the layers (#17), read from the source with ast, function-level
imports included, so a lazy import cannot hide an upward dependency:

    cli, api, diff, verify, modeldiff, report.page      the commands and what they show
    pipeline                                            recipe -> step specs (knows every kind)
    steps, sources (torch helpers), fusion, layouts     the kinds: what a step does (layouts: the
                                                        files of a model and their decode loops)
    runtimes                                            sessions, providers, the OpenVINO target
    engine                                              plans and runs plain specs
    recipe, spec, environment, errors, _util, ...       data and facts, and the source kinds
                                                        (sources/<kind>.py: the loader asks
                                                        each for its checks and defaults)

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
                modules = {f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}")}
                found |= modules
                if len(modules) < len(node.names):  # ``from pkg import name``: pkg's own code runs
                    found.add(base)
    return found


def is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


MODULES = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


KINDS = ("onnxbuild.pipeline", "onnxbuild.steps", "onnxbuild.sources", "onnxbuild.fusion", "onnxbuild.layouts")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if within(m, "onnxbuild.engine")))
def test_the_engine_imports_no_kind(module: str) -> None:
    upward = sorted(
        i
        for i in MODULES[module]
        if within(i, *KINDS, "onnxbuild.api", "onnxbuild.cli", "onnxbuild.review.diff", "onnxbuild.review.verify")
    )
    assert not upward, (
        f"{module} imports {upward}: the engine plans and runs plain specs (onnxbuild.spec); pass what it needs in"
    )


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if within(m, "onnxbuild.steps", "onnxbuild.sources", "onnxbuild.fusion"))
)
def test_kinds_import_no_engine_module(module: str) -> None:
    upward = sorted(
        i
        for i in MODULES[module]
        if within(i, "onnxbuild.engine", "onnxbuild.pipeline", "onnxbuild.api", "onnxbuild.cli")
    )
    assert not upward, (
        f"{module} imports {upward}: environment facts are in onnxbuild.environment, step types in onnxbuild.spec"
    )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if within(m, "onnxbuild.steps")))
def test_steps_import_no_review_tool(module: str) -> None:
    """review/ holds the commands that read builds (diff, verify, upgrade-check); what a step and
    a command both run (the first-divergence search) lives with the step."""
    upward = sorted(i for i in MODULES[module] if within(i, "onnxbuild.review"))
    assert not upward, f"{module} imports {upward}: move what both need below the steps"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if within(m, "onnxbuild.runtimes")))
def test_runtimes_import_no_source_step_or_layout(module: str) -> None:
    """A runtime runs files; what it shares with the sources (the KV cache's names) is below both,
    and the loops that need a source's torch wrappers are layouts."""
    upward = sorted(i for i in MODULES[module] if within(i, *KINDS))
    assert not upward, f"{module} imports {upward}"


SOURCE_KIND_MODULES = tuple(
    f"onnxbuild.sources.{k}"
    for k in (
        "onnx",
        "graph",
        "huggingface",
        "pytorch",
        "tensorflow",
        "gguf_header",
        "vlm_families",
        "vision_encoder_decoder",
        "checkpoint",
    )
)
"""The source kinds, and gguf_header, the huggingface kind's reader of a GGUF file's header (core
too: it imports only errors, and the kind calls it when it records the source), vlm_families,
its table of vision-language families and their recipe rules, and vision_encoder_decoder, its
image-to-text tables, recipe rules and the decoder ids lifted onto a loaded model's config, and
checkpoint, its reader of safetensors files one tensor at a time and its streamed random-init."""


def test_the_core_imports_nothing_above_it() -> None:
    core = (
        "onnxbuild.spec",
        "onnxbuild.environment",
        "onnxbuild.errors",
        "onnxbuild._util",
        "onnxbuild.recipe",
        "onnxbuild.sources.usercode",
        "onnxbuild.sources.kind",  # SourceKind: what a source module exports
        *SOURCE_KIND_MODULES,
    )
    for module in (m for m in MODULES if within(m, *core)):
        upward = sorted(
            i for i in MODULES[module] if not (within(i, *core, "onnxbuild._version") or i == "onnxbuild.sources")
        )
        assert not upward, f"{module} imports {upward}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle() -> None:
    # importing onnxbuild.a.b runs onnxbuild/a/__init__.py first, so a subpackage's
    # __init__ counts as imported (the root package only re-exports the API)
    def parents(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(2, len(parts))}

    graph = {
        m: {i for d in deps for i in {d, *parents(d)} if i in MODULES and i not in (m, "onnxbuild")}
        for m, deps in MODULES.items()
    }
    found = cycles(graph)
    shown = "; ".join(
        " -> ".join(c) + ": " + ", ".join(f"{a} imports {sorted(graph[a] & set(c))}" for a in c) for c in found
    )
    assert not found, f"import circles: {shown}"


SOURCE_KINDS = ("onnx", "graph", "huggingface", "pytorch", "tensorflow")


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_a_source_kind_imports_no_other_source_and_no_step(kind: str) -> None:
    module = f"onnxbuild.sources.{kind}"
    upward = sorted(
        i
        for i in MODULES[module]
        if within(i, "onnxbuild.steps", *(f"onnxbuild.sources.{k}" for k in SOURCE_KINDS if k != kind))
    )
    assert not upward, (
        f"{module} imports {upward}: a source kind stands alone (shared torch helpers are in sources.torchmodel)"
    )
