"""reports/check.json's typed shape and reports/check.md (a pure function of the report)."""

from __future__ import annotations

from typing import TypedDict


class TensorReport(TypedDict):
    """An input or output of the checked model: name, element type, shape."""

    name: str
    dtype: str
    shape: list[int | str | None]


class CheckReport(TypedDict):
    """reports/check.json: opset, IR version, inputs and outputs, operator counts."""

    passed: bool
    ir_version: int
    opsets: dict[str, int]
    producer: str
    inputs: list[TensorReport]
    outputs: list[TensorReport]
    op_types: dict[str, int]
    nodes: int
    initializers: int
    parameters: int
    parameter_bytes: int
    file_bytes: int
    external_data_bytes: int


def markdown(r: CheckReport, name: str) -> str:
    def shape(t: TensorReport) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in t["shape"]) + "]"

    lines = [
        f"# {name}: model check",
        "",
        "ONNX checker (full check) and strict shape inference: **passed**",
        "",
        "| property | value |",
        "|---|---|",
        f"| IR version | {r['ir_version']} |",
        "| opsets | " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(r["opsets"].items())) + " |",
        f"| producer | {r['producer'] or '-'} |",
        f"| nodes | {r['nodes']} |",
        f"| parameters | {r['parameters']:,} ({r['parameter_bytes']:,} bytes) |",
        f"| file size | {r['file_bytes']:,} bytes (+ {r['external_data_bytes']:,} external) |",
        "",
        "## Inputs and outputs",
        "",
        "| | name | dtype | shape |",
        "|---|---|---|---|",
    ]
    lines += [f"| input | {t['name']} | {t['dtype']} | {shape(t)} |" for t in r["inputs"]]
    lines += [f"| output | {t['name']} | {t['dtype']} | {shape(t)} |" for t in r["outputs"]]
    lines += ["", "## Operators", "", "| op | count |", "|---|---|"]
    lines += [f"| {op} | {n} |" for op, n in r["op_types"].items()]
    return "\n".join(lines) + "\n"
