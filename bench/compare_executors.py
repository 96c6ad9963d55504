"""Build recipes/*.yaml with the local executor and with ``--executor ray``, then compare every
artifact byte for byte (the check behind #8): measurements (benchmark.*, timings.json) are
left out, and manifests are compared with the benchmark step's output digests left out.

    python3 bench/compare_executors.py [WORK_DIR]     # ~10 minutes on 2 cores
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASURED = {"benchmark.json", "benchmark.md", "benchmark.png", "timings.json"}


def build(where: Path, extra: list[str]) -> Path:
    if where.exists():
        shutil.rmtree(where)
    shutil.copytree(ROOT / "recipes", where / "recipes")
    recipes = sorted(str(p.relative_to(where)) for p in (where / "recipes").glob("*.yaml"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("ONNXBUILD_CACHE_DIR", None)
    start = time.perf_counter()
    done = subprocess.run(["onnxbuild", "make", *recipes, *extra], cwd=where, env=env, capture_output=True, text=True)
    print(f"{where.name}: exit {done.returncode} in {time.perf_counter() - start:.0f} s", flush=True)
    if done.returncode:
        sys.exit(done.stderr[-2000:])
    return where / "artifacts"


def digests(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name in MEASURED:
            continue
        data = p.read_bytes()
        if p.name == "manifest.json":
            manifest = json.loads(data)
            for step in manifest["steps"]:
                if step["kind"] == "benchmark":
                    step["outputs"] = [o["path"] for o in step["outputs"]]
                    step["data"] = {}
            data = json.dumps(manifest, sort_keys=True).encode()
        out[p.relative_to(folder).as_posix()] = hashlib.sha256(data).hexdigest()
    return out


def main() -> None:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/onnxbuild-executors")
    local = digests(build(work / "local", []))
    ray = digests(build(work / "ray", ["--executor", "ray"]))
    differ = sorted(k for k in set(local) | set(ray) if local.get(k) != ray.get(k))
    print(f"{len(local)} artifact files compared; differing: {differ or 'none'}")


if __name__ == "__main__":
    main()
