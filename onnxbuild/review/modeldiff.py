"""The model-level part of ``onnxbuild diff``: what changed inside an ONNX file.

A key diff says *why* a file changed; a reviewer also needs *what* changed in it: its
inputs and outputs, its opset, which operators (and fused operators) it holds, how many
weight bytes of each type, and how far its outputs moved on the validation inputs. Both
sides come from the cache (local or remote), so this needs no rebuild.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx
    import onnxruntime

    from onnxbuild.engine.cache import Cache, EntryRecord
    from onnxbuild.engine.graph import Plan

from onnxbuild._util import brief
from onnxbuild.steps.exporting import section as export_kind
from onnxbuild.steps.validating import rules

# Operators that only exist as fusions (ONNX Runtime's contrib domain): the counts a
# transformers or onnxruntime bump silently changes.
FUSED_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class ModelFacts:
    """What a reviewer compares between two versions of one ONNX file."""

    opset: dict[str, int]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ops: dict[str, int]
    weights: dict[str, int]
    """Initializer bytes by element type (float32, int8, ...), external data included."""


@dataclass(frozen=True)
class ModelRow:
    """One line of a model file's diff: what, base value, working-tree value, unit."""

    what: str
    base: int | str | None
    now: int | str | None
    unit: str = ""  # "bytes" | "" (a count or a text)

    def shown(self, value: int | str | None) -> str:
        if value is None:
            return "-"
        if self.unit == "bytes":
            return _bytes(int(value))
        return str(value)


@dataclass
class ModelDiff:
    """One ONNX file whose bytes differ between the base and the working tree."""

    step: str
    path: str
    rows: list[ModelRow] = field(default_factory=list)
    drift: dict[str, float] = field(default_factory=dict)
    """Largest absolute difference per output between the two files on the same inputs."""
    drift_inputs: dict[str, int] = field(default_factory=dict)
    note: str = ""


def facts(path: Path) -> ModelFacts:
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load_model(str(path), load_external_data=False)
    ops: dict[str, int] = {}
    for node in _nodes(model.graph):
        name = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        ops[name] = ops.get(name, 0) + 1
    weights: dict[str, int] = {}
    for init in model.graph.initializer:
        kind = onnx.TensorProto.DataType.Name(init.data_type).lower()
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        except (KeyError, TypeError, ValueError):
            itemsize = 2
        count = 1
        for d in init.dims:
            count *= d
        if uses_external_data(init) or not init.raw_data:
            # 4-bit types pack two values a byte
            size = (count + 1) // 2 if kind in ("int4", "uint4") else count * itemsize
        else:
            size = len(init.raw_data)
        weights[kind] = weights.get(kind, 0) + size
    return ModelFacts(
        opset={(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        inputs=tuple(
            _signature(v) for v in model.graph.input if v.name not in {i.name for i in model.graph.initializer}
        ),
        outputs=tuple(_signature(v) for v in model.graph.output),
        ops=ops,
        weights=weights,
    )


def compare(old: ModelFacts, new: ModelFacts) -> list[ModelRow]:
    """What differs, the most telling first: signature, opset, fused ops, other ops, weights."""
    rows: list[ModelRow] = []
    for what, a, b in (("inputs", old.inputs, new.inputs), ("outputs", old.outputs, new.outputs)):
        gone, added = [s for s in a if s not in b], [s for s in b if s not in a]
        for s in gone:
            rows.append(ModelRow(what[:-1], s, None))
        for s in added:
            rows.append(ModelRow(what[:-1], None, s))
    for domain in sorted(set(old.opset) | set(new.opset)):
        if old.opset.get(domain) != new.opset.get(domain):
            rows.append(ModelRow(f"opset {domain}", old.opset.get(domain), new.opset.get(domain)))
    changed = [op for op in set(old.ops) | set(new.ops) if old.ops.get(op, 0) != new.ops.get(op, 0)]
    # fused operators first, then by how much the count moved
    changed.sort(key=lambda op: (not op.startswith(FUSED_DOMAIN), -abs(new.ops.get(op, 0) - old.ops.get(op, 0)), op))
    rows += [ModelRow(f"op {op}", old.ops.get(op, 0), new.ops.get(op, 0)) for op in changed]
    for kind in sorted(set(old.weights) | set(new.weights)):
        if old.weights.get(kind, 0) != new.weights.get(kind, 0):
            rows.append(ModelRow(f"weights {kind}", old.weights.get(kind, 0), new.weights.get(kind, 0), "bytes"))
    return rows


def drift(old: Path, new: Path, sizes: dict[str, int], seed: int) -> tuple[dict[str, float], str]:
    """Largest absolute difference per output of the two files on the same seeded inputs
    (built the way validation builds them), or a note saying why they cannot be compared."""
    import numpy as np
    import onnxruntime as ort

    from onnxbuild.sources.torchmodel import make_inputs, session_specs

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        a = ort.InferenceSession(str(old), options, providers=["CPUExecutionProvider"])
        b = ort.InferenceSession(str(new), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own types
        return {}, f"not run: ONNX Runtime cannot load one side ({brief(exc, limit=160)})"
    ins_a = {i.name: i.type for i in a.get_inputs()}
    ins_b = {i.name: i.type for i in b.get_inputs()}
    if ins_a != ins_b:
        return {}, "not run: the two files take different inputs"
    try:
        specs = session_specs(b.get_inputs(), sizes)
    except ValueError as exc:
        return {}, f"not run: {exc}"
    feeds = make_inputs(specs, sizes, seed=seed, vocab=_vocab(b))
    names = [o.name for o in b.get_outputs() if o.name in {x.name for x in a.get_outputs()}]
    try:
        ra, rb = a.run(names, feeds), b.run(names, feeds)
    except Exception as exc:
        return {}, f"not run: ONNX Runtime refused the inputs ({brief(exc, limit=160)})"
    out: dict[str, float] = {}
    for name, x, y in zip(names, ra, rb, strict=True):
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        out[name] = (
            float(np.max(np.abs(x - y)))
            if x.shape == y.shape and x.size
            else float("nan")
            if x.shape != y.shape
            else 0.0
        )
    return out, ""


def model_diffs(old_plan: Plan, new_plan: Plan, cache: Cache, resolved: Mapping[str, object]) -> list[ModelDiff]:
    """Every ONNX file both sides built whose bytes differ, with what changed inside it."""
    old = {s.spec.name: s for s in old_plan.steps}
    out: list[ModelDiff] = []
    validated = rules.section(resolved)
    traced = export_kind.section(resolved)
    shapes = (validated["shapes"] if validated else []) or [dict(traced["sample"]) if traced else {}]
    sizes = {**shapes[0], "past_sequence": 0}
    seed = validated["seed"] if validated else 0
    for step in new_plan.steps:
        before = old.get(step.spec.name)
        if step.entry is None or before is None or before.entry is None:
            continue
        then = {o["path"]: o["sha256"] for o in before.entry["outputs"]}
        for o in step.entry["outputs"]:
            rel = o["path"]
            if not rel.endswith(".onnx") or rel not in then or then[rel] == o["sha256"]:
                continue
            d = ModelDiff(step.spec.name, rel)
            with tempfile.TemporaryDirectory(prefix="onnxbuild-diff-") as tmp:
                a = _materialise(cache, before.entry, rel, Path(tmp) / "base")
                b = _materialise(cache, step.entry, rel, Path(tmp) / "now")
                if a is None or b is None:
                    d.note = "a side's file is not in the cache"
                else:
                    try:
                        d.rows = compare(facts(a), facts(b))
                    except Exception as exc:  # a file onnx cannot parse
                        d.note = f"cannot read a side ({type(exc).__name__})"
                    else:
                        d.drift, d.note = drift(a, b, sizes, seed)
                        d.drift_inputs = {k: v for k, v in sizes.items() if not (k == "past_sequence" and v == 0)}
            out.append(d)
    return out


def _materialise(cache: Cache, entry: EntryRecord, rel: str, folder: Path) -> Path | None:
    """The entry's file and its companions (external data) under their own names in a
    scratch folder; links, since the cache's objects are never written through."""
    folder.mkdir(parents=True)
    target = None
    for o in entry["outputs"]:
        if o["path"].startswith("reports/") or not (o["path"] == rel or not o["path"].endswith(".onnx")):
            continue
        src = cache.object_path(o["sha256"])
        if not src.is_file():
            if o["path"] == rel:
                return None
            continue
        dest = folder / o["path"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(src, dest)
        if o["path"] == rel:
            target = dest
    return target


def _vocab(session: onnxruntime.InferenceSession) -> int | None:
    """The vocabulary size when the first output is a language model's logits (a fixed last axis)."""
    if not any(i.name == "input_ids" for i in session.get_inputs()):
        return None
    last = session.get_outputs()[0].shape[-1] if session.get_outputs()[0].shape else None
    return last if isinstance(last, int) else None


def _signature(value: onnx.ValueInfoProto) -> str:
    import onnx

    t = value.type.tensor_type
    dims = ", ".join(
        d.dim_param if d.dim_param else str(d.dim_value) if d.HasField("dim_value") else "?" for d in t.shape.dim
    )
    dtype = onnx.TensorProto.DataType.Name(t.elem_type).lower() if t.elem_type else "?"
    return f"{value.name}: {dtype} [{dims}]"


def _nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    out = []
    for node in graph.node:
        out.append(node)
        for attr in node.attribute:
            if attr.g is not None and attr.g.node:
                out += _nodes(attr.g)
            for g in attr.graphs:
                out += _nodes(g)
    return out


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
