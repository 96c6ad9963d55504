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

A decoder whose attention OpenVINO reads as ``ScaledDotProductAttention`` (our fused and
quantized graphs; not the plain export) is compiled *stateful*, as OpenVINO's own LLM pipelines
run it: each past/present pair becomes a variable the model keeps between calls, so the CPU
plugin appends a step's keys and values inside its attention node
(``ScaledDotProductAttentionWithKVCache``) instead of copying the whole cache in, concatenating
it in fp32 and copying it out each step. GPT-2's static int8 file, one decode step after 128
tokens: 7.0-7.2 ms against 9.1-9.4 with the cache as inputs and outputs (the plain export
stayed faster with them, 13.2-13.7 against 14.0-15.9, so it keeps them). The interface does
not change: a past given as arrays is written into the variables (an empty one resets them),
presents are read back from them when asked for, and ``kept()`` hands a decode loop markers for
the cache the session already holds, so feeding them back copies nothing.

One module (~510 lines): the port naming, the empty-past rerun and the stateful cache are the
one Session that makes OpenVINO answer as ONNX Runtime does; each needs the others' state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

if TYPE_CHECKING:
    import numpy as np
    import openvino as ov
    from numpy.typing import NDArray

    from onnxbuild.runtimes.sessions import Feed

    Feeds = Mapping[str, Feed]
    Arrays = dict[str, NDArray[np.generic]]
    OvPort: TypeAlias = "ov.Output | ov.ConstOutput"

from onnxbuild._util import brief
from onnxbuild.recipe.tasks import PAST_PREFIX as PAST
from onnxbuild.recipe.tasks import PRESENT_PREFIX as PRESENT
from onnxbuild.runtimes import fpenv, sessions
from onnxbuild.runtimes.sessions import Kept

NAME = "openvino"
RUNNER = 3
"""How this module runs a variant, in the validate step's key for the variants it checks on
OpenVINO (only theirs rerun when it changes). 2: a decoder with fused attention holds its KV
cache in the model (above); 3: every call with the thread's denormal flags cleared (fpenv.py)."""
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


ISA_CAP = "ONEDNN_MAX_CPU_ISA"
"""oneDNN's cap on the instruction sets its kernels use, which OpenVINO's CPU plugin honours: how
``make test-slow`` runs OpenVINO as on an AVX2-only CPU (``AVX2``) on a machine with AVX-512."""
_BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10", "ALL", "DEFAULT")


def isa_cap_without_bf16() -> bool:
    """Whether ONEDNN_MAX_CPU_ISA caps the plugin below native bf16 (AVX2, AVX512_CORE, ...)."""
    import os

    cap = os.environ.get(ISA_CAP, "").strip().upper()
    return bool(cap) and not cap.startswith(_BF16_ISAS)


def version() -> str:
    from onnxbuild.environment import package_version

    return package_version("openvino")


@dataclass(frozen=True)
class Port:
    """One input or output as ``onnxruntime.NodeArg`` describes it."""

    name: str
    shape: list[int | None]
    type: str


class _Variable(Protocol):
    """One of a stateful compiled model's variables (``openvino.VariableState``)."""

    state: ov.Tensor


@dataclass
class Session:
    """A model compiled by OpenVINO's CPU plugin, called like an ONNX Runtime session.

    ``precision`` is the inference precision OpenVINO chose (read back from the compiled
    model: ``auto`` is bf16 on CPUs with native bf16, f32 elsewhere). ``masked_prefill``
    turns true once a prefill had to go through the one-slot masked past. ``states`` (past
    input name -> OpenVINO variable) is empty unless the model was compiled stateful; its
    past and present ports are then ``None`` in ``inputs`` and ``outputs``.
    """

    compiled: ov.CompiledModel
    request: ov.InferRequest
    precision: str
    inputs: list[tuple[OvPort | None, Port]]
    outputs: list[tuple[OvPort | None, Port]]
    masked_prefill: bool = field(default=False)
    calls: int = field(default=0)  # completed inference requests, for ``kernels``
    generation: int = field(default=0)  # changes of a stateful model's variables, for ``Kept``
    batch: int = field(default=0)  # the rows its cache holds
    states: dict[str, _Variable] = field(default_factory=dict)
    beam: OvPort | None = field(
        default=None
    )  # a stateful model's ``beam_idx`` port (which cache row each batch row reads)

    @property
    def keeps_past(self) -> bool:
        """Whether the model holds its KV cache between calls (see the module's docstring)."""
        return bool(self.states)

    def kept(self) -> list[Kept]:
        """Markers for the cache this stateful session holds after its last call, one per
        present: fed back as the next call's past, they cost nothing."""
        return [self._marker()] * len(self.states)

    def _marker(self) -> Kept:
        return Kept(id(self), self.generation, self.batch)

    def get_inputs(self) -> list[Port]:
        return [p for _, p in self.inputs]

    def get_outputs(self) -> list[Port]:
        return [p for _, p in self.outputs]

    def run(self, names: list[str] | None, feeds: Feeds, /) -> list[NDArray[np.generic]]:
        wanted = names or [p.name for _, p in self.outputs]
        got = self._call(feeds, copy=True, wanted=wanted)
        return [got[n] for n in wanted]

    def infer(self, feeds: Feeds) -> None:
        """One call whose outputs stay in the request's buffers (the next call reuses them): what
        the benchmark times. ONNX Runtime's ``run()`` hands over its own output buffers without
        a copy; ``run()`` here copies every output out, which for GPT-2's 128-token prefill (35 MB
        of logits and presents) was 5.5 ms of 31."""
        self._call(feeds, copy=False, wanted=[])

    def decode_steps(self, feeds: Feeds, span: int) -> tuple[Callable[[], None], Callable[[], None]]:
        """``(prepare, step)`` to time decode steps after the past in ``feeds`` the way this
        session runs them: ``step()`` is one timed call, ``prepare()`` the untimed work before it.

        With the cache as inputs every step feeds the same past. A stateful session holds its
        cache, so its steps are successive tokens: the first after ``feeds``' past, the next
        step later (mask and positions move on), and after ``span`` steps ``prepare()``
        writes ``feeds``' past into the variables again, so no step reads a past longer than
        ``span`` - 1 steps beyond it."""
        if not self.keeps_past or _empty_past(feeds):
            return (lambda: None), (lambda: self.infer(feeds))
        new = int(_array(feeds, "input_ids").shape[1])
        steps = [_moved_on(feeds, k * new) for k in range(span)]
        done = span

        def prepare() -> None:
            nonlocal done
            if done >= span:
                self._take_past(feeds)
                done = 0

        def step() -> None:
            nonlocal done
            self._run_stateful({**steps[done], **dict.fromkeys(self.states, self._marker())}, copy=False, wanted=[])
            done += 1

        return prepare, step

    def kernels(self, feeds: Feeds, *, warmup: int = 3, repeat: int = 10) -> tuple[float, dict[str, float]]:
        """Where one call's time goes: the mean wall time in ms of ``repeat`` calls after
        ``warmup``, and the ms per call per (node type, implementation) from OpenVINO's own
        counters, e.g. ``FullyConnectedQuantizedLegacy (brgemm_avx512_amx_i8)``. Needs a session
        loaded with ``profile=True``.

        The CPU plugin reports each node's *mean* over every call since compilation (its
        ``PerfCount::avg``), first calls and other shapes included: read as they are, a decode
        step profiled after two prefills showed 22 ms of FullyConnected in a 14 ms call. So the
        totals (mean x calls) are read before and after the profiled calls and differenced."""
        import time

        prepare, step = self.decode_steps(feeds, warmup + repeat)
        prepare()
        for _ in range(warmup):
            step()
        before, n_before = self._node_totals(), self.calls
        t0 = time.perf_counter()
        for _ in range(repeat):
            step()
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
        return {
            n.node_name: (f"{n.node_type} ({n.exec_type})", n.real_time.total_seconds() * 1000.0)
            for n in self.request.profiling_info
        }

    def _call(self, feeds: Feeds, *, copy: bool, wanted: list[str]) -> Arrays:
        missing = [p.name for _, p in self.inputs if p.name not in feeds]
        if missing:
            raise ValueError(f"missing inputs: {', '.join(missing)}")
        if self.keeps_past:
            # an empty past resets the variables, which the model fills from a zero-length
            # initial value: no empty input tensor for the plugin to refuse
            return self._run_stateful(feeds, copy=copy, wanted=wanted)
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

    def _run_stateful(self, feeds: Feeds, *, copy: bool, wanted: list[str]) -> Arrays:
        import numpy as np

        self._take_past(feeds)
        given = {port: feeds[p.name] for port, p in self.inputs if port is not None}
        given[self.beam] = np.arange(self.batch, dtype=np.int32)  # each row reads its own cache row
        self.generation += 1  # from here the variables are this call's, whether it succeeds or not
        with fpenv.clean():
            result = self.request.infer(given, share_inputs=True, share_outputs=True)
        self.calls += 1
        got = {p.name: np.array(result[port]) if copy else result[port] for port, p in self.outputs if port is not None}
        for past, state in self.states.items():
            if _present_of(past) in wanted:
                # read in the variable's declared type (the model's float32), whatever the cache holds
                got[_present_of(past)] = np.array(state.state.data)
        return got

    def _take_past(self, feeds: Feeds) -> None:
        """Bring the variables to the past in ``feeds``: markers of the cache held are kept,
        an empty past resets, arrays are written in."""
        import numpy as np
        import openvino as ov

        given = [feeds[name] for name in self.states]
        held = [v for v in given if isinstance(v, Kept)]
        arrays = [v for v in given if not isinstance(v, Kept)]
        if held:
            if len(held) != len(given):
                raise ValueError(
                    "a past is either kept() markers for every cache tensor or arrays for every one, not a mix"
                )
            if any(k != self._marker() for k in held) or int(_array(feeds, "input_ids").shape[0]) != self.batch:
                raise ValueError(
                    "a stateful OpenVINO session holds only the cache of its latest call: feed its kept() "
                    "back after each call, or the past as arrays"
                )
            return
        self.generation += 1
        self.batch = int(_array(feeds, "input_ids").shape[0])  # the graph sizes a new cache from input_ids
        if _empty_past(feeds):
            self.request.reset_state()
            return
        for state, value in zip(self.states.values(), arrays, strict=True):  # no markers: arrays is given
            state.state = ov.Tensor(np.ascontiguousarray(value))

    def _infer(self, feeds: Feeds, *, copy: bool) -> Arrays:
        import numpy as np

        # share_outputs: the request's own buffers, copied at most once here. infer()'s default
        # copies into fresh arrays first; with a second copy on top GPT-2's 128-token prefill
        # (model.onnx, bf16) took 62 ms instead of 42. share_inputs: read the arrays in place
        # as ONNX Runtime does (GPT-2's decode step copied its 9.4 MB past: 11.5 -> 9.4 ms).
        with fpenv.clean():
            result = self.request.infer(
                {port: feeds[p.name] for port, p in self.inputs}, share_inputs=True, share_outputs=True
            )
        self.calls += 1
        return {p.name: np.array(result[port]) if copy else result[port] for port, p in self.outputs}

    def _masked_prefill(self, feeds: Feeds, *, copy: bool) -> Arrays:
        import numpy as np

        if "attention_mask" not in feeds:
            raise ValueError(
                "OpenVINO refused an empty past and the model has no attention_mask to hide a stand-in slot"
            )
        padded = dict(feeds)
        for name, value in feeds.items():
            if name.startswith(PAST):
                if isinstance(value, Kept):
                    raise ValueError(f"{name}: a kept() marker is a past only for the stateful session that made it")
                shape = list(value.shape)
                shape[2] = 1
                padded[name] = np.zeros(shape, dtype=value.dtype)
        mask = _array(feeds, "attention_mask")
        padded["attention_mask"] = np.concatenate([np.zeros((mask.shape[0], 1), dtype=mask.dtype), mask], axis=1)
        got = self._infer(padded, copy=copy)
        return {n: (v[:, :, 1:] if n.startswith(PRESENT) else v) for n, v in got.items()}


def _empty_past(feeds: Feeds) -> bool:
    return any(
        n.startswith(PAST) and not isinstance(v, Kept) and getattr(v, "ndim", 0) == 4 and v.shape[2] == 0
        for n, v in feeds.items()
    )


def _array(feeds: Feeds, name: str) -> NDArray[np.generic]:
    value = feeds[name]
    if isinstance(value, Kept):
        raise ValueError(f"{name}: a kept() marker stands only for a past")
    return value


def _present_of(past: str) -> str:
    return PRESENT + past[len(PAST) :]


def _moved_on(feeds: Feeds, tokens: int) -> dict[str, Feed]:
    """The non-past inputs of the step ``tokens`` tokens after ``feeds``' step: the same new
    tokens, the mask ``tokens`` longer, the positions ``tokens`` further."""
    import numpy as np

    out = {n: v for n, v in feeds.items() if not n.startswith(PAST)}
    if "attention_mask" in out:
        mask = _array(out, "attention_mask")
        out["attention_mask"] = np.concatenate([mask, np.ones((mask.shape[0], tokens), dtype=mask.dtype)], axis=1)
    if "position_ids" in out:
        out["position_ids"] = _array(out, "position_ids") + tokens
    return out


def _stateful(model: ov.Model, pasts: list[str], outputs: list[str]) -> ov.Model | None:
    """``model`` with each past/present pair made a variable, or None where that would not help.

    Only where OpenVINO reads one ``ScaledDotProductAttention`` per layer: the CPU plugin then
    fuses variable, concatenation and attention into ``ScaledDotProductAttentionWithKVCache``
    (for the plain export's decomposed attention it measured slower). As OpenVINO's own LLM
    exports do: a ``beam_idx`` input gathers the cache rows first (the fusion's pattern wants
    it), and each variable starts from a zero-length cache of the call's batch."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops
    from openvino.passes import MakeStateful, Manager

    pairs = {p: _present_of(p) for p in pasts}
    if not pasts or "input_ids" not in {n for i in model.inputs for n in i.get_names()}:
        return None
    paired = set(pairs.values()) <= set(outputs) and all(
        model.input(p).get_partial_shape().rank.get_length() == 4 for p in pasts
    )
    attention = sum(op.get_type_name() == "ScaledDotProductAttention" for op in model.get_ops())
    if not paired or attention * 2 != len(pasts):  # a key and a value per attention
        return None
    beam = ops.parameter([-1], ov.Type.i32, name="beam_idx")
    beam.output(0).get_tensor().set_names({"beam_idx"})
    for name in pasts:
        port = model.input(name)
        consumers = port.get_target_inputs()
        reordered = ops.gather(port, beam, ops.constant(np.array(0, dtype=np.int64)))
        for consumer in consumers:
            consumer.replace_source_output(reordered.output(0))
    model.add_parameters([beam])
    model.validate_nodes_and_infer_types()
    manager = Manager()
    manager.register_pass(MakeStateful(pairs))  # names each variable past + present
    manager.run_passes(model)
    ids = model.input("input_ids")
    batch = ops.gather(
        ops.shape_of(ids, output_type="i64"),
        ops.constant(np.array([0], dtype=np.int64)),
        ops.constant(np.array(0, dtype=np.int64)),
    )
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            dims: list[int | ov.Node] = [d.get_min_length() for d in op.get_output_partial_shape(0)]
            dims[0] = batch
            shape = ops.concat(
                [d if not isinstance(d, int) else ops.constant(np.array([d], dtype=np.int64)) for d in dims], axis=0
            )
            zero = ops.convert(
                ops.constant(np.array(0.0, dtype=np.float32)), op.get_output_element_type(0)
            )  # an f16 cache too
            op.set_arguments([ops.broadcast(zero, shape)])
    model.validate_nodes_and_infer_types()
    return model


def _compile(
    core: ov.Core,
    path: Path,
    model: ov.Model,
    pasts: list[str],
    outputs: list[str],
    config: dict[str, object],
    precision: str,
) -> tuple[ov.CompiledModel, bool]:
    """The compiled model, and whether it holds its KV cache (``_stateful``), which is a speed-up
    and never a reason to fail: where making it stateful or compiling that fails, the file is
    compiled with its cache as inputs and outputs."""
    try:
        held = _stateful(model, pasts, outputs)
        if held is not None:
            # the plugin's default cache is u8 (quantized per token), a rounding the validation's
            # tolerances, chosen from the inference precision, were not set for: keep it at that
            kv = precision if precision != "auto" else core.get_property("CPU", "INFERENCE_PRECISION_HINT")
            return core.compile_model(held, "CPU", {**config, "KV_CACHE_PRECISION": kv}), True
    except RuntimeError:  # OpenVINO's errors; a bug of ours surfaces instead
        model = core.read_model(str(path))  # the transformation changed it in place
    return core.compile_model(model, "CPU", config), False


def load(
    path: Path,
    *,
    precision: Precision = "auto",
    threads: int | None = None,
    profile: bool = False,
    stateful: bool = True,
) -> Session:
    """Compile ``path`` for OpenVINO's CPU plugin (latency hint, ``threads`` inference threads;
    ``profile``: with OpenVINO's per-node counters on, for ``Session.kernels``, never for a timed
    row; ``stateful``: hold a decoder's KV cache in the model where that helps, see above)."""
    # the plugin's threads start inside this call and take its flags; each call clears them again
    with fpenv.clean():
        return _load(path, precision=precision, threads=threads, profile=profile, stateful=stateful)


def _load(path: Path, *, precision: Precision, threads: int | None, profile: bool, stateful: bool) -> Session:
    import onnx
    import openvino as ov

    core = ov.Core()
    config: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    if precision == "auto" and isa_cap_without_bf16():
        precision = "f32"  # the plugin reads bf16 from cpuid, past the cap, and finds no bf16 kernel under it
    if precision != "auto":
        config["INFERENCE_PRECISION_HINT"] = precision
    if profile:
        config["PERF_COUNT"] = True
    graph = onnx.load_model(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    onnx_in = [i.name for i in graph.input if i.name not in initializers]
    onnx_out = [o.name for o in graph.output]
    model = core.read_model(str(path))

    def ports(found: Iterable[OvPort], wanted: list[str], what: str) -> list[tuple[OvPort | None, Port]]:
        out: list[tuple[OvPort | None, Port]] = []
        for port in found:
            names = port.get_names()
            name = next((n for n in wanted if n in names), None)
            if name is None:
                raise ValueError(
                    f"OpenVINO's compiled model has an {what} named {sorted(names)}, "
                    f"none of them an {what} of the ONNX graph ({', '.join(wanted)})"
                )
            shape = [d.get_length() if d.is_static else None for d in port.get_partial_shape()]
            out.append((port, Port(name, shape, f"tensor({_numpy_type(port.get_element_type())})")))
        return sorted(out, key=lambda p: wanted.index(p[1].name))

    # the cache's ports as the ONNX graph has them, before they turn into variables
    cache = [
        (None, p)
        for _, p in ports(model.inputs, onnx_in, "input") + ports(model.outputs, onnx_out, "output")
        if p.name.startswith((PAST, PRESENT))
    ]
    pasts = [p.name for _, p in cache if p.name.startswith(PAST)]
    compiled, held = (
        _compile(core, path, model, pasts, onnx_out, config, precision)
        if stateful
        else (core.compile_model(model, "CPU", config), False)
    )
    request = compiled.create_infer_request()

    def merged(found: Iterable[OvPort], wanted: list[str], what: str) -> list[tuple[OvPort | None, Port]]:
        """The compiled model's ports, and the cache's ports it no longer has (held, ``None``)."""
        live = ports([p for p in found if "beam_idx" not in p.get_names()], wanted, what)
        return sorted(live + [c for c in cache if held and c[1].name in wanted], key=lambda p: wanted.index(p[1].name))

    variables = {state.name: state for state in request.query_state()} if held else {}
    return Session(
        compiled=compiled,
        request=request,
        precision=_precision_name(compiled.get_property("INFERENCE_PRECISION_HINT")),
        inputs=merged(compiled.inputs, onnx_in, "input"),
        outputs=merged(compiled.outputs, onnx_out, "output"),
        states={p: variables[p + _present_of(p)] for p in pasts}
        if held
        else {},  # MakeStateful names a variable by its pair
        beam=next((port for port in compiled.inputs if "beam_idx" in port.get_names()), None),
    )


def _numpy_type(element_type: ov.Type) -> str:
    name = str(element_type.get_type_name())
    return {
        "f32": "float",
        "f16": "float16",
        "bf16": "bfloat16",
        "i64": "int64",
        "i32": "int32",
        "u8": "uint8",
        "i8": "int8",
        "boolean": "bool",
    }.get(name, name)


def _precision_name(element_type: object) -> str:
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


def _answers_as_onnx_runtime(session: Session) -> sessions.Session:
    """Never called: mypy checks here that this Session is a runtimes.sessions.Session."""
    return session
