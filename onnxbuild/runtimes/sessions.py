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
"""Session config entries set on every session that runs an artifact; benchmark.json lists them."""


def options(threads: int = 0) -> onnxruntime.SessionOptions:
    """``onnxruntime.SessionOptions`` with SESSION_CONFIG, warnings off and ``threads`` intra-op
    threads (0: ONNX Runtime's default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    for key, value in SESSION_CONFIG.items():
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
