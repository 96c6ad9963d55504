"""What a source kind says of itself: :class:`SourceKind`, which each module under
``onnxbuild/sources/`` exports as ``KIND`` (see the package's header), and the types of the
recipe sections and records the kinds read and write."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypedDict, TypeVar

from onnxbuild.recipe.sections import ExportSection, Tensor

if TYPE_CHECKING:
    import onnx
    import torch


class _HuggingfaceRequired(TypedDict):
    task: str


class HuggingfaceSource(_HuggingfaceRequired, total=False):
    """``source.huggingface`` (recipe/schema.json ``$defs/huggingface_source``). The schema's
    defaults (revision, dtype, offline, seed, attn_implementation) and ``resolve``'s Nones
    (model, package, config, tokenizer) are present once the recipe is resolved; a recipe's
    checks see the section as written."""

    model: str | None
    package: str | None
    revision: str
    dtype: Literal["float32", "float16", "bfloat16"]
    offline: Literal["error", "random-init"]
    seed: int
    config: dict[str, Any] | None
    """config.json's keys, handed to transformers' AutoConfig as they are (any JSON)."""
    attn_implementation: Literal["eager", "sdpa"]
    tokenizer: str | None
    file: str | None


class _PytorchRequired(TypedDict):
    factory: str


class PytorchSource(_PytorchRequired, total=False):
    """``source.pytorch`` (``$defs/pytorch_source``); kwargs, checkpoint and seed once resolved."""

    kwargs: dict[str, object]
    checkpoint: str | None
    seed: int


class TensorflowSource(TypedDict, total=False):
    """``source.tensorflow`` (``$defs/tensorflow_source``): exactly one of factory and keras
    (the kind's check says so); kwargs and seed once resolved."""

    factory: str
    keras: str
    kwargs: dict[str, object]
    seed: int


class OnnxSource(TypedDict):
    """``source.onnx`` (``$defs/onnx_source``)."""

    path: str


class GraphValue(TypedDict):
    """A graph input or output (``$defs/graph_value``)."""

    name: str
    dtype: str
    shape: list[int | str]


class _RandomRequired(TypedDict):
    seed: int


class RandomInit(_RandomRequired, total=False):
    distribution: Literal["normal", "uniform"]
    scale: float


NestedValues = list["float | NestedValues"]
"""An initializer's literal values, flat or nested, row-major."""


class _InitializerRequired(TypedDict):
    name: str
    dtype: str
    shape: list[int]


class Initializer(_InitializerRequired, total=False):
    """``$defs/initializer``: exactly one of values and random (graph's check says so)."""

    values: NestedValues
    random: RandomInit


class _NodeRequired(TypedDict):
    op_type: str
    inputs: list[str]
    outputs: list[str]


class GraphNode(_NodeRequired, total=False):
    """``$defs/node``; domain and attributes once resolved."""

    name: str
    domain: str
    attributes: dict[str, Any]
    """Keyword arguments of onnx.helper.make_node: any JSON, whose type make_attribute infers."""


class _GraphRequired(TypedDict):
    inputs: list[GraphValue]
    outputs: list[GraphValue]
    nodes: list[GraphNode]


class GraphSource(_GraphRequired, total=False):
    """``source.graph`` (``$defs/graph_source``); the rest once resolved."""

    name: str
    doc_string: str
    opset: int
    ir_version: int
    extra_opsets: dict[str, int]
    initializers: list[Initializer]


Source = HuggingfaceSource | PytorchSource | TensorflowSource | OnnxSource | GraphSource
"""A recipe's ``source.<kind>`` section as one of the kinds reads it."""

S = TypeVar("S")
"""The section type of one kind (its ``Source`` member)."""

Problem = tuple[tuple[str | int, ...], str, bool]
"""A cross-field problem: (key path, message, whether it is at the key rather than its value)."""

Defaults = Callable[[dict[str, Any], str], dict[str, Any]]
"""The schema's default filler: a JSON object with the defaults of the schema node a ``$ref``
names filled in (recipe/resolve.py's ``with_defaults``)."""


class GgufRecord(TypedDict):
    """What a GGUF file holds, as the source record keeps it."""

    file: str
    architecture: str
    name: str
    types: dict[str, int]
    tensors: dict[str, str]


class SourceRecord(TypedDict, total=False):
    """reports/source.json: which weights a traced source's model gets. Every kind writes kind,
    files, seed and weights; the rest are its own."""

    kind: str
    files: dict[str, str]
    seed: int
    weights: str
    task: str
    model: str | None
    package: str | None
    location: str
    hub_commit: str
    why: str
    config_digest: str
    gguf: GgufRecord
    factory: str | None
    keras: str | None
    kwargs: dict[str, object]
    weights_file: str
    """Streamed random-init: the safetensors file the source step wrote (sources/checkpoint.py)."""
    generator: int


class Adapted(Protocol):
    """A model that is no torch module, wrapped so export and validation call it as one."""

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]: ...

    def eval(self) -> Adapted: ...


def _always(src: object) -> bool:
    return True


def _never(src: object) -> bool:
    return False


def _no_dims(src: object) -> tuple[str, ...]:
    return ()


def _no_sizes(src: object) -> dict[str, int]:
    return {}


def _nothing_to_resolve(src: dict[str, Any], defaults: Defaults) -> None:
    return None


def _no_window(src: object) -> int | None:
    return None


def _no_exporter(src: object) -> str | None:
    return None


def _no_config(src: object, recipe_dir: Path) -> dict[str, Any]:
    return {}


def _no_problems(src: object, doc: Mapping[str, object]) -> Iterable[Problem]:
    return ()


@dataclass(frozen=True)
class OnnxFile:
    """An ONNX file a source names, which the source step copies as model.onnx."""

    path: Path
    key: str
    """The recipe key that names it, for messages (``source.onnx.path``)."""
    shown: str
    """How messages name it (as the recipe wrote it)."""
    where: str = ""
    """Where it came from, when not from the recipe's folder ("local folder", the Hub)."""


@dataclass(frozen=True)
class SourceKind(Generic[S]):
    """What a source kind says of itself. Each module under ``onnxbuild/sources/`` (one per key
    the schema allows under ``source``) exports one as ``KIND``; ``sources.source_kind(name)``
    hands it out. The recipe layer imports these modules, so they import only core modules,
    and heavy packages only inside functions."""

    name: str
    traced: bool
    """Exported through torch (the recipe then has ``export`` and ``validate`` sections)."""
    identity: Callable[[S, Path], tuple[dict[str, Path], dict[str, object]]]
    """The local files whose digests identify the model (in the source step's key) and facts
    found without a network (a Hub commit, package versions)."""
    estimate_weights: Callable[[S, Path], int]
    """Bytes of fp32 weights, to place steps on a cluster by memory."""
    record: Callable[[S, Path, dict[str, str]], SourceRecord] | None = None
    """A traced source's record of which weights the model gets (reports/source.json)."""
    load_model: Callable[[S, Mapping[str, object], Path], object] | None = None
    write_weights: Callable[[S, Mapping[str, object], Path], str] | None = None
    """The source step's weights beside the record (streamed random-init); returns a note, "" for none."""
    checkpoint_folder: Callable[[S, Mapping[str, object], Path], Path | None] | None = None
    """The folder of safetensors the model's weights can be read from one tensor at a time."""
    """The model that record (as read back from reports/source.json) describes: a torch module,
    a transformers model or a Keras model (torch, transformers or TensorFlow imported here)."""
    traced_when: Callable[[S], bool] = _always
    """Where tracing depends on the section (``huggingface.file`` is an ONNX file)."""
    resolve: Callable[[dict[str, Any], Defaults], None] = _nothing_to_resolve
    """Defaults the schema cannot express (nested lists), given the schema's default filler. It
    takes the section as JSON, before those defaults make it the kind's section type."""
    check: Callable[[S, Mapping[str, object]], Iterable[Problem]] = _no_problems
    """Cross-field problems of the recipe as this kind sees them."""
    default_io: Callable[[S], tuple[list[Tensor], list[str]]] | None = None
    """Export inputs and outputs when the recipe gives none (a task's), as plain dicts like
    recipe/sections.py's ExportSection.inputs, which they become."""
    varied_dims: Callable[[S], tuple[str, ...]] = _no_dims
    """Dimensions validation always varies, whatever the export declared."""
    held_dims: Callable[[S], tuple[str, ...]] = _no_dims
    """Dimensions its default validation shapes keep at the sample size."""
    sample_defaults: Callable[[S], dict[str, int]] = _no_sizes
    """Export sample sizes its config gives (an image model's image_size)."""
    fixed_image_size: Callable[[S], bool] = _never
    """An image model of one size (its own check asks for config.image_size)."""
    files: Callable[[S], tuple[str, ...]] | None = None
    """The ONNX files of one variant when more than model.onnx."""
    seq2seq: Callable[[S], bool] = _never
    """Those files are an encoder and a decoder."""
    vlm: Callable[[S], bool] = _never
    """Those files are a vision encoder, an embedding and a decoder (image-text-to-text)."""
    top1: Callable[[S], bool] = _never
    """A top-1 agreement floor applies to its outputs."""
    decoder: Callable[[S], bool] = _never
    gguf: Callable[[S], bool] = _never
    """Its weights are a GGUF file (quantize's gguf method writes that file's own blocks)."""
    onnx_file: Callable[[S, Path], OnnxFile | None] | None = None
    """The ONNX file it names (None when the section names none): the source step copies it."""
    build_onnx: Callable[[S], onnx.ModelProto] | None = None
    """Builds its ONNX model (an onnx.ModelProto) from the section itself (a graph in YAML)."""
    config: Callable[[S, Path], dict[str, Any]] = _no_config
    """The model's transformers config: the recipe's ``config``, else its local folder's
    config.json ({} when there is none to read without a network); any JSON."""
    transformers: bool = False
    """A transformers model: called with keyword inputs, its task decides its inputs' natural
    shapes, which outputs are per token and whether top-1 applies, and its tokenizer turns text
    into inputs (validate.sentences)."""
    adapter: Callable[[object, list[str]], Adapted] | None = None
    """Wraps a model that is no torch module (Keras) so export and validation call it as one:
    positional tensors in, a tuple out."""
    needs_inputs: str = ""
    """What ``export.inputs`` must describe when nothing else knows the model's signature (the
    recipe must then give it); empty when the task gives the inputs."""
    converter: str = ""
    """Its own converter to ONNX (tf2onnx), where torch's exporters do not apply."""
    convert: Callable[[Any, ExportSection, Path], None] | None = None
    """Converts its loaded model to ONNX at the path, given the export section (the converter's)."""
    framework: str = "PyTorch"
    """The framework its model runs in, which validation compares ONNX Runtime against."""
    sdpa: Callable[[S], S] | None = None
    """The section set to load the model with PyTorch's fused attention (sdpa), so a baseline is
    not timed with a slower attention than the export may use; None where the kind has no choice."""
    """A text decoder: ``export.with_past`` and the fused decoder graphs apply."""
    window: Callable[[S], int | None] = _no_window
    """A decoder's sliding attention window, from its config: validation's past crosses it."""
    takes_positions: Callable[[S], bool] = _always
    """A decoder's with-past export takes position_ids (ALiBi decoders take none)."""
    exporter: Callable[[S], str | None] = _no_exporter
    """The exporter its model needs when the recipe names none (None: the schema's default)."""
    benchmark_inputs: Callable[[S], list[Tensor]] | None = None
    """Inputs an untraced source is benchmarked by (plain dicts, as export.inputs are)."""
    later: tuple[str, ...] = ()
    """Keys only the steps after the source step read (how the model is loaded, its tokenizer):
    not in the source step's key."""
    imports: tuple[str, ...] = ()
    """Heavy modules loading its model imports: the steps that load it fork from a warm process
    that imported these once per build (engine/execute.py)."""
    recorded: tuple[str, ...] = ()
    """Keys whose whole effect on later steps reaches them through the source step's record
    (which weights, from where): left out of the keys of the steps that read that record."""
