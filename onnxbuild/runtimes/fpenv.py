"""The calling thread's denormal flags, kept apart between engines.

ONNX Runtime (``session.set_denormal_as_zero``, set on every session onnxbuild opens) and
PyTorch (``torch.set_flush_denormal``) set the x86 MXCSR's flush-to-zero (FTZ) and
denormals-are-zero (DAZ) bits on the thread that creates or runs them, and leave them set.
OpenVINO's CPU plugin (2026.4) computes integer shape tensors in some of its AVX2 JIT kernels
as float bit patterns: a small integer such as 8 is a denormal float, DAZ reads it as 0, and
a GPT-2 export then fails with "[CPU] Broadcast node ... Value -1 not in range" on any CPU
without AVX-512 (reproduced here under ``ONEDNN_MAX_CPU_ISA=AVX2``, tests/test_fpenv.py).
So every OpenVINO call onnxbuild makes runs inside :func:`clean`: the flags are cleared
for the call and the thread's own are put back after it, so neither engine sees the other's.

glibc's ``fegetenv``/``fesetenv`` save and restore the whole SSE control word, MXCSR
included, through ctypes: no compiled helper. Elsewhere (another libc, another
architecture) :func:`clean` does nothing and :func:`flags` says so with ``None``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import struct
from collections.abc import Iterator
from contextlib import contextmanager

FTZ = 0x8000
"""MXCSR bit 15: results below the normal range are written as zero."""
DAZ = 0x0040
"""MXCSR bit 6: denormal inputs are read as zero."""
_MXCSR_AT = 28  # glibc's x86_64 fenv_t: the x87 environment (28 bytes), then __mxcsr
_ENV_BYTES = 64  # fenv_t is 32 bytes on x86_64; room to spare


@functools.cache
def _libm() -> ctypes.CDLL | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.fegetenv, lib.fesetenv  # noqa: B018 - both or neither
    except (OSError, AttributeError):
        return None
    return lib


def _get(lib: ctypes.CDLL) -> ctypes.Array[ctypes.c_char]:
    env = ctypes.create_string_buffer(_ENV_BYTES)
    if lib.fegetenv(env) != 0:
        raise OSError("fegetenv failed")
    return env


def flags() -> int | None:
    """The calling thread's FTZ and DAZ bits (``FTZ | DAZ`` when both are set, 0 when neither),
    or None where they cannot be read (not x86_64 with glibc)."""
    lib = _libm()
    if lib is None:
        return None
    mxcsr: int = struct.unpack_from("<I", _get(lib).raw, _MXCSR_AT)[0]
    return mxcsr & (FTZ | DAZ)


@contextmanager
def clean() -> Iterator[None]:
    """Run the block with FTZ and DAZ cleared on this thread, then restore the thread's whole
    floating-point environment as it was (whatever the block set, OpenVINO included)."""
    lib = _libm()
    if lib is None:
        yield
        return
    saved = _get(lib)
    mxcsr: int = struct.unpack_from("<I", saved.raw, _MXCSR_AT)[0]
    cleared = ctypes.create_string_buffer(saved.raw, _ENV_BYTES)
    struct.pack_into("<I", cleared, _MXCSR_AT, mxcsr & ~(FTZ | DAZ))
    lib.fesetenv(cleared)
    try:
        yield
    finally:
        lib.fesetenv(saved)
