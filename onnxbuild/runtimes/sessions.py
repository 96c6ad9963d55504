"""The ONNX Runtime session options every step that runs an artifact shares (validate,
generate, benchmark, ``onnxbuild run``): what is validated is what is timed.

Denormals are flushed (``session.set_denormal_as_zero``). ONNX Runtime's CPU attention
kernels produce denormal floats on every causal prefill whatever the data (the exp() of the
masked scores), and x86 cores compute on denormals through slow microcode: 12
GroupQueryAttention nodes at 128 tokens took 8.7 ms, 5.6 with the flush (uniform random
inputs; MultiHeadAttention 7.8 -> 5.1), GPT-2 int8's whole prefill 31 -> 28 ms (Intel Xeon
with AMX, onnxruntime 1.31, 2 threads). A value below 1.2e-38 becomes 0: no tolerance
validation applies can see it. PyTorch measured no change from ``torch.set_flush_denormal``
(bf16 54.4 vs 53.5 ms, fp32 129 vs 132); its baseline rows run with it all the same, so both
sides of a ratio run alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Union

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime
    from numpy.typing import NDArray


@dataclass(frozen=True)
class Kept:
    """A past that a stateful session already holds: what ``Session.kept()`` hands a decode
    loop in place of the presents, valid as that session's next past only: ``owner`` is the
    session's ``id``, ``generation`` counts every change of its variables (a call, a past
    written in, a reset), ``batch`` the rows the cache holds."""

    owner: int
    generation: int
    batch: int


Feed = Union["NDArray[np.generic]", Kept]
"""A session input: an array, or (a stateful OpenVINO session's past) a marker for the cache it holds."""

SESSION_CONFIG: dict[str, str] = {"session.set_denormal_as_zero": "1"}
"""Session config entries set on every session that runs an artifact, on every CPU."""
U8S8_EXACT = {"session.x64quantprecision": "1"}
"""Set too where :func:`u8s8_saturates`: ONNX Runtime then multiplies int8 weights as uint8
(u8u8), exactly, where its u8s8 kernels would saturate (onnxbuild/quant/u8s8.py). On a VNNI
CPU it would change no number and halve int8 speed (GPT-2 int8 prefill at 128 tokens: 60 ms
without, 122-133 with, AMD EPYC Zen 4), so it is set only where it is needed."""


def u8s8_saturates() -> bool:
    """Whether ONNX Runtime's u8s8 int8 kernels add products in 16 bits with saturation here:
    an x86 CPU without VNNI (AVX2, AVX-512 without VNNI). Read from cpuid through numpy, which
    an emulated CPU (QEMU's EPYC-Milan) answers as the real one would; AVX-VNNI and AMX, which
    numpy does not list, from /proc/cpuinfo."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    import importlib

    try:
        cpu: dict[str, bool] = importlib.import_module("numpy._core._multiarray_umath").__cpu_features__
    except (ImportError, AttributeError):  # numpy < 2: read /proc/cpuinfo alone
        cpu = {}
    if cpu.get("AVX512VNNI"):
        return False
    from onnxbuild.environment import cpu_info

    flags = set(cpu_info()[1].split())
    if not cpu:
        return not flags & {"avx512_vnni", "avx_vnni", "amx_int8"}
    return not flags & {"avx_vnni", "amx_int8"}


def config() -> dict[str, str]:
    """Every session config entry set here: SESSION_CONFIG, and U8S8_EXACT where u8s8 saturates.
    benchmark.json lists them."""
    return {**SESSION_CONFIG, **(U8S8_EXACT if u8s8_saturates() else {})}


def options(threads: int = 0) -> onnxruntime.SessionOptions:
    """``onnxruntime.SessionOptions`` with :func:`config`, warnings off and ``threads``
    intra-op threads (0: ONNX Runtime's default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    for key, value in config().items():
        so.add_session_config_entry(key, value)
    return so


class TensorInfo(Protocol):
    """An input or output as a session lists it (``onnxruntime.NodeArg``,
    ``openvino_target.Port``): its name, its shape (ints and dimension names) and its type
    (``tensor(float)``)."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> Sequence[int | str | None]: ...

    @property
    def type(self) -> str: ...


class Session(Protocol):
    """What validate, generate, benchmark and ``onnxbuild run`` ask of a session: ONNX Runtime's
    ``InferenceSession`` has it, and so does ``openvino_target.Session`` (OpenVINO's CPU plugin
    answering as ONNX Runtime does), so one code path checks, times and decodes both.
    onnxruntime-web runs in Node.js, a file at a time (``onnxbuild.web.run``), not behind this."""

    def get_inputs(self) -> Sequence[TensorInfo]: ...

    def get_outputs(self) -> Sequence[TensorInfo]: ...

    def run(self, output_names: list[str] | None, input_feed: Mapping[str, Feed], /) -> list[NDArray[np.generic]]: ...
