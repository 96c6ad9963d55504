"""Every kind describes itself, and nothing a recipe may say is dropped on the way to a key (#17).

The silent failure this guards: a section the schema accepts but ``loader.resolve`` does
not carry into the resolved recipe never reaches a cache key, so changing it rebuilds
nothing."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from onnxbuild import steps
from onnxbuild.api import parse_recipe
from onnxbuild.spec import STEP_KINDS, StepKind

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "onnxbuild" / "recipe" / "schema.json").read_text(encoding="utf-8"))
RECIPES = sorted(
    [
        *ROOT.glob("recipes/*.yaml"),
        *ROOT.glob("tests/data/*.yaml"),
        *ROOT.glob("tests/data/tasks/*.yaml"),
        *ROOT.glob("tests/data/good/*.yaml"),
        *ROOT.glob("tests/data/steps/*.yaml"),
    ]
)


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_each_step_kind_describes_itself(kind: str) -> None:
    """Each module exports one typed StepKind (no attribute is looked up by name any more)."""
    module = steps.step_module(kind)
    assert module.__name__ == f"onnxbuild.steps.{kind}"
    described = steps.step_kind(kind)
    assert isinstance(described, StepKind) and described.name == kind
    assert isinstance(described.packages, tuple) and all(isinstance(p, str) for p in described.packages)
    assert described.run is module.run, "the engine calls run by the module's name: KIND.run must be that run"
    factor, base = described.memory
    assert factor >= 0 and base > 0


def test_a_module_without_a_kind_is_refused_by_the_registry() -> None:
    import types

    module = types.ModuleType("no_kind_here")
    with pytest.raises(TypeError, match=r"no_kind_here has no KIND = StepKind\(...\) to register as 'x'"):
        steps.register("x", module)


def test_the_registry_is_the_kind_list() -> None:
    assert list(steps.KINDS) == list(STEP_KINDS)


def test_every_recipe_section_the_schema_accepts_reaches_the_resolved_recipe() -> None:
    resolved_keys: set[str] = set()
    set_keys: set[str] = set()
    for path in RECIPES:
        text = path.read_text(encoding="utf-8")
        resolved = parse_recipe(text, str(path))
        doc = yaml.safe_load(text)
        set_keys |= set(doc)
        dropped = set(doc) - set(resolved)
        assert not dropped, (
            f"{path.relative_to(ROOT)}: loader.resolve drops {sorted(dropped)}; give the section its defaults there"
        )
        resolved_keys |= set(resolved)
    unused = set(SCHEMA["properties"]) - set_keys
    assert not unused - {"description"}, (
        f"no recipe in the repository sets {sorted(unused)}: add one so this test covers it"
    )


@pytest.mark.parametrize("kind", [k for k in STEP_KINDS if k in SCHEMA["properties"]])
def test_a_step_kind_that_owns_a_recipe_section_has_it_in_the_schema(kind: str) -> None:
    refs = re.findall(r'"\$ref": "#/\$defs/([A-Za-z0-9_]+)"', json.dumps(SCHEMA["properties"][kind]))
    assert refs, f"recipe section {kind!r} should point at its $defs block(s)"
    assert all(r in SCHEMA["$defs"] for r in refs)


@pytest.mark.parametrize("kind", sorted(SCHEMA["properties"]["source"]["properties"]))
def test_each_source_kind_the_schema_accepts_is_one_module_that_describes_itself(kind: str) -> None:
    from onnxbuild.sources import kinds, source_kind, source_module
    from onnxbuild.sources.kind import SourceKind

    assert kind in kinds()
    assert source_module(kind).__name__ == f"onnxbuild.sources.{kind}"
    described = source_kind(kind)
    assert isinstance(described, SourceKind) and described.name == kind
    if described.traced:
        assert described.record is not None and described.load_model is not None
    assert f"{kind}_source" in SCHEMA["$defs"], f"source kind {kind!r} needs its $defs/{kind}_source block"


def _section_type(section: str) -> Any:
    """The TypedDict ``Resolved`` (recipe/sections.py) gives a section, less None and list[]."""
    from onnxbuild.recipe.sections import Resolved

    typed = typing.get_type_hints(Resolved)[section]
    for arg in (*typing.get_args(typed), typed):
        if typing.get_origin(arg) is list:
            arg = typing.get_args(arg)[0]
        if typing.is_typeddict(arg):
            return arg
    raise AssertionError(f"Resolved.{section} names no TypedDict: {typed}")


@pytest.mark.parametrize(
    "section", ["export", "validate", "optimize", "quantize", "benchmark", "generate", "limits", "providers"]
)
def test_each_section_type_names_exactly_the_schema_keys_and_what_resolve_writes(section: str) -> None:
    typed = _section_type(section)
    keys = set(typed.__required_keys__) | set(typed.__optional_keys__)
    refs = re.findall(r'"\$ref": "#/\$defs/([A-Za-z0-9_]+)"', json.dumps(SCHEMA["properties"][section]))
    schema_keys = set(SCHEMA["$defs"][refs[0]]["properties"])
    assert keys == schema_keys, (
        f"recipe/sections.py {typed.__name__}: missing {sorted(schema_keys - keys)}, extra {sorted(keys - schema_keys)}"
    )
    for path in RECIPES:
        value = parse_recipe(path.read_text(encoding="utf-8"), str(path)).get(section)
        for item in value if isinstance(value, list) else [value] if value else []:
            assert set(item) <= keys, (
                f"{path.name}: resolve writes {sorted(set(item) - keys)} into {section}, which {typed.__name__} "
                "does not name"
            )


def test_a_new_step_kind_is_one_module_one_registry_line_and_one_schema_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's worked example, built for real: a ``checksums`` kind added with a module,
    a registry entry and a schema block (patched in here), and nothing else."""
    import hashlib
    import sys
    import types

    import onnxbuild
    from onnxbuild import pipeline
    from onnxbuild.recipe import resolve as resolve_module
    from onnxbuild.spec import Planning, StepContext, StepInput, StepKind, StepResult, StepSpec

    module = types.ModuleType("onnxbuild_test_checksums")

    def plan(p: Planning) -> list[StepSpec]:
        section = p.recipe.resolved.get("checksums")
        if not section:
            return []
        return [
            StepSpec(
                name="checksums",
                kind="checksums",
                params={"checksums": section},
                deps=tuple(v.step for v in p.variants),
                inputs=tuple(StepInput(v.step, v.path) for v in p.variants),
                outputs=("checksums.txt",),
            )
        ]

    def run(ctx: StepContext, spec: StepSpec) -> StepResult:
        algorithm = spec.params["checksums"]["algorithm"]
        lines = [f"{hashlib.new(algorithm, ctx.input(i.path).read_bytes()).hexdigest()}  {i.path}" for i in spec.inputs]
        ctx.output("checksums.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return StepResult(summary=f"{len(lines)} {algorithm} sums")

    module.run = run  # type: ignore[attr-defined]
    module.KIND = StepKind(name="checksums", packages=(), plan=plan, run=run, memory=(0, 200))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(steps._extra, "checksums", module)  # the registry line (spec.STEP_KINDS) ...
    monkeypatch.setattr(pipeline, "STEP_KINDS", (*pipeline.STEP_KINDS, "checksums"))
    schema = json.loads(json.dumps(resolve_module.schema()))  # ... and the schema block
    schema["properties"]["checksums"] = {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/checksums"}]}
    schema["$defs"]["checksums"] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"algorithm": {"enum": ["sha256", "sha1"], "default": "sha256"}},
    }
    monkeypatch.setattr(resolve_module, "schema", lambda: schema)
    monkeypatch.setattr("onnxbuild.recipe.loader.schema", lambda: schema)

    recipe = tmp_path / "lr.yaml"
    recipe.write_text(
        (ROOT / "recipes" / "linear-regression.yaml").read_text(encoding="utf-8") + "checksums: {}\n", encoding="utf-8"
    )
    settings = onnxbuild.Settings(cache_dir=tmp_path / "cache", artifacts_dir=tmp_path / "artifacts")
    report = onnxbuild.build([str(recipe)], settings, in_process=True)
    assert report.ok
    written = (tmp_path / "artifacts" / "linear-regression" / "checksums.txt").read_text(encoding="utf-8")
    model = (tmp_path / "artifacts" / "linear-regression" / "model.onnx").read_bytes()
    assert written == f"{hashlib.sha256(model).hexdigest()}  model.onnx\n"
    # the section's default reached the key: changing it reruns the step, and says why
    recipe.write_text(
        recipe.read_text(encoding="utf-8").replace("checksums: {}", "checksums: {algorithm: sha1}"), encoding="utf-8"
    )
    planned = onnxbuild.plan([str(recipe)], settings)
    reasons = {s.spec.name: s.reasons for s in planned.steps if s.action == "run"}
    assert reasons == {"checksums": ('checksums.algorithm changed "sha256" -> "sha1"',)}
