"""The ``web`` target: run a model in onnxruntime-web (wasm backend) under Node.js.

The seeds present ONNX Runtime Web as another way to serve a model. onnxbuild runs it
where a browser would, minus the browser: ``run.mjs`` beside this file loads the model
with ``executionProviders: ['wasm']`` and one thread, runs the inputs Python wrote, and
writes the outputs back as raw bytes. The npm package is pinned in package-lock.json here.
``make install`` installs it beside this file (``npm ci --prefix <this folder>``); a user who
only ran ``pip install`` gets it on the web target's first use, installed with ``npm ci`` from
the same lock into a per-user cache (``$XDG_CACHE_HOME/onnxbuild/web-<lock digest>``, or
``ONNXBUILD_WEB_DIR``), so the README's first command gives the whole result. Without Node,
npm or the registry, the web target is skipped with that reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild._util import sha256_bytes

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

HERE = Path(__file__).resolve().parent
RUNNER_NAME = "run.mjs"
LOCK = HERE / "package-lock.json"
WEB_DIR_ENV = "ONNXBUILD_WEB_DIR"
NPM_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class WebRun:
    """onnxruntime-web under Node.js: outputs and per-iteration timings, or the error."""

    outputs: dict[str, NDArray[np.generic]]
    times_ms: list[float]
    error: str | None


def _installed(folder: Path) -> bool:
    return (folder / "node_modules" / "onnxruntime-web" / "package.json").is_file() and (folder / RUNNER_NAME).is_file()


def user_dir() -> Path:
    """Where a first use installs the pinned package: one folder per package-lock.json and runner."""
    if os.environ.get(WEB_DIR_ENV):
        return Path(os.environ[WEB_DIR_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    # run.mjs is copied there too, so a new runner gets a new folder as a new lock does
    return base / "onnxbuild" / f"web-{sha256_bytes(LOCK.read_bytes() + (HERE / RUNNER_NAME).read_bytes())[:12]}"


def home() -> Path | None:
    """The folder whose node_modules holds onnxruntime-web (beside this file, else the user cache)."""
    for folder in (HERE, user_dir()):
        if _installed(folder):
            return folder
    return None


def unavailable(*, install: bool = True) -> str | None:
    """Why the web target cannot run here, or None when it can (installing it first if need be)."""
    if shutil.which("node") is None:
        return "Node.js is not installed (the web target runs onnxruntime-web under node)"
    if home() is not None:
        return None
    if not install:
        return f"onnxruntime-web is not installed: run `npm ci --prefix {HERE}` (make install does)"
    return install_into(user_dir())


def install_into(folder: Path) -> str | None:
    """Install the pinned onnxruntime-web into ``folder`` with ``npm ci``; why not, or None.

    Installs into a temporary sibling and renames it into place, under a lock, so two builds
    starting at once install it once and a killed install leaves nothing half-written.
    """
    if shutil.which("npm") is None:
        return (
            "onnxruntime-web is not installed and npm is not on PATH: install Node.js with npm, "
            f"or run `npm ci --prefix {HERE}`"
        )
    import fcntl

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f".{folder.name}.lock", "w", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _installed(folder):
                return None
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
            try:
                for name in ("package.json", "package-lock.json", RUNNER_NAME):
                    shutil.copyfile(HERE / name, tmp / name)
                try:
                    done = subprocess.run(
                        [
                            "npm",
                            "ci",
                            "--prefix",
                            str(tmp),
                            "--no-audit",
                            "--no-fund",
                            "--ignore-scripts",
                            "--loglevel=error",
                        ],
                        capture_output=True,
                        text=True,
                        timeout=NPM_TIMEOUT_S,
                    )
                except subprocess.TimeoutExpired:
                    return (
                        f"installing onnxruntime-web with npm ci took over {NPM_TIMEOUT_S:.0f} s (no registry?); "
                        f"run `npm ci --prefix {HERE}` by hand"
                    )
                if done.returncode != 0:
                    tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])[:300]
                    return (
                        f"installing onnxruntime-web with npm ci failed ({tail}); run `npm ci --prefix {HERE}` by hand"
                    )
                if folder.exists():
                    shutil.rmtree(folder)  # an older, incomplete install: _installed() said no
                os.replace(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        return (
            f"cannot install onnxruntime-web into {folder} ({exc.strerror or exc}); "
            f"set {WEB_DIR_ENV} to a writable folder"
        )
    return None


def version() -> str:
    folder = home()
    if folder is None:
        return "?"
    data: dict[str, object] = json.loads(
        (folder / "node_modules" / "onnxruntime-web" / "package.json").read_text(encoding="utf-8")
    )
    return str(data.get("version", "?"))


def where() -> str:
    """Where the package was found, for reports: empty when it is the one beside this file."""
    folder = home()
    return "" if folder is None or folder == HERE else str(folder)


def run(
    model: Path,
    feeds: Mapping[str, NDArray[np.generic]],
    *,
    warmup: int = 0,
    iterations: int = 0,
    threads: int = 1,
    timeout_s: float = 600,
) -> WebRun:
    """Run ``model`` on ``feeds`` (numpy arrays) in onnxruntime-web; outputs by name, as numpy."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="onnxbuild-web-") as tmp:
        work = Path(tmp)
        inputs = []
        for i, (name, array) in enumerate(feeds.items()):
            arr = np.ascontiguousarray(array)
            file = work / f"in{i}.bin"
            file.write_bytes(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
            inputs.append(
                {
                    "name": name,
                    "dtype": "bool" if arr.dtype == np.bool_ else arr.dtype.name,
                    "dims": list(arr.shape),
                    "file": str(file),
                }
            )
        job = {
            "model": str(Path(model).resolve()),
            "threads": threads,
            "warmup": warmup,
            "iterations": iterations,
            "inputs": inputs,
            "out": str(work),
        }
        (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
        try:
            folder = home()
            if folder is None:
                return WebRun({}, [], unavailable(install=False))
            done = subprocess.run(
                ["node", str(folder / RUNNER_NAME), str(work / "job.json")],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=folder,
            )
        except subprocess.TimeoutExpired:
            return WebRun({}, [], f"onnxruntime-web did not finish in {timeout_s:.0f} s")
        result_path = work / "result.json"
        if not result_path.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return WebRun({}, [], "node failed: " + " ".join(tail)[:400])
        result = json.loads(result_path.read_text(encoding="utf-8"))
        outputs: dict[str, NDArray[np.generic]] = {}
        for o in result["outputs"]:
            dtype = np.dtype("bool" if o["dtype"] == "bool" else o["dtype"])
            outputs[o["name"]] = np.frombuffer(Path(o["file"]).read_bytes(), dtype=dtype).reshape(o["dims"]).copy()
        return WebRun(outputs, [float(t) for t in result["times_ms"]], result["error"])
