"""Artifact digests that two builds of one recipe share, whoever ran their steps (the Ray
tests), and an ONNX file's inputs and outputs with their dimensions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx

MEASURED = {"timings.json", "report.html", "benchmark.json", "benchmark.md", "benchmark.png", "machine.json"}
"""Durations, memory, latencies and the machine's peaks: they differ run to run by design, whichever executor ran them."""  # noqa: E501


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every artifact but the measured ones; a manifest without its measured steps' figures."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name in MEASURED:
            continue
        data = p.read_bytes()
        if p.name == "manifest.json":
            manifest = json.loads(data)
            for step in manifest["steps"]:
                if step["kind"] in ("benchmark", "machine"):
                    step["outputs"] = [o["path"] for o in step["outputs"]]
                    step["data"] = {}
            data = json.dumps(manifest, sort_keys=True).encode()
        out[p.relative_to(folder).as_posix()] = hashlib.sha256(data).hexdigest()
    return out


def signature(path: Path) -> dict[str, list[int | str]]:
    """Each input's and output's dimensions, a name where the axis is dynamic."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.input, *graph.output]
    }
