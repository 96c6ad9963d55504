"""The resolved recipe's sections as types, so mypy sees every key a step reads.

``loader.resolve`` fills every default, so each key below is present in a resolved
recipe (``export`` and ``validate`` only where the source is traced). A step turns its
``spec.params`` section into one of these with ``typing.cast`` at its entry point; a
misspelt key is then a type error, not a KeyError in a user's build. The JSON Schema
(recipe/schema.json) stays the source of truth for what a user may write;
tests/test_kinds.py checks that these types name exactly the schema's keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypedDict

Shape = dict[str, int]
"""Sizes of the symbolic dimensions, e.g. {"batch": 1, "sequence": 128}."""


class Tensor(TypedDict):
    name: str
    dtype: str
    shape: list[int | str]


class ExportWeights(TypedDict):
    """export.weights: the fused exporter's MatMul weights quantized as they are written."""

    bits: Literal[4, 8]
    block_size: int
    accuracy_level: int
    symmetric: bool


class _ExportKeys(TypedDict):
    exporter: Literal["torchscript", "dynamo", "fused"]
    opset: int
    inputs: list[Tensor]
    outputs: list[str]
    sample: Shape
    constant_folding: bool
    external_data: Literal["auto", "always", "never"]
    device: Literal["cpu", "cuda"]
    with_past: bool


class ExportSection(_ExportKeys, total=False):
    weights: ExportWeights
    """Only where the recipe gives it (exporter: fused): absent, every other export's key is as before."""


class AccuracyCheck(TypedDict):
    dataset: str
    batch_size: int
    max_drop: float
    min: float | None


class TextSection(TypedDict):
    """validate.text: real text a decoder's variants are measured on (exactly one source)."""

    file: str | None
    package: str | None
    inline: str | None
    window: int
    max_windows: int


class ValidateSection(TypedDict):
    shapes: list[Shape]
    atol: float
    rtol: float
    top1_min: float | None
    seed: int
    on_fail: Literal["error", "warn"]
    left_padding: bool
    accuracy: AccuracyCheck | None
    sentences: list[str] | None
    cosine_min: float | None
    text: TextSection | None
    ppl_increase_max: float | None
    kld_max: float | None
    text_top1_min: float | None


class VariantValidate(TypedDict, total=False):
    """A variant's own tolerances; absent keys take the precision's defaults."""

    atol: float
    rtol: float
    top1_min: float
    cosine_min: float
    ppl_increase_max: float
    kld_max: float
    text_top1_min: float


class TransformerOptions(TypedDict):
    model_type: str
    num_heads: int
    hidden_size: int
    opt_level: int
    only_onnxruntime: bool
    fusion_options: dict[str, Any]


class Float16Options(TypedDict):
    keep_io_types: bool


SIGNATURE_KEYS = ("inputs", "outputs", "with_past")
"""What of ``export:`` the steps that run the model read (validate, benchmark): its signature;
how it was exported reaches them as the model file."""


class OptimizeSection(TypedDict):
    level: Literal["none", "basic", "extended", "layout", "all"]
    decoder: Literal["auto", "fused", "export"]
    skip_layer_norm: Literal["auto", "fused", "sum"]
    transformer: TransformerOptions | None
    float16: Float16Options | None
    validate: VariantValidate


class Calibration(TypedDict):
    method: Literal["minmax", "entropy", "percentile"]
    samples: int
    npz: str | None
    text: str | None
    window: int


class Budget(TypedDict, total=False):
    """An accuracy budget (steps/budget.py): at least one figure."""

    ppl_increase_max: float
    kld_max: float
    fallback: Literal[8, "float"]
    margin: float


QuantizeSection = TypedDict(
    "QuantizeSection",
    {
        "name": str,
        "method": Literal["dynamic", "static", "int4", "weight_only", "gguf", "smooth_int8"],
        "bits": Literal[4, 8],
        "algorithm": Literal["rtn", "hqq"],
        "budget": Budget | None,
        "from": Literal["model", "optimized"],  # a keyword: hence the functional form
        "per_channel": bool,
        "reduce_range": bool,
        "weight_type": Literal["int8", "uint8"],
        "activation_type": Literal["uint8", "int8"],
        "op_types": list[str] | None,
        "exclude_nodes": list[str],
        "calibration": Calibration,
        "block_size": int,
        "symmetric": bool,
        "accuracy_level": Literal[0, 1, 2, 3, 4],
        "embedding": bool,
        "keep": list[str],
        "keep_worst": int,
        "validate": VariantValidate,
    },
)


class BenchmarkSection(TypedDict):
    iterations: int
    warmup: int
    min_time_s: float
    shapes: list[Shape]
    baseline: Literal["pytorch", "none"]
    threads: int | None
    decode_tokens: int


class Sampling(TypedDict):
    temperature: float
    top_k: int


class GenerateSection(TypedDict):
    max_new_tokens: int
    prompt: str | None
    prompt_ids: list[int] | None
    prompt_length: int
    seed: int
    sampling: Sampling | None
    agreement_min: float | None


class Provider(TypedDict):
    name: str
    options: dict[str, Any]


class Limit(TypedDict):
    memory_mb: int | None
    seconds: float | None


class LimitsSection(TypedDict):
    memory_mb: int | None
    seconds: float | None
    steps: dict[str, Limit]


class Contract(TypedDict, total=False):
    """One variant's graph contract (``expect.<variant>`` or ``expect.all``); see steps/expect.py."""

    ops: dict[str, int | str]
    absent: list[str]
    weights: dict[str, float]
    max_mb: float
    opset: int
    inputs: dict[str, str]
    outputs: dict[str, str]


class _TracedSections(TypedDict, total=False):
    """Only a source traced through torch (or TensorFlow) has an export and a validate section."""

    export: ExportSection
    validate: ValidateSection


class Resolved(_TracedSections):
    """A whole resolved recipe (``Recipe.resolved``)."""

    name: str
    description: str
    source: dict[str, dict[str, object]]
    optimize: OptimizeSection | None
    quantize: list[QuantizeSection]
    benchmark: BenchmarkSection | None
    generate: GenerateSection | None
    limits: LimitsSection
    providers: list[Provider]
    expect: dict[str, Contract]


TARGETS = ("web", "openvino")
"""Names in ``providers:`` that are runtimes of their own, not ONNX Runtime execution providers."""


def target_variants(providers: Sequence[Provider]) -> dict[str, set[str]]:
    """target (web, openvino) -> the variants validated there: its ``options.variants``, default model."""
    return {p["name"]: set(p["options"].get("variants") or ["model"]) for p in providers if p["name"] in TARGETS}
