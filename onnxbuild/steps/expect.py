"""The ``expect[.<variant>]`` steps: a variant's graph contract, checked right after the step
that writes it.

A recipe's ``expect:`` says, per variant (``model``, ``optimized``, a quantize name) or for
``all`` of them, what its file must hold: fused-op counts (``GroupQueryAttention: 12``,
``SkipLayerNormalization: ">= 24"``), ops that must not appear, the least share of the
weight bytes in a dtype (``int8: 0.7``; 4-bit packed weights count as ``int4``), the largest
file, the opset and the signature (``input_ids: int64[batch, sequence]``). A broken rule
fails the build naming the rule, what it expected and what the file holds: a transformers or
onnxruntime upgrade that stops a fusion from firing fails CI with the fusion's name, and a
"float16" file that still holds float32 weights fails its weights rule.

An encoder-decoder's rules on ops, weights and size hold for its files together; the
signature and opset are the decoder's.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from onnxbuild._util import every_node, pretty_json
from onnxbuild.errors import StepError
from onnxbuild.recipe.sections import Contract
from onnxbuild.spec import Checking, Found, Planning, StepInput, StepKind
from onnxbuild.steps.base import StepContext, StepResult, StepSpec

if TYPE_CHECKING:
    import onnx

PACKAGES = ("onnx",)

MEMORY = (1, 300)

ALL = "all"
"""The ``expect:`` key whose rules apply to every variant."""

COMPARISON = re.compile(r"^\s*(==|>=|<=|>|<)?\s*([0-9]+)\s*$")
OPERATORS: dict[str, Callable[[int, int], bool]] = {
    "==": operator.eq,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}

# ONNX TensorProto data types by name, as the weights rule spells them
DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    9: "bool",
    5: "int16",
    6: "int32",
    7: "int64",
    10: "float16",
    11: "float64",
    16: "bfloat16",
    21: "uint4",
    22: "int4",
}


def plan(p: Planning) -> list[StepSpec]:
    """One step per variant with a contract (its own rules over ``all``'s, rule by rule)."""
    expect = p.recipe.resolved.get("expect") or {}
    if not expect:
        return []
    common = expect.get(ALL)
    steps = []
    for v in p.variants:
        own = expect.get(v.name)
        if common is None and own is None:
            continue
        contract = _merged(common, own)
        name = "expect" if v.name == "model" else f"expect.{v.name}"
        steps.append(
            StepSpec(
                name=name,
                kind="expect",
                params={"expect": contract, "variant": v.name, "files": list(v.paths)},
                deps=(v.step,),
                inputs=tuple(StepInput(v.step, f) for f in v.paths),
                outputs=(f"reports/expect/{v.name}.json",),
            )
        )
    return steps


class ExpectParams(TypedDict):
    """What :func:`plan` puts in a step's params."""

    expect: Contract
    variant: str
    files: list[str]


class RuleCheck(TypedDict):
    """One rule's line in reports/expect/<variant>.json."""

    rule: str
    expected: object
    actual: object
    ok: bool


def _merged(common: Contract | None, own: Contract | None) -> Contract | None:
    """``all``'s rules under the variant's own: mappings (ops, weights, inputs, outputs) merge
    name by name, the rest is replaced."""
    if common is None:
        return own
    if own is None:
        return common
    merged = common | own
    # each mapping rule by name: their value types differ, so one at a time
    if "ops" in common and "ops" in own:
        merged["ops"] = common["ops"] | own["ops"]
    if "weights" in common and "weights" in own:
        merged["weights"] = common["weights"] | own["weights"]
    if "inputs" in common and "inputs" in own:
        merged["inputs"] = common["inputs"] | own["inputs"]
    if "outputs" in common and "outputs" in own:
        merged["outputs"] = common["outputs"] | own["outputs"]
    return merged


def run(ctx: StepContext, spec: StepSpec) -> StepResult:
    import onnx

    params = cast(ExpectParams, spec.params)  # the JSON plan() built
    contract, variant = params["expect"], params["variant"]
    files = [ctx.input(f) for f in params["files"]]
    models = [onnx.load_model(str(f), load_external_data=False) for f in files]
    main = models[-1]
    ops: Counter[str] = Counter(n.op_type for m in models for n in every_node(m.graph))
    checks: list[RuleCheck] = []

    def rule(name: str, expected: object, actual: object, ok: bool) -> None:
        checks.append({"rule": f"expect.{variant}.{name}", "expected": expected, "actual": actual, "ok": ok})

    for op, wanted in (contract.get("ops") or {}).items():
        how, count = _comparison(wanted, f"expect.{variant}.ops.{op}")
        rule(f"ops.{op}", f"{how} {count}", ops.get(op, 0), OPERATORS[how](ops.get(op, 0), count))
    for op in contract.get("absent") or []:
        rule(f"absent.{op}", "absent", ops.get(op, 0), ops.get(op, 0) == 0)
    if contract.get("weights"):
        shares = weight_shares(models, files)
        for dtype, least in contract["weights"].items():
            rule(
                f"weights.{dtype}",
                f">= {least:.0%} of the weight bytes",
                f"{shares.get(dtype, 0.0):.1%}",
                shares.get(dtype, 0.0) >= least,
            )
    if contract.get("max_mb") is not None:
        size = sum(_file_bytes(f) for f in files) / 1e6
        rule("max_mb", f"<= {contract['max_mb']:g} MB", f"{size:.2f} MB", size <= contract["max_mb"])
    if contract.get("opset") is not None:
        opset = next((o.version for o in main.opset_import if o.domain in ("", "ai.onnx")), None)
        rule("opset", contract["opset"], opset, opset == contract["opset"])
    for side, values in (("inputs", main.graph.input), ("outputs", main.graph.output)):
        signature = {v.name: _signature(v) for v in values}
        wanted_by_name = (contract.get("inputs") if side == "inputs" else contract.get("outputs")) or {}
        for name, wanted in wanted_by_name.items():
            got = signature.get(name, "missing")
            rule(f"{side}.{name}", _normal(wanted), got, got == _normal(wanted))

    ctx.output(f"reports/expect/{variant}.json").write_text(
        pretty_json({"variant": variant, "checks": checks}), encoding="utf-8"
    )
    broken = [c for c in checks if not c["ok"]]
    if broken:
        lines = "; ".join(f"{c['rule']}: expected {c['expected']}, found {c['actual']}" for c in broken)
        raise StepError(f"the {variant} file breaks {len(broken)} of its {len(checks)} contract rules: {lines}")
    return StepResult(summary=f"{len(checks)} rules hold", data={"rules": len(checks)})


def _comparison(wanted: int | str, key: str) -> tuple[str, int]:
    if isinstance(wanted, int):
        return "==", wanted
    match = COMPARISON.match(str(wanted))
    if match is None:  # the schema's pattern refuses it first; kept for a recipe loaded another way
        raise StepError(f"{key}: {wanted!r} is not a count or a comparison such as '>= 24'")
    return match.group(1) or "==", int(match.group(2))


def weight_shares(models: list[onnx.ModelProto], files: list[Path]) -> dict[str, float]:
    """Share of the initializer bytes by dtype; a 4-bit packed weight (MatMulNBits' B,
    GatherBlockQuantized's data) counts as int4 whatever its storage type."""
    sizes: Counter[str] = Counter()
    for model in models:

        def four(n: onnx.NodeProto) -> bool:  # both ops' bits default to 4; weight_only may say 8
            return next((a.i for a in n.attribute if a.name == "bits"), 4) == 4

        packed = {n.input[1] for n in model.graph.node if n.op_type == "MatMulNBits" and len(n.input) > 1 and four(n)}
        packed |= {n.input[0] for n in model.graph.node if n.op_type == "GatherBlockQuantized" and four(n)}
        for t in model.graph.initializer:
            dtype = "int4" if t.name in packed else DTYPES.get(t.data_type, f"type {t.data_type}")
            sizes[dtype] += _tensor_bytes(t)
    total = sum(sizes.values())
    return {k: v / total for k, v in sizes.items()} if total else {}


def _tensor_bytes(t: onnx.TensorProto) -> int:
    if t.raw_data:
        return len(t.raw_data)
    external = {e.key: e.value for e in t.external_data}
    if "length" in external:
        return int(external["length"])
    import onnx

    return len(onnx.numpy_helper.to_array(t).tobytes()) if t.data_location != onnx.TensorProto.EXTERNAL else 0


def _file_bytes(path: Path) -> int:
    """The file and its external-data files beside it."""
    return path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(f"{path.name}.data*"))


def _signature(value: onnx.ValueInfoProto) -> str:
    from onnx import helper

    tensor = value.type.tensor_type
    dims = ", ".join(d.dim_param or str(d.dim_value) for d in tensor.shape.dim)
    return f"{helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else '?'}[{dims}]"


def _normal(signature: str) -> str:
    """``int64[batch,sequence]`` and ``int64[ batch, sequence ]`` read alike."""
    head, _, dims = signature.partition("[")
    return f"{head.strip()}[{', '.join(d.strip() for d in dims.rstrip(']').split(',') if d.strip())}]"


def check(c: Checking) -> Iterable[Found]:
    for variant in c.doc.get("expect") or {}:
        if variant != "all" and variant not in c.variants:
            yield (
                ("expect", variant),
                f"no variant {variant!r} (this recipe has: {', '.join(c.variants)}; `all` for every one)",
                True,
            )


KIND = StepKind(
    name="expect",
    packages=PACKAGES,
    plan=plan,
    run=run,
    memory=MEMORY,
    check=check,
    each_variant=True,
)
"""What this kind says of itself (onnxbuild.spec.StepKind)."""
