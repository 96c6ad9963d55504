"""TensorFlow / Keras models, converted with tf2onnx: a factory function or a .keras file.

The input signature is the recipe's ``export.inputs`` (name, dtype, shape with symbolic
dimensions), turned into ``tf.TensorSpec``s. ``import tensorflow`` costs ~3 s here, so it
happens only inside the steps that need the model. Validation runs the TensorFlow model
through a small adapter that takes and returns torch tensors, so the validate step
compares it with ONNX Runtime exactly as it does a torch model.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild._util import brief
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import ExportSection
from onnxbuild.sources import usercode
from onnxbuild.sources.kind import Problem, SourceKind, SourceRecord, TensorflowSource

if TYPE_CHECKING:
    import tensorflow as tf
    import torch

PACKAGES = ("tensorflow", "tensorflow-cpu", "tf2onnx", "keras")


def _quiet() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ start-up chatter


def source_files(src: TensorflowSource, recipe_dir: Path) -> dict[str, Path]:
    """Files whose contents identify the model: the factory's Python file or the .keras file."""
    if src.get("keras"):
        return {"source.tensorflow.keras": recipe_dir / src["keras"]}
    found = usercode.file_path(src["factory"], recipe_dir)
    return {"source.tensorflow.factory": found} if found is not None else {}


def identity(src: TensorflowSource, recipe_dir: Path) -> tuple[dict[str, Path], dict[str, object]]:
    """The factory's or .keras file, and the TensorFlow and tf2onnx versions, which change
    the converted graph (found without importing them)."""
    from onnxbuild.environment import package_version

    return source_files(src, recipe_dir), {"packages": {name: package_version(name) for name in PACKAGES}}


def estimate_weights(src: TensorflowSource, recipe_dir: Path) -> int:
    return 64 * 1024 * 1024


def record(src: TensorflowSource, recipe_dir: Path, digests: dict[str, str]) -> SourceRecord:
    if src.get("factory"):
        usercode.check_defines(src["factory"], recipe_dir, "source.tensorflow.factory")
    missing = [label for label, digest in digests.items() if digest == "missing"]
    if missing:
        raise StepError(f"{missing[0]}: file not found (paths are relative to the recipe's folder, {recipe_dir})")
    return {
        "kind": "tensorflow",
        "factory": src.get("factory"),
        "keras": src.get("keras"),
        "kwargs": src["kwargs"],
        "files": dict(digests),
        "seed": src["seed"],
        "weights": "keras file" if src.get("keras") else "factory",
    }


def load_model(src: TensorflowSource, record: Mapping[str, object], recipe_dir: Path) -> tf.keras.Model:
    """The Keras model, seeded (factories that train are repeatable on CPU)."""
    _quiet()
    try:
        import tensorflow as tf
    except ImportError:
        raise StepError("source.tensorflow: TensorFlow is not installed: pip install 'onnxbuild[tensorflow]'") from None
    tf.keras.utils.set_random_seed(int(src["seed"]))
    tf.config.experimental.enable_op_determinism()
    if src.get("keras"):
        try:
            return tf.keras.models.load_model(recipe_dir / src["keras"], compile=False)
        except Exception as exc:
            raise StepError(
                f"source.tensorflow.keras: cannot load {src['keras']}: {type(exc).__name__}: {str(exc)[:300]}"
            ) from None
    fn = usercode.load_function(src["factory"], recipe_dir, "source.tensorflow.factory")
    try:
        model = fn(**src["kwargs"])
    except Exception as exc:
        raise StepError(f"source.tensorflow.factory: {src['factory']} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, tf.keras.Model):
        raise StepError(
            f"source.tensorflow.factory: {src['factory']} returned {type(model).__name__}, not a tf.keras.Model"
        )
    return model


class KerasAdapter:
    """Calls a Keras model the way the validate step calls a wrapped torch module:
    positional torch tensors in, a tuple of torch tensors out."""

    def __init__(self, model: tf.keras.Model, input_names: list[str]) -> None:
        self.model = model
        self.input_names = input_names

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        import torch

        arrays = [a.detach().cpu().numpy() if hasattr(a, "detach") else a for a in args]
        out = self.model(
            arrays[0] if len(arrays) == 1 else dict(zip(self.input_names, arrays, strict=True)), training=False
        )
        outs = out if isinstance(out, (list, tuple)) else [out]
        return tuple(torch.from_numpy(o.numpy()) for o in outs)

    def eval(self) -> KerasAdapter:
        return self


def convert(model: tf.keras.Model, export: ExportSection, path: Path) -> None:
    """tf2onnx at the recipe's opset; graph outputs renamed to export.outputs, in order."""
    _quiet()
    import tensorflow as tf
    import tf2onnx

    signature = [
        tf.TensorSpec(
            [None if isinstance(d, str) else int(d) for d in t["shape"]], tf.as_dtype(t["dtype"]), name=t["name"]
        )
        for t in export["inputs"]
    ]
    try:
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=signature, opset=int(export["opset"]))
    except Exception as exc:
        raise StepError(f"tf2onnx could not convert the model: {type(exc).__name__}: {brief(exc, limit=400)}") from None
    produced = [o.name for o in proto.graph.output]
    wanted = list(export["outputs"])
    if len(produced) != len(wanted):
        raise StepError(
            f"export.outputs names {len(wanted)} outputs but the model returns {len(produced)} ({', '.join(produced)})"
        )
    renames = {old: new for old, new in zip(produced, wanted, strict=True) if old != new}
    for node in proto.graph.node:
        node.output[:] = [renames.get(o, o) for o in node.output]
        node.input[:] = [renames.get(i, i) for i in node.input]
    for o in proto.graph.output:
        o.name = renames.get(o.name, o.name)
    # Symbolic axes read as the recipe names them, not unk__0.
    for value, t in zip(proto.graph.input, export["inputs"], strict=False):
        for dim, d in zip(value.type.tensor_type.shape.dim, t["shape"], strict=False):
            if isinstance(d, str):
                dim.dim_param = d
    path.write_bytes(proto.SerializeToString())


def check(src: TensorflowSource, doc: Mapping[str, object]) -> Iterable[Problem]:
    """Exactly one of factory and keras; the factory reference is well formed."""
    if ("factory" in src) == ("keras" in src):
        got = "it has both" if "factory" in src else "it has neither"
        yield (
            ("source", "tensorflow"),
            f"give exactly one of `factory` (file.py:function) and `keras` (a .keras file); {got}",
            True,
        )
    wrong = usercode.ref_problem(src["factory"]) if isinstance(src.get("factory"), str) else None
    if wrong:
        yield ("source", "tensorflow", "factory"), wrong, False


KIND = SourceKind(
    name="tensorflow",
    traced=True,
    identity=identity,
    estimate_weights=estimate_weights,
    record=record,
    load_model=load_model,
    check=check,
    adapter=KerasAdapter,
    needs_inputs="its input signature: name, dtype and shape of each model input",
    converter="tf2onnx",
    convert=convert,
    framework="TensorFlow",
)
"""What this kind says of itself (onnxbuild.sources.kind.SourceKind)."""
