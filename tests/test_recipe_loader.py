"""The recipe language: safe YAML, schema and cross-field checks, defaults, the memo.

Bad recipes are a table mapping YAML to the exact problems reported, each as
``file:line:col: path: message``; a wording change shows up here as a diff.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from onnxbuild import api
from onnxbuild.api import load_recipe, parse_recipe
from onnxbuild.errors import RecipeError
from onnxbuild.recipe.loader import MAX_RECIPE_BYTES

DATA = Path(__file__).resolve().parent / "data"
RECIPES = Path(__file__).resolve().parent.parent / "recipes"

# A valid graph recipe; cases below break one thing in it. Line numbers in the
# expected messages count from `name:` as line 1.
GRAPH = """\
name: lr
source:
  graph:
    inputs:
      - {name: X, dtype: float32, shape: [batch, 4]}
    outputs:
      - {name: Y, dtype: float32, shape: [batch, 2]}
    initializers:
      - {name: A, dtype: float32, shape: [4, 2], random: {seed: 0}}
    nodes:
      - {op_type: MatMul, inputs: [X, A], outputs: [Y]}
"""

# A valid Hugging Face recipe (5 lines); cases append sections from line 6 on.
HF = """\
name: tiny
source:
  huggingface:
    model: openai-community/gpt2
    task: text-generation
"""

ONNX = "source: {onnx: {path: m.onnx}}\n"

TOP_KEYS = (
    "benchmark, convert, description, expect, export, generate, limits, name, optimize, providers, "
    "quantize, serve, source, validate"
)
NAME_RULE = "a name of letters, digits, '.', '_' or '-' (at most 64, no path separators), e.g. gpt2-small"
SOURCES = "exactly one of: onnx, graph, huggingface, pytorch, tensorflow"


def bomb(levels: int) -> str:
    """A "billion laughs" document: 10**levels values from ``levels`` lines."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


BAD: list[Any] = [
    # ---------------------------------------------------------------- YAML itself
    pytest.param(
        "name: a\nsource: [1, 2\n",
        [
            "r.yaml:3:1: YAML syntax error: did not find expected ',' or ']' (while parsing a flow sequence that "
            "starts at line 2, column 9)"
        ],
        id="syntax-unclosed-bracket",
    ),
    pytest.param(
        'name: "abc\nsource: {}\n',
        [
            "r.yaml:3:1: YAML syntax error: found unexpected end of stream (while scanning a quoted scalar that "
            "starts at line 1, column 7)"
        ],
        id="syntax-unclosed-quote",
    ),
    pytest.param(
        "name: a\n  source: b\n",
        ["r.yaml:2:9: YAML syntax error: mapping values are not allowed in this context"],
        id="syntax-bad-indent",
    ),
    pytest.param(
        "name: a\nsource:\n\tonnx: {path: m.onnx}\n",
        [
            "r.yaml:3:1: YAML syntax error: found character that cannot start any token (indent with spaces; YAML "
            "does not allow tabs)"
        ],
        id="tab-indent",
    ),
    pytest.param(
        "name: a\nname: b\n" + ONNX,
        ["r.yaml:2:1: name: duplicate key (first at line 1); remove one of them"],
        id="duplicate-key",
    ),
    pytest.param(
        "name: a\nsource:\n  onnx: {path: m.onnx, path: n.onnx}\n",
        ["r.yaml:3:24: source.onnx.path: duplicate key (first at line 3); remove one of them"],
        id="duplicate-nested-key",
    ),
    pytest.param(
        "name: a\n1: b\n" + ONNX,
        ["r.yaml:2:1: keys must be strings (got '1'); quote the key"],
        id="non-string-key",
    ),
    pytest.param(
        "name: a\n[1, 2]: b\n" + ONNX,
        ["r.yaml:2:1: keys must be strings (got a list or mapping); quote the key"],
        id="collection-key",
    ),
    pytest.param(
        "name: !!python/object/apply:os.system ['echo pwned']\n" + ONNX,
        ["r.yaml:1:7: name: tag !!python/object/apply:os.system is not allowed in a recipe (only plain YAML values)"],
        id="python-tag",
    ),
    pytest.param(
        "name: !custom a\n" + ONNX,
        ["r.yaml:1:7: name: tag !custom is not allowed in a recipe (only plain YAML values)"],
        id="custom-tag",
    ),
    pytest.param(
        "base: &b {path: m.onnx}\nname: a\nsource: {onnx: {<<: *b}}\n",
        ["r.yaml:3:17: source.onnx: merge keys (<<) are not supported; write the keys out"],
        id="merge-key",
    ),
    pytest.param(
        bomb(9),
        ["r.yaml:1:1: the document expands to more than 100000 values (YAML aliases?); a recipe is far smaller"],
        id="alias-bomb",
    ),
    pytest.param(
        "a: &a [*a]\n",
        ["r.yaml:1:1: the document is nested too deeply (recursive YAML alias?)"],
        id="recursive-alias",
    ),
    pytest.param(
        "x:\n" + "".join(f"{'  ' * i}- \n" for i in range(150)),
        ["r.yaml:101:199: the document is nested more than 100 levels deep; a recipe is far flatter"],
        id="deep-nesting",
    ),
    pytest.param(
        "name: a\x07b\n" + ONNX,
        ["r.yaml:1:8: YAML does not allow the control character U+0007; remove it"],
        id="control-character",
    ),
    pytest.param(
        "name: a\n---\nname: b\n",
        ["r.yaml:2:1: YAML syntax error: expected a single document in the stream, but found another document"],
        id="two-documents",
    ),
    pytest.param(
        "",
        ["r.yaml:1:1: the recipe is empty; it needs at least `name:` and `source:` (see recipes/ for examples)"],
        id="empty-file",
    ),
    pytest.param(
        "# only a comment\n",
        ["r.yaml:1:1: the recipe is empty; it needs at least `name:` and `source:` (see recipes/ for examples)"],
        id="only-comments",
    ),
    pytest.param(
        "- name: a\n",
        ["r.yaml:1:1: a recipe is a mapping of keys (name, source, ...), not a list"],
        id="list-document",
    ),
    pytest.param(
        "just some text\n",
        ["r.yaml:1:1: a recipe is a mapping of keys (name, source, ...), not a string"],
        id="scalar-document",
    ),
    # ---------------------------------------------------------------- schema
    pytest.param(
        "name: a\nsoruce: {onnx: {path: m.onnx}}\n",
        [
            f"r.yaml:1:1: missing required key 'source' ({SOURCES})",
            f"r.yaml:2:1: soruce: unknown key (did you mean 'source'? expected one of: {TOP_KEYS})",
        ],
        id="unknown-top-level-key",
    ),
    pytest.param(
        "name: a\n" + ONNX + "exprot: {opset: 18}\n",
        [f"r.yaml:3:1: exprot: unknown key (did you mean 'export'? expected one of: {TOP_KEYS})"],
        id="unknown-key-did-you-mean",
    ),
    pytest.param(
        GRAPH.replace("random: {seed: 0}", "random: {seed: 0, sead: 1}"),
        [
            "r.yaml:9:68: source.graph.initializers[0].random.sead: unknown key (did you mean 'seed'? expected "
            "one of: distribution, scale, seed)"
        ],
        id="unknown-nested-key",
    ),
    pytest.param(
        "name: a\nsource:\n  onnx: {path: m.onnx, extra: 1}\n",
        ["r.yaml:3:24: source.onnx.extra: unknown key (expected one of: path)"],
        id="unknown-key-no-suggestion",
    ),
    pytest.param(
        ONNX,
        [f"r.yaml:1:1: missing required key 'name' ({NAME_RULE})"],
        id="missing-name",
    ),
    pytest.param(
        "name: a\n",
        [f"r.yaml:1:1: missing required key 'source' ({SOURCES})"],
        id="missing-source",
    ),
    pytest.param(
        "name: a\nsource:\n  onnx: {path: m.onnx}\n  pytorch: {factory: 'm.py:f'}\n",
        [f"r.yaml:2:1: source: must name {SOURCES} (got onnx, pytorch)"],
        id="source-two-kinds",
    ),
    pytest.param(
        "name: a\nsource: {}\n",
        [f"r.yaml:2:1: source: must name {SOURCES} (got nothing)"],
        id="source-no-kind",
    ),
    pytest.param(
        "name: a\nsource: onnx\n",
        [f'r.yaml:2:9: source: must be a mapping naming {SOURCES} (got "onnx")'],
        id="source-not-a-mapping",
    ),
    pytest.param(
        "name: a\nsource:\n  onnx:\n",
        ["r.yaml:3:8: source.onnx: must be a mapping (got null)"],
        id="source-null",
    ),
    pytest.param(
        "name: a\nsource:\n  graph:\n    inputs: [{name: X, dtype: float32, shape: [1]}]\n"
        "    outputs: [{name: X, dtype: float32, shape: [1]}]\n",
        ["r.yaml:3:3: source.graph: missing required key 'nodes' (a list)"],
        id="graph-missing-nodes",
    ),
    pytest.param(
        "name: models/gpt2\n" + ONNX,
        [f'r.yaml:1:7: name: must be {NAME_RULE} (got "models/gpt2")'],
        id="name-with-slash",
    ),
    pytest.param(
        "name: yes\n" + ONNX,
        [
            f"r.yaml:1:7: name: must be {NAME_RULE} (got true; YAML read this as a boolean, put the value in "
            "quotes to make it text)"
        ],
        id="name-read-as-boolean",
    ),
    pytest.param(
        HF + "export:\n  opset: 30\n",
        ["r.yaml:7:10: export.opset: must be an integer from 7 to 23 (got 30)"],
        id="opset-out-of-range",
    ),
    pytest.param(
        HF + "export:\n  opset: eighteen\n",
        ['r.yaml:7:10: export.opset: must be an integer from 7 to 23 (got "eighteen")'],
        id="opset-not-integer",
    ),
    pytest.param(
        HF + "export:\n  exporter: onnx\n",
        ['r.yaml:7:13: export.exporter: must be one of: torchscript, dynamo, fused (got "onnx")'],
        id="exporter-enum",
    ),
    pytest.param(
        HF + "export:\n  exporter: fused\n",
        [
            "r.yaml:7:13: export.exporter: fused writes a text-generation decoder's graph with its KV cache: "
            "it needs a huggingface text-generation source and export.with_past: true; use exporter: torchscript"
        ],
        id="fused-exporter-without-cache",
    ),
    pytest.param(
        HF + "export:\n  exporter: fused\n  with_past: true\noptimize:\n  decoder: fused\n",
        [
            "r.yaml:10:12: optimize.decoder: export.exporter: fused already writes the fused graph: remove "
            "optimize.decoder (or the optimize section; quantize from: model)"
        ],
        id="fused-exporter-and-fused-optimize",
    ),
    pytest.param(
        HF.replace("text-generation", "generation"),
        [
            "r.yaml:5:11: source.huggingface.task: must be one of: feature-extraction, text-classification, "
            "token-classification, question-answering, fill-mask, text-generation, text2text-generation, "
            "automatic-speech-recognition, image-classification, image-feature-extraction, object-detection, "
            "semantic-segmentation, audio-classification, zero-shot-image-classification, multiple-choice, "
            'sentence-similarity, image-text-to-text, image-to-text (got "generation")'
        ],
        id="task-enum",
    ),
    pytest.param(
        HF + "validate:\n  atol: -1\n",
        ["r.yaml:7:9: validate.atol: must be a number >= 0 (got -1)"],
        id="negative-atol",
    ),
    pytest.param(
        HF + "validate:\n  shapes:\n    - {batch: 0, sequence: 8}\n",
        ["r.yaml:8:15: validate.shapes[0].batch: must be an integer from 1 to 1048576 (got 0)"],
        id="shape-size-zero",
    ),
    pytest.param(
        HF + "validate:\n  shapes:\n    - {batch: 1, sequence: 8, 1x: 2}\n",
        ["r.yaml:8:31: validate.shapes[0].1x: not a dimension name; use an identifier such as batch or sequence"],
        id="shape-bad-dimension-name",
    ),
    pytest.param(
        GRAPH.replace("shape: [4, 2]", "shape: [4, 2.5]"),
        ["r.yaml:9:46: source.graph.initializers[0].shape[1]: must be an integer >= 0 (got 2.5)"],
        id="initializer-dim-not-integer",
    ),
    pytest.param(
        GRAPH.replace("shape: [batch, 4]", "shape: [batch, 4.5]"),
        [
            "r.yaml:5:50: source.graph.inputs[0].shape[1]: must be a non-negative integer or a symbolic dimension "
            "name such as batch (got 4.5)"
        ],
        id="input-dim-not-integer",
    ),
    pytest.param(
        GRAPH.replace("dtype: float32, shape: [batch, 4]", "dtype: float, shape: [batch, 4]"),
        [
            "r.yaml:5:26: source.graph.inputs[0].dtype: must be one of: float32, float16, bfloat16, float64, "
            'int8, uint8, int16, int32, int64, bool (got "float")'
        ],
        id="dtype-enum",
    ),
    pytest.param(
        GRAPH + "benchmark: {iterations: 0}\n",
        ["r.yaml:12:25: benchmark.iterations: must be an integer >= 1 (got 0)"],
        id="nullable-section-explains-inside",
    ),
    pytest.param(
        GRAPH + "optimize: {level: fast, transformer: {num_heads: -1}}\n",
        [
            'r.yaml:12:19: optimize.level: must be one of: none, basic, extended, layout, all (got "fast")',
            "r.yaml:12:50: optimize.transformer.num_heads: must be an integer >= 0 (got -1)",
        ],
        id="nested-nullable-sections",
    ),
    pytest.param(
        GRAPH + "benchmark: fast\n",
        ['r.yaml:12:12: benchmark: must be a mapping, or null for no benchmark (got "fast")'],
        id="nullable-section-wrong-type",
    ),
    pytest.param(
        "name: a\nsource:\n  pytorch:\n    factory: model.py\n",
        [
            'r.yaml:4:14: source.pytorch.factory: must be "path/to/file.py:function" or "package.module:function" '
            '(got "model.py")'
        ],
        id="pytorch-factory-format",
    ),
    pytest.param(
        "name: a\n" + ONNX + "providers: [{name: CPU}]\n",
        [
            "r.yaml:3:20: providers[0].name: must be an ONNX Runtime provider name such as CPUExecutionProvider "
            "or CUDAExecutionProvider, web (onnxruntime-web under Node.js) or openvino (the OpenVINO CPU plugin) "
            '(got "CPU")'
        ],
        id="provider-name",
    ),
    pytest.param(
        GRAPH + "quantize:\n  - {name: q}\n",
        [
            "r.yaml:13:5: quantize[0]: missing required key 'method' "
            "(one of: dynamic, static, int4, weight_only, gguf, smooth_int8)"
        ],
        id="quantize-missing-method",
    ),
    pytest.param(
        # Every schema problem in the file comes back at once, in file order.
        "name: a/b\nsource:\n  onnx: {path: m.onnx, extra: 1}\nexport:\n  opset: eighteen\n  exporter: onnx\n"
        "providers: []\n",
        [
            f'r.yaml:1:7: name: must be {NAME_RULE} (got "a/b")',
            "r.yaml:3:24: source.onnx.extra: unknown key (expected one of: path)",
            'r.yaml:5:10: export.opset: must be an integer from 7 to 23 (got "eighteen")',
            'r.yaml:6:13: export.exporter: must be one of: torchscript, dynamo, fused (got "onnx")',
            "r.yaml:7:12: providers: must have at least 1 item",
        ],
        id="all-problems-at-once",
    ),
    # ---------------------------------------------------------------- cross-field checks
    pytest.param(
        HF + "validate:\n  shapes:\n    - {batch: 1, sequence: 8, heads: 2}\n",
        ["r.yaml:8:31: validate.shapes[0].heads: unknown dimension (the inputs use: batch, sequence)"],
        id="validate-shape-unknown-dim",
    ),
    pytest.param(
        HF + "validate:\n  shapes:\n    - {batch: 1}\n",
        ["r.yaml:8:7: validate.shapes[0]: missing a size for dimension 'sequence' (the inputs use: batch, sequence)"],
        id="validate-shape-missing-dim",
    ),
    pytest.param(
        GRAPH.replace("inputs: [X, A]", "inputs: [X, W]"),
        [
            "r.yaml:11:39: source.graph.nodes[0].inputs[1]: 'W' is not a graph input, an initializer or the "
            "output of an earlier node"
        ],
        id="node-input-undefined",
    ),
    pytest.param(
        GRAPH.replace("outputs: [Y]}", "outputs: [Z]}"),
        ["r.yaml:7:16: source.graph.outputs[0].name: 'Y' is not produced by any node"],
        id="graph-output-not-produced",
    ),
    pytest.param(
        GRAPH.replace("random: {seed: 0}", "values: [1, 2, 3]"),
        ["r.yaml:9:58: source.graph.initializers[0].values: has 3 values but shape [4, 2] needs 8"],
        id="initializer-values-count",
    ),
    pytest.param(
        GRAPH.replace("random: {seed: 0}", "values: [[1, 2], [3, 4], [5, 6]]"),
        ["r.yaml:9:58: source.graph.initializers[0].values: has 6 values but shape [4, 2] needs 8"],
        id="initializer-nested-values-count",
    ),
    pytest.param(
        GRAPH.replace("random: {seed: 0}", "values: [1, 2, 3, 4, 5, 6, 7, 8], random: {seed: 0}"),
        [
            "r.yaml:9:9: source.graph.initializers[0]: give exactly one of `values` (the numbers) and `random` (a "
            "seed); it has both"
        ],
        id="initializer-values-and-random",
    ),
    pytest.param(
        GRAPH.replace(", random: {seed: 0}", ""),
        [
            "r.yaml:9:9: source.graph.initializers[0]: give exactly one of `values` (the numbers) and `random` (a "
            "seed); it has neither"
        ],
        id="initializer-neither",
    ),
    pytest.param(
        GRAPH + "export:\n  opset: 18\n",
        [
            "r.yaml:12:1: export: applies only to huggingface, pytorch and tensorflow sources (this recipe's "
            "source is graph); remove it"
        ],
        id="export-on-graph-source",
    ),
    pytest.param(
        HF.replace("    task", "    package: pkg/model\n    task"),
        [
            "r.yaml:3:3: source.huggingface: give exactly one of `model` (Hub id or folder) and `package` (a "
            "folder inside an installed package); it has both"
        ],
        id="huggingface-model-and-package",
    ),
    pytest.param(
        HF.replace("    model: openai-community/gpt2\n", ""),
        [
            "r.yaml:3:3: source.huggingface: give exactly one of `model` (Hub id or folder) and `package` (a "
            "folder inside an installed package); it has neither"
        ],
        id="huggingface-neither",
    ),
    pytest.param(
        "name: mlp\nsource:\n  pytorch:\n    factory: model.py:build\n",
        [
            "r.yaml:3:3: source.pytorch: a pytorch source needs export.inputs (name, dtype and shape of each "
            "model input)"
        ],
        id="pytorch-without-export",
    ),
    pytest.param(
        "name: mlp\nsource:\n  pytorch:\n    factory: model.py:build\nexport:\n  opset: 18\n",
        ["r.yaml:5:1: export: a pytorch source needs export.inputs (name, dtype and shape of each model input)"],
        id="pytorch-without-export-inputs",
    ),
    pytest.param(
        "name: mlp\nsource:\n  pytorch:\n    factory: model.py:build\nexport:\n  inputs:\n"
        "    - {name: x, shape: [batch, 4]}\n    - {name: x, shape: [batch, 4]}\n",
        ["r.yaml:8:14: export.inputs[1].name: input 'x' is listed twice (first as export.inputs[0])"],
        id="duplicate-export-input",
    ),
    pytest.param(
        "name: mlp\nsource:\n  pytorch:\n    factory: model.py:build\nexport:\n  inputs:\n"
        "    - {name: x, shape: [batch, 4]}\n  sample: {sequence: 3}\n",
        ["r.yaml:8:3: export.sample: give a sample size for dimension 'batch' (e.g. sample: {batch: 2})"],
        id="sample-missing-dim",
    ),
    pytest.param(
        GRAPH + "quantize:\n  - {name: int8, method: dynamic}\n  - {name: int8, method: static}\n",
        ["r.yaml:14:12: quantize[1].name: variant name 'int8' is used twice; names must be unique"],
        id="duplicate-quantize-names",
    ),
    pytest.param(
        GRAPH + "quantize:\n  - {name: q, method: dynamic, from: optimized}\n",
        ["r.yaml:13:38: quantize[0].from: quantizes the optimized variant, but the recipe has no optimize section"],
        id="quantize-from-missing-optimize",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_bad_recipe(text: str, expected: list[str]) -> None:
    with pytest.raises(RecipeError) as exc:
        parse_recipe(text, "r.yaml")
    assert [str(p) for p in exc.value.problems] == expected
    assert exc.value.exit_code == 2


def test_deep_nesting_does_not_crash_the_process() -> None:
    """200 KB of ``[`` once overflowed libyaml's C stack: a segfault, not an error message.

    Run in a child process so that a regression fails this test instead of killing pytest.
    """
    code = (
        "from onnxbuild.errors import RecipeError\n"
        "from onnxbuild.api import parse_recipe\n"
        "try:\n"
        "    parse_recipe('x: ' + '[' * 100_000 + ']' * 100_000, 'r.yaml')\n"
        "except RecipeError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    # Where it stops depends on the libyaml build (ours counts to 101; libyaml >= 0.2.6 stops
    # flow nesting at 1000 while scanning ahead); the verdict and the message do not.
    assert (done.returncode, done.stderr) == (0, "")
    assert re.fullmatch(
        r"r\.yaml:1:(103|1003): the document is nested more than 100 levels deep; a recipe is far flatter\n",
        done.stdout,
    )


BAD_FILES = {
    "several-problems.yaml": [
        f'bad/several-problems.yaml:2:7: name: must be {NAME_RULE} (got "my/model")',
        "bad/several-problems.yaml:4:28: source.onnx.checksum: unknown key (expected one of: path)",
        f"bad/several-problems.yaml:5:1: exprot: unknown key (did you mean 'export'? expected one of: {TOP_KEYS})",
        "bad/several-problems.yaml:7:12: providers: must have at least 1 item",
        "bad/several-problems.yaml:8:25: benchmark.iterations: must be an integer >= 1 (got 0)",
    ],
    "tabs.yaml": [
        "bad/tabs.yaml:4:1: YAML syntax error: found character that cannot start any token (indent with spaces; "
        "YAML does not allow tabs)",
    ],
    "python-tag.yaml": [
        "bad/python-tag.yaml:2:7: name: tag !!python/object/apply:os.system is not allowed in a recipe (only "
        "plain YAML values)",
    ],
    "alias-bomb.yaml": [
        "bad/alias-bomb.yaml:1:1: the document expands to more than 100000 values (YAML aliases?); a recipe is "
        "far smaller",
    ],
    "gpt2-typos.yaml": [
        'bad/gpt2-typos.yaml:7:10: export.opset: must be an integer from 7 to 23 (got "eighteen")',
        "bad/gpt2-typos.yaml:8:3: export.exproter: unknown key (did you mean 'exporter'? expected one of: "
        "constant_folding, device, exporter, external_data, inputs, opset, outputs, sample, weights, with_past)",
        "bad/gpt2-typos.yaml:10:9: validate.atol: must be a number >= 0 (got -1)",
    ],
    "dangling-graph.yaml": [
        "bad/dangling-graph.yaml:7:16: source.graph.outputs[0].name: 'Y' is not produced by any node",
        "bad/dangling-graph.yaml:9:58: source.graph.initializers[0].values: has 3 values but shape [4, 2] needs 8",
        "bad/dangling-graph.yaml:11:39: source.graph.nodes[0].inputs[1]: 'W' is not a graph input, an initializer "
        "or the output of an earlier node",
    ],
}


def test_every_bad_file_has_expectations() -> None:
    assert sorted(p.name for p in (DATA / "bad").glob("*.yaml")) == sorted(BAD_FILES)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_recipe_file(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(DATA)
    memo = tmp_path / "memo"
    with pytest.raises(RecipeError) as exc:
        load_recipe(f"bad/{name}", memo_dir=memo)
    assert [str(p) for p in exc.value.problems] == BAD_FILES[name]
    assert not memo.exists(), "a recipe that fails to load must leave nothing behind"


# ---------------------------------------------------------------- unreadable files


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as exc:
        load_recipe(tmp_path / "nope.yaml")
    assert (
        str(exc.value) == f"{tmp_path / 'nope.yaml'}: no such file (check the path; recipes usually live in recipes/)"
    )


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as exc:
        load_recipe(tmp_path)
    assert str(exc.value) == f"{tmp_path}: is a directory, not a recipe file (name a .yaml file inside it)"


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07\x12\x07pytorch\x00\x00")
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    assert str(exc.value) == f"{path}: is a binary file, not YAML text"


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: a\ndescription: naïve café\n".encode("latin-1"))
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    assert str(exc.value) == f"{path}:2:16: is not valid UTF-8 text (save the file as UTF-8)"


def test_not_utf8_column_counts_characters(tmp_path: Path) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_bytes("name: a\ndescription: é".encode() + b"\xff\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    assert str(exc.value) == f"{path}:2:15: is not valid UTF-8 text (save the file as UTF-8)"


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"name: a\n" + b"#" * MAX_RECIPE_BYTES)
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    size = MAX_RECIPE_BYTES + 8
    assert str(exc.value) == f"{path}: is {size} bytes; a recipe must be at most {MAX_RECIPE_BYTES} bytes (1 MiB)"


def test_file_of_exactly_the_limit_loads(tmp_path: Path) -> None:
    head = b"name: a\n" + ONNX.encode()
    path = tmp_path / "full.yaml"
    path.write_bytes(head + b"#" * (MAX_RECIPE_BYTES - len(head)))
    assert load_recipe(path).name == "a"


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(("\ufeffname: a\n" + ONNX).encode())
    assert load_recipe(path).name == "a"


# ---------------------------------------------------------------- YAML values


def test_yaml_1_1_surprises_are_data_not_objects() -> None:
    """Dates stay text and quoted values stay strings: a recipe holds only JSON-able data."""
    resolved = parse_recipe('name: "123"\ndescription: 2024-01-31\n' + ONNX, "r.yaml")
    assert resolved["name"] == "123"
    assert resolved["description"] == "2024-01-31"
    json.dumps(resolved)


def test_good_files_load() -> None:
    names = {p.name: load_recipe(p).name for p in sorted((DATA / "good").glob("*.yaml"))}
    assert names == {"onnx-file.yaml": "onnx-file", "pytorch-mlp.yaml": "pytorch-mlp", "quoted-values.yaml": "123"}


# ---------------------------------------------------------------- defaults


def test_tiny_gpt2_defaults() -> None:
    r = load_recipe(RECIPES / "tiny-gpt2.yaml").resolved
    export, validate = r["export"], r["validate"]
    assert export["opset"] == 18
    assert export["exporter"] == "torchscript"
    assert export["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}]
    assert export["outputs"] == ["logits"]
    assert export["sample"] == {"batch": 2, "sequence": 16}
    assert validate["shapes"] == [
        {"batch": 1, "sequence": 1},
        {"batch": 2, "sequence": 16},
        {"batch": 5, "sequence": 33},
    ]
    # An axis the export fixed by mistake fails validation only at a shape unlike the sample.
    sample = export["sample"]
    assert any(s["batch"] != sample["batch"] and s["sequence"] != sample["sequence"] for s in validate["shapes"])
    assert (validate["atol"], validate["rtol"], validate["top1_min"]) == (1e-4, 1e-3, 0.99)
    assert r["source"]["huggingface"]["revision"] == "main"
    assert r["providers"] == [{"name": "CPUExecutionProvider", "options": {}}]
    assert (r["optimize"], r["quantize"], r["benchmark"]) == (None, [], None)


def test_graph_recipe_has_no_export_or_validate() -> None:
    r = load_recipe(RECIPES / "linear-regression.yaml").resolved
    assert "export" not in r
    assert "validate" not in r
    a, b = r["source"]["graph"]["initializers"]
    assert a["random"] == {"seed": 0, "distribution": "normal", "scale": 1.0}
    assert b["values"] == [0.5, -0.5]
    assert r["source"]["graph"]["nodes"][0] == {
        "op_type": "MatMul",
        "inputs": ["X", "A"],
        "outputs": ["XA"],
        "domain": "",
        "attributes": {},
    }


def test_pytorch_defaults_follow_the_sample() -> None:
    r = load_recipe(DATA / "good" / "pytorch-mlp.yaml").resolved
    assert r["export"]["outputs"] == ["output"]
    assert r["export"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}]
    assert r["validate"]["shapes"] == [{"batch": 1}, {"batch": 3}, {"batch": 7}]
    assert r["validate"]["top1_min"] is None


def test_explicit_values_win_over_defaults() -> None:
    r = load_recipe(RECIPES / "gpt2.yaml").resolved
    assert r["validate"]["shapes"] == [
        {"batch": 1, "sequence": 8},
        {"batch": 2, "sequence": 16},
        {"batch": 3, "sequence": 64},
        {"batch": 1, "sequence": 128},
    ]


@pytest.mark.parametrize("name", ["tiny-gpt2", "linear-regression", "gpt2"])
def test_show_is_stable(name: str) -> None:
    path = RECIPES / f"{name}.yaml"
    assert api.show(path) == api.show(path)


def test_show_output_is_a_recipe_that_resolves_to_itself(tmp_path: Path) -> None:
    first = load_recipe(RECIPES / "linear-regression.yaml").resolved
    shown = tmp_path / "shown.yaml"
    shown.write_text(api.show(RECIPES / "linear-regression.yaml"), encoding="utf-8")
    assert load_recipe(shown).resolved == first


def test_show_output_of_a_huggingface_recipe_loads(tmp_path: Path) -> None:
    shown = tmp_path / "shown.yaml"
    shown.write_text(api.show(RECIPES / "tiny-gpt2.yaml"), encoding="utf-8")
    assert load_recipe(shown).resolved == load_recipe(RECIPES / "tiny-gpt2.yaml").resolved


# ---------------------------------------------------------------- the memo


@pytest.mark.parametrize("name", ["tiny-gpt2", "linear-regression", "gpt2"])
def test_memo_gives_the_same_recipe(name: str, tmp_path: Path) -> None:
    path = RECIPES / f"{name}.yaml"
    memo = tmp_path / "memo"
    plain = load_recipe(path)
    written = load_recipe(path, memo_dir=memo)
    assert len(list(memo.iterdir())) == 1
    read_back = load_recipe(path, memo_dir=memo)
    assert plain == written == read_back


def test_memo_is_used_and_a_damaged_one_is_ignored(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: a\n" + ONNX, encoding="utf-8")
    memo = tmp_path / "memo"
    load_recipe(recipe, memo_dir=memo)
    (entry,) = memo.iterdir()
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "description": "from the memo"}))
    assert load_recipe(recipe, memo_dir=memo).resolved["description"] == "from the memo"
    entry.write_text("{not json")
    assert load_recipe(recipe, memo_dir=memo).resolved["description"] == ""


def test_memo_follows_the_file_contents(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    memo = tmp_path / "memo"
    recipe.write_text("name: a\n" + ONNX, encoding="utf-8")
    assert load_recipe(recipe, memo_dir=memo).name == "a"
    recipe.write_text("name: b\n" + ONNX, encoding="utf-8")
    assert load_recipe(recipe, memo_dir=memo).name == "b"
    recipe.write_text("name: c/d\n" + ONNX, encoding="utf-8")
    with pytest.raises(RecipeError):
        load_recipe(recipe, memo_dir=memo)
    assert len(list(memo.iterdir())) == 2


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).resolve().parent.parent / "recipes").glob("*.yaml")), ids=lambda p: p.stem
)
def test_show_prints_a_recipe_that_loads_to_the_same_resolved_form(path: Path, tmp_path: Path) -> None:
    """`onnxbuild show` is meant to be copied: its output (nulls included) is a valid recipe (#15)."""
    from onnxbuild.api import load_recipe, show

    shown = tmp_path / path.name
    shown.write_text(show(path), encoding="utf-8")
    for name in ("digits_mlp.py", "keras_mlp.py"):  # factories the recipes name, beside them
        shutil.copy(path.parent / name, tmp_path / name)
    assert load_recipe(shown).resolved == load_recipe(path).resolved
