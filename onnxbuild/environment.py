"""Package versions and platform facts, read from metadata (never by importing the package)."""

from __future__ import annotations

import json
import os
import platform
import sys
from functools import cache
from pathlib import Path
from typing import Any

# Some packages ship under more than one distribution name; the first installed wins.
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
}

REPORTED = ("onnx", "onnxruntime", "onnxscript", "torch", "transformers", "numpy")


_memo: dict[str, str] = {}
_memo_file: Path | None = None


def use_memo(path: Path) -> None:
    """Remember versions in ``path`` between runs, keyed by the mtimes of sys.path folders.

    Installing, removing or upgrading a distribution adds or removes a ``*.dist-info``
    entry and so changes its folder's mtime; while no mtime changed, the versions
    cannot have either, and importlib.metadata (25 ms here) is never imported.
    """
    global _memo_file
    _memo_file = path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("signature") == _signature():
            _memo.update(data["versions"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass


def save_memo() -> None:
    if _memo_file is None or not _computed:
        return
    try:
        from onnxbuild._util import atomic_write_text, canonical_json

        atomic_write_text(_memo_file, canonical_json({"signature": _signature(), "versions": {**_memo, **_computed}}))
    except OSError:
        pass


_computed: dict[str, str] = {}


def _signature() -> list[Any]:
    sig: list[Any] = []
    for entry in sys.path:
        try:
            sig.append([entry, os.stat(entry or ".").st_mtime_ns])
        except OSError:
            sig.append([entry, None])
    return sig


def package_version(name: str) -> str:
    """Installed version of ``name``, or ``"not installed"``."""
    if name in _memo:
        return _memo[name]
    if name not in _computed:
        _computed[name] = _lookup(name)
    return _computed[name]


@cache
def _lookup(name: str) -> str:
    from importlib import metadata

    for dist in _DISTRIBUTIONS.get(name, (name,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def versions(names: tuple[str, ...] = REPORTED) -> dict[str, str]:
    from onnxbuild._version import __version__

    out = {name: package_version(name) for name in names}
    out["onnxbuild"] = __version__
    out["python"] = platform.python_version()
    return out


def cpu_info() -> tuple[str, str]:
    """(CPU model name, feature flags) from /proc/cpuinfo, or what ``platform`` knows elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine(), ""

    def field(*names: str) -> str:
        return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(names)), "")

    return field("model name") or platform.processor() or platform.machine(), field("flags", "Features")


def platform_info() -> dict[str, str]:
    return {"system": platform.system(), "machine": platform.machine(), "python_implementation": sys.implementation.name}
