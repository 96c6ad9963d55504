"""Package versions and platform facts, read from metadata (never by importing the package)."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

# Some packages ship under more than one distribution name; the first installed wins.
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
}

REPORTED = ("onnx", "onnxruntime", "onnxscript", "torch", "transformers", "numpy")


class Versions:
    """Package versions for cache keys, remembered in a file between runs (the cache's
    ``state/versions.json``), keyed by the mtimes of the sys.path folders.

    Installing, removing or upgrading a distribution adds, removes or renames a
    ``*.dist-info`` entry (see :func:`_signature`); while none changed, the versions cannot
    have either, and importlib.metadata (25-40 ms here) is never imported. The
    cache that persists the file owns the object: no module-level state.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._memo: dict[str, str] | None = None
        self._computed: dict[str, str] = {}

    def _load(self) -> dict[str, str]:
        if self._memo is None:
            self._memo = {}
            if self.path is not None:
                try:
                    data = json.loads(self.path.read_text(encoding="utf-8"))
                    if data.get("signature") == _signature() and isinstance(data.get("versions"), dict):
                        self._memo = {str(k): str(v) for k, v in data["versions"].items()}
                except (OSError, ValueError, TypeError, AttributeError):
                    pass
        return self._memo

    def get(self, name: str) -> str:
        """Installed version of ``name``, or ``"not installed"``."""
        memo = self._load()
        if name in memo:
            return memo[name]
        if name not in self._computed:
            self._computed[name] = _lookup(name)
        return self._computed[name]

    def save(self) -> None:
        """Write what this run had to look up (nothing when the file already knew it all)."""
        if self.path is None or not self._computed:
            return
        try:
            from onnxbuild._util import atomic_write_text, canonical_json

            versions: dict[str, str] = {**self._load(), **self._computed}
            atomic_write_text(self.path, canonical_json({"signature": _signature(), "versions": versions}))
        except OSError:
            pass


def _signature() -> list[list[object]]:
    """What importlib.metadata would read: the distributions on sys.path, by folder name.

    A ``*.dist-info`` name carries its version, so an install, removal or upgrade changes a
    name; an ``*.egg-info`` name does not, so its mtime stands in. Folders that hold no
    distributions (the script's folder, the working folder, a test runner's additions)
    are left out, so ``onnxbuild``, ``python -m onnxbuild`` and a test's ``python -c`` all
    find what the last one saved (the sys.path folders' mtimes, keyed before, did not:
    each way of starting threw the others' memo away). About 1 ms for 200 distributions."""
    sig: list[list[object]] = []
    for entry in sys.path:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
        if names:
            eggs = [[n, os.stat(os.path.join(entry or ".", n)).st_mtime_ns] for n in names if n.endswith(".egg-info")]
            sig.append([os.path.abspath(entry or "."), names, eggs])
    return sig


def package_version(name: str) -> str:
    """Installed version of ``name``, or ``"not installed"`` (read from metadata each process)."""
    return _lookup(name)


@cache
def _lookup(name: str) -> str:
    from importlib import metadata

    for dist in _DISTRIBUTIONS.get(name, (name,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def versions(names: tuple[str, ...] = REPORTED, lookup: Callable[[str], str] = package_version) -> dict[str, str]:
    """The reported versions; ``lookup`` is a cache's :class:`Versions` where one is open, so a
    no-op build never imports importlib.metadata (40 ms of a 0.1 s no-op, measured)."""
    from onnxbuild._version import __version__

    out = {name: lookup(name) for name in names}
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


BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""/proc/cpuinfo flags of native bf16 arithmetic: x86 AVX512-BF16 or AMX, Arm's BF16 extension."""
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")
"""Flags of int8 dot-product instructions: x86 VNNI or AMX, Arm's dot product or int8 matmul."""


def missing_feature(flags: tuple[str, ...], what: str) -> str | None:
    """Why the CPU lacks ``what`` (none of ``flags`` in its feature list), or None when it has it."""
    have = set(cpu_info()[1].split())
    if have & set(flags):
        return None
    return f"this CPU has no native {what} (none of {', '.join(flags)} among its flags)"


def cpu_fingerprint() -> str:
    """A short digest of the CPU's model and feature flags, read without heavy imports."""
    from onnxbuild._util import sha256_text

    model, flags = cpu_info()
    return sha256_text(f"{model}\n{' '.join(sorted(flags.split()))}")[:16]


def platform_info() -> dict[str, str]:
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "python_implementation": sys.implementation.name,
    }
