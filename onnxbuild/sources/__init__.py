"""Where models come from: one module per source kind, ``onnxbuild.sources.<kind>``.

Every source module says, without heavy imports at plan time:

- ``identity(src, recipe_dir) -> (files, facts)``: the local files whose digests identify
  the model (hashed into the source step's key) and facts found without a network (a
  Hub commit, package versions);
- ``estimate_weights(src, recipe_dir) -> int``: bytes of fp32 weights, to place steps on
  a cluster by memory;

and, for a source traced through torch (``huggingface``, ``pytorch``, ``tensorflow``):

- ``record(src, recipe_dir, digests) -> dict``: the source step's record of which weights
  the model gets (reports/source.json);
- ``load_model(src, record, recipe_dir)``: the model that record describes (torch,
  transformers or TensorFlow imported here).

``onnx`` and ``graph`` sources write model.onnx in the source step instead.

What the recipe layer asks of a kind (the loader imports these modules, so they import
only core modules, and heavy packages only inside functions):

- ``TRACED``: whether the model is exported (it then has ``export`` and ``validate``
  sections); ``traced(src)`` where it depends on the section (``huggingface.file``);
- ``resolve(src, defaults)``: defaults the schema cannot express (nested lists);
- ``check(src, doc)``: cross-field problems as ``(key path, message, at the key)``;
- ``default_io(src)``: export inputs and outputs when the recipe gives none (a task's);
- ``varied_dims(src)``: dimensions validation always varies; ``held_dims(src)``: those
  its default shapes keep at the sample size; ``sample_defaults(src)``: export sample
  sizes its config gives; ``fixed_image_size(src)``: an image model of one size (its own
  check asks for it); ``files(src)``: the ONNX files of one variant when more than
  model.onnx, and ``seq2seq(src)``: those are an encoder and a decoder;
  ``top1(src)``: a top-1 floor applies; ``decoder(src)``: ``export.with_past`` applies; ``benchmark_inputs(src)``: inputs an untraced source is benchmarked by.

``LATER``: keys only the steps after the source step read (how the model is loaded, its
tokenizer): not in the source step's key.
``RECORDED``: keys whose whole effect on later steps reaches them through the source step's
record (which weights, from where): left out of the keys of the steps that read that record.

Adding a source kind is this module and its ``$defs/<kind>_source`` block in
recipe/schema.json (the kinds are the schema's ``source`` keys). A source module imports
no other source module and no step or engine module.
"""  # noqa: E501

from __future__ import annotations

import importlib
import json
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any


@cache
def kinds() -> tuple[str, ...]:
    """The source kinds: the keys the schema allows under ``source``."""
    schema = json.loads((Path(__file__).parent.parent / "recipe" / "schema.json").read_text(encoding="utf-8"))
    return tuple(schema["properties"]["source"]["properties"])


def source_module(kind: str) -> ModuleType:
    """The module of a source kind (imported on first use; the recipe's schema has already
    refused a kind it does not list, so the schema is not read again here)."""
    return importlib.import_module(f"onnxbuild.sources.{kind}")


def traced(source: dict[str, Any]) -> bool:
    """Whether a recipe's ``source`` section is a framework model to export."""
    ((kind, src),) = source.items()
    module = source_module(kind)
    check = getattr(module, "traced", None)
    return bool(module.TRACED) and (check is None or bool(check(src)))


def traced_kinds() -> list[str]:
    return [k for k in kinds() if source_module(k).TRACED]


def is_decoder(source: dict[str, Any]) -> bool:
    """Whether a recipe's ``source`` is a text decoder, which ``export.with_past`` and the
    fused decoder graphs apply to (the kind's ``decoder(src)``; none has it by default)."""
    ((kind, src),) = source.items()
    check = getattr(source_module(kind), "decoder", None)
    return bool(check(src)) if check is not None else False


def recorded(section: Any) -> tuple[str, ...]:
    """The ``source:`` keys (dotted, as under a step's params) the source record carries to the
    steps that read it: left out of their keys, the record being in them as an input."""
    ((kind, src),) = section.items()
    if not isinstance(src, dict):
        return ()
    return tuple(f"source.{kind}.{k}" for k in getattr(source_module(kind), "RECORDED", ()) if k in src)


def section_for(section: Any, *, drop: tuple[str, ...] = (), unset: tuple[str, ...] = ()) -> Any:
    """The ``source:`` section as one step reads it: less the keys it never reads (``drop``)
    and the options it reads only when they are set (``unset``, while None)."""
    from onnxbuild._util import pick

    ((kind, src),) = section.items()
    if not isinstance(src, dict):
        return section
    kept = pick(src, {k for k, v in src.items() if k not in drop and not (k in unset and v is None)})
    paths = getattr(section, "paths", None)
    return {kind: kept} if paths is None else type(section)({kind: kept}, paths)
