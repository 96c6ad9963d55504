"""Where the time goes: ONNX Runtime's profiler and OpenVINO's per-node counters, the top
kernels per variant and shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from onnxbuild.runtimes import sessions
from onnxbuild.steps.base import StepContext
from onnxbuild.steps.benchmarking.decode import decode_step

if TYPE_CHECKING:
    from onnxbuild.report.benchmark import Kernels
    from onnxbuild.runtimes.openvino_target import Precision
    from onnxbuild.runtimes.openvino_target import Session as OpenVinoSession
    from onnxbuild.sources.decoder import PastLayout
    from onnxbuild.steps.benchmarking.timing import Feeds

KERNELS_SHOWN = 6


def ort_kernels(ctx: StepContext, path: Path, sizes: dict[str, int], feeds: Feeds, threads: int) -> Kernels:
    """Where one call's time goes, as ONNX Runtime's profiler tells it: the CPU provider's time
    per op type (kernel) at the largest shape, from a separately profiled session (the timed
    rows run unprofiled). ORT names the op type and the provider that ran each node, not the
    MLAS routine inside it."""
    import onnxruntime as ort

    so = sessions.options(threads)
    so.enable_profiling = True
    so.profile_file_prefix = str(ctx.output_dir / ".profile" / "ort")
    (ctx.output_dir / ".profile").mkdir(exist_ok=True)
    try:
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        usable = {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
        for _ in range(2):  # the second call is the one read: the first pays for allocations
            session.run(None, usable)
        events = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
    except Exception as exc:  # profiling is an explanation, never a failure of the benchmark
        return {"shape": dict(sizes), "error": str(exc)[:300], "ops": []}
    finally:
        import shutil

        shutil.rmtree(ctx.output_dir / ".profile", ignore_errors=True)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    last = runs[-1]
    start, end = last["ts"], last["ts"] + last["dur"]
    per_op: dict[str, float] = {}
    providers: set[str] = set()
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time") and start <= e["ts"] <= end:
            op = e.get("args", {}).get("op_name", "?")
            per_op[op] = per_op.get(op, 0.0) + e["dur"] / 1000.0
            providers.add(e.get("args", {}).get("provider", "?"))
    total = sum(per_op.values()) or 1.0
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:KERNELS_SHOWN]
    return {
        "shape": dict(sizes),
        "run_ms": round(last["dur"] / 1000.0, 3),
        "providers": sorted(providers),
        "ops": [{"op": op, "ms": round(ms, 3), "share": round(ms / total, 3)} for op, ms in top],
    }


def openvino_kernels(
    path: Path, precision: Precision, threads: int, sizes: dict[str, int], feeds: Feeds, layout: PastLayout | None
) -> list[Kernels]:
    """Where one call's time goes in OpenVINO's CPU plugin, from its own per-node counters in a
    separately compiled, profiled model (the timed rows run without them): per node type and
    the implementation it picked (``brgemm_avx512_amx_i8``, ``ref_f32``: OpenVINO names the
    kernel, where ONNX Runtime names only the op), ms per call over 10 calls after 3 of warm-up
    (``Session.kernels``), at the largest shape, and for a decoder at one decode step after a
    past as long as that prompt too (a stateful model's: successive tokens after it). The node
    times add up to less than the call: the rest is spent outside OpenVINO's nodes (about 1 ms
    of GPT-2's 7 ms decode step)."""
    from onnxbuild.runtimes import openvino_target

    out: list[Kernels] = []
    call = "prefill" if layout is not None else "call"
    try:
        session = openvino_target.load(path, precision=precision, threads=threads, profile=True)
        out.append(_openvino_profile(session, call, feeds, sizes))
        if layout is not None:
            call = "decode"
            out.append(_openvino_profile(session, call, decode_step(session, sizes)[1], sizes))
    except Exception as exc:  # profiling is an explanation, never a failure of the benchmark
        out.append({"call": call, "shape": dict(sizes), "error": str(exc)[:300], "ops": []})
    return out


def _openvino_profile(session: OpenVinoSession, call: str, feeds: Feeds, sizes: dict[str, int]) -> Kernels:
    """One entry of ``openvino_kernels``: the call's wall time and its top node types."""
    wall, per = session.kernels(feeds)
    total = sum(per.values()) or 1.0
    top = sorted(per.items(), key=lambda kv: -kv[1])[:KERNELS_SHOWN]
    return {
        "call": call,
        "shape": dict(sizes),
        "run_ms": round(wall, 3),
        "ops": [{"op": op, "ms": round(ms, 3), "share": round(ms / total, 3)} for op, ms in top],
    }
