"""Where models come from: one module per source kind, named in ``SOURCES``.

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

``onnx`` and ``graph`` sources write model.onnx in the source step instead. A source
module imports no other source module and no step or engine module.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SOURCES: dict[str, str] = {kind: f"onnxbuild.sources.{kind}" for kind in ("onnx", "graph", "huggingface", "pytorch", "tensorflow")}


def source_module(kind: str) -> ModuleType:
    """The module of a source kind (imported on first use)."""
    return importlib.import_module(SOURCES[kind])
