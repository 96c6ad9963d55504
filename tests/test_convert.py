"""#39: kinds describe themselves, proven by a variant-making kind added as one module
(onnxbuild/steps/convert.py), one registry line (spec.STEP_KINDS) and one schema block: a
float16 copy of a variant, built, checked against its contract and validated with fp16's
tolerances like any other variant, on a real 2-layer GPT-2."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from click.testing import CliRunner

import onnxbuild
from onnxbuild.cli import cli
from onnxbuild.recipe.variants import VARIANT_TOLERANCES
from onnxbuild.spec import STEP_KINDS
from tests.helpers_tiny import TINY_GPT2_SOURCE

PACKAGE = Path(onnxbuild.__file__).resolve().parent

RECIPE: dict[str, Any] = {
    "name": "tiny-fp16",
    "source": TINY_GPT2_SOURCE,
    "export": {"with_past": True, "outputs": ["logits"]},
    "validate": {"shapes": [{"batch": 1, "sequence": 8}, {"batch": 2, "sequence": 16}]},
    "optimize": {"level": "basic", "transformer": {"model_type": "gpt2"}},
    "convert": [
        {"name": "fp16", "from": "optimized"},
        {"name": "fp16-model", "keep_io_types": False, "validate": {"atol": 0.3}},
    ],
    "expect": {"fp16": {"weights": {"float16": 0.9}}},
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("convert")
    (root / "recipes").mkdir()
    path = root / "recipes" / "tiny-fp16.yaml"
    path.write_text(yaml.safe_dump(RECIPE, sort_keys=False), encoding="utf-8")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.chdir(root)
    try:
        report = onnxbuild.build(
            [path], onnxbuild.Settings(cache_dir=root / "cache", artifacts_dir=root / "artifacts"), jobs=1
        )
    finally:
        mp.undo()
    assert report.ok, report.failures()
    return root


def test_an_fp16_variant_is_built_from_the_variant_it_names_and_validated_with_fp16_tolerances(built: Path) -> None:
    folder = built / "artifacts" / "tiny-fp16"
    model = onnx.load_model(str(folder / "fp16" / "model.onnx"))
    weights = [t for t in model.graph.initializer if len(t.dims) >= 2]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
    assert {o.name: o.type.tensor_type.elem_type for o in model.graph.output}[
        "logits"
    ] == onnx.TensorProto.FLOAT  # keep_io_types
    own = onnx.load_model(str(folder / "fp16-model" / "model.onnx"))
    assert {o.name: o.type.tensor_type.elem_type for o in own.graph.output}["logits"] == onnx.TensorProto.FLOAT16
    merged = json.loads((folder / "reports" / "validation.json").read_text(encoding="utf-8"))
    assert set(merged["variants"]) == {"model", "optimized", "fp16", "fp16-model"} and merged["passed"] is True
    for name, atol in (("fp16", VARIANT_TOLERANCES["fp16"]["atol"]), ("fp16-model", 0.3)):
        v = json.loads((folder / "reports" / "validation" / f"{name}.json").read_text(encoding="utf-8"))["variants"][
            name
        ]
        assert v["passed"] is True and v["atol"] == atol and v["top1_min"] == VARIANT_TOLERANCES["fp16"]["top1_min"]
        assert {o["atol"] for case in v["shapes"] for o in case["outputs"].values()} == {atol}
    contract = json.loads((folder / "reports" / "expect" / "fp16.json").read_text(encoding="utf-8"))
    assert [c["ok"] for c in contract["checks"]] == [True]


def test_explain_mismatch_compares_an_fp16_variant_with_the_variant_it_was_made_from(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(built)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(
        cli,
        [
            "explain-mismatch",
            "recipes/tiny-fp16.yaml",
            "--variant",
            "fp16",
            "--cache-dir",
            "cache",
            "--artifacts-dir",
            "artifacts",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (
        result.output.startswith("tiny-fp16: fp16 (artifacts/tiny-fp16/fp16/model.onnx) against optimized at ")
        and "(atol 0.2, rtol 0.05)" in result.output
    )


def _named_in(path: Path, names: set[str]) -> dict[str, int]:
    """How often each of ``names`` appears as a whole string constant in ``path``'s code."""
    counts: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            counts[node.value] = counts.get(node.value, 0) + 1
    return counts


def test_the_convert_kind_is_named_only_in_its_module_the_registry_and_the_schema() -> None:
    """The recipe layer, the engine, validate, benchmark and api find its variants through
    the kind's own ``variants(recipe)`` and the schema's ``x-variants`` mark, not by name."""
    assert "convert" in STEP_KINDS
    schema = json.loads((PACKAGE / "recipe" / "schema.json").read_text(encoding="utf-8"))
    assert schema["properties"]["convert"]["x-variants"] is True and "convert" in schema["$defs"]
    named = {
        path.relative_to(PACKAGE).as_posix(): n
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).as_posix() not in ("steps/convert.py", "spec.py")
        for n in [_named_in(path, {"convert"}).get("convert", 0)]
        if n
    }
    assert named == {}, f"the convert kind is named outside its module and the registry: {named}"


PARTS_OF_KINDS = {
    "benchmarking": "benchmark",
    "validating": "validate",
    "quantizing": "quantize",
    "exporting": "export",
    "vlm": "huggingface",  # sources/vlm*.py: the huggingface kind's vision-language files and their checks
    "vlm_families": "huggingface",
    "vision_encoder_decoder": "huggingface",  # its image-to-text tables and checks
}
PACKAGE_LISTS = ("PACKAGES", "REPORTED")
"""Tuples of distribution names (the ``onnx`` package is not the onnx source kind)."""

# Where a kind's name is still written outside its module, it names something else. Each
# (file, word) with how often and why; the test fails on a new one and on one that went away.
SAME_WORD_ELSEWHERE: dict[tuple[str, str], int] = {
    # the PyTorch engine: benchmark rows' "engine", benchmark.baseline's value, and the
    # accuracy and generation reports' fields (the pytorch source kind is not meant)
    ("report/benchmark.py", "pytorch"): 3,
    ("report/generation.py", "pytorch"): 2,
    ("report/page.py", "pytorch"): 2,
    ("report/validation.py", "pytorch"): 3,
    ("recipe/sections.py", "pytorch"): 1,
    ("steps/benchmark.py", "pytorch"): 1,
    ("steps/benchmarking/decode.py", "pytorch"): 1,
    ("steps/benchmarking/pytorch.py", "pytorch"): 5,
    ("steps/benchmarking/targets.py", "pytorch"): 2,
    ("steps/generate.py", "pytorch"): 1,
    ("steps/validate.py", "pytorch"): 3,
    ("steps/validating/checks.py", "pytorch"): 1,
    # the validation report's "reference": the framework compared against (SourceKind.framework)
    ("report/validation.py", "tensorflow"): 1,
    # the machine figures were measured on: the benchmark's identity and report field, and
    # platform.machine() in the environment record
    ("environment.py", "machine"): 1,
    ("report/benchmark.py", "machine"): 1,
    ("report/page.py", "machine"): 2,
    ("steps/benchmark.py", "machine"): 2,
    # optimize.decoder's value "export" (the exported graph, as the schema spells it) and the
    # optimize report's decoder.graph field
    ("recipe/sections.py", "export"): 1,
    ("steps/optimize.py", "export"): 2,
    ("steps/optimize.py", "graph"): 2,
    # the GGUF report's "onnx" field: the ONNX initializer a GGUF tensor became
    ("steps/quantizing/gguf.py", "onnx"): 2,
    # the report page's section title
    ("report/page.py", "benchmark"): 1,
    # a quantize entry's own `validate:` key in its TypedDict (a literal key: mypy needs one)
    ("recipe/sections.py", "validate"): 1,
}


def _kind_words(path: Path, names: set[str]) -> dict[str, int]:
    """Like _named_in, less the distribution names in package lists."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {
        id(c)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in PACKAGE_LISTS for t in node.targets)
        for c in ast.walk(node.value)
    }
    counts: dict[str, int] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in names
            and id(node) not in skip
        ):
            counts[node.value] = counts.get(node.value, 0) + 1
    return counts


def test_no_kind_is_named_outside_its_module_the_registries_and_the_schema() -> None:
    """Every other module finds a kind through its module (``export.section(resolved)``,
    ``rules.own(entry)``), what it says of itself (``SourceKind.transformers``, ``StepKind.check``)
    or the registry, so adding or changing a kind touches its module, a registry line and the
    schema. The registries are spec.py's STEP_KINDS and the two packages' __init__."""
    from onnxbuild.sources import kinds

    names = {*STEP_KINDS, *kinds()} - {"source", "check", "report"}  # words as much as kinds
    found: dict[tuple[str, str], int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ("spec.py", "steps/__init__.py", "sources/__init__.py"):
            continue
        # a kind's parts (steps/benchmarking/ for benchmark) count as its own module
        own = rel.removeprefix("steps/").removeprefix("sources/").removesuffix(".py").split("/")[0]
        own = PARTS_OF_KINDS.get(own, own)
        found.update({(rel, word): n for word, n in _kind_words(path, names).items() if word != own})
    new = {k: n for k, n in found.items() if n > SAME_WORD_ELSEWHERE.get(k, 0)}
    gone = {k: n for k, n in SAME_WORD_ELSEWHERE.items() if found.get(k, 0) < n}
    assert not new, f"kinds named outside their modules: {new}; find the kind through its module instead"
    assert not gone, f"fewer than listed (lower SAME_WORD_ELSEWHERE): {gone}"
