"""What a dependency bump does to the artifacts: ``onnxbuild upgrade-check``.

The recipes are built twice: here, and in a throwaway virtual environment that has this
environment's packages with the ``--with`` requirements installed over them (a separate
cache and artifacts folder, so nothing built here is touched). Then, per artifact: are the
bytes identical, did validation figures move, did fused-op counts change, did a contract
or a validation break, and how did latency move on this machine. The report is Markdown
for a pull request.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from onnxbuild.errors import UsageError


@dataclass(frozen=True)
class Side:
    """One environment's build of the recipes."""

    label: str
    versions: dict[str, str]
    artifacts: Path
    ok: bool
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Comparison:
    markdown: str
    broken: bool
    """A contract, a validation or the build itself broke with the new versions."""


def environment(withs: list[str], root: Path) -> Path:
    """A virtual environment with this one's packages and ``withs`` installed over them
    (made once per set of requirements under ``root``); its Python."""
    if not withs:
        raise UsageError("--with: name at least one requirement to try, such as --with 'onnxruntime==1.30.0'")
    digest = hashlib.sha256("\n".join(sorted(withs)).encode()).hexdigest()[:12]
    venv = root / digest
    python = venv / "bin" / "python"
    marker = venv / "installed.json"
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == sorted(withs):
        return python
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(venv)], capture_output=True, text=True
    )
    if made.returncode != 0:
        raise UsageError(f"could not make a virtual environment at {venv}: {made.stderr.strip()[-500:]}")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *withs],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise UsageError(
            f"pip could not install {' '.join(withs)}: {done.stderr.strip()[-800:]}; "
            "check the versions exist for this Python (pip index versions NAME)"
        )
    marker.write_text(json.dumps(sorted(withs)), encoding="utf-8")
    return python


def build_with(python: Path, recipes: list[str], work: Path) -> tuple[bool, list[str]]:
    """``onnxbuild make --keep-going`` with that Python, into ``work``; (ok, failure lines)."""
    done = subprocess.run(
        [
            str(python),
            "-m",
            "onnxbuild",
            "make",
            "--keep-going",
            "--cache-dir",
            str(work / "cache"),
            "--artifacts-dir",
            str(work / "artifacts"),
            *recipes,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONNOUSERSITE": "1"},
    )
    failures = [line.strip() for line in done.stderr.splitlines() if "step " in line and " failed" in line]
    return done.returncode == 0, failures


def versions_of(python: Path) -> dict[str, str]:
    # the modules' own versions: onnxruntime may come from onnxruntime-gpu's distribution
    code = (
        "import json, importlib\nout = {}\n"
        "for n in ('onnx', 'onnxruntime', 'torch', 'transformers', 'numpy', 'onnxscript'):\n"
        "    try: out[n] = importlib.import_module(n).__version__\n"
        "    except Exception: pass\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    out: dict[str, str] = json.loads(done.stdout)
    return out


def compare(before: Side, after: Side, names: list[str]) -> Comparison:
    """The Markdown report of ``after`` against ``before`` for the recipes ``names``."""
    changed = {k: (before.versions.get(k), v) for k, v in after.versions.items() if before.versions.get(k) != v}
    lines = [
        "## Dependency check: "
        f"{', '.join(f'{k} {a} -> {b}' for k, (a, b) in changed.items()) or 'no package version changed'}",
        "",
    ]
    broken = not after.ok
    for name in names:
        lines += [f"### {name}", ""]
        a, b = _read(before.artifacts / name), _read(after.artifacts / name)
        if not b["manifest"]:
            lines += ["Not built with the new versions: " + ("; ".join(after.failures) or "see the build log"), ""]
            broken = True
            continue
        lines += ["| file | bytes | validation max abs diff | fused ops | p50 latency |", "|---|---|---|---|---|"]
        for path in sorted(set(a["files"]) | set(b["files"])):
            if not path.endswith(".onnx"):
                continue
            variant = "model" if "/" not in path else path.split("/")[0]
            same = (
                "identical"
                if a["files"].get(path) == b["files"].get(path)
                else ("new" if path not in a["files"] else "missing" if path not in b["files"] else "differ")
            )
            lines.append(
                f"| `{path}` | {same} | {_moved(a['validation'].get(variant), b['validation'].get(variant))} | "
                f"{_fused(a['fused'], b['fused'], variant)} | "
                f"{_latency(a['latency'].get(variant), b['latency'].get(variant))} |"
            )
        for variant, (was, now) in sorted(
            {v: (a["passed"].get(v), b["passed"].get(v)) for v in set(a["passed"]) | set(b["passed"])}.items()
        ):
            if was and now is False:
                lines.append(f"\n**validation of {variant} broke** with the new versions")
                broken = True
        lines.append("")
    if after.failures:
        lines += ["Failed with the new versions:", "", *[f"- {f}" for f in after.failures], ""]
    lines.append("Latency from one run on this machine each side; compare ratios, not single figures.")
    return Comparison("\n".join(lines) + "\n", broken)


class _Built(TypedDict):
    """What one side's artifact folder says about a recipe, for the comparison."""

    manifest: object
    files: dict[str, str]
    validation: dict[str, float | None]
    passed: dict[str, bool]
    fused: dict[str, int]
    latency: dict[str, float]


def _read(folder: Path) -> _Built:
    # Any: the manifest and three step reports, each of its own shape, read with .get chains; a damaged
    # one fails there as it always has, which narrowing each level to object would change
    def load(rel: str) -> Any:
        p = folder / rel
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None

    manifest = load("manifest.json") or {}
    files = {o["path"]: o["sha256"] for s in manifest.get("steps", []) for o in s.get("outputs", [])}
    validation = load("reports/validation.json") or {}
    per_variant = validation.get("variants", {})
    diffs = {
        v: max(
            (c.get("max_abs_diff") or 0.0 for s in r.get("shapes", []) for c in s.get("outputs", {}).values()),
            default=None,
        )
        for v, r in per_variant.items()
    }
    passed = {v: bool(r.get("passed")) for v, r in per_variant.items()}
    fused = (load("reports/optimize.json") or {}).get("fused_ops") or {}
    bench = load("benchmark.json") or {}
    latency: dict[str, float] = {}
    for r in bench.get("results", []):
        if r.get("provider") == "CPUExecutionProvider" and r.get("p50_ms") is not None:
            latency.setdefault(r["variant"], r["p50_ms"])
    return {
        "manifest": manifest,
        "files": files,
        "validation": diffs,
        "passed": passed,
        "fused": fused,
        "latency": latency,
    }


def _moved(a: float | None, b: float | None) -> str:
    if a is None and b is None:
        return "-"
    if a == b:
        return f"{b:.3g} (same)"
    return f"{a if a is None else format(a, '.3g')} -> {b if b is None else format(b, '.3g')}"


def _fused(a: dict[str, int], b: dict[str, int], variant: str) -> str:
    if variant != "optimized":
        return "-"
    if a == b:
        return "same" if a else "-"
    return ", ".join(
        f"{op} {a.get(op, 0)} -> {b.get(op, 0)}" for op in sorted(set(a) | set(b)) if a.get(op) != b.get(op)
    )


def _latency(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{a:.3g} -> {b:.3g} ms ({(b - a) / a:+.0%})"
