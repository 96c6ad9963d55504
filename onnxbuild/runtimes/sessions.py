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

from typing import Any

SESSION_CONFIG: dict[str, str] = {"session.set_denormal_as_zero": "1"}
"""Session config entries set on every session that runs an artifact; benchmark.json lists them."""


def options(threads: int = 0) -> Any:
    """``onnxruntime.SessionOptions`` with SESSION_CONFIG, warnings off and ``threads`` intra-op
    threads (0: ONNX Runtime's default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    for key, value in SESSION_CONFIG.items():
        so.add_session_config_entry(key, value)
    return so
