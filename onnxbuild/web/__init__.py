"""The ``web`` target: run a model in onnxruntime-web (wasm backend) under Node.js.

The seeds present ONNX Runtime Web as another way to serve a model. onnxbuild runs it
where a browser would, minus the browser: ``run.mjs`` beside this file loads the model
with ``executionProviders: ['wasm']`` and one thread, runs the inputs Python wrote, and
writes the outputs back as raw bytes. The npm package is pinned in package-lock.json here
and installed with ``npm ci --prefix <this folder>`` (``make install`` does it); without
Node or the package, the web target is skipped with that reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "run.mjs"
PACKAGE = HERE / "node_modules" / "onnxruntime-web" / "package.json"
WEB = "web"
"""The provider name a recipe lists for this target."""


@dataclass(frozen=True)
class WebRun:
    outputs: dict[str, Any]
    times_ms: list[float]
    error: str | None


def unavailable() -> str | None:
    """Why the web target cannot run here, or None when it can."""
    if shutil.which("node") is None:
        return "Node.js is not installed (the web target runs onnxruntime-web under node)"
    if not PACKAGE.is_file():
        return f"onnxruntime-web is not installed: run `npm ci --prefix {HERE}` (make install does)"
    return None


def version() -> str:
    data: dict[str, Any] = json.loads(PACKAGE.read_text(encoding="utf-8"))
    return str(data.get("version", "?"))


def run(model: Path, feeds: dict[str, Any], *, warmup: int = 0, iterations: int = 0, threads: int = 1, timeout_s: float = 600) -> WebRun:
    """Run ``model`` on ``feeds`` (numpy arrays) in onnxruntime-web; outputs by name, as numpy."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="onnxbuild-web-") as tmp:
        work = Path(tmp)
        inputs = []
        for i, (name, array) in enumerate(feeds.items()):
            arr = np.ascontiguousarray(array)
            file = work / f"in{i}.bin"
            file.write_bytes(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
            inputs.append({"name": name, "dtype": "bool" if arr.dtype == np.bool_ else arr.dtype.name, "dims": list(arr.shape), "file": str(file)})
        job = {"model": str(Path(model).resolve()), "threads": threads, "warmup": warmup, "iterations": iterations, "inputs": inputs, "out": str(work)}
        (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
        try:
            done = subprocess.run(["node", str(RUNNER), str(work / "job.json")], capture_output=True, text=True, timeout=timeout_s, cwd=HERE)
        except subprocess.TimeoutExpired:
            return WebRun({}, [], f"onnxruntime-web did not finish in {timeout_s:.0f} s")
        result_path = work / "result.json"
        if not result_path.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return WebRun({}, [], "node failed: " + " ".join(tail)[:400])
        result = json.loads(result_path.read_text(encoding="utf-8"))
        outputs: dict[str, Any] = {}
        for o in result["outputs"]:
            dtype = np.dtype("bool" if o["dtype"] == "bool" else o["dtype"])
            outputs[o["name"]] = np.frombuffer(Path(o["file"]).read_bytes(), dtype=dtype).reshape(o["dims"]).copy()
        return WebRun(outputs, [float(t) for t in result["times_ms"]], result["error"])
