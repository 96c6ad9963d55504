"""The ``openvino`` target: run an ONNX file in OpenVINO's CPU plugin, as ONNX Runtime would.

OpenVINO reads ONNX directly (its own runtime, not ONNX Runtime's OpenVINO execution
provider: that ships as a separate ``onnxruntime-openvino`` distribution which replaces the
``onnxruntime`` package itself, so it cannot share an environment with our onnxruntime).
``Session`` wraps a compiled model in the part of ``onnxruntime.InferenceSession``'s
interface the validate and benchmark steps and the decoder loop use (``get_inputs``,
``get_outputs``, ``run``), so one code path times and checks both runtimes.

Two things OpenVINO does differently, found by trying it:

* A compiled model's port can carry several names, and ``get_any_name()`` may return an
  internal one such as ``/Concat_output_0``: ports are matched by every name they carry,
  and named by the one the ONNX graph gives.
* Some OpenVINO versions reject a past of length 0 (an empty tensor read as batch 0). A
  decoder's prefill that OpenVINO refuses is rerun with a past of one zero slot that the
  attention mask hides (position ids are explicit, so no position moves); the slot is cut
  from the presents again. On ONNX Runtime both calls agree to 2e-6 on GPT-2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from onnxbuild._util import brief
from onnxbuild.sources.decoder import PAST_PREFIX as PAST
from onnxbuild.sources.decoder import PRESENT_PREFIX as PRESENT

NAME = "openvino"
Precision = Literal["auto", "f32", "bf16", "f16"]


def unavailable() -> str | None:
    """Why OpenVINO cannot run here, or None when it can."""
    try:
        import openvino as ov
    except ImportError:
        return "the openvino package is not installed (pip install openvino)"
    except Exception as exc:  # a broken install (missing shared libraries) is a reason, not a crash
        return f"the openvino package does not import: {brief(exc)}"
    try:
        devices = ov.Core().available_devices
    except Exception as exc:
        return f"OpenVINO cannot list its devices: {brief(exc)}"
    if "CPU" not in devices:
        return f"OpenVINO has no CPU device here (it has: {', '.join(devices) or 'none'})"
    return None


def version() -> str:
    from onnxbuild.environment import package_version

    return package_version("openvino")


@dataclass(frozen=True)
class Port:
    """One input or output as ``onnxruntime.NodeArg`` describes it."""

    name: str
    shape: list[Any]
    type: str


@dataclass
class Session:
    """A model compiled by OpenVINO's CPU plugin, called like an ONNX Runtime session.

    ``precision`` is the inference precision OpenVINO chose (read back from the compiled
    model: ``auto`` is bf16 on CPUs with native bf16, f32 elsewhere). ``masked_prefill``
    turns true once a prefill had to go through the one-slot masked past.
    """

    compiled: Any
    request: Any
    precision: str
    inputs: list[tuple[Any, Port]]
    outputs: list[tuple[Any, Port]]
    masked_prefill: bool = field(default=False)
    calls: int = field(default=0)  # completed inference requests, for ``kernels``

    def get_inputs(self) -> list[Port]:
        return [p for _, p in self.inputs]

    def get_outputs(self) -> list[Port]:
        return [p for _, p in self.outputs]

    def run(self, names: list[str] | None, feeds: dict[str, Any]) -> list[Any]:
        got = self._call(feeds, copy=True)
        return [got[n] for n in (names or [p.name for _, p in self.outputs])]

    def infer(self, feeds: dict[str, Any]) -> None:
        """One call whose outputs stay in the request's buffers (the next call reuses them): what
        the benchmark times. ONNX Runtime's ``run()`` hands over its own output buffers without
        a copy; ``run()`` here copies every output out, which for GPT-2's 128-token prefill (35 MB
        of logits and presents) was 5.5 ms of 31."""
        self._call(feeds, copy=False)

    def kernels(self, feeds: dict[str, Any], *, warmup: int = 3, repeat: int = 10) -> tuple[float, dict[str, float]]:
        """Where one call's time goes: the mean wall time in ms of ``repeat`` calls after
        ``warmup``, and the ms per call per (node type, implementation) from OpenVINO's own
        counters, e.g. ``FullyConnectedQuantizedLegacy (brgemm_avx512_amx_i8)``. Needs a session
        loaded with ``profile=True``.

        The CPU plugin reports each node's *mean* over every call since compilation (its
        ``PerfCount::avg``), first calls and other shapes included: read as they are, a decode
        step profiled after two prefills showed 22 ms of FullyConnected in a 14 ms call. So the
        totals (mean x calls) are read before and after the profiled calls and differenced."""
        import time

        for _ in range(warmup):
            self.infer(feeds)
        before, n_before = self._node_totals(), self.calls
        t0 = time.perf_counter()
        for _ in range(repeat):
            self.infer(feeds)
        wall = (time.perf_counter() - t0) * 1000.0 / repeat
        after, n_after = self._node_totals(), self.calls
        per: dict[str, float] = {}
        for name, (key, mean) in after.items():
            ms = (mean * n_after - before.get(name, (key, 0.0))[1] * n_before) / (n_after - n_before)
            if ms > 0:
                per[key] = per.get(key, 0.0) + ms
        return wall, per

    def _node_totals(self) -> dict[str, tuple[str, float]]:
        """node name -> ("NodeType (implementation)", its mean ms per call so far)."""
        return {n.node_name: (f"{n.node_type} ({n.exec_type})", n.real_time.total_seconds() * 1000.0) for n in self.request.profiling_info}

    def _call(self, feeds: dict[str, Any], *, copy: bool) -> dict[str, Any]:
        if self.masked_prefill and _empty_past(feeds):
            # refused once, refused always: asking first again would cost a failed call each time
            return self._masked_prefill(feeds, copy=copy)
        try:
            return self._infer(feeds, copy=copy)
        except Exception:
            if not _empty_past(feeds):
                raise
            got = self._masked_prefill(feeds, copy=copy)
            self.masked_prefill = True
            return got

    def _infer(self, feeds: dict[str, Any], *, copy: bool) -> dict[str, Any]:
        import numpy as np

        missing = [p.name for _, p in self.inputs if p.name not in feeds]
        if missing:
            raise ValueError(f"missing inputs: {', '.join(missing)}")
        # share_outputs: the request's own buffers, copied at most once here. infer()'s default
        # copies into fresh arrays first; with a second copy on top GPT-2's 128-token prefill
        # (model.onnx, bf16) took 62 ms instead of 42. share_inputs: read the arrays in place
        # as ONNX Runtime does (GPT-2's decode step copied its 9.4 MB past: 11.5 -> 9.4 ms).
        result = self.request.infer({port: feeds[p.name] for port, p in self.inputs}, share_inputs=True, share_outputs=True)
        self.calls += 1
        return {p.name: np.array(result[port]) if copy else result[port] for port, p in self.outputs}

    def _masked_prefill(self, feeds: dict[str, Any], *, copy: bool) -> dict[str, Any]:
        import numpy as np

        if "attention_mask" not in feeds:
            raise ValueError("OpenVINO refused an empty past and the model has no attention_mask to hide a stand-in slot")
        padded = dict(feeds)
        for name, value in feeds.items():
            if name.startswith(PAST):
                shape = list(value.shape)
                shape[2] = 1
                padded[name] = np.zeros(shape, dtype=value.dtype)
        mask = feeds["attention_mask"]
        padded["attention_mask"] = np.concatenate([np.zeros((mask.shape[0], 1), dtype=mask.dtype), mask], axis=1)
        got = self._infer(padded, copy=copy)
        return {n: (v[:, :, 1:] if n.startswith(PRESENT) else v) for n, v in got.items()}


def _empty_past(feeds: dict[str, Any]) -> bool:
    return any(n.startswith(PAST) and v.ndim == 4 and v.shape[2] == 0 for n, v in feeds.items())


def load(path: Path, *, precision: Precision = "auto", threads: int | None = None, profile: bool = False) -> Session:
    """Compile ``path`` for OpenVINO's CPU plugin (latency hint, ``threads`` inference threads;
    ``profile``: with OpenVINO's per-node counters on, for ``Session.kernels``, never for a timed row)."""
    import onnx
    import openvino as ov

    core = ov.Core()
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    if precision != "auto":
        config["INFERENCE_PRECISION_HINT"] = precision
    if profile:
        config["PERF_COUNT"] = True
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    graph = onnx.load_model(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    onnx_in = [i.name for i in graph.input if i.name not in initializers]
    onnx_out = [o.name for o in graph.output]

    def ports(found: Any, wanted: list[str], what: str) -> list[tuple[Any, Port]]:
        out = []
        for port in found:
            names = port.get_names()
            name = next((n for n in wanted if n in names), None)
            if name is None:
                raise ValueError(f"OpenVINO's compiled model has an {what} named {sorted(names)}, none of them an {what} of the ONNX graph ({', '.join(wanted)})")
            shape = [d.get_length() if d.is_static else None for d in port.get_partial_shape()]
            out.append((port, Port(name, shape, f"tensor({_numpy_type(port.get_element_type())})")))
        return sorted(out, key=lambda p: wanted.index(p[1].name))

    inference = compiled.get_property("INFERENCE_PRECISION_HINT")
    return Session(
        compiled=compiled,
        request=compiled.create_infer_request(),
        precision=_precision_name(inference),
        inputs=ports(compiled.inputs, onnx_in, "input"),
        outputs=ports(compiled.outputs, onnx_out, "output"),
    )


def _numpy_type(element_type: Any) -> str:
    name = str(element_type.get_type_name())
    return {"f32": "float", "f16": "float16", "bf16": "bfloat16", "i64": "int64", "i32": "int32", "u8": "uint8", "i8": "int8", "boolean": "bool"}.get(name, name)


def _precision_name(element_type: Any) -> str:
    """``bf16``/``f32``/``f16`` from OpenVINO's element type."""
    name = str(element_type.get_type_name()) if hasattr(element_type, "get_type_name") else str(element_type)
    return {"bf16": "bf16", "f32": "f32", "f16": "f16"}.get(name, name)


# Tolerances for a variant run at a lower inference precision than its weights: bf16 keeps 8
# bits of mantissa (relative step 2**-8 = 0.4% per rounding), f16 11 bits. Measured on GPT-2
# (random-init) bf16 logits: max abs diff 0.034 against PyTorch fp32 at 128 tokens.
TOLERANCES: dict[str, tuple[float, float]] = {"bf16": (0.1, 0.05), "f16": (0.05, 0.01)}
"""inference precision -> (atol, rtol) used unless the provider's options set them."""

TOP1_MIN = 0.9
"""Language models below f32: the least share of predictions (argmax over the vocabulary)
that must match the source model's, unless the provider's options set ``top1_min``."""
