"""Which ONNX Runtime execution providers work here, tested rather than taken from the list.

``get_available_providers()`` lists what the build was compiled with: onnxruntime-gpu
lists CUDA and TensorRT on machines without a GPU and then silently runs on CPU. So
each provider is tried on a one-node model and judged by the session's actual providers.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxbuild._util import brief


@dataclass(frozen=True)
class ProviderStatus:
    """An execution provider as tried here: listed, usable, and why not."""

    name: str
    listed: bool
    works: bool
    reason: str


def probe(names: list[str] | None = None) -> list[ProviderStatus]:
    import contextlib
    import io
    import logging

    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    listed = ort.get_available_providers()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y]),
        ir_version=10,
        opset_imports=[helper.make_opsetid("", 18)],
    )
    data = model.SerializeToString()
    ort.set_default_logger_severity(4)
    logging.getLogger("onnxruntime").setLevel(logging.CRITICAL)
    out: list[ProviderStatus] = []
    for name in names or listed:
        if name not in listed:
            out.append(ProviderStatus(name, False, False, "not in this onnxruntime build"))
            continue
        printed = io.StringIO()  # ORT prints its fallback banner to stdout; keep it out of --json
        try:
            with contextlib.redirect_stdout(printed):
                session = ort.InferenceSession(
                    data, providers=[name] if name == "CPUExecutionProvider" else [name, "CPUExecutionProvider"]
                )
                actual = session.get_providers()[0]
                session.run(None, {"x": np.ones((1, 4), np.float32)})
        except Exception as exc:
            out.append(ProviderStatus(name, True, False, f"session failed: {brief(exc, limit=200)}"))
            continue
        if actual != name:
            detail = next(
                (
                    line.split("EP Error", 1)[1].strip()
                    for line in printed.getvalue().splitlines()
                    if "EP Error" in line and len(line) > 40
                ),
                "",
            )
            detail = detail.split(" void ", 1)[-1][:200] if detail else "missing driver, CUDA/cuDNN libraries or device"
            out.append(ProviderStatus(name, True, False, f"listed, but sessions fall back to {actual} ({detail})"))
        else:
            out.append(ProviderStatus(name, True, True, "ok"))
    return out
