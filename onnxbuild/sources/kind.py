"""What a source kind says of itself: :class:`SourceKind`, which each module under
``onnxbuild/sources/`` exports as ``KIND`` (see the package's header)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Source = dict[str, Any]
"""A recipe's ``source.<kind>`` section as resolved (JSON from the recipe)."""
Problem = tuple[tuple[Any, ...], str, bool]
"""A cross-field problem: (key path, message, whether it is at the key rather than its value)."""


def _always(src: Source) -> bool:
    return True


def _never(src: Source) -> bool:
    return False


def _no_dims(src: Source) -> tuple[str, ...]:
    return ()


def _no_sizes(src: Source) -> dict[str, int]:
    return {}


def _nothing_to_resolve(src: Source, defaults: Callable[[dict[str, Any], str], dict[str, Any]]) -> None:
    return None


def _no_config(src: Source, recipe_dir: Path) -> dict[str, Any]:
    return {}


def _no_problems(src: Source, doc: dict[str, Any]) -> Iterable[Problem]:
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
class SourceKind:
    """What a source kind says of itself. Each module under ``onnxbuild/sources/`` (one per key
    the schema allows under ``source``) exports one as ``KIND``; ``sources.source_kind(name)``
    hands it out. The recipe layer imports these modules, so they import only core modules,
    and heavy packages only inside functions."""

    name: str
    traced: bool
    """Exported through torch (the recipe then has ``export`` and ``validate`` sections)."""
    identity: Callable[[Source, Path], tuple[dict[str, Path], dict[str, Any]]]
    """The local files whose digests identify the model (in the source step's key) and facts
    found without a network (a Hub commit, package versions)."""
    estimate_weights: Callable[[Source, Path], int]
    """Bytes of fp32 weights, to place steps on a cluster by memory."""
    record: Callable[[Source, Path, dict[str, str]], dict[str, Any]] | None = None
    """A traced source's record of which weights the model gets (reports/source.json)."""
    load_model: Callable[[Source, dict[str, Any], Path], Any] | None = None
    """The model that record describes (torch, transformers or TensorFlow imported here)."""
    traced_when: Callable[[Source], bool] = _always
    """Where tracing depends on the section (``huggingface.file`` is an ONNX file)."""
    resolve: Callable[[Source, Callable[[dict[str, Any], str], dict[str, Any]]], None] = _nothing_to_resolve
    """Defaults the schema cannot express (nested lists), given the schema's default filler."""
    check: Callable[[Source, dict[str, Any]], Iterable[Problem]] = _no_problems
    """Cross-field problems of the recipe as this kind sees them."""
    default_io: Callable[[Source], tuple[list[dict[str, Any]], list[str]]] | None = None
    """Export inputs and outputs when the recipe gives none (a task's)."""
    varied_dims: Callable[[Source], tuple[str, ...]] = _no_dims
    """Dimensions validation always varies, whatever the export declared."""
    held_dims: Callable[[Source], tuple[str, ...]] = _no_dims
    """Dimensions its default validation shapes keep at the sample size."""
    sample_defaults: Callable[[Source], dict[str, int]] = _no_sizes
    """Export sample sizes its config gives (an image model's image_size)."""
    fixed_image_size: Callable[[Source], bool] = _never
    """An image model of one size (its own check asks for config.image_size)."""
    files: Callable[[Source], tuple[str, ...]] | None = None
    """The ONNX files of one variant when more than model.onnx."""
    seq2seq: Callable[[Source], bool] = _never
    """Those files are an encoder and a decoder."""
    top1: Callable[[Source], bool] = _never
    """A top-1 agreement floor applies to its outputs."""
    decoder: Callable[[Source], bool] = _never
    gguf: Callable[[Source], bool] = _never
    """Its weights are a GGUF file (quantize's gguf method writes that file's own blocks)."""
    onnx_file: Callable[[Source, Path], OnnxFile | None] | None = None
    """The ONNX file it names (None when the section names none): the source step copies it."""
    build_onnx: Callable[[Source], Any] | None = None
    """Builds its ONNX model (an onnx.ModelProto) from the section itself (a graph in YAML)."""
    config: Callable[[Source, Path], dict[str, Any]] = _no_config
    """The model's transformers config: the recipe's ``config``, else its local folder's
    config.json ({} when there is none to read without a network)."""
    transformers: bool = False
    """A transformers model: called with keyword inputs, its task decides its inputs' natural
    shapes, which outputs are per token and whether top-1 applies, and its tokenizer turns text
    into inputs (validate.sentences)."""
    adapter: Callable[[Any, list[str]], Any] | None = None
    """Wraps a model that is no torch module (Keras) so export and validation call it as one:
    positional tensors in, a tuple out."""
    needs_inputs: str = ""
    """What ``export.inputs`` must describe when nothing else knows the model's signature (the
    recipe must then give it); empty when the task gives the inputs."""
    converter: str = ""
    """Its own converter to ONNX (tf2onnx), where torch's exporters do not apply."""
    convert: Callable[[Any, Any, Path], None] | None = None
    """Converts its loaded model to ONNX at the path, given the export section (the converter's)."""
    framework: str = "PyTorch"
    """The framework its model runs in, which validation compares ONNX Runtime against."""
    sdpa: Callable[[Source], Source] | None = None
    """The section set to load the model with PyTorch's fused attention (sdpa), so a baseline is
    not timed with a slower attention than the export may use; None where the kind has no choice."""
    """A text decoder: ``export.with_past`` and the fused decoder graphs apply."""
    benchmark_inputs: Callable[[Source], list[dict[str, Any]]] | None = None
    """Inputs an untraced source is benchmarked by."""
    later: tuple[str, ...] = ()
    """Keys only the steps after the source step read (how the model is loaded, its tokenizer):
    not in the source step's key."""
    imports: tuple[str, ...] = ()
    """Heavy modules loading its model imports: the steps that load it fork from a warm process
    that imported these once per build (engine/execute.py)."""
    recorded: tuple[str, ...] = ()
    """Keys whose whole effect on later steps reaches them through the source step's record
    (which weights, from where): left out of the keys of the steps that read that record."""
