"""What this CPU reaches at its best, measured (``measure_peaks``): GEMM throughput per precision
at sizes that reach it (torch and ONNX Runtime, the better kept), int8 at several shapes, and
memory read bandwidth; and whether something else held the cores meanwhile (``cpu_share``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx
    import torch

    from onnxbuild.runtimes.sessions import Session
from onnxbuild.steps.roofline import Peaks, sig

GEMM_SIZES = (1024, 2048)
"""Square GEMM sizes of the compute peaks, the best one kept. One size understates them: on an
AMX core torch.mm bf16 gives 470 GFLOP/s at 1024 and 1,890 at 2048, and a benchmark row then
read "180% of bf16 GEMM"."""


INT8_SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048), (256, 2048, 2048))
"""(M, K, N) of the int8 peak: square ones and a prefill's (few rows, wide weights)."""


MEMORY_BYTES = 512 * 2**20
"""The read-bandwidth buffer: beyond all but the largest L3 caches, within the memory a build step may use."""


NO_DOT_PRODUCT = "no int8 dot-product instructions on this CPU"


def measure_peaks(threads: int, budget_s: float = 1.0) -> Peaks:
    """Measure this CPU's best GEMM throughput per precision and its memory read bandwidth.

    Each figure is the best over the sizes in :data:`GEMM_SIZES` (int8: :data:`INT8_SHAPES`)
    and, for fp32, over two libraries (torch's BLAS and onnxruntime's MLAS: on some CPUs one
    is twice the other), each the best of as many repeats as fit in ``budget_s`` (after a
    warm-up call): a peak is a best case. bf16 and int8 are measured only where the CPU has
    native instructions for them (``BF16_FLAGS``) and is None elsewhere: emulated, it would be
    no limit anyone reaches for. int8 is measured everywhere, as onnxruntime's kernel runs it
    with or without dot-product instructions (``INT8_FLAGS``; ``how`` says which). ``cpu_share`` says how much of its
    threads' CPU time the timed calls got: a loaded machine gives low figures
    (:attr:`Peaks.loaded`). About ``10 * budget_s`` seconds plus imports and the calls
    themselves, and a 512 MiB buffer.

    Args:
        threads: the threads each benchmark uses (set for torch, and as onnxruntime's
            intra-op threads), as the timed rows do.
        budget_s: the time spent repeating each figure at each size.
    """
    import torch

    from onnxbuild.environment import BF16_FLAGS, INT8_FLAGS, cpu_info

    flags = set(cpu_info()[1].split())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    how: dict[str, str] = {}
    clock = _Clock()
    try:
        fp32, how["fp32_gflops"] = max(
            [_torch_gemm(torch.float32, n, threads, budget_s, clock) for n in GEMM_SIZES]
            + [_ort_gemm(n, threads, budget_s, clock) for n in GEMM_SIZES]
        )
        bf16: float | None = None
        if flags & set(BF16_FLAGS):
            bf16, how["bf16_gflops"] = max(_torch_gemm(torch.bfloat16, n, threads, budget_s, clock) for n in GEMM_SIZES)
        else:
            how["bf16_gflops"] = f"not measured: no native bf16 on this CPU (flags {', '.join(sorted(BF16_FLAGS))})"
        # int8 is measured on every CPU: without dot-product instructions it is still the limit
        # an int8 row runs against (MLAS's u8s8 kernel), and often below fp32's (issue 52: an
        # int8 row against the fp32 limit read "174% of the measured fp32 GEMM limit")
        int8, how["int8_gops"] = max(_ort_int8_gemm(shape, threads, budget_s, clock) for shape in INT8_SHAPES)
        if not flags & set(INT8_FLAGS):
            how["int8_gops"] = f"{NO_DOT_PRODUCT} (flags {', '.join(sorted(INT8_FLAGS))}): {how['int8_gops']}"
        memory, how["memory_gbps"] = _read_bandwidth(threads, budget_s, clock)
    finally:
        torch.set_num_threads(before)
    share = clock.share(threads)
    return Peaks(
        sig(fp32),
        None if bf16 is None else sig(bf16),
        None if int8 is None else sig(int8),
        sig(memory),
        threads,
        how,
        round(share, 3),
    )


class _Clock:
    """Wall time and this process's CPU time (all its threads) over the timed calls."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def share(self, threads: int) -> float:
        return min(1.0, self.cpu / (self.wall * threads)) if self.wall > 0 else 1.0


def cpu_share(threads: int, seconds: float = 0.3) -> float:
    """The share of ``threads`` threads' CPU time a short onnxruntime GEMM loop (384^2, the
    peaks' fp32 kernel) gets now: about 1 on an idle machine, about 0.5 where another job keeps
    every core busy."""
    clock = _Clock()
    _ort_gemm(384, threads, seconds, clock)
    return round(clock.share(threads), 3)


def _best(
    call: Callable[[], object], budget_s: float, warmup: int = 1, clock: _Clock | None = None
) -> tuple[float, int]:
    """The shortest time of ``call`` (seconds) over at least 3 repeats and ``budget_s``, and the repeat count."""
    for _ in range(warmup):
        call()
    best, count = math.inf, 0
    end = time.perf_counter() + budget_s
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while count < 3 or time.perf_counter() < end:
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
        count += 1
    if clock is not None:
        clock.cpu += time.process_time() - cpu0
        clock.wall += time.perf_counter() - wall0
    return best, count


def _torch_gemm(
    dtype: torch.dtype, n: int, threads: int, budget_s: float, clock: _Clock | None = None
) -> tuple[float, str]:
    import torch

    a = torch.randn(n, n, generator=torch.Generator().manual_seed(0)).to(dtype)
    b = torch.randn(n, n, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    with torch.inference_mode():
        seconds, count = _best(lambda: torch.mm(a, b, out=out), budget_s, clock=clock)
    name = str(dtype).removeprefix("torch.")
    return (
        2 * n**3 / seconds / 1e9,
        f"torch.mm {n}x{n} {name}, {threads} thread(s), best of {count}: 2n^3 / time "
        f"(best of sizes {', '.join(map(str, GEMM_SIZES))})",
    )


def _session(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    weights: Sequence[onnx.TensorProto],
    threads: int,
) -> Session:
    import onnx
    import onnxruntime as ort

    graph = onnx.helper.make_graph(nodes, "peak", inputs, outputs, weights)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session: Session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session


def _ort_gemm(n: int, threads: int, budget_s: float, clock: _Clock | None = None) -> tuple[float, str]:
    """onnxruntime's fp32 MatMul (MLAS, as every fp32 ONNX row runs it)."""
    import numpy as np
    import onnx

    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((n, n), dtype=np.float32), "B")
    session = _session(
        [onnx.helper.make_node("MatMul", ["A", "B"], ["Y"])],
        [onnx.helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, [n, n])],
        [onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [n, n])], [weight], threads,
    )  # fmt: skip
    feeds = {"A": rng.standard_normal((n, n), dtype=np.float32)}
    seconds, count = _best(lambda: session.run(None, feeds), budget_s, clock=clock)
    return (
        2 * n**3 / seconds / 1e9,
        f"onnxruntime MatMul float32 {n}x{n}, {threads} intra-op thread(s), best of {count}: 2n^3 / time "
        f"(best of torch and onnxruntime at sizes {', '.join(map(str, GEMM_SIZES))})",
    )


def _ort_int8_gemm(
    shape: tuple[int, int, int], threads: int, budget_s: float, clock: _Clock | None = None
) -> tuple[float, str]:
    """onnxruntime's int8 GEMM (MLAS, as dynamic quantization's MatMulInteger runs it): u8 x s8."""
    import numpy as np
    import onnx

    m, k, n = shape
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.integers(-128, 128, (k, n), dtype=np.int8), "B")
    session = _session(
        [onnx.helper.make_node("MatMulInteger", ["A", "B"], ["Y"])],
        [onnx.helper.make_tensor_value_info("A", onnx.TensorProto.UINT8, [m, k])],
        [onnx.helper.make_tensor_value_info("Y", onnx.TensorProto.INT32, [m, n])], [weight], threads,
    )  # fmt: skip
    feeds = {"A": rng.integers(0, 256, (m, k), dtype=np.uint8)}
    seconds, count = _best(lambda: session.run(None, feeds), budget_s, clock=clock)
    return (
        2 * m * k * n / seconds / 1e9,
        f"onnxruntime MatMulInteger uint8 {m}x{k} x int8 {k}x{n}, {threads} intra-op thread(s), best of {count}: "
        f"2mkn / time (best of {', '.join(f'{a}x{b}x{c}' for a, b, c in INT8_SHAPES)})",
    )


def _read_bandwidth(threads: int, budget_s: float, clock: _Clock | None = None) -> tuple[float, str]:
    import torch

    buffer = torch.ones(MEMORY_BYTES // 4, dtype=torch.float32)
    with torch.inference_mode():
        seconds, count = _best(buffer.sum, budget_s, clock=clock)
    return (
        MEMORY_BYTES / seconds / 1e9,
        f"torch sum of a {MEMORY_BYTES // 2**20} MiB float32 tensor, {threads} thread(s), best of {count}: "
        "bytes / time",
    )
