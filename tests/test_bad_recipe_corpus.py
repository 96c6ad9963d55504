"""A corpus of malformed recipe files (tests/data/corpus/), each one run through ``onnxbuild make``.

Every file must be refused before anything is built: exit code 2, the file named with its
line and column (whole-file problems such as binary or oversized files have none), a
message that says what to change, no traceback, and nothing written anywhere. Each file
opens with a comment saying what is wrong in it, except those that cannot hold one.

test_recipe_loader.py pins the loader's wording on minimal snippets; this corpus is
realistic files on disk, through the real command, and is where a new malformed file
found in the wild goes: add the file, then its line to EXPECTED.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from onnxbuild.cli import cli
from onnxbuild.recipe.loader import MAX_RECIPE_BYTES

CORPUS = Path(__file__).resolve().parent / "data" / "corpus"

NAME_RULE = "name: must be a name of letters, digits, '.', '_' or '-' (at most 64, no path separators), e.g. gpt2-small"
DIM_RULE = "must be a non-negative integer or a symbolic dimension name such as batch"
NAME_PATTERN = "must be a string matching ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
TAB_HINT = (
    "YAML syntax error: found character that cannot start any token (indent with spaces; YAML does not allow tabs)"
)
EMPTY = "the recipe is empty; it needs at least `name:` and `source:` (see recipes/ for examples)"

# File name (without .yaml) -> (line:column, or None for a whole-file problem; the message
# that follows "<file>:<line>:<col>: "). Lists of accepted keys are cut off where another
# new key would change them: the suggestion before them is what helps.
EXPECTED: dict[str, tuple[str | None, str]] = {
    # YAML syntax and encoding
    "syntax-unclosed-flow-mapping": (
        "12:7",
        "YAML syntax error: did not find expected ',' or '}' (while parsing a flow mapping that starts at line "
        "11, column 9)",
    ),
    "syntax-unclosed-quote": (
        "17:1",
        "YAML syntax error: found unexpected end of stream (while scanning a quoted scalar that starts at line 3, "
        "column 14)",
    ),
    "syntax-mapping-in-scalar": ("2:13", "YAML syntax error: mapping values are not allowed in this context"),
    "syntax-bad-indent": (
        "8:6",
        "YAML syntax error: did not find expected key (while parsing a block mapping that starts at line 5, column 5)",
    ),
    "syntax-undefined-alias": ("11:65", "YAML syntax error: found undefined alias"),
    "syntax-two-documents": (
        "16:1",
        "YAML syntax error: expected a single document in the stream, but found another document",
    ),
    "syntax-sequence-after-mapping": (
        "5:1",
        "YAML syntax error: did not find expected key (while parsing a block mapping that starts at line 2, column 1)",
    ),
    "tabs-indent": ("5:1", TAB_HINT),
    "tabs-in-flow": ("7:1", TAB_HINT),
    "duplicate-key-top": ("3:1", "name: duplicate key (first at line 2); remove one of them"),
    "duplicate-key-nested": ("6:5", "source.graph.opset: duplicate key (first at line 5); remove one of them"),
    "duplicate-key-flow": ("7:35", "source.graph.inputs[0].dtype: duplicate key (first at line 7); remove one of them"),
    "non-string-key": ("5:1", "keys must be strings (got '2'); quote the key"),
    "merge-key": ("9:10", "source.graph.outputs[0]: merge keys (<<) are not supported; write the keys out"),
    "python-tag": (
        "2:7",
        "name: tag !!python/object/apply:os.system is not allowed in a recipe (only plain YAML values)",
    ),
    "custom-tag": ("4:9", "source.onnx: tag !include is not allowed in a recipe (only plain YAML values)"),
    "control-character": ("3:18", "YAML does not allow the control character U+0007; remove it"),
    "huge-integer": (
        "11:65",
        "source.graph.initializers[0].random.seed: integer too large (a recipe's integers fit in 64 bits)",
    ),
    "unreadable-int": (
        "11:65",
        'source.graph.initializers[0].random.seed: YAML takes "0b_" for an integer but cannot read it as one; put '
        "it in quotes to make it text",
    ),
    "deep-nesting": ("3:113", "the document is nested more than 100 levels deep; a recipe is far flatter"),
    "alias-bomb": ("1:1", "the document expands to more than 100000 values (YAML aliases?); a recipe is far smaller"),
    "recursive-alias": ("1:1", "the document is nested too deeply (recursive YAML alias?)"),
    "empty": ("1:1", EMPTY),
    "only-comments": ("1:1", EMPTY),
    "whitespace-only": ("1:1", EMPTY),
    "top-level-list": ("1:1", "a recipe is a mapping of keys (name, source, ...), not a list"),
    "top-level-scalar": ("1:1", "a recipe is a mapping of keys (name, source, ...), not a string"),
    "binary-garbage": (None, "is a binary file, not YAML text"),
    "png-image": (None, "is a binary file, not YAML text"),
    "utf16-text": (None, "is a binary file, not YAML text"),
    "latin1-bytes": ("5:17", "is not valid UTF-8 text (save the file as UTF-8)"),
    "line-separator-in-string": ("6:1", "bogus: unknown key (expected one of:"),
    # wrong types
    "name-is-number": (
        "2:7",
        f"{NAME_RULE} (got 2024; YAML read this as a number, put the value in quotes to make it text)",
    ),
    "name-is-boolean": (
        "2:7",
        f"{NAME_RULE} (got true; YAML read this as a boolean, put the value in quotes to make it text)",
    ),
    "source-is-string": (
        "3:9",
        "source: must be a mapping naming exactly one of: onnx, graph, huggingface, pytorch, tensorflow (got "
        '"model.onnx")',
    ),
    "opset-is-word": ("5:12", 'source.graph.opset: must be an integer from 7 to 23 (got "eighteen")'),
    "quantize-is-mapping": ("16:11", "quantize: must be a list (got a mapping)"),
    "nodes-is-mapping": ("13:12", "source.graph.nodes: must be a list (got a mapping)"),
    "providers-empty": ("5:12", "providers: must have at least 1 item"),
    "benchmark-iterations-zero": ("5:25", "benchmark.iterations: must be an integer >= 1 (got 0)"),
    "expect-unknown-variant": (
        "8:3",
        "expect.int4: no variant 'int4' (this recipe has: model, int8; `all` for every one)",
    ),
    "expect-bad-count": (
        "8:22",
        'expect.optimized.ops.Attention: must be a count (12) or a comparison such as ">= 24" (got "about 12")',
    ),
    "description-is-list": ("3:14", "description: must be a string (got a list)"),
    # unknown keys, missing sections
    "unknown-top-key": ("9:1", "exprot: unknown key (did you mean 'export'? expected one of:"),
    "unknown-source-key": ("4:28", "source.onnx.checksum: unknown key (expected one of: path)"),
    "unknown-quantize-key": (
        "17:35",
        "quantize[0].width: unknown key (expected one of: accuracy_level, activation_type, algorithm, bits, "
        "block_size, budget, calibration,",
    ),
    "missing-name": (
        "2:1",
        "missing required key 'name' (a name of letters, digits, '.', '_' or '-' (at most 64, no path "
        "separators), e.g. gpt2-small)",
    ),
    "missing-source": (
        "2:1",
        "missing required key 'source' (exactly one of: onnx, graph, huggingface, pytorch, tensorflow)",
    ),
    "source-empty": (
        "3:1",
        "source: must name exactly one of: onnx, graph, huggingface, pytorch, tensorflow (got nothing)",
    ),
    "two-sources": (
        "3:1",
        "source: must name exactly one of: onnx, graph, huggingface, pytorch, tensorflow (got onnx, graph)",
    ),
    "graph-missing-nodes": ("4:3", "source.graph: missing required key 'nodes' (a list)"),
    "quantize-missing-method": (
        "17:5",
        "quantize[0]: missing required key 'method' (one of: dynamic, static, int4, weight_only, gguf, smooth_int8)",
    ),
    # bad enum values
    "enum-dtype": (
        "7:26",
        "source.graph.inputs[0].dtype: must be one of: float32, float16, bfloat16, float64, int8, uint8, int16, "
        'int32, int64, bool (got "float33")',
    ),
    "enum-quantize-method": (
        "17:24",
        'quantize[0].method: must be one of: dynamic, static, int4, weight_only, gguf, smooth_int8 (got "int3")',
    ),
    "enum-optimize-level": ("16:19", 'optimize.level: must be one of: none, basic, extended, layout, all (got "max")'),
    "enum-task": (
        "6:11",
        "source.huggingface.task: must be one of: feature-extraction, text-classification, token-classification, "
        "question-answering, fill-mask, text-generation, text2text-generation, automatic-speech-recognition, "
        "image-classification, image-feature-extraction, object-detection, semantic-segmentation, "
        "audio-classification, zero-shot-image-classification, multiple-choice, sentence-similarity, "
        'image-text-to-text, image-to-text (got "translation")',
    ),
    "enum-exporter": ("9:20", 'export.exporter: must be one of: torchscript, dynamo, fused (got "onnx")'),
    "enum-on-fail": ("9:21", 'validate.on_fail: must be one of: error, warn (got "ignore")'),
    "left-padding-not-bool": ("9:26", "validate.left_padding: must be true or false (got 8)"),
    # tolerances, opsets and other numbers
    "negative-atol": ("9:18", "validate.atol: must be a number >= 0 (got -0.001)"),
    "non-numeric-rtol": ("9:18", 'validate.rtol: must be a number >= 0 (got "tight")'),
    "negative-variant-atol": ("19:22", "quantize[0].validate.atol: must be a number >= 0 (got -3)"),
    "nan-tolerance": ("9:18", "validate.atol: must be a finite number (got .nan)"),
    "inf-variant-tolerance": ("19:22", "quantize[0].validate.atol: must be a finite number (got .inf)"),
    "top1-above-one": ("9:22", "validate.top1_min: must be a number from 0 to 1 or null (got 1.5)"),
    "opset-too-low": ("5:12", "source.graph.opset: must be an integer from 7 to 23 (got 6)"),
    "opset-too-high": ("9:17", "export.opset: must be an integer from 7 to 23 (got 99)"),
    "ir-version-too-low": ("6:17", "source.graph.ir_version: must be an integer from 3 to 13 (got 2)"),
    # shapes
    "shape-float-dim": ("7:50", f"source.graph.inputs[0].shape[1]: {DIM_RULE} (got 4.5)"),
    "shape-negative-dim": ("7:43", f"source.graph.inputs[0].shape[0]: {DIM_RULE} (got -1)"),
    "shape-bad-symbol": ("7:43", f'source.graph.inputs[0].shape[0]: {DIM_RULE} (got "batch size")'),
    "initializer-symbolic-dim": ("11:43", 'source.graph.initializers[0].shape[0]: must be an integer >= 0 (got "n")'),
    "initializer-value-count": ("12:55", "source.graph.initializers[1].values: has 3 values but shape [2] needs 2"),
    "sample-not-integer": ("10:19", 'export.sample.batch: must be an integer from 1 to 1048576 (got "two")'),
    "validate-shape-zero": ("10:20", "validate.shapes[0].batch: must be an integer from 1 to 1048576 (got 0)"),
    "validate-shape-unknown-dim": (
        "10:36",
        "validate.shapes[0].width: unknown dimension (the inputs use: batch, sequence)",
    ),
    # references to things that do not exist
    "quantize-from-unknown-variant": ("18:47", 'quantize[1].from: must be one of: model, optimized (got "int8")'),
    "quantize-from-missing-optimize": (
        "17:41",
        "quantize[0].from: quantizes the optimized variant, but the recipe has no optimize section",
    ),
    "quantize-duplicate-name": ("18:12", "quantize[1].name: variant name 'int8' is used twice; names must be unique"),
    "quantize-builtin-name": (
        "17:12",
        "quantize[0].name: 'optimized' names a built-in variant; choose another name (e.g. int8)",
    ),
    "graph-dangling-input": (
        "14:39",
        "source.graph.nodes[0].inputs[1]: 'W' is not a graph input, an initializer or the output of an earlier node",
    ),
    "graph-output-not-produced": ("9:16", "source.graph.outputs[0].name: 'Z' is not produced by any node"),
    "export-with-onnx-source": (
        "5:1",
        "export: applies only to huggingface, pytorch and tensorflow sources (this recipe's source is onnx); remove it",
    ),
    "hf-model-and-package": (
        "4:3",
        "source.huggingface: give exactly one of `model` (Hub id or folder) and `package` (a folder inside an "
        "installed package); it has both",
    ),
    # a task's inputs (#18)
    "image-without-size": (
        "4:3",
        "source.huggingface: an image model is exported at one sample size: give export.sample: {batch: 2, "
        "height: 224, width: 224} (or config.image_size)",
    ),
    "vit-without-image-size": (
        "8:13",
        "source.huggingface.config: a vit model takes images of the one size its position embeddings were made "
        "for; give config.image_size (224 for the base models)",
    ),
    "image-with-sentences": (
        "10:3",
        "validate.sentences: task image-feature-extraction takes images (pixel_values), not text; remove "
        "validate.sentences",
    ),
    "token-classification-with-past": (
        "10:14",
        "export.with_past: applies to huggingface text-generation models (this recipe has task "
        "token-classification); remove it",
    ),
    "question-answering-image-size": (
        "10:36",
        "validate.shapes[0].height: unknown dimension (the inputs use: batch, sequence)",
    ),
    "seq2seq-with-past": (
        "10:3",
        "export.with_past: an encoder-decoder's decoder_model.onnx always takes its cache (past_key_values.*) and "
        "the encoder has none; remove with_past",
    ),
    "seq2seq-float16": (
        "8:12",
        "source.huggingface.dtype: encoder-decoder models export in float32 (their decoder cache is float32); "
        "remove dtype",
    ),
    "speech-sequence-shape": (
        "10:23",
        "validate.shapes[0].sequence: unknown dimension (the inputs use: batch, decoder_sequence)",
    ),
    "seq2seq-one-input": (
        "10:11",
        "export.inputs: an encoder-decoder's encoder takes input_ids and attention_mask, both [batch, sequence] "
        "(got input_ids); remove export.inputs for the defaults",
    ),
    "speech-text-prompt": (
        "11:3",
        "generate.prompt: a speech model's prompt is audio: generation starts from seeded features of the "
        "export's shape; remove it",
    ),
    "text-classification-bart": (
        "8:26",
        "source.huggingface.config.model_type: text-classification on a bart (an encoder-decoder) scores the "
        "decoder's state at each row's last <eos> token, and onnxbuild's seeded validation tokens hold none; not "
        "supported yet: classify with an encoder model, or export the whole model with task text2text-generation",
    ),
    "image-to-text-llava": (
        "8:26",
        "source.huggingface.config.model_type: image-to-text exports a vision-encoder-decoder (an image encoder and "
        "a text decoder, transformers' VisionEncoderDecoderModel) as an encoder and a decoder file; a llava is not "
        "one (a vision-language model: use task image-text-to-text)",
    ),
    "image-to-text-gpt2-no-cross-attention": (
        "11:16",
        "source.huggingface.config.decoder: a gpt2 decoder reads the image through cross-attention layers it "
        "builds only with add_cross_attention: true; add it to config.decoder",
    ),
    "image-to-text-text-prompt": (
        "14:3",
        "generate.prompt_ids: an image-to-text model's prompt is an image: generation starts from seeded pixels "
        "of the export's shape; remove it",
    ),
    "image-text-to-text-vision-encoder-decoder": (
        "8:26",
        "source.huggingface.config.model_type: image-text-to-text exports llava, idefics3, smolvlm so far (got "
        "'vision-encoder-decoder'); an image encoder with a text decoder is task image-to-text",
    ),
    "cosine-without-sentences": (
        "9:12",
        "validate.cosine_min: compares sentence embeddings; add validate.sentences (the text to embed)",
    ),
    "pytorch-factory-no-function": (
        "4:22",
        'source.pytorch.factory: must be "path/to/file.py:function" or "package.module:function" (got "mlp.py")',
    ),
    # names that would lead out of artifacts/
    "name-dotdot": ("2:7", f'{NAME_RULE} (got "../evil")'),
    "name-absolute": ("2:7", f'{NAME_RULE} (got "/abs")'),
    "name-just-dotdot": ("2:7", f'{NAME_RULE} (got "..")'),
    "name-slash": ("2:7", f'{NAME_RULE} (got "models/lr")'),
    "name-backslash": ("2:7", f'{NAME_RULE} (got "models\\\\lr")'),
    "name-empty": ("2:7", f'{NAME_RULE} (got "")'),
    "name-too-long": ("2:7", f'{NAME_RULE} (got "{"a" * 60}...")'),
    "quantize-name-dotdot": ("17:12", f'quantize[0].name: {NAME_PATTERN} (got "../x")'),
    "quantize-name-slash": ("17:12", f'quantize[0].name: {NAME_PATTERN} (got "int8/fast")'),
    "provider-bad-name": (
        "5:20",
        "providers[0].name: must be an ONNX Runtime provider name such as CPUExecutionProvider or "
        "CUDAExecutionProvider, web (onnxruntime-web under Node.js) or openvino (the OpenVINO CPU plugin) (got "
        '"cuda")',
    ),
    "provider-unknown-name": (
        "5:20",
        "providers[0].name: unknown execution provider 'TensorRTExecutionProvider'; did you mean "
        "TensorrtExecutionProvider? onnxruntime knows: ACLExecutionProvider, ArmNNExecutionProvider, "
        "AzureExecutionProvider, CANNExecutionProvider, CPUExecutionProvider, CUDAExecutionProvider, "
        "CoreMLExecutionProvider, DmlExecutionProvider, DnnlExecutionProvider, JsExecutionProvider, "
        "MIGraphXExecutionProvider, NnapiExecutionProvider, NvTensorRTRTXExecutionProvider, "
        "OpenVINOExecutionProvider, QNNExecutionProvider, ROCMExecutionProvider, RknpuExecutionProvider, "
        "SNPEExecutionProvider, TensorrtExecutionProvider, VSINPUExecutionProvider, VitisAIExecutionProvider, "
        "WebGpuExecutionProvider, WebNNExecutionProvider, XnnpackExecutionProvider (or web, openvino)",
    ),
    "openvino-bad-precision": (
        "7:26",
        "providers[0].options.precision: expected one of auto, f32, bf16, f16, got 'int8'",
    ),
    "openvino-unknown-option": (
        "7:15",
        "providers[0].options.variant: unknown option for the openvino target (it takes: variants, precision, "
        "atol, rtol, top1_min)",
    ),
    "openvino-unknown-variant": (
        "7:26",
        "providers[0].options.variants[0]: no variant 'int8' (this recipe has: model)",
    ),
    "several-problems": ("8:25", "benchmark.iterations: must be an integer >= 1 (got 0)"),
}

# Cases the loader gets wrong today: each test fails until the loader is fixed (strict xfail).
KNOWN_BUGS: dict[str, str] = {}

NO_COMMENT = {"empty", "binary-garbage", "png-image", "utf16-text"}
"""Files that cannot open with a comment: zero bytes, or not UTF-8 text from the first byte."""


def make(recipe: Path | str, out: Path) -> Result:
    return CliRunner().invoke(
        cli, ["--cache-dir", str(out / "cache"), "--artifacts-dir", str(out / "artifacts"), "make", str(recipe)]
    )


def everything_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def assert_refused(result: Result, shown: str, where: str | None, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # an exit on purpose, not a crash
    assert "Traceback" not in result.output
    assert result.output.startswith("Error: "), result.output
    located = f"{shown}:{where}" if where else shown
    assert f"\n  {located}: {message}" in result.output, result.output


def test_the_corpus_and_its_table_agree() -> None:
    files = sorted(p.stem for p in CORPUS.iterdir())
    assert files == sorted(EXPECTED)
    assert all(p.suffix == ".yaml" for p in CORPUS.iterdir())
    assert len(files) >= 50
    assert set(KNOWN_BUGS) <= set(EXPECTED)


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - NO_COMMENT))
def test_each_file_says_what_is_wrong_with_it(name: str) -> None:
    assert (CORPUS / f"{name}.yaml").read_bytes().startswith(b"# ")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[n])) if n in KNOWN_BUGS else n
        for n in sorted(EXPECTED)
    ],
)
def test_a_malformed_recipe_is_refused_with_its_position_and_nothing_is_written(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the default cache and artifacts folders would land here
    recipe = CORPUS / f"{name}.yaml"
    where, message = EXPECTED[name]
    result = make(recipe, tmp_path / "out")
    assert_refused(result, str(recipe), where, message)
    assert everything_under(tmp_path) == []


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    result = make(CORPUS / "several-problems.yaml", tmp_path)
    assert result.output.startswith("Error: 5 problems in the recipe:\n")
    assert [line.split(": ", 2)[1] for line in result.output.splitlines()[1:]] == [
        "name",
        "source.onnx.checksum",
        "exprot",
        "providers",
        "benchmark.iterations",
    ]


def fifty_megabytes(folder: Path) -> Path:
    path = folder / "huge.yaml"
    block = b"description: a recipe padded far past any sensible size\n" * (1 << 14)
    with path.open("wb") as f:
        for _ in range(50 * (1 << 20) // len(block) + 1):
            f.write(block)
    return path


def a_directory(folder: Path) -> Path:
    (folder / "recipes.yaml").mkdir()
    (folder / "recipes.yaml" / "inner.yaml").write_text("name: inner\n", encoding="utf-8")
    return folder / "recipes.yaml"


def a_missing_file(folder: Path) -> Path:
    return folder / "nowhere.yaml"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (fifty_megabytes, "is {size} bytes; a recipe must be at most 1048576 bytes (1 MiB)"),
        (a_directory, "is a directory, not a recipe file (name a .yaml file inside it)"),
        (a_missing_file, "no such file (check the path; recipes usually live in recipes/)"),
    ],
)
def test_a_path_that_is_no_recipe_file_is_refused(
    build: Callable[[Path], Path], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    recipe = build(tmp_path / "in")
    before = everything_under(tmp_path)
    size = recipe.stat().st_size if recipe.is_file() else 0
    assert size == 0 or size > 50 * 10**6 > MAX_RECIPE_BYTES
    result = make(recipe, tmp_path / "out")
    assert_refused(result, str(recipe), None, message.format(size=size))
    assert everything_under(tmp_path) == before


def test_a_source_path_the_os_refuses_is_reported_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "long.yaml"
    recipe.write_text(
        "# A file name longer than any file system allows (255 bytes).\nname: long\nsource:\n"
        f"  onnx: {{path: {'a' * 300}.onnx}}\n",
        encoding="utf-8",
    )
    result = make(recipe, tmp_path / "out")
    assert result.exit_code in (1, 2), result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "source.onnx.path" in result.output


@pytest.mark.parametrize("name", ["alias-bomb", "binary-garbage", "tabs-indent"])
def test_the_real_command_exits_2_without_a_traceback(name: str, tmp_path: Path) -> None:
    recipe = CORPUS / f"{name}.yaml"
    where, message = EXPECTED[name]
    cmd = [
        sys.executable,
        "-m",
        "onnxbuild",
        "--cache-dir",
        "cache",
        "--artifacts-dir",
        "artifacts",
        "make",
        str(recipe),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    located = f"{recipe}:{where}" if where else str(recipe)
    assert proc.stderr == f"Error: 1 problem in the recipe:\n  {located}: {message}\n"
    assert everything_under(tmp_path) == []


def test_the_known_provider_names_hold_every_name_the_installed_onnxruntime_knows() -> None:
    """#39: a provider name onnxruntime does not know (a typo) passed with exit 0; the static list
    that refuses it must not refuse a real one."""
    import onnxruntime

    from onnxbuild.recipe.checks import KNOWN_PROVIDERS

    assert set(onnxruntime.get_all_providers()) <= set(KNOWN_PROVIDERS)
