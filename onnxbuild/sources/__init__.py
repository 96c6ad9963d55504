"""Where models come from: one module per source kind, ``onnxbuild.sources.<kind>``.

Each module exports what its kind says of itself as ``KIND``, a typed
:class:`onnxbuild.sources.kind.SourceKind` (``source_kind(name)`` hands it out), without heavy
imports at plan time. Every kind gives ``identity`` (the local files whose digests identify
the model, and facts found without a network) and ``estimate_weights``; a kind traced
through torch (``traced=True``: huggingface, pytorch, tensorflow) also gives ``record``
(which weights the model gets, reports/source.json) and ``load_model``; ``onnx`` and
``graph`` sources write model.onnx in the source step instead. The optional fields (a
recipe check, defaults the schema cannot express, default inputs and outputs, the
dimensions validation varies or holds, an encoder-decoder's files, whether a top-1 floor
or a KV cache applies, the keys only later steps read or the record carries) have
defaults that mean "nothing of the kind": the field documentation is in sources/kind.py.

Adding a source kind is its module and its ``$defs/<kind>_source`` block in
recipe/schema.json (the kinds are the schema's ``source`` keys). A source module imports
no other source module and no step or engine module.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from onnxbuild.sources.kind import SourceKind


@cache
def kinds() -> tuple[str, ...]:
    """The source kinds: the keys the schema allows under ``source``."""
    schema = json.loads((Path(__file__).parent.parent / "recipe" / "schema.json").read_text(encoding="utf-8"))
    return tuple(schema["properties"]["source"]["properties"])


def source_module(kind: str) -> ModuleType:
    """The module of a source kind (imported on first use; the recipe's schema has already
    refused a kind it does not list, so the schema is not read again here)."""
    return importlib.import_module(f"onnxbuild.sources.{kind}")


def source_kind(kind: str) -> SourceKind[Any]:
    """What a source kind says of itself: its module's ``KIND``. Which section type its hooks
    take depends on ``kind``, a string: callers hand them the recipe's JSON section."""
    described: SourceKind[Any] = source_module(kind).KIND
    return described


def traced(source: Mapping[str, object]) -> bool:
    """Whether a recipe's ``source`` section is a framework model to export."""
    ((kind, src),) = source.items()
    described = source_kind(kind)
    return described.traced and described.traced_when(src)


def traced_kinds() -> list[str]:
    return [k for k in kinds() if source_kind(k).traced]


def is_decoder(source: Mapping[str, object]) -> bool:
    """Whether a recipe's ``source`` is a text decoder, which ``export.with_past`` and the
    fused decoder graphs apply to (the kind's ``decoder``; none has it by default)."""
    ((kind, src),) = source.items()
    return source_kind(kind).decoder(src)


def recorded(section: Mapping[str, object]) -> tuple[str, ...]:
    """The ``source:`` keys (dotted, as under a step's params) the source record carries to the
    steps that read it: left out of their keys, the record being in them as an input."""
    ((kind, src),) = section.items()
    if not isinstance(src, dict):
        return ()
    return tuple(f"source.{kind}.{k}" for k in source_kind(kind).recorded if k in src)


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
