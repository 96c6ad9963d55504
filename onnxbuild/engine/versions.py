"""Package versions and platform facts, read from metadata (never by importing the package)."""

from __future__ import annotations

import platform
import sys
from functools import cache
from importlib import metadata

# Some packages ship under more than one distribution name; the first installed wins.
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
}

REPORTED = ("onnx", "onnxruntime", "onnxscript", "torch", "transformers", "numpy")


@cache
def package_version(name: str) -> str:
    """Installed version of ``name``, or ``"not installed"``."""
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


def platform_info() -> dict[str, str]:
    return {"system": platform.system(), "machine": platform.machine(), "python_implementation": sys.implementation.name}
