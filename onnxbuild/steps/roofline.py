"""Work per call and the machine's limits: a roofline for the benchmark's timed rows.

A timed row says how long one call took; this module says how long it could have taken.
``graph_work`` (steps/graphwork.py) counts the work of one call from the graph and the
concrete input shapes, ``measure_peaks`` (steps/peaks.py) measures what this CPU reaches at
its best (GEMM throughput per precision, memory read bandwidth) and ``roofline`` here puts
the two beside the measured time:
the least time is ``max(flops / compute peak, weight bytes / memory bandwidth)``, and the
row achieved that fraction of it.

What is counted, and why it is enough:

- FLOPs are matrix products only (MatMul and its quantized and fused forms, Gemm,
  MatMulNBits, Conv, attention's QK^T and softmax*V, two-operand Einsum), with a
  multiply-add as 2 FLOPs. They dominate transformer and convolution work; elementwise
  ops, norms and softmax are left out.
- Bytes are the initializers as stored (4-bit weights packed, their scales and zero points
  included), read once per call; a table only Gathers read (an embedding) counts the rows
  its indices pick. That is the traffic that bounds a decode step; activations
  and the KV cache are left out, so a long-context decode reads more than this.
- An op that does heavy math but whose shapes stay unknown (or that is not modelled, such
  as QAttention or an Einsum of three operands) is named in ``Work.uncounted``: the FLOPs
  are then a lower bound.

Peaks are CPU figures: a row on another execution provider gets no roofline from them.
A row's products are all held to its precision's peak, including those it keeps in float
(an int8 model's attention): its least time then comes out a little short.

Example (all-MiniLM-L6-v2's int8 file, 128 tokens, on a 2-core AVX-512 VNNI machine):
    >>> work = graph_work("int8/model.onnx", {"input_ids": (1, 128), "attention_mask": (1, 128), "token_type_ids": (1, 128)})
    >>> work.flops, work.weight_bytes
    (2868903936, 22765468)
    >>> peaks = measure_peaks(threads=2)
    >>> roofline(work, time_ms=8.62, precision="int8", peaks=peaks, phase="prefill").describe()
    'int8 prefill: 40% of int8 GEMM'
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypedDict

if TYPE_CHECKING:
    pass


Phase = Literal["prefill", "decode", ""]


Bound = Literal["compute", "memory"]


LOADED_BELOW = 0.8
"""A measurement got less than this share of its threads' CPU time (process CPU time over
wall time x threads): something else ran on the cores, so its figures are low."""


INT8_PRECISIONS = frozenset({"int8", "uint8", "int4", "uint4"})
"""Row precisions whose products run in int8: int4 means MatMulNBits, which multiplies in
int8 at accuracy_level 4 (the quantize step's default)."""


class WorkDict(TypedDict):
    flops: int
    weight_bytes: int
    by_op: dict[str, int]
    uncounted: list[str]


class PeaksDict(TypedDict):
    fp32_gflops: float
    bf16_gflops: float | None
    int8_gops: float | None
    memory_gbps: float
    threads: int
    how: dict[str, str]
    cpu_share: float | None


class RooflineDict(TypedDict):
    gflops: float
    gbps: float
    bound: Bound
    limit: str
    fraction: float
    min_ms: float


@dataclass(frozen=True)
class Work:
    """What one call of a graph does: its matrix-product FLOPs and the weight bytes it reads."""

    flops: int
    weight_bytes: int
    by_op: dict[str, int] = field(default_factory=dict, hash=False)
    """FLOPs per op type (only op types that did some)."""
    uncounted: tuple[str, ...] = ()
    """Op types with heavy math left out (shapes unknown or not modelled): ``flops`` is then a lower bound."""

    def as_dict(self) -> WorkDict:
        return {
            "flops": self.flops,
            "weight_bytes": self.weight_bytes,
            "by_op": dict(self.by_op),
            "uncounted": list(self.uncounted),
        }


@dataclass(frozen=True)
class Peaks:
    """The best this CPU reached with ``threads`` threads; None where it has no native support."""

    fp32_gflops: float
    bf16_gflops: float | None
    int8_gops: float | None
    memory_gbps: float
    threads: int
    how: dict[str, str] = field(default_factory=dict, hash=False)
    """One line per figure on how it was measured (or why it was not)."""
    cpu_share: float | None = None
    """The share of its threads' CPU time the timed calls got (None: not known); below
    :data:`LOADED_BELOW` the machine was loaded and the figures are low."""

    @property
    def loaded(self) -> bool:
        return self.cpu_share is not None and self.cpu_share < LOADED_BELOW

    def as_dict(self) -> PeaksDict:
        return {
            "fp32_gflops": self.fp32_gflops,
            "bf16_gflops": self.bf16_gflops,
            "int8_gops": self.int8_gops,
            "memory_gbps": self.memory_gbps,
            "threads": self.threads,
            "how": dict(self.how),
            "cpu_share": self.cpu_share,
        }

    def at_least(self, other: Peaks) -> Peaks:
        """Each figure the higher of the two (a peak is a best case), with the lines saying how."""

        def best(key: str, a: float | None, b: float | None) -> float | None:
            if a is None or (b is not None and b > a):
                how[key] = other.how.get(key, how.get(key, ""))
                return b
            return a

        how = dict(self.how)
        fp32 = best("fp32_gflops", self.fp32_gflops, other.fp32_gflops)
        memory = best("memory_gbps", self.memory_gbps, other.memory_gbps)
        assert fp32 is not None and memory is not None
        bf16 = best("bf16_gflops", self.bf16_gflops, other.bf16_gflops)
        int8 = best("int8_gops", self.int8_gops, other.int8_gops)
        shares = [s for s in (self.cpu_share, other.cpu_share) if s is not None]
        return Peaks(fp32, bf16, int8, memory, self.threads, how, min(shares) if shares else None)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Peaks:
        """The inverse of ``as_dict``; raises ValueError naming the first bad key."""

        def number(key: str, optional: bool = False) -> float | None:
            value = data.get(key)
            if value is None and optional:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(
                    f"peaks.{key}: must be a positive number{' or null' if optional else ''} (got {value!r})"
                )
            return float(value)

        threads = data.get("threads")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"peaks.threads: must be a positive integer (got {threads!r})")
        how = data.get("how", {})
        if not isinstance(how, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in how.items()):
            raise ValueError(f"peaks.how: must map figure names to strings (got {how!r})")
        fp32, memory = number("fp32_gflops"), number("memory_gbps")
        assert fp32 is not None and memory is not None
        return cls(
            fp32,
            number("bf16_gflops", True),
            number("int8_gops", True),
            memory,
            threads,
            dict(how),
            number("cpu_share", True),
        )


@dataclass(frozen=True)
class Roofline:
    """One timed row against the machine's limits."""

    gflops: float
    """Achieved matrix-product GFLOP/s (GOP/s for int8)."""
    gbps: float
    """Achieved weight read rate, GB/s."""
    bound: Bound
    """Which limit the row's least time comes from."""
    limit: str
    """The peak that bounds it: "fp32 GEMM", "bf16 GEMM", "int8 GEMM" or "memory bandwidth"."""
    fraction: float
    """Least time over measured time: 1.0 is at the limit (above 1 when peaks were measured low)."""
    min_ms: float
    """The least time one call could take at the peaks."""
    precision: str = ""
    phase: Phase = ""
    uncounted: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for a report, such as ``int4 decode: 31% of memory bandwidth``."""
        label = " ".join(p for p in (self.precision, self.phase) if p)
        text = f"{label + ': ' if label else ''}{self.fraction:.0%} of {self.limit}"
        return text + (f" (at least: {', '.join(self.uncounted)} not counted)" if self.uncounted else "")

    def as_dict(self) -> RooflineDict:
        return {
            "gflops": self.gflops,
            "gbps": self.gbps,
            "bound": self.bound,
            "limit": self.limit,
            "fraction": self.fraction,
            "min_ms": self.min_ms,
        }


def sig(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits: figures for a report, not for arithmetic."""
    return float(f"{value:.{digits}g}")


def roofline(work: Work, time_ms: float, precision: str, peaks: Peaks, phase: Phase = "") -> Roofline:
    """A timed row against the machine's limits.

    The compute peak follows the row's precision: bf16 uses the bf16 GEMM peak (fp32's where
    the CPU has none: it computes in fp32 there), int8, uint8 and int4 the int8 one, everything
    else fp32 (fp16 on the CPU computes in fp32). An int8 row never gets fp32's limit: with no
    int8 peak (peaks measured before it was measured everywhere) only memory is counted, and
    the row says so. The least time is
    ``max(flops / compute peak, weight_bytes / memory bandwidth)``; ``fraction`` is it over
    ``time_ms``, not clamped: above 1 means the peaks were measured low.

    Raises:
        ValueError: ``time_ms`` or a peak used is not positive.
    """
    if not time_ms > 0:
        raise ValueError(f"time_ms: must be positive (got {time_ms!r})")
    compute_name = "fp32 GEMM"
    compute_peak: float | None = peaks.fp32_gflops
    uncounted = work.uncounted
    if precision == "bf16" and peaks.bf16_gflops is not None:
        compute_name, compute_peak = "bf16 GEMM", peaks.bf16_gflops
    elif precision in INT8_PRECISIONS:
        compute_name, compute_peak = "int8 GEMM", peaks.int8_gops
        if compute_peak is None:
            uncounted = (*uncounted, "int8 compute (no int8 limit measured)")
    if (compute_peak is not None and not compute_peak > 0) or not peaks.memory_gbps > 0:
        raise ValueError(
            f"peaks: {compute_name} and memory bandwidth must be positive (got {compute_peak!r}, {peaks.memory_gbps!r})"
        )
    seconds = time_ms / 1e3
    compute_s = work.flops / (compute_peak * 1e9) if compute_peak is not None else 0.0
    memory_s = work.weight_bytes / (peaks.memory_gbps * 1e9)
    bound: Bound = "compute" if compute_s >= memory_s and compute_s > 0 else "memory"
    least = max(compute_s, memory_s)
    return Roofline(
        gflops=sig(work.flops / seconds / 1e9),
        gbps=sig(work.weight_bytes / seconds / 1e9),
        bound=bound,
        limit=compute_name if bound == "compute" else "memory bandwidth",
        fraction=round(least / seconds, 3),
        min_ms=sig(least * 1e3),
        precision=precision,
        phase=phase,
        uncounted=uncounted,
    )
